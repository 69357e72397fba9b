"""What one iteration of a WHILE node costs the GPU, apart from its body's kernels.

A WHILE graph whose body is K ``noop`` kernels and the ``count_down`` condition kernel, launched for 1 and for
1 + STEPS iterations: (t(1 + STEPS) - t(1)) / STEPS is the GPU time of one iteration. Beside it, one replay of a
flat graph of the same K + 1 kernels. The difference is what the conditional node itself adds per iteration
(evaluating the condition and launching the body again). Both with plain and with programmatic (PDL) edges
between the body's kernels. GPU spans: CUDA events around one launch queued behind a blocker kernel.

Run from the repository root: ``PYTHONPATH=.:benchmarks python3 benchmarks/diagnostics/loop_iteration.py``.
"""

import numpy as np

from rawgraphs.bench import Blocker, time_gpu_queued
from rawgraphs.conditional import add_conditional
from rawgraphs.context import Stream
from rawgraphs.graph import Graph
from rawgraphs.kernel import LaunchShape, Module
from rawgraphs.memory import DeviceBuffer

STEPS, REPEATS = 128, 15
stream = Stream.create()
hold = Blocker(stream, 2)
noop = Module.from_file("basic").kernel("noop")
count_down = Module.from_file("conditional").kernel("count_down")
counter = DeviceBuffer(1, np.int32)  # [1] iterations left


def body_launches(K: int, pdl: bool) -> None:
    for _ in range(K):
        noop.launch(LaunchShape(1, 32, pdl=pdl), noop.args(), stream)


def gpu_us(fn) -> float:
    return float(np.median(time_gpu_queued(fn, stream, hold, REPEATS)))


print(f"{'K':>4} {'pdl':>5} {'iteration us':>13} {'flat K+1 us':>12} {'conditional adds us':>20}")
for K in (1, 10, 84):
    for pdl in (False, True):
        g = Graph()
        loop = add_conditional(g, "while", default=1)
        with Graph.capture(stream, into=loop.bodies[0]):
            body_launches(K, pdl)
            count_down.launch(LaunchShape(1, 1), count_down.args(handle=loop.handle, counter=counter), stream)
        exe = g.instantiate()
        exe.upload(stream)

        def run(n: int, exe=exe) -> None:
            counter.copy_from(np.array([n], np.int32), stream)
            exe.launch(stream)

        per_iter = (gpu_us(lambda: run(1 + STEPS)) - gpu_us(lambda: run(1))) / STEPS
        f = Graph()
        with Graph.capture(stream, into=f):
            body_launches(K + 1, pdl)
        fx = f.instantiate()
        fx.upload(stream)
        flat = gpu_us(lambda fx=fx: fx.launch(stream))
        print(f"{K:4d} {pdl!s:>5} {per_iter:13.2f} {flat:12.2f} {per_iter - flat:20.2f}", flush=True)
        exe.close()
        fx.close()
        g.close()
        f.close()
hold.close()
