"""Per-block timestamps of the decode step: when each block of each launch reached its PDL wait, when the wait
let it go, and (the gemv kernels: ``gemv``, ``gemv_unit``, ``gemv_rows2/3``) when it started, had its input in
shared memory, had stored its units and finished. It shows what a launch boundary is made of on the GPU itself::

    model = DecodeModel(cfg, weights, compile_options=("-DRG_TRACE",))   # kernels/pdl.cuh's trace compiled in
    trace = BlockTrace(model.modules)
    trace.reset()
    model.run_eager(B, stream)            # or a graph replay
    stream.synchronize()
    spans = launch_spans(trace.records(), [ln.name for ln in model.step_launches(B)])

Times are ``%globaltimer`` nanoseconds (one clock for every SM). The trace costs an atomic and eight stores per
block (plus a block barrier in the gemv kernels), so compare a traced step with an untraced one before reading small
gaps.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..errors import CudaError
from ..memory import DeviceBuffer, DeviceView

__all__ = ["BlockTrace", "LaunchSpan", "launch_spans"]

RECORD = np.dtype([("grid", "<u8"), ("where", "<u8"), ("arrived", "<u8"), ("released", "<u8"),
                   ("exit", "<u8"), ("entered", "<u8"), ("staged", "<u8"), ("summed", "<u8")])  # pdl.cuh's
# record; where = smid << 32 | block; exit, entered, staged and summed 0 = none (only the gemv kernels record
# them). Records saved before session 37 lack staged and summed: launch_spans reads them as none.
_WORDS = RECORD.itemsize // 8
_HEAD = 16  # u64 before the per-SM counters
_LINE = 16  # u64 per SM counter (one 128-byte line each)


class BlockTrace:
    """The trace buffer of ``modules`` (compiled with ``-DRG_TRACE``): up to ``per_sm`` records per SM on SMs
    with ``%smid < sms``."""

    def __init__(self, modules, per_sm: int = 1024, sms: int = 256):
        self.per_sm, self.sms = per_sm, sms
        self._records_at = _HEAD + _LINE * sms
        self.buf = DeviceBuffer(self._records_at + _WORDS * per_sm * sms, np.uint64)
        self._symbols = []
        for mod in modules:
            try:
                self._symbols.append(mod.symbol("rg_trace", np.uint64))
            except CudaError as e:
                raise ValueError(f"module {mod.program.name} has no rg_trace: build the model with "
                                 "compile_options=('-DRG_TRACE',)") from e
        self.reset()
        self._point(self.buf.ptr)

    def _point(self, ptr: int) -> None:
        for sym in self._symbols:
            sym.copy_from(np.array([ptr], np.uint64))

    def _head(self) -> DeviceView:
        return DeviceView(self.buf.ptr, self._records_at, np.uint64, owner=self.buf)

    def reset(self) -> None:
        """Forget the records (synchronous: call it between steps, not during capture)."""
        head = np.zeros(self._records_at, np.uint64)
        head[:2] = self.per_sm, self.sms
        self._head().copy_from(head)

    def records(self) -> np.ndarray:
        """The records written since :meth:`reset` (synchronous read), as a :data:`RECORD` array."""
        counts = self._head().to_numpy()[_HEAD::_LINE]
        if counts.max() > self.per_sm:
            raise RuntimeError(f"trace overflow: {int(counts.max())} records on one SM for {self.per_sm} per SM; "
                               "reset between steps or pass a larger per_sm")
        every = DeviceView(self.buf.ptr + 8 * self._records_at, _WORDS * self.per_sm * self.sms, np.uint64,
                           owner=self.buf).to_numpy().view(RECORD).reshape(self.sms, self.per_sm)
        return np.concatenate([every[sm, :int(n)] for sm, n in enumerate(counts)])

    def close(self) -> None:
        """Point the modules back at nothing (they stop recording) and free the buffer."""
        if not self.buf.closed:
            self._point(0)
            self.buf.close()


class LaunchSpan(NamedTuple):
    """One launch's blocks that waited (attention blocks past a row's context return at once, unrecorded), in ns
    from the first arrival of the traced step; entries, exits and prologue NaN where none were traced."""

    name: str
    blocks: int
    arrive: tuple[float, float]   # first, last block at the PDL wait
    release: tuple[float, float]  # first, last block past the wait
    exit: tuple[float, float]     # first, last block done (gemv only)
    enter: tuple[float, float]    # first, last block started (gemv only)
    prologue: float               # median over blocks of start -> arrival at the wait (gemv only)
    busy: tuple[float, float]     # median, longest over blocks of its own release -> its exit (gemv only)
    stage: float = math.nan       # median over blocks of release -> input in shared memory (gemv only)
    units: float = math.nan       # median over blocks of input staged -> thread 0's warp's last unit stored


def launch_spans(records: np.ndarray, names) -> list[LaunchSpan]:
    """Group ``records`` by launch (``%gridid`` grows with every launch, so its order is the step's) and name
    them ``names`` in order; a different launch count is an error (a launch with no waiting block, or two
    steps)."""
    names = list(names)
    grids = np.unique(records["grid"])
    if len(grids) != len(names):
        raise ValueError(f"the trace holds {len(grids)} launches, the step has {len(names)}")
    t_ref = int(records["arrived"].min())
    spans = []
    for name, grid in zip(names, grids, strict=True):
        r = records[records["grid"] == grid]
        started, done = r[r["entered"] != 0], r[r["exit"] != 0]
        busy = done["exit"].astype(np.int64) - done["released"].astype(np.int64)
        marks = (math.nan, math.nan)  # stage, units: records saved before session 37 have no marks
        if "staged" in r.dtype.names:
            m = r[(r["staged"] != 0) & (r["summed"] != 0)]
            marks = _median_gap(m["released"], m["staged"]), _median_gap(m["staged"], m["summed"])
        spans.append(LaunchSpan(name, len(r), _first_last(r["arrived"], t_ref), _first_last(r["released"], t_ref),
                                _first_last(done["exit"], t_ref), _first_last(started["entered"], t_ref),
                                _median_gap(started["entered"], started["arrived"]),
                                (float(np.median(busy)), float(busy.max())) if len(busy) else (math.nan, math.nan),
                                *marks))
    return spans


def _median_gap(t0: np.ndarray, t1: np.ndarray) -> float:
    return float(np.median(t1.astype(np.int64) - t0.astype(np.int64))) if len(t0) else float("nan")


def _first_last(t: np.ndarray, t_ref: int) -> tuple[float, float]:
    if not len(t):
        return float("nan"), float("nan")
    t = t.astype(np.int64) - t_ref
    return float(t.min()), float(t.max())
