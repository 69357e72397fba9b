"""memory_cost: device memory and startup time of capturing 15 batch sizes of the `1b` model (seed exercise D).

A DecodeRunner over one `1b` DecodeModel (max_batch 256, a small KV pool of 256 tokens per row) captures
1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256 (--quick: up to 64). Reported: the driver's free
memory (cuMemGetInfo) and the graph memory pool (cuDeviceGetGraphMemAttribute) before and after, per graph
and in total, against a fresh runner capturing only the largest size; capture + instantiate time of all
sizes; and the static buffers (activations + workspaces) all graphs share, which a design with one memory
pool per graph would have paid once per size.

Targets: capture + instantiate of all sizes <= 0.5 s; memory of all sizes <= 1.2x the largest alone, where a
size's memory is the intermediates its graph needs (our shared static buffers, which the largest alone needs
too) plus the driver's memory for its graph (the drop in free memory; cuMemGetInfo moves in 2 MiB pages).

Run: ``python benchmarks/memory_cost.py [--out DIR] [--quick]``; prints a table, writes
``DIR/memory_cost.json`` and ``DIR/memory_cost.png`` (memory held as the sizes are captured, against the largest
alone and against one set of buffers per size).
"""

from __future__ import annotations

import gc
import sys
import time
from itertools import accumulate

from common import Checks, build_model, finish, no_gpu, parser, plot, verdict, write_result

from rawgraphs.bench import format_table, make_row, plot_lines
from rawgraphs.context import Stream, device
from rawgraphs.model.decode import DecodeModel
from rawgraphs.runner import DecodeRunner, graph_memory

PRESET = "1b"
SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
KV_TOKENS = 256
STATIC_BUFFERS = ("tokens", "positions", "block_tables", "x", "qkv", "attn", "gu", "logits", "attn_counters",
                  "split_counters", "next_tokens", "normed", "workspace", "part_o", "part_ml")
TARGET_S, TARGET_RATIO = 0.5, 1.2
MIB = 2**20


def capture_sizes(quick: bool) -> tuple[int, ...]:
    """The sizes captured: all 15, or those up to 64 with --quick."""
    return tuple(s for s in SIZES if not quick or s <= 64)


def static_bytes(model: DecodeModel) -> int:
    """Bytes of the model's static activation and workspace buffers (shared by every captured graph)."""
    return sum(getattr(model, name).nbytes for name in STATIC_BUFFERS)


def per_size_static_bytes(cfg, sizes) -> list[int]:
    """Static buffers of each size sized for its own batch (what a design with buffers per graph would hold)."""
    return [static_bytes(DecodeModel(cfg, None, max_batch=s, plan_only=True)) for s in sizes]


def capture(model: DecodeModel, sizes, stream: Stream) -> dict:
    """Capture ``sizes`` with a fresh runner; free-memory and graph-pool deltas, times and the runner."""
    dev = device()
    gc.collect()
    dev.synchronize()
    free0, pool0 = dev.memory_info()[0], graph_memory()
    t0 = time.perf_counter()
    runner = DecodeRunner(model, sizes, stream=stream)
    runner.capture(progress=False)
    wall = time.perf_counter() - t0
    dev.synchronize()
    free1, pool1 = dev.memory_info()[0], graph_memory()
    return {"runner": runner, "bytes": free0 - free1, "wall_s": wall,
            "pool_bytes": pool1["reserved_current"] - pool0["reserved_current"],
            "capture_instantiate_s": sum(r.capture_ms + r.instantiate_ms for r in runner.reports) / 1e3}


def release(runner: DecodeRunner) -> None:
    """Destroy a runner's graphs now."""
    for exe in runner.graphs.values():
        exe.close()
    runner.graphs.clear()
    gc.collect()


def main(argv: list[str] | None = None) -> int:
    opts = parser(__doc__).parse_args(argv)
    if no_gpu("benchmarks/memory_cost.py"):
        return 0
    t_start = time.perf_counter()
    sizes = capture_sizes(opts.quick)
    stream = Stream.create()
    checks = Checks()
    model = build_model(PRESET, sizes[-1], kv_tokens=KV_TOKENS)
    cfg = model.cfg
    for s in sizes:
        model.step_launches(s)  # plan every size before measuring (host only)
    every = capture(model, sizes, stream)
    runner = every["runner"]
    checks(sorted(runner.graphs) == list(sizes) and not runner.failures, f"all {len(sizes)} sizes captured")
    table = [{"size": r.size, "nodes": r.nodes, "capture ms": r.capture_ms, "instantiate ms": r.instantiate_ms,
              "upload ms": r.upload_ms, "device MiB": r.device_bytes / MIB,
              "graph pool MiB": r.graph_mem_reserved / MIB} for r in runner.reports]
    rows = [make_row([r.capture_ms + r.instantiate_ms], unit="ms", case="capture + instantiate", size=r.size,
                     nodes=r.nodes, upload_ms=r.upload_ms, device_bytes=r.device_bytes,
                     graph_mem_reserved=r.graph_mem_reserved) for r in runner.reports]
    release(runner)
    alone = capture(model, (sizes[-1],), stream)
    release(alone["runner"])

    table.append({"size": f"all {len(sizes)}", "nodes": sum(r["nodes"] for r in table),
                  "capture ms": sum(r["capture ms"] for r in table),
                  "instantiate ms": sum(r["instantiate ms"] for r in table),
                  "upload ms": sum(r["upload ms"] for r in table), "device MiB": every["bytes"] / MIB,
                  "graph pool MiB": every["pool_bytes"] / MIB})
    table.append({"size": f"{sizes[-1]} alone", "nodes": None, "capture ms": None, "instantiate ms": None,
                  "upload ms": None, "device MiB": alone["bytes"] / MIB, "graph pool MiB": alone["pool_bytes"] / MIB})
    print(format_table(table, ["size", "nodes", "capture ms", "instantiate ms", "upload ms", "device MiB",
                               "graph pool MiB"],
                       title=f"capturing {PRESET} decode graphs on {device().name} (device MiB: drop in free "
                             "memory; graph pool: reserved)"))
    shared = static_bytes(model)
    per_size = per_size_static_bytes(cfg, sizes)
    per_graph = sum(per_size)
    kv_token_bytes = cfg.kv_bytes_per_token()
    t_ci = every["capture_instantiate_s"]
    notes = [
        f"capture + instantiate of all {len(sizes)} sizes: {t_ci:.3f} s (wall incl. upload "
        f"{every['wall_s']:.3f} s; target <= {TARGET_S} s): {verdict(t_ci <= TARGET_S)}",
        f"static buffers (activations + workspaces) shared by every graph: {shared / MIB:.1f} MiB; one set per "
        f"size, each sized for its batch, would be {per_graph / MIB:.1f} MiB",
        f"memory of all sizes: {every['bytes'] / MIB:.1f} MiB = {every['bytes'] / kv_token_bytes:.0f} tokens of "
        f"KV cache given up ({kv_token_bytes / 1024:.0f} KiB per token)",
    ]
    # What a size costs = the intermediates its graph needs + the driver's memory for the graph. Ours live in the
    # static buffers, sized for the largest batch and shared: the largest alone needs all of them too, so they
    # count once on both sides (torch.cuda.CUDAGraph would hold them in its graph pool).
    ratio = (shared + every["bytes"]) / (shared + alone["bytes"])
    notes.append(f"memory of all sizes / largest alone, shared intermediates included on both sides: "
                 f"({shared / MIB:.1f} + {every['bytes'] / MIB:.1f}) / ({shared / MIB:.1f} + "
                 f"{alone['bytes'] / MIB:.1f}) MiB = {ratio:.2f}x (target <= {TARGET_RATIO}x): "
                 f"{verdict(ratio <= TARGET_RATIO)}")
    notes.append(f"the driver's memory for the graphs alone (cuMemGetInfo, 2 MiB pages): all sizes "
                 f"{every['bytes'] / MIB:.1f} MiB, the largest alone {alone['bytes'] / MIB:.1f} MiB (measured in the "
                 "same process after the first runner was released: memory the driver kept may read as 0 here)")
    for line in notes:
        print(line)
    rows += [make_row([every["bytes"] / MIB], unit="MiB", case=f"all {len(sizes)} sizes",
                      graph_pool_bytes=every["pool_bytes"], capture_instantiate_s=t_ci, wall_s=every["wall_s"]),
             make_row([alone["bytes"] / MIB], unit="MiB", case=f"{sizes[-1]} alone",
                      graph_pool_bytes=alone["pool_bytes"], capture_instantiate_s=alone["capture_instantiate_s"]),
             make_row([shared / MIB], unit="MiB", case="shared static buffers", per_graph_design_bytes=per_graph)]
    params = {"model": PRESET, "sizes": list(sizes), "max_batch": sizes[-1], "kv_tokens": KV_TOKENS,
              "quick": opts.quick, "memory": "drop in cuMemGetInfo free bytes across capture+instantiate+upload"}
    write_result("memory_cost", opts.out, params, rows, notes, checks)
    graphs_mib = list(accumulate(r["device MiB"] for r in table[:len(sizes)]))
    plot(lambda: plot_lines(opts.out / "memory_cost.png", list(sizes), {
        "shared buffers + graphs captured so far": [shared / MIB + g for g in graphs_mib],
        f"largest ({sizes[-1]}) alone": [(shared + alone["bytes"]) / MIB] * len(sizes),
        "one set of buffers per size + graphs": [a + g for a, g in zip(accumulate(b / MIB for b in per_size),
                                                                    graphs_mib)]},
        title=f"{PRESET}: device memory while capturing sizes 1..{sizes[-1]} ({device().name})",
        xlabel="last size captured", ylabel="MiB"))
    print(f"total {time.perf_counter() - t_start:.1f} s")
    return finish(checks)


if __name__ == "__main__":
    sys.exit(main())
