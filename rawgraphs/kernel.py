"""Modules, kernels that know their signature, launch shapes, and eager launch.

A kernel's signature is read from its ``extern "C" __global__`` or ``template <...> __global__`` declaration in
the source (:mod:`rawgraphs.signature`), so the Python side never restates it by hand (``expect=`` checks a stated
one against the source). Its arguments are one packed block (:class:`rawgraphs.kernel_args.KernelArgs`) that the
launch and graph kernel nodes read directly.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cuda.bindings import driver

from .capture_state import release
from .capture_state import state as capture_state
from .compiler import Program, compile_file, compile_source
from .context import Stream, device
from .cubin import check_signature, param_sizes
from .errors import ClosedError, check
from .kernel_args import KernelArgs
from .memory import DeviceView
from .signature import Signature, launchable, parse_signatures, resolve

__all__ = ["LaunchShape", "Kernel", "Module", "cluster_value"]


@dataclass(frozen=True)
class LaunchShape:
    """Grid, block and dynamic shared memory of one launch; validated at construction.

    ``pdl=True`` launches with programmatic stream serialization (sm_90+): the kernel may start while the
    previous kernel on the stream finishes, and must ``griddepcontrol.wait`` before reading its results
    (kernels/pdl.cuh). Captured, it becomes a programmatic graph edge.

    ``cluster`` (sm_90+) groups blocks into thread block clusters of that shape (each dimension divides the
    grid's; at most 16 blocks): a cluster's blocks run at once on one GPC and may read each other's shared memory.
    A graph node keeps it as a node attribute. Above 8 blocks (the portable limit) the kernel is opted in to
    non-portable cluster sizes before its first launch or node (H100 and H200 take 16).
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
        if any(gd % cd for gd, cd in zip(g, c)) or c[0] * c[1] * c[2] > _MAX_CLUSTER:
            raise ValueError(f"cluster {c} must divide grid {g} in every dimension and hold at most "
                             f"{_MAX_CLUSTER} blocks")
        object.__setattr__(self, "grid", g)
        object.__setattr__(self, "block", b)
        object.__setattr__(self, "shared", int(shared))
        object.__setattr__(self, "pdl", bool(pdl))
        object.__setattr__(self, "cluster", c)
        # Not a field: read by every eager launch (Kernel.launch), where a property call would cost a Python frame.
        object.__setattr__(self, "launch_ex", self.pdl or self.clustered)
        object.__setattr__(self, "nonportable", c[0] * c[1] * c[2] > _PORTABLE_CLUSTER)

    @property
    def clustered(self) -> bool:
        return self.cluster != (1, 1, 1)


_PORTABLE_CLUSTER, _MAX_CLUSTER = 8, 16  # blocks per cluster: portable, and with the non-portable opt-in (sm_90)


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
        self._nonportable = False  # opted in to clusters of more than 8 blocks

    def args(self, /, *args, **kwargs) -> KernelArgs:
        """A new packed argument block; all arguments required, by position or name."""
        return KernelArgs(self.signature, *args, **kwargs)

    def prepare(self, shape: LaunchShape) -> None:
        """Opt the function in to ``shape.shared`` bytes of dynamic shared memory if above what it may use now
        (48 KiB with its static shared memory, until opted in further), and to ``shape.cluster`` if non-portable."""
        if shape.nonportable and not self._nonportable:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
            check(driver.cuFuncSetAttribute(self.function, attr, 1),
                  f"cuFuncSetAttribute({self.name}, NON_PORTABLE_CLUSTER_SIZE_ALLOWED)")
            self._nonportable = True
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
        if shape.shared > self._max_shared or (shape.nonportable and not self._nonportable):  # once per kernel
            self.prepare(shape)
        g, b = shape.grid, shape.block
        if shape.launch_ex:
            err, = driver.cuLaunchKernelEx(self._config(shape, stream), self.function, args.address, 0)
        else:
            err, = driver.cuLaunchKernel(self.function, g[0], g[1], g[2], b[0], b[1], b[2], shape.shared,
                                         stream.handle, args.address, 0)
        if err:
            call = "cuLaunchKernelEx" if shape.launch_ex else "cuLaunchKernel"
            check((err,), f"{call}({self.name}, grid={g}, block={b}, shared={shape.shared}, pdl={shape.pdl}, "
                          f"cluster={shape.cluster})")
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

    @functools.cached_property
    def _param_sizes(self) -> dict[str, tuple[int, ...]]:
        return param_sizes(self.program.cubin)

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
            symbol = self.program.lowered.get(name, name)
            check_signature(self._param_sizes, symbol, sig)  # the source's signature against the cubin's
            k = self._kernels[name] = Kernel(self, name, symbol, sig)
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
