"""What a cubin says about its kernels' parameters, from the ELF's ``.nv.info.<kernel>`` sections.

The driver copies each launch argument by the size the compiled kernel declares for it, from the pointer rawgraphs
passes in ``kernelParams``. A signature read from the source (:mod:`rawgraphs.signature`) that disagrees, say a
kernel whose parameters a ``#if`` or a ``-D`` option changed, would make the driver read past a field or
misread it, with no error. :func:`check_signature` compares the two before a kernel is used.

Records of ``.nv.info.<kernel>``: ``u8 format, u8 attribute, u16 value``, then for format 4 (``EIFMT_SVAL``) a
payload of ``value`` bytes. Attribute 0x17 (``EIATTR_KPARAM_INFO``) has a 12-byte payload: ``u32 index,
u16 ordinal, u16 offset, u32 flags`` with the parameter's size in bytes in bits 18..31 of ``flags``.
"""

from __future__ import annotations

import struct

from .signature import FORMATS, Signature

__all__ = ["param_sizes", "check_signature"]

_SVAL, _KPARAM_INFO = 4, 0x17


def _sections(cubin: bytes) -> dict[str, bytes]:
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    out = {}
    for name_off, _, _, _, offset, size, *_ in headers:
        start = names_at + name_off
        out[cubin[start:cubin.index(b"\0", start)].decode()] = cubin[offset:offset + size]
    return out


def param_sizes(cubin: bytes) -> dict[str, tuple[int, ...]]:
    """``{symbol: (size of parameter 0, 1, ...)}`` for every kernel of ``cubin`` (a kernel without parameters
    maps to ``()``)."""
    out = {}
    for name, data in _sections(cubin).items():
        if not name.startswith(".nv.info."):
            continue
        sizes, i = {}, 0
        while i + 4 <= len(data):
            fmt, attr, value = struct.unpack_from("<BBH", data, i)
            i += 4
            if fmt == _SVAL:
                if attr == _KPARAM_INFO:
                    _, ordinal, _, flags = struct.unpack_from("<IHHI", data, i)
                    sizes[ordinal] = (flags >> 18) & 0x3FFF
                i += value
        out[name.removeprefix(".nv.info.")] = tuple(sizes[k] for k in sorted(sizes))
    return out


def check_signature(sizes: dict[str, tuple[int, ...]], symbol: str, sig: Signature) -> None:
    """TypeError when the compiled kernel ``symbol`` takes other parameters than ``sig`` says. A cubin without
    ``.nv.info`` for ``symbol`` is not checked."""
    got = sizes.get(symbol)
    want = tuple(struct.calcsize(FORMATS[p.type]) for p in sig.params)
    if got is not None and got != want:
        raise TypeError(f"kernel {sig.name}: the source's signature {sig} has parameters of {list(want)} bytes, "
                        f"but the compiled kernel takes {list(got)}: a #if or a -D option changed its declaration, "
                        f"which rawgraphs reads without the preprocessor; declare the kernel once, the same way "
                        f"for every option")
