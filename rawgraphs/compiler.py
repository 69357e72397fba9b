"""NVRTC -> cubin, with the CUDA wheels' headers and an on-disk cache.

The cache key is the source, the contents of the local headers it may include, the options, the requested
name expressions and the NVRTC version, so a changed header or a new NVRTC never serves a stale cubin.
Compiling needs no GPU: pass ``arch="sm_90"`` (the default when no device is present).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from cuda.bindings import nvrtc

from .errors import CompileError, check

__all__ = ["Program", "compile_source", "compile_file", "ptxas_report", "resource_usage", "kernel_dir", "kernel_files",
           "default_arch", "nvrtc_version", "cache_dir", "DEFAULT_OPTIONS"]

DEFAULT_OPTIONS = ("-std=c++17", "-default-device", "-lineinfo", "-DNDEBUG")


@dataclass(frozen=True)
class Program:
    """A compiled cubin and what it took to make it."""

    name: str
    arch: str
    cubin: bytes = field(repr=False)
    options: tuple[str, ...]
    lowered: dict[str, str]  # name expression -> mangled symbol (templated kernels)
    compile_ms: float
    cache_hit: bool
    log: str = ""


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """The NVRTC library's ``(major, minor)``."""
    return tuple(check(nvrtc.nvrtcVersion(), "nvrtcVersion"))


def kernel_dir() -> Path:
    """Where the shipped ``*.cu`` kernels are: ``kernels/`` of a source checkout, or inside the wheel."""
    here = Path(__file__).resolve().parent
    for cand in (here / "_kernels", here.parent / "kernels"):
        if cand.is_dir() and any(cand.glob("*.cu")):
            return cand
    raise FileNotFoundError(f"no kernels found next to {here} (looked in _kernels/ and ../kernels/)")


def kernel_files() -> list[Path]:
    """Every shipped kernel source, sorted by name."""
    return sorted(kernel_dir().glob("*.cu"))


@functools.cache
def _include_dirs() -> tuple[str, ...]:
    """The cudart headers (cuda_bf16.h, cuda_fp16.h, ...) from the nvidia-cuda-runtime wheel."""
    from cuda.pathfinder import find_nvidia_header_directory
    found = find_nvidia_header_directory("cudart")
    return (found,) if found else ()


def default_arch() -> str:
    """The current device's arch, or ``sm_90`` (what we tune for) when there is no GPU."""
    from .context import device, gpu_available
    return device().arch if gpu_available() else "sm_90"


def cache_dir() -> Path:
    """``$RAWGRAPHS_CACHE`` or ``~/.cache/rawgraphs``."""
    return Path(os.environ.get("RAWGRAPHS_CACHE", Path.home() / ".cache" / "rawgraphs"))


def _key(source: str, headers: dict[str, str], options: tuple[str, ...], names: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (source, json.dumps(sorted(headers.items())), "\0".join(options), "\0".join(names),
                 "nvrtc %d.%d" % nvrtc_version()):
        h.update(part.encode())
        h.update(b"\x01")
    return h.hexdigest()[:32]


def _nvrtc_compile(source: str, name: str, headers: dict[str, str], options: tuple[str, ...],
                   names: tuple[str, ...]) -> tuple[bytes, dict[str, str], str]:
    hnames = list(headers)
    prog = check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), len(hnames),
                                          [headers[n].encode() for n in hnames], [n.encode() for n in hnames]),
                 "nvrtcCreateProgram")
    try:
        for expr in names:
            check(nvrtc.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression")
        err, = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        # NVRTC writes into the buffers it is given: they must be mutable and our own. `b" " * size` (the usual
        # cuda-python idiom) is, for an empty log (size 1, the NUL), CPython's shared one-byte object b" ", and the
        # NUL written into it made every later b" " in the process b"\x00" (NumPy's .npy header padding among them).
        size = check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = bytearray(size)
        check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = bytes(buf).rstrip(b"\0 ").decode(errors="replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(name, log, options)
        buf = bytearray(check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize"))
        check(nvrtc.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        cubin = bytes(buf)
        lowered = {e: check(nvrtc.nvrtcGetLoweredName(prog, e.encode()), "nvrtcGetLoweredName").decode()
                   for e in names}
    finally:
        destroyed = nvrtc.nvrtcDestroyProgram(prog)
    check(destroyed, "nvrtcDestroyProgram")  # reached only without an error above, which would matter more
    return cubin, lowered, log


def compile_source(source: str, name: str = "kernel.cu", arch: str | None = None,
                   options: tuple[str, ...] = (), name_expressions: tuple[str, ...] = (),
                   headers: dict[str, str] | None = None, use_cache: bool = True) -> Program:
    """Compile CUDA C++ ``source`` to a cubin for ``arch`` (``sm_XX``; default: the device's).

    ``headers`` maps include names to their text (local ``#include "x.cuh"``); ``name_expressions`` are
    templated kernel names (e.g. ``"gemv<4>"``) whose mangled symbols come back in ``Program.lowered``.
    Raises :class:`CompileError` with the NVRTC log, file name and line on failure.
    """
    arch = arch or default_arch()
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"arch must look like 'sm_90' (or 'sm_90a', 'sm_100f'), got {arch!r}")
    options, name_expressions = _strings(options), _strings(name_expressions)
    headers = dict(headers or {})
    opts = (f"--gpu-architecture={arch}", *DEFAULT_OPTIONS, *options,
            *(f"--include-path={d}" for d in _include_dirs()))
    names = tuple(name_expressions)
    t0 = time.perf_counter()
    key = _key(source, headers, opts, names)
    path = cache_dir() / f"{Path(name).stem}-{arch}-{key}"
    if use_cache and path.with_suffix(".cubin").is_file():
        try:
            cubin = path.with_suffix(".cubin").read_bytes()
            lowered = json.loads(path.with_suffix(".json").read_text())
            log = path.with_suffix(".log").read_text()
            return Program(name, arch, cubin, opts, lowered, (time.perf_counter() - t0) * 1e3, True, log)
        except (OSError, ValueError):
            pass  # a torn cache entry (or one from before logs were kept): compile again and overwrite it
    cubin, lowered, log = _nvrtc_compile(source, name, headers, opts, names)
    ms = (time.perf_counter() - t0) * 1e3
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(lowered))
            os.replace(tmp, path.with_suffix(".json"))
            tmp.write_text(log)
            os.replace(tmp, path.with_suffix(".log"))
            tmp.write_bytes(cubin)
            os.replace(tmp, path.with_suffix(".cubin"))  # the cubin last: its presence marks a whole entry
        except OSError:
            pass  # a read-only home is no reason to fail a compile
    return Program(name, arch, cubin, opts, lowered, ms, False, log)


def _strings(value) -> tuple[str, ...]:
    """One option (or name expression) given as a plain string is one, not a sequence of one-letter ones."""
    return (value,) if isinstance(value, str) else tuple(value)


def compile_file(path: str | os.PathLike, arch: str | None = None, options: tuple[str, ...] = (),
                 name_expressions: tuple[str, ...] = (), use_cache: bool = True) -> Program:
    """Compile a ``.cu`` file; the ``*.cuh`` headers beside it are available to ``#include "..."``."""
    path = Path(path)
    if not path.suffix and not path.exists():
        path = kernel_dir() / f"{path}.cu"  # a bare kernel-file name, e.g. "rmsnorm"
    headers = {h.name: h.read_text() for h in sorted(path.parent.glob("*.cuh"))}
    return compile_source(path.read_text(), path.name, arch, options, name_expressions, headers, use_cache)


def ptxas_report(program: Program) -> dict[str, dict[str, int]]:
    """``{kernel: {"regs", "local bytes", "static smem"}}`` from the ptxas report in ``program.log`` (compile with
    ``options=("--ptxas-options=-v",)``; otherwise empty): registers per thread, the stack frame (local memory: spills
    and local arrays) and static shared bytes, keyed by kernel name or, for a template's instantiation, by its name
    expression."""
    expression = {symbol: expr for expr, symbol in program.lowered.items()}
    report, name = {}, None
    for line in program.log.splitlines():
        if m := re.search(r"Function properties for (\w+)", line):
            name = expression.get(m.group(1), m.group(1))
        elif name and (m := re.search(r"(\d+) bytes stack frame", line)):
            report.setdefault(name, {})["local bytes"] = int(m.group(1))
        elif name and (m := re.search(r"Used (\d+) registers.*?(?:(\d+) bytes smem|$)", line)):
            report.setdefault(name, {}).update({"regs": int(m.group(1)), "static smem": int(m.group(2) or 0)})
    return {k: v for k, v in report.items() if "regs" in v}


def resource_usage(path: str | os.PathLike, arch: str = "sm_90", options: tuple[str, ...] = (),
                   name_expressions: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """``{kernel: (registers per thread, static shared bytes)}`` of a ``.cu`` file as ptxas allocates them
    (``--ptxas-options=-v``, its log cached with the cubin; no GPU needed), keyed by kernel name, or for a
    template's instantiation by its name expression. What occupancy a kernel can have beside another follows
    from these."""
    prog = compile_file(path, arch, (*_strings(options), "--ptxas-options=-v"), name_expressions)
    return {k: (v["regs"], v["static smem"]) for k, v in ptxas_report(prog).items()}
