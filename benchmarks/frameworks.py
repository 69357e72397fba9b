"""frameworks: what does each framework charge the host for the same work?

Raw cuda.bindings, rawgraphs, CuPy, cuda.core and torch side by side, on the same cubin (``kernels/basic.cu``
``noop`` and ``axpb``, compiled once by rawgraphs.compiler) wherever a framework can load one. torch cannot: its
rows run torch's own single-kernel op on a tensor of the same size (``torch.add(x, b, out=y)``, and the
in-place ``x.add_(b)``), and the tables say so.

  eager    host us per launch (``--iters`` back-to-back launches, perf_counter, sync untimed, rounds
           interleaved): raw packed ``cuLaunchKernel``, ``Kernel.launch``, ``cupy.RawModule``,
           ``cuda.core.launch`` with a ``LaunchConfig``, torch
  graph    a dependent chain of N = 10/100/350 launches (node i reads node i-1's output): build or capture +
           instantiate (ms), host us per graph launch, GPU us per node (CUDA events around one replay queued
           behind a ~60 us blocker kernel). Routes: raw ``cuGraphAddKernelNode``, rawgraphs capture and
           explicit, ``cupy.cuda.Stream.begin_capture``/``end_capture``, cuda.core ``GraphBuilder`` (capture)
           and ``GraphDefinition`` (explicit), ``torch.cuda.CUDAGraph`` (``capture_begin``/``capture_end``)
  update   host cost per node of changing the scalar ``b`` of every node of the instantiated 350 chain:
           rawgraphs ``set_args_many``, raw ``cuGraphExecKernelNodeSetParams``, cuda.core ``graph[node].update``
           and its whole-graph route (definition ``KernelNode.update`` + ``Graph.update``); CuPy and torch have
           no public per-node update API, so their only route, recapture + instantiate, is timed

Every chain computes ``y <- a * y + b`` n times with a = 1 (so torch's add of a scalar is the same arithmetic)
on integer-valued floats: the result is exact. Each eager launch, each graph and each update is checked
against :func:`chain_reference` on poisoned (NaN) outputs before it is timed; a wrong result fails that row
loudly. A missing package (cupy, cuda.core, torch) skips its rows with a note.

Run: ``python benchmarks/frameworks.py [--out DIR] [--quick]``; prints three tables, writes
``DIR/frameworks.json`` and ``DIR/frameworks.png``.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
from common import no_gpu, parser, plot, write_result
from cuda.bindings import driver
from graph_overheads import ELEMS, NOOP_SHAPE, SHAPE, Chain, wall_ms
from launch_overhead import Case, cupy_launch, measure, raw_packed, rawgraphs_launch

from rawgraphs.bench import Blocker, format_table, make_row, summarize, time_gpu_queued, time_host
from rawgraphs.context import Stream, device
from rawgraphs.errors import check
from rawgraphs.graph import Graph
from rawgraphs.kernel import Kernel, Module
from rawgraphs.memory import DeviceBuffer

A, B, B_NEW = 1.0, 1.0, 2.0  # axpb's a and b; b of every node after an update
NODES = (10, 100, 350)
SAME_CUBIN, TORCH_KERNEL = "kernels/basic.cu cubin", "torch's own add kernel"
RAW = "raw cuda.bindings"  # the framework every ratio is taken to
F32, I32 = np.float32, np.int32


def chain_reference(x: np.ndarray, a: float, b: float, n: int) -> np.ndarray:
    """NumPy float32 result of ``n`` dependent axpb launches: ``y <- a * y + b`` (product rounded, then the
    sum: the kernel has no FMA), starting from ``y = x``."""
    y = np.asarray(x, np.float32).copy()  # [ELEMS]
    for _ in range(n):
        y = (np.float32(a) * y).astype(np.float32) + np.float32(b)
    return y


def graph_launch_iters(nodes: int) -> int:
    """Graph launches per host-timing sample: enough to average, few enough that a long chain's replays never
    fill the launch queue (a full queue turns host time into GPU time)."""
    return max(10, min(100, 20_000 // nodes))


def optional(name: str, notes: list[str]):
    """The imported module, or None with a note when it is not installed (its rows are skipped)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        notes.append(f"{name} is not installed ({e}): its rows are skipped")
        print("note: " + notes[-1], file=sys.stderr)
        return None


@dataclass
class Built:
    """An instantiated chain: ``launch()`` replays it once on the bench stream; ``nodes`` are what an update
    API addresses; ``close()`` frees it."""

    launch: Callable[[], None]
    close: Callable[[], None] = lambda: None
    nodes: list = field(default_factory=list)
    exe: object = None


@dataclass
class Route:
    """One way one framework makes the chain a graph: ``build(n, b)`` captures or builds and instantiates."""

    framework: str
    route: str
    kernel: str
    build: Callable[[int, float], Built]
    result: Callable[[int], np.ndarray]  # the chain's output on the host after n nodes (stream synchronized)
    poison: Callable[[], None]


@dataclass
class Update:
    """One framework's way to give every node of an instantiated chain a new ``b``. ``make(built, n)`` returns
    ``set_b(b)``; None when the framework has no such API (then ``recapture`` says whether rebuilding the
    graph is timed instead)."""

    framework: str
    api: str
    route: Route
    make: Callable[[Built, int], Callable[[float], None]] | None
    recapture: bool = False


@dataclass
class Framework:
    """Everything one framework contributes: eager launches ``{kernel: launch}``, chain routes, updates."""

    name: str
    kernel: str
    eager: dict[tuple[str, str], Callable[[], None]]  # (kernel, method) -> one launch
    routes: list[Route]
    updates: list[Update]
    eager_check: Callable[[Callable[[], None]], np.ndarray] | None = None  # launch once -> its output


@dataclass
class Bench:
    """What every framework shares: the stream, the cubin, the rawgraphs kernels and the chain's buffers."""

    stream: Stream
    module: Module
    axpb: Kernel
    noop: Kernel
    chain: Chain  # x [ELEMS] and two ping-pong outputs [ELEMS]; node i writes bufs[(i + 1) % 2]
    out: DeviceBuffer  # [ELEMS] output of the eager axpb
    cubin: Path
    eager_named: dict = field(init=False)

    def __post_init__(self):
        self.eager_named = {"out": self.out, "x": self.chain.x, "a": A, "b": B, "n": ELEMS}

    def poison(self) -> None:
        for buf in self.chain.bufs:
            buf.fill_bytes(0xFF, self.stream)  # NaN

    def result(self, n: int) -> np.ndarray:
        self.stream.synchronize()
        return self.chain.bufs[n % 2].to_numpy()

    def eager_out(self, launch: Callable[[], None]) -> np.ndarray:
        self.out.fill_bytes(0xFF, self.stream)
        launch()
        self.stream.synchronize()
        return self.out.to_numpy()

    def pointers(self, i: int) -> tuple[int, int]:
        """(out, x) device addresses of chain node ``i``."""
        named = self.chain.named(i)
        return int(named["out"]), int(named["x"])

    def route(self, framework: str, route: str, build: Callable[[int, float], Built]) -> Route:
        """A route over the shared chain buffers (every cubin framework)."""
        return Route(framework, route, SAME_CUBIN, build, self.result, self.poison)


# ---- the frameworks ---------------------------------------------------------------------------------------
def raw_framework(bench: Bench) -> Framework:
    """cuda.bindings alone: packed cuLaunchKernel; cuGraphCreate + cuGraphAddKernelNode + cuGraphInstantiate;
    cuGraphExecKernelNodeSetParams with parameter structs built beforehand."""
    stream, axpb = bench.stream, bench.axpb

    def node_params(i: int, b: float) -> tuple[driver.CUDA_KERNEL_NODE_PARAMS, tuple]:
        out, x = bench.pointers(i)
        slots = (ctypes.c_void_p(out), ctypes.c_void_p(x), ctypes.c_float(A), ctypes.c_float(b),
                 ctypes.c_int(ELEMS))
        block = (ctypes.c_void_p * len(slots))(*(ctypes.addressof(s) for s in slots))
        p = driver.CUDA_KERNEL_NODE_PARAMS()
        p.func = axpb.function
        p.gridDimX, p.gridDimY, p.gridDimZ = SHAPE.grid
        p.blockDimX, p.blockDimY, p.blockDimZ = SHAPE.block
        p.sharedMemBytes = 0
        p.kernelParams = ctypes.addressof(block)
        return p, (slots, block)  # the driver reads the block during the call that gets p

    def build(n: int, b: float) -> Built:
        g = check(driver.cuGraphCreate(0), "cuGraphCreate")
        nodes, prev = [], []
        for i in range(n):
            p, _keep = node_params(i, b)
            prev = [check(driver.cuGraphAddKernelNode(g, prev, len(prev), p), "cuGraphAddKernelNode")]
            nodes += prev
        exe = check(driver.cuGraphInstantiate(g, 0), "cuGraphInstantiate")
        launch_fn, h = driver.cuGraphLaunch, stream.handle

        def launch() -> None:
            err, = launch_fn(exe, h)
            if err:
                check((err,), "cuGraphLaunch")

        def close() -> None:
            check(driver.cuGraphExecDestroy(exe), "cuGraphExecDestroy")
            check(driver.cuGraphDestroy(g), "cuGraphDestroy")

        return Built(launch, close, nodes, exe)

    def setter(built: Built, n: int) -> Callable[[float], None]:
        prebuilt = {b: [node_params(i, b) for i in range(n)] for b in (B, B_NEW)}
        setp, exe = driver.cuGraphExecKernelNodeSetParams, built.exe

        def set_b(b: float) -> None:
            for node, (p, _keep) in zip(built.nodes, prebuilt[b]):
                err, = setp(exe, node, p)
                if err:
                    check((err,), "cuGraphExecKernelNodeSetParams")

        return set_b

    route = bench.route(RAW, "explicit cuGraphAddKernelNode", build)
    eager = {("noop", "raw cuLaunchKernel (packed)"): raw_packed(Case(bench.noop, NOOP_SHAPE, {}), stream),
             ("axpb", "raw cuLaunchKernel (packed)"): raw_packed(Case(axpb, SHAPE, bench.eager_named), stream)}
    return Framework(RAW, SAME_CUBIN, eager, [route],
                     [Update(RAW, "cuGraphExecKernelNodeSetParams (prebuilt params)", route,
                             setter)], bench.eager_out)


def rawgraphs_framework(bench: Bench) -> Framework:
    """rawgraphs: Kernel.launch; Graph.capture and Graph.add_kernel, instantiate; GraphExec.set_args_many."""
    stream, axpb, chain = bench.stream, bench.axpb, bench.chain

    def built(g: Graph) -> Built:
        exe = g.instantiate()

        def close() -> None:
            exe.close()
            g.close()

        return Built(lambda: exe.launch(stream), close, list(g.nodes), exe)

    def captured(n: int, b: float) -> Built:
        with Graph.capture(stream) as g:
            for i in range(n):
                axpb.launch(SHAPE, axpb.args(**chain.named(i, b)), stream)
        return built(g)

    def setter(b_: Built, n: int) -> Callable[[float], None]:
        return lambda b: b_.exe.set_args_many(b_.nodes, b=b)

    explicit = bench.route("rawgraphs", "explicit Graph.add_kernel", lambda n, b: built(chain.explicit(n, b)))
    eager = {("noop", "rawgraphs Kernel.launch"): rawgraphs_launch(Case(bench.noop, NOOP_SHAPE, {}), stream),
             ("axpb", "rawgraphs Kernel.launch"): rawgraphs_launch(Case(axpb, SHAPE, bench.eager_named), stream)}
    return Framework("rawgraphs", SAME_CUBIN, eager,
                     [bench.route("rawgraphs", "capture Graph.capture", captured), explicit],
                     [Update("rawgraphs", "GraphExec.set_args_many", explicit, setter)], bench.eager_out)


def cupy_framework(bench: Bench, cp) -> Framework:
    """CuPy: a RawModule kernel of the same cubin, launched and captured on a CuPy view of the bench stream."""
    cps = cp.cuda.Stream.from_external(bench.stream)  # the CUDA stream protocol (Stream.__cuda_stream__)
    cps.use()  # CuPy launches and captures on its current stream
    kernel = cp.RawModule(path=str(bench.cubin)).get_function("axpb")
    views = {}

    def view(ptr: int):  # a zero-copy CuPy array over a chain buffer, as a CuPy user would pass it
        if ptr not in views:
            mem = cp.cuda.UnownedMemory(ptr, ELEMS * 4, bench.chain, device_id=device().ordinal)
            views[ptr] = cp.ndarray((ELEMS,), cp.float32, cp.cuda.MemoryPointer(mem, 0))
        return views[ptr]

    def build(n: int, b: float) -> Built:
        args = [(view(o), view(x), F32(A), F32(b), I32(ELEMS)) for o, x in map(bench.pointers, range(n))]
        cps.begin_capture()
        try:
            for a in args:
                kernel(SHAPE.grid, SHAPE.block, a)
        finally:
            g = cps.end_capture()  # instantiates too: a cupy.cuda.Graph is an executable graph
        return Built(lambda: g.launch(stream=cps))

    route = bench.route("cupy", "capture begin_capture/end_capture", build)
    eager = {(k, "cupy RawModule call"): cupy_launch(c, bench.stream, bench.cubin) for k, c in
             (("noop", Case(bench.noop, NOOP_SHAPE, {})), ("axpb", Case(bench.axpb, SHAPE, bench.eager_named)))}
    return Framework("cupy", SAME_CUBIN, eager, [route],
                     [Update("cupy", "none public: recapture + instantiate", route, None, recapture=True)],
                     bench.eager_out)


def cuda_core_framework(bench: Bench, notes: list[str]) -> Framework:
    """cuda.core: ObjectCode.from_cubin kernels, launch(stream, LaunchConfig, kernel, *args), GraphBuilder and
    GraphDefinition, graph[node].update and Graph.update."""
    from cuda.core import Device, LaunchConfig, ObjectCode, launch
    from cuda.core import Stream as CoreStream
    from cuda.core.graph import Graph as CoreGraph
    from cuda.core.graph import GraphDefinition

    Device(device().ordinal).set_current()  # the primary context, the one rawgraphs uses
    code = ObjectCode.from_cubin(bench.module.program.cubin)
    k_axpb, k_noop = code.get_kernel("axpb"), code.get_kernel("noop")
    s = CoreStream.from_handle(int(bench.stream.handle))
    cfg, noop_cfg = LaunchConfig(grid=SHAPE.grid[0], block=SHAPE.block[0]), LaunchConfig(grid=1, block=32)

    def node_args(i: int, b: float) -> tuple:
        return (*bench.pointers(i), F32(A), F32(b), I32(ELEMS))

    def builder(n: int, b: float) -> Built:
        gb = s.create_graph_builder().begin_building()
        try:
            for i in range(n):
                launch(gb, cfg, k_axpb, *node_args(i, b))
        finally:
            gb.end_building()
        g = gb.complete()
        gb.close()
        return Built(lambda: g.launch(s), g.close, exe=g)

    def definition(n: int, b: float) -> Built:
        gd = GraphDefinition()
        node, nodes = gd, []
        for i in range(n):
            node = node.launch(cfg, k_axpb, *node_args(i, b))  # a node depending on the one before
            nodes.append(node)
        g = gd.instantiate()
        return Built(lambda: g.launch(s), g.close, nodes, (g, gd))

    def definition_raw_launch(n: int, b: float) -> Built:
        """The definition route's graph launched by a raw cuGraphLaunch of its handle: splits cuda.core's
        Graph.launch cost into the binding's and the driver's share."""
        built = definition(n, b)
        launch_fn, h, sh = driver.cuGraphLaunch, built.exe[0].handle, bench.stream.handle

        def raw_launch() -> None:
            err, = launch_fn(h, sh)
            if err:
                check((err,), "cuGraphLaunch")

        built.launch = raw_launch
        return built

    def per_node(built: Built, n: int) -> Callable[[float], None]:
        g, ptrs = built.exe[0], [bench.pointers(i) for i in range(n)]

        def set_b(b: float) -> None:
            for node, p in zip(built.nodes, ptrs):
                g[node].update(config=cfg, kernel=k_axpb, args=(*p, F32(A), F32(b), I32(ELEMS)))

        return set_b

    def whole(built: Built, n: int) -> Callable[[float], None]:
        (g, gd), ptrs = built.exe, [bench.pointers(i) for i in range(n)]

        def set_b(b: float) -> None:
            for node, p in zip(built.nodes, ptrs):
                node.update(args=(*p, F32(A), F32(b), I32(ELEMS)))
            g.update(gd)

        return set_b

    explicit = bench.route("cuda.core", "explicit GraphDefinition", definition)
    has_views = hasattr(CoreGraph, "__getitem__")
    if not has_views:
        notes.append("this cuda.core has no executable-node views (graph[node], new in 1.2.0): its per-node row "
                     "is empty")
    eager_args = (int(bench.out), int(bench.chain.x), F32(A), F32(B), I32(ELEMS))
    eager = {("noop", "cuda.core launch"): lambda: launch(s, noop_cfg, k_noop),
             ("axpb", "cuda.core launch"): lambda: launch(s, cfg, k_axpb, *eager_args)}
    return Framework("cuda.core", SAME_CUBIN, eager,
                     [bench.route("cuda.core", "capture GraphBuilder", builder), explicit,
                      bench.route("cuda.core", "GraphDefinition, raw cuGraphLaunch", definition_raw_launch)],
                     [Update("cuda.core", "graph[node].update", explicit, per_node if has_views else None),
                      Update("cuda.core", "KernelNode.update + Graph.update (whole graph)", explicit, whole)],
                     bench.eager_out)


def torch_framework(bench: Bench, torch) -> Framework:
    """torch: its own add-a-scalar kernel (it cannot load our cubin), eager and in a torch.cuda.CUDAGraph."""
    ext = torch.cuda.ExternalStream(int(bench.stream.handle))
    torch.cuda.set_stream(ext)  # torch launches, captures and replays on its current stream
    x = torch.from_numpy(bench.chain.x_host).to("cuda")               # [ELEMS]
    bufs = [torch.empty_like(x) for _ in range(2)]                    # [ELEMS] each, ping-pong like the chain
    out, y = torch.empty_like(x), x.clone()                           # [ELEMS], [ELEMS]
    bench.stream.synchronize()

    def src(i: int):
        return x if i == 0 else bufs[i % 2]

    def build(n: int, b: float) -> Built:
        g = torch.cuda.CUDAGraph()
        g.capture_begin()  # without torch.cuda.graph's gc.collect() and device synchronize
        try:
            for i in range(n):
                torch.add(src(i), b, out=bufs[(i + 1) % 2])
        finally:
            g.capture_end()  # instantiates too
        return Built(g.replay, g.reset)

    def poison() -> None:
        for t in bufs:
            t.fill_(float("nan"))

    def result(n: int) -> np.ndarray:
        return bufs[n % 2].cpu().numpy()

    def eager_check(launch: Callable[[], None]) -> np.ndarray:
        if launch is inplace:
            y.copy_(x)  # in place: the input is the output, so start from x (nothing to poison)
            launch()
            return y.cpu().numpy()
        out.fill_(float("nan"))
        launch()
        return out.cpu().numpy()

    def inplace() -> None:
        y.add_(B)

    route = Route("torch", "torch.cuda.CUDAGraph capture", TORCH_KERNEL, build, result, poison)
    eager = {("axpb", "torch.add(x, b, out=y)"): lambda: torch.add(x, B, out=out),
             ("axpb", "torch y.add_(b) in place"): inplace}
    return Framework("torch", TORCH_KERNEL, eager, [route],
                     [Update("torch", "none public: recapture + instantiate", route, None, recapture=True)],
                     eager_check)


# ---- measuring ----------------------------------------------------------------------------------------------
class Failures:
    """Failures that cost one row, not the run: each prints its traceback, is named at the end and makes the
    exit status 1 (never a silent skip)."""

    def __init__(self):
        self.failed: list[str] = []

    def attempt(self, what: str, fn: Callable[[], object]):
        """``fn()``, or None (recorded and printed) when it raises."""
        try:
            return fn()
        except Exception as e:  # one framework's failure must not cost the other frameworks' rows
            traceback.print_exc()
            self.failed.append(f"{what}: {type(e).__name__}: {e}")
            print(f"FAILED {self.failed[-1]} (its rows are skipped)", flush=True)
            return None


def expect(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Exact equality (integer-valued float32 and a = 1: every framework must get every bit right)."""
    if not np.array_equal(got, want):
        raise AssertionError(f"{what}: wrong result (max |error| {np.abs(got - want).max()}, "
                             f"{int(np.isnan(got).sum())} NaN of {got.size})")


def verify(route: Route, built: Built, n: int, want: np.ndarray, what: str) -> None:
    """Replay ``built`` once into poisoned buffers and compare with ``want``."""
    route.poison()
    built.launch()
    expect(route.result(n), want, f"{route.framework} {route.route}, {n} nodes, {what}")


def med(samples) -> float:
    return summarize(samples).median


def measure_eager(frameworks: list[Framework], bench: Bench, iters: int, repeats: int,
                  fails: Failures) -> tuple[list[dict], list[dict]]:
    """JSON rows and table rows of host us per eager launch, every launch checked first."""
    want = chain_reference(bench.chain.x_host, A, B, 1)
    launches, owner = {}, {}
    for fw in frameworks:
        for (kernel, method), launch in fw.eager.items():
            def check_one(fw=fw, kernel=kernel, method=method, launch=launch) -> bool:
                if kernel == "noop":  # nothing to compare: it must launch and finish without an error
                    launch()
                    bench.stream.synchronize()
                else:
                    expect(fw.eager_check(launch), want, f"eager {method}")
                return True

            if fails.attempt(f"eager {method} ({kernel})", check_one):
                launches[kernel, method], owner[kernel, method] = launch, fw
    samples = measure(launches, bench.stream, iters, repeats)
    raw = {k: med(s) for (k, m), s in samples.items() if owner[k, m].name == RAW}
    rows, table = [], []
    for (kernel, method), s in samples.items():
        fw = owner[kernel, method]
        rows.append(make_row(s, question="eager host per launch", kernel=kernel, method=method,
                             framework=fw.name, runs=fw.kernel))
        table.append({"kernel": kernel, "method": method, "runs": fw.kernel, "host us": med(s),
                      "p10": float(np.percentile(s, 10)), "p90": float(np.percentile(s, 90)),
                      "ratio to raw": med(s) / raw[kernel] if kernel in raw else None})
    return rows, table


GpuTimer = Callable[[Callable[[], None]], list[float]]  # launch -> GPU us samples of one launch


def measure_graphs(routes: list[Route], bench: Bench, counts: dict, gpu_us: GpuTimer,
                   fails: Failures) -> tuple[list[dict], list[dict]]:
    """Per chain length: build/capture + instantiate ms, host us per graph launch, GPU us per node."""
    rows, table = [], []
    for n in NODES:
        more_rows, more_table = measure_chain(routes, n, bench, counts, gpu_us, fails)
        rows += more_rows
        table += more_table
    return rows, table


def measure_chain(routes: list[Route], n: int, bench: Bench, counts: dict, gpu_us: GpuTimer,
                  fails: Failures) -> tuple[list[dict], list[dict]]:
    """:func:`measure_graphs` for chains of ``n`` nodes."""
    stream, rows, table = bench.stream, [], []
    want = chain_reference(bench.chain.x_host, A, B, n)

    def prepare(r: Route) -> tuple[Route, Built, list[float]]:
        built = r.build(n, B)  # untimed: warms up and is checked before anything is timed
        verify(r, built, n, want, "before timing")
        ms, others = wall_ms(lambda: r.build(n, B), counts["build"])
        for o in others:
            o.close()
        return r, built, ms

    live = {}
    for r in routes:
        got = fails.attempt(f"graph {r.framework} {r.route} ({n} nodes)", partial(prepare, r))
        if got:
            live[r.framework, r.route] = got
    iters = graph_launch_iters(n)
    host = {key: [] for key in live}
    for _, built, _ in live.values():
        time_host(built.launch, warmup=iters, iters=iters, repeats=1, sync=stream.synchronize)
    for _ in range(counts["rounds"]):  # interleaved rounds: slow drift touches every route alike
        for key, (_, built, _) in live.items():
            host[key] += time_host(built.launch, warmup=0, iters=iters, repeats=1, sync=stream.synchronize)
    raw_host = next((med(h) for (f, _), h in host.items() if f == RAW), None)
    for key, (r, built, build_ms) in live.items():
        gpu = [us / n for us in gpu_us(built.launch)]
        fails.attempt(f"graph {r.framework} {r.route} ({n} nodes) after timing",
                      partial(verify, r, built, n, want, "after timing"))
        built.close()
        label = {"framework": r.framework, "route": r.route, "runs": r.kernel, "nodes": n}
        rows += [make_row(build_ms, unit="ms", question="graph build + instantiate", **label),
                 make_row(host[key], unit="us", question="graph host per launch", **label),
                 make_row(gpu, unit="us", question="graph GPU per node", **label)]
        table.append({**label, "build+inst ms": med(build_ms), "host us/launch": med(host[key]),
                      "ratio to raw": med(host[key]) / raw_host if raw_host else None, "GPU us/node": med(gpu)})
    return rows, table


def measure_updates(updates: list[Update], bench: Bench, repeats: int, fails: Failures
                    ) -> tuple[list[dict], list[dict]]:
    """Host us per node of giving every node of the instantiated chain a new ``b`` (or of rebuilding it)."""
    n = NODES[-1]
    want = {b: chain_reference(bench.chain.x_host, A, b, n) for b in (B, B_NEW)}
    rows, table = [], []
    for u in updates:
        r = u.route
        if u.make is None and not u.recapture:
            table.append({"framework": u.framework, "api": u.api + ": not available", "us/node": None})
            continue

        def run(u=u, r=r) -> list[float]:
            if u.recapture:  # the only route: a new graph with the new value baked in
                first = r.build(n, B_NEW)
                verify(r, first, n, want[B_NEW], "recaptured with the new b")
                first.close()
                ms, graphs = wall_ms(lambda: r.build(n, B_NEW), repeats)
                for g in graphs:
                    g.close()
                return [m * 1e3 / n for m in ms]
            built = r.build(n, B)
            set_b = u.make(built, n)
            for b in (B_NEW, B):
                set_b(b)
                verify(r, built, n, want[b], f"{u.api} b={b}")
            flip = {"b": B}

            def toggled() -> None:
                flip["b"] = B_NEW if flip["b"] == B else B
                set_b(flip["b"])

            samples = [us / n for us in time_host(toggled, warmup=2, iters=1, repeats=repeats)]
            set_b(B)
            verify(r, built, n, want[B], f"{u.api} after timing")
            built.close()
            return samples

        samples = fails.attempt(f"update {u.framework} {u.api}", run)
        if samples:
            rows.append(make_row(samples, question="update per node", framework=u.framework, api=u.api,
                                 nodes=n))
            table.append({"framework": u.framework, "api": u.api, "us/node": med(samples),
                          f"ms for {n}": med(samples) * n / 1e3})
    raw = next((t["us/node"] for t in table if t["framework"] == RAW and t["us/node"]), None)
    for t in table:
        t["ratio to raw"] = t["us/node"] / raw if raw and t["us/node"] else None
    return rows, table


def draw(path: Path, eager: list[dict], graphs: list[dict], title: str) -> Path:
    """Two panels: host us per eager axpb-sized launch by method; host us per graph launch by route and N."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6))
    bars = [r for r in eager if r["kernel"] == "axpb"]
    left.bar(range(len(bars)), [r["host us"] for r in bars],
             yerr=[[r["host us"] - r["p10"] for r in bars], [r["p90"] - r["host us"] for r in bars]], capsize=4)
    left.set_xticks(range(len(bars)), [r["method"] for r in bars], rotation=25, ha="right", fontsize=8)
    left.set_ylabel("host us per launch (median, p10-p90)")
    left.set_title("eager launch: axpb, or torch's add")
    routes = list(dict.fromkeys(f"{r['framework']}\n{r['route']}" for r in graphs))
    host = {(f"{r['framework']}\n{r['route']}", r["nodes"]): r["host us/launch"] for r in graphs}
    width = 0.8 / len(NODES)
    for j, n in enumerate(NODES):
        right.bar(np.arange(len(routes)) + (j - (len(NODES) - 1) / 2) * width,
                  [host.get((k, n), np.nan) for k in routes], width, label=f"N = {n}")
    right.set_xticks(range(len(routes)), routes, rotation=25, ha="right", fontsize=7)
    right.set_yscale("log")  # cuda.core's launch costs up to ~40x the others
    right.set_ylabel("host us per graph launch (median, log scale)")
    right.set_title("one launch of a dependent chain of N kernel nodes")
    right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    opts = parser(__doc__).parse_args(argv)
    if no_gpu("frameworks"):
        return 0
    t_start = time.perf_counter()
    iters, repeats = (500, 10) if opts.quick else (2000, 20)
    counts = {"build": 3, "rounds": 10, "gpu": 10, "update": 10} if opts.quick else \
        {"build": 7, "rounds": 30, "gpu": 30, "update": 30}
    notes: list[str] = []
    fails = Failures()
    dev, stream = device(), Stream.create()
    module = Module.from_file("basic")
    axpb, noop = module.kernel("axpb"), module.kernel("noop")
    x_host = np.random.default_rng(0).integers(1, 100, ELEMS).astype(np.float32)  # [ELEMS], never zero
    chain, out = Chain(axpb, x_host), DeviceBuffer((ELEMS,), np.float32)          # [ELEMS] buffers
    blocker = Blocker(stream)

    with tempfile.TemporaryDirectory() as tmp:  # CuPy loads the cubin from a file
        cubin = Path(tmp) / "basic.cubin"
        cubin.write_bytes(module.program.cubin)
        bench = Bench(stream, module, axpb, noop, chain, out, cubin)
        frameworks = [raw_framework(bench), rawgraphs_framework(bench)]
        setups = {"cupy": partial(cupy_framework, bench), "torch": partial(torch_framework, bench),
                  "cuda.core": lambda _: cuda_core_framework(bench, notes)}
        for name, setup in setups.items():
            found = fails.attempt(f"import {name}", partial(optional, name, notes))
            fw = found and fails.attempt(f"{name} setup", partial(setup, found))
            if fw:
                frameworks.append(fw)
        print(f"frameworks: {', '.join(f.name for f in frameworks)} ({time.perf_counter() - t_start:.1f} s)",
              flush=True)
        eager_rows, eager = measure_eager(frameworks, bench, iters, repeats, fails)
        gpu_us = partial(time_gpu_queued, stream=stream, hold=blocker, repeats=counts["gpu"], warmup=0)
        graph_rows, graphs = measure_graphs([r for f in frameworks for r in f.routes], bench, counts, gpu_us, fails)
        update_rows, updates = measure_updates([u for f in frameworks for u in f.updates], bench,
                                               counts["update"], fails)

    n = NODES[-1]
    print(format_table(eager, ["kernel", "method", "runs", "host us", "p10", "p90", "ratio to raw"],
                       title=f"eager: host us per launch on {dev.name} ({iters} launches x {repeats} samples, "
                             "median)") + "\n")
    print(format_table(graphs, ["framework", "route", "nodes", "build+inst ms", "host us/launch", "ratio to raw",
                                "GPU us/node"],
                       title=f"graphs of a dependent chain on {dev.name} (median; ratio: host us per graph "
                             "launch / raw cuGraphLaunch)") + "\n")
    print(format_table(updates, ["framework", "api", "us/node", f"ms for {n}", "ratio to raw"],
                       title=f"update: host us per node to change b on all {n} nodes of the instantiated chain "
                             f"(median) on {dev.name}") + "\n")
    notes += [f"torch cannot load a cubin: its rows run {TORCH_KERNEL} (y = x + b) on a float32 tensor of {ELEMS} "
              f"elements; every other row runs noop or axpb from the one {SAME_CUBIN} ({ELEMS} elements, one block)",
              "CuPy and torch have no public API to change a parameter of one node of an instantiated graph: their "
              "update rows time the only route, recapture + instantiate, per node"]
    params = {"nodes": list(NODES), "elems": ELEMS, "a": A, "b": B, "b_updated": B_NEW, "quick": opts.quick,
              "eager": {"iters": iters, "repeats": repeats}, "counts": counts,
              "timers": "host: perf_counter_ns around the launch loop, sync untimed, rounds interleaved; GPU: "
                        "CUDA events around one replay queued behind a blocker kernel; build: wall time"}
    write_result("frameworks", opts.out, params, eager_rows + graph_rows + update_rows, notes + fails.failed)
    plot(lambda: draw(opts.out / "frameworks.png", eager, graphs,
                      f"host cost per launch by framework ({dev.name})"))
    for line in notes:
        print("note: " + line)
    print(f"total {time.perf_counter() - t_start:.1f} s")
    blocker.close()
    if fails.failed:
        print("FAILED (rows skipped): " + "; ".join(fails.failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
