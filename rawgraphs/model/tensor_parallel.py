"""Megatron-style tensor parallelism of the decoder: how the weights split over ``tp`` ranks, and a NumPy
reference of the split model.

Column-parallel: QKV (each rank owns ``H/tp`` query heads and ``KVH/tp`` KV heads, so attention and the KV cache
stay rank-local) and gate/up (``F/tp`` columns of the MLP). Row-parallel: O and down take that rank's slice of
their input and produce a partial sum of the full output, so one all-reduce follows each (two per layer).
Embedding, norms and the LM head are replicated. Rank ``r``'s shard is an ordinary model of
``local_config(cfg, tp)``: the GPU decode step runs it unchanged, with an all-reduce between the row-parallel
projection and the residual add (the multi-GPU issue's NCCL part).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .config import ModelConfig
from .reference import ReferenceModel, embedding
from .weights import LayerWeights, Weights

__all__ = ["local_config", "shard", "TensorParallelReference"]


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


def shard(weights: Weights, tp: int) -> list[Weights]:
    """``tp`` shards of ``weights``, one per rank, each a valid :class:`Weights` of ``local_config``."""
    cfg, local = weights.cfg, local_config(weights.cfg, tp)
    return [Weights(local, weights.embed, [_shard_layer(lw, cfg, r, tp) for lw in weights.layers],
                    weights.final_norm, weights.lm_head) for r in range(tp)]


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
        return lead.head(x)
