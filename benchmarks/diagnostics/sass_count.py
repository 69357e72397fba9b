"""SASS instruction counts of the kernels as NVRTC compiles them (cubin -> nvdisasm), per kernel and per opcode.

At B = 1 gemv's row stream spends ~70 instructions on each 512-byte warp-chunk. Session 13 took 1b B=1 from 701
to 646 us by removing a signed remainder (the ring slot) and a PRMT per bf16 pair; session 14 cut the count by
another 17% (141 -> 117 per 2 chunks) for no gain, and Nsight Compute put the isolated projections at 37-60% of
the SM's issue peak (benchmarks/NOTES.md): a count says what an edit changed, not what it will gain. Count before
and after a kernel edit; no GPU is needed.

Run from the repository root: ``python3 benchmarks/diagnostics/sass_count.py [file ...] [--arch sm_90] [--kernel
NAME] [--opcodes N] [--kernels-dir DIR] [--same-as DIR] [--loops NAME]`` (default: every kernels/*.cu; ``--kernel``
prints that kernel's disassembly instead; ``--loops`` each of its loops' length and opcodes, e.g. the B = 2 unit
stream's 93-instruction chunk loop, the same in gemv_rows and gemv_rows2 (session 44); ``--same-as`` says, per
kernel, whether its SASS equals that of the same kernel in another tree's kernels/, e.g. ``git archive HEAD kernels
| tar x -C /tmp/head`` and ``--same-as /tmp/head/kernels``: how sessions 16-17 showed an edit left a kernel's code
as it was; it also says how far each kernel's code moved in its module, which moves the step by itself: session 43's
unused kernel, shifting every kernel of gemv.cu by 4480 bytes with the same SASS, took small B = 1 from 199.6 to
201.9 us on the H100, so an A/B of trees whose kernels moved needs a control tree that moves them alike). The
model's template instantiations (``attention<128,1,true>``) are compiled in and named by their expression. nvdisasm
comes with the CUDA toolkit, or ``pip install nvidia-cuda-nvdisasm``.

Counts and placement are those of the NVRTC this runs with: the device compiles with 13.0 (``pip install
nvidia-cuda-nvrtc==13.0.88`` gives its cubins byte for byte), and pip's 13.5 gives other code (gemv 8008 instructions
against 7024; session 44 sized its pad controls with 13.5, so they did not move the device's kernels as the probes
did). Run with another version, it says so on stderr before anything else.
"""

import argparse
import collections
import io
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from rawgraphs.compiler import compile_file, kernel_dir, nvrtc_version
from rawgraphs.errors import CompileError
from rawgraphs.model.decode import KERNEL_FILES

DEVICE_NVRTC = (13, 0)  # the device machine's NVRTC (README, "Registers and SASS depend on the NVRTC version")


def version_warning(version: tuple[int, int]) -> str | None:
    """What to say when ``version`` is not the device's NVRTC (None when it is)."""
    if tuple(version) == DEVICE_NVRTC:
        return None
    have, want = ".".join(map(str, version)), ".".join(map(str, DEVICE_NVRTC))
    return (f"sass_count: NVRTC {have} here, the device compiles with {want}: counts and placement differ from the "
            f"device's (pip install nvidia-cuda-nvrtc=={want}.88 for its cubins)")


def nvdisasm() -> str:
    """The nvdisasm executable: on PATH, else the one the nvidia-cuda-nvdisasm wheel installs."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    for exe in sorted(Path(sysconfig.get_paths()["purelib"]).glob("nvidia/cu*/bin/nvdisasm")):
        return str(exe)
    sys.exit("nvdisasm not found: install the CUDA toolkit or `pip install nvidia-cuda-nvdisasm`")


def disassemble(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([nvdisasm(), "-c", f.name], capture_output=True, text=True, check=True).stdout


def listing(sass: str) -> tuple[dict[str, list[str]], dict[str, dict[str, int]]]:
    """Each kernel's instructions ("@!P0 LDGSTS.E.BYPASS.128 [R5], ..."), in order, and its branch labels
    (".L_x_12") with the index in that list of the instruction each marks."""
    kernels: dict[str, list[str]] = {}
    labels: dict[str, dict[str, int]] = {}
    code = marks = None
    for line in sass.splitlines():
        if m := re.match(r"^\.text\.(\w+):", line):
            code, marks = kernels.setdefault(m.group(1), []), labels.setdefault(m.group(1), {})
        elif code is not None and (m := re.match(r"^(\.L_x_\d+):", line)):
            marks[m.group(1)] = len(code)
        elif code is not None and (m := re.match(r"^\s+/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)):
            code.append(m.group(1))
    return kernels, labels


def by_kernel(sass: str) -> dict[str, list[str]]:
    """Each kernel's instructions, in order (``listing``)."""
    return listing(sass)[0]


def loops(instructions: list[str], labels: dict[str, int]) -> list[tuple[int, int]]:
    """Every backward branch as (first, last) instruction index of the loop it closes, innermost first within a
    nest (in branch order): what an inner loop costs per trip is its length."""
    out = []
    for i, ins in enumerate(instructions):
        if (m := re.search(r"\bBRA\b.*?(\.L_x_\d+)", ins)) and labels.get(m.group(1), i + 1) <= i:
            out.append((labels[m.group(1)], i))
    return out


def opcode(instruction: str) -> str:
    """The opcode without predicate and modifiers: "@!P0 LDGSTS.E.BYPASS.128 [R5]" -> "LDGSTS"."""
    return re.sub(r"^@!?U?P\w+\s+", "", instruction).split()[0].split(".")[0]


def normalized(instructions: list[str]) -> list[str]:
    """Branch labels (``.L_x_N``) and internal call targets (``__internal_N``) renumbered in order of first use: two
    compiles of the same code differ in those numbers alone when the module around it holds other functions."""
    ids: dict[str, int] = {}
    return [re.sub(r"\.L_x_\d+|__internal_\d+", lambda m: f"L{ids.setdefault(m.group(0), len(ids))}", i)
            for i in instructions]


def text_layout(cubin: bytes) -> dict[str, tuple[int, int]]:
    """Each function's code (its ``.text.SYMBOL`` section) as (offset in the cubin from its first code, size),
    bytes."""
    try:
        from elftools.elf.elffile import ELFFile
    except ImportError:
        sys.exit("pyelftools not found: `pip install pyelftools` (it reads the cubin's sections)")
    text = {s.name.removeprefix(".text."): (s["sh_offset"], s["sh_size"])
            for s in ELFFile(io.BytesIO(cubin)).iter_sections() if s.name.startswith(".text.")}
    start = min((offset for offset, _ in text.values()), default=0)
    return {name: (offset - start, size) for name, (offset, size) in text.items()}


def program(path: Path, arch: str):
    """NVRTC's program for ``path`` with the model's template instantiations, or without them in a tree whose file
    has no such template."""
    try:
        return compile_file(path, arch=arch, name_expressions=KERNEL_FILES.get(path.stem, ()), use_cache=False)
    except CompileError:
        return compile_file(path, arch=arch, use_cache=False)


def compiled(path: Path, arch: str) -> tuple[dict[str, list[str]], dict[str, tuple[int, int]]]:
    """Each kernel's instructions and code placement (``text_layout``), the model's template instantiations named
    by their expression (a tree whose file has no such template is compiled without them)."""
    prog = program(path, arch)
    expression = {symbol: expr for expr, symbol in prog.lowered.items()}
    cubin = bytes(prog.cubin)
    return ({expression.get(k, k): v for k, v in by_kernel(disassemble(cubin)).items()},
            {expression.get(k, k): v for k, v in text_layout(cubin).items()})


def verdict(a: list[str] | None, b: list[str] | None, here: tuple[int, int] | None,
            there: tuple[int, int] | None) -> str:
    """``same`` (``normalized``) or ``DIFF`` (both instruction counts), with how far the kernel's code moved in its
    module (here against there), or in which tree alone the kernel is."""
    if not (a and b):
        return "only here" if a else "only there"
    moved = f", moved {here[0] - there[0]:+d} B" if here and there and here[0] != there[0] else ""
    return ("same" if normalized(a) == normalized(b) else f"DIFF {len(a)} vs {len(b)}") + moved


def same_as(files: list[Path], other: Path, arch: str) -> None:
    """Per kernel: ``verdict``."""
    for path in files:
        theirs = other / path.name
        here, here_at = compiled(path, arch)
        there, there_at = compiled(theirs, arch) if theirs.exists() else ({}, {})
        for name in sorted(here.keys() | there.keys()):
            print(f"{path.stem:12s} {name:28s} "
                  f"{verdict(here.get(name), there.get(name), here_at.get(name), there_at.get(name))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", help="kernel files (default: every kernels/*.cu)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--kernels-dir", type=Path, default=None, help="another tree's kernels/ (A/B against this one)")
    ap.add_argument("--kernel", help="print this kernel's disassembly")
    ap.add_argument("--opcodes", type=int, default=6, help="most frequent opcodes to list per kernel")
    ap.add_argument("--same-as", type=Path, help="another tree's kernels/: is each kernel's SASS the same?")
    ap.add_argument("--loops", metavar="KERNEL", help="this kernel's loops (backward branches): length and opcodes")
    args = ap.parse_args()
    if warning := version_warning(nvrtc_version()):
        print(warning, file=sys.stderr)
    folder = args.kernels_dir or kernel_dir()
    files = [folder / (f if f.endswith(".cu") else f + ".cu") for f in args.files] or sorted(folder.glob("*.cu"))
    if args.same_as:
        same_as(files, args.same_as, args.arch)
        return
    if args.loops:
        for path in files:
            prog = program(path, args.arch)
            symbol = prog.lowered.get(args.loops, args.loops)
            kernels, labels = listing(disassemble(bytes(prog.cubin)))
            if symbol not in kernels:
                continue
            for first, last in loops(kernels[symbol], labels[symbol]):
                body = collections.Counter(map(opcode, kernels[symbol][first:last + 1]))
                print(f"{args.loops} [{first}, {last}] {last - first + 1:5d}  "
                      + " ".join(f"{o} {n}" for o, n in body.most_common(args.opcodes)))
            return
        sys.exit(f"no kernel {args.loops!r} in {', '.join(p.name for p in files)}")
    for path in files:
        for name, instructions in compiled(path, args.arch)[0].items():
            if args.kernel:
                if name == args.kernel:
                    print("\n".join(instructions))
                continue
            top = collections.Counter(map(opcode, instructions)).most_common(args.opcodes)
            print(f"{path.stem:12s} {name:24s} {len(instructions):6d}  " + " ".join(f"{o} {n}" for o, n in top))


if __name__ == "__main__":
    main()
