"""padding_cost: what running a batch of 37 as the captured size 48 costs (seed exercise C).

A DecodeRunner of the `1b` model (random weights, random KV history, context 512) captures the default sizes
up to 256 (--quick: up to 64). First the time of every captured size, replaying its graph on a full batch
(every row active). Then batch 37 run as 48, predicted and measured:

  predicted  (i) linear interpolation of the per-size times: t(48) / t_interp(37) - 1 (every row active);
             (ii) the seed's formula (48/37 - 1) x KV fraction of the step (KV bytes / step bytes at 37 rows).
  measured   (a) plain padding: rows 37..47 active with real contexts (position 512, their own blocks), as a
                 naive engine pads; (b) our inactive-row padding: rows 37..47 at position -1 (attention skips
                 them); both against (c) an exact-size graph of 37 rows (``model.capture(37, stream)``).

Real rows' tokens and logits are checked bit-identical between (a) and (b) (same graph) and close to (c)'s
(bf16 tolerance), before timing. Target: (b) costs <= 5% over (c).

Run: ``python benchmarks/padding_cost.py [--out DIR] [--quick]``; prints a table, writes
``DIR/padding_cost.json`` and ``DIR/padding_cost.png`` (ms per captured size).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from common import (
    CONTEXT,
    Checks,
    block_tables,
    build_model,
    check_same_step,
    fill_kv_random,
    finish,
    median,
    no_gpu,
    parser,
    plot,
    poison_step,
    read_step,
    time_ms,
    verdict,
    write_result,
)

from rawgraphs.bench import format_table, make_row, plot_lines
from rawgraphs.context import Stream, device
from rawgraphs.runner import DEFAULT_CAPTURE_SIZES, DecodeRunner, pad_inputs

PRESET = "1b"
ACTUAL, PADDED = 37, 48
TARGET = 0.05  # inactive-row padding 37 -> 48 over exact 37
LOGIT_TOL = 2e-2  # bf16: max |difference| / max |logit| between graphs of different batch sizes


def capture_sizes(quick: bool) -> tuple[int, ...]:
    """The default capture sizes up to 64 (--quick) or 256."""
    top = 64 if quick else 256
    return tuple(s for s in DEFAULT_CAPTURE_SIZES if s <= top)


def interpolate(sizes, times, B: int) -> float:
    """Time of batch ``B`` by linear interpolation between the captured sizes around it."""
    if not sizes[0] <= B <= sizes[-1]:
        raise ValueError(f"batch {B} is outside the captured sizes {sizes[0]}..{sizes[-1]}")
    return float(np.interp(B, sizes, times))


def seed_estimate(actual: int, padded: int, kv_fraction: float) -> float:
    """The seed's padding cost: (padded / actual - 1) x KV fraction of the step time."""
    return (padded / actual - 1) * kv_fraction


def kv_fraction(cfg, rows: int, context: int) -> float:
    """Share of a step's bytes that are K and V (``rows`` rows reading ``context`` tokens each)."""
    kv = cfg.kv_bytes_per_token() * rows * context
    return kv / (kv + cfg.weight_bytes())


def main(argv: list[str] | None = None) -> int:
    opts = parser(__doc__).parse_args(argv)
    if no_gpu("benchmarks/padding_cost.py"):
        return 0
    t_start = time.perf_counter()
    sizes = capture_sizes(opts.quick)
    stream = Stream.create()
    rng = np.random.default_rng(2)
    checks = Checks()
    model = build_model(PRESET, sizes[-1], kv_tokens=CONTEXT + 1)
    cfg, top = model.cfg, sizes[-1]
    fill_kv_random(model, rng)
    runner = DecodeRunner(model, sizes, stream=stream)
    runner.capture(progress=False)
    tokens = rng.integers(1, cfg.vocab, top).astype(np.int32)  # [top]
    positions = np.full(top, CONTEXT, np.int32)                 # [top] every row active
    tables = block_tables(model, top, CONTEXT + 1)              # [top, MB] each row its own blocks

    rows, per_size = [], []
    for s in sizes:
        model.set_inputs(tokens[:s], positions[:s], tables[:s], stream)
        exe = runner.graphs[s]
        samples = time_ms(lambda exe=exe: exe.launch(stream), stream, opts.quick)
        per_size.append(median(samples))
        rows.append(make_row(samples, unit="ms", case="captured size, full batch", batch=s))

    exact = model.capture(ACTUAL, stream)
    exe37 = exact.instantiate()
    exe37.upload(stream)
    exe48 = runner.graphs[PADDED]
    cases = {  # name -> (inputs, graph)
        "(a) plain padding 37->48": ((tokens[:PADDED], positions[:PADDED], tables[:PADDED]), exe48),
        "(b) inactive padding 37->48": (pad_inputs(tokens[:ACTUAL], positions[:ACTUAL], tables[:ACTUAL], PADDED),
                                        exe48),
        "(c) exact 37": ((tokens[:ACTUAL], positions[:ACTUAL], tables[:ACTUAL]), exe37),
    }
    outs, times = {}, {}
    for name, (inputs, exe) in cases.items():
        model.set_inputs(*inputs, stream)
        poison_step(model, stream)  # each case reads back its own step, not the case's before it
        exe.launch(stream)
        tok, logits = read_step(model, ACTUAL, stream)
        outs[name] = (tok, logits)
        times[name] = time_ms(lambda exe=exe: exe.launch(stream), stream, opts.quick)
        rows.append(make_row(times[name], unit="ms", case=name, batch=ACTUAL))
    a, b, c = (outs[n] for n in cases)
    check_same_step(checks, "real rows 0..36, plain vs inactive padding (same graph of 48)", a, b)
    rel = float(np.abs(b[1] - c[1]).max() / np.abs(c[1]).max())  # other graph shape: summation order may differ
    checks(bool(np.isfinite(c[1]).all()) and rel <= LOGIT_TOL,
           f"real rows 0..36: inactive padding vs the exact-37 graph, max relative logit difference {rel:.2g} "
           f"(<= {LOGIT_TOL}); tokens differ in {int((b[0] != c[0]).sum())} of {ACTUAL} rows")

    t = {n: median(s) for n, s in times.items()}
    exact_ms = t["(c) exact 37"]
    interp = interpolate(sizes, per_size, ACTUAL)
    frac = kv_fraction(cfg, ACTUAL, CONTEXT + 1)
    table = [{"case": f"size {s}", "ms": ms, "vs exact 37": None, "predicted": None}
             for s, ms in zip(sizes, per_size)]
    table += [
        {"case": "37 interpolated", "ms": interp, "vs exact 37": interp / exact_ms - 1, "predicted": None},
        {"case": "(a) plain padding 37->48", "ms": t["(a) plain padding 37->48"],
         "vs exact 37": t["(a) plain padding 37->48"] / exact_ms - 1,
         "predicted": per_size[sizes.index(PADDED)] / interp - 1},
        {"case": "(b) inactive padding 37->48", "ms": t["(b) inactive padding 37->48"],
         "vs exact 37": t["(b) inactive padding 37->48"] / exact_ms - 1, "predicted": None},
        {"case": "(c) exact 37", "ms": exact_ms, "vs exact 37": 0.0, "predicted": None},
        {"case": "seed formula (48/37-1) x KV fraction", "ms": None, "vs exact 37": None,
         "predicted": seed_estimate(ACTUAL, PADDED, frac)},
    ]
    print(format_table(table, ["case", "ms", ("vs exact 37", "cost vs exact 37"), ("predicted", "predicted cost")],
                       title=f"{PRESET} decode step at context {CONTEXT} on {device().name} "
                             "(graph replays, median; costs as fractions)"))
    cost_b = t["(b) inactive padding 37->48"] / exact_ms - 1
    notes = [
        f"KV fraction of the step at 37 rows: {frac:.3f} (KV bytes / step bytes)",
        f"plain padding 37->48 costs {t['(a) plain padding 37->48'] / exact_ms - 1:+.1%} over exact 37; predicted "
        f"{per_size[sizes.index(PADDED)] / interp - 1:+.1%} (interpolation), "
        f"{seed_estimate(ACTUAL, PADDED, frac):+.1%} (seed formula)",
        f"inactive-row padding 37->48 costs {cost_b:+.1%} over exact 37 (target <= {TARGET:.0%}): "
        f"{verdict(cost_b <= TARGET)}",
    ]
    for line in notes:
        print(line)
    params = {"model": PRESET, "context": CONTEXT, "capture_sizes": list(sizes), "actual": ACTUAL,
              "padded": PADDED, "quick": opts.quick, "timer": "CUDA events over back-to-back replays, median"}
    write_result("padding_cost", opts.out, params, rows, notes, checks)
    plot(lambda: plot_lines(opts.out / "padding_cost.png", list(sizes), {"graph replay ms": per_size},
                            title=f"{PRESET} step time per captured size, context {CONTEXT} ({device().name})",
                            xlabel="batch size (every row active)", ylabel="ms per step"))
    print(f"total {time.perf_counter() - t_start:.1f} s")
    return finish(checks)


if __name__ == "__main__":
    sys.exit(main())
