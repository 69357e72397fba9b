"""Typed errors and the one ``check()`` every CUDA, runtime and NVRTC result goes through.

cuda.bindings returns ``(err, *values)`` tuples. ``check`` turns them into the values or raises a
:class:`CudaError` that carries the CUDA error name, code, description and, where we know one, a hint.
"""

from __future__ import annotations

from cuda.bindings import driver, nvrtc, runtime

try:  # cuda-pathfinder raises this at the first driver call when libcuda.so is missing
    from cuda.pathfinder import DynamicLibNotFoundError
except ImportError:  # pragma: no cover - older cuda-pathfinder
    DynamicLibNotFoundError = OSError

__all__ = [
    "CudaError", "NoDriverError", "CompileError", "CaptureError", "GraphUpdateError", "ClosedError",
    "check", "check_driver_loaded",
]

# Hints for the errors users meet most; keyed by the error's name, so driver and runtime share them.
_HINTS = {
    "CUDA_ERROR_NO_DEVICE": "no CUDA device is visible: check nvidia-smi and CUDA_VISIBLE_DEVICES.",
    "CUDA_ERROR_NOT_INITIALIZED": "call rawgraphs.context.init() (or any rawgraphs GPU entry point) first.",
    "CUDA_ERROR_INVALID_CONTEXT": "no current context on this thread: use rawgraphs.context.device().",
    "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED": (
        "this call is not allowed while a stream is capturing (synchronize, query, cuMemAlloc, ...): "
        "allocate and synchronize before capture, or use graph memory nodes."),
    "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED": (
        "an earlier illegal call broke this capture: end it (Graph.capture does) and capture again."),
    "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT": (
        "work on the legacy default stream joined a capturing stream: use an explicit non-blocking stream."),
    "CUDA_ERROR_STREAM_CAPTURE_UNJOINED": (
        "a stream forked from the capture (event wait) was not joined back before EndCapture: record an "
        "event on it and make the origin stream wait on that event."),
    "CUDA_ERROR_CAPTURED_EVENT": "this event was recorded inside a capture and cannot be queried or synced.",
    "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD": "end the capture on the thread that began it.",
    "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE": "the new graph differs in topology or node kind: re-instantiate.",
    "CUDA_ERROR_INVALID_VALUE": "an argument was out of range (launch shape, pointer, size): check the call.",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": "too many registers or threads for this block size: shrink the block.",
    "CUDA_ERROR_ILLEGAL_ADDRESS": (
        "a kernel touched memory it does not own; the context is now unusable: run compute-sanitizer."),
    "CUDA_ERROR_OUT_OF_MEMORY": "the device is out of memory: free buffers or shrink sizes.",
    "CUDA_ERROR_NOT_FOUND": "no such symbol: is the kernel extern \"C\" and spelled as in the source?",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "the PTX is newer than the driver: compile to cubin for this arch.",
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "the cubin was built for another arch: compile for this device's sm_XX.",
}

_DESCRIPTIONS = {  # used when the driver is absent, so cuGetErrorString cannot answer
    "CUDA_ERROR_INVALID_VALUE": "invalid argument",
    "CUDA_ERROR_OUT_OF_MEMORY": "out of memory",
    "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED": "operation not permitted when stream is capturing",
}


class CudaError(RuntimeError):
    """A CUDA driver or runtime call failed.

    Attributes
    ----------
    name : str
        The CUDA error name, e.g. ``CUDA_ERROR_INVALID_VALUE``.
    code : int
        Its numeric value.
    description : str
        The driver's description of the error.
    hint : str or None
        What to do about it, where we know.
    call : str or None
        The API call or rawgraphs operation that failed.
    """

    def __init__(self, name: str, code: int, description: str = "", hint: str | None = None,
                 call: str | None = None):
        self.name, self.code, self.description = name, int(code), description
        self.hint = hint if hint is not None else _HINTS.get(name)
        self.call = call
        msg = f"{call + ': ' if call else ''}{name} ({self.code}): {description}"
        if self.hint:
            msg += f"\n  hint: {self.hint}"
        super().__init__(msg)


class NoDriverError(CudaError):
    """No NVIDIA driver (libcuda) could be loaded on this machine."""

    def __init__(self, detail: str = ""):
        super().__init__(
            "CUDA_ERROR_NO_DRIVER", 0, "no NVIDIA driver was found on this machine" +
            (f" ({detail})" if detail else ""),
            hint="install an NVIDIA driver for CUDA 13 (R580+) and check nvidia-smi; CPU-only commands "
                 "(compile, info, tests) still work.")


class ClosedError(ValueError):
    """An object was used after ``close()``."""


class CompileError(RuntimeError):
    """NVRTC failed to compile a kernel source.

    Attributes
    ----------
    log : str
        The full NVRTC log.
    filename : str
        The source's name as given to NVRTC.
    line : int or None
        The first line the log reports an error on, in ``error_file``.
    error_file : str
        The file of that line: ``filename`` or a header it includes.
    """

    def __init__(self, filename: str, log: str, options: tuple[str, ...] = ()):
        self.filename, self.log, self.options = filename, log, tuple(options)
        self.error_file, self.line = _first_error(filename, log)
        where = f"{self.error_file}:{self.line}" if self.line else filename
        super().__init__(f"NVRTC failed to compile {where}\n{log.strip()}\n  options: {' '.join(options)}")


class CaptureError(CudaError):
    """A stream capture failed; carries the capture status and the call that broke it."""

    def __init__(self, err: CudaError, status: str, call: str | None, what_to_do: str | None = None):
        self.status = status
        hint = what_to_do or err.hint
        super().__init__(err.name, err.code, f"{err.description} [capture status: {status}]",
                         hint=hint, call=call)


class GraphUpdateError(CudaError):
    """``cuGraphExecUpdate`` refused a graph; ``reason`` names why and ``node`` which node."""

    def __init__(self, reason: str, node: object | None, detail: str = ""):
        self.reason, self.node = reason, node
        desc = f"update refused: {reason}" + (f" at node {node}" if node is not None else "") + detail
        super().__init__("CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", 910, desc, call="cuGraphExecUpdate")


def _first_error(filename: str, log: str) -> tuple[str, int | None]:
    """(file, line) of the log's first error: the source's own, else the first in any file (a header)."""
    import re
    for name in (re.escape(filename), r"[^\s()]+"):
        m = re.search(rf"^({name})\((\d+)\): (?:catastrophic )?error", log, re.M)
        if m:
            return m.group(1), int(m.group(2))
    return filename, None


def _describe(err) -> tuple[str, int, str]:
    """Name, code and description of a CUresult / cudaError_t / nvrtcResult."""
    code = int(err)
    if isinstance(err, nvrtc.nvrtcResult):
        _, text = nvrtc.nvrtcGetErrorString(err)
        return err.name, code, text.decode() if isinstance(text, bytes) else str(text)
    name = err.name if isinstance(err, (driver.CUresult, runtime.cudaError_t)) else f"error {code}"
    if isinstance(err, runtime.cudaError_t):  # report runtime errors under the driver's names too
        try:
            name = driver.CUresult(code).name
        except ValueError:
            pass
    try:
        ok, text = driver.cuGetErrorString(driver.CUresult(code))
        desc = text.decode() if ok == 0 and text else _DESCRIPTIONS.get(name, "")
    except (DynamicLibNotFoundError, ValueError, RuntimeError):
        desc = _DESCRIPTIONS.get(name, "")
    return name, code, desc


def error_from(err, call: str | None = None) -> CudaError:
    """Build the typed exception for a failed result without raising it."""
    name, code, desc = _describe(err)
    return CudaError(name, code, desc, call=call)


def check(result, call: str | None = None):
    """Return the values of a cuda.bindings result tuple, or raise its typed error.

    ``(SUCCESS,)`` -> ``None``; ``(SUCCESS, v)`` -> ``v``; ``(SUCCESS, a, b)`` -> ``(a, b)``.
    """
    err = result[0]
    if err:  # every success code is 0 and the enums are ints: one truth test on the hot path
        raise error_from(err, call)
    n = len(result)
    if n == 1:
        return None
    return result[1] if n == 2 else result[1:]


def check_driver_loaded(fn, *args):
    """Call a driver entry point, turning a missing libcuda into :class:`NoDriverError`."""
    try:
        return fn(*args)
    except DynamicLibNotFoundError as e:
        raise NoDriverError(str(e).split(".")[0]) from None
