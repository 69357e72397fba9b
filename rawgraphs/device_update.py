"""``DeviceArgUpdater``: the same argument values written into many device-updatable kernel nodes of an
executable graph by one kernel on a stream (``cudaGraphKernelNodeUpdatesApply``), instead of one
``cuGraphExecKernelNodeSetParams`` call per node.

``GraphExec.set_args_many`` pays one driver call per node (0.5-1.2 us on the H200 hosts we measured,
benchmarks/graph_overheads.py), so its per-node cost cannot go below that from the host. Here the host packs
the values once, writes one 40-byte ``cudaGraphKernelNodeUpdate`` per node and field into mapped pinned memory
(NumPy, vectorized over the nodes) and launches ``apply_updates`` (kernels/device_update.cu), which applies the
whole batch on the device, one thread per update (H200, 350 nodes: 0.14 us of host time and 0.16 us of GPU time per
node in session 22; session 7's first version, 0.53 and 0.55 us; 2.5 us of GPU time per node when one thread applied
the whole batch). The update is stream-ordered like
any kernel: a graph launched after it on the same
stream sees the new values, one launched before it does not. The executable's own argument blocks are rewritten
too, so what it reports, and what a later host-side update pushes, agree with what the device holds.

The driver's rules for device-updatable nodes apply: mark them with ``Graph.make_device_updatable`` before
instantiating; such a graph cannot be instantiated twice or updated with ``GraphExec.update``. A host-side update
of these nodes is uploaded with the next launch, which would overwrite device-side updates made after it; the
updater therefore re-uploads the executable (stream-ordered) before its next batch whenever host-side updates
happened since its last one.

Usage::

    g.make_device_updatable(node)           # for every node to update, before instantiate
    exe = g.instantiate()
    up = DeviceArgUpdater(exe, nodes, stream)
    up.set(stream, w=new_weights)          # one kernel on `stream`
    exe.launch(stream)                      # sees w = new_weights
"""

from __future__ import annotations

import numpy as np
from cuda.bindings import driver

from .context import Event, Stream
from .errors import ClosedError, check
from .kernel import LaunchShape, Module
from .memory import HostBuffer

__all__ = ["DeviceArgUpdater", "UPDATE_DTYPE"]

# cudaGraphKernelNodeUpdate (driver_types.h) in its parameter form: node, field, pad, pValue, offset, size.
UPDATE_DTYPE = np.dtype([("node", "<u8"), ("field", "<u4"), ("pad", "<u4"), ("value", "<u8"), ("offset", "<u8"),
                         ("size", "<u8")])
_FIELD_PARAM = 2  # cudaGraphKernelNodeFieldParam
_SLOTS = 2  # staging buffers: the host fills one while the device may still read the other
_APPLY_THREADS = 128  # apply_updates' block; one thread per update
_module: Module | None = None


def _apply_shape(count: int) -> LaunchShape:
    """apply_updates' launch for ``count`` updates: one thread each (the kernel splits the batch evenly over
    whatever threads it gets)."""
    return LaunchShape(-(-count // _APPLY_THREADS), _APPLY_THREADS)


def _apply_kernel():
    global _module
    if _module is None or _module.closed:
        _module = Module.from_file("device_update")
    return _module.kernel("apply_updates")


class _Slot:
    """One staging buffer in mapped pinned memory: ``[nodes * fields]`` updates, then the packed values."""

    def __init__(self, updates: int, value_bytes: int, kernel):
        self.host = HostBuffer(updates * UPDATE_DTYPE.itemsize + value_bytes)
        self.updates = self.host.array[:updates * UPDATE_DTYPE.itemsize].view(UPDATE_DTYPE)
        self.values = self.host.array[updates * UPDATE_DTYPE.itemsize:]
        dev = self.host.device_ptr
        self.values_dev = dev + updates * UPDATE_DTYPE.itemsize
        self.args = kernel.args(updates=dev, count=0)
        self.done = Event.create(timing=False)  # synchronize() returns at once until first recorded


class DeviceArgUpdater:
    """Batched, stream-ordered argument updates of ``nodes`` (device-updatable kernel nodes of ``exe``, all of
    one kernel signature). ``stream`` uploads the executable once, so the device holds the nodes' parameters
    before the first batch."""

    def __init__(self, exe, nodes, stream: Stream):
        self._exe = exe
        self._batch = exe._batch(nodes, "DeviceArgUpdater")
        if self._batch is None:
            raise ValueError("DeviceArgUpdater needs at least one kernel node")
        self._recs = self._batch.recs
        for rec in self._recs:
            if not rec.node.device_handle:
                raise ValueError(f"{rec.node.name!r} is not device-updatable: call Graph.make_device_updatable"
                                 "(node) on it before instantiating")
        self._handles = np.array([rec.node.device_handle for rec in self._recs], np.uint64)
        fields = len(self._recs[0].args.signature.params)
        kernel = _apply_kernel()
        self._kernel = kernel
        self._slots = [_Slot(len(self._recs) * fields, 8 * fields, kernel) for _ in range(_SLOTS)]
        self._next = 0
        self._upload(stream)

    def _upload(self, stream: Stream) -> None:
        check(driver.cuGraphUpload(self._exe._live(), stream.handle), "cuGraphUpload")
        self._uploaded_at = self._exe.host_updates

    def set(self, stream: Stream, /, **named) -> int:
        """Give every node the named values (checked and packed once), applied by one kernel on ``stream``.
        Returns the number of nodes updated."""
        if self._slots is None:
            raise ClosedError("this DeviceArgUpdater was closed")
        exe = self._exe
        exe._live()
        packed = self._batch.pack(**named)
        if not packed:
            return 0
        if exe.host_updates != self._uploaded_at:
            self._upload(stream)
        slot = self._slots[self._next]
        self._next = (self._next + 1) % _SLOTS
        slot.done.synchronize()  # the device has read this buffer's previous batch
        n, f = len(self._recs), len(packed)
        upd = slot.updates[:n * f].reshape(n, f)
        for j, (_, start, end, data, _, _) in enumerate(packed):
            slot.values[8 * j:8 * j + len(data)] = np.frombuffer(data, np.uint8)
            col = upd[:, j]
            col["node"] = self._handles
            col["field"] = _FIELD_PARAM
            col["value"] = slot.values_dev + 8 * j
            col["offset"] = start
            col["size"] = end - start
        self._batch.write(packed)  # the executable's blocks hold the new values (and pin what they point at)
        slot.args.set(count=n * f)
        self._kernel.launch(_apply_shape(n * f), slot.args, stream)
        slot.done.record(stream)
        return n

    def close(self) -> None:
        """Wait for the batches in flight and free the staging memory (idempotent)."""
        for slot in self._slots or ():
            slot.done.synchronize()
            slot.done.close()
            slot.host.close()
        self._slots = None
