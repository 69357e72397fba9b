"""Megatron-style tensor parallelism of the decoder: how the weights split over ``tp`` ranks, and a NumPy
reference of the split model.

Column-parallel: QKV (each rank owns ``H/tp`` query heads and ``KVH/tp`` KV heads, so attention and the KV cache
stay rank-local) and gate/up (``F/tp`` columns of the MLP). Row-parallel: O and down take that rank's slice of
their input and produce a partial sum of the full output, so one all-reduce follows each (two per layer).
Embedding, norms and the LM head are replicated. Rank ``r``'s shard is an ordinary model of
``local_config(cfg, tp)``: the GPU decode step runs it unchanged, with an all-reduce between the row-parallel
projection and the residual add (``DecodeModel(..., comm=)``).

On the GPU: :func:`rank_model` is one rank's :class:`DecodeModel` (weights sharded at load), and
:func:`decode_rank` is what each rank's process runs (``rawgraphs.comm.run_ranks``) to greedy-decode a batch
eagerly, by captured graph, by explicit graph and through the runner.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .config import ModelConfig
from .reference import ReferenceModel, embedding
from .weights import LayerWeights, Weights

__all__ = ["local_config", "rank_weights", "shard", "TensorParallelReference", "rank_model", "DecodeJob",
           "decode_rank"]


def local_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    """The config of one rank's shard: ``H/tp`` heads, ``KVH/tp`` KV heads, ``F/tp`` MLP columns."""
    for name, value in (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.n_kv_heads), ("ffn_dim", cfg.ffn_dim)):
        if tp < 1 or value % tp:
            raise ValueError(f"tensor parallelism {tp} must divide {name} ({value})")
    return replace(cfg, n_heads=cfg.n_heads // tp, n_kv_heads=cfg.n_kv_heads // tp, ffn_dim=cfg.ffn_dim // tp,
                   head_dim=cfg.head_dim)


def _rows(a: np.ndarray, groups: int, r: int, tp: int) -> np.ndarray:
    """Rank ``r``'s share of ``a``'s rows, taken as ``groups`` equal groups (heads) split over ranks."""
    per = groups // tp
    return a.reshape(groups, -1, a.shape[-1])[r * per:(r + 1) * per].reshape(-1, a.shape[-1])


def _shard_layer(lw: LayerWeights, cfg: ModelConfig, r: int, tp: int) -> LayerWeights:
    q, k, v = np.split(lw.w_qkv, [cfg.q_dim, cfg.q_dim + cfg.kv_dim])  # [H hd, D], [KVH hd, D], [KVH hd, D]
    w_qkv = np.concatenate([_rows(q, cfg.n_heads, r, tp), _rows(k, cfg.n_kv_heads, r, tp),
                            _rows(v, cfg.n_kv_heads, r, tp)])
    w_o = _rows(lw.w_o.T, cfg.n_heads, r, tp).T  # [D, H/tp hd]: the columns of this rank's heads
    f = cfg.ffn_dim // tp
    gate, up = lw.w_gate_up[:cfg.ffn_dim], lw.w_gate_up[cfg.ffn_dim:]  # [F, D] each
    w_gate_up = np.concatenate([gate[r * f:(r + 1) * f], up[r * f:(r + 1) * f]])  # [2F/tp, D]
    w_down = lw.w_down[:, r * f:(r + 1) * f]  # [D, F/tp]
    c = np.ascontiguousarray
    return LayerWeights(c(w_qkv), c(w_o), c(w_gate_up), c(w_down), lw.attn_norm, lw.mlp_norm)


def rank_weights(weights: Weights, rank: int, tp: int) -> Weights:
    """Rank ``rank``'s shard of ``weights``: a valid :class:`Weights` of ``local_config(cfg, tp)``."""
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} is outside 0..{tp - 1}")
    if tp == 1:
        return weights  # the one shard is the whole model: no copy (an 8B model is 16 GB)
    cfg, local = weights.cfg, local_config(weights.cfg, tp)
    return Weights(local, weights.embed, [_shard_layer(lw, cfg, rank, tp) for lw in weights.layers],
                   weights.final_norm, weights.lm_head)


def shard(weights: Weights, tp: int) -> list[Weights]:
    """``tp`` shards of ``weights``, one per rank (see :func:`rank_weights`)."""
    return [rank_weights(weights, r, tp) for r in range(tp)]


class TensorParallelReference:
    """The NumPy reference run as ``tp`` ranks: each layer sums the ranks' partial outputs (the all-reduce)
    before the residual add; everything else is rank-local. Equals :class:`ReferenceModel` up to float64
    summation order."""

    def __init__(self, cfg: ModelConfig, weights: Weights, tp: int, num_blocks: int,
                 bf16_activations: bool = True):
        self.cfg = cfg
        self.ranks = [ReferenceModel(s.cfg, s, num_blocks, bf16_activations) for s in shard(weights, tp)]

    def step(self, tokens, positions, block_tables) -> np.ndarray:
        """As :meth:`ReferenceModel.step`: ``logits [B, V]`` (float64)."""
        positions = np.asarray(positions, dtype=np.int64)  # [B]
        lead = self.ranks[0]
        x = embedding(tokens, lead.weights.embed)  # [B, D], replicated
        for layer in range(self.cfg.n_layers):
            x = lead._store(x + sum(rk.attention_part(layer, x, positions, block_tables) for rk in self.ranks))
            x = lead._store(x + sum(rk.mlp_part(layer, x) for rk in self.ranks))
        return lead.head(x, positions)


# ---- on the GPU ---------------------------------------------------------------------------------------------
def rank_model(weights: Weights, comm, **kwargs):
    """This rank's :class:`~rawgraphs.model.decode.DecodeModel`: its shard of ``weights`` (the whole model's)
    on this process's GPU, all-reducing over ``comm``. ``kwargs`` go to DecodeModel (max_batch, kv_tokens...)."""
    from .decode import DecodeModel
    part = rank_weights(weights, comm.rank, comm.size)
    return DecodeModel(part.cfg, part, comm=comm, **kwargs)


@dataclass(frozen=True)
class DecodeJob:
    """What every rank decodes: the model (``hf_folder``, or seeded random weights of ``cfg``), the prompts
    (one per row), how many tokens, and in which modes (``eager``, ``capture``, ``explicit``, ``runner``)."""

    cfg: ModelConfig
    prompts: tuple[tuple[int, ...], ...]
    n_new: int
    seed: int = 0
    hf_folder: str | None = None
    modes: tuple[str, ...] = ("eager", "capture", "explicit", "runner")
    keep_logits: bool = True
    time_steps: bool = False

    def weights(self) -> Weights:
        """The whole model's weights (each rank loads them and keeps its shard)."""
        return Weights.from_hf(self.hf_folder) if self.hf_folder else Weights.random(self.cfg, self.seed)


def decode_rank(comm, job: DecodeJob) -> dict:
    """One rank's part of ``job``, run in each rank's process (every rank issues the same collectives in the
    same order). Returns ``{"modes": {mode: {"tokens": per-row lists, "logits": [steps][B, V]}}, "ms": {"eager":
    ms/step, "graph": ms/step}}`` (``ms`` only with ``job.time_steps``: the last step's inputs, rerun)."""
    from ..bench.stats import summarize
    from ..bench.timing import time_gpu
    from ..context import Stream
    from ..runner import DEFAULT_CAPTURE_SIZES, DecodeRunner, pick_size
    from .generate import generate, model_step, step_runner

    B = len(job.prompts)
    size = pick_size(B, DEFAULT_CAPTURE_SIZES) or B
    prompts = [list(p) for p in job.prompts]
    kv_tokens = max(len(p) for p in prompts) + job.n_new + 1
    model = rank_model(job.weights(), comm, max_batch=size, kv_tokens=kv_tokens)
    out: dict = {"modes": {}, "ms": {}}
    with Stream.create() as stream:
        runs = {}
        for mode in job.modes:
            if mode == "runner":
                runner = DecodeRunner(model, [s for s in DEFAULT_CAPTURE_SIZES if s <= size], stream=stream)
                runner.capture(progress=False)
                step = runner.step
            else:
                runs[mode] = step_runner(model, B, stream, mode)
                step = model_step(model, B, stream, run=runs[mode])
            gen = generate(model, prompts, job.n_new, keep_logits=job.keep_logits, step=step)
            out["modes"][mode] = {"tokens": gen.tokens, "logits": gen.logits}
        if job.time_steps:
            for label, mode in (("eager", "eager"), ("graph", "capture")):
                run = runs.get(mode) or step_runner(model, B, stream, mode)
                out["ms"][label] = summarize(time_gpu(run, stream, warmup=5, iters=20, repeats=10)).median / 1e3
        stream.synchronize()
    return out
