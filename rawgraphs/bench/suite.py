"""``python -m rawgraphs bench {all, launch, graph, ...} --out DIR``: run benchmark scripts, then write summary.md.

Each benchmark is one script in ``benchmarks/`` of a source checkout (one question per script: it prints its
table and writes JSON + PNG to ``--out``). The suite runs them in order as separate processes (a crash or a GPU
error in one cannot poison the next), echoes their output, and renders every JSON it finds into ``summary.md``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from .record import load_json
from .report import render_summary

__all__ = ["BENCHMARKS", "benchmarks_dir", "run_suite", "write_summary"]

# name -> script (benchmarks/<script>.py); "all" runs them in this order
BENCHMARKS = {
    "launch": "launch_overhead", "graph": "graph_overheads", "decode": "decode", "sweep": "batch_sweep",
    "padding": "padding_cost", "memory": "memory_cost", "loop": "device_loop", "compare": "compare_torch",
    "frameworks": "frameworks", "tp": "tp_decode",
}
_QUICK = {"graph_overheads", "decode", "batch_sweep", "padding_cost", "memory_cost", "device_loop", "compare_torch",
          "frameworks", "tp_decode"}


def benchmarks_dir() -> Path | None:
    """``benchmarks/`` beside the package in a source checkout, or None (an installed wheel ships none)."""
    d = Path(__file__).resolve().parents[2] / "benchmarks"
    return d if (d / "decode.py").is_file() else None


def run_suite(names: list[str], out: Path, quick: bool = False) -> int:
    """Run the named benchmarks (or ``["all"]``); returns the number that failed."""
    bdir = benchmarks_dir()
    if bdir is None:
        print("rawgraphs bench needs a source checkout: the benchmark scripts live in benchmarks/ beside the "
              "package (git clone the project and run from its root).")
        return 1
    from ..context import gpu_available
    if not gpu_available():
        print("rawgraphs bench measures a GPU, and this machine has no NVIDIA GPU or driver: nothing to run.")
        return 0
    todo = list(BENCHMARKS) if "all" in names else names
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    t0 = time.perf_counter()
    for i, name in enumerate(todo, 1):
        script = BENCHMARKS[name]
        cmd = [sys.executable, str(bdir / f"{script}.py"), "--out", str(out)]
        if quick and script in _QUICK:
            cmd.append("--quick")
        print(f"[{i}/{len(todo)}] {name}: {' '.join(cmd[1:])}", flush=True)
        t = time.perf_counter()
        rc = subprocess.call(cmd, cwd=bdir.parent)
        print(f"[{i}/{len(todo)}] {name}: exit {rc} after {time.perf_counter() - t:.1f} s", flush=True)
        if rc:
            failed.append(name)
    path = write_summary(out)
    print(f"suite: {len(todo) - len(failed)}/{len(todo)} benchmarks ok in {time.perf_counter() - t0:.0f} s; "
          f"summary in {path}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return len(failed)


def write_summary(out: Path) -> Path:
    """Render every benchmark JSON in ``out`` into ``out/summary.md``."""
    results = []
    for p in sorted(out.glob("*.json")):
        try:
            results.append(load_json(p))
        except (ValueError, KeyError) as e:
            print(f"summary: skipping {p.name}: not a benchmark result ({e})")
    path = out / "summary.md"
    path.write_text(render_summary(results))
    return path
