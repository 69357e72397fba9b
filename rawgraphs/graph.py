"""``Graph``: a CUDA graph built node by node (any DAG), every node a named record.

A kernel node remembers its kernel, launch shape and its own packed argument block, so an instantiated graph
can later rewrite exactly the named arguments of exactly the nodes asked for (``GraphExec.set_args``). Nodes
recorded by stream capture (:mod:`rawgraphs.capture`) are the same records. The graph pins every object its
nodes point at (buffers, kernels, events, child graphs).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field

from cuda.bindings import driver

from .capture_state import release
from .context import Event, device
from .errors import ClosedError, check
from .kernel import Kernel, LaunchShape, cluster_value
from .kernel_args import KernelArgs
from .memory import HostBuffer, _Array, as_view

__all__ = ["Graph", "Node", "kernel_node_params"]


@dataclass(eq=False)
class Node:
    """One node of a :class:`Graph`: its driver handle, kind, unique name and (for kernels) what it launches."""

    handle: driver.CUgraphNode
    kind: str  # kernel, memset, memcpy, event_record, event_wait, empty, child, mem_alloc, mem_free, conditional
    name: str
    deps: tuple[Node, ...] = ()
    kernel: Kernel | None = None
    shape: LaunchShape | None = None
    args: KernelArgs | None = None
    ptr: int | None = None  # the address a mem_alloc node hands out
    pins: tuple = field(default=(), repr=False)  # objects the node points at, kept alive with the graph
    device_handle: int = 0  # cudaGraphDeviceNode_t once made device-updatable (make_device_updatable)
    key: int = field(init=False, repr=False)  # int(handle), computed once: lookups are on the update path

    def __post_init__(self):
        self.key = int(self.handle)

    def describe(self) -> dict:
        """A plain dict for inspection: name, kind, kernel, launch shape, argument values, dependencies."""
        d = {"name": self.name, "kind": self.kind, "deps": [n.name for n in self.deps]}
        if self.kernel is not None:
            d.update(kernel=self.kernel.name, grid=self.shape.grid, block=self.shape.block,
                     shared=self.shape.shared, args=_show(self.args.values()))
        if self.ptr is not None:
            d["ptr"] = hex(self.ptr)
        return d


def _show(values: dict) -> dict:
    return {k: (hex(int(v)) if isinstance(v, _Array) else v) for k, v in values.items()}


def kernel_node_params(kernel: Kernel, shape: LaunchShape, params_address: int, p=None):
    """``CUDA_KERNEL_NODE_PARAMS`` (or ``p``, any struct with its fields) whose ``kernelParams`` is
    ``params_address``, a packed block's ``void*[]`` (``KernelArgs.address``; the driver copies the values)."""
    p = driver.CUDA_KERNEL_NODE_PARAMS() if p is None else p
    p.func = kernel.function
    p.gridDimX, p.gridDimY, p.gridDimZ = shape.grid
    p.blockDimX, p.blockDimY, p.blockDimZ = shape.block
    p.sharedMemBytes = shape.shared
    p.kernelParams = params_address
    return p


def _edge(dep: Node) -> driver.CUgraphEdgeData:
    """A programmatic edge after a kernel node (the dependent may start at its launch_dependents), else a
    default edge."""
    e = driver.CUgraphEdgeData()
    if dep.kind == "kernel":
        e.type = driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
        e.from_port = driver.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
    return e


def _destroy_graph(handle) -> None:
    release(driver.cuGraphDestroy, handle)


class Graph:
    """A CUDA graph owned by rawgraphs. Build with ``Graph()`` + ``add_*`` or ``Graph.capture(stream)``."""

    def __init__(self, handle: driver.CUgraph | None = None, owned: bool = True):
        device()
        self.handle = handle if handle is not None else check(driver.cuGraphCreate(0), "cuGraphCreate")
        self.nodes: list[Node] = []
        self._by_name: dict[str, Node] = {}
        self._by_key: dict[int, Node] = {}
        self._counter = itertools.count()
        self._finalizer = weakref.finalize(self, _destroy_graph, self.handle) if owned else None
        self._closed = False
        self.parent: Graph | None = None  # the graph holding this one as a conditional body
        self._execs = weakref.WeakSet()  # executables name their nodes by our node handles: keep them valid

    def _adopt(self) -> None:
        """Take ownership of a borrowed handle (a capture's graph, handed over by cuStreamEndCapture)."""
        self._finalizer = weakref.finalize(self, _destroy_graph, self.handle)

    def _abandon(self) -> None:
        """Close without destroying: the driver already invalidated (part of) this graph."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer.detach()

    # ---- construction -------------------------------------------------------------------------------------
    def _live(self) -> driver.CUgraph:
        if self._closed:
            raise ClosedError("this Graph was closed")
        return self.handle

    def _deps(self, deps: Iterable[Node] | Node | None) -> tuple[Node, ...]:
        deps = () if deps is None else (deps,) if isinstance(deps, Node) else tuple(deps)
        for d in deps:
            if self._by_key.get(d.key) is not d:
                raise ValueError(f"dependency {d.name!r} is not a node of this graph")
        return deps

    def _begin(self, deps, name: str | None, stem: str) -> tuple[tuple[Node, ...], str]:
        """A new node's checked dependencies and name, before the driver adds it: a refused name or dependency
        leaves no node in the driver's graph that this object does not know."""
        deps = self._deps(deps)
        name = name or f"{stem}#{next(self._counter)}"
        if name in self._by_name:
            raise ValueError(f"a node named {name!r} already exists in this graph")
        return deps, name

    def _record(self, node: Node) -> Node:
        self.nodes.append(node)
        self._by_name[node.name] = node
        self._by_key[node.key] = node
        return node

    def add_kernel(self, kernel: Kernel, shape: LaunchShape, args: KernelArgs | dict, deps=None,
                   name: str | None = None) -> Node:
        """A kernel node. The node owns its block (a dict is packed into a new one, a KernelArgs is copied), so
        later updates touch only this node."""
        deps, name = self._begin(deps, name, kernel.name)
        if isinstance(args, dict):
            args = kernel.args(**args)  # a block of the node's own already
        elif args.signature is not kernel.signature:
            raise TypeError(f"argument block is for {args.signature.name}(), not {kernel.name}()")
        else:
            args = args.copy()
        kernel.prepare(shape)
        if shape.pdl and deps:  # programmatic edges from kernel dependencies, as stream capture makes them
            p = driver.CUgraphNodeParams()
            p.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
            kernel_node_params(kernel, shape, args.address, p.kernel)
            h = check(driver.cuGraphAddNode(self._live(), [d.handle for d in deps], [_edge(d) for d in deps],
                                            len(deps), p), f"cuGraphAddNode({kernel.name}, programmatic)")
        else:
            h = check(driver.cuGraphAddKernelNode(self._live(), [d.handle for d in deps], len(deps),
                                                  kernel_node_params(kernel, shape, args.address)),
                      f"cuGraphAddKernelNode({kernel.name})")
        if shape.clustered:  # kernel node params have no cluster field: it is a node attribute
            attr = driver.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            value = cluster_value(shape.cluster, driver.CUkernelNodeAttrValue())
            try:
                check(driver.cuGraphKernelNodeSetAttribute(h, attr, value),
                      f"cuGraphKernelNodeSetAttribute({kernel.name}, cluster {shape.cluster})")
            except Exception:
                check(driver.cuGraphDestroyNode(h), "cuGraphDestroyNode")
                raise
        return self._record(Node(h, "kernel", name, deps, kernel, shape, args,
                                 pins=(kernel,)))

    def add_memset(self, dst, value: int, deps=None, name: str | None = None, element_size: int = 1) -> Node:
        """Set every element (1, 2 or 4 bytes wide) of device array ``dst`` to ``value``."""
        deps, name = self._begin(deps, name, "memset")
        view = as_view(dst)
        if element_size not in (1, 2, 4) or view.nbytes % element_size:
            raise ValueError(f"element_size must be 1, 2 or 4 and divide {view.nbytes} bytes")
        p = driver.CUDA_MEMSET_NODE_PARAMS()
        p.dst, p.value, p.elementSize = int(view), value, element_size  # int(): refuses a closed buffer
        p.width, p.height, p.pitch = view.nbytes // element_size, 1, 0
        h = check(driver.cuGraphAddMemsetNode(self._live(), [d.handle for d in deps], len(deps), p,
                                              device().context), "cuGraphAddMemsetNode")
        return self._record(Node(h, "memset", name, deps, pins=(view,)))

    def add_memcpy(self, dst, src, nbytes: int | None = None, deps=None, name: str | None = None) -> Node:
        """Copy ``nbytes`` (default: all of ``src``) between device arrays and pinned :class:`HostBuffer`s."""
        deps, name = self._begin(deps, name, "memcpy")
        p = driver.CUDA_MEMCPY3D()
        ends = []
        for side, obj in (("src", src), ("dst", dst)):
            host = isinstance(obj, HostBuffer)
            view = obj if host else as_view(obj)
            ends.append((view, view.array.nbytes if host else view.nbytes))
            mt = driver.CUmemorytype
            setattr(p, f"{side}MemoryType", mt.CU_MEMORYTYPE_HOST if host else mt.CU_MEMORYTYPE_DEVICE)
            setattr(p, f"{side}Host" if host else f"{side}Device", int(view))
        nbytes = ends[0][1] if nbytes is None else nbytes
        if nbytes > min(ends[0][1], ends[1][1]):
            raise ValueError(f"memcpy of {nbytes} bytes overruns src ({ends[0][1]}) or dst ({ends[1][1]})")
        p.WidthInBytes, p.Height, p.Depth = nbytes, 1, 1
        h = check(driver.cuGraphAddMemcpyNode(self._live(), [d.handle for d in deps], len(deps), p,
                                              device().context), "cuGraphAddMemcpyNode")
        return self._record(Node(h, "memcpy", name, deps, pins=(ends[0][0], ends[1][0])))

    def add_event_record(self, event: Event, deps=None, name: str | None = None) -> Node:
        """Record ``event`` when the dependencies are done."""
        deps, name = self._begin(deps, name, "event_record")
        h = check(driver.cuGraphAddEventRecordNode(self._live(), [d.handle for d in deps], len(deps),
                                                   event.handle), "cuGraphAddEventRecordNode")
        return self._record(Node(h, "event_record", name, deps, pins=(event,)))

    def add_event_wait(self, event: Event, deps=None, name: str | None = None) -> Node:
        """Wait for ``event`` (recorded elsewhere) before the nodes that depend on this one."""
        deps, name = self._begin(deps, name, "event_wait")
        h = check(driver.cuGraphAddEventWaitNode(self._live(), [d.handle for d in deps], len(deps),
                                                 event.handle), "cuGraphAddEventWaitNode")
        return self._record(Node(h, "event_wait", name, deps, pins=(event,)))

    def add_empty(self, deps=None, name: str | None = None) -> Node:
        """A node that does nothing: a join point for many dependencies."""
        deps, name = self._begin(deps, name, "empty")
        h = check(driver.cuGraphAddEmptyNode(self._live(), [d.handle for d in deps], len(deps)),
                  "cuGraphAddEmptyNode")
        return self._record(Node(h, "empty", name, deps))

    def add_child(self, child: Graph, deps=None, name: str | None = None) -> Node:
        """Embed a copy of ``child`` (the driver clones it; later edits of ``child`` do not reach this node)."""
        deps, name = self._begin(deps, name, "child")
        h = check(driver.cuGraphAddChildGraphNode(self._live(), [d.handle for d in deps], len(deps),
                                                  child._live()), "cuGraphAddChildGraphNode")
        return self._record(Node(h, "child", name, deps, pins=(child,)))

    def add_mem_alloc(self, nbytes: int, deps=None, name: str | None = None) -> Node:
        """Allocate ``nbytes`` from the graph memory pool; the address is ``node.ptr`` (mapped at launch)."""
        deps, name = self._begin(deps, name, "mem_alloc")
        p = driver.CUDA_MEM_ALLOC_NODE_PARAMS()
        p.poolProps.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        p.poolProps.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        p.poolProps.location.id = device().ordinal
        p.bytesize = nbytes
        h = check(driver.cuGraphAddMemAllocNode(self._live(), [d.handle for d in deps], len(deps), p),
                  "cuGraphAddMemAllocNode")
        return self._record(Node(h, "mem_alloc", name, deps, ptr=int(p.dptr)))

    def add_mem_free(self, alloc: Node | int, deps=None, name: str | None = None) -> Node:
        """Free graph memory (a ``mem_alloc`` node or its address) after the dependencies."""
        deps, name = self._begin(deps, name, "mem_free")
        ptr = alloc.ptr if isinstance(alloc, Node) else int(alloc)
        h = check(driver.cuGraphAddMemFreeNode(self._live(), [d.handle for d in deps], len(deps), ptr),
                  "cuGraphAddMemFreeNode")
        return self._record(Node(h, "mem_free", name, deps))

    def make_device_updatable(self, node: Node) -> int:
        """Mark a kernel node device-updatable; returns its device handle (also ``node.device_handle``) for
        kernels/device_update.cu (``cudaGraphKernelNodeSetGridDim`` / ``SetParam`` from a kernel in the running
        graph) and :class:`rawgraphs.device_update.DeviceArgUpdater` (batches from outside it)."""
        if node.kind != "kernel":
            raise ValueError(f"{node.name!r} is a {node.kind} node; only kernel nodes are device-updatable")
        attr = driver.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE
        value = driver.CUkernelNodeAttrValue()
        value.deviceUpdatableKernelNode.deviceUpdatable = 1
        check(driver.cuGraphKernelNodeSetAttribute(node.handle, attr, value), "cuGraphKernelNodeSetAttribute")
        got = check(driver.cuGraphKernelNodeGetAttribute(node.handle, attr), "cuGraphKernelNodeGetAttribute")
        node.device_handle = int(got.deviceUpdatableKernelNode.devNode)
        return node.device_handle

    # ---- lookup and inspection ----------------------------------------------------------------------------
    def node(self, name: str) -> Node:
        """The node called ``name``."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no node named {name!r}; nodes: {', '.join(self._by_name)}") from None

    def nodes_of(self, kernel: Kernel | str) -> list[Node]:
        """Every kernel node launching ``kernel`` (a Kernel or its name), in insertion order."""
        want = kernel if isinstance(kernel, str) else kernel.name
        return [n for n in self.nodes if n.kernel is not None and n.kernel.name == want]

    def node_count(self) -> int:
        """Nodes in the driver's graph (includes nodes not made through rawgraphs)."""
        return check(driver.cuGraphGetNodes(self._live(), 0), "cuGraphGetNodes")[1]

    def describe(self) -> list[dict]:
        """One dict per recorded node (see :meth:`Node.describe`)."""
        return [n.describe() for n in self.nodes]

    def dot(self, path: str, verbose: bool = True) -> str:
        """Write Graphviz DOT via ``cuGraphDebugDotPrint``; returns ``path``."""
        flags = driver.CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE if verbose else 0
        check(driver.cuGraphDebugDotPrint(self._live(), str(path).encode(), int(flags)), "cuGraphDebugDotPrint")
        return str(path)

    def instantiate(self, **flags):
        """Instantiate into a :class:`rawgraphs.executable.GraphExec` (see its flags)."""
        from .executable import GraphExec
        return GraphExec(self, **flags)

    @classmethod
    def capture(cls, stream, mode: str = "global", into: Graph | None = None):
        """Context manager recording work on ``stream`` into a new graph, or into ``into`` (see
        :mod:`rawgraphs.capture`)."""
        from .capture import capture
        return capture(stream, mode, into)

    def close(self) -> None:
        """Close the graph (idempotent): no more building. The driver graph is destroyed now, or when the last
        executable made from it goes (they name their nodes by this graph's node handles)."""
        self._closed = True
        if self._finalizer is not None and not self._execs:
            self._finalizer()

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.nodes)
