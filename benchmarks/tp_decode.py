"""tp_decode: tensor-parallel decode step time at TP = 1, 2, 4, 8: eager vs graph, and the all-reduce share.

Models: `1b` and `8b` (Llama-3-8B-shaped: D=4096, L=32, H=32, KVH=8, F=14336, V=128256, untied), B = 1 and 8 rows
at context 512, random weights sharded at load (Megatron: column-parallel QKV and gate/up, row-parallel O and
down, one all-reduce after each), random KV history. Each TP that this machine has GPUs for runs one process
per GPU (rawgraphs.comm.run_ranks); the others are skipped with a message. On every rank:

- eager: the step's launches and NCCL calls one by one; graph: the whole step captured as one graph, its
  all-reduces inside (checked bit-identical to eager before timing);
- graph w/o all-reduce: the same step captured without its all-reduce entries (wrong numbers, same kernels):
  the all-reduce share of the step is ``1 - (graph w/o all-reduce) / graph``;
- at TP=1 also the plain model (no communicator, residual adds fused), checked bit-identical to TP=1: what the
  TP path costs on one GPU (the partial stores and add launches).

Times are CUDA-event medians on each rank (the all-reduces keep ranks in step); the table shows the slowest
rank. The floor is one rank's bytes (its weight shard, the replicated LM head, its KV heads) at the measured
copy bandwidth. Run: ``python benchmarks/tp_decode.py [--out DIR] [--quick] [--tp 1,2] [--models 1b]``.
"""

from __future__ import annotations

import gc
import sys
import time

import numpy as np
from common import (
    CONTEXT,
    Checks,
    check_same_step,
    fill_kv_random,
    finish,
    median,
    no_gpu,
    parser,
    poison_step,
    read_step,
    step_inputs,
    time_ms,
    write_result,
)

from rawgraphs.bench import format_table, make_row
from rawgraphs.bench.bandwidth import copy_bandwidth_gbs, floor_ms, step_bytes
from rawgraphs.comm import nccl_available, run_ranks
from rawgraphs.context import Stream, device
from rawgraphs.errors import check
from rawgraphs.graph import Graph
from rawgraphs.model import ModelConfig, Weights
from rawgraphs.model.decode import AllReduce, DecodeModel
from rawgraphs.model.tensor_parallel import local_config, rank_model

CONFIGS = {
    "1b": ModelConfig.preset("1b"),
    "8b": ModelConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab=128256,
                      rope_theta=500000.0, max_seq_len=8192),
}


def capture(model: DecodeModel, B: int, stream: Stream, collectives: bool = True):
    """An instantiated, uploaded graph of the step (optionally without its all-reduce entries)."""
    with Graph.capture(stream) as g:
        for ln in model.step_launches(B):
            if collectives or not isinstance(ln, AllReduce):
                ln.enqueue(stream)
    exe = g.instantiate()
    exe.upload(stream)
    return g, exe


def measure(model: DecodeModel, B: int, inputs, stream: Stream, quick: bool, checks: Checks, label: str) -> dict:
    """ms/step samples: eager, graph and (with a communicator) graph without all-reduces; plus the step's
    (tokens, logits) from the graph, checked bit-identical to eager's."""
    model.set_inputs(*inputs, stream)
    model.run_eager(B, stream)
    eager_out = read_step(model, B, stream)
    g, exe = capture(model, B, stream)
    poison_step(model, stream)
    exe.launch(stream)
    out = read_step(model, B, stream)
    check_same_step(checks, f"{label} graph vs eager", eager_out, out)
    samples = {"eager": time_ms(lambda: model.run_eager(B, stream), stream, quick),
               "graph": time_ms(lambda: exe.launch(stream), stream, quick)}
    if model.comm is not None:
        g2, bare = capture(model, B, stream, collectives=False)
        samples["graph w/o all-reduce"] = time_ms(lambda: bare.launch(stream), stream, quick)
        bare.close()
        g2.close()
        exe.launch(stream)  # leave the state of a real step behind
    stream.synchronize()
    exe.close()
    g.close()
    return {"samples": samples, "step": out}


def bench_rank(comm, name: str, batches: list[int], quick: bool) -> dict:
    """One rank's measurements of model ``name`` (runs in each rank's process)."""
    cfg, tp = CONFIGS[name], comm.size
    rng = np.random.default_rng(0)  # the same inputs on every rank
    t0 = time.perf_counter()
    weights = Weights.random(cfg, seed=0)
    model = rank_model(weights, comm, max_batch=max(batches), kv_tokens=CONTEXT + 1)
    load_s = time.perf_counter() - t0
    fill_kv_random(model, np.random.default_rng(1))
    checks, stream = Checks(), Stream.create()
    gbs = copy_bandwidth_gbs(stream)
    out = {"rank": comm.rank, "gbs": gbs, "load_s": load_s, "by_batch": {}}
    plain = DecodeModel(cfg, weights, max_batch=max(batches), kv_tokens=CONTEXT + 1) if tp == 1 else None
    del weights
    gc.collect()
    if plain is not None:
        fill_kv_random(plain, np.random.default_rng(1))  # the same KV history as the TP=1 model
    for B in batches:
        inputs = step_inputs(model, B, CONTEXT, rng)
        res = measure(model, B, inputs, stream, quick, checks, f"{name} TP={tp} rank {comm.rank} B={B}")
        if plain is not None:
            ref = measure(plain, B, inputs, stream, quick, checks, f"{name} plain B={B}")
            check_same_step(checks, f"{name} B={B}: TP=1 (NCCL path) vs plain model", ref["step"], res["step"])
            res["samples"]["plain graph"] = ref["samples"]["graph"]
            res["samples"]["plain eager"] = ref["samples"]["eager"]
        out["by_batch"][B] = res["samples"]
    out["failed"] = checks.failed
    stream.synchronize()
    return out


def rows_for(name: str, tp: int, ranks: list[dict], batches: list[int]) -> tuple[list[dict], list[dict]]:
    """Table rows (the slowest rank per quantity) and JSON rows (rank 0's samples) of one model at one TP."""
    cfg, gbs = local_config(CONFIGS[name], tp), ranks[0]["gbs"]
    table, rows = [], []
    for B in batches:
        ms = {k: max(median(r["by_batch"][B][k]) for r in ranks) for k in ranks[0]["by_batch"][B]}
        ctx = [CONTEXT + 1] * B
        floor, nbytes = floor_ms(cfg, ctx, gbs), step_bytes(cfg, ctx)
        share = 1 - ms["graph w/o all-reduce"] / ms["graph"]
        table.append({"model": name, "TP": tp, "B": B, "eager ms": ms["eager"], "graph ms": ms["graph"],
                      "speedup": ms["eager"] / ms["graph"], "w/o AR ms": ms["graph w/o all-reduce"],
                      "AR share": f"{100 * share:.1f}%", "plain graph ms": ms.get("plain graph", ""),
                      "floor ms": floor, "x floor": ms["graph"] / floor, "GB/s/rank": nbytes / ms["graph"] / 1e6})
        for mode, samples in ranks[0]["by_batch"][B].items():
            rows.append(make_row(samples, unit="ms", model=name, tp=tp, batch=B, mode=mode, floor_ms=floor,
                                 rank_step_bytes=nbytes, allreduce_share=share))
    return table, rows


def gpu_count() -> int:
    """CUDA devices visible here."""
    from cuda.bindings import driver
    device()
    return check(driver.cuDeviceGetCount(), "cuDeviceGetCount")


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--tp", default="1,2,4,8", help="tensor-parallel sizes to try (default 1,2,4,8)")
    ap.add_argument("--models", default="1b,8b", help=f"models, of {', '.join(CONFIGS)} (default 1b,8b)")
    opts = ap.parse_args(argv)
    if no_gpu("benchmarks/tp_decode.py"):
        return 0
    if not nccl_available():
        print("benchmarks/tp_decode.py needs NCCL (pip install 'rawgraphs[tp]'); nothing was measured.")
        return 0
    t_start = time.perf_counter()
    n_gpus = gpu_count()
    sizes = [int(t) for t in opts.tp.split(",")]
    models = opts.models.split(",")
    batches = [1] if opts.quick else [1, 8]
    skipped = [tp for tp in sizes if tp > n_gpus]
    for tp in skipped:
        print(f"TP={tp}: skipped, this machine has {n_gpus} GPU(s)")
    columns = ["model", "TP", "B", "eager ms", "graph ms", "speedup", "w/o AR ms", "AR share", "plain graph ms",
               "floor ms", "x floor", "GB/s/rank"]
    table, rows, failed, loads, device_name = [], [], [], {}, device().name
    for name in models:
        for tp in [t for t in sizes if t <= n_gpus]:
            t0 = time.perf_counter()
            ranks = run_ranks(bench_rank, tp, name, batches, opts.quick)
            loads[f"{name} TP={tp}"] = (ranks[0]["load_s"], time.perf_counter() - t0)
            failed += [f for r in ranks for f in r["failed"]]
            t, r = rows_for(name, tp, ranks, batches)
            table += t
            rows += r
            print(format_table(t, columns), flush=True)  # as it comes: a long run still shows the first models
    if not table:
        print("no TP size fits this machine: nothing was measured")
        return 0
    print(format_table(table, columns, title=f"tensor-parallel decode step at context {CONTEXT} on {n_gpus} x "
                                             f"{device_name} (slowest rank; floor: one rank's bytes)"))
    notes = [f"context {CONTEXT}; AR share = 1 - (graph without its all-reduce entries) / graph",
             "plain graph ms: the same weights without a communicator (fused residual adds), TP=1 only",
             *(f"{k}: weights made and loaded in {a:.1f} s, whole run {b:.1f} s" for k, (a, b) in loads.items()),
             *(f"TP={tp} skipped: {n_gpus} GPU(s) here" for tp in skipped)]
    params = {"models": models, "tp": sizes, "batches": batches, "context": CONTEXT, "quick": opts.quick,
              "configs": {m: CONFIGS[m].to_hf() for m in models},
              "timer": "CUDA events over back-to-back steps on each rank, median; table: slowest rank"}
    checks = Checks()  # the ranks' failed checks (each rank printed its own)
    for f in failed:
        checks(False, f)
    write_result("tp_decode", opts.out, params, rows, notes, checks)
    print(f"total {time.perf_counter() - t_start:.1f} s")
    return finish(checks)


if __name__ == "__main__":
    sys.exit(main())
