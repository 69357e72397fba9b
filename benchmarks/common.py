"""Shared setup of the decode benchmarks: arguments, a model with random weights and random KV history, block
tables, timing in ms, self-checks that print, results as JSON.

Context convention: a row "at context T" has T tokens of history in its KV cache and feeds its next token at
position T, so attention reads T + 1 tokens; its block table covers at least T + 1 tokens.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
from cuda.bindings import driver

from rawgraphs.bench import BenchResult, collect_metadata, summarize, time_gpu
from rawgraphs.context import Stream, device, gpu_available
from rawgraphs.errors import check
from rawgraphs.memory import DeviceBuffer
from rawgraphs.model import BlockAllocator, ModelConfig, Weights, make_block_tables
from rawgraphs.model.decode import DecodeModel

BF16 = np.dtype(ml_dtypes.bfloat16)
CONTEXT = 512          # default context of the decode benchmarks
RANDOM_CHUNK = 64 << 20  # bytes of random bf16 the KV fill cycles through


def parser(doc: str) -> argparse.ArgumentParser:
    """An ArgumentParser with the common ``--out DIR`` (default ./out) and ``--quick`` flags."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out"), help="folder for JSON and PNG (default ./out)")
    ap.add_argument("--quick", action="store_true", help="a smaller run, for a fast check")
    return ap


def no_gpu(script: str) -> bool:
    """True (after printing one sentence) when there is no GPU to measure on."""
    if gpu_available():
        return False
    print(f"{script} needs an NVIDIA GPU and driver; none was found here, so nothing was measured.")
    return True


def build_model(preset: str, max_batch: int, kv_tokens: int, seed: int = 0, **model_kw) -> DecodeModel:
    """A DecodeModel of ``preset`` with seeded random weights and a KV pool of ``max_batch`` x ``kv_tokens``
    (``model_kw``: more DecodeModel arguments)."""
    cfg = ModelConfig.preset(preset)
    weights = Weights.random(cfg, seed)
    model = DecodeModel(cfg, weights, max_batch=max_batch, kv_tokens=kv_tokens, **model_kw)
    del weights
    gc.collect()
    return model


def fill_kv_random(model: DecodeModel, rng: np.random.Generator) -> None:
    """Random normal bf16 (never zero) in every K and V cache of every layer, so attention reads real data.

    A ``RANDOM_CHUNK`` of random values is uploaded once and copied on the device into every cache, each from a
    different phase of a twice-as-long source (a full host fill of the 1b pool would take seconds).
    """
    host = rng.standard_normal(RANDOM_CHUNK, dtype=np.float32).astype(BF16)  # [2 * chunk bytes / 2]
    host[host == 0] = 1
    caches = [c for layer in model.layers for c in (layer.k_cache, layer.v_cache)]
    with DeviceBuffer.from_numpy(host) as src:
        for i, cache in enumerate(caches):
            phase = (i * 7919 * 2) % RANDOM_CHUNK  # bytes, even (whole bf16 values)
            done = 0
            while done < cache.nbytes:
                n = min(RANDOM_CHUNK, cache.nbytes - done)
                check(driver.cuMemcpyDtoD(cache.ptr + done, src.ptr + phase, n), "cuMemcpyDtoD")
                done += n
        device().synchronize()  # our streams are non-blocking: finish the fill before anything reads it


def block_tables(model: DecodeModel, B: int, tokens: int, seed: int = 0) -> np.ndarray:
    """Block tables ``int32 [B, max_blocks]`` giving each of ``B`` rows its own shuffled blocks for ``tokens``."""
    alloc = BlockAllocator(model.num_blocks, seed)
    return make_block_tables([alloc.grow([], tokens) for _ in range(B)], model.max_blocks)


def step_inputs(model: DecodeModel, B: int, context: int, rng: np.random.Generator,
                cover: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens ``[B]`` (random ids), positions ``[B]`` (all ``context``) and block tables covering ``cover``
    tokens per row (default ``context + 1``)."""
    tokens = rng.integers(1, model.cfg.vocab, B).astype(np.int32)  # [B]
    positions = np.full(B, context, np.int32)                       # [B]
    return tokens, positions, block_tables(model, B, cover or context + 1)


def timing(quick: bool) -> dict:
    """time_gpu counts: fewer with ``--quick``."""
    return {"warmup": 3, "iters": 10, "repeats": 5} if quick else {"warmup": 5, "iters": 20, "repeats": 10}


def time_ms(fn: Callable[[], object], stream: Stream, quick: bool) -> list[float]:
    """GPU ms per call of ``fn`` (CUDA events over back-to-back calls), one sample per repeat."""
    return [us / 1e3 for us in time_gpu(fn, stream, **timing(quick))]


def median(samples) -> float:
    """The median of some samples."""
    return summarize(samples).median


def verdict(ok: bool) -> str:
    """PASS or MISS."""
    return "PASS" if ok else "MISS"


class Checks:
    """Self-checks that print one line each and are remembered; ``failed`` lists the ones that failed."""

    def __init__(self):
        self.failed: list[str] = []
        self.passed = 0

    def __call__(self, ok: bool, what: str) -> bool:
        print(("check ok: " if ok else "CHECK FAILED: ") + what, flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)
        return ok

    def notes(self) -> list[str]:
        """What the JSON and summary.md say of the self-checks: every failure, or that all passed."""
        if self.failed:
            return [f"self-check FAILED (numbers may be wrong): {what}" for what in self.failed]
        return ["self-checks: none failed" + (f" ({self.passed} passed)" if self.passed else "")]


def check_same_step(checks: Checks, label: str, a: tuple[np.ndarray, np.ndarray],
                    b: tuple[np.ndarray, np.ndarray]) -> bool:
    """``a`` and ``b`` are (tokens, logits) of the same rows: finite, bit-identical."""
    (ta, la), (tb, lb) = a, b
    same = np.array_equal(ta, tb) and np.array_equal(la, lb) and bool(np.isfinite(la).all())
    diff = float(np.abs(la - lb).max()) if la.size else 0.0
    return checks(same, f"{label}: tokens and logits bit-identical and finite (max |diff| {diff:g})")


def poison_step(model: DecodeModel, stream: Stream) -> None:
    """NaN logits and token -1 on ``stream``: what the next step reads back must be its own, so a graph that ran
    nothing cannot pass a comparison with the step before it."""
    model.logits.fill_bytes(0xFF, stream)
    model.next_tokens.fill_bytes(0xFF, stream)


def read_step(model: DecodeModel, B: int, stream: Stream) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [B], logits [B, V]) of the last step (waits for the stream)."""
    tokens = model.read_tokens(B, stream)
    return tokens, model.read_logits(B).copy()


def write_result(name: str, out: Path, params: dict, rows: list[dict], notes: list[str],
                 checks: Checks | None = None) -> Path:
    """Write ``out/name.json`` (BenchResult with run metadata; with ``checks``, their outcome among the notes) and
    print where."""
    notes = notes + (checks.notes() if checks is not None else [])
    path = BenchResult(name, collect_metadata(), params, rows, notes).write_json(Path(out) / f"{name}.json")
    print(f"wrote {path}")
    return path


def plot(draw: Callable[[], Path]) -> None:
    """Run a plot helper; says so (never silently) when matplotlib is missing."""
    try:
        print(f"wrote {draw()}")
    except ImportError:
        print("note: matplotlib is not installed (the [bench] extra): no plot", file=sys.stderr)


def finish(checks: Checks) -> int:
    """Exit status: 0, or 1 with the failed self-checks named."""
    if checks.failed:
        print("FAILED self-checks (numbers above may be wrong): " + "; ".join(checks.failed))
        return 1
    return 0


def eager_vs_graph(model: DecodeModel, B: int, inputs: tuple, stream: Stream, quick: bool, checks: Checks,
                   label: str) -> tuple[list[float], list[float]]:
    """ms/step samples of eager launches and of a captured graph for ``B`` rows on ``inputs``; the graph's
    tokens and logits are first checked bit-identical to eager's. Every repeat of the step rewrites the same KV
    slot with the same values, so the state is the same at every repeat."""
    model.set_inputs(*inputs, stream)
    model.run_eager(B, stream)
    eager_out = read_step(model, B, stream)
    graph = model.capture(B, stream)
    exe = graph.instantiate()
    exe.upload(stream)
    poison_step(model, stream)
    exe.launch(stream)
    check_same_step(checks, f"{label} graph vs eager", eager_out, read_step(model, B, stream))
    eager = time_ms(lambda: model.run_eager(B, stream), stream, quick)
    replay = time_ms(lambda: exe.launch(stream), stream, quick)
    stream.synchronize()
    exe.close()
    graph.close()
    return eager, replay
