"""profile_step: one decode step of a model, bracketed by cuProfilerStart/Stop, for Nsight Compute.

Builds ``--model`` with random weights and a random KV history at context 512, runs ``--warmup`` eager steps
(compiles, warms caches), then one step between cuProfilerStart and cuProfilerStop, so ncu profiles exactly one
step's kernels:

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \\
        python3 benchmarks/profile_step.py --model 1b --batch 1

``--graph`` profiles one replay of the captured step instead (ncu then profiles its kernel nodes one by one).
``--active N`` marks rows N.. inactive (position -1), as the runner pads a batch: profile ``--batch 48 --active
37`` next to ``--batch 37`` to see what each kernel pays for 11 padding rows.
ncu serializes kernels and flushes caches between them: the per-kernel times are isolated times (no PDL overlap),
and their sum is the step without launch gaps or overlap; compare it with the graph step time of
benchmarks/decode.py to see what the gaps cost.
"""

from __future__ import annotations

import argparse

import numpy as np
from common import CONTEXT, build_model, fill_kv_random, step_inputs
from cuda.bindings import driver

from rawgraphs.context import Stream
from rawgraphs.errors import check


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="1b", help="preset name (tiny, small, 1b)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--graph", action="store_true", help="profile a graph replay instead of eager launches")
    ap.add_argument("--active", type=int, default=None, help="rows past this many are inactive (padding)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    model = build_model(a.model, a.batch, CONTEXT + 16)  # kv_tokens per row
    fill_kv_random(model, rng)
    stream = Stream.create()
    tokens, positions, tables = step_inputs(model, a.batch, CONTEXT, rng)
    positions[a.batch if a.active is None else a.active:] = -1
    model.set_inputs(tokens, positions, tables, stream)
    if a.graph:
        exe = model.capture(a.batch, stream).instantiate()
        exe.upload(stream)
        step = lambda: exe.launch(stream)  # noqa: E731
    else:
        step = lambda: model.run_eager(a.batch, stream)  # noqa: E731
    for _ in range(a.warmup):
        step()
    stream.synchronize()
    check(driver.cuProfilerStart(), "cuProfilerStart")
    step()
    stream.synchronize()
    check(driver.cuProfilerStop(), "cuProfilerStop")
    print(f"profiled one {'graph' if a.graph else 'eager'} step of {a.model} at B={a.batch}, "
          f"{len(model.step_launches(a.batch))} launches")


if __name__ == "__main__":
    main()
