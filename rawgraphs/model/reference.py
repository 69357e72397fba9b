"""Float64 NumPy reference for the decode step: one function per kernel, then the whole model.

Every op takes any float input dtype (``ml_dtypes.bfloat16`` included), upcasts to float64 and returns float64;
GPU tests compare a kernel's bf16/fp32 output against these with a stated tolerance. Shapes and conventions are
those of ``kernels/README.md``: HF weight layout ``W[N_out, K_in]``, rotate-half RoPE, paged KV cache
``[num_blocks, KVH, 16, hd]``, ``positions[b] < 0`` marks an inactive (padding) row whose outputs are zeros.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = [
    "embedding", "rmsnorm", "linear", "rope", "silu_mul", "attention", "paged_attention", "append_kv",
    "argmax", "to_bf16",
]

BLOCK_SIZE = 16


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


def rope(x, positions, theta: float) -> np.ndarray:
    """Rotate-half RoPE of ``x[B, nh, hd]`` at ``positions[B]`` -> ``[B, nh, hd]``.

    ``inv_freq[i] = theta^(-2i/hd)``; ``out[i] = x[i] cos - x[i+hd/2] sin``, ``out[i+hd/2] = x[i+hd/2] cos +
    x[i] sin``. Rows with ``positions[b] < 0`` are inactive and come back as zeros.
    """
    x = _f64(x)
    positions = np.asarray(positions, dtype=np.int64)
    half = x.shape[-1] // 2
    inv_freq = theta ** (-2.0 * np.arange(half, dtype=np.float64) / x.shape[-1])  # [hd/2]
    angle = positions[:, None].astype(np.float64) * inv_freq[None, :]  # [B, hd/2]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]  # [B, 1, hd/2]
    x1, x2 = x[..., :half], x[..., half:]
    out = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # [B, nh, hd]
    out[positions < 0] = 0.0
    return out


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
            out[b] = attention(q[b], _gather(k_cache, block_tables[b], n), _gather(v_cache, block_tables[b], n))
    return out


def append_kv(k_cache, v_cache, k, v, block_tables, positions) -> None:
    """Write ``k, v[B, KVH, hd]`` in place into the paged caches at ``positions[B]``; inactive rows write nothing.

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
