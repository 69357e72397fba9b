"""compare_torch's `1b` run with torch.compile, for the given batch sizes (default 1 8), without the `small`
run before it: ``PYTHONPATH=. python3 benchmarks/diagnostics/torch_compile_in_compare.py [B ...]``.

Session 3 on the H200: passes for (1, 8) under CUDA_LAUNCH_BLOCKING=1 and for (1, 64) without it (torch.compile
1387 us per `1b` B=1 step), while the full compare_torch.py (`small` first) faults after the compile.
"""

import sys

sys.path.insert(0, "benchmarks")
import compare_torch as ct

from rawgraphs.context import Stream, device

dev = device()

notes = []
with Stream.create() as stream:
    checks, rows = ct.run_model("1b", tuple(int(b) for b in sys.argv[1:]) or (1, 8), 0, True, True, stream, dev, notes)
for r in rows:
    print(r["method"], r["batch"], f"{r['summary']['median']:.1f} us")
print("\n".join(notes))
print("all ok")
