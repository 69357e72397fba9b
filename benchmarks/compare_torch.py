"""compare_torch: rawgraphs' decode step against the same model in plain PyTorch (eager, CUDAGraph, torch.compile).

Same seeded weights (``Weights.random(cfg, seed)``), same prompts, same process and CUDA context. For each model
(``small``, ``1b``) and batch (1, 8, 64; ``--quick``: ``small`` at 1, 8):

  tokens   the twin check with forced inputs. rawgraphs (captured graph on a ``DecodeModel``) decodes 32 new
           tokens after a 6-token prompt running free (greedy, its own tokens); ``TorchDecoder``'s
           ``torch.cuda.CUDAGraph`` is fed rawgraphs' tokens at every step (same prompt, positions and inputs),
           so the two are compared on identical inputs at every step (fp32 logits [B, V] of both kept).
           The noise bound ``tau`` does not depend on the twin: rawgraphs against itself with other kernels,
           the largest |logit difference| of row 0 (the same prompt at every B) between this B and B=1 fed
           the same tokens (at B=1: against B=8). Verdict, per model and B (``agreement.forced_verdict``):
           PASS iff (a) max |twin - rawgraphs logits| <= 2 tau over every step, row and token, and (b) every
           new token the twin decides differently from rawgraphs (argmax, lowest index on ties) is a near-tie:
           rawgraphs' margin logits_rg[tok_rg] - logits_rg[tok_twin] <= 2 tau. Printed as "twin tokens (forced
           inputs) ... PASS/MISS" with tau, the twin's max difference, the disagreements of the 32 x B
           decisions and their largest margin.
           Why not literal free-running equality: these random-weight models are chaotic (logit std 1 over
           32000 tokens, top-2 gaps often < 0.01, one changed bf16 rounding grows to ~0.07 in the logits);
           rawgraphs against itself (row 0 at B=8 vs B=1) agrees for only 19 of 32 free-running steps on
           ``small``. The free-running agreement (both running free: steps all rows agree, rows agreeing on all
           32, first difference and its margins, and rawgraphs' own row 0 against B=1) is still printed, for
           information. Torch eager against torch graph must agree exactly: that is a self-check (exit code 1
           if not).
  time     GPU time per step (CUDA events: ``time_gpu`` for rawgraphs, ``torch.cuda.Event`` for torch), host time
           per step (enqueue cost), capture time and graph memory, for rawgraphs eager / graph, torch eager /
           CUDAGraph, and torch.compile(mode="reduce-overhead") for ``1b`` at B=1 when it compiles within 120 s
           (not with ``--quick``). torch.compile runs in a child process of its own (same weights, prompt and
           buffer sizes; its tokens are checked against a torch CUDAGraph in that process): in this process, after
           the ``small`` model's run, its first torch eager step after the 1b compile hit an illegal address,
           while 1b alone, torch alone, or CUDA_LAUNCH_BLOCKING=1 ran clean (benchmarks/diagnostics/, session 3).

Two PyTorch twins are timed. ``TorchDecoder`` (the exact twin, token-checked) rounds where the kernels round, which
costs it fp32 residual products, logits and attention and cuBLAS without reduced-precision split-K;
``PlainTorchDecoder`` (rawgraphs/compare/plain_twin.py) is the same model as a PyTorch user writes it with torch's
defaults (bf16 addmm, SDPA, bf16 SwiGLU and LM head). Target: rawgraphs graph step <= 0.25x the plain twin's
``torch.cuda.CUDAGraph`` step at B=1 on ``1b`` (PASS/MISS; the ratio to the exact twin's graph is printed beside it,
the verdict of sessions 7-22).
Timing runs at the context the generation left (prompt + 31 tokens); torch attends over its whole static cache
(48 slots, masked) as gpt-fast does, rawgraphs over the live context only.

Run: ``python benchmarks/compare_torch.py [--out DIR] [--quick | --tokens] [--no-compile] [--seed N]``
(``--tokens``: the token check only, ``small`` and ``1b`` at B = 1, 8, 64, no timing); prints two tables, writes
``DIR/compare_torch.json`` and ``DIR/compare_torch_<model>.png``.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

from rawgraphs.bench import BenchResult, collect_metadata, format_table, make_row, plot_bars, time_gpu, time_host
from rawgraphs.bench.stats import summarize
from rawgraphs.compare import PlainTorchDecoder, TorchDecoder, match_length, time_torch
from rawgraphs.compare.agreement import (
    ForcedVerdict,
    first_divergence,
    forced_verdict,
    prefix_lengths,
    row_noise,
    run_forced,
    same_input_logit_diff,
)
from rawgraphs.context import Stream, device, gpu_available
from rawgraphs.model import ModelConfig, Weights, make_block_tables
from rawgraphs.model.blocks import BLOCK_SIZE
from rawgraphs.model.decode import DecodeModel
from rawgraphs.model.generate import generate, model_step, step_runner

PROMPT = [1, 10, 100, 200, 300, 400]
N_NEW = 32
MAX_LEN = 48  # torch cache slots: prompt - 1 + N_NEW = 37 rounded up to 16
REF_B = 8  # the batch size rawgraphs at B=1 is compared with for tau
TARGET = 0.25
PLAIN = "torch CUDAGraph, plain twin"  # PlainTorchDecoder's graph: the target's baseline
COMPILE_BUDGET_S = 120.0  # the compile child gets this + 60 s: well inside the suite's 420 s per benchmark
TIMING = {"warmup": 3, "iters": 10, "repeats": 10}
HOST = {"warmup": 2, "iters": 3, "repeats": 10}


def prompts_for(cfg: ModelConfig, B: int) -> list[list[int]]:
    """A distinct 6-token prompt per row (as ``rawgraphs demo``)."""
    return [[(t + 7 * b) % cfg.vocab for t in PROMPT] for b in range(B)]


def row0(tokens: list[list[int]], logits: list) -> tuple[list[list[int]], list]:
    """Row 0 of a generation: its tokens and its logits ``[1, V]`` per step."""
    return tokens[:1], [lg[:1] for lg in logits]


def self_floor(base: tuple[list[list[int]], list], tokens: list[list[int]], logits: list) -> tuple[int, float]:
    """Row 0 at this batch size against row 0 at B=1 (``base``): steps agreeing, max same-input logit diff."""
    t0, l0 = row0(tokens, logits)
    return prefix_lengths(base[0], t0)[0], same_input_logit_diff(base[0], t0, base[1], l0, len(PROMPT))


def rg_logits_step(rg: DecodeModel, B: int, stream: Stream):
    """rawgraphs' eager step for ``B`` rows as (tokens [B], positions [B]) -> fp32 logits [B, V]; row ``b``
    keeps its KV cache in blocks ``b * nb .. (b + 1) * nb - 1``. Eager launches are the kernels its graph
    replays, so the numbers are those of the graph at this ``B``."""
    nb = -(-MAX_LEN // BLOCK_SIZE)
    tables = make_block_tables([list(range(b * nb, (b + 1) * nb)) for b in range(B)], rg.max_blocks)
    step = model_step(rg, B, stream, "eager")

    def logits(tokens, positions):
        step(tokens, positions, tables)  # waits for the stream
        return rg.read_logits(B).copy()

    return logits


def twin_logits_step(tm: TorchDecoder, B: int):
    """The twin's CUDAGraph step for ``B`` rows as (tokens [B], positions [B]) -> fp32 logits [B, V]."""

    def logits(tokens, positions):
        tm.step_graph(tokens, positions)
        return tm.read_logits(B)

    return logits


def forced_check(rg: DecodeModel, tm: TorchDecoder, stream: Stream, prompts: list[list[int]],
                 rg_tokens: list[list[int]], rg_logits: list) -> ForcedVerdict:
    """The forced-input twin check of one batch: the twin fed rawgraphs' tokens, judged against ``tau`` =
    rawgraphs' row 0 at this B against rawgraphs at B=1 (at B=1: at ``REF_B``) on the same tokens."""
    B = len(prompts)
    twin = run_forced(twin_logits_step(tm, B), prompts, rg_tokens, N_NEW)  # [B, V] per step
    ref_b = REF_B if B == 1 else 1
    forced = [rg_tokens[0]] + [None] * (ref_b - 1)  # the other rows of the REF_B run decode freely
    ref = run_forced(rg_logits_step(rg, ref_b, stream), prompts_for(rg.cfg, ref_b), forced, N_NEW)
    return forced_verdict(rg_tokens, rg_logits, twin, row_noise(rg_logits, ref), len(PROMPT))


def check_tokens(model: str, rg: DecodeModel, tm: TorchDecoder, B: int, stream: Stream, dev,
                 base: dict) -> dict:
    """Generate with rawgraphs (captured graph), torch eager and torch graph; capture costs of both graphs.
    ``base`` holds row 0 of the B=1 runs (filled when B == 1) for the self-agreement floor."""
    import torch

    ps = prompts_for(rg.cfg, B)
    rg.step_launches(B)  # argument packing, the analogue of torch's warm-up: not capture time
    stream.synchronize()
    free0 = dev.memory_info()[0]
    t0 = time.perf_counter()
    rg_graph = step_runner(rg, B, stream, "capture")  # capture + instantiate + upload
    stream.synchronize()
    rg_capture_s, rg_mem = time.perf_counter() - t0, free0 - dev.memory_info()[0]
    rg_gen = generate(rg, ps, N_NEW, step=model_step(rg, B, stream, run=rg_graph), keep_logits=True)
    rg_tokens = rg_gen.tokens
    t_eager = tm.generate(ps, N_NEW, "eager")
    t_logits: list = []
    t_graph = tm.generate(ps, N_NEW, "graph", logits=t_logits)  # captures on first use
    torch.cuda.synchronize()
    stats = tm.capture_stats[B]
    match = match_length(rg_tokens, t_graph)
    lengths = prefix_lengths(rg_tokens, t_graph)
    div = first_divergence(rg_tokens, t_graph, rg_gen.logits, t_logits, len(PROMPT))
    if B == 1:
        base["rg"], base["torch"] = row0(rg_tokens, rg_gen.logits), row0(t_graph, t_logits)
    rg_self, rg_self_dl = self_floor(base["rg"], rg_tokens, rg_gen.logits) if base else (None, None)
    t_self, t_self_dl = self_floor(base["torch"], t_graph, t_logits) if base else (None, None)
    verdict = forced_check(rg, tm, stream, ps, rg_tokens, rg_gen.logits)
    return {"model": model, "batch": B, "verdict": verdict, "forced": "PASS" if verdict.passed else "MISS",
            "tau": f"{verdict.tau:.3g}", "bound": f"{verdict.bound:.3g}", "twin_dlogit": f"{verdict.max_diff:.3g}",
            "disagree": f"{verdict.disagreements}/{verdict.decisions}", "worst_margin": f"{verdict.worst_margin:.3g}",
            "rg_vs_torch": match, "rows_equal": sum(n == N_NEW for n in lengths),
            "mean_prefix": sum(lengths) / B,
            "first_diff": None if div is None else f"{div.step} (row {div.row})",
            "margins": None if div is None else f"{div.margin_a:.3g} / {div.margin_b:.3g}",
            "divergence": None if div is None else vars(div),
            "dlogit": same_input_logit_diff(rg_tokens, t_graph, rg_gen.logits, t_logits, len(PROMPT)),
            "logit_std": float(rg_gen.logits[len(PROMPT) - 1].std()),
            "rg_row0_vs_b1": rg_self, "rg_row0_dlogit": rg_self_dl,
            "torch_row0_vs_b1": t_self, "torch_row0_dlogit": t_self_dl,
            "torch_eager_vs_graph": match_length(t_eager, t_graph), "steps": N_NEW,
            "rg_graph": rg_graph, "rg_capture_ms": rg_capture_s * 1e3, "rg_graph_mib": rg_mem / 2**20,
            "torch_capture_ms": stats.seconds * 1e3, "torch_graph_mib": stats.reserved / 2**20,
            "torch_graph_alloc_mib": stats.allocated / 2**20}


def compile_child(spec: str) -> int:
    """``--compile-child MODEL,B,MAX_BATCH,SEED``: torch.compile of the twin alone in this process; prints one JSON
    line: the compile message and, when it compiled, compile ms, tokens matching torch CUDAGraph, GPU and host
    us samples."""
    import torch

    model, B, max_batch, seed = spec.split(",")
    B, cfg = int(B), ModelConfig.preset(model)
    weights = Weights.random(cfg, int(seed))
    tm = TorchDecoder(cfg, weights, int(max_batch), MAX_LEN)
    del weights
    ps = prompts_for(cfg, B)
    t_graph = tm.generate(ps, N_NEW, "graph")
    t0 = time.perf_counter()
    fn, message = tm.try_compile(B, COMPILE_BUDGET_S)
    out = {"message": message, "compile_ms": (time.perf_counter() - t0) * 1e3}
    if fn is not None:
        out["tokens_match"] = match_length(tm.generate(ps, N_NEW, "compile"), t_graph)
        out["gpu"] = time_torch(fn, **TIMING)
        out["host"] = time_host(fn, sync=torch.cuda.synchronize, **HOST)
        torch.cuda.synchronize()
    print(json.dumps(out))
    return 0


def compile_in_child(model: str, B: int, max_batch: int, seed: int) -> dict:
    """Run :func:`compile_child` in a process of its own; its JSON, or ``{"message": why it failed}``."""
    cmd = [sys.executable, __file__, "--compile-child", f"{model},{B},{max_batch},{seed}"]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_BUDGET_S + 60)
    except subprocess.TimeoutExpired:
        return {"message": f"torch.compile child ran past {COMPILE_BUDGET_S + 60:.0f} s: left out"}
    lines = run.stdout.strip().splitlines()
    if run.returncode or not lines or not lines[-1].startswith("{"):
        tail = " | ".join((run.stdout + run.stderr).strip().splitlines()[-3:])
        return {"message": f"torch.compile child failed (exit {run.returncode}): {tail}"}
    return json.loads(lines[-1])


def time_case(model: str, rg: DecodeModel, tm: TorchDecoder, plain: PlainTorchDecoder, B: int, stream: Stream,
              check: dict, compile_seed: int | None, notes: list[str]) -> list[dict]:
    """Rows of GPU time per step (raw samples) with host time, capture time and graph memory; the plain twin
    captured here on the exact twin's last inputs; with ``compile_seed``, also torch.compile's, measured in a
    child process."""
    import torch

    plain._set_inputs(tm.tokens[:B].cpu().numpy(), tm.positions[:B].cpu().numpy())
    plain_stats = plain.capture(B)
    rg_eager = step_runner(rg, B, stream, "eager")
    methods = [("rawgraphs eager", rg_eager, "rg", None, None),
               ("rawgraphs graph", check["rg_graph"], "rg", check["rg_capture_ms"], check["rg_graph_mib"]),
               ("torch eager", tm.runner(B, "eager"), "torch", None, None),
               ("torch CUDAGraph", tm.runner(B, "graph"), "torch", check["torch_capture_ms"],
                check["torch_graph_mib"]),
               (PLAIN, plain.runner(B, "graph"), "torch", plain_stats.seconds * 1e3, plain_stats.reserved / 2**20)]
    compiled = []  # torch.compile's row, last
    if compile_seed is not None:
        child = compile_in_child(model, B, tm.max_batch, compile_seed)
        notes.append(f"{model} B={B}: {child['message']} (in a process of its own)")
        print(notes[-1], flush=True)
        if "gpu" in child:
            notes.append(f"{model} B={B}: torch.compile tokens match torch CUDAGraph for "
                         f"{child['tokens_match']}/{N_NEW} steps")
            compiled.append(make_row(child["gpu"], "us", model=model, method="torch.compile", batch=B,
                                     host_us=summarize(child["host"]).median, capture_ms=child["compile_ms"],
                                     graph_mib=None))
    rows = []
    for name, fn, side, capture_ms, mib in methods:
        if side == "rg":
            gpu = time_gpu(fn, stream, **TIMING)
            host = time_host(fn, sync=stream.synchronize, **HOST)
        else:
            gpu = time_torch(fn, **TIMING)
            host = time_host(fn, sync=torch.cuda.synchronize, **HOST)
        try:  # an asynchronous fault surfaces at the next sync: name the method that ran before it
            torch.cuda.synchronize()
        except Exception as e:
            raise RuntimeError(f"{model} B={B}: the device failed while timing {name!r} ({e})") from e
        rows.append(make_row(gpu, "us", model=model, method=name, batch=B,
                             host_us=summarize(host).median, capture_ms=capture_ms, graph_mib=mib))
    rows += compiled
    base = next(r["summary"]["median"] for r in rows if r["method"] == "torch CUDAGraph")
    plain_base = next(r["summary"]["median"] for r in rows if r["method"] == PLAIN)
    for r in rows:
        r["x_torch_graph"] = r["summary"]["median"] / base
        r["x_plain_graph"] = r["summary"]["median"] / plain_base
    return rows


def run_model(model: str, batches: tuple[int, ...], seed: int, try_compile: bool, timing: bool, stream: Stream,
              dev, notes: list[str]) -> tuple[list[dict], list[dict]]:
    """Token checks (and, with ``timing``, timing rows) of one model at every batch size; ``try_compile``:
    also torch.compile at 1b B=1."""
    import torch

    cfg = ModelConfig.preset(model)
    t0 = time.perf_counter()
    weights = Weights.random(cfg, seed)
    rg = DecodeModel(cfg, weights, max_batch=max(batches), kv_tokens=MAX_LEN)
    tm = TorchDecoder(cfg, weights, max(batches), MAX_LEN)
    plain = PlainTorchDecoder(cfg, weights, max(batches), MAX_LEN) if timing else None
    del weights
    notes.append(f"{model}: torch matmul flags {tm.matmul_flags} (TorchDecoder: fp32 accumulation as the kernels)"
                 + (f"; plain twin (the target's baseline): {plain.matmul_flags}, SDPA with a boolean mask"
                    if plain else ""))
    if not tm.fp32_mm:
        notes.append("torch.mm(out_dtype=float32) is missing: torch multiplies fp32 copies of the LM head, w_o and "
                     "w_down (slower; its timings are not comparable)")
    print(f"{model}: D={cfg.dim} L={cfg.n_layers} H={cfg.n_heads} F={cfg.ffn_dim} V={cfg.vocab}; "
          f"weights + both models ready in {time.perf_counter() - t0:.1f} s", flush=True)
    checks, rows, base = [], [], {}
    for B in batches:
        check = check_tokens(model, rg, tm, B, stream, dev, base)
        checks.append(check)
        line = "  " + check["verdict"].line(f"{model} B={B}")
        if timing:
            compile_seed = seed if try_compile and model == "1b" and B == 1 else None
            rows += time_case(model, rg, tm, plain, B, stream, check, compile_seed, notes)
            med = {r["method"]: r["summary"]["median"] for r in rows if r["batch"] == B}
            line += (f"; step us: rawgraphs graph {med['rawgraphs graph']:.1f}, "
                     f"torch CUDAGraph {med['torch CUDAGraph']:.1f} (exact twin), {med[PLAIN]:.1f} (plain twin)")
        print(line, flush=True)
    for check in checks:
        del check["rg_graph"]
    del rg, tm, plain
    gc.collect()
    torch.cuda.empty_cache()
    return checks, rows


def target_line(rows: list[dict]) -> str:
    """PASS/MISS of rawgraphs graph <= TARGET x the plain twin's CUDAGraph at B=1 on 1b (the exact twin's beside)."""
    med = {r["method"]: r["summary"]["median"] for r in rows if r["model"] == "1b" and r["batch"] == 1}
    if not med:
        return "target (1b, B=1): not measured (--quick runs small only; --tokens times nothing)"
    rg, plain, exact = med["rawgraphs graph"], med[PLAIN], med["torch CUDAGraph"]
    verdict = "PASS" if rg / plain <= TARGET else "MISS"
    return (f"target rawgraphs graph <= {TARGET}x torch CUDAGraph (plain twin) at B=1 on 1b: {verdict} "
            f"({rg:.1f} us vs {plain:.1f} us = {rg / plain:.3f}x; the exact twin's graph {exact:.1f} us: "
            f"{rg / exact:.3f}x)")


def plot(out: Path, model: str, rows: list[dict]) -> Path:
    """Bars of the median step time (p10/p90 whiskers) of every method and batch of one model."""
    mine = [r for r in rows if r["model"] == model]
    return plot_bars(out / f"compare_torch_{model}.png", [f"B={r['batch']} {r['method']}" for r in mine],
                     [r["summary"]["median"] for r in mine], low=[r["summary"]["p10"] for r in mine],
                     high=[r["summary"]["p90"] for r in mine], ylabel="GPU us per decode step",
                     title=f"{model}: rawgraphs vs PyTorch decode step")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results", help="folder for compare_torch.json and the PNGs")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small only, B=1 and 8, no torch.compile")
    mode.add_argument("--tokens", action="store_true", help="token check only: small and 1b at B=1, 8, 64")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (its compile can take minutes)")
    ap.add_argument("--compile-child", metavar="MODEL,B,MAX_BATCH,SEED", help=argparse.SUPPRESS)  # see compile_child
    args = ap.parse_args(argv)
    if args.compile_child:
        return compile_child(args.compile_child)
    if importlib.util.find_spec("torch") is None or not gpu_available():
        print("compare_torch needs torch and an NVIDIA GPU; this machine lacks one of them, so nothing ran.")
        return 0
    dev = device()  # the primary context first: torch's tensors are created in it afterwards
    import torch

    if not torch.cuda.is_available():
        print("compare_torch needs torch built with CUDA; torch.cuda.is_available() is False, so nothing ran.")
        return 0
    out = Path(args.out)
    models, batches = (("small",), (1, 8)) if args.quick else (("small", "1b"), (1, 8, 64))
    notes: list[str] = []
    checks, rows = [], []
    t0 = time.perf_counter()
    with Stream.create() as stream:
        for model in models:
            c, r = run_model(model, batches, args.seed, not (args.quick or args.no_compile), not args.tokens,
                             stream, dev, notes)
            checks += c
            rows += r
    print()
    print(format_table(checks, ["model", "batch", ("tau", "tau (rg vs rg)"), ("bound", "2 tau"),
                                ("twin_dlogit", "twin max |dlogit|"),
                                ("disagree", "decisions differing"), ("worst_margin", "largest rg margin"),
                                ("forced", "verdict (<= 2 tau)"), ("torch_eager_vs_graph", "torch eager=graph")],
                       title=f"twin tokens, forced inputs: torch fed rawgraphs' {N_NEW} greedy tokens after a "
                             f"{len(PROMPT)}-token prompt"))
    print()
    print(format_table(checks, ["model", "batch", ("rg_vs_torch", "rawgraphs=torch steps"),
                                ("rows_equal", f"rows {N_NEW}/{N_NEW}"), ("mean_prefix", "mean steps/row"),
                                ("first_diff", "first diff"), ("margins", "margins rg / torch"),
                                ("dlogit", "max |dlogit| same inputs"), ("logit_std", "logit std"),
                                ("rg_row0_vs_b1", "rg row0 = rg B=1"), ("rg_row0_dlogit", "its |dlogit|"),
                                ("torch_row0_vs_b1", "torch row0 = torch B=1"), "steps"],
                       title=f"for information: greedy tokens, {N_NEW} steps after a {len(PROMPT)}-token prompt, "
                             f"both running free"))
    if rows:
        print()
        print(format_table(rows, ["model", "batch", "method", ("summary.median", "GPU us/step"),
                              ("summary.p10", "p10"), ("summary.p90", "p90"), ("host_us", "host us/step"),
                              ("capture_ms", "capture/compile ms"), ("graph_mib", "graph MiB"),
                              ("x_torch_graph", "x torch graph"), ("x_plain_graph", "x plain graph")],
                           title="decode step (graph MiB: rawgraphs free-memory drop; torch graph pool reserved)"))
    target = target_line(rows)
    verdicts = [c["verdict"].line(f"{c['model']} B={c['batch']}") for c in checks]
    print()
    print(target)
    print("\n".join(verdicts))
    broken = [c for c in checks if c["torch_eager_vs_graph"] != N_NEW]
    for c in checks:
        if c["rg_vs_torch"] != N_NEW:
            notes.append(f"{c['model']} B={c['batch']}: running free, rawgraphs and torch tokens agree for the first "
                         f"{c['rg_vs_torch']} of {N_NEW} steps in every row ({c['rows_equal']}/{c['batch']} rows "
                         f"agree on all); first difference at new token {c['first_diff']} with logit margins "
                         f"{c['margins']} (rawgraphs / torch) against a same-input logit difference up to "
                         f"{c['dlogit']:.3g}")
    printed = len(notes)  # the notes after these were printed above
    notes += [target] + verdicts
    notes += [f"self-check FAILED (numbers may be wrong): torch eager and CUDAGraph tokens differ for {c['model']} "
              f"B={c['batch']}" for c in broken]
    for c in checks:
        c["forced_check"] = {**vars(c["verdict"]), "passed": c["verdict"].passed}
    keep = ("model", "batch", "forced_check", "rg_vs_torch", "rows_equal", "mean_prefix", "divergence", "dlogit",
            "logit_std", "rg_row0_vs_b1", "rg_row0_dlogit", "torch_row0_vs_b1", "torch_row0_dlogit",
            "torch_eager_vs_graph", "steps", "rg_capture_ms", "rg_graph_mib", "torch_capture_ms", "torch_graph_mib",
            "torch_graph_alloc_mib")
    result = BenchResult("compare_torch", collect_metadata(import_torch=True),
                         params={"quick": args.quick, "tokens_only": args.tokens, "seed": args.seed,
                                 "prompt": PROMPT, "n_new": N_NEW, "torch_max_len": MAX_LEN, "timing": TIMING,
                                 "host_timing": HOST,
                                 "tokens": [{k: c[k] for k in keep} for c in checks]},
                         rows=rows, notes=notes)
    paths = [result.write_json(out / "compare_torch.json")]
    try:
        paths += [plot(out, m, rows) for m in models if rows]
    except ImportError as e:  # matplotlib is the optional [bench] extra
        print(f"no PNG: {e}")
    print(f"wrote {', '.join(str(p) for p in paths)} in {time.perf_counter() - t0:.0f} s")
    for n in notes[:printed]:
        print("note:", n)
    if broken:
        print(f"SELF-CHECK FAILED: torch eager and torch CUDAGraph tokens differ for "
              f"{[(c['model'], c['batch']) for c in broken]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
