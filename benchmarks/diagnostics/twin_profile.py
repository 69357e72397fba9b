"""Where a PyTorch twin's decode step spends its GPU time: torch.profiler's kernel table of its CUDA-graph replays.

compare_torch.py reads the torch target against the plain twin's graph step (1b B=1: 1816.6 us in session 27, 4.2x
the bandwidth floor, 3.2x rawgraphs' step). This prints, per kernel name, launches and GPU us per step, grouped as
matmul (cuBLAS / CUTLASS GEMM and GEMV), attention (SDPA / flash) and the rest (elementwise, reductions, copies),
beside the replay's own CUDA-event time, so the gap between kernel time and step time (launch gaps) shows too.
Same model, weights and cache length (48 slots, context 38) as compare_torch.py.

Run on a GPU: ``PYTHONPATH=. python3 benchmarks/diagnostics/twin_profile.py [preset] [--batch B] [--exact]``
(``--exact``: the exact twin, TorchDecoder, instead of the plain one). cuBLAS's GEMMs on the H200 are ``nvjet_*``
kernels (torch 2.11).
"""

import argparse
from collections import defaultdict

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from rawgraphs.compare import PlainTorchDecoder, TorchDecoder
from rawgraphs.model import ModelConfig, Weights

MAX_LEN, CONTEXT = 48, 37  # compare_torch.py's cache slots; the position its last steps decode at
WARMUP, STEPS = 100, 50  # replays before timing (clocks ramp: after 1 + 20, session 27 read both twins ~15% slow)


def kind(name: str) -> str:
    n = name.lower()
    if any(s in n for s in ("gemm", "gemv", "cutlass", "xmma", "nvjet", "splitk", "cublas")):
        return "matmul"
    if any(s in n for s in ("flash", "attention", "fmha", "sdpa", "softmax")):
        return "attention"
    return "other"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", nargs="?", default="1b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--exact", action="store_true", help="profile TorchDecoder (the exact twin)")
    ap.add_argument("--top", type=int, default=12)
    opts = ap.parse_args()
    B, cfg = opts.batch, ModelConfig.preset(opts.preset)
    twin = (TorchDecoder if opts.exact else PlainTorchDecoder)(cfg, Weights.random(cfg, 0), B, MAX_LEN)
    twin.step_graph(np.arange(1, B + 1), np.full(B, CONTEXT))  # captures, then one replay
    graph = twin.graphs[B]
    for _ in range(WARMUP):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(STEPS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    step_us = start.elapsed_time(end) * 1e3 / STEPS
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            graph.replay()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])  # kernel name -> [launches, us] over STEPS replays
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            per[e.name][0] += 1
            per[e.name][1] += e.device_time_total
    if not per:
        print("the profiler saw no kernels inside the graph replays (CUPTI without graph kernel records?)")
        return 1
    total = sum(us for _, us in per.values()) / STEPS
    launches = sum(n for n, _ in per.values()) / STEPS
    name = "exact twin (TorchDecoder)" if opts.exact else "plain twin (PlainTorchDecoder)"
    print(f"{opts.preset} B={B} {name}: graph step {step_us:.1f} us (CUDA events, {STEPS} replays); "
          f"{launches:.0f} kernels per step, {total:.1f} us of kernel time; the rest, {step_us - total:.1f} us, is "
          f"gaps between kernels")
    by_kind = defaultdict(lambda: [0.0, 0.0])
    for k, (n, us) in per.items():
        by_kind[kind(k)][0] += n / STEPS
        by_kind[kind(k)][1] += us / STEPS
    for k, (n, us) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k:9s} {n:6.0f} kernels  {us:8.1f} us  ({us / n:.2f} us each)")
    print(f"top {opts.top} kernels by GPU time per step:")
    for k, (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1])[:opts.top]:
        print(f"  {us / STEPS:8.1f} us  {n / STEPS:5.0f} x  {kind(k):9s} {k[:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
