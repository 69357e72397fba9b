"""Does nesting the decode loop inside another conditional node cost GPU time? (session 32)

The resident loop (rawgraphs/model/resident.py) runs the device loop's WHILE inside an outer WHILE. This times, per
token at N = 128 and context 512, in interleaved rounds: DeviceLoop as is; the same decode part inside an IF
(default 1); inside a WHILE that runs once (count_down); and ResidentLoop. Timers: wall (perf_counter from launch or
ring to the results; a 128-token run lasts 28-180 ms, so a few us of latency is < 0.1%), CUDA events around one
launch queued behind a blocker, and for the resident loop its own globaltimer span. All four must give the same
tokens.

Run: ``PYTHONPATH=. python benchmarks/diagnostics/nesting_probe.py small,1b``.
Session 32 (H100): all four within 0.5% of each other at B = 1 and 8 on both models
(benchmarks/results/session32/nesting_probe_h100.log).
"""

from __future__ import annotations

import sys
import time

import numpy as np

sys.path.insert(0, "benchmarks")
from common import CONTEXT, build_model, fill_kv_random, no_gpu, step_inputs

from rawgraphs.bench import Blocker, time_gpu_queued
from rawgraphs.conditional import add_conditional
from rawgraphs.context import Stream
from rawgraphs.kernel import LaunchShape
from rawgraphs.memory import DeviceBuffer
from rawgraphs.model.loop import DeviceLoop
from rawgraphs.model.resident import ResidentLoop

N, NEVER, ROUNDS = 128, -5, 3


class InIf(DeviceLoop):
    """The decode part inside an IF node whose handle defaults to 1."""

    def _build(self, g):
        self._add_decode(add_conditional(g, "if", default=1, name="outer").bodies[0], deps=[])


class InWhileOnce(DeviceLoop):
    """The decode part inside a WHILE whose body ends with count_down on a counter set to 1 before each run."""

    def _build(self, g):
        self.counter = DeviceBuffer(1, np.int32)
        outer = add_conditional(g, "while", default=1, name="outer")
        body = outer.bodies[0]
        self._add_decode(body, deps=[])
        cd = self.module.kernel("count_down")
        body.add_kernel(cd, LaunchShape(1, 1), cd.args(handle=outer.handle, counter=self.counter),
                        deps=[body.node("loop_end")])

    def start(self, tokens, positions, block_tables):
        self.counter.copy_from(np.ones(1, np.int32))
        super().start(tokens, positions, block_tables)


def probe(preset: str, B: int, stream: Stream, rng) -> None:
    model = build_model(preset, 8, kv_tokens=CONTEXT + N + 1)
    fill_kv_random(model, rng)
    inputs = step_inputs(model, B, CONTEXT, rng, cover=CONTEXT + N + 1)
    hold = Blocker(stream, 3)
    loops = {"loop": DeviceLoop(model, B, N, NEVER, stream), "in if": InIf(model, B, N, NEVER, stream),
             "in while": InWhileOnce(model, B, N, NEVER, stream)}
    wall = {k: [] for k in [*loops, "resident"]}
    gpu = {k: [] for k in wall}
    tokens = {}
    for _ in range(ROUNDS):
        for name, loop in loops.items():
            stream.synchronize()
            t0 = time.perf_counter()
            loop.start(*inputs)
            stream.synchronize()
            wall[name].append((time.perf_counter() - t0) * 1e6 / N)
            tokens[name] = loop.h_out.array.copy()
            gpu[name] += [us / N for us in time_gpu_queued(lambda lp=loop: lp.start(*inputs), stream, hold, 2)]
        with ResidentLoop(model, B, N, NEVER, stream) as res:
            res.run(*inputs)
            for _ in range(ROUNDS):
                t0 = time.perf_counter()
                res.submit()
                res.wait()
                wall["resident"].append((time.perf_counter() - t0) * 1e6 / N)
                gpu["resident"].append(res.gpu_ns / 1e3 / N)
            tokens["resident"] = res.h_out.array.copy()
    for name in wall:
        print(f"{preset} B={B} {name:9s} wall {np.median(wall[name]):8.2f}  events/globaltimer "
              f"{np.median(gpu[name]):8.2f} us/token  (wall {min(wall[name]):.2f}-{max(wall[name]):.2f})")
    print(f"{preset} B={B} tokens equal: {all(np.array_equal(t, tokens['loop']) for t in tokens.values())}")
    hold.close()


def main() -> int:
    if no_gpu("benchmarks/diagnostics/nesting_probe.py"):
        return 0
    stream, rng = Stream.create(), np.random.default_rng(3)
    for preset in (sys.argv[1] if len(sys.argv) > 1 else "small").split(","):
        for B in (1, 8):
            probe(preset, B, stream, rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
