"""How close do the decode projections (kernels/gemv.cu, launched by gemv_plan) come to HBM bandwidth?

The 1b config's projections (qkv 6144x2048, o 2048x2048, gate_up 11264x2048, down 2048x5632, LM head
32000x2048 with fp32 logits) at B = 1, 2, 4, 8, 64, 256, and the small config's at B = 1. Weights are rotated over
copies that together exceed 3x the 60 MB L2, so every launch reads them from HBM, as in decode. Three timings per
case, all CUDA events:
- ``single``: one plan (main kernel + split-K reduce when planned) between two events, queued behind a ~50 us
  spin kernel so the GPU never waits for Python: the kernel's own time including ramp-up and tail.
- ``stream``: 16 back-to-back plans (rotating weights) behind a longer spin, time / 16: what a decode step's
  stream of launches sees, inter-kernel gaps included.
- ``pdl``: the same with programmatic dependent launch, as the decode step launches them (each launch may
  start, and stream its first weights, while the one before it finishes).
GB/s counts the bytes that must move (W + x + y; the split-K workspace is overhead, not counted); the ratio
is to the measured 4270 GB/s copy bandwidth.

Usage: PYTHONPATH=. python3 benchmarks/gemv_bandwidth.py [--out gemv.json] [--reps 50] [--alternatives]
(``--alternatives`` also times another kernel next to each default; such rows are marked ``*``)
(default JSON path: $OUT/gemv_bandwidth.json when $OUT is set).
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import replace

import ml_dtypes
import numpy as np

from rawgraphs.bench.record import BenchResult, collect_metadata, make_row
from rawgraphs.context import Event, Stream, device
from rawgraphs.kernel import LaunchShape, Module
from rawgraphs.memory import DeviceBuffer
from rawgraphs.model.plans import MMA_KERNELS, gemv_plan

HBM_GBS = 4270.0
L2_BYTES = 60 * 2**20
SHAPES = [("qkv", 6144, 2048, "bf16"), ("o", 2048, 2048, "residual"), ("gate_up", 11264, 2048, "silu"),
          ("down", 2048, 5632, "residual"), ("lm_head", 32000, 2048, "f32")]
SMALL_SHAPES = [("s.qkv", 2304, 768, "bf16"), ("s.o", 768, 768, "residual"), ("s.gate_up", 4096, 768, "silu"),
                ("s.down", 768, 2048, "residual"), ("s.lm_head", 32000, 768, "f32")]  # the small config, B = 1
BATCHES = [1, 2, 4, 8, 64, 256]
# Alternatives timed next to the plan's default: (kernel, splits, grid scale); None splits = the plan's choice
# (B = 1's gemv at scale 1 is gemv_unit's launch on the kernel that also holds the general body);
# the grid scale multiplies grid[0] (gemv is correct for any grid: its warp groups stride over the rows; half its
# grid leaves room on the SMs for the next launches, which costs under PDL).
ALTERNATIVES = {1: [("gemv", None, 1), ("gemv", None, 0.5), ("gemv_mma", 1, 1)],
                8: [("gemv", None, 1), ("gemm_tc", None, 1), ("gemm_tc_narrow", None, 1)],
                64: [("gemv_mma", 1, 1)], 256: [("gemv_mma", 1, 1)],
                **{b: [("gemm_tc", None, 1)] for b in (2, 4, 12, 16)}}
STREAM_LAUNCHES = 16
SPIN = """extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}"""


def time_case(mod, spin, stream, name: str, N: int, K: int, out: str, B: int, reps: int,
              kernel: str | None = None, splits: int | None = None, scale: float = 1) -> dict:
    """Median single-launch and back-to-back times of one projection at batch ``B`` (plan overrides:
    ``kernel``, ``splits``, ``scale`` x grid[0])."""
    plan = gemv_plan(B, N, K, out, kernel, splits)
    if scale != 1:
        plan = replace(plan, grid=(max(1, round(plan.grid[0] * scale)), *plan.grid[1:]))
    w_bytes = N * K * 2
    copies = max(2, math.ceil(3 * L2_BYTES / w_bytes))
    ws = [DeviceBuffer((N, K), ml_dtypes.bfloat16) for _ in range(copies)]  # [N, K] each
    for w in ws:
        w.fill_bytes(0x3C, stream)  # bf16 0x3C3C ~ 0.0115: finite, non-zero
    x = DeviceBuffer.from_numpy(np.random.default_rng(0).standard_normal((B, K)).astype(ml_dtypes.bfloat16))
    y = DeviceBuffer((B, N), np.float32 if out == "f32" else ml_dtypes.bfloat16)  # [B, N]
    y.zero(stream)
    work = DeviceBuffer((max(plan.workspace_bytes, 1),), np.uint8)
    counters = DeviceBuffer((max(plan.counters, 1),), np.int32)  # in-kernel split merges: zeros, kept zero
    counters.zero(stream)
    device().synchronize()  # the pageable upload of x has landed
    # Packed argument blocks per weight copy, built once: the timed loop only launches.
    steps = [[(mod.kernel(s.kernel), s.grid, s.block, s.shared, s.args)
              for s in plan.launches(y, x, w, work, B, N, K, counters=counters)] for w in ws]
    steps = [[(k, LaunchShape(g, b, sh), LaunchShape(g, b, sh, pdl=True), k.args(**args))
              for k, g, b, sh, args in launches] for launches in steps]

    def run(i: int, pdl: bool = False) -> None:
        for kernel, shape, pdl_shape, args in steps[i % copies]:
            kernel.launch(pdl_shape if pdl else shape, args, stream)

    spin_k = spin.kernel("spin")
    short, long = spin_k.args(cycles=100_000), spin_k.args(cycles=400_000)  # ~50 us / ~200 us at ~1.98 GHz
    one = LaunchShape((1,), (32,))
    start, end = Event.create(), Event.create()
    single, back, back_pdl = [], [], []
    for i in range(reps + 5):
        spin_k.launch(one, short, stream)
        start.record(stream)
        run(i)
        end.record(stream)
        end.synchronize()
        if i >= 5:
            single.append(start.elapsed_ms(end) * 1e3)
    for pdl, samples in ((False, back), (True, back_pdl)):
        for i in range(max(reps // 5, 5) + 2):
            spin_k.launch(one, long, stream)
            start.record(stream)
            for j in range(STREAM_LAUNCHES):
                run(i * STREAM_LAUNCHES + j, pdl)
            end.record(stream)
            end.synchronize()
            if i >= 2:
                samples.append(start.elapsed_ms(end) * 1e3 / STREAM_LAUNCHES)
    stream.synchronize()
    outs = N // 2 if out == "silu" else N  # outputs per row
    moved = w_bytes + B * K * 2 + B * outs * (4 if out == "f32" else 2) * (2 if out == "residual" else 1)
    us, us_stream, us_pdl = float(np.median(single)), float(np.median(back)), float(np.median(back_pdl))
    for buf in (*ws, x, y, work):
        buf.close()
    return {"name": name, "N": N, "K": K, "out": out, "B": B,
            "plan": "default" if kernel is None else "override",
            "kernel": plan.kernel + (f"x{scale}" if scale != 1 else ""), "grid": list(plan.grid),
            "splits": plan.splits, "mbytes": moved / 1e6, "single_us": us, "stream_us": us_stream,
            "gbs": moved / us / 1e3, "ratio": moved / us / 1e3 / HBM_GBS,
            "stream_gbs": moved / us_stream / 1e3, "stream_ratio": moved / us_stream / 1e3 / HBM_GBS,
            "pdl_us": us_pdl, "pdl_ratio": moved / us_pdl / 1e3 / HBM_GBS,
            "single_samples": single, "stream_samples": back, "pdl_samples": back_pdl}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = os.path.join(os.environ["OUT"], "gemv_bandwidth.json") if os.environ.get("OUT") else \
        "gemv_bandwidth.json"
    ap.add_argument("--out", default=default_out, help="JSON results path")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--alternatives", action="store_true", help="also time the other kernels (tuning)")
    ap.add_argument("--batches", type=int, nargs="+", default=BATCHES, help=f"batch sizes (default {BATCHES})")
    a = ap.parse_args()
    dev = device()
    mod, spin = Module.from_file("gemv"), Module.from_source(SPIN, "spin.cu")
    names = ("gemv", "gemv_unit", "gemv_rows2", "gemv_rows3", *MMA_KERNELS, "gemm_tc", "gemm_tc_narrow",
             "splitk_reduce")
    attrs = {k: mod.kernel(k).attributes() for k in names}
    rows = []
    with Stream.create() as stream:
        for B in a.batches:
            for name, N, K, out in SHAPES + (SMALL_SHAPES if B == 1 else []):
                rows.append(time_case(mod, spin, stream, name, N, K, out, B, a.reps))
                if a.alternatives:
                    for kernel, splits, scale in ALTERNATIVES.get(B, []):
                        rows.append(time_case(mod, spin, stream, name, N, K, out, B, a.reps, kernel, splits,
                                              scale))

    print(f"{dev.name}  registers: " + ", ".join(f"{k}={v['registers']}" for k, v in attrs.items()))
    print(f"{'proj':>8} {'N':>6} {'K':>5} {'B':>4} {'kernel':>15} {'spl':>3} {'MB':>7} {'us':>8} {'GB/s':>6} "
          f"{'/4270':>6} {'strm us':>8} {'GB/s':>6} {'/4270':>6} {'pdl us':>7} {'/4270':>6}")
    for r in rows:
        kernel = r["kernel"] + ("" if r["plan"] == "default" else "*")
        print(f"{r['name']:>8} {r['N']:>6} {r['K']:>5} {r['B']:>4} {kernel:>15} {r['splits']:>3} "
              f"{r['mbytes']:>7.2f} {r['single_us']:>8.2f} {r['gbs']:>6.0f} {r['ratio']:>6.2f} "
              f"{r['stream_us']:>8.2f} {r['stream_gbs']:>6.0f} {r['stream_ratio']:>6.2f} "
              f"{r['pdl_us']:>7.2f} {r['pdl_ratio']:>6.2f}")
    result = BenchResult("gemv_bandwidth", collect_metadata(),
                         params={"hbm_gbs": HBM_GBS, "reps": a.reps, "stream_launches": STREAM_LAUNCHES,
                                 "kernel_attributes": attrs},
                         notes=["single: one plan behind a spin kernel; stream: 16 back-to-back plans / 16; "
                                "stream_pdl: the same launched with programmatic dependent launch",
                                "bytes = W + x + y (residual: y read and written); split-K workspace not "
                                "counted"])
    for r in rows:
        fields = {k: v for k, v in r.items() if not k.endswith("_samples")}
        result.rows.append(make_row(r["single_samples"], "us", timing="single", **fields))
        result.rows.append(make_row(r["stream_samples"], "us", timing="stream", **fields))
        result.rows.append(make_row(r["pdl_samples"], "us", timing="stream_pdl", **fields))
    print(f"wrote {result.write_json(a.out)}")


if __name__ == "__main__":
    main()
