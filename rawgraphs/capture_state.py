"""Per-thread state of the captures rawgraphs has open.

Two jobs that must be cheap on the eager hot path (one attribute read when nothing is capturing):
- record every kernel launched through rawgraphs into the open capture on its stream, as a named node record;
- refuse calls that would silently escape a capture: a synchronous host<->device copy *succeeds and is not
  recorded* during a global-mode capture (the driver runs it now), a classic way to bake stale data into a graph.
"""

from __future__ import annotations

import threading

from cuda.bindings import driver

from .errors import CaptureError, error_from

__all__ = ["state", "release"]

_lock = threading.Lock()
_open = 0  # captures open in this process, all threads
_pending: list = []  # destructor calls held back while a capture is open


def release(fn, *args) -> None:
    """Run a destructor (cuMemFree, cuGraphDestroy, ...) now, or once no capture is open.

    The garbage collector may run a finalizer in the middle of a capture; in global mode a free then
    *invalidates the capture* (STREAM_CAPTURE_INVALIDATED on the next launch), so frees wait for its end.
    """
    with _lock:
        if _open:
            _pending.append((fn, args))
            return
    fn(*args)


def capture_opened() -> None:
    global _open
    with _lock:
        _open += 1


def capture_closed() -> None:
    """Called when a capture ends; runs the destructors held back once the last open capture is gone."""
    global _open
    with _lock:
        _open -= 1
        todo = _pending[:] if _open == 0 else []
        if todo:
            _pending.clear()
    for fn, args in todo:
        fn(*args)


class _State(threading.local):
    depth = 0  # number of captures open on this thread (0 on the hot path)

    def __init__(self):
        self.sessions = {}  # int(stream handle) -> open capture session (rawgraphs.capture._Session)

    def refuse(self, what: str, instead: str = "an async copy on the capturing stream (from pinned memory) or a "
               "memcpy node") -> None:
        """Raise CaptureError if this thread has a capture open (the capture itself stays valid)."""
        if self.depth:
            err = error_from(driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
            raise CaptureError(err, "ACTIVE (rawgraphs refused the call before the driver saw it)", what,
                               f"{what} would run immediately and NOT be recorded in the graph: use {instead}.")

    def on_launch(self, kernel, shape, args, stream) -> None:
        """Called by Kernel.launch while depth > 0: record the launch into the capture of its stream."""
        from .capture import record_launch  # lazy: capture imports kernel, which imports this module
        record_launch(kernel, shape, args, stream)


state = _State()
