"""``GraphExec``: an instantiated graph you launch and update in place, without recapture.

Each kernel node of the executable has its *own* packed argument block (copied from the graph's record at
instantiate), pinned with everything it points at. ``set_args`` rewrites only the named bytes of that block and
hands the node to ``cuGraphExecKernelNodeSetParams`` with a ``CUDA_KERNEL_NODE_PARAMS`` built once per node
(its ``kernelParams`` point into the block, so rewriting the block is all an update needs). The call goes through
cuda.bindings: calling libcuda through ctypes with prebuilt ``c_void_p`` arguments is slower. Same host, same
350 nodes, interleaved (H200, session 10): the bindings call 0.80 us per node, ctypes 0.98 (0.88 with the GIL
held, ``PyDLL``); with the block write, 1.08 / 1.25 / 1.13 us. The blocks live in argument tables
(:mod:`rawgraphs.arg_table`): ``set_args_many`` resolves a node list once, writes all its rows with one array
write, and its per-node Python is the driver call alone.
"""

from __future__ import annotations

import ctypes
import time
import weakref
from dataclasses import replace

from cuda.bindings import driver

from .arg_table import ArgTable, Batch, retarget, tables_for
from .capture_state import release
from .context import Stream
from .errors import ClosedError, CudaError, GraphUpdateError, check, error_from
from .graph import Graph, Node, _show, kernel_node_params
from .kernel import Kernel, LaunchShape
from .kernel_args import KernelArgs, convert_arg
from .memory import as_view

__all__ = ["GraphExec"]


class _UpdateResultInfo(ctypes.Structure):  # CUgraphExecUpdateResultInfo (cuda.h)
    _fields_ = [("result", ctypes.c_int), ("errorNode", ctypes.c_void_p), ("errorFromNode", ctypes.c_void_p)]


class _Libcuda:
    """The driver entry point we call without cuda.bindings (loaded on first use)."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        # cuda.bindings returns (FAILURE, None) for a refused update: the reason and node are lost there
        self.exec_update = lib.cuGraphExecUpdate_v2
        self.exec_update.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_UpdateResultInfo)]
        self.exec_update.restype = ctypes.c_int


_lib: _Libcuda | None = None
_set_params = driver.cuGraphExecKernelNodeSetParams  # the update hot path, looked up once
_BATCHES_KEPT = 64  # node lists whose resolution an executable keeps for set_args_many


def _libcuda() -> _Libcuda:
    global _lib
    if _lib is None:
        _lib = _Libcuda()
    return _lib


class _ExecKernel:
    """The executable's own record of one kernel node: its block is row ``row`` of ``table``; the KernelArgs
    view of it and the ``CUDA_KERNEL_NODE_PARAMS`` (kernelParams pointing into it) are made on first use, so
    instantiate only fills the tables."""

    __slots__ = ("node", "kernel", "shape", "table", "row", "_args", "_params")

    def __init__(self, node: Node, kernel: Kernel, shape: LaunchShape, table: ArgTable, row: int):
        self.node, self.kernel, self.shape, self.table, self.row = node, kernel, shape, table, row
        self._args = self._params = None

    @property
    def args(self) -> KernelArgs:
        if self._args is None:
            self._args = self.table.view(self.row)
        return self._args

    @property
    def params(self) -> driver.CUDA_KERNEL_NODE_PARAMS:
        if self._params is None:
            self._params = kernel_node_params(self.kernel, self.shape, self.table.address(self.row))
        return self._params


def _instantiate_error(err, p: driver.CUDA_GRAPH_INSTANTIATE_PARAMS, graph: Graph) -> CudaError:
    """The driver's refusal of an instantiation, with its reason (``result_out``) and the node it names."""
    result = p.result_out.name.removeprefix("CUDA_GRAPH_INSTANTIATE_")
    base = error_from(err if err else driver.CUresult.CUDA_ERROR_INVALID_VALUE, "cuGraphInstantiateWithParams")
    if result == "SUCCESS":  # refused before the driver looked at the nodes
        return base
    key = int(p.hErrNode_out)
    node = _find_node(graph, key)
    at = f" at node {node.name!r}" if node else f" at a node rawgraphs did not make ({key:#x})" if key else ""
    hints = {"CONDITIONAL_HANDLE_UNUSED": "a conditional handle was created but no conditional node uses it",
             "MULTIPLE_CTXS_NOT_SUPPORTED": "the graph's nodes belong to more than one context",
             "NODE_OPERATION_NOT_SUPPORTED": "a node's operation cannot be in this kind of graph (e.g. with "
                                             "device_launch=True)",
             "INVALID_STRUCTURE": "the graph's structure is invalid (e.g. a cycle, or graph memory freed twice)"}
    return CudaError(base.name, base.code, f"{base.description} [instantiate result: {result}{at}]",
                     hint=hints.get(result, base.hint), call=base.call)


def _find_node(graph: Graph, key: int) -> Node | None:
    """The node of ``graph`` or of a graph it holds (a conditional body, a child) whose handle is ``key``."""
    node = graph._by_key.get(key)
    if node is None and key:
        held = (g for n in graph.nodes for g in n.pins if isinstance(g, Graph))
        node = next((found for g in held if (found := _find_node(g, key)) is not None), None)
    return node


def _destroy_exec(handle) -> None:
    release(driver.cuGraphExecDestroy, handle)


class GraphExec:
    """An executable graph. Make with ``graph.instantiate(...)`` or ``GraphExec(graph, ...)``.

    Parameters
    ----------
    upload_stream : Stream, optional
        Instantiate with ``CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`` and upload on this stream.
    auto_free_on_launch : bool
        Free unfreed graph allocations when relaunched (``..._AUTO_FREE_ON_LAUNCH``).
    device_launch : bool
        Allow launching from the device (``..._DEVICE_LAUNCH``; the graph must qualify).
    use_node_priority : bool
        Use per-node launch priorities (``..._USE_NODE_PRIORITY``).
    """

    def __init__(self, graph: Graph, *, upload_stream: Stream | None = None, auto_free_on_launch: bool = False,
                 device_launch: bool = False, use_node_priority: bool = False):
        F = driver.CUgraphInstantiate_flags
        flags = ((F.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH if auto_free_on_launch else 0)
                 | (F.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH if device_launch else 0)
                 | (F.CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY if use_node_priority else 0))
        # WithParams, not plain cuGraphInstantiate, for its answer on failure: why, and at which node
        p = driver.CUDA_GRAPH_INSTANTIATE_PARAMS()
        p.flags = int(flags | (F.CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD if upload_stream is not None else 0))
        if upload_stream is not None:
            p.hUploadStream = upload_stream.handle
        t0 = time.perf_counter()
        err, handle = driver.cuGraphInstantiateWithParams(graph._live(), p)
        if err or p.result_out != driver.CUgraphInstantiateResult.CUDA_GRAPH_INSTANTIATE_SUCCESS:
            raise _instantiate_error(err, p, graph)
        self.handle = handle
        self.instantiate_ms = (time.perf_counter() - t0) * 1e3
        self.upload_ms: float | None = None
        self._finalizer = weakref.finalize(self, _destroy_exec, self.handle)
        self.graph = graph  # pins the graph: its node handles name our nodes to the driver
        graph._execs.add(self)
        self.host_updates = 0  # calls that pushed node parameters from the host (DeviceArgUpdater re-uploads)
        kernels = [n for n in graph.nodes if n.kind == "kernel"]
        self._set_records(zip(kernels, kernels))

    def _set_records(self, pairs) -> None:
        """Records of the kernel nodes of ``pairs`` ``(node, source)``: each takes kernel, shape and a copy of the
        arguments from ``source``, the copies kept in argument tables (one per parameter list)."""
        pairs = list(pairs)
        tables, rows = tables_for([src.args for _, src in pairs])
        self._kernels: dict[int, _ExecKernel] = {}
        for (node, src), table, row in zip(pairs, tables, rows, strict=True):
            self._kernels[node.key] = table.recs[row] = _ExecKernel(node, src.kernel, src.shape, table, row)
        self._tables = list({id(t): t for t in tables}.values())
        self._batches: dict[tuple, Batch] = {}  # set_args_many's resolved node lists

    def _live(self) -> driver.CUgraphExec:
        if not self._finalizer.alive:
            raise ClosedError("this GraphExec was closed")
        return self.handle

    def _rec(self, node: Node | str) -> _ExecKernel:
        return self._recs_of((node,))[0]

    # ---- launch -------------------------------------------------------------------------------------------
    def upload(self, stream: Stream) -> None:
        """Upload the graph's work descriptors ahead of the first launch (timed in ``upload_ms``)."""
        t0 = time.perf_counter()
        check(driver.cuGraphUpload(self._live(), stream.handle), "cuGraphUpload")
        stream.synchronize()
        self.upload_ms = (time.perf_counter() - t0) * 1e3

    def launch(self, stream: Stream) -> None:
        """Launch the whole graph on ``stream`` (the hot path: one driver call)."""
        if not self._finalizer.alive:
            raise ClosedError("this GraphExec was closed")
        err, = driver.cuGraphLaunch(self.handle, stream.handle)
        if err:
            check((err,), "cuGraphLaunch")

    # ---- in-place updates ---------------------------------------------------------------------------------
    def _push(self, rec: _ExecKernel) -> None:
        self.host_updates += 1
        err, = _set_params(self.handle, rec.node.handle, rec.params)
        if err:
            raise error_from(err, f"cuGraphExecKernelNodeSetParams({rec.node.name})")

    def set_args(self, node: Node | str, /, **named) -> None:
        """Rewrite the named pointer/scalar arguments of one kernel node; nothing else changes. If the driver
        refuses them, the node keeps its old values here too (and its old pointer targets stay pinned)."""
        self._live()
        rec = self._rec(node)
        args = rec.args
        packed = args.pack(**named)
        old = args.saved(packed)
        args.apply(packed)
        try:
            self._push(rec)
        except CudaError:
            args.apply(old)
            raise

    def set_args_many(self, nodes, /, **named) -> int:
        """Give the same named values to many kernel nodes (all of one kernel signature): values are checked
        and packed once, then written into each node's block. Returns the number of nodes updated."""
        self._live()
        batch = self._batch(nodes, "set_args_many")
        if batch is None:
            return 0
        packed = batch.pack(**named)
        self.host_updates += 1
        return batch.push(self.handle, packed, _set_params)

    def _batch(self, nodes, caller: str) -> Batch | None:
        """The :class:`Batch` of ``nodes`` (nodes or names of one signature; None if empty), resolved once and
        kept while the records last: a repeated update of the same nodes skips resolving them."""
        if isinstance(nodes, (str, Node)):
            raise TypeError(f"{caller} takes a list of kernel nodes or node names; for one node use set_args")
        key = tuple(nodes)
        try:
            batch = self._batches.get(key)
        except TypeError:
            raise TypeError(f"{caller} takes kernel nodes or node names") from None
        if batch is None:
            recs = self._recs_of_one_signature(key, caller)
            if not recs:
                return None
            if len(self._batches) >= _BATCHES_KEPT:
                self._batches.clear()
            batch = self._batches[key] = Batch(recs)
        return batch

    def _recs_of(self, nodes) -> list[_ExecKernel]:
        """The records of ``nodes`` (nodes or names), checked to be this executable's kernel nodes."""
        get, recs = self._kernels.get, []
        for node in nodes:
            if isinstance(node, str):
                node = self.graph.node(node)
            rec = get(node.key)
            if rec is None or rec.node is not node:
                raise ValueError(f"{node.name!r} is not a kernel node of this executable graph")
            recs.append(rec)
        return recs

    def _recs_of_one_signature(self, nodes, caller: str) -> list[_ExecKernel]:
        """:meth:`_recs_of`, checked to share one kernel signature (one packing serves them all)."""
        recs = self._recs_of(nodes)
        sig = recs[0].args.signature if recs else None
        if any(r.args.signature is not sig and r.args.signature.params != sig.params for r in recs):
            raise TypeError(f"{caller} needs nodes whose kernels share one signature")
        return recs

    def set_args_where(self, kernel, /, **named) -> int:
        """Every node of ``kernel`` (a Kernel or name): ``exe.set_args_where("gemv", w=new_weights)``."""
        return self.set_args_many(self.graph.nodes_of(kernel), **named)

    def set_launch(self, node: Node | str, grid=None, block=None, shared: int | None = None) -> None:
        """Change a kernel node's grid, block or dynamic shared memory in place."""
        self._live()
        rec = self._rec(node)
        s = rec.shape
        shape = replace(s, grid=grid or s.grid, block=block or s.block,
                        shared=s.shared if shared is None else shared)
        rec.node.kernel.prepare(shape)
        p = rec.params
        p.gridDimX, p.gridDimY, p.gridDimZ = shape.grid
        p.blockDimX, p.blockDimY, p.blockDimZ = shape.block
        p.sharedMemBytes = shape.shared
        try:
            self._push(rec)
        except Exception:
            p.gridDimX, p.gridDimY, p.gridDimZ = s.grid
            p.blockDimX, p.blockDimY, p.blockDimZ = s.block
            p.sharedMemBytes = s.shared
            raise
        rec.shape = shape

    def retarget(self, mapping: dict) -> int:
        """Point every pointer argument that now points at a key of ``mapping`` at its value instead (keys and
        values: buffers, arrays or addresses). Swaps a whole weight set or KV pool in place; returns the number
        of kernel nodes changed."""
        self._live()
        new = {}  # old address -> (new address, value, the object it pins): converted once, not per node
        for k, v in mapping.items():
            old = k if isinstance(k, int) else as_view(k).ptr
            raw, ref = convert_arg("retarget", f"new pointer for {old:#x}", "ptr", v)
            new[old] = (raw, v, ref)
        changed = retarget(self._tables, new, self.handle, _set_params) if new else 0
        self.host_updates += changed > 0
        return changed

    def set_enabled(self, node: Node | str, enabled: bool) -> None:
        """Enable or disable a kernel, memset or memcpy node for later launches."""
        node = self.graph.node(node) if isinstance(node, str) else node
        self.host_updates += 1
        check(driver.cuGraphNodeSetEnabled(self._live(), node.handle, int(bool(enabled))),
              f"cuGraphNodeSetEnabled({node.name})")

    def args_of(self, node: Node | str) -> dict:
        """The argument values this executable holds for a kernel node now."""
        return self._rec(node).args.values()

    def update(self, graph: Graph) -> None:
        """Take every node parameter from ``graph`` (same topology) via ``cuGraphExecUpdate``.

        Raises :class:`GraphUpdateError` with the reason (``TOPOLOGY_CHANGED``, ``FUNCTION_CHANGED``, ...) and the
        offending node of ``graph``; the executable is then unchanged and still launches as before.
        """
        old = [r.node for r in self._kernels.values()]
        new = [n for n in graph.nodes if n.kind == "kernel"]
        if len(new) != len(old):  # our records pair kernel nodes by construction order: refuse before the driver
            extra = new[len(old)].name if len(new) > len(old) else None
            raise GraphUpdateError("TOPOLOGY_CHANGED", extra, f" ({len(new)} kernel nodes, this executable has "
                                   f"{len(old)}; refused by rawgraphs before the driver)")
        info = _UpdateResultInfo()
        err = _libcuda().exec_update(int(self._live()), int(graph._live()), ctypes.byref(info))
        if err:
            if err != driver.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE:
                raise error_from(driver.CUresult(err), "cuGraphExecUpdate")
            reason = driver.CUgraphExecUpdateResult(info.result).name.removeprefix("CU_GRAPH_EXEC_UPDATE_ERROR_")
            bad = graph._by_key.get(info.errorNode or 0) or self.graph._by_key.get(info.errorNode or 0)
            raise GraphUpdateError(reason, bad.name if bad else (hex(info.errorNode) if info.errorNode else None))
        # the driver paired nodes by topology; our records pair in the same order (the copies pin what they point at)
        self._set_records(zip(old, new))
        self._params_from = graph  # pins what its other nodes (memcpy, memset, events, children) now point at

    def describe(self) -> list[dict]:
        """The executable's kernel nodes with their current launch shapes and argument values."""
        out = []
        for r in self._kernels.values():
            d = r.node.describe()
            d.update(grid=r.shape.grid, block=r.shape.block, shared=r.shape.shared, args=_show(r.args.values()))
            out.append(d)
        return out

    def close(self) -> None:
        """Destroy the executable graph (idempotent)."""
        self._finalizer()

    def __enter__(self) -> GraphExec:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
