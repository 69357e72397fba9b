"""torch.compile(mode="reduce-overhead") of the PyTorch twin, alone (no rawgraphs model), stage by stage: eager,
capture, compile, replays, generate, and eager / CUDA-graph steps after the compile, each followed by a synchronize.

Run: ``PYTHONPATH=. python3 benchmarks/diagnostics/torch_compile_alone.py [preset] [max_batch]``. Session 3 on the
H200: every stage passes for `1b` with 1 and 64 batch slots (compare_torch's illegal address needs more; README).
"""

import sys
import traceback

import torch

from rawgraphs.compare.torch_model import TorchDecoder
from rawgraphs.model import ModelConfig, Weights

cfg = ModelConfig.preset(sys.argv[1] if len(sys.argv) > 1 else "1b")
tm = TorchDecoder(cfg, Weights.random(cfg, 0), int(sys.argv[2]) if len(sys.argv) > 2 else 1, 48)


def stage(name, fn):
    try:
        fn()
        torch.cuda.synchronize()
        print("ok  ", name, flush=True)
    except Exception as e:
        print("FAIL", name, type(e).__name__, str(e).splitlines()[0], flush=True)
        traceback.print_exc()
        sys.exit(1)


tm._set_inputs([5], [7])
stage("eager x3", lambda: [tm._step(1) for _ in range(3)])
stage("capture", lambda: tm.capture(1))
stage("graph x3", lambda: [tm.graphs[1].replay() for _ in range(3)])
fn, msg = tm.try_compile(1, 300)
print(msg, flush=True)
stage("compile x10", lambda: [fn() for _ in range(10)])
for t in range(3):
    tm._set_inputs([5 + t], [8 + t])
    stage(f"compile pos {8 + t}", fn)
stage("eager after compile", lambda: tm._step(1))
stage("graph after compile", lambda: tm.graphs[1].replay())
stage("generate compile", lambda: tm.generate([[1, 10, 100, 200, 300, 400]], 32, "compile"))
stage("eager x5 after generate", lambda: [tm._step(1) for _ in range(5)])
stage("compile x10 after generate", lambda: [fn() for _ in range(10)])
print("all stages ok")
