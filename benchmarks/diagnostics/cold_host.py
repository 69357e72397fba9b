"""How much slower host code runs after a pause, with no CUDA at all: the NumPy lines of ``DecodeModel.stage_inputs``
(B = 8 rows into pinned-size arrays), timed cold (right after a gap) and warm (again at once), medians of 15.

Gaps: 30 ms of ``time.sleep``; 30 ms of a ``perf_counter`` busy loop; none; the same two pinned to one CPU; 30 ms of a
pure-Python arithmetic loop (no system calls); 30 ms of NumPy sums over a 64 MB array; a 1 ms sleep. Run: ``python3
benchmarks/diagnostics/cold_host.py`` (any machine). Session 19, the H200 machine's host: warm 5.1-5.3 us, cold 113-149
us after every 30 ms gap (the pure arithmetic loop included, pinned or not), 12 us after 1 ms; our CPU: 3.2-3.9 ->
7.5-72 us. This is why the device loop's host time per token misses 0.2 us at N = 128 (README, "On-device decode loop").
"""

import json
import os
import time

import numpy as np

h_tok, h_pos, h_tab = np.zeros(8, np.int32), np.zeros(8, np.int32), np.zeros((8, 256), np.int32)
INPUTS = (np.arange(8), np.arange(8) + 500, np.arange(8 * 40).reshape(8, 40))


def stage(tokens, positions, tables) -> None:
    """stage_inputs' lines: convert, check, write into the staging arrays."""
    tokens, positions, tables = (np.asarray(a, np.int32) for a in (tokens, positions, tables))
    B = len(tokens)
    if positions.max(initial=-1) >= 4096:
        raise ValueError("position past the end")
    if tables.view(np.uint32).max(initial=0) >= 4096 or tokens.view(np.uint32).max(initial=0) >= 32000:
        raise ValueError("an id past the end")  # session 25's id checks
    h_tok[:B], h_pos[:B], h_tab[:B] = tokens, positions, 0
    h_tab[:B, :tables.shape[1]] = tables


def trial(gap) -> dict:
    cold, warm = [], []
    for _ in range(15):
        gap()
        t0 = time.perf_counter()
        stage(*INPUTS)
        t1 = time.perf_counter()
        stage(*INPUTS)
        cold.append(t1 - t0)
        warm.append(time.perf_counter() - t1)
    return {"cold_us": round(float(np.median(cold)) * 1e6, 2), "warm_us": round(float(np.median(warm)) * 1e6, 2)}


def busy() -> None:
    end = time.perf_counter() + 0.03
    while time.perf_counter() < end:
        pass


def arithmetic(n=[0]) -> None:  # noqa: B006 - the calibrated count is kept between calls
    if not n[0]:
        t0, x = time.perf_counter(), 0
        for i in range(200000):
            x += i
        n[0] = int(200000 * 0.03 / (time.perf_counter() - t0))
    x = 0
    for i in range(n[0]):
        x += i


def numpy_sums() -> None:
    a, end = np.ones(8 << 20), time.perf_counter() + 0.03
    while time.perf_counter() < end:
        a.sum()


def main() -> None:
    res = {"cpus": os.cpu_count()}
    for name, gap in (("sleep30ms", lambda: time.sleep(0.03)), ("busy30ms", busy), ("nogap", lambda: None)):
        res[name] = trial(gap)
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    for name, gap in (("pinned_sleep30ms", lambda: time.sleep(0.03)), ("pinned_busy30ms", busy),
                      ("pinned_arithmetic30ms", arithmetic), ("pinned_numpy30ms", numpy_sums),
                      ("pinned_sleep1ms", lambda: time.sleep(0.001))):
        res[name] = trial(gap)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
