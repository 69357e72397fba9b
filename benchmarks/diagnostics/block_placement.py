"""When each part of a launch's grid starts, waits, is let go and finishes: the per-block records that
``boundary_trace.py`` leaves in ``boundary_trace_<preset>.npz`` (its last traced replay), by thirds of the grid.

The block scheduler hands out blocks in index order, so a grid's first blocks are the ones placed early, beside the
previous launch (PDL), and the rest only as the previous launch's blocks leave. Per kind of launch (medians over
the step's layers), in us from the launch's first release, for blocks [0, n/3), [n/3, 2n/3), [2n/3, n): median
entry (gemv only), arrival at the PDL wait, release from it and exit (gemv only); then the exit spread: exits at
p0 / p50 / p100, and the spread (standard deviation) of the SMs' mean exits against that within one SM.

Run after boundary_trace.py, from the repository root (no GPU needed)::

    python3 benchmarks/diagnostics/block_placement.py out/boundary_trace_1b.npz [more.npz ...]
"""

import sys

import numpy as np


def thirds(r: np.ndarray) -> dict:
    """One launch's records (``rawgraphs.model.trace.RECORD``) -> medians per third of the grid and exit spread."""
    r = r[np.argsort(r["where"] & 0xFFFFFFFF, kind="stable")]  # by block index
    t0 = int(r["released"].min())

    def us(field, part):
        t = part[field][part[field] != 0]
        return float(np.median(t.astype(np.int64) - t0)) / 1e3 if len(t) else float("nan")

    n = len(r)
    parts = [r[i * n // 3:(i + 1) * n // 3] for i in range(3)]
    out = {f: [us(f, p) for p in parts] for f in ("entered", "arrived", "released", "exit")}
    done = r[r["exit"] != 0]
    if len(done):
        ex = (done["exit"].astype(np.int64) - t0) / 1e3
        sm = done["where"] >> 32
        sms = np.unique(sm)
        out["exit_p0_p50_p100"] = [float(v) for v in np.percentile(ex, [0, 50, 100])]
        out["sm_mean_sd"] = float(np.std([ex[sm == s].mean() for s in sms]))
        out["within_sm_sd"] = float(np.mean([ex[sm == s].std() for s in sms]))
    return out


def by_kind(records: np.ndarray, names) -> dict:
    """:func:`thirds` of every launch, medians over the launches of each kind (the name after the last dot)."""
    grids = np.unique(records["grid"])
    if len(grids) != len(names):
        raise ValueError(f"the records hold {len(grids)} launches, the names {len(names)}")
    kinds: dict[str, list[dict]] = {}
    for name, g in zip(names, grids, strict=True):
        kinds.setdefault(str(name).split(".")[-1], []).append(thirds(records[records["grid"] == g]))
    return {k: {f: np.median([row[f] for row in rows], axis=0).tolist() for f in rows[0]} for k, rows in kinds.items()}


def main(paths: list[str]) -> None:
    for path in paths:
        z = np.load(path)
        print(f"{path}: us from each launch's first release; entry / arrival / release / exit medians by grid third")
        for kind, v in by_kind(z["records"], list(z["names"])).items():
            cells = " | ".join(" ".join(f"{x:6.2f}" for x in v[f]) for f in ("entered", "arrived", "released", "exit"))
            line = f"  {kind:10s} {cells}"
            if "exit_p0_p50_p100" in v:
                line += (" || exits " + " ".join(f"{x:6.2f}" for x in v["exit_p0_p50_p100"])
                         + f", SM means sd {v['sm_mean_sd']:.2f}, within an SM {v['within_sm_sd']:.2f}")
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
