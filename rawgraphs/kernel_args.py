"""Packed kernel argument blocks: ``void* params[n]`` pointing into a value buffer, which ``cuLaunchKernel`` and graph
kernel nodes read directly (the int-address form of ``kernelParams``, the fastest path cuda.bindings offers). Fields
are checked, converted and rewritten in place by name, which is how graph nodes are updated later.
"""

from __future__ import annotations

import ctypes
import struct

import numpy as np
from cuda.bindings import driver

from .memory import _Array, as_view
from .signature import FORMATS, RANGES, Signature

__all__ = ["KernelArgs", "convert_arg"]


class KernelArgs:
    """One packed argument block for a signature, with fields rewritten in place by name.

    ``address`` is the address of the ``void*[]`` the driver reads. Pointer fields keep a reference to the
    object they point into (a buffer, a CuPy array) so it cannot be freed while this block may be launched.
    A block and its ``void*[]`` are one ctypes buffer, filled by one ``struct`` call: building and copying blocks
    is on the path of every captured launch and every explicit node (H200 host, 350 axpb blocks: built in 7.1 ms and
    copied in 1.8 with a converter call and a slice write per field and two ctypes buffers; 2.7 and 1.0 ms so).
    """

    __slots__ = ("signature", "_values", "_buf", "_mv", "_pin", "_layout", "refs", "address")

    def __init__(self, signature: Signature, *args, **kwargs):
        lay = _layout_of(signature)
        self.signature, self._layout, self._pin = signature, lay, None
        values = _bind(signature, lay.names, args, kwargs)
        raws, self.refs = _convert_all(signature.name, lay, values)
        base = self._own_buffer(lay)
        try:
            lay.whole.pack_into(self._buf, 0, *raws, *[base + o for o in lay.offsets])
        except (struct.error, OverflowError):  # out of range: let the field's own check say which and why
            for name, typ, _ in lay.types:
                struct.pack(lay.fields[name][1], convert_arg(signature.name, name, typ, values[name])[0])
            raise
        self._values = values

    def _own_buffer(self, lay: _Layout) -> int:
        """Give the block a fresh zeroed buffer of its own; returns the buffer's address."""
        buf = lay.buffer()
        base = ctypes.addressof(buf)
        self._buf, self._mv, self.address = buf, memoryview(buf).cast("B")[:lay.size], base + lay.ptr_at
        return base

    def set(self, **named) -> None:
        """Rewrite the named fields in place (type- and range-checked before any byte changes)."""
        self.apply(self.pack(**named))

    def pack(self, **named) -> tuple:
        """Check and convert values once; :meth:`apply` writes them into any block of this signature (the
        batched graph update packs once and applies to many nodes)."""
        packed = []
        for name, value in named.items():
            try:
                typ, fmt, off = self._layout.fields[name]
            except KeyError:
                raise TypeError(f"{self.signature.name or 'kernel'}() has no argument {name!r}; "
                                f"its arguments are {', '.join(self.signature.names)}") from None
            raw, ref = convert_arg(self.signature.name, name, typ, value)
            data = struct.pack(fmt, raw)
            packed.append((name, off, off + len(data), data, value, ref))
        return tuple(packed)

    def apply(self, packed: tuple) -> None:
        """Write values made by :meth:`pack` of a block with the same signature (a slice write per field of
        bytes packed once; an executable's batched update writes many rows at once instead: arg_table.Batch)."""
        mv, values, refs = self._mv, self._values, self.refs
        for name, start, end, data, value, ref in packed:
            mv[start:end] = data
            values[name] = value
            refs[name] = ref

    def saved(self, packed: tuple) -> tuple:
        """What :meth:`apply` of ``packed`` would overwrite, in the same form: ``apply(saved)`` puts it back."""
        mv, values, refs = self._mv, self._values, self.refs
        return tuple((name, start, end, bytes(mv[start:end]), values[name], refs.get(name))
                     for name, start, end, *_ in packed)

    def __setitem__(self, name: str, value) -> None:
        self.set(**{name: value})

    def __getitem__(self, name: str):
        self._field(name)  # an unknown name says which exist
        return self._values[name]

    def values(self) -> dict:
        """The current value of every field, in signature order."""
        return {n: self._values[n] for n in self._layout.names}

    def offset(self, name: str) -> int:
        """Byte offset of ``name`` in the kernel's parameter buffer (what device-side node updates address)."""
        return self._field(name)[2]

    def raw(self, name: str):
        """The value stored in the block for ``name`` (a pointer as an int), read back from the bytes."""
        _, fmt, off = self._field(name)
        return struct.unpack_from(fmt, self._buf, off)[0]

    def _field(self, name: str) -> tuple:
        """(type, format, offset) of ``name``, or a KeyError that lists the kernel's arguments."""
        try:
            return self._layout.fields[name]
        except KeyError:
            raise KeyError(f"{self.signature.name or 'kernel'}() has no argument {name!r}; its arguments are "
                           f"{', '.join(self.signature.names)}") from None

    @staticmethod
    def layout(signature: Signature) -> tuple[int, tuple[int, ...]]:
        """Bytes of the packed block of ``signature`` and each field's byte offset in it."""
        lay = _layout_of(signature)
        return lay.size, lay.offsets

    def data(self) -> bytes:
        """The packed block's bytes."""
        return bytes(self._mv)

    @classmethod
    def over(cls, signature: Signature, block: np.ndarray, address: int, values, refs, pin) -> KernelArgs:
        """A block kept in someone else's storage (a row of an executable's ArgTable): ``block`` (uint8, the
        block's size) holds the bytes, ``address`` is its ``void*[]`` (kept alive by ``pin``), ``values`` and
        ``refs`` are dict-like. Nothing is copied."""
        new = cls.__new__(cls)
        new.signature, new._layout = signature, _layout_of(signature)
        new._buf = (ctypes.c_char * len(block)).from_buffer(block)
        new._mv = memoryview(new._buf).cast("B")
        new._pin, new.address = pin, address
        new._values, new.refs = values, refs
        return new

    def copy(self) -> KernelArgs:
        """An independent block with the same values (each graph node owns its own). The bytes are copied as
        they are (they were checked when written): every captured launch and every instantiated node copies
        a block, and re-packing from the values cost ~20 us for an 11-argument kernel."""
        lay = self._layout
        new = KernelArgs.__new__(KernelArgs)
        new.signature, new._layout, new._pin = self.signature, lay, None
        base = new._own_buffer(lay)
        new._mv[:] = self._mv
        lay.words.pack_into(new._buf, lay.ptr_at, *[base + o for o in lay.offsets])
        new._values, new.refs = dict(self._values), dict(self.refs)
        return new

    def __repr__(self) -> str:
        return f"KernelArgs({self.signature.name}: {self.values()})"


class _Layout:
    """How a signature's block is laid out: ``size`` bytes with fields at ``offsets`` (natural alignment, as the
    ABI lays kernel parameters out), then at ``ptr_at`` the ``void*[]`` (one word per field, at least one);
    ``whole`` packs every field's value and every word at once; ``fields[name]`` = (type, format, offset)."""

    __slots__ = ("names", "types", "fields", "size", "offsets", "ptr_at", "whole", "words", "buffer")

    def __init__(self, sig: Signature):
        fmt, offsets, off = "<", [], 0
        for p in sig.params:
            size = struct.calcsize(FORMATS[p.type])
            start = (off + size - 1) // size * size
            fmt += "x" * (start - off) + FORMATS[p.type]
            offsets.append(start)
            off = start + size
        self.size = max(off, 8)
        self.ptr_at = -(-self.size // 8) * 8
        self.offsets = tuple(offsets)
        words = len(offsets)  # a kernel without parameters still gets one word, never read
        self.whole = struct.Struct(fmt + "x" * (self.ptr_at - off) + "Q" * words)
        self.words = struct.Struct("<" + "Q" * words)
        self.buffer = ctypes.c_char * (self.ptr_at + 8 * max(words, 1))  # a zeroed buffer when called
        self.names = sig.names
        self.types = tuple((p.name, p.type, p.type in ("f32", "f64")) for p in sig.params)  # (name, type, float)
        self.fields = {p.name: (p.type, "<" + FORMATS[p.type], o) for p, o in zip(sig.params, offsets)}


_LAYOUTS: dict[int, tuple[Signature, _Layout]] = {}  # id(signature) -> (signature, its layout)


def _layout_of(sig: Signature) -> _Layout:
    """The layout of a signature's packed block (computed once)."""
    hit = _LAYOUTS.get(id(sig))
    if hit is not None and hit[0] is sig:
        return hit[1]
    lay = _Layout(sig)
    _LAYOUTS[id(sig)] = (sig, lay)
    return lay


def _bind(sig: Signature, names: tuple[str, ...], args: tuple, kwargs: dict) -> dict:
    if not args and len(kwargs) == len(names):  # all by name, the usual call: no checks needed if all present
        try:
            return {n: kwargs[n] for n in names}
        except KeyError:
            pass  # a wrong name: the general path says which
    if len(args) > len(names):
        raise TypeError(f"{sig.name}() takes {len(names)} arguments, got {len(args)} positional")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise TypeError(f"{sig.name}() has no argument {k!r}; its arguments are {', '.join(names)}")
        if k in bound:
            raise TypeError(f"{sig.name}() got argument {k!r} twice")
        bound[k] = v
    missing = [n for n in names if n not in bound]
    if missing:
        raise TypeError(f"{sig.name}() is missing argument(s) {', '.join(missing)}; signature: {sig}")
    return bound


def _convert_all(kernel: str, lay: _Layout, values: dict) -> tuple[list, dict]:
    """(raw values in field order, {name: object to keep alive}): the common types inline, anything else (and
    every error) through :func:`convert_arg`; integer ranges are checked by the pack that follows."""
    raws, refs = [], {}
    for name, typ, flt in lay.types:
        v = values[name]
        t = type(v)
        if t is int and not flt:
            raws.append(v)
            refs[name] = None
        elif flt and t is float:  # an int goes through convert_arg: float(10**400) overflows
            raws.append(v)
            refs[name] = None
        elif typ == "ptr" and isinstance(v, _Array):
            raws.append(int(v))
            refs[name] = v
        else:
            raw, refs[name] = convert_arg(kernel, name, typ, v)
            raws.append(raw)
    return raws, refs


def convert_arg(kernel: str, name: str, typ: str, value):
    """(raw value to pack, object to keep alive) or a TypeError/ValueError naming the argument."""
    where = f"{kernel}() argument {name!r} ({typ})"
    if typ == "ptr":
        if value is None:
            return 0, None
        if isinstance(value, int) and not isinstance(value, bool):
            raw, ref = value, None
        elif isinstance(value, _Array) or hasattr(value, "__cuda_array_interface__"):
            ref = as_view(value)
            raw = int(ref)
        elif isinstance(value, driver.CUdeviceptr):
            raw, ref = int(value), None
        else:
            raise TypeError(f"{where} needs a device pointer (int, DeviceBuffer, CuPy array, torch tensor), "
                            f"got {type(value).__name__}")
    elif typ in ("f32", "f64"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
            raise TypeError(f"{where} needs a number, got {type(value).__name__}")
        try:
            raw = float(value)
            if typ == "f32":
                struct.pack("<f", raw)  # finite but past float32's range: OverflowError (inf and nan pass)
        except OverflowError:
            raise ValueError(f"{where} = {value!r} does not fit in {typ}") from None
        return raw, None
    else:
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(f"{where} needs an int, got {type(value).__name__}")
        raw, ref = value.__index__(), None
    lo, hi = RANGES[typ]
    if not lo <= raw <= hi:
        raise ValueError(f"{where} = {raw} is out of range [{lo}, {hi}]")
    return raw, ref
