"""ncu_stalls: per-op time, instructions and stall reasons of one profiled decode step, side by side for trees.

Reads the CSVs that ``ncu --csv --page raw --print-units base --metrics gpu__time_duration.sum,
smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active`` writes over
``benchmarks/profile_step.py`` (one file per tree, ``DIR/<tree>.csv``) and prints, per tree, each op's launches,
median time (us), median instructions executed and its largest stall reasons in cycles per issued instruction
(``no_instruction``: waiting for the instruction fetch; ``branch_resolving``: for a branch target), so two trees'
kernels for the same op can be compared. Launches are named by their place in the step where the kernel count is
HEAD + L x LAYER + TAIL for a whole number of layers L (a B = 1 step: embed, L x (qkv, attention, o, gate_up, down),
LM head, argmax), else by kernel name. Times are isolated (ncu serializes kernels: no PDL overlap).

    python3 benchmarks/diagnostics/ncu_stalls.py DIR base unitop
"""

from __future__ import annotations

import argparse
import collections
import csv
import statistics
from pathlib import Path

HEAD = ("embed",)
LAYER = ("qkv", "attention", "o", "gate_up", "down")
TAIL = ("lm_head", "argmax")
STALL = "smsp__average_warps_issue_stalled_"


def op_names(n: int) -> list[str] | None:
    """The op of each of a step's n launches, or None where n is not HEAD + L x LAYER + TAIL."""
    layers, rest = divmod(n - len(HEAD) - len(TAIL), len(LAYER))
    if layers < 1 or rest:
        return None
    return [*HEAD, *(LAYER * layers), *TAIL]


def load(path: Path) -> dict[str, dict[str, list[float]]]:
    """{"op:kernel": {metric: [value per launch]}} of one raw-page ncu CSV (its second row holds the units)."""
    rows = list(csv.reader(line for line in path.open() if line.startswith('"')))
    if len(rows) < 3:
        raise ValueError(f"{path}: no profiled kernels (ncu's messages are in the .err file beside it)")
    head, data = rows[0], rows[2:]
    col = {h: i for i, h in enumerate(head)}
    names = op_names(len(data))
    out: dict[str, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for j, r in enumerate(data):
        kernel = r[col["Kernel Name"]].split("(")[0]
        key = f"{names[j]}:{kernel}" if names else kernel
        for h, i in col.items():
            if h.startswith(("gpu__", "smsp__")) and r[i]:
                out[key][h].append(float(r[i].replace(",", "")))
    return out


def summary(per: dict[str, dict[str, list[float]]], top: int = 5) -> list[str]:
    """One line per op: launches, median us, median instructions, the `top` stalls, no_instruction."""
    lines = []
    for key, m in per.items():
        stalls = {s[len(STALL):].replace("_per_issue_active.ratio", ""): statistics.median(v)
                  for s, v in m.items() if s.startswith(STALL)}
        big = sorted(stalls.items(), key=lambda kv: -kv[1])[:top]
        lines.append(f"{key:28s} {len(m['gpu__time_duration.sum']):3d} "
                     f"{statistics.median(m['gpu__time_duration.sum']) / 1e3:7.2f} us "
                     f"{statistics.median(m['smsp__inst_executed.sum']):9.0f} inst  "
                     + " ".join(f"{a}={b:.2f}" for a, b in big)
                     + f" | no_instruction={stalls.get('no_instruction', 0.0):.2f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="folder of <tree>.csv files")
    ap.add_argument("trees", nargs="+")
    a = ap.parse_args()
    for tree in a.trees:
        try:
            per = load(a.dir / f"{tree}.csv")
        except (OSError, ValueError, KeyError) as e:
            print(f"== {tree}: unreadable ({e})")
            continue
        total = sum(sum(m["gpu__time_duration.sum"]) for m in per.values()) / 1e3
        print(f"== {tree}: isolated kernel times sum to {total:.1f} us; op:kernel, launches, medians, stalls per issue")
        print("\n".join(summary(per)))


if __name__ == "__main__":
    main()
