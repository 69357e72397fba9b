"""When each part of a launch's grid starts, waits, is let go and finishes: the per-block records that
``boundary_trace.py`` leaves in ``boundary_trace_<preset>.npz`` (its last traced replay), by thirds of the grid.

The block scheduler hands out blocks in index order, so a grid's first blocks are the ones placed early, beside the
previous launch (PDL), and the rest only as the previous launch's blocks leave. Per kind of launch (medians over
the step's layers), in us from the launch's first release, for blocks [0, n/3), [n/3, 2n/3), [2n/3, n): median
entry (gemv only), arrival at the PDL wait, release from it and exit (gemv only); then the exit spread: exits at
p0 / p50 / p100, and the spread (standard deviation) of the SMs' mean exits against that within one SM. Last, per
gemv kind, the SMs by how many of the launch's blocks they held (0 to 4): how many SMs, and their last exit. Under
a cap of 3 blocks per SM, a 256-block grid can leave 3 on some SMs and none on others, and the full SMs finish last.

With ``--preset NAME`` (the model the trace ran), each B = 1 projection that runs gemv's unit stream also gets its
SMs by the units (weight rows, gate/up row pairs) their blocks held, from the stream's block-major order (warp w of
block b owns units b * 8 + w + i * blocks * 8), and their last exit: how far an SM's load sets its finish. Session
30 (H100): gate_up SMs at 24 / 32 / 40 / 48 units exited at 12.4 / 13.3 / 15.0 / 17.3 us, yet giving every block
an even share did not make the step faster (benchmarks/NOTES.md).

With ``--layers 4,5``, first the launches of those layers one by one, in us from the traced step's first arrival:
first / last block at the PDL wait, past it, started and done, and the median block's busy time (sessions 35-36's
``trace_layers_4_5.log``).

Run after boundary_trace.py, from the repository root (no GPU needed)::

    PYTHONPATH=. python3 benchmarks/diagnostics/block_placement.py [--preset 1b] [--layers 4,5] out/trace_1b.npz
"""

import argparse

import numpy as np

from rawgraphs.model.plans import SMS  # the H200's and H100's: an SM that holds no block of a launch counts (as 0)

MAX_PER_SM = 4  # gemv's blocks per SM by its registers alone


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
        held = np.bincount(sm.astype(np.int64), minlength=SMS)  # blocks per SM id
        last = np.zeros(len(held))
        np.maximum.at(last, sm.astype(np.int64), ex)
        out["sms_holding"] = [float(np.count_nonzero(held == k)) for k in range(MAX_PER_SM + 1)]
        out["last_exit_holding"] = [float(np.median(last[held == k])) if k and (held == k).any() else float("nan")
                                    for k in range(MAX_PER_SM + 1)]
    return out


def by_kind(records: np.ndarray, names) -> dict:
    """:func:`thirds` of every launch, medians over the launches of each kind (the name after the last dot)."""
    grids = np.unique(records["grid"])
    if len(grids) != len(names):
        raise ValueError(f"the records hold {len(grids)} launches, the names {len(names)}")
    kinds: dict[str, list[dict]] = {}
    for name, g in zip(names, grids, strict=True):
        kinds.setdefault(str(name).split(".")[-1], []).append(thirds(records[records["grid"] == g]))
    return {k: {f: _median_columns([row[f] for row in rows]) for f in rows[0]} for k, rows in kinds.items()}


def _median_columns(rows) -> list[float] | float:
    """Median over launches of each column, NaNs left out (NaN where a column has no number)."""
    a = np.asarray(rows, dtype=float)
    cols = a.reshape(len(a), -1).T
    med = [float(np.median(c[~np.isnan(c)])) if (~np.isnan(c)).any() else float("nan") for c in cols]
    return med if a.ndim > 1 else med[0]


def block_units(units: int, blocks: int, warps: int = 8) -> np.ndarray:
    """Units each block of the unit stream owns: warp w of block b takes units b * warps + w + i * blocks * warps."""
    g = np.arange(blocks * warps)
    per_group = np.where(g < units, (units - 1 - g) // (blocks * warps) + 1, 0)
    return per_group.reshape(blocks, warps).sum(axis=1)


def unit_streams(preset: str) -> dict[str, tuple[int, int]]:
    """``{launch name: (units, blocks)}`` of the B = 1 step's gemv_unit launches: the unit stream (one warp per
    unit, one K range: gemv.cu's condition), from the step's own launch plan (no GPU)."""
    from rawgraphs.model import ModelConfig
    from rawgraphs.model.decode import DecodeModel
    from rawgraphs.model.plans import OUT_MODES, UNIT_KERNEL

    out = {}
    for ln in DecodeModel(ModelConfig.preset(preset), None, max_batch=1, plan_only=True).step_launches(1):
        a = ln.args
        if ln.kernel.name == UNIT_KERNEL:  # it runs only the unit stream (gemv_plan picks it for exactly that)
            out[ln.name] = (a["N"] // 2 if a["mode"] == OUT_MODES["silu"] else a["N"], ln.shape.grid[0])
    return out


def load_table(records: np.ndarray, names, preset: str) -> dict[str, dict[int, tuple[int, float]]]:
    """Per unit-stream kind: ``{units an SM held: (SMs, median of their last exits in us)}``, medians over the
    kind's launches (us from each launch's first release); launches that do not run the unit stream are left out."""
    streams, rows = unit_streams(preset), {}
    for name, g in zip(names, np.unique(records["grid"]), strict=True):
        r = records[(records["grid"] == g) & (records["exit"] != 0)]
        if str(name) not in streams or not len(r):
            continue
        n_units, blocks = streams[str(name)]
        blk, sm = (r["where"] & 0xFFFFFFFF).astype(np.int64), (r["where"] >> 32).astype(np.int64)
        if blk.max() >= blocks:
            raise ValueError(f"{name}: block {blk.max()} in the records, the {preset} plan has {blocks}")
        load = np.bincount(sm, weights=block_units(n_units, blocks)[blk], minlength=SMS).astype(np.int64)
        last = np.zeros(len(load))
        np.maximum.at(last, sm, (r["exit"].astype(np.int64) - int(r["released"].min())) / 1e3)
        for u in np.unique(load[load > 0]):
            rows.setdefault(str(name).split(".")[-1], {}).setdefault(int(u), []).append(
                (int((load == u).sum()), float(np.median(last[load == u]))))
    return {k: {u: (int(np.median([n for n, _ in v])), float(np.median([t for _, t in v])))
                for u, v in sorted(d.items())} for k, d in rows.items()}


def layer_lines(records: np.ndarray, names, layers) -> list[str]:
    """One line per launch of ``layers`` (``L<i>.`` names): first/last arrival, release, entry and exit in us from
    the step's first arrival (:func:`rawgraphs.model.trace.launch_spans`), and the median busy time."""
    from rawgraphs.model.trace import launch_spans

    prefixes = tuple(f"L{i}." for i in layers)

    def pair(p):
        return f"{p[0] / 1e3:7.2f}/{p[1] / 1e3:7.2f}"

    return [f"{s.name:13s} n={s.blocks:4d} arr {pair(s.arrive)} rel {pair(s.release)} ent {pair(s.enter)} "
            f"exit {pair(s.exit)} busy {s.busy[0] / 1e3:.2f}"
            for s in launch_spans(records, names) if s.name.startswith(prefixes)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", help="the model the trace ran (tiny, small, 1b): adds the per-SM units table")
    ap.add_argument("--layers", type=lambda v: [int(i) for i in v.split(",")], default=[],
                    help="comma-separated layer indices: list their launches one by one first")
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args(argv)
    for path in args.paths:
        z = np.load(path)
        if args.layers:
            print(f"{path}: us from the step's first arrival, first/last block at the PDL wait (arr), past it (rel), "
                  "started (ent), done (exit); median busy")
            print("\n".join("  " + line for line in layer_lines(z["records"], list(z["names"]), args.layers)))
        kinds = by_kind(z["records"], list(z["names"]))
        print(f"{path}: us from each launch's first release; entry / arrival / release / exit medians by grid third")
        for kind, v in kinds.items():
            cells = " | ".join(" ".join(f"{x:6.2f}" for x in v[f]) for f in ("entered", "arrived", "released", "exit"))
            line = f"  {kind:10s} {cells}"
            if "exit_p0_p50_p100" in v:
                line += (" || exits " + " ".join(f"{x:6.2f}" for x in v["exit_p0_p50_p100"])
                         + f", SM means sd {v['sm_mean_sd']:.2f}, within an SM {v['within_sm_sd']:.2f}")
            print(line)
        print("  SMs holding 0 / 1 / 2 / 3 / 4 blocks of the launch (median over layers), and their last exit (us)")
        for kind, v in kinds.items():
            if "sms_holding" in v:
                print(f"  {kind:10s} " + " ".join(f"{x:4.0f}" for x in v["sms_holding"]) + " | "
                      + " ".join(f"{x:6.2f}" for x in v["last_exit_holding"]))
        if args.preset:
            print(f"  unit stream ({args.preset}): units an SM held -> SMs, their last exit (us), medians over layers")
            for kind, table in load_table(z["records"], list(z["names"]), args.preset).items():
                print(f"  {kind:10s} " + "  ".join(f"{u}: {n} SMs {t:.2f}" for u, (n, t) in table.items()))


if __name__ == "__main__":
    main()
