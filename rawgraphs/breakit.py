"""The "break it" exercise: every forbidden thing inside ``Graph.capture``, and what survives it.

Each case runs inside ``Graph.capture`` on a fresh stream and does one thing a capture cannot hold: a read
back, an allocation, a host branch on device data, a synchronize, an unjoined fork, legacy-stream work, a
synchronous host->device copy, a query of a captured event. For each we report the CUDA error name, the call
that broke it, the capture status :class:`~rawgraphs.errors.CaptureError` reports, whether the driver had
marked the capture ``INVALIDATED`` right after the call, and then whether the streams used still run an eager
kernel correctly and whether a graph instantiated *before* the breakage still replays correctly.

``python -m rawgraphs break [--json PATH]`` prints the table (:func:`main`); :func:`run_all` returns the rows.
See the CUDA Programming Guide, "Creating a Graph Using Stream Capture" (prohibited operations).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .capture import capture_status
from .context import Event, Stream, gpu_available
from .errors import CaptureError
from .graph import Graph
from .kernel import Kernel, LaunchShape, Module
from .memory import DeviceBuffer

__all__ = ["CASES", "COLUMNS", "Case", "healthy", "main", "plan", "run_all"]

N = 512                              # axpb elements
SHAPE = LaunchShape((N // 256,), (256,))  # axpb: one thread per element
A, B = 3.0, 1.0                      # the probe launch: out = 3 * x + 1


@dataclass
class _Ctx:
    """What a case body may touch: the kernel, its buffers and the streams/event made for this case."""

    axpb: Kernel
    x: DeviceBuffer    # [N] float32 input, never written
    out: DeviceBuffer  # [N] float32 scratch output
    stream: Stream     # the capturing stream (fresh per case)
    side: Stream       # a second fresh stream (the fork case forks into it)
    event: Event       # a fresh event (fork / captured-event cases)


def _launch(ctx: _Ctx, stream: Stream) -> None:
    ctx.axpb.launch(SHAPE, ctx.axpb.args(out=ctx.out, x=ctx.x, a=2.0, b=0.0, n=N), stream)


def _item(ctx: _Ctx) -> None:
    _launch(ctx, ctx.stream)
    ctx.out.to_numpy()[0].item()  # would read stale data now, not the replay's


def _alloc(ctx: _Ctx) -> None:
    _launch(ctx, ctx.stream)
    DeviceBuffer(1 << 20, np.uint8)


def _branch(ctx: _Ctx) -> None:
    _launch(ctx, ctx.stream)
    if ctx.out.to_numpy()[0] > 0:  # the branch would be decided once, at capture, and baked in
        _launch(ctx, ctx.stream)


def _sync(ctx: _Ctx) -> None:
    _launch(ctx, ctx.stream)
    ctx.stream.synchronize()


def _fork(ctx: _Ctx) -> None:
    ctx.event.record(ctx.stream)
    ctx.side.wait(ctx.event)  # the side stream joins the capture
    _launch(ctx, ctx.side)    # ... and is never joined back into ctx.stream


def _legacy(ctx: _Ctx) -> None:
    _launch(ctx, ctx.stream)             # ctx.stream is a blocking stream here
    _launch(ctx, Stream.legacy())        # legacy work implicitly joins every blocking stream


def _h2d(ctx: _Ctx) -> None:
    _launch(ctx, ctx.stream)
    ctx.out.copy_from(np.ones(N, np.float32))  # the driver would run this now and not record it


def _query(ctx: _Ctx) -> None:
    _launch(ctx, ctx.stream)
    ctx.event.record(ctx.stream)
    ctx.event.query()


@dataclass(frozen=True)
class Case:
    """One forbidden thing: its label, what it tries, the body run inside the capture."""

    key: str
    title: str
    tried: str
    body: Callable[[_Ctx], None]
    blocking: bool = False  # capture a blocking stream (so legacy-stream work can join it)


CASES: tuple[Case, ...] = (
    Case("i", ".item() read back", "launch, then out.to_numpy()[0].item() (synchronous cuMemcpyDtoH)", _item),
    Case("ii", "allocation", "launch, then DeviceBuffer(1 MiB) (cuMemAlloc)", _alloc),
    Case("iii", "host branch on data", "launch, then `if out.to_numpy()[0] > 0: launch again`", _branch),
    Case("iv", "stream synchronize", "launch, then stream.synchronize() (cuStreamSynchronize)", _sync),
    Case("v", "unjoined fork", "record an event, a side stream waits on it and launches, never joins back",
         _fork),
    Case("vi", "legacy-stream work", "capture a blocking stream, then launch on Stream.legacy()", _legacy,
         blocking=True),
    Case("vii", "sync host->device copy", "launch, then out.copy_from(host) (synchronous cuMemcpyHtoD)",
         _h2d),
    Case("viii", "query a captured event", "record an event in the capture, then event.query()", _query),
)


def plan() -> str:
    """What the exercise tries, one line per case."""
    lines = ["Each case runs inside Graph.capture on a fresh stream:"]
    lines += [f"  ({c.key}) {c.title}: {c.tried}" for c in CASES]
    lines.append("Afterwards: does each stream still run an eager launch exactly, and does a graph "
                 "instantiated before still replay exactly?")
    return "\n".join(lines)


def _works(run: Callable[[], None], out: DeviceBuffer, want: np.ndarray,
           stream: Stream) -> tuple[bool, str]:
    """Poison ``out`` on ``stream``, ``run()`` (launch there, synchronize), compare exactly; never raises."""
    try:
        out.fill_bytes(0xFF, stream)  # NaN everywhere, ordered before the launch on a non-blocking stream
        run()
        if not np.array_equal(out.to_numpy(), want):
            return False, "wrong result"
        return True, ""
    except Exception as e:  # noqa: BLE001  (report, do not crash: the point is to learn what still works)
        return False, f"{type(e).__name__}: {e}".splitlines()[0]


def _stream_works(ctx: _Ctx, stream: Stream, want: np.ndarray) -> tuple[bool, str]:
    status = capture_status(stream)
    if status != "NONE":
        return False, f"stream capture status {status}"

    def run() -> None:
        ctx.axpb.launch(SHAPE, ctx.axpb.args(out=ctx.out, x=ctx.x, a=A, b=B, n=N), stream)
        stream.synchronize()

    return _works(run, ctx.out, want, stream)


def _run_case(case: Case, axpb: Kernel, x: DeviceBuffer, out: DeviceBuffer, want: np.ndarray,
              other: Callable[[], tuple[bool, str]]) -> dict:
    ctx = _Ctx(axpb, x, out, Stream.create(non_blocking=not case.blocking), Stream.create(),
               Event.create(timing=False))
    after = "unknown"
    try:
        try:
            with Graph.capture(ctx.stream):
                try:
                    case.body(ctx)
                finally:
                    after = capture_status(ctx.stream)  # the driver's view right after the forbidden call
        except CaptureError as e:
            error, call, status = e.name, e.call, e.status
        except Exception as e:  # noqa: BLE001  (not what a broken capture should raise: show it as it is)
            error, call = f"{type(e).__name__}: {e}".splitlines()[0], None
            status = capture_status(ctx.stream)
        else:
            error, call, status = "none", None, after
        checks = [_stream_works(ctx, s, want) for s in (ctx.stream, ctx.side)]
        other_ok, other_why = other()
    finally:
        for obj in (ctx.stream, ctx.side, ctx.event):
            obj.close()
    why = "; ".join(w for _, w in checks if w) or other_why
    return {"case": f"({case.key}) {case.title}", "tried": case.tried, "error": error, "call": call,
            "status": status, "invalidated": after == "INVALIDATED", "stream_ok": all(ok for ok, _ in checks),
            "other_graph_ok": other_ok, "detail": why}


def run_all(cases: tuple[Case, ...] = CASES, seed: int = 0) -> list[dict]:
    """Run every case (needs a GPU); one row per case.

    Row keys: ``case``, ``tried``, ``error`` (CUDA error name, or ``none`` when nothing broke), ``call`` (what
    broke it), ``status`` (``CaptureError.status``), ``invalidated`` (the driver reported the capture
    ``INVALIDATED`` right after the call), ``stream_ok`` (the capturing stream and the side stream run an
    eager kernel with the exact result), ``other_graph_ok`` (a graph instantiated before all cases still
    replays exactly), ``detail`` (why a check failed, else empty).
    """
    axpb = Module.from_file("basic").kernel("axpb")
    x_host = np.random.default_rng(seed).uniform(0.5, 2.0, N).astype(np.float32)  # [N], never zero
    want = np.float32(A) * x_host + np.float32(B)  # exact: axpb does no FMA contraction
    x = DeviceBuffer.from_numpy(x_host)  # [N]
    out, other_out = DeviceBuffer(N, np.float32), DeviceBuffer(N, np.float32)  # [N], [N]
    home = Stream.create()
    with Graph.capture(home) as g:  # the "other" graph, made and instantiated before anything breaks
        axpb.launch(SHAPE, axpb.args(out=other_out, x=x, a=A, b=B, n=N), home)
    exe = g.instantiate()

    def other() -> tuple[bool, str]:
        def run() -> None:
            exe.launch(home)
            home.synchronize()
        return _works(run, other_out, want, home)

    try:
        ok, why = other()
        if not ok:
            raise RuntimeError(f"break it: the reference graph is wrong before anything broke ({why})")
        return [_run_case(c, axpb, x, out, want, other) for c in cases]
    finally:
        exe.close()
        g.close()
        home.close()


def healthy(row: dict) -> bool:
    """The expected outcome: the capture failed with a CUDA error and everything else still works."""
    return row["error"] != "none" and row["stream_ok"] and row["other_graph_ok"]


COLUMNS = ["case", "error", "call", "status", ("invalidated", "invalidated"), ("stream_ok", "stream ok"),
           ("other_graph_ok", "other graph ok")]


def main(argv: list[str] | None = None) -> int:
    """``rawgraphs break``: print the table. Returns 0 when every capture broke loudly and everything else
    still works (also without a GPU, where it prints the plan), 1 otherwise."""
    ap = argparse.ArgumentParser(prog="rawgraphs break", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="also write the rows (and run metadata) as JSON here")
    opts = ap.parse_args(argv)
    if not gpu_available():
        print("The break-it exercise needs an NVIDIA GPU and driver, and none was found on this machine.")
        print(plan())
        return 0
    from .bench.report import format_table

    print(plan() + "\n")
    rows = run_all()
    print(format_table(rows, COLUMNS, title="break it: forbidden calls inside Graph.capture"))
    for r in rows:
        if r["detail"]:
            print(f"{r['case']}: {r['detail']}")
    bad = [r["case"] for r in rows if not healthy(r)]
    print("every capture broke loudly; streams and the other graph still work" if not bad
          else f"UNEXPECTED: {', '.join(bad)}")
    if opts.json is not None:
        from .bench.record import collect_metadata

        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps({"exercise": "break_it", "metadata": collect_metadata(),
                                         "rows": rows}, indent=1) + "\n")
        print(f"wrote {opts.json}")
    return 1 if bad else 0
