"""Greedy generation for a batch of sequences on a :class:`DecodeModel`: prefill token by token, then decode.

Host bookkeeping only: which token each row feeds, its position, its KV blocks. Rows may join late
(``starts``): until then they are inactive padding rows (position -1), which is how sequences of different
lengths share one batch and one graph.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..context import Stream
from .blocks import BlockAllocator, make_block_tables
from .decode import DecodeModel

__all__ = ["MODES", "step_runner", "model_step", "generate", "Generation"]

# One decode step: (tokens [B], positions [B], block_tables [B, MB]) -> next tokens [B]
StepFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

MODES = ("eager", "capture", "explicit")


def step_runner(model: DecodeModel, B: int, stream: Stream, mode: str) -> Callable[[], None]:
    """A callable that runs one step for ``B`` rows: eager launches, or a graph by capture / explicit nodes."""
    if mode == "eager":
        return lambda: model.run_eager(B, stream)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    graph = model.capture(B, stream) if mode == "capture" else model.build_graph(B)
    exe = graph.instantiate()
    exe.upload(stream)
    return lambda: exe.launch(stream)


def model_step(model: DecodeModel, B: int, stream: Stream, mode: str = "eager",
               run: Callable[[], None] | None = None) -> StepFn:
    """A step function for ``B`` rows: stage inputs, run (``run``, or eager / a graph by ``mode``), read the
    greedy tokens."""
    run = run or step_runner(model, B, stream, mode)

    def step(tokens, positions, tables):
        model.set_inputs(tokens, positions, tables, stream)
        run()
        return model.read_tokens(len(tokens), stream)

    return step


@dataclass
class Generation:
    """Tokens generated per row, and (if kept) the logits of every step ``[steps][B, V]``."""

    tokens: list[list[int]]
    logits: list[np.ndarray] = field(default_factory=list)
    steps: int = 0


def generate(model: DecodeModel, prompts: list[list[int] | None], n_new: int, stream: Stream | None = None,
             mode: str = "eager", starts: list[int] | None = None, keep_logits: bool = False,
             seed: int | None = None, step: StepFn | None = None) -> Generation:
    """Greedy-decode ``n_new`` tokens after each prompt; row ``b`` joins at step ``starts[b]`` (default 0).

    A prompt of ``None`` is a padding row: inactive at every step, it generates nothing.

    ``step`` overrides the step (e.g. ``DecodeRunner.step``); otherwise ``mode`` picks eager / capture /
    explicit on ``stream``.
    ``seed`` shuffles the KV block order (non-contiguous block tables).
    """
    B = len(prompts)
    if any(p is not None and len(p) == 0 for p in prompts) or n_new < 1:
        raise ValueError("every prompt needs at least one token and n_new must be >= 1")
    if all(p is None for p in prompts):
        raise ValueError("every prompt is None (padding): there is nothing to decode")
    try:
        starts = [0] * B if starts is None else [operator.index(s) for s in starts]
    except TypeError:
        starts = None
    if starts is None or len(starts) != B or min(starts, default=0) < 0:
        raise ValueError(f"starts must be {B} ints >= 0, the step at which each row joins")
    step = step or model_step(model, B, stream, mode)
    alloc = BlockAllocator(model.num_blocks, seed)
    blocks: list[list[int]] = [[] for _ in range(B)]
    out = Generation([[] for _ in range(B)])
    total = max(s + len(p) - 1 + n_new for s, p in zip(starts, prompts) if p is not None)
    for t in range(total):
        tokens = np.zeros(B, np.int32)
        positions = np.full(B, -1, np.int32)
        for b, (s, prompt) in enumerate(zip(starts, prompts)):
            pos = t - s
            if prompt is None or pos < 0 or len(out.tokens[b]) >= n_new:
                continue  # not joined yet, or finished: an inactive row
            tokens[b] = prompt[pos] if pos < len(prompt) else out.tokens[b][-1]
            positions[b] = pos
            alloc.grow(blocks[b], pos + 1)
        nxt = step(tokens, positions, make_block_tables(blocks, model.max_blocks))
        if keep_logits:
            out.logits.append(model.read_logits(B).copy())
        for b, prompt in enumerate(prompts):
            if prompt is not None and positions[b] >= len(prompt) - 1:
                out.tokens[b].append(int(nxt[b]))
        out.steps += 1
    return out
