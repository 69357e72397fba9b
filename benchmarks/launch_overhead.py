"""launch_overhead: host cost of one eager kernel launch, rawgraphs against the raw binding and CuPy.

Question (issue target): is rawgraphs' per-launch host overhead at most 1.15x that of a raw cuda.bindings
``cuLaunchKernel`` with a pre-packed argument block?

For ``noop`` (no arguments) and ``axpb`` (5 arguments) from ``kernels/basic.cu``, four ways to launch:
  (a) raw packed  cuLaunchKernel with a ``void**`` we packed with ctypes, passed as its int address
  (b) raw tuple   cuLaunchKernel with the ``(values, ctypes types)`` form (cuda.bindings packs per call)
  (c) rawgraphs   ``Kernel.launch(shape, args, stream)`` with a packed ``KernelArgs``
  (d) cupy        a ``cupy.RawModule`` kernel call (same cubin; skipped with a note when CuPy is missing)

Each sample times ``--iters`` back-to-back launches on one stream with ``perf_counter_ns`` (the launch loop
only; the stream is synchronized after, untimed) and divides by ``--iters``. Samples are taken in rounds
that run every method once, so slow clock drift touches all methods alike. Before timing, each method's
``axpb`` launch is checked against NumPy on a poisoned output, so no broken launch gets measured.

Run: ``python benchmarks/launch_overhead.py [--out DIR] [--iters 2000] [--repeats 20]``; prints a table,
writes ``DIR/launch_overhead.json`` (and ``.png``).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cuda.bindings import driver

from rawgraphs.bench import (
    BenchResult,
    collect_metadata,
    format_table,
    make_row,
    plot_bars,
    progress,
    time_host,
)
from rawgraphs.context import Stream, device
from rawgraphs.errors import check
from rawgraphs.kernel import Kernel, LaunchShape, Module
from rawgraphs.memory import DeviceBuffer

N = 4096  # axpb elements: a tiny kernel, so the GPU keeps up with the host and only launch cost is measured
A, B = 1.5, -0.25
TARGET = 1.15  # rawgraphs / raw packed, per launch

_CTYPES = {"ptr": ctypes.c_void_p, "i32": ctypes.c_int, "f32": ctypes.c_float}
_NUMPY = {"i32": np.int32, "f32": np.float32}

Launch = Callable[[], None]


@dataclass
class Case:
    """One kernel to launch: the rawgraphs kernel, its launch shape and its arguments by name."""

    kernel: Kernel
    shape: LaunchShape
    named: dict  # argument name -> DeviceBuffer or Python scalar

    def raw_values(self) -> list:
        """Argument values in signature order, pointers as ints."""
        return [int(self.named[p.name]) if p.type == "ptr" else self.named[p.name]
                for p in self.kernel.signature.params]

    def ctypes_types(self) -> list:
        """The ctypes type of each argument, in signature order."""
        return [_CTYPES[p.type] for p in self.kernel.signature.params]


def raw_packed(case: Case, stream: Stream) -> Launch:
    """(a) cuLaunchKernel with a ctypes ``void*[]`` built once; the driver gets its address (an int)."""
    slots = [t(v) for t, v in zip(case.ctypes_types(), case.raw_values())]  # one ctypes value per argument
    params = (ctypes.c_void_p * max(len(slots), 1))(*(ctypes.addressof(s) for s in slots))
    address = ctypes.addressof(params) if slots else 0  # NULL for a kernel with no parameters
    f, (gx, gy, gz), (bx, by, bz), h = case.kernel.function, case.shape.grid, case.shape.block, stream.handle
    launch = driver.cuLaunchKernel

    def run() -> None:
        err, = launch(f, gx, gy, gz, bx, by, bz, 0, h, address, 0)
        if err:
            check((err,), "cuLaunchKernel")

    run.keep_alive = (slots, params)  # the driver reads them at every launch
    return run


def raw_tuple(case: Case, stream: Stream) -> Launch:
    """(b) cuLaunchKernel with ``(values, types)``: cuda.bindings packs the arguments at every call."""
    params = (tuple(case.raw_values()), tuple(case.ctypes_types()))
    f, (gx, gy, gz), (bx, by, bz), h = case.kernel.function, case.shape.grid, case.shape.block, stream.handle
    launch = driver.cuLaunchKernel

    def run() -> None:
        err, = launch(f, gx, gy, gz, bx, by, bz, 0, h, params, 0)
        if err:
            check((err,), "cuLaunchKernel")

    return run


def rawgraphs_launch(case: Case, stream: Stream) -> Launch:
    """(c) rawgraphs: ``Kernel.launch`` of an argument block packed once by name."""
    kernel, shape, args = case.kernel, case.shape, case.kernel.args(**case.named)

    def run() -> None:
        kernel.launch(shape, args, stream)

    return run


def cupy_launch(case: Case, stream: Stream, cubin: Path) -> Launch:
    """(d) CuPy: the same cubin loaded by ``cupy.RawModule``, launched on our stream with CuPy arrays."""
    import cupy as cp

    kernel = cp.RawModule(path=str(cubin)).get_function(case.kernel.name)
    args = []
    for p in case.kernel.signature.params:
        v = case.named[p.name]
        if p.type == "ptr":  # a zero-copy CuPy view of our buffer, as a CuPy user would pass it
            mem = cp.cuda.UnownedMemory(int(v), v.nbytes, v, device_id=device().ordinal)
            args.append(cp.ndarray(v.shape, v.dtype, cp.cuda.MemoryPointer(mem, 0)))
        else:
            args.append(_NUMPY[p.type](v))
    args = tuple(args)
    cp_stream = cp.cuda.Stream.from_external(stream)  # the CUDA stream protocol (Stream.__cuda_stream__)
    cp_stream.use()  # CuPy launches on its current stream; set once, outside the timed loop
    grid, block = case.shape.grid, case.shape.block

    def run() -> None:
        kernel(grid, block, args)

    run.keep_alive = cp_stream
    return run


def check_axpb(run: Launch, out: DeviceBuffer, x_host: np.ndarray, stream: Stream, method: str) -> None:
    """Launch once into a poisoned output and compare with NumPy (fp32: rtol 1e-6, atol 1e-6)."""
    out.fill_bytes(0xFF)  # NaN everywhere
    run()
    stream.synchronize()
    np.testing.assert_allclose(out.to_numpy(), np.float32(A) * x_host + np.float32(B), rtol=1e-6, atol=1e-6,
                               err_msg=f"axpb launched by {method} computed the wrong result")


def make_launches(cases: dict[str, Case], stream: Stream, cubin: Path, notes: list[str]) -> dict:
    """``{(kernel, method): launch}`` for every case and every available method."""
    methods: dict[str, Callable[[Case], Launch]] = {
        "raw packed": lambda c: raw_packed(c, stream),
        "raw tuple": lambda c: raw_tuple(c, stream),
        "rawgraphs": lambda c: rawgraphs_launch(c, stream),
    }
    try:
        import cupy  # noqa: F401  (only to learn whether it is installed)
        methods["cupy"] = lambda c: cupy_launch(c, stream, cubin)
    except ImportError:
        notes.append("cupy is not installed: method (d) skipped")
        print("note: " + notes[-1], file=sys.stderr)
    return {(k, m): make(case) for k, case in cases.items() for m, make in methods.items()}


def measure(launches: dict, stream: Stream, iters: int, repeats: int) -> dict[tuple, list[float]]:
    """Host us per launch, ``repeats`` samples per launch method, taken in interleaved rounds."""
    for run in launches.values():  # warm-up: one sample's worth of launches each
        for _ in range(iters):
            run()
        stream.synchronize()
    samples = {key: [] for key in launches}
    for _ in progress(range(repeats), label="launch_overhead"):
        for key, run in launches.items():
            samples[key] += time_host(run, warmup=0, iters=iters, repeats=1, sync=stream.synchronize)
    return samples


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out"), help="folder for JSON and PNG (default ./out)")
    ap.add_argument("--iters", type=int, default=2000, help="launches per sample")
    ap.add_argument("--repeats", type=int, default=20, help="samples per method (>= 15)")
    opts = ap.parse_args(argv)
    if opts.repeats < 15:
        ap.error("--repeats must be at least 15")

    dev = device()
    stream = Stream.create()
    module = Module.from_file("basic")
    x_host = np.random.default_rng(0).uniform(0.5, 2.0, N).astype(np.float32)  # [N], never zero
    x, out = DeviceBuffer.from_numpy(x_host), DeviceBuffer((N,), np.float32)  # [N], [N]
    cases = {
        "noop": Case(module.kernel("noop"), LaunchShape(grid=(1,), block=(32,)), {}),
        # axpb: one thread per element, grid = N / 256
        "axpb": Case(module.kernel("axpb"), LaunchShape(grid=(N // 256,), block=(256,)),
                     {"out": out, "x": x, "a": A, "b": B, "n": N}),
    }
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:  # CuPy loads the cubin from a file
        cubin = Path(tmp) / "basic.cubin"
        cubin.write_bytes(module.program.cubin)
        launches = make_launches(cases, stream, cubin, notes)
        methods = list(dict.fromkeys(m for _, m in launches))
        for m in methods:
            check_axpb(launches["axpb", m], out, x_host, stream, m)
        samples = measure(launches, stream, opts.iters, opts.repeats)

    rows = []
    for (k, m), s in samples.items():
        row = make_row(s, kernel=k, method=m)
        row["ratio_to_raw_packed"] = row["summary"]["median"] / float(np.median(samples[k, "raw packed"]))
        rows.append(row)
    columns = ["kernel", "method", ("summary.median", "host us/launch"), ("summary.p10", "p10"),
               ("summary.p90", "p90"), ("ratio_to_raw_packed", "ratio to (a)")]
    print(format_table(rows, columns,
                       title=f"launch_overhead on {dev.name}: host time per eager launch "
                             f"({opts.iters} launches x {opts.repeats} samples)"))
    ratio = {r["kernel"]: r["ratio_to_raw_packed"] for r in rows if r["method"] == "rawgraphs"}
    met = all(v <= TARGET for v in ratio.values())
    notes.append("rawgraphs / raw packed: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()) +
                 f" (target <= {TARGET:.2f}x: {'met' if met else 'NOT met'})")
    print(notes[-1])

    result = BenchResult("launch_overhead", collect_metadata(),
                         {"iters": opts.iters, "repeats": opts.repeats, "n": N, "methods": methods,
                          "timer": "host perf_counter_ns around the launch loop; sync untimed"}, rows, notes)
    print(f"wrote {result.write_json(opts.out / 'launch_overhead.json')}")
    try:
        png = plot_bars(opts.out / "launch_overhead.png", [f"{r['kernel']}\n{r['method']}" for r in rows],
                        [r["summary"]["median"] for r in rows], title=f"host time per launch ({dev.name})",
                        ylabel="us / launch (median, p10-p90)", low=[r["summary"]["p10"] for r in rows],
                        high=[r["summary"]["p90"] for r in rows])
        print(f"wrote {png}")
    except ImportError:
        print("note: matplotlib is not installed (the [bench] extra): no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
