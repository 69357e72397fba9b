"""How far two greedy generations agree, and how close their logits were while their inputs were the same.

Pure NumPy, for comparing two implementations of one model (rawgraphs and ``TorchDecoder``, or rawgraphs with
itself at another batch size). Both generations run free (each feeds back its own tokens); nothing here feeds
one model's tokens to the other. Steps are counted as in ``rawgraphs.model.generate``: ``logits[s]`` is step
``s`` of ``P - 1 + n_new`` (``P`` prompt tokens), and the new token ``n`` comes from step ``P - 1 + n``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Divergence", "prefix_lengths", "first_divergence", "same_input_logit_diff"]


@dataclass(frozen=True)
class Divergence:
    """The first new token at which two generations differ.

    ``step`` is the index of that new token (0-based), ``row`` the lowest row that differs there; ``token_a``,
    ``token_b`` what each model chose; ``margin_a = logits_a[token_a] - logits_a[token_b]`` (>= 0) and
    ``margin_b = logits_b[token_b] - logits_b[token_a]`` (>= 0) how decided each model was (a near-tie when
    both are about the size of the logit differences before it).
    """

    step: int
    row: int
    token_a: int
    token_b: int
    margin_a: float
    margin_b: float


def prefix_lengths(a: list[list[int]], b: list[list[int]]) -> list[int]:
    """Per row, how many leading new tokens two generations share."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} rows against {len(b)}")
    out = []
    for ra, rb in zip(a, b):
        n = 0
        while n < min(len(ra), len(rb)) and ra[n] == rb[n]:
            n += 1
        out.append(n)
    return out


def first_divergence(a: list[list[int]], b: list[list[int]], logits_a: list[np.ndarray],
                     logits_b: list[np.ndarray], prompt_len: int) -> Divergence | None:
    """The earliest differing new token over all rows (lowest row on ties), with both models' margins there;
    None when the generations agree everywhere. ``logits_*[s]``: step ``s`` ``[B, V]``."""
    lengths = prefix_lengths(a, b)
    diverged = [(n, r) for r, n in enumerate(lengths) if n < min(len(a[r]), len(b[r]))]
    if not diverged:
        return None
    n, r = min(diverged)
    ta, tb = a[r][n], b[r][n]
    la, lb = logits_a[prompt_len - 1 + n][r], logits_b[prompt_len - 1 + n][r]  # [V] each
    return Divergence(n, r, ta, tb, float(la[ta] - la[tb]), float(lb[tb] - lb[ta]))


def same_input_logit_diff(a: list[list[int]], b: list[list[int]], logits_a: list[np.ndarray],
                          logits_b: list[np.ndarray], prompt_len: int, rows: int | None = None) -> float:
    """Largest ``|logits_a - logits_b|`` over the steps and rows whose inputs were identical in both runs: every
    prompt step, and generated steps up to and including a row's first differing token. ``rows`` limits the
    comparison to the first rows (e.g. row 0 of runs at two batch sizes)."""
    rows = len(a) if rows is None else rows
    lengths = prefix_lengths(a[:rows], b[:rows])
    worst = 0.0
    for s, (la, lb) in enumerate(zip(logits_a, logits_b)):
        # step s reads new tokens 0..s-P; its inputs are the same while those all agree
        same = [r for r in range(rows) if s - prompt_len < lengths[r]]
        if same:
            worst = max(worst, float(np.abs(la[same] - lb[same]).max()))
    return worst
