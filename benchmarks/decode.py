"""decode: ms per decode step of the `small` and `1b` models, eager vs captured graph, against the bandwidth floor.

For each model, B = 1, 8, 64 rows at context 512 (random weights, random KV history), the step runs as eager
launches and as one captured graph (checked bit-identical to eager before timing). GPU time per step is CUDA
events over back-to-back steps (median). Beside each: the bandwidth floor (every weight once plus each row's
K and V, at the device-to-device copy bandwidth measured once), the GB/s achieved and the ratio to the floor.

Targets: `1b` graph step at B=1 <= 1.25x its floor; `small` graph step at B=1 <= 0.15 ms.

Run: ``python benchmarks/decode.py [--out DIR] [--quick]`` (--quick: B = 1, 8 only); prints a table, writes
``DIR/decode.json``.
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
    step_inputs,
    verdict,
    write_result,
)

from rawgraphs.bench import format_table, make_row
from rawgraphs.bench.bandwidth import copy_bandwidth_gbs, floor_ms, step_bytes
from rawgraphs.context import Stream, device

MODELS = ("small", "1b")
TARGET_1B_X_FLOOR = 1.25
TARGET_SMALL_MS = 0.15


def batches(quick: bool) -> list[int]:
    """Batch sizes measured."""
    return [1, 8] if quick else [1, 8, 64]


def main(argv: list[str] | None = None) -> int:
    opts = parser(__doc__).parse_args(argv)
    if no_gpu("benchmarks/decode.py"):
        return 0
    t_start = time.perf_counter()
    Bs = batches(opts.quick)
    stream = Stream.create()
    rng = np.random.default_rng(0)
    checks = Checks()
    gbs = copy_bandwidth_gbs(stream)
    print(f"copy bandwidth {gbs:.0f} GB/s (read + write) on {device().name}")
    table, rows = [], []
    for preset in MODELS:
        model = build_model(preset, max(Bs), kv_tokens=CONTEXT + 1)
        cfg = model.cfg
        fill_kv_random(model, rng)
        for B in Bs:
            inputs = step_inputs(model, B, CONTEXT, rng)
            eager, graph = eager_vs_graph(model, B, inputs, stream, opts.quick, checks, f"{preset} B={B}")
            ctx = [CONTEXT + 1] * B
            floor, nbytes = floor_ms(cfg, ctx, gbs), step_bytes(cfg, ctx)
            for mode, samples in (("eager", eager), ("graph", graph)):
                ms = median(samples)
                fields = {"model": preset, "batch": B, "mode": mode}
                table.append({**fields, "ms/step": ms, "floor ms": floor, "GB/s": nbytes / ms / 1e6,
                              "x floor": ms / floor, "tokens/s": B / ms * 1e3})
                rows.append(make_row(samples, unit="ms", **fields, floor_ms=floor, step_bytes=nbytes))
        del model
        gc.collect()
    print(format_table(table, ["model", "batch", "mode", "ms/step", "floor ms", "x floor", "GB/s", "tokens/s"],
                       title=f"decode step at context {CONTEXT} on {device().name} "
                             f"(floor at {gbs:.0f} GB/s measured copy bandwidth)"))

    def graph_row(preset):
        return next(r for r in table if r["model"] == preset and r["batch"] == 1 and r["mode"] == "graph")

    big, small = graph_row("1b"), graph_row("small")
    notes = [
        f"context {CONTEXT}: each row's KV holds {CONTEXT} random tokens, attention reads {CONTEXT + 1}",
        f"1b graph step at B=1: {big['ms/step']:.3f} ms = {big['x floor']:.2f}x its floor "
        f"(target <= {TARGET_1B_X_FLOOR}x): {verdict(big['x floor'] <= TARGET_1B_X_FLOOR)}",
        f"small graph step at B=1: {small['ms/step']:.3f} ms (target <= {TARGET_SMALL_MS} ms): "
        f"{verdict(small['ms/step'] <= TARGET_SMALL_MS)}",
    ]
    for line in notes[1:]:
        print(line)
    params = {"models": list(MODELS), "batches": Bs, "context": CONTEXT, "copy_gbs": gbs, "quick": opts.quick,
              "timer": "CUDA events over back-to-back steps (eager: launch gaps included), median"}
    write_result("decode", opts.out, params, rows, notes, checks)
    print(f"total {time.perf_counter() - t_start:.1f} s")
    return finish(checks)


if __name__ == "__main__":
    sys.exit(main())
