"""How close does paged decode attention come to HBM bandwidth on the KV bytes it must read?

The 1b config's attention (H=16, hd=128; KVH=16 and a GQA variant KVH=4) at B = 1, 8, 64 with every row at
context 512 or 4096, launched with the plan for max_seq_len=4096 (the fixed grid one CUDA graph uses). Each
timed launch is queued behind a ~50 us spin kernel so the GPU never waits for Python, and the KV pool is
rotated over copies that together exceed the 60 MB L2 (cold reads, as in decode). Median of CUDA-event times
(attention alone, attention + combine, and attention with the combine fused in, as the decode step runs it);
GB/s of K+V bytes read and the ratio to the measured 4270 GB/s copy bandwidth. Then:
B=48 with 11 inactive rows next to B=37 (inactive rows must cost next to nothing); B = 1, 8, 64 at context 513
with 0 and 2 K/V pages per warp prefetched into L2 before the PDL wait (the plan prefetches at B = 1 only); B=1 at
context 513 and 4096 with 64, 128 and 256 tokens per split (the fixed cost of a short batch).

Usage: PYTHONPATH=. python3 benchmarks/attention_bandwidth.py [--out results.json] [--reps 50]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace

import ml_dtypes
import numpy as np

from rawgraphs.bench.record import collect_metadata
from rawgraphs.context import Event, Stream, device
from rawgraphs.kernel import LaunchShape, Module
from rawgraphs.memory import DeviceBuffer
from rawgraphs.model.attn_plan import KERNELS, attention_kernel, attention_plan
from rawgraphs.model.reference import rope_tables

HBM_GBS = 4270.0
L2_BYTES = 60 * 2**20
MAX_SEQ = 4096
H, HD = 16, 128
SPIN = """extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}"""


def time_case(mods, stream, kvh: int, batch: int, ctx: int, active: int, reps: int,
              g: int | None = None, partition: int | None = None, prefetch: int | None = None) -> dict:
    """Median time of attention (+ combine) for ``batch`` rows, the first ``active`` of them at context
    ``ctx`` (``g`` forces the query heads per block, ``partition`` the tokens per split, ``prefetch`` the pages
    per warp moved into L2 before the wait)."""
    plan = attention_plan(H, kvh, HD, batch, MAX_SEQ, heads_per_block=g, partition=partition)
    if prefetch is not None:
        plan = replace(plan, prefetch=prefetch)
    max_blocks = MAX_SEQ // 16
    used = active * math.ceil(ctx / 16)  # blocks read per launch
    block_bytes = kvh * 16 * HD * 2  # one cache's block, bf16
    kv_bytes = 2 * used * block_bytes  # K and V
    copies = max(1, math.ceil(4 * L2_BYTES / kv_bytes))
    k_cache = DeviceBuffer((copies * used, kvh, 16, HD), ml_dtypes.bfloat16)  # [NB, KVH, 16, hd]
    v_cache = DeviceBuffer((copies * used, kvh, 16, HD), ml_dtypes.bfloat16)
    k_cache.fill_bytes(0x3C)
    v_cache.fill_bytes(0x3D)
    rng = np.random.default_rng(0)
    tables = []
    for r in range(copies):  # shuffled, non-contiguous blocks; copy r uses its own region of the pool
        t = np.zeros((batch, max_blocks), np.int32)  # [B, max_blocks]
        t[:active, :used // active] = (r * used + rng.permutation(used)).reshape(active, -1)
        tables.append(DeviceBuffer.from_numpy(t))
    positions = DeviceBuffer.from_numpy(np.array([ctx - 1] * active + [-1] * (batch - active), np.int32))
    cos, sin = (DeviceBuffer.from_numpy(t) for t in rope_tables(HD, 500000.0, max_blocks * 16))
    qkv = DeviceBuffer.from_numpy(rng.standard_normal((batch, (H + 2 * kvh) * HD)).astype(ml_dtypes.bfloat16))
    out = DeviceBuffer((batch, H * HD), ml_dtypes.bfloat16)
    part_o = DeviceBuffer(plan.part_o_shape, np.float32)
    part_ml = DeviceBuffer(plan.part_ml_shape, np.float32)

    attn, comb = mods["attention"].kernel(plan.kernel), mods["attention"].kernel("attention_combine")
    spin = mods["spin"].kernel("spin")
    spin_args = spin.args(cycles=100_000)  # ~50 us at ~1.98 GHz: covers the Python launches behind it
    counters = DeviceBuffer(plan.counters_shape, np.int32)  # fused combine; every launch leaves it zero
    counters.zero()
    device().synchronize()
    attn_args, fused_args = ([attn.args(**plan.args(out=out, part_o=part_o, part_ml=part_ml, counters=c, qkv=qkv,
                                                    k_cache=k_cache, v_cache=v_cache, block_tables=t,
                                                    positions=positions, max_blocks=max_blocks, n_kv_heads=kvh,
                                                    rope_cos=cos, rope_sin=sin))
                              for t in tables] for c in (0, counters))
    comb_args = comb.args(**plan.combine_args(out=out, part_o=part_o, part_ml=part_ml, positions=positions,
                                              max_blocks=max_blocks))
    start, mid, end, fstart, fend = (Event.create() for _ in range(5))
    times, attn_times, fused_times = [], [], []
    for i in range(reps + 5):
        spin.launch(LaunchShape(grid=(1,), block=(32,)), spin_args, stream)
        start.record(stream)
        attn.launch(plan.attention, attn_args[i % copies], stream)
        mid.record(stream)
        if plan.combine:
            comb.launch(plan.combine_shape, comb_args, stream)
        end.record(stream)
        spin.launch(LaunchShape(grid=(1,), block=(32,)), spin_args, stream)
        fstart.record(stream)
        attn.launch(plan.attention, fused_args[(i + 1) % copies], stream)
        fend.record(stream)
        fend.synchronize()
        if i >= 5:  # warm-up
            times.append(start.elapsed_ms(end) * 1e3)
            attn_times.append(start.elapsed_ms(mid) * 1e3)
            fused_times.append(fstart.elapsed_ms(fend) * 1e3)
    us = float(np.median(times))
    gbs = kv_bytes / us / 1e3
    return {"kvh": kvh, "g": plan.heads_per_block, "batch": batch, "active": active, "ctx": ctx,
            "partition": plan.partition, "prefetch": plan.prefetch, "splits": plan.max_splits,
            "grid": list(plan.attention.grid),
            "kv_mb": kv_bytes / 2**20,
            "median_us": us, "attention_us": float(np.median(attn_times)),
            "fused_us": float(np.median(fused_times)), "gbs": gbs, "ratio": gbs / HBM_GBS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="attention_bandwidth.json", help="JSON results path")
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    dev = device()
    mods = {"attention": Module.from_file("attention", name_expressions=KERNELS),
            "spin": Module.from_source(SPIN, "spin.cu")}
    shown = [attention_kernel(*v) for v in ((128, 1, False), (128, 1, True), (128, 4, False), (64, 1, False),
                                            (16, 2, False))]
    attrs = {n: mods["attention"].kernel(n).attributes() for n in (*shown, "attention_combine")}
    rows = []
    with Stream.create() as stream:
        for kvh in (16, 4):
            for batch in (1, 8, 64):
                for ctx in (512, 4096):
                    rows.append(time_case(mods, stream, kvh, batch, ctx, batch, a.reps))
        for batch, active in ((37, 37), (48, 37)):
            rows.append(time_case(mods, stream, 16, batch, 4096, active, a.reps))
        for batch in (8, 64):  # GQA with fewer heads per block (K/V read G/g times, the later reads from L2)
            for g in (2, 1):
                rows.append(time_case(mods, stream, 4, batch, 4096, batch, a.reps, g))
        for batch in (1, 8, 64):  # K/V pages per warp prefetched into L2 before the wait: the plan's vs 0 / 2
            for prefetch in (0, 2):
                rows.append(time_case(mods, stream, 16, batch, 513, batch, a.reps, prefetch=prefetch))
        for partition in (64, 128, 256):  # the decode benchmark's B = 1 case (context 512 + the new token)
            for ctx in (513, 4096):
                rows.append(time_case(mods, stream, 16, 1, ctx, 1, a.reps, partition=partition))

    print(f"{dev.name}  H={H} hd={HD} plan max_seq_len={MAX_SEQ}  registers: "
          + ", ".join(f"{n} {a['registers']} (spill {a['local_bytes']} B)" for n, a in attrs.items()))
    print(f"{'KVH':>4} {'G':>2} {'B':>3} {'act':>3} {'ctx':>5} {'part':>4} {'pf':>2} {'spl':>3} {'KV MB':>8} "
          f"{'attn us':>8} {'total us':>8} {'fused us':>8} {'GB/s':>7} {'/4270':>6}")
    for r in rows:
        print(f"{r['kvh']:>4} {r['g']:>2} {r['batch']:>3} {r['active']:>3} {r['ctx']:>5} {r['partition']:>4} "
              f"{r['prefetch']:>2} {r['splits']:>3} {r['kv_mb']:>8.1f} {r['attention_us']:>8.2f} "
              f"{r['median_us']:>8.2f} {r['fused_us']:>8.2f} "
              f"{r['gbs']:>7.0f} {r['ratio']:>6.2f}")
    meta = {**collect_metadata(), "kernel_attributes": attrs, "hbm_gbs": HBM_GBS}  # the harness's metadata
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
