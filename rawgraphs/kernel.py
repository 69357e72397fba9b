"""Modules, kernels that know their signature, packed argument blocks, and eager launch.

A kernel's signature is read from its ``extern "C" __global__`` declaration in the source, so the Python side
never restates it by hand (``expect=`` checks a stated one against the source). :class:`KernelArgs` is one packed
host block, ``void* params[n]`` pointing into a value buffer, that ``cuLaunchKernel`` and graph kernel nodes
read directly (the int-address form of ``kernelParams``, the fastest path cuda.bindings offers). Fields are
rewritten in place by name, which is how graph nodes are updated later.
"""

from __future__ import annotations

import ctypes
import re
import struct
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cuda.bindings import driver

from .capture_state import release
from .capture_state import state as capture_state
from .compiler import Program, compile_file, compile_source
from .context import Stream, device
from .errors import ClosedError, check
from .memory import DeviceView, _Array, as_view

__all__ = ["Param", "Signature", "LaunchShape", "KernelArgs", "Kernel", "Module", "launchable", "parse_signatures",
           "resolve"]

# C parameter type -> (our type name, struct format). Pointers of any pointee are "ptr".
_C_TYPES = {
    "int": "i32", "int32_t": "i32", "unsigned": "u32", "unsigned int": "u32", "uint32_t": "u32",
    "long long": "i64", "long long int": "i64", "int64_t": "i64",
    "unsigned long long": "u64", "unsigned long long int": "u64", "uint64_t": "u64", "size_t": "u64",
    "cudaGraphConditionalHandle": "u64", "cudaGraphDeviceNode_t": "u64", "float": "f32", "double": "f64",
}
_FORMATS = {"ptr": "Q", "i32": "i", "u32": "I", "i64": "q", "u64": "Q", "f32": "f", "f64": "d"}
_RANGES = {"i32": (-2**31, 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-2**63, 2**63 - 1),
           "u64": (0, 2**64 - 1), "ptr": (0, 2**64 - 1)}


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its name and type (``ptr``, ``i32``, ``u32``, ``i64``, ``u64``, ``f32``, ``f64``)."""

    name: str
    type: str

    def __post_init__(self):
        if self.type not in _FORMATS:
            raise ValueError(f"parameter {self.name!r}: unknown type {self.type!r} (one of {sorted(_FORMATS)})")


@dataclass(frozen=True)
class Signature:
    """A kernel's name and ordered parameters; ``template`` for a ``template <...> __global__`` kernel, which is
    launched by the name expression of an instantiation compiled in (``"attention<128,1,true>"``)."""

    name: str
    params: tuple[Param, ...]
    template: bool = False

    @classmethod
    def parse(cls, text: str) -> Signature:
        """``"rmsnorm(x: ptr, n: i32, eps: f32)"`` or ``"x:ptr, n:i32"`` (then the name is empty)."""
        m = re.fullmatch(r"\s*(\w*)\s*\(?(.*?)\)?\s*", text, re.S)
        params = [p.split(":") for p in m.group(2).split(",") if p.strip()]
        return cls(m.group(1), tuple(Param(n.strip(), t.strip()) for n, t in params))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def __str__(self) -> str:
        return f"{self.name}({', '.join(f'{p.name}: {p.type}' for p in self.params)})"


def _c_param(decl: str, kernel: str) -> Param:
    decl = re.sub(r"\b(const|volatile|__restrict__|__restrict|__grid_constant__)\b", " ", decl).strip()
    m = re.fullmatch(r"(.*?)\s*([*&]*)\s*(\w+)", decl, re.S)
    if not m:
        raise ValueError(f"kernel {kernel}: cannot parse parameter {decl!r}")
    ctype, stars, name = " ".join(m.group(1).split()), m.group(2), m.group(3)
    if "&" in stars:
        raise ValueError(f"kernel {kernel}: reference parameter {name!r} cannot be passed from the host")
    if stars:
        return Param(name, "ptr")
    if ctype not in _C_TYPES:
        raise ValueError(f"kernel {kernel}: parameter {name!r} has unsupported type {ctype!r}; "
                         f"use a pointer or one of {sorted(_C_TYPES)}")
    return Param(name, _C_TYPES[ctype])


def parse_signatures(source: str) -> dict[str, Signature]:
    """Signatures of every ``__global__`` function in ``source``, keyed by name (a template's by its bare name,
    marked ``template``)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)
    sigs = {}
    for m in re.finditer(r"(template\s*<[^>]*>\s*)?__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
                         r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)", text):
        name, body = m.group(2), m.group(3).strip()
        decls = [] if body in ("", "void") else [d for d in body.split(",")]
        sigs[name] = Signature(name, tuple(_c_param(d, name) for d in decls), bool(m.group(1)))
    return sigs


def resolve(signatures: dict[str, Signature], compiled, name: str) -> Signature:
    """The signature of kernel ``name`` in a module of ``signatures`` compiled with the name expressions
    ``compiled``: a plain kernel by its name, a template instantiation by a name expression compiled in
    (``"attention<128,1,true>"``, the template's parameters). Raises KeyError naming what is wrong and what exists."""
    base = name.split("<")[0].strip()
    sig = signatures.get(base)
    if sig is None:
        raise KeyError(f"no kernel {name!r}; the source has {sorted(signatures)}")
    if not sig.template:
        if name != base:
            raise KeyError(f"{name!r}: {base} is not a template kernel; launch it as {base!r}")
        return sig
    if name not in compiled:
        instances = sorted(e for e in compiled if e.split("<")[0].strip() == base)
        raise KeyError(f"{name!r}: {base} is a template kernel; launch an instantiation compiled in by name "
                       f"expression ({instances or 'none: pass name_expressions= to compile one'})")
    return Signature(name, sig.params)


def launchable(signatures: dict[str, Signature], name_expressions=()) -> dict[str, Signature]:
    """What a module of these kernels compiled with ``name_expressions`` can launch, by name: each plain kernel
    and each template instantiation (:func:`resolve`); not a bare template."""
    out = {n: s for n, s in signatures.items() if not s.template}
    out.update({e: resolve(signatures, name_expressions, e) for e in name_expressions})
    return out


@dataclass(frozen=True)
class LaunchShape:
    """Grid, block and dynamic shared memory of one launch; validated at construction.

    ``pdl=True`` launches with programmatic stream serialization (sm_90+): the kernel may start while the
    previous kernel on the stream finishes, and must ``griddepcontrol.wait`` before reading its results
    (kernels/pdl.cuh). Captured, it becomes a programmatic graph edge.

    ``cluster`` (sm_90+) groups blocks into thread block clusters of that shape (each dimension divides the
    grid's; at most 8 blocks, the portable limit): a cluster's blocks run at once on one GPC and may read each
    other's shared memory. A graph node keeps it as a node attribute.
    """

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int = 0
    pdl: bool = False
    cluster: tuple[int, int, int] = (1, 1, 1)

    def __init__(self, grid, block, shared: int = 0, pdl: bool = False, cluster=(1, 1, 1)):
        g = _dim3(grid, "grid")
        b = _dim3(block, "block")
        c = _dim3(cluster, "cluster")
        if b[0] * b[1] * b[2] > 1024:
            raise ValueError(f"block {b} has {b[0] * b[1] * b[2]} threads; the limit is 1024")
        if shared < 0:
            raise ValueError(f"shared memory must be >= 0, got {shared}")
        if any(gd % cd for gd, cd in zip(g, c)) or c[0] * c[1] * c[2] > 8:
            raise ValueError(f"cluster {c} must divide grid {g} in every dimension and hold at most 8 blocks")
        object.__setattr__(self, "grid", g)
        object.__setattr__(self, "block", b)
        object.__setattr__(self, "shared", int(shared))
        object.__setattr__(self, "pdl", bool(pdl))
        object.__setattr__(self, "cluster", c)
        # Not a field: read by every eager launch (Kernel.launch), where a property call would cost a Python frame.
        object.__setattr__(self, "launch_ex", self.pdl or self.clustered)

    @property
    def clustered(self) -> bool:
        return self.cluster != (1, 1, 1)


def cluster_value(cluster: tuple[int, int, int], value):
    """``value`` (a launch attribute's ``CUlaunchAttributeValue`` or a graph node's ``CUkernelNodeAttrValue``)
    with its cluster dimensions set to ``cluster``."""
    value.clusterDim.x, value.clusterDim.y, value.clusterDim.z = cluster
    return value


def _dim3(v, what: str) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, int) else tuple(v)
    if not 1 <= len(t) <= 3 or any(not isinstance(x, int) or x < 1 for x in t):
        raise ValueError(f"{what} must be 1 to 3 positive ints, got {v!r}")
    return (t + (1, 1))[:3]


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

    def __setitem__(self, name: str, value) -> None:
        self.set(**{name: value})

    def __getitem__(self, name: str):
        return self._values[name]

    def values(self) -> dict:
        """The current value of every field, in signature order."""
        return {n: self._values[n] for n in self._layout.names}

    def offset(self, name: str) -> int:
        """Byte offset of ``name`` in the kernel's parameter buffer (what device-side node updates address)."""
        return self._layout.fields[name][2]

    def raw(self, name: str):
        """The value stored in the block for ``name`` (a pointer as an int), read back from the bytes."""
        _, fmt, off = self._layout.fields[name]
        return struct.unpack_from(fmt, self._buf, off)[0]

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
            size = struct.calcsize(_FORMATS[p.type])
            start = (off + size - 1) // size * size
            fmt += "x" * (start - off) + _FORMATS[p.type]
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
        self.fields = {p.name: (p.type, "<" + _FORMATS[p.type], o) for p, o in zip(sig.params, offsets)}


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
        elif flt and (t is float or t is int):
            raws.append(float(v))
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
        return float(value), None
    else:
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(f"{where} needs an int, got {type(value).__name__}")
        raw, ref = value.__index__(), None
    lo, hi = _RANGES[typ]
    if not lo <= raw <= hi:
        raise ValueError(f"{where} = {raw} is out of range [{lo}, {hi}]")
    return raw, ref


class Kernel:
    """One ``__global__`` function of a loaded :class:`Module`, with its signature. Pins its module."""

    def __init__(self, module: Module, name: str, symbol: str, signature: Signature):
        self.module, self.name, self.signature = module, name, signature
        self.function = check(driver.cuModuleGetFunction(module.handle, symbol.encode()),
                              f"cuModuleGetFunction({name})")
        # Dynamic shared bytes a launch may ask for without opting in: 48 KiB less the kernel's static shared
        # memory (a 33 KiB request failed with INVALID_VALUE beside 17 KiB of static arrays).
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self._max_shared = check(driver.cuFuncGetAttribute(attr, self.function),
                                 f"cuFuncGetAttribute({name}, MAX_DYNAMIC_SHARED_SIZE_BYTES)")
        self._configs: dict = {}  # (shape, stream) -> CUlaunchConfig for PDL and cluster launches

    def args(self, /, *args, **kwargs) -> KernelArgs:
        """A new packed argument block; all arguments required, by position or name."""
        return KernelArgs(self.signature, *args, **kwargs)

    def prepare(self, shape: LaunchShape) -> None:
        """Opt the function in to ``shape.shared`` bytes of dynamic shared memory if above what it may use now
        (48 KiB with its static shared memory, until opted in further)."""
        if shape.shared > self._max_shared:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(driver.cuFuncSetAttribute(self.function, attr, shape.shared), "cuFuncSetAttribute")
            self._max_shared = shape.shared

    def launch(self, shape: LaunchShape, args: KernelArgs, stream: Stream) -> None:
        """Eager launch of a prepared argument block on ``stream`` (the hot path: one driver call)."""
        if args.signature is not self.signature:
            raise TypeError(f"argument block is for {args.signature.name}(), not {self.name}()")
        if self.module.closed:
            raise ClosedError(f"kernel {self.name}: its module was closed")
        if shape.shared > self._max_shared:
            self.prepare(shape)
        g, b = shape.grid, shape.block
        if shape.launch_ex:
            err, = driver.cuLaunchKernelEx(self._config(shape, stream), self.function, args.address, 0)
        else:
            err, = driver.cuLaunchKernel(self.function, g[0], g[1], g[2], b[0], b[1], b[2], shape.shared,
                                         stream.handle, args.address, 0)
        if err:
            check((err,), f"cuLaunchKernel({self.name}, grid={g}, block={b}, shared={shape.shared})")
        if capture_state.depth:  # inside Graph.capture: keep a named record of the node just captured
            capture_state.on_launch(self, shape, args, stream)

    def _config(self, shape: LaunchShape, stream: Stream) -> driver.CUlaunchConfig:
        """The cached ``CUlaunchConfig`` of a PDL or cluster launch of ``shape`` on ``stream``."""
        key = (shape, int(stream.handle))
        cfg = self._configs.get(key)
        if cfg is None:
            cfg = driver.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = shape.grid
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = shape.block
            cfg.sharedMemBytes, cfg.hStream = shape.shared, stream.handle
            attrs = []
            if shape.pdl:
                attr = driver.CUlaunchAttribute()
                attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
                attr.value.programmaticStreamSerializationAllowed = 1
                attrs.append(attr)
            if shape.clustered:
                attr = driver.CUlaunchAttribute()
                attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
                attr.value = cluster_value(shape.cluster, attr.value)
                attrs.append(attr)
            cfg.attrs, cfg.numAttrs = attrs, len(attrs)
            self._configs[key] = cfg
        return cfg

    def __call__(self, grid, block, /, *args, stream: Stream, shared: int = 0, **kwargs) -> KernelArgs:
        """Convenience: pack the arguments and launch once; returns the block it launched."""
        block_args = self.args(*args, **kwargs)
        self.launch(LaunchShape(grid, block, shared), block_args, stream)
        return block_args

    def attributes(self) -> dict[str, int]:
        """Registers per thread, local (spill) bytes, static shared bytes and max threads per block."""
        a = driver.CUfunction_attribute
        q = {"registers": a.CU_FUNC_ATTRIBUTE_NUM_REGS, "local_bytes": a.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
             "shared_bytes": a.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
             "max_threads": a.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK}
        return {k: check(driver.cuFuncGetAttribute(v, self.function), "cuFuncGetAttribute") for k, v in q.items()}

    def blocks_per_sm(self, shape: LaunchShape) -> int:
        """How many blocks of ``shape`` (its block size and dynamic shared bytes) one SM holds at once, by the
        driver's occupancy calculator (cuOccupancyMaxActiveBlocksPerMultiprocessor): registers, shared memory
        and threads, whichever binds first. Opts in to ``shape.shared`` first, as a launch would."""
        self.prepare(shape)
        threads = shape.block[0] * shape.block[1] * shape.block[2]
        return check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function, threads, shape.shared),
                     f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name})")

    def __repr__(self) -> str:
        return f"Kernel({self.signature})"


def _unload(handle) -> None:
    release(driver.cuModuleUnload, handle)


class Module:
    """A loaded cubin and the signatures of its kernels. Create with :meth:`from_file` / :meth:`from_source`."""

    def __init__(self, program: Program, signatures: dict[str, Signature]):
        device()
        self.program, self.signatures = program, signatures
        self._launchable = launchable(signatures, program.lowered)  # name -> signature, what kernel() serves
        self.handle = check(driver.cuModuleLoadData(program.cubin), f"cuModuleLoadData({program.name})")
        self._finalizer = weakref.finalize(self, _unload, self.handle)
        self._kernels: dict[str, Kernel] = {}

    @classmethod
    def from_source(cls, source: str, name: str = "kernel.cu", **compile_kw) -> Module:
        """Compile ``source`` for the current device and load it."""
        return cls(compile_source(source, name, **compile_kw), parse_signatures(source))

    @classmethod
    def from_file(cls, path, **compile_kw) -> Module:
        """Compile a ``.cu`` file (or a shipped kernel by bare name, e.g. ``"rmsnorm"``) and load it."""
        program = compile_file(path, **compile_kw)
        src = Path(path) if Path(path).exists() else None
        from .compiler import kernel_dir
        src = src or kernel_dir() / f"{path}.cu"
        return cls(program, parse_signatures(src.read_text()))

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def names(self) -> tuple[str, ...]:
        """Every kernel :meth:`kernel` can return: plain kernels and the template instantiations compiled in."""
        return tuple(self._launchable)

    def kernel(self, name: str, expect: str | None = None) -> Kernel:
        """The kernel ``name``: a plain kernel, or a template instantiation by the name expression it was
        compiled with (``Module.from_file("attention", name_expressions=("attention<128,1,true>",))``).

        ``expect`` (``"x: ptr, n: i32"``) states the signature the caller relies on; it must match the source.
        """
        if self.closed:
            raise ClosedError(f"module {self.program.name} was closed")
        k = self._kernels.get(name)
        if k is None:
            sig = self._launchable.get(name) or resolve(self.signatures, self.program.lowered, name)  # raises
            k = self._kernels[name] = Kernel(self, name, self.program.lowered.get(name, name), sig)
        if expect is not None:
            want = Signature.parse(expect).params
            if want != k.signature.params:
                raise TypeError(f"kernel {name}: stated signature ({expect}) does not match the source "
                                f"{k.signature}")
        return k

    def symbol(self, name: str, dtype=np.uint8) -> DeviceView:
        """The module's ``__device__`` variable ``name`` as a view of its memory (``cuModuleGetGlobal``), e.g.
        ``mod.symbol("rg_trace", np.uint64).copy_from(np.array([buf.ptr], np.uint64))``. Its length is the
        variable's size in ``dtype`` elements; the view keeps the module loaded."""
        if self.closed:
            raise ClosedError(f"module {self.program.name} was closed")
        dtype = np.dtype(dtype)
        ptr, size = check(driver.cuModuleGetGlobal(self.handle, name.encode()),
                          f"cuModuleGetGlobal({self.program.name}, {name!r}): is it a __device__ variable of the "
                          "source, compiled in?")
        if size % dtype.itemsize:
            raise ValueError(f"{name} is {size} bytes, not a whole number of {dtype} elements")
        return DeviceView(int(ptr), size // dtype.itemsize, dtype, owner=self)

    def close(self) -> None:
        """Unload the module (idempotent); its kernels then refuse to launch."""
        self._finalizer()
