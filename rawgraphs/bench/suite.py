"""``python -m rawgraphs bench {all, launch, graph, ...} --out DIR``: run benchmark scripts, then write summary.md.

Each benchmark is one script in ``benchmarks/`` of a source checkout (one question per script: it prints its
table and writes JSON + PNG to ``--out``). The suite runs them in order as separate processes (a crash or a GPU
error in one cannot poison the next, a hang is stopped after ``TIMEOUT_S``), echoes their output, and renders into
``summary.md`` the exit status of every run and the JSON written during this suite (an older file in ``--out`` is
named as stale, not shown as a result).
"""

from __future__ import annotations

import os
import signal
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
TIMEOUT_S = 420  # one benchmark's limit: `bench all` runs in ~215-300 s on the H200
DEADLINE_S = 520  # the whole suite's: under run_on_device.sh's 540 s (the device's 600 s per command), summary written
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
    runs: list[tuple[str, str, float]] = []  # (name, status, seconds)
    started = time.time()
    t0 = time.perf_counter()
    term = signal.signal(signal.SIGTERM, _interrupt)  # a `timeout` around the suite: still write the summary
    try:
        for i, name in enumerate(todo, 1):
            script = BENCHMARKS[name]
            cmd = [sys.executable, str(bdir / f"{script}.py"), "--out", str(out)]
            if quick and script in _QUICK:
                cmd.append("--quick")
            print(f"[{i}/{len(todo)}] {name}: {' '.join(cmd[1:])}", flush=True)
            t = time.perf_counter()
            limit = min(TIMEOUT_S, DEADLINE_S - (t - t0))
            status = _run(cmd, bdir.parent, limit) if limit > 0 else "not run (the suite's deadline passed)"
            runs.append((name, status, time.perf_counter() - t))
            print(f"[{i}/{len(todo)}] {name}: {status} after {runs[-1][2]:.1f} s", flush=True)
    finally:  # a summary of what ran, also when the suite itself is interrupted
        signal.signal(signal.SIGTERM, term)
        path = write_summary(out, runs, since=started)
    failed = [name for name, status, _ in runs if status != "ok"]
    print(f"suite: {len(runs) - len(failed)}/{len(todo)} benchmarks ok in {time.perf_counter() - t0:.0f} s; "
          f"summary in {path}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return len(failed)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _run(cmd: list[str], cwd: Path, limit: float) -> str:
    """Run one benchmark script in a session of its own; past ``limit`` seconds (or on an interrupt) kill its
    whole process group: its own children (a compile process, tensor-parallel ranks) must not hold the GPU for
    the next benchmark."""
    p = subprocess.Popen(cmd, cwd=cwd, start_new_session=True)
    try:
        rc = p.wait(timeout=limit)
        return "ok" if rc == 0 else f"FAILED (exit {rc})"
    except subprocess.TimeoutExpired:
        return f"FAILED (stopped after {limit:.0f} s)"
    finally:  # whatever of its group is left (the script itself after a timeout, or children it left behind)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it and all its children are gone
        p.wait()


def write_summary(out: Path, runs: list[tuple[str, str, float]] = (), since: float | None = None) -> Path:
    """Render into ``out/summary.md`` the suite's ``runs`` (name, status, seconds) and every benchmark JSON in
    ``out`` written at or after ``since`` (a Unix time; None: all of them); older ones are listed as stale."""
    results, stale = [], []
    for p in sorted(out.glob("*.json")):
        if since is not None and p.stat().st_mtime < since:
            stale.append(p.name)
            continue
        try:
            results.append(load_json(p))
        except (ValueError, KeyError) as e:
            print(f"summary: skipping {p.name}: not a benchmark result ({e})")
    path = out / "summary.md"
    path.write_text(render_summary(results, runs=runs, stale=stale))
    return path
