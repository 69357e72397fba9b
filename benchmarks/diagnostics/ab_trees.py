"""A/B several source trees in one device call: the graph step of each (``ab_steps.py``: context 512, CUDA-event
median of replays), the trees alternating within each round so they share the host's and the GPU's state, then one
table of every round per preset, batch and tree, with each tree's change against the first.

Here (no GPU needed), extract each ref into ``scratch/ab/NAME`` (``scratch/`` is git-ignored: carry it)::

    python benchmarks/diagnostics/ab_trees.py prepare main new=tc-target-2x head=.     # NAME=REF, "." = this tree
    python benchmarks/diagnostics/ab_trees.py prepare base=main unit=main+probe.patch   # REF+PATCH: ref, then patch

A ``+PATCH`` (any number, applied in order with ``git apply``) builds a tree from a ref and a committed diff: unmerged
branches do not survive from one session's checkout to the next, so a probe that could not run is kept as a diff
(``git diff main probe > benchmarks/results/sessionNN/prepared/probe.patch``).

On the device, from the repository root (the first tree prepared is the baseline)::

    python3 benchmarks/diagnostics/ab_trees.py run --batches 17,24,64 --rounds 2 [--presets small,1b] [--deadline 240]
        [--trees base,new]                              # some of the prepared trees, the first as the baseline

``AB_CONTEXT=2048`` in the environment times every tree at that context instead (trees whose ``ab_steps.py`` reads
it: from session 31 on). Calls differ by ~3 us at B = 1 on the H200 and rounds within a call by ~0.5%: compare trees
within one call only. A tree whose kernels merely sit elsewhere in their module can differ by ~1% too (session 43: an
unused kernel shifting gemv.cu's kernels by 4480 bytes cost small B = 1 1.2% with the same SASS). ``sass_count.py
--same-as`` says how far each kernel moved; where they moved, prepare a control tree moved alike (an unused pad
kernel, as branch ``probe-layout-pad2`` adds) and read the candidate against it.

``--deadline`` (seconds) fits the run into a device call's budget: a tree's run starts only if the longest finished
run so far still fits, its timeout is cut to what is left, and the table of the rounds that ran is printed either way
(a shell ``timeout`` around the whole run would lose it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from statistics import median

ROOT = Path("scratch/ab")
ORDER = ROOT / "ORDER"  # the prepared trees' names, baseline first
# Committed benchmark results are left out of the trees: no run reads them, and at ~8 MB a tree they kept more than
# six trees from fitting the device tool's 64 MiB carry.
LEFT_OUT = "benchmarks/results"


def parse_spec(spec: str) -> tuple[str, str]:
    """``NAME=REF`` or ``REF`` (named after the ref, ``/`` as ``_``; ``.`` is ``head``) -> (name, ref); REF may carry
    ``+PATCH`` parts (``split_ref``)."""
    name, _, ref = spec.rpartition("=")
    name = name or ("head" if ref == "." else ref.replace("/", "_"))
    if not ref or not name.replace("_", "").replace("-", "").replace(".", "").isalnum():
        raise ValueError(f"cannot read tree spec {spec!r}: use NAME=REF or REF")
    return name, ref


def split_ref(ref: str) -> tuple[str, list[Path]]:
    """``REF+PATCH+...`` -> (ref, patch files, each checked to exist here)."""
    ref, *patches = ref.split("+")
    missing = [p for p in patches if not Path(p).is_file()]
    if not ref or missing:
        raise ValueError(f"tree ref {ref!r}: no such patch file {missing}" if missing else "empty ref before '+'")
    return ref, [Path(p).resolve() for p in patches]


def prepare(specs: list[str]) -> None:
    trees = [parse_spec(s) for s in specs]
    if len({n for n, _ in trees}) != len(trees):
        raise ValueError(f"tree names must differ: {[n for n, _ in trees]}")
    refs = {name: split_ref(ref) for name, ref in trees}  # every patch checked before any tree is removed
    shutil.rmtree(ROOT, ignore_errors=True)
    for name, spec in trees:
        ref, patches = refs[name]
        dest = ROOT / name
        dest.mkdir(parents=True)
        if ref == ".":  # tracked and untracked-but-not-ignored files, as the device tool copies them
            files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                                    ".", f":(exclude){LEFT_OUT}"], check=True, capture_output=True).stdout.split(b"\0")
            for f in filter(None, files):
                src = Path(f.decode())
                if src.is_file():
                    (dest / src).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dest / src)
        else:
            archive = subprocess.run(["git", "archive", ref, "--", ".", f":(exclude){LEFT_OUT}"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "xf", "-", "-C", str(dest)], input=archive, check=True)
        # git apply as a patch tool in dest: the ceiling keeps it from finding this repository around dest (inside
        # one it would take the patch's paths from the repository's top and skip those outside dest)
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(dest.resolve().parent))
        for patch in patches:
            subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=dest, env=env, check=True)
        print(f"{name}: {spec} -> {dest}")
    ORDER.write_text("\n".join(n for n, _ in trees) + "\n")


def chosen(trees: str | None) -> list[str]:
    """The prepared trees to run, baseline first: all of them (ORDER), or those named in ``trees`` ("a,b")."""
    prepared = ORDER.read_text().split()
    if trees is None:
        return prepared
    names = trees.split(",")
    unknown = [n for n in names if n not in prepared]
    if unknown or len(set(names)) != len(names) or not names:
        raise ValueError(f"--trees {trees!r}: name prepared trees once each; prepared: {prepared}")
    return names


def run(batches: str, presets: str, rounds: int, timeout: float, deadline: float | None = None,
        clock=time.monotonic, names: list[str] | None = None) -> list[dict]:
    """The ``ab_steps.py`` rows of ``names`` (default: every prepared tree), trees alternating within each round;
    with ``deadline`` (seconds from now), a run starts only while the longest one so far that finished still fits."""
    names = names or chosen(None)
    rows, t0, longest = [], clock(), 0.0
    for r in range(1, rounds + 1):
        for name in names:
            left = float("inf") if deadline is None else deadline - (clock() - t0)
            if left < max(longest, 1.0):
                print(f"deadline: {deadline:g} s reached, round {r} stops before {name}", flush=True)
                return rows
            env = dict(os.environ, AB_TAG=name, AB_BATCHES=batches, AB_PRESETS=presets, PYTHONPATH=".:benchmarks")
            start = clock()
            try:
                out = subprocess.run([sys.executable, "benchmarks/diagnostics/ab_steps.py"], cwd=ROOT / name,
                                     env=env, capture_output=True, text=True, timeout=min(timeout, left))
                text, err = out.stdout, out.stderr if out.returncode else ""
                longest = max(longest, clock() - start)  # a run that hung says nothing of how long one takes
            except subprocess.TimeoutExpired as e:
                text, err = (e.stdout or b"").decode(), f"timed out after {min(timeout, left):g} s"
            for line in text.splitlines():
                if line.startswith("{"):
                    row = json.loads(line)
                    row.pop("kernels", None)
                    rows.append({**row, "round": r})
                    print(json.dumps(rows[-1]), flush=True)
            if err:
                print(f"{name}, round {r}: {err.strip().splitlines()[-1]}", flush=True)
    return rows


def table(rows: list[dict], names: list[str]) -> str:
    """One line per (preset, B): each tree's us per round, then each tree's median against the first tree's."""
    us = defaultdict(list)
    for row in rows:
        us[(row["preset"], row["B"], row["tag"])].append(row["us"])
    keys = sorted({(row["preset"], row["B"]) for row in rows}, key=lambda k: (k[0] != "small", k[0], k[1]))
    lines = []
    for preset, B in keys:
        base = us.get((preset, B, names[0]))
        cells = []
        for n in names:
            v = us.get((preset, B, n))
            if not v:
                cells.append(f"{n}=-")
                continue
            change = f" ({100 * (median(v) / median(base) - 1):+.1f}%)" if base and n != names[0] else ""
            cells.append(f"{n}=" + "/".join(f"{x:.1f}" for x in v) + change)
        lines.append(f"{preset} B={B}: " + "  ".join(cells))
    return "\n".join(lines) or "no results (see the errors above)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="extract refs into scratch/ab/NAME (first = baseline)")
    p.add_argument("trees", nargs="+", metavar="NAME=REF")
    r = sub.add_parser("run", help="time every prepared tree, alternating, and print the table")
    r.add_argument("--batches", default="1,2,3,4")
    r.add_argument("--presets", default="small,1b")
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--timeout", type=float, default=150.0, help="seconds per tree per round")
    r.add_argument("--deadline", type=float, default=None, help="seconds for the whole run (see above)")
    r.add_argument("--trees", default=None, help="prepared trees to run, baseline first (default: all, as prepared)")
    a = ap.parse_args(argv)
    if a.cmd == "prepare":
        prepare(a.trees)
    else:
        names = chosen(a.trees)
        print(table(run(a.batches, a.presets, a.rounds, a.timeout, a.deadline, names=names), names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
