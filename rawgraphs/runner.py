"""``DecodeRunner``: one graph per capture size, padding, shared buffers, loud fallbacks (seed exercises B-D).

What serving engines do around their graphs, in the open. Every captured size launches into the *same* static
buffers of one :class:`~rawgraphs.model.decode.DecodeModel` (they never run concurrently), so capturing 14 sizes
costs little more device memory than the largest alone. A batch of ``B`` rows runs on the smallest captured
size ``>= B``; the padding rows are marked inactive in data (position -1) so attention and the projections
skip them. Nothing falls back to eager silently: by default a batch with no graph raises, and the opt-in
fallback warns once and counts every such step in ``runner.stats``.
"""

from __future__ import annotations

import bisect
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from cuda.bindings import driver

from .context import Stream, device
from .errors import CaptureError, check
from .executable import GraphExec
from .model.decode import DecodeModel, rows_agree

__all__ = ["DEFAULT_CAPTURE_SIZES", "DecodeRunner", "CaptureReport", "NoGraphError", "pick_size", "pad_inputs"]

# 3 has a plan of its own (the projections' gemv_rows3 where the model is wide enough): 1b's step at 3 rows took
# 1050 us against 1145 padded to 4 (H200, session 17); 5-7 run gemv_mma's 8-row tile like 8 does.
DEFAULT_CAPTURE_SIZES = (1, 2, 3, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
FALLBACKS = ("raise", "eager")


class NoGraphError(RuntimeError):
    """A step needed a graph that does not exist (batch above the largest capture size, or a failed capture)."""


def pick_size(B: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest captured size ``>= B`` (``sizes`` sorted), or None when ``B`` is above them all."""
    if B < 1:
        raise ValueError(f"batch must be >= 1, got {B}")
    i = bisect.bisect_left(sizes, B)
    return sizes[i] if i < len(sizes) else None


def pad_inputs(tokens, positions, tables, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``B..size-1`` as inactive padding: token 0, position -1, block table of zeros."""
    tokens, positions, tables = (np.asarray(a, np.int32) for a in (tokens, positions, tables))
    B = len(tokens)
    if not rows_agree(tokens, positions, tables) or B > size:
        raise ValueError(f"inputs must be [B], [B], [B, MB] with B <= {size}; "
                         f"got {tokens.shape}, {positions.shape}, {tables.shape}")
    pt = np.zeros(size, np.int32)                                # [size]
    pp = np.full(size, -1, np.int32)                             # [size]
    ptab = np.zeros((size, tables.shape[1]), np.int32)           # [size, MB]
    pt[:B], pp[:B], ptab[:B] = tokens, positions, tables
    return pt, pp, ptab


@dataclass(frozen=True)
class CaptureReport:
    """What capturing one size cost."""

    size: int
    capture_ms: float
    instantiate_ms: float
    upload_ms: float
    nodes: int
    device_bytes: int  # driver free-memory drop across capture + instantiate + upload
    graph_mem_reserved: int  # graph memory pool reserved after this size (cuDeviceGetGraphMemAttribute)


@dataclass
class RunnerStats:
    """Counts of every step: by graph size, eager fallbacks (never silent), padded rows."""

    graph_steps: Counter = field(default_factory=Counter)
    eager_steps: int = 0
    fallback_steps: int = 0
    padded_rows: int = 0


class DecodeRunner:
    """Graphs for a list of batch sizes over one model's static buffers.

    Parameters
    ----------
    model : DecodeModel with ``max_batch >= max(capture_sizes)``.
    capture_sizes : batch sizes to capture (sorted, unique).
    eager : run every step eagerly at its exact size (``--enforce-eager``: debugging only).
    fallback : ``"raise"`` (default) or ``"eager"``: what a step without a graph does.
    """

    def __init__(self, model: DecodeModel, capture_sizes=DEFAULT_CAPTURE_SIZES, *, eager: bool = False,
                 fallback: str = "raise", stream: Stream | None = None):
        sizes = tuple(sorted(set(int(s) for s in capture_sizes)))
        if not sizes or sizes[0] < 1:
            raise ValueError(f"capture sizes must be positive ints, got {capture_sizes!r}")
        if sizes[-1] > model.max_batch:
            raise ValueError(f"largest capture size {sizes[-1]} exceeds the model's max_batch {model.max_batch}")
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
        self.model, self.sizes, self.eager, self.fallback = model, sizes, eager, fallback
        self.stream = stream or Stream.create()
        self.graphs: dict[int, GraphExec] = {}
        self.reports: list[CaptureReport] = []
        self.failures: dict[int, CaptureError] = {}
        self.stats = RunnerStats()
        self._warned = False

    def capture(self, progress: bool = True) -> list[CaptureReport]:
        """Capture, instantiate and upload a graph for every size (largest first, so the graph memory pool is
        sized once). A failed capture raises unless the fallback policy is ``eager`` (then it is recorded in
        ``failures`` and that size's steps fall back, loudly)."""
        if self.eager:
            return []
        from .bench.report import progress as bar
        dev = device()
        order = sorted(self.sizes, reverse=True)
        for size in (bar(order, label="capturing") if progress else order):
            self.model.step_launches(size)  # plan outside the timed capture
            dev.synchronize()
            free0 = dev.memory_info()[0]
            t0 = time.perf_counter()
            try:
                graph = self.model.capture(size, self.stream)
            except CaptureError as e:
                if self.fallback == "raise":
                    raise
                self.failures[size] = e
                continue
            t1 = time.perf_counter()
            exe = graph.instantiate()
            exe.upload(self.stream)
            self.graphs[size] = exe
            self.reports.append(CaptureReport(size, (t1 - t0) * 1e3, exe.instantiate_ms, exe.upload_ms,
                                              graph.node_count(), free0 - dev.memory_info()[0],
                                              graph_memory()["reserved_current"]))
        self.reports.sort(key=lambda r: r.size)
        return self.reports

    def step(self, tokens, positions, block_tables) -> np.ndarray:
        """One decode step for ``B = len(tokens)`` rows; returns their greedy next tokens ``[B]``."""
        B = len(tokens)
        m, s = self.model, self.stream
        if self.eager:
            m.set_inputs(tokens, positions, block_tables, s)
            m.run_eager(B, s)
            self.stats.eager_steps += 1
            return m.read_tokens(B, s)
        size = pick_size(B, self.sizes)
        exe = self.graphs.get(size) if size is not None else None
        if exe is None:
            return self._fallback(B, size, tokens, positions, block_tables)
        m.set_inputs(*pad_inputs(tokens, positions, block_tables, size), s)
        exe.launch(s)
        self.stats.graph_steps[size] += 1
        self.stats.padded_rows += size - B
        return m.read_tokens(B, s)

    def _fallback(self, B, size, tokens, positions, block_tables) -> np.ndarray:
        why = (f"batch {B} is above the largest capture size {self.sizes[-1]}" if size is None
               else f"the capture of size {size} failed: {self.failures.get(size)}")
        if B > self.model.max_batch:
            raise NoGraphError(f"no graph for this step: {why}, and the model's buffers hold {self.model.max_batch} "
                               f"rows: build the DecodeModel with max_batch >= {B}.")
        if self.fallback == "raise":
            raise NoGraphError(f"no graph for this step: {why}. Capture a larger size, or pass "
                               "fallback='eager' to run such steps eagerly (counted in runner.stats).")
        if not self._warned:
            warnings.warn(f"rawgraphs: running eagerly because {why}; every such step is counted in "
                          "runner.stats.fallback_steps", RuntimeWarning, stacklevel=3)
            self._warned = True
        self.stats.fallback_steps += 1
        m = self.model
        m.set_inputs(tokens, positions, block_tables, self.stream)
        m.run_eager(B, self.stream)
        return m.read_tokens(B, self.stream)

    def report(self) -> str:
        """The startup report: per size capture/instantiate/upload time, nodes, memory; then totals."""
        from .bench.report import format_table
        rows = [{"size": r.size, "capture ms": r.capture_ms, "instantiate ms": r.instantiate_ms,
                 "upload ms": r.upload_ms, "nodes": r.nodes, "device MiB": r.device_bytes / 2**20}
                for r in self.reports]
        rows.append({"size": "total", "capture ms": sum(r.capture_ms for r in self.reports),
                     "instantiate ms": sum(r.instantiate_ms for r in self.reports),
                     "upload ms": sum(r.upload_ms for r in self.reports),
                     "nodes": sum(r.nodes for r in self.reports),
                     "device MiB": sum(r.device_bytes for r in self.reports) / 2**20})
        text = format_table(rows, list(rows[0]), title=f"captured {len(self.reports)} sizes")
        if self.failures:
            text += "\nFAILED captures (these sizes fall back to eager): " + ", ".join(map(str, self.failures))
        return text


def graph_memory() -> dict[str, int]:
    """The device's graph memory pool: used/reserved, current and high-water (bytes)."""
    A = driver.CUgraphMem_attribute
    attrs = {"used_current": A.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, "used_high": A.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
             "reserved_current": A.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
             "reserved_high": A.CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH}
    dev = device()
    return {k: int(check(driver.cuDeviceGetGraphMemAttribute(dev.handle, a), "cuDeviceGetGraphMemAttribute"))
            for k, a in attrs.items()}
