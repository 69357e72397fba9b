"""What does cuGraphExecUpdate accept? Try one change at a time against an instantiated 4-node DAG and print the
driver's verdict (through rawgraphs' GraphExec.update, which reports the reason the bindings drop).

    python benchmarks/update_rules.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from rawgraphs import DeviceBuffer, Graph, GraphUpdateError, LaunchShape, Module, gpu_available
from rawgraphs.bench.report import format_table

N = 1024
SHAPE = LaunchShape(N // 256, 256)


def dag(k, bufs, *, c_kernel="add", edge_b=True, extra=None):
    """a, b independent; c = a + b (or another kernel); d after c. Variants change one thing."""
    g = Graph()
    na = g.add_kernel(k["axpb"], SHAPE, {"out": bufs[0], "x": bufs[1], "a": 2.0, "b": 1.0, "n": N}, name="a")
    nb = g.add_kernel(k["axpb"], SHAPE, {"out": bufs[2], "x": bufs[1], "a": 3.0, "b": 0.0, "n": N}, name="b")
    deps = [na, nb] if edge_b else [na]
    if c_kernel == "add":
        nc = g.add_kernel(k["add"], SHAPE, {"out": bufs[3], "x": bufs[0], "y": bufs[2], "n": N}, deps=deps, name="c")
    else:
        nc = g.add_kernel(k["axpb"], SHAPE, {"out": bufs[3], "x": bufs[0], "a": 1.0, "b": 0.0, "n": N}, deps=deps,
                          name="c")
    last = g.add_kernel(k["axpb"], SHAPE, {"out": bufs[4], "x": bufs[3], "a": 0.5, "b": 0.0, "n": N}, deps=nc,
                        name="d")
    if extra == "memset":
        g.add_memset(bufs[5], 0, deps=last, name="extra_memset")
    elif extra == "memset_first":
        g.add_memset(bufs[5], 0, name="extra_memset")
    return g


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="out")
    args = p.parse_args(argv)
    if not gpu_available():
        print("update_rules needs an NVIDIA GPU; none was found.")
        return 0
    m = Module.from_file("basic")
    k = {n: m.kernel(n) for n in ("axpb", "add")}
    bufs = [DeviceBuffer.from_numpy(np.arange(N, dtype=np.float32)) for _ in range(6)]
    cases = {"same topology, new scalars": {}, "one edge removed (c no longer waits for b)": {"edge_b": False},
             "kernel function of c changed": {"c_kernel": "axpb"},
             "a memset node added at the end": {"extra": "memset"},
             "a memset node added as a root": {"extra": "memset_first"}}
    rows = []
    for what, change in cases.items():
        exe = dag(k, bufs).instantiate()
        try:
            exe.update(dag(k, bufs, **change))
            rows.append({"change": what, "verdict": "accepted", "reason": "-", "node": "-"})
        except GraphUpdateError as e:
            rows.append({"change": what, "verdict": "refused", "reason": e.reason, "node": str(e.node)})
    print(format_table(rows, ["change", "verdict", "reason", "node"], title="cuGraphExecUpdate verdicts"))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "update_rules.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
