"""Device selection, the primary context, streams and events.

rawgraphs runs in the device's *primary* context, the one the CUDA runtime (and so CuPy and torch) uses, so
their arrays are valid kernel arguments here and our buffers are valid there.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

from cuda.bindings import driver

from .capture_state import release
from .errors import ClosedError, NoDriverError, check, check_driver_loaded

__all__ = ["Device", "Stream", "Event", "init", "device", "gpu_available", "driver_version"]


@functools.cache
def init() -> None:
    """``cuInit`` once per process; raises :class:`NoDriverError` when there is no NVIDIA driver."""
    check(check_driver_loaded(driver.cuInit, 0), "cuInit")


def gpu_available() -> bool:
    """True when a driver loads and at least one device is visible. Never raises."""
    try:
        init()
        return check(driver.cuDeviceGetCount(), "cuDeviceGetCount") > 0
    except (NoDriverError, RuntimeError):
        return False


def driver_version() -> tuple[int, int]:
    """The driver's CUDA version as ``(major, minor)``, e.g. ``(13, 0)``."""
    init()
    v = check(driver.cuDriverGetVersion(), "cuDriverGetVersion")
    return v // 1000, (v % 1000) // 10


@dataclass(frozen=True)
class Device:
    """One CUDA device with its primary context retained (for the life of the process)."""

    ordinal: int
    handle: driver.CUdevice
    context: driver.CUcontext
    name: str
    compute_capability: tuple[int, int]
    total_memory: int

    @property
    def arch(self) -> str:
        """The NVRTC target, e.g. ``sm_90``."""
        return "sm_%d%d" % self.compute_capability

    def attribute(self, attr: driver.CUdevice_attribute) -> int:
        """``cuDeviceGetAttribute`` for this device."""
        return check(driver.cuDeviceGetAttribute(attr, self.handle), "cuDeviceGetAttribute")

    def make_current(self) -> None:
        """Make this device's primary context current on the calling thread."""
        check(driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def synchronize(self) -> None:
        """Wait for all work on this device's context."""
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize")

    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes from ``cuMemGetInfo``."""
        return tuple(check(driver.cuMemGetInfo(), "cuMemGetInfo"))


@functools.cache
def _open_device(ordinal: int) -> Device:
    init()
    n = check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
    if not 0 <= ordinal < n:
        raise ValueError(f"device {ordinal} does not exist: this machine has {n} CUDA device(s)")
    dev = check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    name = check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName").split(b"\0")[0].decode()
    attr = driver.CUdevice_attribute
    cc = tuple(check(driver.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute") for a in (
        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
    total = check(driver.cuDeviceTotalMem(dev), "cuDeviceTotalMem")
    return Device(ordinal, dev, ctx, name, cc, total)


def device(ordinal: int = 0) -> Device:
    """Open device ``ordinal`` (default 0), make its primary context current and return it."""
    d = _open_device(ordinal)
    d.make_current()
    return d


def _done(result: tuple, call: str) -> bool:
    """A query's answer (cuStreamQuery, cuEventQuery): True when the work is done, False while it is pending
    (CUDA_ERROR_NOT_READY); any other error raises as its CudaError."""
    if result[0] == driver.CUresult.CUDA_ERROR_NOT_READY:
        return False
    check(result, call)
    return True


def _destroy_stream(handle) -> None:
    release(driver.cuStreamDestroy, handle)


class _ClosedStream:
    """A closed stream's handle: the driver call it is passed to raises ClosedError when converting it, so the
    launch hot paths (which pass ``stream.handle`` unchecked) cannot reach a destroyed or reused handle."""

    def __index__(self) -> int:
        raise ClosedError("this Stream was closed")

    __int__ = __index__

    def __repr__(self) -> str:
        return "<closed stream>"


class Stream:
    """A CUDA stream, owned (``Stream.create``) or borrowed (``Stream.borrow``) from CuPy, torch or a handle."""

    def __init__(self, handle: driver.CUstream, owned: bool):
        self.handle, self.owned = handle, owned
        self._finalizer = weakref.finalize(self, _destroy_stream, handle) if owned else None

    @classmethod
    def create(cls, non_blocking: bool = True, priority: int = 0) -> Stream:
        """A new stream; non-blocking by default so legacy-stream work never joins it implicitly."""
        device()
        flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING if non_blocking else 0
        return cls(check(driver.cuStreamCreateWithPriority(flags, priority), "cuStreamCreateWithPriority"), True)

    @classmethod
    def borrow(cls, obj) -> Stream:
        """Wrap a stream we do not own: anything with the CUDA stream protocol's ``__cuda_stream__`` (a cuda.core
        stream, another rawgraphs Stream), a ``CUstream``, an int handle, a CuPy stream (``.ptr``) or a torch stream
        (``.cuda_stream``). We never destroy it."""
        if hasattr(obj, "__cuda_stream__"):
            version, raw = obj.__cuda_stream__()
            if version != 0:
                raise ValueError(f"__cuda_stream__ version {version}: only version 0 of the CUDA stream protocol "
                                 "is known")
        else:
            raw = getattr(obj, "cuda_stream", getattr(obj, "ptr", obj))
        return cls(raw if isinstance(raw, driver.CUstream) else driver.CUstream(int(raw)), False)

    @classmethod
    def legacy(cls) -> Stream:
        """The legacy default stream (``CU_STREAM_LEGACY``): it synchronizes with blocking streams."""
        return cls(driver.CUstream(driver.CU_STREAM_LEGACY), False)

    def _live(self) -> driver.CUstream:
        if self.owned and not self._finalizer.alive:
            raise ClosedError("this Stream was closed")
        return self.handle

    def synchronize(self) -> None:
        """Block the host until all work queued on this stream is done."""
        check(driver.cuStreamSynchronize(self._live()), "cuStreamSynchronize")

    def query(self) -> bool:
        """True when all work queued on this stream is done, False while some is pending; an error the work ended
        on (a fault in a kernel) raises as its CudaError."""
        return _done(driver.cuStreamQuery(self._live()), "cuStreamQuery")

    def wait(self, event: Event) -> None:
        """Make later work on this stream wait for ``event`` (also how a capture forks and joins)."""
        check(driver.cuStreamWaitEvent(self._live(), event.handle, 0), "cuStreamWaitEvent")

    def is_capturing(self) -> bool:
        """Whether this stream is capturing now."""
        status = check(driver.cuStreamIsCapturing(self._live()), "cuStreamIsCapturing")
        return status == driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE

    def close(self) -> None:
        """Destroy an owned stream (idempotent); a borrowed one is left alone."""
        if self._finalizer is not None:
            self._finalizer()
            self.handle = _ClosedStream()

    def __int__(self) -> int:
        return int(self.handle)

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol (version 0, the handle), so other libraries can borrow this stream:
        ``cupy.cuda.Stream.from_external(s)`` (CuPy >= 14), ``cuda.core``'s ``Device().create_stream(s)``."""
        return 0, int(self._live())

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _destroy_event(handle) -> None:
    release(driver.cuEventDestroy, handle)


class Event:
    """A CUDA event; ``Event.create(timing=True)`` for ``elapsed_ms``."""

    def __init__(self, handle: driver.CUevent):
        self.handle = handle
        self._finalizer = weakref.finalize(self, _destroy_event, handle)

    @classmethod
    def create(cls, timing: bool = True) -> Event:
        """A new event; ``timing=False`` makes a cheaper event for ordering only."""
        device()
        flags = 0 if timing else driver.CUevent_flags.CU_EVENT_DISABLE_TIMING
        return cls(check(driver.cuEventCreate(flags), "cuEventCreate"))

    def record(self, stream: Stream) -> Event:
        """Record this event on ``stream``; returns self."""
        check(driver.cuEventRecord(self.handle, stream.handle), "cuEventRecord")
        return self

    def synchronize(self) -> None:
        """Block until the event has completed."""
        check(driver.cuEventSynchronize(self.handle), "cuEventSynchronize")

    def query(self) -> bool:
        """True when complete, False when still pending."""
        return _done(driver.cuEventQuery(self.handle), "cuEventQuery")

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to ``end`` (both recorded, ``end`` complete)."""
        return check(driver.cuEventElapsedTime(self.handle, end.handle), "cuEventElapsedTime")

    def close(self) -> None:
        """Destroy the event (idempotent)."""
        self._finalizer()
