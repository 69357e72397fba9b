"""``python -m rawgraphs {info, compile, demo, bench, break}``."""

from __future__ import annotations

import argparse
import platform
import sys
from importlib import metadata

from .bench.report import format_table
from .compiler import compile_file, kernel_files, nvrtc_version, ptxas_report
from .context import device, driver_version, gpu_available
from .errors import NoDriverError
from .kernel import Module
from .model.decode import KERNEL_FILES
from .signature import launchable, parse_signatures

NO_GPU = "No NVIDIA GPU or driver found on this machine: running only what needs no GPU."


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def cmd_info(args) -> int:
    """Versions, and the device (or a plain sentence that there is none)."""
    rows = [("python", platform.python_version()), ("rawgraphs", _version("rawgraphs")),
            ("cuda-bindings", _version("cuda-bindings")), ("cuda-core", _version("cuda-core")),
            ("nvrtc", "%d.%d" % nvrtc_version()), ("numpy", _version("numpy")),
            ("cupy", _version("cupy-cuda13x"))]
    try:
        rows.append(("driver (CUDA)", "%d.%d" % driver_version()))
    except NoDriverError:
        rows.append(("driver", "none: no NVIDIA driver was found"))
    if gpu_available():
        d = device()
        rows += [("device", f"{d.ordinal}: {d.name}"), ("arch", d.arch),
                 ("memory", f"{d.total_memory / 2**30:.1f} GiB")]
    else:
        rows.append(("device", "none: " + NO_GPU))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def cmd_compile(args) -> int:
    """Compile every kernel in kernels/ and print a table with registers, local (spill) bytes and static shared
    memory: the driver's attributes where a GPU of the arch is, else ptxas' report."""
    gpu = gpu_available()
    arch = args.arch or (device().arch if gpu else "sm_90")
    with_attrs = gpu and arch == device().arch
    # Registers and spills depend on the NVRTC version (13.0 and 13.5 differ), so the table says which one it is.
    source = "the driver reports" if with_attrs else "ptxas reports"
    print(("" if gpu else NO_GPU + " ") + f"Compiling for {arch} with NVRTC {'.'.join(map(str, nvrtc_version()))}; "
          f"registers and memory as {source} them.")
    columns = ["file", "kernel", "arch", "cubin bytes", "compile ms", "cached", "regs", "spill bytes", "static smem"]
    rows = []
    for path in kernel_files():
        names = KERNEL_FILES.get(path.stem, ())  # the model's template instantiations
        prog = compile_file(path, arch=arch, options=() if with_attrs else ("--ptxas-options=-v",),
                            name_expressions=names, use_cache=not args.no_cache)
        sigs = parse_signatures(path.read_text())
        module = Module(prog, sigs) if with_attrs else None
        report = {} if with_attrs else ptxas_report(prog)
        for name in sorted(launchable(sigs, names)):
            row = {"file": path.name, "kernel": name, "arch": arch, "cubin bytes": len(prog.cubin),
                   "compile ms": prog.compile_ms, "cached": prog.cache_hit}
            if module is not None:
                a = module.kernel(name).attributes()
                row.update({"regs": a["registers"], "spill bytes": a["local_bytes"],
                            "static smem": a["shared_bytes"]})
            else:
                r = report.get(name, {})
                row.update({"regs": r.get("regs"), "spill bytes": r.get("local bytes"),
                            "static smem": r.get("static smem")})
            rows.append(row)
    print(format_table(rows, columns))
    return 0


def cmd_demo(args) -> int:
    """Decode eagerly, by capture and by explicit graph; compare; print costs (or the plan, with no GPU)."""
    from .demo import run
    return run(args)


def cmd_bench(args) -> int:
    """Run benchmark scripts and write JSON, PNG and summary.md to --out."""
    from pathlib import Path

    from .bench.suite import run_suite
    return 1 if run_suite(args.names, Path(args.out), args.quick) else 0


def cmd_break(args) -> int:
    """The seed's exercise E: every forbidden thing inside a capture, and what it did."""
    from .breakit import main as breakit_main
    return breakit_main(["--json", args.json] if args.json else [])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rawgraphs", description="Raw, inspectable CUDA graphs for LLM decode.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, driver and device").set_defaults(fn=cmd_info)
    c = sub.add_parser("compile", help="compile every kernel in kernels/ and print a table")
    c.add_argument("--arch", help="target, e.g. sm_90 (default: the device's, or sm_90 without a GPU)")
    c.add_argument("--no-cache", action="store_true", help="ignore the on-disk cubin cache")
    c.set_defaults(fn=cmd_compile)
    d = sub.add_parser("demo", help="the main job: decode eager vs captured vs explicit graph, with costs")
    from .demo import add_arguments
    add_arguments(d)
    d.set_defaults(fn=cmd_demo)
    from .bench.suite import BENCHMARKS
    b = sub.add_parser("bench", help="run benchmarks: tables, JSON, PNG plots and summary.md")
    b.add_argument("names", nargs="+", choices=["all", *BENCHMARKS], help="which benchmarks ('all': every one)")
    b.add_argument("--out", default="out", help="folder for results (default ./out)")
    b.add_argument("--quick", action="store_true", help="smaller runs, for a fast check")
    b.set_defaults(fn=cmd_bench)
    k = sub.add_parser("break", help="exercise E: try each forbidden call inside a capture, print what happened")
    k.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    k.set_defaults(fn=cmd_break)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
