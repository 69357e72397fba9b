"""Is the device loop's host time a property of how the host waits? `small`, B = 1 and 8, N = 128: after each
loop run, wait by (a) cuStreamSynchronize, (b) a Python loop polling cuStreamQuery, (c) cuStreamSynchronize then
200 us of Python busy work; then time stage_inputs + the launch of the next run.

Run from the repository root: ``PYTHONPATH=. python3 benchmarks/diagnostics/host_wait.py``. Session 3 on the H200:
B=1 ~140 us per run whatever the wait; B=8 148 us after a synchronize, 25 us after polling (README, device loop).
"""

import sys
import time

import numpy as np
from cuda.bindings import driver

sys.path.insert(0, "benchmarks")
from common import CONTEXT, build_model, fill_kv_random, step_inputs

from rawgraphs.context import Stream
from rawgraphs.model.loop import DeviceLoop

stream = Stream.create()
model = build_model("small", 8, kv_tokens=CONTEXT + 129)
fill_kv_random(model, np.random.default_rng(0))
for B in (1, 8):
    inputs = step_inputs(model, B, CONTEXT, np.random.default_rng(1), cover=CONTEXT + 129)
    lp = DeviceLoop(model, B, 128, eos=-5, stream=stream)

    def poll():
        while driver.cuStreamQuery(stream.handle)[0] == driver.CUresult.CUDA_ERROR_NOT_READY:
            pass

    def busy():
        stream.synchronize()
        t = time.perf_counter()
        while time.perf_counter() - t < 200e-6:
            pass

    for name, wait in (("synchronize", stream.synchronize), ("poll cuStreamQuery", poll), ("sync + 200 us busy", busy)):
        st, la = [], []
        lp.start(*inputs)
        wait()
        for _ in range(30):
            t0 = time.perf_counter()
            model.stage_inputs(*inputs)
            t1 = time.perf_counter()
            lp.exe.launch(stream)
            t2 = time.perf_counter()
            wait()
            st.append(t1 - t0)
            la.append(t2 - t1)
        both = np.median(np.add(st, la)) * 1e6
        print(f"B={B} wait by {name:20s}: stage_inputs {np.median(st) * 1e6:7.2f} us, "
              f"launch {np.median(la) * 1e6:7.2f} us, both {both:7.2f} us = {both / 128:.3f} us/token at N=128")
