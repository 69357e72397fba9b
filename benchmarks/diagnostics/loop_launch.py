"""Where the device loop's host time goes. (1) stage_inputs line by line: back to back, right after a loop run +
synchronize, and while a loop runs; the same writes to plain NumPy memory. (2) Host cost of launching a WHILE graph
whose body is K noop kernels + the tail kernel, against a flat graph of K + 1 kernels, and whether it instantiates
for device launch.

Run from the repository root: ``PYTHONPATH=. python3 benchmarks/diagnostics/loop_launch.py``. Session 3 on the
H200: the WHILE launch is 2.6-3.0 us for K = 1..300 (flat: 1.6-1.9 us); every NumPy line of stage_inputs is 5-40x
slower right after a ~35 ms synchronize than back to back; a graph with a conditional node is refused for device
launch (CUDA_ERROR_INVALID_VALUE).
"""

import sys
import time

import numpy as np

sys.path.insert(0, "benchmarks")
from common import CONTEXT, build_model, fill_kv_random, step_inputs

from rawgraphs.conditional import add_conditional
from rawgraphs.context import Stream
from rawgraphs.graph import Graph
from rawgraphs.kernel import LaunchShape, Module
from rawgraphs.memory import DeviceBuffer
from rawgraphs.model.loop import DeviceLoop

stream = Stream.create()


def med(a):
    return f"{np.median(a) * 1e6:8.2f} us (p10 {np.percentile(a, 10) * 1e6:7.2f} p90 {np.percentile(a, 90) * 1e6:7.2f})"


def lines(model, tokens, positions, block_tables):
    t = [time.perf_counter()]
    tokens, positions = np.asarray(tokens, np.int32), np.asarray(positions, np.int32)
    t.append(time.perf_counter())
    tables = np.asarray(block_tables, np.int32)
    B = len(tokens)
    t.append(time.perf_counter())
    bad = not (len(positions) == B == len(tables)) or B > model.max_batch or tables.shape[1] > model.max_blocks
    t.append(time.perf_counter())
    bad = bad or positions.max(initial=-1) >= model.cfg.max_seq_len
    t.append(time.perf_counter())
    model.h_tokens.array[:B] = tokens
    t.append(time.perf_counter())
    model.h_positions.array[:B] = positions
    t.append(time.perf_counter())
    model.h_tables.array[:B] = 0
    t.append(time.perf_counter())
    model.h_tables.array[:B, : tables.shape[1]] = tables
    t.append(time.perf_counter())
    assert not bad
    return np.diff(t)


model = build_model("small", 8, kv_tokens=CONTEXT + 129)
fill_kv_random(model, np.random.default_rng(0))
inputs = step_inputs(model, 1, CONTEXT, np.random.default_rng(1), cover=CONTEXT + 129)
print(
    "types:",
    [type(x).__name__ + str(getattr(x, "dtype", "")) + str(getattr(x, "shape", "")) for x in inputs],
    "h_tables",
    model.h_tables.array.shape,
    model.h_tables.array.flags["C_CONTIGUOUS"],
)
names = [
    "asarray tok/pos",
    "asarray tables",
    "shape checks",
    "positions.max",
    "h_tokens=",
    "h_positions=",
    "h_tables=0",
    "h_tables=tables",
]
back = np.array([lines(model, *inputs) for _ in range(300)])
print("back-to-back, no GPU work:")
[print(f"   {n:16s} {med(back[:, i])}") for i, n in enumerate(names)]
lp = DeviceLoop(model, 1, 128, eos=-5, stream=stream)
after = []
for _ in range(40):
    lp.exe.launch(stream)
    stream.synchronize()
    after.append(lines(model, *inputs))
after = np.array(after)
print("right after a loop run + synchronize:")
[print(f"   {n:16s} {med(after[:, i])}") for i, n in enumerate(names)]
busy = []
for _ in range(20):
    lp.exe.launch(stream)
    busy.append(lines(model, *inputs))
    stream.synchronize()
busy = np.array(busy)
print("while a loop runs:")
[print(f"   {n:16s} {med(busy[:, i])}") for i, n in enumerate(names)]
plain = np.zeros_like(model.h_tables.array)
t = []
for _ in range(40):
    lp.exe.launch(stream)
    stream.synchronize()
    t0 = time.perf_counter()
    plain[:1] = 0
    plain[:1, : inputs[2].shape[1]] = inputs[2]
    t.append(time.perf_counter() - t0)
print("same writes to plain numpy memory after a loop run:", med(t))

noop = Module.from_file("basic").kernel("noop")
tail = Module.from_file("conditional").kernel("decode_loop_tail")
bufs = [DeviceBuffer(1, np.int32) for _ in range(4)] + [DeviceBuffer((4, 1), np.int32), DeviceBuffer(1, np.int32)]


def launch_cost(exe, n=60):
    t = []
    for _ in range(n):
        stream.synchronize()
        t0 = time.perf_counter()
        exe.launch(stream)
        t.append(time.perf_counter() - t0)
    stream.synchronize()
    return med(t)


for K in (1, 10, 30, 100, 300):
    g = Graph()
    loop = add_conditional(g, "while", default=1)
    with Graph.capture(stream, into=loop.bodies[0]):
        for _ in range(K):
            noop.launch(LaunchShape(1, 32), noop.args(), stream)
        tail.launch(
            LaunchShape(1, 32),
            tail.args(
                handle=loop.handle,
                next=bufs[0],
                tokens=bufs[1],
                positions=bufs[2],
                done=bufs[3],
                out=bufs[4],
                step=bufs[5],
                max_steps=1,
                B=1,
                eos=-5,
            ),
            stream,
        )
    exe = g.instantiate()
    exe.upload(stream)
    f = Graph()
    with Graph.capture(stream, into=f):
        for _ in range(K + 1):
            noop.launch(LaunchShape(1, 32), noop.args(), stream)
    fx = f.instantiate()
    fx.upload(stream)
    print(f"K={K:4d} body nodes: WHILE launch {launch_cost(exe)}   flat graph of K+1 launch {launch_cost(fx)}")
    try:
        dx = g.instantiate(device_launch=True)
        dx.upload(stream)
        print(f"K={K:4d} WHILE instantiated for device launch, host launch {launch_cost(dx)}")
        dx.close()
    except Exception as e:
        print(f"K={K:4d} device_launch instantiate refused: {type(e).__name__}: {e}")
    exe.close()
    fx.close()
try:
    dx = lp.graph.instantiate(device_launch=True)
    dx.upload(stream)
    print("small B=1 loop graph instantiated for device launch, host launch", launch_cost(dx))
except Exception as e:
    print(f"loop graph device_launch refused: {type(e).__name__}: {e}")
print("small B=1 loop graph (as DeviceLoop instantiates it), host launch", launch_cost(lp.exe))
