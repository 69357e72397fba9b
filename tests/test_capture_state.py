"""Destructors wait while a capture is open (a free during a global-mode capture would invalidate it), and the
synchronous-copy guard, without a GPU."""

import sys
from types import SimpleNamespace

import pytest

from rawgraphs.capture_state import capture_closed, capture_opened, release, state
from rawgraphs.errors import CaptureError


def test_release_runs_now_without_open_captures():
    calls = []
    release(calls.append, 1)
    assert calls == [1]


def test_release_waits_for_the_last_open_capture():
    calls = []
    capture_opened()
    capture_opened()
    try:
        release(calls.append, "a")
        release(calls.append, "b")
        assert calls == []
        capture_closed()
        assert calls == []  # one capture still open
    finally:
        capture_closed()
    assert calls == ["a", "b"]


def test_synchronous_copy_is_refused_while_this_thread_captures():
    state.refuse("anything")  # nothing open: no error
    state.depth += 1
    try:
        with pytest.raises(CaptureError, match="NOT be recorded") as ei:
            state.refuse("DeviceBuffer.copy_from (synchronous cuMemcpyHtoD)")
        assert ei.value.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    finally:
        state.depth -= 1


def test_a_capture_that_cannot_start_leaves_no_open_count():
    """Any error in ``__enter__`` (here a closed ``into`` graph, a ClosedError, not a CudaError) must close the count
    it opened: one left behind would hold every later free of the process."""
    from rawgraphs.errors import ClosedError

    def closed():
        raise ClosedError("this Graph was closed")

    cap = sys.modules["rawgraphs.capture"]  # the module: ``rawgraphs.capture`` is also the class's name
    with pytest.raises(ClosedError):
        cap.capture(SimpleNamespace(handle=0), into=SimpleNamespace(nodes=[], _live=closed)).__enter__()
    calls = []
    release(calls.append, "freed")
    assert calls == ["freed"]


def test_a_stream_closed_inside_its_capture_still_ends_it(monkeypatch):
    """``s.close()`` inside ``with Graph.capture(s)``: the stream's handle then refuses every call, yet the capture
    must end (through the raw handle kept at the start), close its open count, and only then destroy the stream."""
    from cuda.bindings import driver

    from rawgraphs import context

    cap = sys.modules["rawgraphs.capture"]
    ok, active = driver.CUresult.CUDA_SUCCESS, driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
    ended = []
    monkeypatch.setattr(cap, "driver", SimpleNamespace(  # the calls a capture into a graph makes, on raw handles
        cuGraphGetNodes=lambda g, n: (ok, [], 0),
        cuStreamBeginCaptureToGraph=lambda s, g, deps, data, n, mode: (int(s), (ok,))[1],
        cuStreamGetCaptureInfo=lambda s: (int(s), (ok, active, 7, None, [], 0))[1],
        cuStreamIsCapturing=lambda s: (int(s), (ok, active))[1],
        cuStreamEndCapture=lambda s: (ended.append(int(s)), (ok, None))[1]))
    destroyed = []
    monkeypatch.setattr(context, "_destroy_stream", lambda h: release(destroyed.append, int(h)))
    s = context.Stream(driver.CUstream(0x1234), owned=True)
    with cap.capture(s, into=SimpleNamespace(nodes=[], _live=lambda: 1, handle=1, parent=None)):
        s.close()
        assert destroyed == []  # held back while the capture is open
    assert ended == [0x1234] and destroyed == [0x1234] and state.depth == 0
    calls = []
    release(calls.append, "freed")
    assert calls == ["freed"]
