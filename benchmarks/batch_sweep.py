"""batch_sweep: speedup of a captured graph over eager launches vs batch size (seed exercise B).

For `small` and `1b` at context 512 (random weights, random KV history), B in {1, 2, 4, 8, 16, 32, 64}: ms per
step as eager launches and as a captured graph (checked bit-identical to eager first; CUDA events over
back-to-back steps, median), and the speedup eager / graph. The seed's section 7 expects the speedup to fall
as the work per kernel grows: largest for the small model at batch 1.

Run: ``python benchmarks/batch_sweep.py [--out DIR] [--quick]`` (--quick: `small` only, B = 1, 8, 64); prints
a table, writes ``DIR/batch_sweep.json`` and ``DIR/batch_sweep.png`` (speedup vs batch, one line per model).
"""

from __future__ import annotations

import gc
import sys
import time

import numpy as np
from common import (
    CONTEXT,
    Checks,
    build_model,
    eager_vs_graph,
    fill_kv_random,
    finish,
    median,
    no_gpu,
    parser,
    plot,
    step_inputs,
    write_result,
)

from rawgraphs.bench import format_table, make_row, plot_lines
from rawgraphs.context import Stream, device


def sweep(quick: bool) -> tuple[tuple[str, ...], list[int]]:
    """(models, batch sizes) measured."""
    return (("small",), [1, 8, 64]) if quick else (("small", "1b"), [1, 2, 4, 8, 16, 32, 64])


def falls_with_batch(speedups: list[float], slack: float = 0.05) -> bool:
    """True when the speedup at the largest batch is below the one at the smallest and no point rises by more
    than ``slack`` (relative) over the one before it: the trend of the seed's section 7."""
    rises = all(b <= a * (1 + slack) for a, b in zip(speedups, speedups[1:]))
    return rises and speedups[-1] < speedups[0]


def main(argv: list[str] | None = None) -> int:
    opts = parser(__doc__).parse_args(argv)
    if no_gpu("benchmarks/batch_sweep.py"):
        return 0
    t_start = time.perf_counter()
    models, Bs = sweep(opts.quick)
    stream = Stream.create()
    rng = np.random.default_rng(1)
    checks = Checks()
    table, rows, series = [], [], {}
    for preset in models:
        model = build_model(preset, max(Bs), kv_tokens=CONTEXT + 1)
        fill_kv_random(model, rng)
        for B in Bs:
            inputs = step_inputs(model, B, CONTEXT, rng)
            eager, graph = eager_vs_graph(model, B, inputs, stream, opts.quick, checks, f"{preset} B={B}")
            e, g = median(eager), median(graph)
            table.append({"config": preset, "batch": B, "eager ms": e, "graph ms": g, "speedup": e / g})
            rows += [make_row(eager, unit="ms", config=preset, batch=B, mode="eager"),
                     make_row(graph, unit="ms", config=preset, batch=B, mode="graph", speedup=e / g)]
        series[preset] = [r["speedup"] for r in table if r["config"] == preset]
        del model
        gc.collect()
    print(format_table(table, ["config", "batch", "eager ms", "graph ms", "speedup"],
                       title=f"graph vs eager decode step at context {CONTEXT} on {device().name} (median)"))
    notes = [f"{m}: speedup {s[0]:.2f}x at B={Bs[0]} -> {s[-1]:.2f}x at B={Bs[-1]}; falls with batch as in "
             f"seed section 7: {'yes' if falls_with_batch(s) else 'no'}" for m, s in series.items()]
    for line in notes:
        print(line)
    params = {"models": list(models), "batches": Bs, "context": CONTEXT, "quick": opts.quick,
              "timer": "CUDA events over back-to-back steps (eager: launch gaps included), median"}
    write_result("batch_sweep", opts.out, params, rows, notes, checks)
    plot(lambda: plot_lines(opts.out / "batch_sweep.png", Bs, series, logx=True,
                            title=f"graph speedup over eager, context {CONTEXT} ({device().name})",
                            xlabel="batch size", ylabel="eager ms / graph ms"))
    print(f"total {time.perf_counter() - t_start:.1f} s")
    return finish(checks)


if __name__ == "__main__":
    sys.exit(main())
