"""How far two greedy generations agree, how close their logits were on the same inputs, and the verdict of
the forced-input token check.

Pure NumPy, for comparing two implementations of one model (rawgraphs and ``TorchDecoder``, or rawgraphs with
itself at another batch size). ``prefix_lengths``, ``first_divergence`` and ``same_input_logit_diff`` look at
two generations that both ran free (each fed back its own tokens). ``run_forced`` instead feeds a model given
tokens (another model's greedy choices), so both models see identical inputs at every step, and
``forced_verdict`` judges such a pair against a noise bound ``tau`` (see there). Steps are counted as in
``rawgraphs.model.generate``: ``logits[s]`` is step ``s`` of ``P - 1 + n_new`` (``P`` prompt tokens), and the
new token ``n`` comes from step ``P - 1 + n``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Divergence", "ForcedVerdict", "first_divergence", "forced_verdict", "prefix_lengths", "row_noise",
           "run_forced", "same_input_logit_diff"]

# One step of a model: (tokens [B], positions [B]) -> fp32 logits [B, V]
StepLogits = Callable[[np.ndarray, np.ndarray], np.ndarray]


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


def run_forced(step: StepLogits, prompts: list[list[int]], forced: list[list[int] | None],
               n_new: int) -> list[np.ndarray]:
    """Run ``step`` over equal-length prompts (all rows start at position 0), then decide ``n_new`` tokens
    per row, feeding row ``b`` the tokens ``forced[b]`` instead of its own choices; a row whose ``forced[b]``
    is None feeds back its own greedy token (argmax, lowest index on ties). Returns the logits of every one
    of the ``P - 1 + n_new`` steps, ``[B, V]`` each."""
    B, P = len(prompts), len(prompts[0])
    if len(forced) != B or any(len(p) != P for p in prompts) or n_new < 1:
        raise ValueError("need equal-length prompts, one forced entry per row and n_new >= 1")
    if any(f is not None and len(f) < n_new for f in forced):
        raise ValueError(f"every forced row needs {n_new} tokens")
    n = n_new
    own: list[list[int]] = [[] for _ in range(B)]
    logits = []
    for t in range(P - 1 + n):
        tokens = [p[t] if t < P else (f if f is not None else o)[t - P] for p, f, o in zip(prompts, forced, own)]
        out = np.asarray(step(np.asarray(tokens, np.int32), np.full(B, t, np.int32)))  # [B, V]
        logits.append(out)
        if t >= P - 1:
            for o, x in zip(own, np.argmax(out, axis=-1)):
                o.append(int(x))
    return logits


def row_noise(logits_a: list[np.ndarray], logits_b: list[np.ndarray], row: int = 0) -> float:
    """``max |logits_a - logits_b|`` of one row over every step and the vocabulary (runs on identical inputs)."""
    if len(logits_a) != len(logits_b):
        raise ValueError(f"{len(logits_a)} steps against {len(logits_b)}")
    return max(float(np.abs(np.asarray(a[row], np.float64) - b[row]).max()) for a, b in zip(logits_a, logits_b))


@dataclass(frozen=True)
class ForcedVerdict:
    """The forced-input token check of a twin against rawgraphs (``forced_verdict``).

    ``tau``: rawgraphs against itself (other kernels, same inputs); ``bound = factor * tau``; ``max_diff``: the
    twin's largest ``|logit - rawgraphs logit|`` over every step, row and token; ``decisions``: new tokens
    compared (``n_new x B``); ``disagreements``: how many the twin decided differently; ``worst_margin``:
    the largest rawgraphs margin ``logits_rg[tok_rg] - logits_rg[tok_twin]`` among them (0 without any).
    """

    tau: float
    bound: float
    max_diff: float
    decisions: int
    disagreements: int
    worst_margin: float

    @property
    def passed(self) -> bool:
        """Logits within the bound, and every disagreement a near-tie within it."""
        return self.max_diff <= self.bound and self.worst_margin <= self.bound

    def line(self, label: str) -> str:
        """One line: the verdict and its numbers."""
        return (f"twin tokens (forced inputs) {label}: {'PASS' if self.passed else 'MISS'} "
                f"(max |dlogit| {self.max_diff:.3g} vs 2 tau = {self.bound:.3g}; {self.disagreements}/"
                f"{self.decisions} decisions differ, largest rawgraphs margin {self.worst_margin:.3g})")


def forced_verdict(rg_tokens: list[list[int]], rg_logits: list[np.ndarray], twin_logits: list[np.ndarray],
                   tau: float, prompt_len: int, factor: float = 2.0) -> ForcedVerdict:
    """Judge a twin fed rawgraphs' inputs at every step (``run_forced`` with ``rg_tokens``).

    The rule: PASS iff (a) ``max |twin logits - rawgraphs logits| <= factor * tau`` over every step, row and
    token, and (b) at every new token where the twin's greedy choice (argmax, lowest index on ties) differs
    from rawgraphs' token, rawgraphs' own margin ``logits_rg[tok_rg] - logits_rg[tok_twin] <= factor * tau``
    (a near-tie that noise of that size may flip). ``tau`` is rawgraphs against itself on identical inputs
    with other kernels (``row_noise`` of two batch sizes), so the bound does not depend on the twin.
    ``rg_logits``, ``twin_logits``: ``[B, V]`` per step, ``P - 1 + n_new`` steps.
    """
    if len(rg_logits) != len(twin_logits):
        raise ValueError(f"{len(rg_logits)} steps against {len(twin_logits)}")
    max_diff = max(float(np.abs(np.asarray(a, np.float64) - b).max()) for a, b in zip(rg_logits, twin_logits))
    decisions, margins = 0, []
    for b, row in enumerate(rg_tokens):
        for n, tok in enumerate(row):
            s = prompt_len - 1 + n
            twin_tok = int(np.argmax(twin_logits[s][b]))
            decisions += 1
            if twin_tok != tok:
                margins.append(float(rg_logits[s][b][tok]) - float(rg_logits[s][b][twin_tok]))
    return ForcedVerdict(tau, factor * tau, max_diff, decisions, len(margins), max(margins, default=0.0))
