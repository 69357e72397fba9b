"""What each kind of launch costs the decode step *inside the graph*: the step as explicit nodes, timed whole and
again without every launch of one kind (qkv, attention, o_proj, ...). Isolated kernel times (ncu, or
gemv_bandwidth.py) miss what programmatic dependent launch overlaps and what a launch boundary costs; the
difference a left-out kind makes is its in-situ cost. The results are wrong without it, only the time counts.
Beside each kind: the bytes one launch must read, their time at the measured copy bandwidth, and the excess (in-situ
cost - bytes time): the fixed part of a launch, which a card with other bandwidth leaves about where it is.

Run from the repository root: ``PYTHONPATH=. python3 benchmarks/diagnostics/step_costs.py [preset [B]]``
(default ``1b 1``). Session 6 on the H200, 1b B=1, context 512 (778.7 us): qkv 8.9, attention 7.0, o 5.4,
gate_up 12.9, down 10.6 us per launch, LM head 30.4 us, embed and argmax ~1 us (benchmarks/NOTES.md).
"""

import sys

import numpy as np

sys.path.insert(0, "benchmarks")
from common import CONTEXT, fill_kv_random, median, step_inputs, time_ms

from rawgraphs.bench.bandwidth import copy_bandwidth_gbs
from rawgraphs.context import Stream
from rawgraphs.graph import Graph
from rawgraphs.model import ModelConfig, Weights
from rawgraphs.model.decode import DecodeModel


def kind(name: str) -> str:
    """A launch's kind: its name without the layer ("L3.gate_up" -> "gate_up"; split-K reduces: "reduce")."""
    return "reduce" if name.endswith(".reduce") else name.split(".")[-1]


def launch_bytes(cfg: ModelConfig, B: int, context: int) -> dict[str, int]:
    """Bytes one launch of each weight- or KV-streaming kind must read (bf16): its weights, or the rows' K and V."""
    d, w = cfg.dim, 2
    return {"qkv": w * cfg.qkv_dim * d, "attention": w * 2 * cfg.kv_dim * context * B, "o_proj": w * d * cfg.q_dim,
            "gate_up": w * 2 * cfg.ffn_dim * d, "down": w * d * cfg.ffn_dim, "lm_head": w * cfg.vocab * d}


def replay_us(launches, stream: Stream, prepare=None) -> float:
    """Median replay time (us) of ``launches`` as one graph of explicit nodes in a chain; ``prepare(exe)``, if
    given, edits the executable first (e.g. ``exe.retarget``)."""
    g, prev = Graph(), None
    for ln in launches:
        prev = g.add_kernel(ln.kernel, ln.shape, ln.args, deps=prev)
    exe = g.instantiate()
    if prepare is not None:
        prepare(exe)
    exe.upload(stream)
    us = median(time_ms(lambda: exe.launch(stream), stream, False)) * 1e3
    stream.synchronize()
    exe.close()
    g.close()
    return us


def main(preset: str = "1b", B: int = 1) -> None:
    cfg = ModelConfig.preset(preset)
    stream = Stream.create()
    model = DecodeModel(cfg, Weights.random(cfg, 0), max_batch=B, kv_tokens=CONTEXT + 16)
    rng = np.random.default_rng(0)
    fill_kv_random(model, rng)
    model.set_inputs(*step_inputs(model, B, CONTEXT, rng), stream)
    launches = model.step_launches(B)
    whole = replay_us(launches, stream)
    gbs = copy_bandwidth_gbs(stream)
    nbytes = launch_bytes(cfg, B, CONTEXT)
    print(f"{preset} B={B}, context {CONTEXT}: {len(launches)} launches, step {whole:.1f} us; copy bandwidth "
          f"{gbs:.0f} GB/s")
    print(f"  {'kind (step without it)':40s} {'n':>5s} {'step us':>8s} {'us/launch':>10s} {'MB/launch':>10s} "
          f"{'bytes us':>9s} {'excess us':>10s}")
    excess_layer = 0.0
    for k in dict.fromkeys(kind(ln.name) for ln in launches):  # in step order
        rest = [ln for ln in launches if kind(ln.name) != k]
        n = len(launches) - len(rest)
        per = (whole - replay_us(rest, stream)) / n
        row = f"  {k:40s} {n:5d} {whole - per * n:8.1f} {per:10.2f}"
        if k in nbytes:
            floor_us = nbytes[k] / (gbs * 1e3)
            row += f" {nbytes[k] / 1e6:10.2f} {floor_us:9.2f} {per - floor_us:10.2f}"
            excess_layer += (per - floor_us) if n == cfg.n_layers else 0.0
        print(row)
    print(f"  excess over the bytes per layer (qkv, attention, o_proj, gate_up, down): {excess_layer:.2f} us, "
          f"{excess_layer * cfg.n_layers:.1f} us per step")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if args else "1b", int(args[1]) if len(args) > 1 else 1)
