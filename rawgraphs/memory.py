"""Device memory: an owning ``DeviceBuffer``, pinned ``HostBuffer`` and zero-copy views of foreign arrays.

Anything with ``__cuda_array_interface__`` (CuPy arrays, torch CUDA tensors) can be a kernel argument through
:func:`as_view`; we keep a reference to the owner so its memory outlives every graph that points at it.
"""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Iterable

import numpy as np
from cuda.bindings import driver

from .capture_state import release
from .capture_state import state as capture_state
from .context import Stream, device
from .errors import ClosedError, check

__all__ = ["DeviceBuffer", "HostBuffer", "DeviceView", "as_view"]




def _typed(shape, dtype) -> tuple[tuple[int, ...], np.dtype, int]:
    try:
        shape = (operator.index(shape),) if not isinstance(shape, Iterable) else tuple(map(operator.index, shape))
    except TypeError:
        raise TypeError(f"a shape is an int or a sequence of ints, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"a shape's sizes must be >= 0, got {shape}")
    dtype = np.dtype(dtype)
    return shape, dtype, math.prod(shape) * dtype.itemsize


class _Array:
    """Shape/dtype metadata shared by device buffers and views."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3}

    def __int__(self) -> int:
        return self.ptr

    def to_numpy(self) -> np.ndarray:
        """Synchronous copy to a new host array of this shape and dtype."""
        capture_state.refuse("DeviceBuffer.to_numpy (cuMemcpyDtoH)")
        out = np.empty(self.shape, self.dtype)
        if out.nbytes:
            check(driver.cuMemcpyDtoH(out.ctypes.data, int(self), out.nbytes), "cuMemcpyDtoH")
        return out

    def copy_from(self, host: np.ndarray, stream: Stream | None = None) -> None:
        """Copy a host array of the same byte size in; async on ``stream`` if given (pinned memory only for
        true asynchrony), otherwise synchronous."""
        host = np.ascontiguousarray(host)
        if host.nbytes != self.nbytes:
            raise ValueError(f"size mismatch: host array has {host.nbytes} bytes, buffer {self.nbytes}")
        if stream is None:
            capture_state.refuse("DeviceBuffer.copy_from (synchronous cuMemcpyHtoD)")
            check(driver.cuMemcpyHtoD(int(self), host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
        else:
            check(driver.cuMemcpyHtoDAsync(int(self), host.ctypes.data, host.nbytes, stream.handle),
                  "cuMemcpyHtoDAsync")

    def upload_async(self, host: HostBuffer, nbytes: int, stream: Stream) -> None:
        """Copy the first ``nbytes`` of pinned ``host`` in, asynchronously on ``stream`` (capturable)."""
        if nbytes > min(self.nbytes, host.array.nbytes):
            raise ValueError(f"copy of {nbytes} bytes overruns the buffer or the host array")
        check(driver.cuMemcpyHtoDAsync(int(self), int(host), nbytes, stream.handle), "cuMemcpyHtoDAsync")

    def download_async(self, host: HostBuffer, nbytes: int, stream: Stream) -> None:
        """Copy the first ``nbytes`` out to pinned ``host``, asynchronously on ``stream``."""
        if nbytes > min(self.nbytes, host.array.nbytes):
            raise ValueError(f"copy of {nbytes} bytes overruns the buffer or the host array")
        check(driver.cuMemcpyDtoHAsync(int(host), int(self), nbytes, stream.handle), "cuMemcpyDtoHAsync")

    def fill_bytes(self, byte: int, stream: Stream | None = None) -> None:
        """Set every byte to ``byte`` (e.g. 0xFF to poison an output before a test)."""
        if stream is None:
            capture_state.refuse("DeviceBuffer.fill_bytes (synchronous cuMemsetD8)",
                                 "fill_bytes(byte, stream) on the capturing stream or a memset node")
            check(driver.cuMemsetD8(int(self), byte, self.nbytes), "cuMemsetD8")
        else:
            check(driver.cuMemsetD8Async(int(self), byte, self.nbytes, stream.handle), "cuMemsetD8Async")

    def zero(self, stream: Stream | None = None) -> None:
        """Set every byte to zero."""
        self.fill_bytes(0, stream)


def _free(ptr: int) -> None:
    release(driver.cuMemFree, ptr)


class DeviceBuffer(_Array):
    """Owning device allocation with a shape and dtype (``cuMemAlloc``; freed on ``close`` or collection)."""

    def __init__(self, shape, dtype=np.uint8):
        self.shape, self.dtype, nbytes = _typed(shape, dtype)
        device()
        self.ptr = int(check(driver.cuMemAlloc(max(nbytes, 1)), "cuMemAlloc"))
        self._finalizer = weakref.finalize(self, _free, self.ptr)

    @classmethod
    def from_numpy(cls, host: np.ndarray) -> DeviceBuffer:
        """A new buffer holding a copy of ``host``."""
        buf = cls(host.shape, host.dtype)
        buf.copy_from(host)
        return buf

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Free the memory now (idempotent). Graphs that point at it pin it, so close those first."""
        self._finalizer()

    def __int__(self) -> int:
        if not self._finalizer.alive:
            raise ClosedError("this DeviceBuffer was closed")
        return self.ptr

    def __enter__(self) -> DeviceBuffer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DeviceBuffer(0x{self.ptr:x}, shape={self.shape}, dtype={self.dtype})"


def _free_host(ptr: int) -> None:
    release(driver.cuMemFreeHost, ptr)


class HostBuffer:
    """Pinned (page-locked) host memory exposed as a NumPy array: the source/target of async copies and
    memcpy nodes, which must not move while a graph refers to them."""

    def __init__(self, shape, dtype=np.uint8):
        shape, dtype, nbytes = _typed(shape, dtype)
        device()
        self.ptr = int(check(driver.cuMemHostAlloc(max(nbytes, 1), 0), "cuMemHostAlloc"))
        self._finalizer = weakref.finalize(self, _free_host, self.ptr)
        import ctypes
        raw = (ctypes.c_byte * max(nbytes, 1)).from_address(self.ptr)
        self.array = np.frombuffer(raw, dtype=np.uint8, count=nbytes).view(dtype).reshape(shape)
        self._device_ptr: int | None = None

    @property
    def device_ptr(self) -> int:
        """The address kernels use to read or write this memory directly (zero-copy, over the bus): with
        unified addressing, pinned memory is mapped into the device's address space."""
        if self._device_ptr is None:
            self._device_ptr = int(check(driver.cuMemHostGetDevicePointer(self.ptr, 0),
                                         "cuMemHostGetDevicePointer"))
        return self._device_ptr

    def __int__(self) -> int:
        if not self._finalizer.alive:
            raise ClosedError("this HostBuffer was closed")
        return self.ptr

    def close(self) -> None:
        """Free the pinned memory (idempotent); ``array`` must not be used afterwards."""
        self._finalizer()


class DeviceView(_Array):
    """A non-owning view of device memory that keeps its owner alive."""

    def __init__(self, ptr: int, shape, dtype, owner: object = None):
        self.ptr, self.owner = int(ptr), owner
        self.shape, self.dtype, _ = _typed(shape, dtype)

    def __repr__(self) -> str:
        return f"DeviceView(0x{self.ptr:x}, shape={self.shape}, dtype={self.dtype})"


def as_view(obj) -> _Array:
    """A :class:`DeviceView` of any object with ``__cuda_array_interface__`` (CuPy, torch, Numba); our own
    buffers and views are returned as they are. Only C-contiguous arrays are accepted."""
    if isinstance(obj, _Array):
        return obj
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(f"{type(obj).__name__} is not a device array (no __cuda_array_interface__)")
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != tuple(np.empty(shape, dtype).strides):
        raise ValueError(f"only C-contiguous device arrays can be kernel arguments (strides {strides})")
    return DeviceView(cai["data"][0], shape, dtype, owner=obj)
