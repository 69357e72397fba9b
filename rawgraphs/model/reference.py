"""Float64 NumPy reference for the decode step: one function per kernel, then the whole model.

Every op takes any float input dtype (``ml_dtypes.bfloat16`` included), upcasts to float64 and returns
float64; GPU tests compare a kernel's bf16/fp32 output against these with a stated tolerance. Shapes and
conventions are those of ``kernels/README.md``: HF weight layout ``W[N_out, K_in]``, rotate-half RoPE, paged
KV cache ``[num_blocks, KVH, 16, hd]``, ``positions[b] < 0`` marks an inactive (padding) row whose outputs
are zeros.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .blocks import BLOCK_SIZE
from .config import ModelConfig
from .weights import Weights

__all__ = [
    "ReferenceModel",
    "append_kv",
    "argmax",
    "attention",
    "embedding",
    "linear",
    "paged_attention",
    "rmsnorm",
    "rope",
    "rope_tables",
    "silu_mul",
    "to_bf16",
]



def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def to_bf16(a) -> np.ndarray:
    """Round to bf16 (round-to-nearest-even, as ``__float2bfloat16``) and return it as float64."""
    return np.asarray(a, dtype=np.float64).astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def embedding(tokens, table) -> np.ndarray:
    """Rows of ``table[V, D]`` for ``tokens[B]`` -> ``[B, D]``."""
    tokens = np.asarray(tokens, dtype=np.int64)
    return _f64(np.asarray(table)[tokens])  # [B, D]


def rmsnorm(x, w, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x^2) + eps) * w`` over the last axis; ``x[B, D]``, ``w[D]`` -> ``[B, D]``."""
    x = _f64(x)
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # [B, 1]
    return x * inv * _f64(w)


def linear(x, w) -> np.ndarray:
    """``y[b, n] = sum_k x[b, k] * w[n, k]``; ``x[B, K]``, ``w[N, K]`` (HF layout) -> ``[B, N]``."""
    return _f64(x) @ _f64(w).T


def _rope_angles(positions, head_dim: int, theta: float) -> np.ndarray:
    """float64 ``pos * theta^(-2i/hd)`` for ``positions[T]`` -> ``[T, hd/2]``."""
    inv_freq = theta ** (-2.0 * np.arange(head_dim // 2, dtype=np.float64) / head_dim)  # [hd/2]
    return np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]


def rope(x, positions, theta: float) -> np.ndarray:
    """Rotate-half RoPE of ``x[B, nh, hd]`` at ``positions[B]`` -> ``[B, nh, hd]``.

    ``inv_freq[i] = theta^(-2i/hd)``; ``out[i] = x[i] cos - x[i+hd/2] sin``, ``out[i+hd/2] = x[i+hd/2] cos +
    x[i] sin``. Rows with ``positions[b] < 0`` are inactive and come back as zeros.
    """
    x = _f64(x)
    positions = np.asarray(positions, dtype=np.int64)
    half = x.shape[-1] // 2
    angle = _rope_angles(positions, x.shape[-1], theta)  # [B, hd/2]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]  # [B, 1, hd/2]
    x1, x2 = x[..., :half], x[..., half:]
    out = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # [B, nh, hd]
    out[positions < 0] = 0.0
    return out


def rope_tables(head_dim: int, theta: float, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """fp32 ``cos, sin [max_len, hd/2]`` of ``pos * theta^(-2i/hd)``, computed in float64 then rounded (the
    tables the attention kernel and the PyTorch twin rotate with)."""
    angle = _rope_angles(np.arange(max_len), head_dim, theta)  # [T, hd/2]
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def silu_mul(gu) -> np.ndarray:
    """``silu(gate) * up`` of the fused ``gu[B, 2F]`` (gate columns, then up) -> ``[B, F]``."""
    gu = _f64(gu)
    f = gu.shape[-1] // 2
    gate, up = gu[..., :f], gu[..., f:]
    return gate / (1.0 + np.exp(-gate)) * up


def attention(q, k, v) -> np.ndarray:
    """Causal-free softmax attention of one sequence: ``q[H, hd]``, ``k, v[T, KVH, hd]`` -> ``[H, hd]``.

    Grouped-query: query head ``h`` reads kv head ``h // (H // KVH)``; scale ``1/sqrt(hd)``.
    """
    q, k, v = _f64(q), _f64(k), _f64(v)
    n_heads, hd = q.shape
    group = n_heads // k.shape[1]
    kv_head = np.arange(n_heads) // group  # [H]
    kh = k[:, kv_head, :]  # [T, H, hd]
    vh = v[:, kv_head, :]  # [T, H, hd]
    scores = np.einsum("hd,thd->ht", q, kh) / np.sqrt(hd)  # [H, T]
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("ht,thd->hd", p, vh)  # [H, hd]


def _gather(cache: np.ndarray, table: np.ndarray, ctx_len: int) -> np.ndarray:
    """Tokens ``0..ctx_len-1`` of one sequence from a paged ``cache[NB, KVH, 16, hd]`` -> ``[T, KVH, hd]``."""
    t = np.arange(ctx_len)
    blocks = np.asarray(table, dtype=np.int64)[t // BLOCK_SIZE]  # [T]
    return cache[blocks, :, t % BLOCK_SIZE, :]  # [T, KVH, hd]


def paged_attention(q, k_cache, v_cache, block_tables, ctx_lens) -> np.ndarray:
    """Attention of ``q[B, H, hd]`` over each row's first ``ctx_lens[b]`` cached tokens -> ``[B, H, hd]``.

    ``k_cache, v_cache[num_blocks, KVH, 16, hd]``; token ``t`` of row ``b`` lives in block
    ``block_tables[b, t // 16]``, slot ``t % 16``. Rows with ``ctx_lens[b] <= 0`` come back as zeros.
    """
    q = _f64(q)
    k_cache, v_cache = np.asarray(k_cache), np.asarray(v_cache)
    out = np.zeros_like(q)  # [B, H, hd]
    for b, n in enumerate(np.asarray(ctx_lens, dtype=np.int64)):
        if n > 0:
            k = _gather(k_cache, block_tables[b], n)  # [T, KVH, hd]
            v = _gather(v_cache, block_tables[b], n)  # [T, KVH, hd]
            out[b] = attention(q[b], k, v)
    return out


def append_kv(k_cache, v_cache, k, v, block_tables, positions) -> None:
    """Write ``k, v[B, KVH, hd]`` into the paged caches at ``positions[B]``, in place; skip inactive rows.

    The cache arrays keep their dtype (bf16 caches round, as the GPU's stores do).
    """
    for b, pos in enumerate(np.asarray(positions, dtype=np.int64)):
        if pos < 0:
            continue
        block = int(block_tables[b][pos // BLOCK_SIZE])
        k_cache[block, :, pos % BLOCK_SIZE, :] = np.asarray(k[b]).astype(k_cache.dtype)
        v_cache[block, :, pos % BLOCK_SIZE, :] = np.asarray(v[b]).astype(v_cache.dtype)


def argmax(logits) -> np.ndarray:
    """Greedy token per row of ``logits[B, V]`` (lowest index on ties) -> ``int32[B]``."""
    return np.argmax(np.asarray(logits), axis=-1).astype(np.int32)


class ReferenceModel:
    """The whole decode step in float64 NumPy over a paged KV cache laid out as on the GPU.

    Per layer the caches are ``k_cache[l], v_cache[l]: [num_blocks, KVH, 16, hd]``. With
    ``bf16_activations=True`` (the default) values are rounded to bf16 where the GPU stores bf16 tensors, so a
    GPU-vs-reference comparison can be tight. The rounding points, in step order:

    1. ``h = rmsnorm(x)`` (both norms in each layer, and the final norm);
    2. ``qkv = h @ w_qkv^T``; then ``q`` after RoPE; ``k`` after RoPE and ``v`` when stored in the bf16 cache;
    3. the attention output ``a``;
    4. the residual after each add, ``x + a @ w_o^T`` and ``x + m @ w_down^T`` (the projection is added to the
       residual in fp32 and rounded once: the GEMV epilogue fuses the residual add);
    5. ``gu = h @ w_gate_up^T`` and ``m = silu(gate) * up``;
    6. logits are rounded to fp32.

    The embedding gather is exact (the table is bf16). With ``bf16_activations=False`` everything stays
    float64 and the caches are float64.
    """

    def __init__(self, cfg: ModelConfig, weights: Weights, num_blocks: int, bf16_activations: bool = True):
        self.cfg, self.weights, self.bf16_activations = cfg, weights, bf16_activations
        shape = (num_blocks, cfg.n_kv_heads, BLOCK_SIZE, cfg.head_dim)
        dtype = ml_dtypes.bfloat16 if bf16_activations else np.float64
        self.k_cache = [np.zeros(shape, dtype) for _ in range(cfg.n_layers)]  # L x [NB, KVH, 16, hd]
        self.v_cache = [np.zeros(shape, dtype) for _ in range(cfg.n_layers)]  # L x [NB, KVH, 16, hd]

    def _store(self, a: np.ndarray) -> np.ndarray:
        return to_bf16(a) if self.bf16_activations else a

    def step(self, tokens, positions, block_tables) -> np.ndarray:
        """Decode one token per row: ``tokens[B]`` at ``positions[B]`` -> ``logits[B, V]`` (float64).

        Appends each active row's K, V at its position (``block_tables [B, max_blocks]``) before attending
        over ``positions[b] + 1`` tokens. Inactive rows (``positions[b] < 0``) write no cache, attend to
        nothing and get zero logits (the projections skip them).
        """
        positions = np.asarray(positions, dtype=np.int64)  # [B]
        x = embedding(tokens, self.weights.embed)  # [B, D]
        for layer in range(self.cfg.n_layers):
            x = self._store(x + self.attention_part(layer, x, positions, block_tables))  # [B, D]
            x = self._store(x + self.mlp_part(layer, x))  # [B, D]
        return self.head(x, positions)

    def attention_part(self, layer: int, x: np.ndarray, positions: np.ndarray, block_tables) -> np.ndarray:
        """What attention adds to the residual ``x [B, D]`` (float64, before the add): norm, QKV, RoPE, KV
        append, paged attention, output projection. Under tensor parallelism, one rank's partial sum."""
        cfg, lw, r = self.cfg, self.weights.layers[layer], self._store
        n, h_, kvh, hd = len(positions), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        h = r(rmsnorm(x, lw.attn_norm, cfg.rms_norm_eps))  # [B, D]
        qkv = r(linear(h, lw.w_qkv))  # [B, (H + 2*KVH)*hd]
        q = qkv[:, :cfg.q_dim].reshape(n, h_, hd)  # [B, H, hd]
        k = qkv[:, cfg.q_dim:cfg.q_dim + cfg.kv_dim].reshape(n, kvh, hd)  # [B, KVH, hd]
        v = qkv[:, cfg.q_dim + cfg.kv_dim:].reshape(n, kvh, hd)  # [B, KVH, hd]
        q = r(rope(q, positions, cfg.rope_theta))
        k = rope(k, positions, cfg.rope_theta)
        append_kv(self.k_cache[layer], self.v_cache[layer], k, v, block_tables, positions)
        a = r(paged_attention(q, self.k_cache[layer], self.v_cache[layer], block_tables, positions + 1))
        return linear(a.reshape(n, cfg.q_dim), lw.w_o)  # [B, D]

    def mlp_part(self, layer: int, x: np.ndarray) -> np.ndarray:
        """What the MLP adds to the residual ``x [B, D]`` (float64, before the add)."""
        cfg, lw, r = self.cfg, self.weights.layers[layer], self._store
        h = r(rmsnorm(x, lw.mlp_norm, cfg.rms_norm_eps))
        gu = r(linear(h, lw.w_gate_up))  # [B, 2F]
        m = r(silu_mul(gu))  # [B, F]
        return linear(m, lw.w_down)  # [B, D]

    def head(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Final norm and LM head: logits ``[B, V]``, zeros for inactive rows."""
        h = self._store(rmsnorm(x, self.weights.final_norm, self.cfg.rms_norm_eps))
        logits = linear(h, self.weights.lm_head)  # [B, V]
        logits[positions < 0] = 0.0
        return logits.astype(np.float32).astype(np.float64) if self.bf16_activations else logits
