"""Kernel signatures read from CUDA source: the ``extern "C" __global__`` (and ``template <...> __global__``)
declarations give each kernel's parameter names and types, so the Python side never restates them by hand.

``parse_signatures(source)`` keys them by name; ``launchable`` / ``resolve`` say what a module compiled with some
name expressions can launch (plain kernels, and template instantiations such as ``"attention<128,1,true>"``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["FORMATS", "RANGES", "Param", "Signature", "launchable", "parse_signatures", "resolve"]

# C parameter type -> (our type name, struct format). Pointers of any pointee are "ptr".
_C_TYPES = {
    "int": "i32", "int32_t": "i32", "unsigned": "u32", "unsigned int": "u32", "uint32_t": "u32",
    "long long": "i64", "long long int": "i64", "int64_t": "i64",
    "unsigned long long": "u64", "unsigned long long int": "u64", "uint64_t": "u64", "size_t": "u64",
    "cudaGraphConditionalHandle": "u64", "cudaGraphDeviceNode_t": "u64", "float": "f32", "double": "f64",
}
FORMATS = {"ptr": "Q", "i32": "i", "u32": "I", "i64": "q", "u64": "Q", "f32": "f", "f64": "d"}
RANGES = {"i32": (-2**31, 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-2**63, 2**63 - 1),
           "u64": (0, 2**64 - 1), "ptr": (0, 2**64 - 1)}


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its name and type (``ptr``, ``i32``, ``u32``, ``i64``, ``u64``, ``f32``, ``f64``)."""

    name: str
    type: str

    def __post_init__(self):
        if self.type not in FORMATS:
            raise ValueError(f"parameter {self.name!r}: unknown type {self.type!r} (one of {sorted(FORMATS)})")


@dataclass(frozen=True)
class Signature:
    """A kernel's name and ordered parameters; ``template`` for a ``template <...> __global__`` kernel, which is
    launched by the name expression of an instantiation compiled in (``"attention<128,1,true>"``)."""

    name: str
    params: tuple[Param, ...]
    template: bool = False
    error: str | None = None  # why rawgraphs cannot launch it (a parameter type it cannot pass), if it cannot

    @classmethod
    def parse(cls, text: str) -> Signature:
        """``"rmsnorm(x: ptr, n: i32, eps: f32)"`` or ``"x: ptr, n: i32"`` (then the name is empty)."""
        m = re.fullmatch(r"\s*(?:(\w*)\s*\((.*)\)|(.*?))\s*", text, re.S)
        name, body = (m.group(1), m.group(2)) if m.group(2) is not None else ("", m.group(3))
        params = []
        for p in body.split(",") if body.strip() else ():
            parts = [s.strip() for s in p.split(":")]
            if len(parts) != 2 or not re.fullmatch(r"\w+", parts[0]):
                raise ValueError(f"signature {text!r}: parameter {p.strip()!r} is not 'name: type'")
            params.append(Param(*parts))
        return cls(name, tuple(params))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def __str__(self) -> str:
        return f"{self.name}({', '.join(f'{p.name}: {p.type}' for p in self.params)})"


def _c_param(decl: str, kernel: str) -> Param:
    decl = decl.split("=")[0]  # a default value: the host passes every argument anyway
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
        try:
            sigs[name] = Signature(name, tuple(_c_param(d, name) for d in decls), bool(m.group(1)))
        except ValueError as e:  # refused when asked for, not for the whole source: other kernels stay usable
            sigs[name] = Signature(name, (), bool(m.group(1)), error=str(e))
    return sigs


def resolve(signatures: dict[str, Signature], compiled, name: str) -> Signature:
    """The signature of kernel ``name`` in a module of ``signatures`` compiled with the name expressions
    ``compiled``: a plain kernel by its name, a template instantiation by a name expression compiled in
    (``"attention<128,1,true>"``, the template's parameters). Raises KeyError naming what is wrong and what exists."""
    base = name.split("<")[0].strip()
    sig = signatures.get(base)
    if sig is None:
        raise KeyError(f"no kernel {name!r}; the source has {sorted(signatures)}")
    if sig.error:
        raise ValueError(sig.error)
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
    out = {n: s for n, s in signatures.items() if not s.template and not s.error}
    out.update({e: resolve(signatures, name_expressions, e) for e in name_expressions})
    return out
