"""Conditional nodes: IF, IF/ELSE, WHILE and SWITCH, steered by device data (seed, constraint 3).

A conditional node owns one body graph per branch (``Conditional.bodies``); fill a body with explicit nodes
(``body.add_kernel(...)``) or by capturing into it (``Graph.capture(stream, into=body)``). Its *handle* is a
64-bit value a kernel passes to ``cudaGraphSetConditional`` (kernels/conditional.cu) to choose the branch or
keep a loop going. With ``default`` given, the handle is reset to it at every launch of the graph.
IF and WHILE need CUDA 12.3+, IF/ELSE and SWITCH 12.8+ (the driver refuses otherwise: the error says so).
See the CUDA Programming Guide, "Conditional Graph Nodes".
"""

from __future__ import annotations

from dataclasses import dataclass

from cuda.bindings import driver

from .capture_state import state
from .context import Stream, device
from .errors import CudaError, check
from .graph import Graph, Node

__all__ = ["Conditional", "create_handle", "add_conditional", "capture_conditional", "KINDS"]

_T = driver.CUgraphConditionalNodeType
KINDS = {"if": (_T.CU_GRAPH_COND_TYPE_IF, 1), "if_else": (_T.CU_GRAPH_COND_TYPE_IF, 2),
         "while": (_T.CU_GRAPH_COND_TYPE_WHILE, 1), "switch": (_T.CU_GRAPH_COND_TYPE_SWITCH, None)}


@dataclass(frozen=True)
class Conditional:
    """A conditional node, its handle (pass it to a condition kernel) and its body graphs (branch order:
    IF = [then], IF/ELSE = [then, else], WHILE = [body], SWITCH = [case 0, case 1, ...])."""

    node: Node
    handle: int
    kind: str
    bodies: tuple[Graph, ...]


def create_handle(graph: Graph, default: int | None = None) -> int:
    """A conditional handle of ``graph``; ``default`` (if given) is assigned at the start of every launch."""
    flags = driver.CU_GRAPH_COND_ASSIGN_DEFAULT if default is not None else 0
    h = check(driver.cuGraphConditionalHandleCreate(graph._live(), device().context, default or 0, flags),
              "cuGraphConditionalHandleCreate")
    return int(h)


def _params(kind: str, handle: int, cases: int | None) -> driver.CUgraphNodeParams:
    if kind not in KINDS:
        raise ValueError(f"conditional kind must be one of {sorted(KINDS)}, got {kind!r}")
    ctype, size = KINDS[kind]
    if kind == "switch":
        if not cases or cases < 1:
            raise ValueError("a switch needs cases >= 1")
        size = cases
    elif cases is not None:
        raise ValueError(f"cases applies to 'switch' only, not {kind!r}")
    p = driver.CUgraphNodeParams()
    p.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    p.conditional.handle = handle
    p.conditional.type = ctype
    p.conditional.size = size
    p.conditional.ctx = device().context
    return p


def _finish(graph: Graph, handle_node, p, kind: str, handle: int, deps, name: str) -> Conditional:
    bodies = tuple(Graph(b, owned=False) for b in p.conditional.phGraph_out[:p.conditional.size])
    for body in bodies:
        body.parent = graph
    node = graph._record(Node(handle_node, "conditional", name, deps, pins=bodies))
    return Conditional(node, handle, kind, bodies)


def add_conditional(graph: Graph, kind: str, handle: int | None = None, default: int | None = None,
                    cases: int | None = None, deps=None, name: str | None = None) -> Conditional:
    """Add an IF / IF-ELSE / WHILE / SWITCH node to an explicit graph.

    ``handle`` defaults to a new one of ``graph`` with ``default``; ``cases`` is the number of SWITCH branches.
    """
    deps, name = graph._begin(deps, name, kind)
    handle = create_handle(graph, default) if handle is None else handle
    p = _params(kind, handle, cases)
    try:
        h = check(driver.cuGraphAddNode(graph._live(), [d.handle for d in deps], None, len(deps), p),
                  f"cuGraphAddNode(conditional {kind})")
    except CudaError as e:
        hint = (e.hint + " " if e.hint else "") + f"({kind} nodes need a driver for CUDA 12.3+, if_else/switch 12.8+)"
        raise CudaError(e.name, e.code, e.description, hint=hint, call=e.call) from e
    return _finish(graph, h, p, kind, handle, deps, name)


def capture_conditional(stream: Stream, kind: str, default: int | None = None, cases: int | None = None,
                        name: str | None = None) -> Conditional:
    """Add a conditional node at the current point of a rawgraphs capture on ``stream``; later captured work
    depends on it. Fill its bodies with ``Graph.capture(other_stream, into=body)`` or explicit nodes."""
    session = state.sessions.get(int(stream.handle))
    if session is None:
        raise RuntimeError("capture_conditional needs an open rawgraphs capture (Graph.capture) on this stream")
    res = check(driver.cuStreamGetCaptureInfo(stream.handle), "cuStreamGetCaptureInfo")
    frontier = list(res[3] or ())
    graph = session.graph
    _, name = graph._begin((), name, kind)
    handle = create_handle(graph, default)
    p = _params(kind, handle, cases)
    h = check(driver.cuGraphAddNode(graph.handle, frontier, None, len(frontier), p),
              f"cuGraphAddNode(conditional {kind})")
    check(driver.cuStreamUpdateCaptureDependencies(
        stream.handle, [h], None, 1, driver.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES),
        "cuStreamUpdateCaptureDependencies")
    return _finish(graph, h, p, kind, handle, (), name)
