"""What a launch boundary of the decode step is made of, read from per-block GPU timestamps (rawgraphs.model.trace).

The step (graph replay, B = 1, context 512) runs with kernels/pdl.cuh's trace compiled in. Per launch, in ns of
%globaltimer: when its first block reached the PDL wait (arrive), when the first block was let past the PDL wait
(release), and for gemv when its blocks were done (exit). Per kind of launch (medians over layers and replays):

- ``critical``: release of this launch's first block -> release of the next launch's first block: the step's
  critical path through this launch (the per-kind sums add up to the step).
- ``sits``: how long the first block waited at griddepcontrol.wait (how early PDL placed it).
- ``late``: last block's arrival - first release: > 0 when blocks only found room after the previous launch.
- ``skew``: last block's release - first block's release: how far apart the wait lets a launch's blocks go.
- gemv only: ``work`` (first release -> last exit), ``tail`` (first exit -> last exit), ``handoff`` (last exit
  -> the next launch's first release: how long the GPU takes to let the next kernel go), ``placed`` (last block's
  start - first release: > 0 when blocks only found room on an SM after the launch was let go), ``prologue``
  (median over blocks of start -> arrival at the wait: issuing the first cp.async ring), and ``busy`` /
  ``busy_max`` (median and longest over blocks of the block's own release -> its exit): ``work`` is at most
  ``skew`` + ``busy_max``, so the two tell a late release from a slow block. ``busy`` splits into ``stage`` (median
  of a block's release -> its input in shared memory, after the block barrier: the input's read and RMSNorm),
  ``units`` (input staged -> thread 0's warp's last unit stored: the dots on weights still arriving) and the rest
  (the other warps' last units, the exit barrier).

The traced step is timed beside an untraced model of the same weights, to show what the trace costs (100-160 us on
1b; it can reorder two variants of a kernel's grid, session 30: rank variants by the untraced A/B); the last
replay's records go to ``boundary_trace_<preset>.npz`` (records, launch names) for a closer look.
Run from the repository root: ``PYTHONPATH=.:benchmarks python3 benchmarks/diagnostics/boundary_trace.py``.
"""

import json
import sys

import numpy as np

sys.path.insert(0, "benchmarks")
from common import CONTEXT, build_model, fill_kv_random, median, no_gpu, parser, step_inputs, time_ms

from rawgraphs.context import Stream
from rawgraphs.model.trace import BlockTrace, launch_spans

REPLAYS = 7


def kind(name: str) -> str:
    return "reduce" if name.endswith(".reduce") else name.split(".")[-1]


def boundaries(spans) -> list[dict]:
    """Per launch (all but the last, which has no next release): the quantities of the module docstring, us."""
    rows = []
    for s, nxt in zip(spans, spans[1:]):
        r = {"name": s.name, "kind": kind(s.name), "blocks": s.blocks,
             "critical": (nxt.release[0] - s.release[0]) / 1e3, "sits": (s.release[0] - s.arrive[0]) / 1e3,
             "late": (s.arrive[1] - s.release[0]) / 1e3, "skew": (s.release[1] - s.release[0]) / 1e3}
        if not np.isnan(s.exit[1]):
            r.update(work=(s.exit[1] - s.release[0]) / 1e3, tail=(s.exit[1] - s.exit[0]) / 1e3,
                     handoff=(nxt.release[0] - s.exit[1]) / 1e3, placed=(s.enter[1] - s.release[0]) / 1e3,
                     prologue=s.prologue / 1e3, busy=s.busy[0] / 1e3, busy_max=s.busy[1] / 1e3,
                     stage=s.stage / 1e3, units=s.units / 1e3)
        rows.append(r)
    return rows


def summarize(rows: list[dict]) -> dict:
    out = {}
    for k in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == k]
        out[k] = {"per_step": len(mine) // REPLAYS,
                  **{q: float(np.median([r[q] for r in mine])) for q in mine[0] if q not in ("name", "kind")}}
    return out


def run(preset: str, B: int, stream: Stream, out) -> dict:
    rng = np.random.default_rng(0)
    models = {"plain": build_model(preset, B, CONTEXT + 16),
              "traced": build_model(preset, B, CONTEXT + 16, compile_options=("-DRG_TRACE",))}
    steps, exes = {}, {}
    for label, model in models.items():
        fill_kv_random(model, rng)
        model.set_inputs(*step_inputs(model, B, CONTEXT, np.random.default_rng(1)), stream)
        exes[label] = model.build_graph(B).instantiate()
        exes[label].upload(stream)
    trace = BlockTrace(models["traced"].modules)
    for label, exe in exes.items():  # the traced step records into a buffer it keeps overflowing: same work
        steps[label] = median(time_ms(lambda e=exe: e.launch(stream), stream, False)) * 1e3
    names = [ln.name for ln in models["traced"].step_launches(B)]
    rows, ticks = [], []
    for _ in range(REPLAYS):
        trace.reset()
        exes["traced"].launch(stream)
        stream.synchronize()
        recs = trace.records()
        rows += boundaries(launch_spans(recs, names))
        t = np.unique(np.concatenate([recs["arrived"], recs["released"]]))
        ticks.append(int(np.diff(t).min()))
    np.savez_compressed(out / f"boundary_trace_{preset}.npz", records=recs, names=np.array(names))
    trace.close()
    by_kind = summarize(rows)
    print(f"{preset} B={B}, context {CONTEXT}: step {steps['plain']:.1f} us, traced {steps['traced']:.1f} us "
          f"({len(names)} launches; finest %globaltimer step seen {min(ticks)} ns)")
    cols = ("per_step", "blocks", "critical", "sits", "late", "skew", "work", "tail", "handoff", "placed", "prologue",
            "busy", "busy_max", "stage", "units")
    print("  " + " ".join(f"{c:>10s}" for c in ("kind",) + cols))
    for k, v in by_kind.items():
        print("  " + f"{k:>10s} " + " ".join(f"{v[c]:10.2f}" if c in v else f"{'-':>10s}" for c in cols))
    return {"preset": preset, "B": B, "step_us": steps["plain"], "traced_step_us": steps["traced"],
            "timer_step_ns": min(ticks), "by_kind": by_kind, "launches": rows[:len(names) - 1]}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--presets", default="1b,small")
    args = ap.parse_args()
    if no_gpu("boundary_trace.py"):
        return
    stream = Stream.create()
    args.out.mkdir(parents=True, exist_ok=True)
    results = [run(p, 1, stream, args.out) for p in args.presets.split(",")]
    (args.out / "boundary_trace.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
