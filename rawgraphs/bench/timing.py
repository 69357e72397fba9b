"""Timing loops for benchmarks: GPU time with CUDA events, host launch cost with ``perf_counter_ns``.

These are for ``benchmarks/`` only. Timed *tests* are forbidden in rawgraphs: a test asserts behaviour, never
speed (timings are noisy, machine-dependent and would make the suite flaky). Importing this module is safe on
a machine without a GPU; only calling :func:`time_gpu` needs one.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import numpy as np

from ..context import Event, Stream
from ..kernel import LaunchShape, Module
from ..memory import DeviceBuffer

__all__ = ["Blocker", "time_gpu", "time_gpu_queued", "time_host"]


def time_gpu(fn: Callable[[], object], stream: Stream, warmup: int = 10, iters: int = 100,
             repeats: int = 15) -> list[float]:
    """GPU time per call of ``fn``, in microseconds, one sample per repeat.

    ``fn`` must enqueue its work on ``stream``. Each repeat records an event, calls ``fn`` ``iters`` times,
    records a second event and waits for it; the sample is the elapsed time divided by ``iters``. Averaging
    over ``iters`` calls hides the event resolution (~0.5 us) for short kernels.

    Parameters
    ----------
    fn : callable
        Enqueues one unit of work on ``stream`` (a kernel launch, a graph launch, ...).
    stream : Stream
        The stream ``fn`` enqueues on; the events are recorded on it.
    warmup : int
        Calls before timing (module load, clocks, caches), followed by a stream synchronize.
    iters : int
        Calls per repeat.
    repeats : int
        Number of samples returned.
    """
    _check_counts(warmup, iters, repeats)
    for _ in range(warmup):
        fn()
    stream.synchronize()
    start, end = Event.create(timing=True), Event.create(timing=True)
    samples = []
    try:
        for _ in range(repeats):
            start.record(stream)
            for _ in range(iters):
                fn()
            end.record(stream)
            end.synchronize()
            samples.append(start.elapsed_ms(end) * 1e3 / iters)
    finally:
        start.close()
        end.close()
    return samples


class Blocker:
    """Keeps the GPU busy for a while: ``launches`` x ``axpb`` over 128 MiB (~60 us each on an H200). Queued
    ahead of a timed span (:func:`time_gpu_queued`), it lets the host finish enqueueing the timed work before
    the GPU gets there, so the span holds the work and not the host's launch latency."""

    ELEMS = 1 << 25  # float32 elements in and out: 128 MiB each

    def __init__(self, stream: Stream, launches: int = 1):
        self.stream, self.launches = stream, launches
        self.kernel = Module.from_file("basic").kernel("axpb")
        self.x, self.y = DeviceBuffer(self.ELEMS, np.float32), DeviceBuffer(self.ELEMS, np.float32)  # [ELEMS] each
        self.x.zero(stream)
        self.args = self.kernel.args(out=self.y, x=self.x, a=1.0, b=0.0, n=self.ELEMS)
        self.shape = LaunchShape((self.ELEMS // 256,), (256,))

    def __call__(self) -> None:
        for _ in range(self.launches):
            self.kernel.launch(self.shape, self.args, self.stream)

    def close(self) -> None:
        self.x.close()
        self.y.close()


def time_gpu_queued(fn: Callable[[], object], stream: Stream, hold: Callable[[], object], repeats: int,
                    warmup: int = 1) -> list[float]:
    """GPU time of one call of ``fn``, in microseconds, one sample per repeat: events around the call, queued
    behind ``hold`` (a :class:`Blocker`) so the span starts when the GPU reaches ``fn``'s work, not while the
    host is still enqueueing it. ``hold`` must outlast the host's time in ``fn`` for that to hold."""
    _check_counts(warmup, 1, repeats)
    for _ in range(warmup):
        fn()
    start, end = Event.create(timing=True), Event.create(timing=True)
    samples = []
    try:
        for _ in range(repeats):
            hold()
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            samples.append(start.elapsed_ms(end) * 1e3)
    finally:
        start.close()
        end.close()
    return samples


def time_host(fn: Callable[[], object], warmup: int = 10, iters: int = 100, repeats: int = 15,
              sync: Callable[[], object] | None = None) -> list[float]:
    """Host time per call of ``fn``, in microseconds, one sample per repeat (launch/enqueue cost).

    Each repeat times ``iters`` back-to-back calls with ``time.perf_counter_ns`` and then calls ``sync``
    *outside* the timed region, so the sample is what the host spends enqueueing, not the GPU's run time.
    The garbage collector is paused while timing so a collection does not land in one sample.

    Keep ``iters`` below what fills the device's launch queue (about a thousand pending launches of a
    kernel slower than the host): when the queue is full a launch blocks and host time becomes GPU time.

    Parameters
    ----------
    fn : callable
        One call to measure (e.g. one kernel launch).
    warmup, iters, repeats : int
        As for :func:`time_gpu`.
    sync : callable, optional
        Waits for the work ``fn`` queued (e.g. ``stream.synchronize``); called after warm-up and after each
        repeat, never inside the timed loop.
    """
    _check_counts(warmup, iters, repeats)
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            for _ in range(iters):
                fn()
            t1 = time.perf_counter_ns()
            sync()
            samples.append((t1 - t0) / 1e3 / iters)
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def _check_counts(warmup: int, iters: int, repeats: int) -> None:
    if warmup < 0 or iters < 1 or repeats < 1:
        raise ValueError(f"need warmup >= 0, iters >= 1, repeats >= 1; got {warmup}, {iters}, {repeats}")
