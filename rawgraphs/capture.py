"""Stream capture into a :class:`~rawgraphs.graph.Graph` that always ends the capture.

``with Graph.capture(stream) as g:`` begins a capture *into a graph we own* (``cuStreamBeginCaptureToGraph``),
records every kernel launched through rawgraphs as a named node record (so captured graphs are as updatable as
explicit ones, also for launches on streams forked into the capture), and on exit ends the capture. If anything
inside failed, or the driver refuses the end (an unjoined fork, an invalidated capture), the partial graph is
discarded, the stream is left usable, and :class:`CaptureError` names the CUDA error, the capture status and the
call that broke it. See the CUDA Programming Guide, "Creating a Graph Using Stream Capture".
"""

from __future__ import annotations

from cuda.bindings import driver

from .capture_state import capture_closed, capture_opened, state
from .context import Stream
from .errors import CaptureError, ClosedError, CudaError, check, error_from
from .graph import Graph, Node

__all__ = ["capture", "capture_status"]

_MODES = {
    "global": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
    "thread_local": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    "relaxed": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
}


def capture_status(stream: Stream | driver.CUstream) -> str:
    """``NONE``, ``ACTIVE`` or ``INVALIDATED`` for ``stream`` (a Stream or a raw handle; never raises)."""
    try:
        err, status = driver.cuStreamIsCapturing(stream.handle if isinstance(stream, Stream) else stream)
    except ClosedError:
        return "unknown (the Stream was closed)"
    if err:
        return f"unknown ({error_from(err).name})"
    return status.name.removeprefix("CU_STREAM_CAPTURE_STATUS_")


def _capture_info(handle) -> tuple:
    """(capture id, dependency nodes) of a capturing stream."""
    res = check(driver.cuStreamGetCaptureInfo(handle), "cuStreamGetCaptureInfo")
    return int(res[1]), list(res[3] or ())


class _Session:
    """One open capture: records rawgraphs kernel launches into the graph as named nodes."""

    def __init__(self, graph: Graph, stream: Stream):
        self.graph, self.stream = graph, stream
        self.id, _ = _capture_info(stream.handle)

    def record_launch(self, kernel, shape, args, handle) -> None:
        _, deps = _capture_info(handle)
        if len(deps) != 1:  # right after a launch the stream's frontier is exactly the new node
            raise RuntimeError(f"capture bookkeeping: expected the launched node, found {len(deps)} frontier nodes")
        g = self.graph
        g._record(Node(deps[0], "kernel", g._begin((), None, kernel.name)[1], (), kernel, shape, args.copy(),
                       pins=(kernel,)))


def record_launch(kernel, shape, args, stream) -> None:
    """Record a rawgraphs launch into the capture of ``stream`` (also a stream forked into the capture)."""
    key = int(stream.handle)
    session = state.sessions.get(key)
    if session is None:
        err, status, cid = driver.cuStreamGetCaptureInfo(stream.handle)[:3]
        if err or status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            return  # a launch on a stream that is not capturing: nothing to record
        session = next((s for s in state.sessions.values() if s.id == int(cid)), None)
        if session is None:
            return  # captured by someone else (CuPy, torch): not ours to record
        state.sessions[key] = session
    session.record_launch(kernel, shape, args, stream.handle)


def _driver_nodes(graph: Graph) -> list:
    n = check(driver.cuGraphGetNodes(graph._live(), 0), "cuGraphGetNodes")[1]
    return list(check(driver.cuGraphGetNodes(graph.handle, n), "cuGraphGetNodes")[0]) if n else []


class capture:
    """``with capture(stream, mode="global") as graph:`` (also ``Graph.capture(stream)``).

    ``mode`` is ``global`` (default: any thread's unsafe call such as ``cuMemAlloc`` breaks the capture, the
    safest), ``thread_local`` or ``relaxed``. ``into`` captures into an existing graph instead of a new one
    (e.g. the body of a conditional node); on failure the nodes this capture added to it are removed again.
    """

    def __init__(self, stream: Stream, mode: str = "global", into: Graph | None = None):
        if mode not in _MODES:
            raise ValueError(f"capture mode must be one of {sorted(_MODES)}, got {mode!r}")
        self.stream, self.mode, self.into = stream, mode, into
        self.graph: Graph | None = None

    def __enter__(self) -> Graph:
        # the raw handle, kept for __exit__: a Stream closed inside the block has a handle that refuses every call,
        # but its destroy waits for the capture's end, so the raw handle still ends the capture
        s = self._handle = self.stream.handle
        mode = _MODES[self.mode]
        capture_opened()  # before Begin: from here on, destructors run by the GC wait for the end
        try:
            if self.into is None:
                # the driver owns the graph of a plain capture until EndCapture hands it over (it destroys
                # it itself when the capture is invalidated), so we borrow it until then
                check(driver.cuStreamBeginCapture(s, mode), "cuStreamBeginCapture")
                graph = Graph(check(driver.cuStreamGetCaptureInfo(s), "cuStreamGetCaptureInfo")[2], owned=False)
                self._before = set()
            else:
                graph = self.into
                self._before = {int(h) for h in _driver_nodes(graph)}
                check(driver.cuStreamBeginCaptureToGraph(s, graph._live(), None, None, 0, mode),
                      "cuStreamBeginCaptureToGraph")
        except BaseException as e:  # a closed `into` too: an open count left behind would hold every free forever
            capture_closed()
            if isinstance(e, CudaError):
                raise CaptureError(e, capture_status(s), e.call) from None
            raise
        self._records = len(graph.nodes)
        self.graph = graph
        state.depth += 1
        state.sessions[int(self.stream.handle)] = _Session(graph, self.stream)
        return graph

    def __exit__(self, exc_type, exc, tb) -> bool:
        state.depth -= 1
        for key in [k for k, s in state.sessions.items() if s.graph is self.graph]:
            del state.sessions[key]
        status = capture_status(self._handle)
        try:
            err, handle = driver.cuStreamEndCapture(self._handle)  # always end: the stream is usable afterwards
        finally:
            capture_closed()
        if self.into is None and handle is not None and int(handle):
            self.graph._adopt()  # ownership passes to us now (a NULL graph means the driver discarded it)
        if exc is None and not err:
            return False
        # a capture *into* a graph that the driver invalidated may have destroyed that graph: never touch it again
        broken = self.into is not None and (bool(err) or status != "ACTIVE")
        self._discard(broken)
        extra = (" The driver discarded the graph this capture wrote into (and the graph holding it, e.g. the "
                 "parent of a conditional body): build that graph again." if broken else "")
        if isinstance(exc, CaptureError):
            return False
        if isinstance(exc, CudaError):
            raise CaptureError(exc, status, exc.call, (exc.hint or "") + extra) from exc
        if exc is not None:
            return False  # a Python error inside the block: re-raise it as it is
        raise CaptureError(error_from(err), status, "cuStreamEndCapture", (error_from(err).hint or "") + extra)

    def _discard(self, broken: bool) -> None:
        """Drop what the failed capture recorded: the whole graph, or only the nodes it added to ``into``."""
        g = self.graph
        if self.into is None:
            g.close()  # destroys it if we adopted it; an invalidated capture's graph is already gone
            return
        if broken:
            for lost in (g, g.parent):
                if lost is not None:
                    lost._abandon()
            return
        for h in _driver_nodes(g):
            if int(h) not in self._before:
                check(driver.cuGraphDestroyNode(h), "cuGraphDestroyNode")
        for node in g.nodes[self._records:]:
            del g._by_name[node.name], g._by_key[node.key]
        del g.nodes[self._records:]
