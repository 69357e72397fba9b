"""What each kind of launch costs the decode step *inside the graph*: the step as explicit nodes, timed whole and
again without every launch of one kind (qkv, attention, o_proj, ...). Isolated kernel times (ncu, or
gemv_bandwidth.py) miss what programmatic dependent launch overlaps and what a launch boundary costs; the
difference a left-out kind makes is its in-situ cost. The results are wrong without it, only the time counts.

Run from the repository root: ``PYTHONPATH=. python3 benchmarks/diagnostics/step_costs.py [preset [B]]``
(default ``1b 1``). Session 6 on the H200, 1b B=1, context 512 (778.7 us): qkv 8.9, attention 7.0, o 5.4,
gate_up 12.9, down 10.6 us per launch, LM head 30.4 us, embed and argmax ~1 us (benchmarks/NOTES.md).
"""

import sys

import numpy as np

sys.path.insert(0, "benchmarks")
from common import CONTEXT, fill_kv_random, median, step_inputs, time_ms

from rawgraphs.context import Stream
from rawgraphs.graph import Graph
from rawgraphs.model import ModelConfig, Weights
from rawgraphs.model.decode import DecodeModel


def kind(name: str) -> str:
    """A launch's kind: its name without the layer ("L3.gate_up" -> "gate_up"; split-K reduces: "reduce")."""
    return "reduce" if name.endswith(".reduce") else name.split(".")[-1]


def replay_us(launches, stream: Stream) -> float:
    g, prev = Graph(), None
    for ln in launches:
        prev = g.add_kernel(ln.kernel, ln.shape, ln.args, deps=prev)
    exe = g.instantiate()
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
    print(f"{preset} B={B}, context {CONTEXT}: {len(launches)} launches, step {whole:.1f} us")
    for k in dict.fromkeys(kind(ln.name) for ln in launches):  # in step order
        rest = [ln for ln in launches if kind(ln.name) != k]
        n = len(launches) - len(rest)
        without = replay_us(rest, stream)
        print(f"  without {k:32s} ({n:3d}): {without:8.1f} us -> {(whole - without) / n:6.2f} us per launch")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if args else "1b", int(args[1]) if len(args) > 1 else 1)
