"""Argument tables: an executable's kernel-node argument blocks stored by column, so a batched update is one
array write plus the driver call per node.

``GraphExec`` keeps the blocks of all its kernel nodes that share a parameter list in one :class:`ArgTable`:
row i of ``blocks`` (uint8) is node i's packed block (what its ``kernelParams`` point into), and
``values[name][i]`` / ``refs[name][i]`` its Python value and the object it pins. A :class:`KernelArgs` of such a
node is a view of its row, so ``set_args`` and everything else work as on any block. Giving many nodes one value
(``set_args_many``, ``DeviceArgUpdater.set``) is then one NumPy write into ``blocks`` and one list write per
column, and the per-node Python left is the ``cuGraphExecKernelNodeSetParams`` call itself.

Why by hand: writing each node's block and value dicts in Python cost ~0.26 us per node on our CPU (0.8 us on
the H200's host, where the driver call itself took 0.63), more than the call; a :class:`Batch` (the nodes of one
update, resolved once and cached by the executable) writes all rows at once. On the H200 ``set_args_many`` then
took 0.53-0.64 us per node against the raw call's 0.48-0.60 in the same runs (session 18). :func:`retarget` finds
the pointer fields to move by reading each table's pointer columns at once.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from itertools import repeat

import numpy as np

from .errors import error_from
from .kernel_args import KernelArgs

__all__ = ["ArgTable", "Batch", "retarget", "tables_for"]


class _Row(MutableMapping):
    """One row of a table's columns seen as a dict ``{name: value}`` (a node's ``KernelArgs`` values or refs)."""

    __slots__ = ("columns", "row")

    def __init__(self, columns: dict[str, list], row: int):
        self.columns, self.row = columns, row

    def __getitem__(self, name: str):
        return self.columns[name][self.row]

    def __setitem__(self, name: str, value) -> None:
        self.columns[name][self.row] = value

    def __delitem__(self, name: str) -> None:
        raise TypeError("a kernel argument cannot be removed")

    def __iter__(self):
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)


class ArgTable:
    """The argument blocks and values of kernel nodes with one parameter list, a row per node: ``blocks`` (rows
    padded to 8 bytes, so the pointer fields are a uint64 column each), ``ptrs`` (row i: the ``void*[]`` into
    row i that the driver reads as its node's ``kernelParams``), ``values`` / ``refs`` columns, and ``recs[row]``,
    the executable's record. Built from the nodes' own blocks in one pass: no per-node ctypes objects (three of
    those per node made instantiate's Python ~10 us a node on our CPU)."""

    def __init__(self, sources: list[KernelArgs]):
        n, sig = len(sources), sources[0].signature
        self.size, offsets = KernelArgs.layout(sig)
        stride = -(-self.size // 8) * 8
        self.blocks = np.zeros((n, stride), np.uint8)
        self.blocks[:, :self.size] = np.frombuffer(b"".join(a.data() for a in sources), np.uint8).reshape(n, -1)
        self.signatures = [a.signature for a in sources]  # equal parameter lists, their own names
        self.values = {k: [a[k] for a in sources] for k in sig.names}
        self.refs = {k: [a.refs[k] for a in sources] for k in sig.names}
        words = np.array(offsets or (0,), np.uint64)  # a kernel without parameters: one pointer, never read
        rows = np.arange(n, dtype=np.uint64)[:, None] * np.uint64(stride)
        self.ptrs = np.uint64(self.blocks.ctypes.data) + rows + words[None, :]  # [n, fields]
        self._ptr0, self._ptr_row = self.ptrs.ctypes.data, self.ptrs.shape[1] * 8
        self.pointers = [(p.name, o // 8) for p, o in zip(sig.params, offsets) if p.type == "ptr"]  # (name, word)
        self.recs: list = [None] * n

    def address(self, row: int) -> int:
        """The ``void*[]`` of ``row``'s fields (its node's ``kernelParams``)."""
        return self._ptr0 + row * self._ptr_row

    def view(self, row: int) -> KernelArgs:
        """``row`` as a :class:`KernelArgs` (no copy: writes through it land in the table)."""
        return KernelArgs.over(self.signatures[row], self.blocks[row, :self.size], self.address(row),
                               _Row(self.values, row), _Row(self.refs, row), pin=self)


def tables_for(sources: list[KernelArgs]) -> tuple[list[ArgTable], list[int]]:
    """Tables holding copies of the argument blocks ``sources``, one per parameter list: each source's table and
    row, in order."""
    groups: dict[tuple, list[int]] = {}
    for i, args in enumerate(sources):
        groups.setdefault(args.signature.params, []).append(i)
    where: list = [None] * len(sources)
    for members in groups.values():
        table = ArgTable([sources[i] for i in members])
        for row, i in enumerate(members):
            where[i] = (table, row)
    return [w[0] for w in where], [w[1] for w in where]


class Batch:
    """The kernel nodes of one batched update (records of one table), resolved once: their rows (a slice when
    consecutive) and the (node handle, params) pair of each driver call."""

    def __init__(self, recs: list):
        self.recs = recs
        self.table = recs[0].table
        self.row_list = [r.row for r in recs]
        self.n = len(self.row_list)
        self.consecutive = self.row_list == list(range(self.row_list[0], self.row_list[0] + self.n))
        # what indexes the rows: a slice where consecutive (list and array slicing then copy nothing per row)
        self.rows = slice(self.row_list[0], self.row_list[0] + self.n) if self.consecutive else np.array(self.row_list)
        self.calls = [(r.node.handle, r.params) for r in recs]

    def pack(self, **named) -> tuple:
        """Values checked and packed once (:meth:`KernelArgs.pack`)."""
        return self.recs[0].args.pack(**named)

    def write(self, packed: tuple) -> None:
        """Write packed values into every row: the blocks and the value columns."""
        t = self.table
        for name, start, end, data, value, ref in packed:
            t.blocks[self.rows, start:end] = np.frombuffer(data, np.uint8)
            self._fill(t.values[name], value)
            self._fill(t.refs[name], ref)

    def _fill(self, column: list, value) -> None:
        if self.consecutive:
            column[self.rows] = repeat(value, self.n)
        else:  # rows picked out of order: rare, a plain loop
            for r in self.row_list:
                column[r] = value

    def _take(self, column: list) -> list:
        return column[self.rows] if self.consecutive else [column[r] for r in self.row_list]

    def _saved(self, packed: tuple) -> tuple:
        """What :meth:`write` will overwrite, for :meth:`_restore`."""
        t = self.table
        return (t.blocks[self.rows].copy(),
                {name: (self._take(t.values[name]), self._take(t.refs[name])) for name, *_ in packed})

    def _restore(self, saved: tuple, first: int) -> None:
        """Put back the bytes and values of rows ``first`` on (the error path)."""
        t, (blocks, cols) = self.table, saved
        rows = self.row_list[first:]
        t.blocks[rows] = blocks[first:]
        for name, (values, refs) in cols.items():
            for r, v, ref in zip(rows, values[first:], refs[first:], strict=True):
                t.values[name][r], t.refs[name][r] = v, ref

    def push(self, exe_handle, packed: tuple, set_params) -> int:
        """Write ``packed`` into every row and hand each node to the driver. If the driver refuses node k, the k
        nodes before it keep the new values and node k on keep their old ones (blocks and values), then the
        error is raised naming node k."""
        saved = self._saved(packed)
        self.write(packed)
        for handle, params in self.calls:  # the hot loop: one driver call per node, nothing else
            err, = set_params(exe_handle, handle, params)
            if err:
                break
        else:
            return self.n
        k = next(i for i, c in enumerate(self.calls) if c[0] is handle)
        self._restore(saved, k)
        raise error_from(err, f"cuGraphExecKernelNodeSetParams({self.recs[k].node.name}) in a batched update: the "
                         f"{k} node(s) before it took the new values, it and the {self.n - k - 1} after it did not")


def retarget(tables: list[ArgTable], new: dict[int, tuple], exe_handle, set_params) -> int:
    """Point every pointer field that holds a key of ``new`` (old address -> (new address, value, ref)) at the
    new address, in every table, and hand each changed node to the driver once; returns the number of nodes
    changed. The fields are found by column (each pointer field of a table read at once), not node by node.
    If the driver refuses a node, it and the nodes after it get their old pointers back before the error."""
    changed = []  # (table, row, [(name, word, old address, old value, old ref)]) in table and row order
    for t in tables:
        words, edits = t.blocks.view(np.uint64), {}
        for name, w in t.pointers:
            # the column as a list and a dict lookup per row: np.isin cost ~30 us a call on short columns
            for r, old in enumerate(words[:, w].tolist()):
                if old not in new:
                    continue
                edits.setdefault(r, []).append((name, w, old, t.values[name][r], t.refs[name][r]))
                words[r, w], t.values[name][r], t.refs[name][r] = new[old]
        changed += [(t, r, e) for r, e in edits.items()]
    for i, (t, r, _) in enumerate(changed):
        rec = t.recs[r]
        err, = set_params(exe_handle, rec.node.handle, rec.params)
        if err:
            for t2, r2, edits in changed[i:]:
                words = t2.blocks.view(np.uint64)
                for name, w, old, value, ref in edits:
                    words[r2, w], t2.values[name][r2], t2.refs[name][r2] = old, value, ref
            raise error_from(err, f"cuGraphExecKernelNodeSetParams({rec.node.name}) in retarget: the {i} node(s) "
                             f"before it were retargeted, it and the {len(changed) - i - 1} after it were not")
    return len(changed)
