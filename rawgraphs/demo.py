"""``python -m rawgraphs demo``: the main job. Decode with eager launches, a captured graph, an explicit graph and
the batch-size runner, check they agree, and show what each step costs against the bandwidth floor; ``--update``,
``--loop N`` and ``--tp N`` add the in-place update demo, the on-device loop and tensor parallelism.

Without a GPU it says so, compiles the kernels and prints the plan of the step (what would launch).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from .bench.bandwidth import copy_bandwidth_gbs, floor_ms, step_bytes
from .bench.report import format_table
from .bench.stats import summarize
from .bench.timing import time_gpu, time_host
from .context import Stream, gpu_available
from .model import ModelConfig, Weights
from .model.blocks import BlockAllocator, make_block_tables
from .model.decode import AllReduce, DecodeModel, PlanCommunicator
from .model.generate import MODES, generate, model_step, step_runner
from .model.loop import DeviceLoop
from .model.resident import ResidentLoop
from .model.tensor_parallel import DecodeJob, decode_rank, local_config
from .runner import DEFAULT_CAPTURE_SIZES, DecodeRunner, pick_size

NOMINAL_GBS = 4270.0  # H200 copy bandwidth measured here (read + write); used only for the GPU-less plan


def _at_least(minimum: int):
    """An argparse type: an int >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="small", help="tiny | small | 1b, or a folder with an HF Llama "
                   "config.json + *.safetensors (default: small, seeded random weights)")
    p.add_argument("--prompt-ids", default="1,10,100,200,300,400", help="comma-separated prompt token ids")
    p.add_argument("--tokens", type=_at_least(1), default=32, help="tokens to generate per sequence (default 32)")
    p.add_argument("--batch", type=_at_least(1), default=1, help="sequences decoded together (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--no-pdl", action="store_true", help="launch without programmatic dependent launch")
    p.add_argument("--update", action="store_true", help="also swap weights, KV pool and eps in place, no recapture")
    p.add_argument("--loop", type=_at_least(0), default=0, metavar="N", help="also decode N tokens in one graph launch")
    p.add_argument("--tp", type=_at_least(0), default=0, metavar="N", help="tensor parallelism: one process per GPU "
                   "on N GPUs, NCCL all-reduces captured in each rank's graph (1: one GPU through the same path)")


def load(spec: str, seed: int, with_weights: bool = True) -> tuple[ModelConfig, Weights | None]:
    """A preset with seeded random weights, or an HF checkpoint folder."""
    if Path(spec).is_dir():
        cfg = ModelConfig.from_hf(spec)
        return cfg, Weights.from_hf(spec) if with_weights else None
    try:
        cfg = ModelConfig.preset(spec)
    except ValueError as e:
        raise SystemExit(f"--model {spec!r} is not a folder with an HF config.json and *.safetensors, "
                         f"and {e}") from None
    return cfg, Weights.random(cfg, seed) if with_weights else None


def _kv_tokens(args, prompt_len: int) -> int:
    """KV slots a row needs: its prompt and the most tokens any part of the demo decodes after it."""
    return prompt_len + max(args.tokens, args.loop) + 1


def _prompts(args, cfg) -> list[list[int]]:
    try:
        ids = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    except ValueError:
        ids = []
    if not ids or any(not 0 <= t < cfg.vocab for t in ids):
        raise SystemExit(f"--prompt-ids must be comma-separated token ids in [0, {cfg.vocab}), got "
                         f"{args.prompt_ids!r}")
    if _kv_tokens(args, len(ids)) > cfg.max_seq_len:
        raise SystemExit(f"the prompt ({len(ids)}) and the tokens to decode ({max(args.tokens, args.loop)}) need a "
                         f"context of {_kv_tokens(args, len(ids))}, past the model's max_seq_len {cfg.max_seq_len}")
    return [[(t + 7 * b) % cfg.vocab for t in ids] for b in range(args.batch)]  # a distinct prompt per row


def _reads(ln, cfg: ModelConfig, context: int, B: int) -> int:
    """Bytes a launch must read at least: its weight matrix (a projection), or its layer's K and V of ``B`` rows at
    ``context`` tokens (attention); 0 for the rest (their reads are activations, ~KB)."""
    names = () if isinstance(ln, AllReduce) else ln.args.signature.names
    if "w" in names:
        return ln.args.refs["w"].nbytes
    if "k_cache" in names:
        return cfg.kv_bytes_per_token() // cfg.n_layers * context * B
    return 0


def _plan_row(ln, reads: int) -> dict:
    """One launch of the plan; ``reads`` (bytes) and their time at the nominal bandwidth: what the launch costs at
    the least, against which its measured time (``benchmarks/diagnostics/step_costs.py``) shows its fixed cost."""
    mb, us = (f"{reads / 1e6:.2f}", f"{reads / NOMINAL_GBS / 1e3:.2f}") if reads else ("", "")
    floor = {"MB read": mb, "floor us": us}
    if isinstance(ln, AllReduce):
        return {"launch": ln.name, "kernel": f"NCCL all-reduce (sum over {ln.comm.size} ranks)", "grid": "",
                "block": "", "shared": "", **floor}
    # dynamic shared memory: what a kernel uses, or unused bytes that cap its blocks per SM (plans.py)
    return {"launch": ln.name, "kernel": ln.kernel.name, "grid": str(ln.shape.grid), "block": str(ln.shape.block[0]),
            "shared": f"{ln.shape.shared / 1024:.1f} KiB" if ln.shape.shared else "0", **floor}


def print_plan(cfg: ModelConfig, B: int, prompt_len: int, n_new: int, tp: int = 0) -> None:
    """The step's launches (first layer in full, then counts) and its bandwidth floor, without a GPU; with
    ``tp``, the step of one tensor-parallel rank."""
    if tp:
        local = local_config(cfg, tp)
        model = DecodeModel(local, None, max_batch=B, plan_only=True, comm=PlanCommunicator(0, tp))
    else:
        model = DecodeModel(cfg, None, max_batch=B, plan_only=True)
    launches = model.step_launches(B)
    shown = [ln for ln in launches if not ln.name.startswith("L") or ln.name.startswith("L0.")]
    rank = f", one rank of {tp} (H={local.n_heads} KVH={local.n_kv_heads} F={local.ffn_dim})" if tp else ""
    ctx, c = [prompt_len + n_new] * B, model.cfg
    rows = [_plan_row(ln, _reads(ln, c, ctx[0], B)) for ln in shown]
    print(format_table(rows, ["launch", "kernel", "grid", "block", "shared", "MB read", "floor us"],
                       title=f"decode step plan, B={B}{rank} (layers 1..{cfg.n_layers - 1} repeat layer 0; floor: "
                             f"bytes at {NOMINAL_GBS / 1000:.2f} TB/s)"))
    n_ar = sum(isinstance(ln, AllReduce) for ln in launches)
    print(f"\n{len(launches) - n_ar} kernels{f' and {n_ar} all-reduces' if tp else ''} per step"
          f"{' per rank' if tp else ''}; {step_bytes(c, ctx) / 1e9:.3f} GB per step at context {ctx[0]}; "
          f"floor {floor_ms(c, ctx, NOMINAL_GBS):.3f} ms/step at {NOMINAL_GBS / 1000:.2f} TB/s")


def run(args: argparse.Namespace) -> int:
    cfg, _ = load(args.model, args.seed, with_weights=False)
    prompts = _prompts(args, cfg)
    if args.tp:
        try:
            local_config(cfg, args.tp)
        except ValueError as e:
            raise SystemExit(f"--tp {args.tp}: {e}") from None
    if not gpu_available():
        from .cli import cmd_compile  # it says there is no GPU
        cmd_compile(argparse.Namespace(arch=None, no_cache=False))
        print()
        print_plan(cfg, args.batch, len(prompts[0]), args.tokens, args.tp)
        return 0
    if args.tp:
        return run_tp(args, cfg, prompts)
    _, weights = load(args.model, args.seed)
    B = args.batch
    size = pick_size(B, DEFAULT_CAPTURE_SIZES) or B  # the runner pads B up to its next capture size
    model = DecodeModel(cfg, weights, max_batch=size, kv_tokens=_kv_tokens(args, len(prompts[0])),
                        pdl=not args.no_pdl)
    stream = Stream.create()
    print(f"model {args.model}: D={cfg.dim} L={cfg.n_layers} H={cfg.n_heads} KVH={cfg.n_kv_heads} "
          f"F={cfg.ffn_dim} V={cfg.vocab}; batch {B}; {len(model.step_launches(B))} kernels per step; "
          f"PDL {'off' if args.no_pdl else 'on'}")
    runner = DecodeRunner(model, [s for s in DEFAULT_CAPTURE_SIZES if s <= size], stream=stream)
    runner.capture(progress=False)
    results, runners = {}, {}
    for mode in MODES:
        runners[mode] = step_runner(model, B, stream, mode)
        results[mode] = generate(model, prompts, args.tokens, keep_logits=True,
                                 step=model_step(model, B, stream, run=runners[mode]))
    results["runner"] = generate(model, prompts, args.tokens, keep_logits=True, step=runner.step)
    same = all(results[m].tokens == results["eager"].tokens for m in MODES)
    diff = max(float(np.abs(a - b).max()) for m in MODES for a, b in zip(results[m].logits,
                                                                         results["eager"].logits))
    for b, toks in enumerate(results["eager"].tokens[:4]):
        print(f"row {b}: prompt {prompts[b]} -> {toks}")
    print(f"tokens identical across eager/capture/explicit: {same}; max logit difference {diff:g}; runner "
          f"(B={B} run as {size}) gives the same tokens: {results['runner'].tokens == results['eager'].tokens}")
    gbs = copy_bandwidth_gbs(stream)
    ctx = [len(prompts[0]) + args.tokens] * B
    floor = floor_ms(cfg, ctx, gbs)
    rows = []
    runners["runner"] = lambda: runner.graphs[size].launch(stream)
    for mode, run in runners.items():
        gpu_us = summarize(time_gpu(run, stream, warmup=5, iters=20, repeats=10)).median
        host_us = summarize(time_host(run, warmup=2, iters=3, repeats=10, sync=stream.synchronize)).median
        ms = gpu_us / 1e3
        rows.append({"mode": mode, "batch": f"{B}->{size}" if mode == "runner" else str(B), "ms/step": ms,
                     "host us/step": host_us, "tokens/s": B / ms * 1e3,
                     "kernels": len(model.step_launches(size if mode == "runner" else B)),
                     "GB/s": step_bytes(cfg, ctx) / ms / 1e6, "x floor": ms / floor})
    print(format_table(rows, ["mode", "batch", "ms/step", "host us/step", "tokens/s", "kernels", "GB/s", "x floor"],
                       title=f"decode step at context {ctx[0]} (floor {floor:.3f} ms at {gbs / 1000:.2f} TB/s "
                             f"measured copy bandwidth)"))
    ok = same
    if args.loop:
        ok &= _loop_demo(model, prompts, args.loop, stream, results["eager"].tokens, runners["capture"])
    if args.update:
        from .demo_update import run_update_demo
        ok &= run_update_demo(cfg, weights, prompts, min(args.tokens, 16), args.seed)
    return 0 if ok else 1


def run_tp(args: argparse.Namespace, cfg: ModelConfig, prompts: list[list[int]]) -> int:
    """``demo --tp N``: every rank decodes in each mode; tokens must agree across modes and ranks, and with
    the plain single-GPU model (run here afterwards, eagerly)."""
    from .comm import run_ranks
    if args.no_pdl or args.update or args.loop:
        raise SystemExit("--tp runs the decode demo only (no --no-pdl, --update or --loop)")
    folder = args.model if Path(args.model).is_dir() else None
    job = DecodeJob(cfg, tuple(tuple(p) for p in prompts), args.tokens, args.seed, folder, keep_logits=False,
                    time_steps=True)
    print(f"model {args.model}: D={cfg.dim} L={cfg.n_layers} H={cfg.n_heads} KVH={cfg.n_kv_heads} F={cfg.ffn_dim} "
          f"V={cfg.vocab}; batch {args.batch}; tensor parallel over {args.tp} GPU(s), one process each")
    ranks = run_ranks(decode_rank, args.tp, job)
    lead = ranks[0]["modes"]["eager"]["tokens"]
    same_modes = all(r["modes"][m]["tokens"] == lead for r in ranks for m in r["modes"])
    _, weights = load(args.model, args.seed)
    plain = DecodeModel(cfg, weights, max_batch=len(prompts), kv_tokens=len(prompts[0]) + args.tokens + 1)
    single = generate(plain, prompts, args.tokens, Stream.create()).tokens
    for b, toks in enumerate(lead[:4]):
        print(f"row {b}: prompt {prompts[b]} -> {toks}")
    print(f"tokens identical across ranks and eager/capture/explicit/runner: {same_modes}; identical to the "
          f"single-GPU model: {single == lead}")
    rows = [{"rank": r, "eager ms/step": ranks[r]["ms"]["eager"], "graph ms/step": ranks[r]["ms"]["graph"],
             "graph speedup": ranks[r]["ms"]["eager"] / ranks[r]["ms"]["graph"]} for r in range(args.tp)]
    print(format_table(rows, ["rank", "eager ms/step", "graph ms/step", "graph speedup"],
                       title=f"TP={args.tp} decode step at context {len(prompts[0]) + args.tokens}"))
    return 0 if same_modes and single == lead else 1


def _loop_demo(model: DecodeModel, prompts, n: int, stream: Stream, want_tokens, replay) -> bool:
    """Decode ``n`` tokens per row in ONE graph launch (a WHILE node) and compare with step-by-step decoding."""
    B = len(prompts)
    last = generate(model, prompts, 1, step=model_step(model, B, stream, "capture"))  # prefill; KV holds prompts
    loop = DeviceLoop(model, B, n, eos=-1, stream=stream)  # no EOS: runs n steps
    alloc_tables = _tables_for(model, B, len(prompts[0]) + n + 1)
    first = [t[0] for t in last.tokens]
    positions = [len(p) for p in prompts]
    got = loop.run(first, positions, alloc_tables)
    want = [w[1:n + 1] for w in want_tokens] if len(want_tokens[0]) > n else None
    def run_loop():  # the loop advances positions on the device: restage the inputs every time
        loop.start(first, positions, alloc_tables)

    us = summarize(time_gpu(run_loop, stream, warmup=1, iters=1, repeats=5)).median
    step_us = summarize(time_gpu(replay, stream, warmup=2, iters=10, repeats=5)).median
    same = want is None or got == want
    print(f"device loop: {n} tokens x {B} rows in one graph launch: {us / n:.1f} us/token (single-step replay "
          f"{step_us:.1f} us); tokens equal step-by-step: {same if want is not None else 'n/a (use --tokens > N)'}")
    with ResidentLoop(model, B, n, eos=-1, stream=stream) as resident:  # launched once, rung from pinned memory
        same_resident = resident.run(first, positions, alloc_tables) == got
        t0 = time.perf_counter()
        resident.submit()  # the same request again: no staging, one store
        host_us = (time.perf_counter() - t0) * 1e6
        resident.wait()
        same_resident &= resident.tokens() == got
        print(f"resident loop: the same request twice from one graph launch ({resident.launches}): "
              f"{resident.gpu_ns / 1e3 / n:.1f} us/token on the GPU, {host_us:.1f} us of host time for the "
              f"second request; tokens equal the device loop's: {same_resident}")
    return same and same_resident


def _tables_for(model: DecodeModel, B: int, tokens: int) -> np.ndarray:
    """Block tables giving row b the same blocks generate() gave it (fresh allocator, rows in order)."""
    alloc = BlockAllocator(model.num_blocks)
    blocks = [[] for _ in range(B)]
    for t in range(tokens):
        for b in range(B):
            alloc.grow(blocks[b], t + 1)
    return make_block_tables(blocks, model.max_blocks)
