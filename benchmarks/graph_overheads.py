"""graph_overheads: what a CUDA graph costs to make, launch and update, rawgraphs against the raw binding.

Questions (issue "Graphs"), on dependent chains of 10/100/350/1000 ``axpb`` kernel nodes
(``kernels/basic.cu``):
  build      explicit ``Graph.add_kernel`` of the chain, ``Graph.capture`` of the same launches, instantiate,
             upload (wall time, ms)
  launch     host cost of one ``GraphExec.launch`` against raw ``cuGraphLaunch`` on the same exec handle
             (``--iters`` back-to-back launches timed with perf_counter, sync untimed, rounds interleaved)
  gpu        GPU time of one replay / nodes, for ``axpb`` and ``noop`` chains (CUDA events around one replay
             queued behind a ~60 us blocker kernel, so the host's launch latency is not in the span)
  set_args   per node: ``exe.set_args`` one node at a time, ``set_args_many``, ``set_args_where`` and the raw
             ``cuGraphExecKernelNodeSetParams`` with prebuilt ``CUDA_KERNEL_NODE_PARAMS`` (350 nodes), and
             ``DeviceArgUpdater.set`` on a device-updatable copy of the chain (one stream-ordered kernel applies
             the batch: host cost only, the device applies it before the next launch on that stream)
  update     ``exe.update(graph)`` of the 350 chain (ms)
  recapture  recapture + instantiate of the 350 chain against ``set_args_many`` of 64 nodes in place (ratio)

Targets: wrapper launch <= 1.2x raw cuGraphLaunch; batched set_args <= 1.0 us per node; 64 in-place updates
>= 20x faster than recapture + instantiate. Each node computes ``y = 1 * y + 1`` on 256 integer-valued floats,
so a replay of n nodes gives exactly ``x + n``; that is checked (also after set_args / the raw binding /
update) before anything is timed, and again after the timing.

Run: ``python benchmarks/graph_overheads.py [--out DIR] [--quick]``; prints one table per question, writes
``DIR/graph_overheads.json`` and ``DIR/graph_overheads.png``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from cuda.bindings import driver

from rawgraphs.bench import (
    BenchResult,
    Blocker,
    collect_metadata,
    format_table,
    make_row,
    plot_lines,
    time_gpu_queued,
    time_host,
)
from rawgraphs.context import Stream, device, gpu_available
from rawgraphs.device_update import DeviceArgUpdater
from rawgraphs.errors import check
from rawgraphs.executable import GraphExec
from rawgraphs.graph import Graph, kernel_node_params
from rawgraphs.kernel import Kernel, LaunchShape, Module
from rawgraphs.memory import DeviceBuffer

ELEMS = 256                              # elements per node: one block
SHAPE = LaunchShape((1,), (ELEMS,))      # axpb: grid = ceil(ELEMS / 256), block = 256
NOOP_SHAPE = LaunchShape((1,), (32,))
UPDATED = 64                             # nodes updated in place in the recapture comparison
TARGET_LAUNCH, TARGET_SET_ARGS, TARGET_RATIO = 1.2, 1.0, 20.0


class Chain:
    """Buffers of one ``axpb`` chain: input x and two ping-pong outputs. Node i reads x (i = 0) or
    ``bufs[i % 2]`` and writes ``bufs[(i + 1) % 2]``: every node depends on the one before it."""

    def __init__(self, axpb: Kernel, x_host: np.ndarray):
        self.axpb, self.x_host = axpb, x_host
        self.x = DeviceBuffer.from_numpy(x_host)                           # [ELEMS]
        self.bufs = [DeviceBuffer(ELEMS, np.float32) for _ in range(2)]   # [ELEMS] each

    def named(self, i: int, b: float = 1.0) -> dict:
        return {"out": self.bufs[(i + 1) % 2], "x": self.x if i == 0 else self.bufs[i % 2], "a": 1.0, "b": b,
                "n": ELEMS}

    def explicit(self, n: int, b: float = 1.0, device_updatable: bool = False) -> Graph:
        g = Graph()
        prev = None
        for i in range(n):
            prev = g.add_kernel(self.axpb, SHAPE, self.named(i, b), deps=prev)
            if device_updatable:
                g.make_device_updatable(prev)
        return g

    def captured(self, n: int, stream: Stream) -> Graph:
        with Graph.capture(stream) as g:
            for i in range(n):
                self.axpb.launch(SHAPE, self.axpb.args(**self.named(i)), stream)
        return g

    def check(self, exe: GraphExec, n: int, stream: Stream, extra: float, what: str) -> None:
        """Replay into poisoned buffers and compare with ``x + n + extra`` exactly."""
        for buf in self.bufs:
            buf.fill_bytes(0xFF, stream)  # stream-ordered: a plain memset runs on the legacy stream
        exe.launch(stream)
        stream.synchronize()
        got = self.bufs[n % 2].to_numpy()
        want = self.x_host + np.float32(n + extra)
        if not np.array_equal(got, want):
            raise AssertionError(f"self-check failed ({what}, {n} nodes): max error "
                                 f"{np.nanmax(np.abs(got - want))}")


def noop_chain(noop: Kernel, n: int) -> Graph:
    g = Graph()
    prev = None
    for _ in range(n):
        prev = g.add_kernel(noop, NOOP_SHAPE, {}, deps=prev)
    return g


def wall_ms(fn: Callable[[], object], repeats: int) -> tuple[list[float], list]:
    """Wall time of ``fn()`` in ms per call and what each call returned."""
    samples, results = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        results.append(fn())
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples, results


def close_all(*objs) -> None:
    for o in objs:
        o.close()


def measure_build(chain: Chain, n: int, stream: Stream, repeats: int) -> dict[str, list[float]]:
    """ms to build explicitly, capture, instantiate and upload an n-node chain."""
    explicit, graphs = wall_ms(lambda: chain.explicit(n), repeats)
    capture, captured = wall_ms(lambda: chain.captured(n, stream), repeats)
    inst, execs = wall_ms(graphs[0].instantiate, repeats)
    upload = []
    for exe in execs:
        exe.upload(stream)
        upload.append(exe.upload_ms)
    chain.check(execs[0], n, stream, 0, "explicit")
    exe_c = captured[0].instantiate()
    chain.check(exe_c, n, stream, 0, "captured")
    close_all(exe_c, *execs, *graphs, *captured)
    return {"explicit build": explicit, "capture": capture, "instantiate": inst, "upload": upload}


def raw_launch(exe: GraphExec, stream: Stream) -> Callable[[], None]:
    """``cuGraphLaunch`` on the executable's handle, straight through cuda.bindings."""
    launch, h, s = driver.cuGraphLaunch, exe.handle, stream.handle

    def run() -> None:
        err, = launch(h, s)
        if err:
            check((err,), "cuGraphLaunch")

    return run


def measure_launch(exe: GraphExec, n: int, stream: Stream, repeats: int) -> dict[str, list[float]]:
    """Host us per launch, wrapper and raw, in interleaved rounds; few enough launches per sample that the
    queue never fills (a full queue would turn host time into GPU time)."""
    iters = max(10, min(100, 20_000 // n))
    methods = {"GraphExec.launch": lambda: exe.launch(stream), "raw cuGraphLaunch": raw_launch(exe, stream)}
    for run in methods.values():
        time_host(run, warmup=iters, iters=iters, repeats=1, sync=stream.synchronize)
    samples = {m: [] for m in methods}
    for _ in range(repeats):
        for m, run in methods.items():
            samples[m] += time_host(run, warmup=0, iters=iters, repeats=1, sync=stream.synchronize)
    return samples


def per_node(fn: Callable[[], object], nodes: int, repeats: int) -> list[float]:
    """Host us per node of ``fn``, which updates ``nodes`` nodes once per call."""
    return [s / nodes for s in time_host(fn, warmup=3, iters=1, repeats=repeats)]


def raw_setter(exe: GraphExec, nodes: list, b: float) -> Callable[[], None]:
    """Set ``b`` on every node through the raw ``cuGraphExecKernelNodeSetParams`` binding, with one
    ``CUDA_KERNEL_NODE_PARAMS`` per node built beforehand (it points at its own copy of the node's block)."""
    blocks = [node.args.copy() for node in nodes]
    for blk in blocks:
        blk.set(b=b)
    pairs = [(node.handle, kernel_node_params(node.kernel, node.shape, blk.address))
             for node, blk in zip(nodes, blocks, strict=True)]
    setp, h = driver.cuGraphExecKernelNodeSetParams, exe.handle

    def run() -> None:
        for nh, params in pairs:
            err, = setp(h, nh, params)
            if err:
                check((err,), "cuGraphExecKernelNodeSetParams")

    run.keep_alive = blocks  # the driver reads them at every call
    return run


def self_check(chain: Chain, stream: Stream, n: int) -> None:
    """Before any timing: explicit and captured chains compute ``x + n``, and every update path (set_args,
    set_args_many, set_args_where, the raw binding, update) moves the result by exactly what it changed."""
    g = chain.explicit(n)
    exe = g.instantiate()
    chain.check(exe, n, stream, 0, "explicit chain")
    captured = chain.captured(n, stream)
    exe_c = captured.instantiate()
    chain.check(exe_c, n, stream, 0, "captured chain")
    nodes = g.nodes
    exe.set_args(nodes[5], b=3.0)  # one node adds 3 instead of 1
    chain.check(exe, n, stream, 2, "set_args on one node")
    exe.set_args_many(nodes[:UPDATED], b=2.0)
    chain.check(exe, n, stream, UPDATED, f"set_args_many on {UPDATED} nodes")
    exe.set_args_where("axpb", b=1.0)
    chain.check(exe, n, stream, 0, "set_args_where on every node")
    raw_setter(exe, nodes, 2.0)()
    chain.check(exe, n, stream, n, "raw cuGraphExecKernelNodeSetParams on every node")
    alt = chain.explicit(n, b=3.0)
    exe.update(alt)
    chain.check(exe, n, stream, 2 * n, "exe.update to a b=3 chain")
    exe.update(g)
    chain.check(exe, n, stream, 0, "exe.update back to the original chain")
    close_all(exe_c, captured, exe, g, alt)


def measure_set_args(chain: Chain, exe: GraphExec, nodes: list, stream: Stream, repeats: int) -> dict:
    """Per-node host cost of each way to rewrite the scalar ``b`` of every node (b toggles 1 <-> 2)."""
    n = len(nodes)
    raw = [raw_setter(exe, nodes, 1.0), raw_setter(exe, nodes, 2.0)]
    flip = {"i": 0}

    def toggled(fn: Callable[[float], object]) -> Callable[[], None]:
        def run() -> None:
            flip["i"] ^= 1
            fn(1.0 + flip["i"])
        return run

    def single(b: float) -> None:
        for node in nodes:
            exe.set_args(node, b=b)

    methods = {
        "set_args (one node per call)": toggled(single),
        "set_args_many": toggled(lambda b: exe.set_args_many(nodes, b=b)),
        "set_args_where": toggled(lambda b: exe.set_args_where("axpb", b=b)),
        "raw cuGraphExecKernelNodeSetParams": toggled(lambda b: raw[int(b) - 1]()),
    }
    samples = {m: per_node(fn, n, repeats) for m, fn in methods.items()}
    exe.set_args_many(nodes, b=1.0)
    chain.check(exe, n, stream, 0, "after the set_args timing")
    return samples


def measure_device_updater(chain: Chain, n: int, stream: Stream, repeats: int,
                           blocker: Blocker) -> tuple[list[float], list[float]]:
    """Per node: host us of one ``DeviceArgUpdater.set`` (the stream idle before it, so no batch in flight
    makes it wait) and GPU us of the ``apply_updates`` kernel it queues (CUDA events around it, queued behind
    ``blocker`` so the span holds the kernel and not the host's packing before it), on a device-updatable copy
    of the chain, b toggling 1 <-> 2; the results are checked before and after."""
    g = chain.explicit(n, device_updatable=True)
    exe = g.instantiate()
    up = DeviceArgUpdater(exe, g.nodes, stream)
    up.set(stream, b=2.0)
    chain.check(exe, n, stream, n, "DeviceArgUpdater.set on every node")
    flip = {"i": 0}

    def toggled() -> None:
        flip["i"] ^= 1
        up.set(stream, b=1.0 + flip["i"])

    host = []
    for i in range(repeats + 3):
        stream.synchronize()
        t0 = time.perf_counter()
        toggled()
        t1 = time.perf_counter()
        if i >= 3:
            host.append((t1 - t0) * 1e6 / n)
    hold = lambda: [blocker() for _ in range(3)]  # noqa: E731 - ~190 us: longer than set()'s host time (~50 us)
    gpu = [us / n for us in time_gpu_queued(toggled, stream, hold, repeats, warmup=3)]
    up.set(stream, b=1.0)
    chain.check(exe, n, stream, 0, "after the DeviceArgUpdater timing")
    close_all(up, exe, g)
    return host, gpu


def measure_update(chain: Chain, exe: GraphExec, n: int, stream: Stream, repeats: int) -> list[float]:
    """ms of ``exe.update(graph)``, alternating between a b=2 chain and one like the original."""
    alt, same = chain.explicit(n, b=2.0), chain.explicit(n)
    graphs = [same, alt]
    flip = {"i": 0}

    def run() -> None:
        flip["i"] ^= 1
        exe.update(graphs[flip["i"] ^ 1])

    samples = [s / 1e3 for s in time_host(run, warmup=2, iters=1, repeats=repeats)]
    exe.update(same)
    chain.check(exe, n, stream, 0, "after the update timing")
    return samples


def measure_recapture(chain: Chain, exe: GraphExec, nodes: list, stream: Stream, repeats: int) -> dict:
    """ms of capture + instantiate of the chain, and ms of ``set_args_many`` on ``UPDATED`` of its nodes."""
    n = len(nodes)

    def recapture() -> GraphExec:
        return chain.captured(n, stream).instantiate()

    recap, execs = wall_ms(recapture, repeats)
    for e in execs:
        close_all(e, e.graph)
    flip = {"i": 0}

    def in_place() -> None:
        flip["i"] ^= 1
        exe.set_args_many(nodes[:UPDATED], b=1.0 + flip["i"])

    inplace = [s / 1e3 for s in time_host(in_place, warmup=3, iters=1, repeats=repeats * 4)]
    exe.set_args_many(nodes, b=1.0)
    chain.check(exe, n, stream, 0, "after the recapture comparison")
    return {"recapture + instantiate": recap, f"set_args_many ({UPDATED} nodes)": inplace}


def med(samples: list[float]) -> float:
    return float(np.median(samples))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out"), help="folder for JSON and PNG (default ./out)")
    ap.add_argument("--quick", action="store_true", help="chains of 10/100/350 only, fewer samples")
    opts = ap.parse_args(argv)
    lengths = [10, 100, 350] if opts.quick else [10, 100, 350, 1000]
    r_build, r_launch, r_gpu, r_small = (3, 10, 10, 10) if opts.quick else (7, 30, 30, 30)
    if not gpu_available():
        print("graph_overheads needs an NVIDIA GPU and driver; none was found here.", file=sys.stderr)
        return 1
    t_start = time.perf_counter()

    dev = device()
    stream = Stream.create()
    mod = Module.from_file("basic")
    axpb, noop = mod.kernel("axpb"), mod.kernel("noop")
    x_host = np.random.default_rng(0).integers(1, 100, ELEMS).astype(np.float32)  # [ELEMS], never zero
    chain = Chain(axpb, x_host)
    blocker = Blocker(stream)

    self_check(chain, stream, 350)
    rows: list[dict] = []
    tables: dict[str, list[dict]] = {"build": [], "launch": [], "gpu": []}
    for n in lengths:
        build = measure_build(chain, n, stream, r_build)
        rows += [make_row(s, unit="ms", question="build", method=m, nodes=n) for m, s in build.items()]
        tables["build"].append({"nodes": n, **{m: med(s) for m, s in build.items()}})

        g = chain.explicit(n)
        exe = g.instantiate()
        exe.upload(stream)
        chain.check(exe, n, stream, 0, "launch")
        launch = measure_launch(exe, n, stream, r_launch)
        rows += [make_row(s, unit="us", question="launch host", method=m, nodes=n) for m, s in launch.items()]
        wrap, raw = med(launch["GraphExec.launch"]), med(launch["raw cuGraphLaunch"])
        tables["launch"].append({"nodes": n, "GraphExec.launch us": wrap, "raw cuGraphLaunch us": raw,
                                 "ratio": wrap / raw})

        gpu = {"axpb": time_gpu_queued(lambda e=exe: e.launch(stream), stream, blocker, r_gpu)}
        g_noop = noop_chain(noop, n)
        exe_noop = g_noop.instantiate()
        gpu["noop"] = time_gpu_queued(lambda e=exe_noop: e.launch(stream), stream, blocker, r_gpu)
        rows += [make_row([s / n for s in v], unit="us", question="gpu per node", method=k, nodes=n)
                 for k, v in gpu.items()]
        tables["gpu"].append({"nodes": n, "axpb us/node": med(gpu["axpb"]) / n,
                              "noop us/node": med(gpu["noop"]) / n, "axpb replay us": med(gpu["axpb"])})
        close_all(exe_noop, g_noop, exe, g)

    n = 350
    g = chain.explicit(n)
    exe = g.instantiate()
    nodes = list(g.nodes)
    chain.check(exe, n, stream, 0, "set_args graph")
    set_args = measure_set_args(chain, exe, nodes, stream, r_small)
    set_args["DeviceArgUpdater.set (device-side, stream-ordered)"], apply_gpu = measure_device_updater(
        chain, n, stream, r_small, blocker)
    rows.append(make_row(apply_gpu, unit="us", question="device-side apply per node (GPU)",
                         method="apply_updates kernel", nodes=n))
    rows += [make_row(s, unit="us", question="set_args per node", method=m, nodes=n)
             for m, s in set_args.items()]
    raw_set = med(set_args["raw cuGraphExecKernelNodeSetParams"])
    tables["set_args"] = [{"method": m, "us/node": med(s), "p10": float(np.percentile(s, 10)),
                           "p90": float(np.percentile(s, 90)), "ratio to raw": med(s) / raw_set}
                          for m, s in set_args.items()]
    upd = measure_update(chain, exe, n, stream, r_small)
    rows.append(make_row(upd, unit="ms", question="update", method="exe.update(graph)", nodes=n))
    tables["update"] = [{"nodes": n, "exe.update(graph) ms": med(upd), "per node us": med(upd) * 1e3 / n}]
    recap = measure_recapture(chain, exe, nodes, stream, max(5, r_build))
    rows += [make_row(s, unit="ms", question="recapture vs in place", method=m, nodes=n)
             for m, s in recap.items()]
    recap_ms, inplace_ms = (med(s) for s in recap.values())
    tables["recapture"] = [{"nodes": n, "recapture + instantiate ms": recap_ms,
                            f"update {UPDATED} in place ms": inplace_ms, "ratio": recap_ms / inplace_ms}]
    close_all(exe, g)

    titles = {
        "build": "build / capture / instantiate / upload of a dependent axpb chain (ms, median)",
        "launch": "host cost of one graph launch (us, median)",
        "gpu": "GPU time per node of one replay (CUDA events; us, median)",
        "set_args": f"host cost per node of rewriting one scalar on {n} nodes (us)",
        "update": "exe.update(graph) of the 350 chain (median)",
        "recapture": f"recapture + instantiate vs set_args_many on {UPDATED} of {n} nodes in place (median)",
    }
    for key, title in titles.items():
        print(format_table(tables[key], list(tables[key][0]), title=f"{title} on {dev.name}") + "\n")

    worst_launch = max(r["ratio"] for r in tables["launch"])
    batched = med(set_args["set_args_many"])
    on_device = med(set_args["DeviceArgUpdater.set (device-side, stream-ordered)"])
    ratio = recap_ms / inplace_ms
    notes = [
        (f"launch: GraphExec.launch / raw cuGraphLaunch at most {worst_launch:.2f}x over chain lengths "
         f"(target <= {TARGET_LAUNCH}x): {verdict(worst_launch <= TARGET_LAUNCH)}"),
        (f"set_args_many (host-side, immediate): {batched:.2f} us per node (target <= {TARGET_SET_ARGS} us): "
         f"{verdict(batched <= TARGET_SET_ARGS)}"),
        (f"DeviceArgUpdater.set (batched on the device, stream-ordered): {on_device:.2f} us of host time per "
         f"node (target <= {TARGET_SET_ARGS} us): {verdict(on_device <= TARGET_SET_ARGS)}; the device applies "
         f"the batch in {med(apply_gpu):.2f} us of GPU time per node"),
        (f"in place: updating {UPDATED} nodes is {ratio:.0f}x faster than recapture + instantiate of {n} "
         f"nodes (target >= {TARGET_RATIO:.0f}x): {verdict(ratio >= TARGET_RATIO)}"),
    ]
    for line in notes:
        print(line)

    params = {"lengths": lengths, "elems_per_node": ELEMS, "quick": opts.quick, "updated_nodes": UPDATED,
              "repeats": {"build": r_build, "launch": r_launch, "gpu": r_gpu, "small": r_small},
              "timers": "host perf_counter (launch loop only, sync untimed); GPU: CUDA events around one "
                        "replay queued behind a blocker kernel"}
    result = BenchResult("graph_overheads", collect_metadata(), params, rows, notes)
    print(f"wrote {result.write_json(opts.out / 'graph_overheads.json')}")
    try:
        series = {
            "GraphExec.launch host us": [r["GraphExec.launch us"] for r in tables["launch"]],
            "raw cuGraphLaunch host us": [r["raw cuGraphLaunch us"] for r in tables["launch"]],
            "GPU us/node (axpb)": [r["axpb us/node"] for r in tables["gpu"]],
            "GPU us/node (noop)": [r["noop us/node"] for r in tables["gpu"]],
        }
        png = plot_lines(opts.out / "graph_overheads.png", lengths, series, logx=True,
                         title=f"graph launch host cost and GPU time per node ({dev.name})",
                         xlabel="kernel nodes in the chain", ylabel="us (median)")
        print(f"wrote {png}")
    except ImportError:
        print("note: matplotlib is not installed (the [bench] extra): no plot", file=sys.stderr)
    print(f"total {time.perf_counter() - t_start:.1f} s")
    close_all(blocker, stream)
    return 0


if __name__ == "__main__":
    sys.exit(main())
