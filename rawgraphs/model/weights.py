"""``Weights``: a model's bf16 host arrays in the kernels' fused layouts; seeded random or HF safetensors.

Layouts (``kernels/README.md``): linear weights are HF ``W[N_out, K_in]``; ``w_qkv [(H + 2*KVH)*hd, D]`` is
q rows, then k, then v; ``w_gate_up [2F, D]`` is gate rows, then up. ``lm_head`` is the very same array as
``embed`` when the config ties them.
"""

from __future__ import annotations

import functools
import json
import os
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from statistics import NormalDist

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from .config import ModelConfig

__all__ = ["LayerWeights", "Weights"]

BF16 = np.dtype(ml_dtypes.bfloat16)
_CHUNK = 1 << 22  # values per random-fill task

_LAYER_FIELDS = ("w_qkv", "w_o", "w_gate_up", "w_down", "attn_norm", "mlp_norm")


@dataclass
class LayerWeights:
    """One decoder layer's bf16 arrays."""

    w_qkv: np.ndarray  # [(H + 2*KVH)*hd, D]
    w_o: np.ndarray  # [D, H*hd]
    w_gate_up: np.ndarray  # [2F, D]
    w_down: np.ndarray  # [D, F]
    attn_norm: np.ndarray  # [D]
    mlp_norm: np.ndarray  # [D]


def _layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d = cfg.dim
    return {"w_qkv": (cfg.qkv_dim, d), "w_o": (d, cfg.q_dim), "w_gate_up": (2 * cfg.ffn_dim, d),
            "w_down": (d, cfg.ffn_dim), "attn_norm": (d,), "mlp_norm": (d,)}


@dataclass
class Weights:
    """All bf16 weights of a model; shapes and dtypes are checked against ``cfg`` at construction."""

    cfg: ModelConfig
    embed: np.ndarray  # [V, D]
    layers: list[LayerWeights]
    final_norm: np.ndarray  # [D]
    lm_head: np.ndarray  # [V, D]; `is embed` when tied

    def __post_init__(self):
        cfg = self.cfg
        if len(self.layers) != cfg.n_layers:
            raise ValueError(f"expected {cfg.n_layers} layers, got {len(self.layers)}")
        if cfg.tie_word_embeddings and self.lm_head is not self.embed:
            raise ValueError("tie_word_embeddings: lm_head must be the same array as embed")
        shapes = _layer_shapes(cfg)
        expected = {"embed": (cfg.vocab, cfg.dim), "final_norm": (cfg.dim,), "lm_head": (cfg.vocab, cfg.dim)}
        expected.update({f"layers.{i}.{f}": shapes[f] for i in range(cfg.n_layers) for f in _LAYER_FIELDS})
        for name, array in self.arrays().items():
            if array.shape != expected[name] or array.dtype != BF16 or not array.flags.c_contiguous:
                raise ValueError(f"weight {name}: expected contiguous bf16 {expected[name]}, "
                                 f"got {array.dtype} {array.shape}")

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array by name (``embed``, ``layers.{i}.w_qkv``, ..., ``final_norm``, ``lm_head``)."""
        out = {"embed": self.embed}
        for i, layer in enumerate(self.layers):
            out.update({f"layers.{i}.{f}": getattr(layer, f) for f in _LAYER_FIELDS})
        out["final_norm"] = self.final_norm
        out["lm_head"] = self.lm_head
        return out

    @property
    def nbytes(self) -> int:
        """Host bytes held (a tied LM head counted once)."""
        return sum(a.nbytes for a in {id(a): a for a in self.arrays().values()}.values())

    @classmethod
    def random(cls, cfg: ModelConfig, seed: int = 0) -> Weights:
        """Seeded random weights that keep activations O(1) through many layers; no element is zero.

        Linear weights are normal with std ``1/sqrt(K_in)``, the embedding std 1, norms ``1 + 0.1 * normal``.
        Each tensor chunk has its own stream (``SeedSequence([seed, tensor, chunk])``): the result does not
        depend on order or thread count.
        """
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            return cls._random(cfg, seed, pool)

    @classmethod
    def _random(cls, cfg: ModelConfig, seed: int, pool: Executor) -> Weights:
        counter = iter(range(1 << 30))

        def linear(n: int, k: int) -> np.ndarray:
            return _normal_bf16((n, k), 1.0 / np.sqrt(k), seed, next(counter), pool)

        def norm() -> np.ndarray:
            rng = np.random.default_rng([seed, next(counter)])
            return (1.0 + 0.1 * rng.standard_normal(cfg.dim, dtype=np.float32)).astype(BF16)  # [D]

        d, f = cfg.dim, cfg.ffn_dim
        embed = _normal_bf16((cfg.vocab, d), 1.0, seed, next(counter), pool)  # [V, D]
        layers = [LayerWeights(w_qkv=linear(cfg.qkv_dim, d), w_o=linear(d, cfg.q_dim),
                               w_gate_up=linear(2 * f, d), w_down=linear(d, f),
                               attn_norm=norm(), mlp_norm=norm()) for _ in range(cfg.n_layers)]
        final_norm = norm()
        lm_head = embed if cfg.tie_word_embeddings else linear(cfg.vocab, d)
        return cls(cfg, embed, layers, final_norm, lm_head)

    @classmethod
    def from_hf(cls, folder: str | PathLike) -> Weights:
        """Load a HF ``LlamaForCausalLM`` checkpoint (``config.json`` + ``*.safetensors``); fuse qkv, gate/up.

        bf16, fp16 and fp32 tensors are accepted; fp16/fp32 are rounded to bf16 (nearest even).
        """
        folder = Path(folder)
        cfg = ModelConfig.from_hf(folder)
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {folder}")
        tensors: dict[str, np.ndarray] = {}
        for file in files:
            # safetensors >= 0.4 with ml_dtypes returns bf16 tensors as ml_dtypes.bfloat16 arrays in numpy.
            with safe_open(file, framework="numpy") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                    tensors[name] = f.get_tensor(name)

        def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
            if name not in tensors:
                raise KeyError(f"checkpoint {folder} lacks tensor {name!r}")
            if tensors[name].shape != shape:  # each part before fusing: a fused shape can hide a wrong split
                raise ValueError(f"checkpoint {folder}: tensor {name!r} has shape {tensors[name].shape}, the config "
                                 f"says {shape}")
            return _as_bf16(tensors.pop(name), name)

        def fused(*parts: tuple[str, tuple[int, ...]]) -> np.ndarray:
            return np.ascontiguousarray(np.concatenate([take(*part) for part in parts], axis=0))

        D, F, q, kv = cfg.dim, cfg.ffn_dim, cfg.q_dim, cfg.kv_dim
        layers = []
        for i in range(cfg.n_layers):
            p = f"model.layers.{i}."
            layers.append(LayerWeights(
                w_qkv=fused((p + "self_attn.q_proj.weight", (q, D)), (p + "self_attn.k_proj.weight", (kv, D)),
                            (p + "self_attn.v_proj.weight", (kv, D))),
                w_o=take(p + "self_attn.o_proj.weight", (D, q)),
                w_gate_up=fused((p + "mlp.gate_proj.weight", (F, D)), (p + "mlp.up_proj.weight", (F, D))),
                w_down=take(p + "mlp.down_proj.weight", (D, F)),
                attn_norm=take(p + "input_layernorm.weight", (D,)),
                mlp_norm=take(p + "post_attention_layernorm.weight", (D,))))
        embed = take("model.embed_tokens.weight", (cfg.vocab, D))
        final_norm = take("model.norm.weight", (D,))
        if cfg.tie_word_embeddings:
            tensors.pop("lm_head.weight", None)  # some tied checkpoints store a copy anyway
            lm_head = embed
        else:
            lm_head = take("lm_head.weight", (cfg.vocab, D))
        unused = [n for n in tensors if not n.endswith("rotary_emb.inv_freq")]
        if unused:
            raise ValueError(f"checkpoint {folder} has tensors this model does not use: {sorted(unused)[:8]}")
        return cls(cfg, embed, layers, final_norm, lm_head)

    def save_hf(self, folder: str | PathLike) -> Path:
        """Write ``config.json`` + ``model.safetensors`` (HF Llama names, bf16); returns the folder."""
        cfg = self.cfg
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        q, kv, f = cfg.q_dim, cfg.kv_dim, cfg.ffn_dim
        out = {"model.embed_tokens.weight": self.embed, "model.norm.weight": self.final_norm}
        if not cfg.tie_word_embeddings:
            out["lm_head.weight"] = self.lm_head
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            out[p + "self_attn.q_proj.weight"] = layer.w_qkv[:q]
            out[p + "self_attn.k_proj.weight"] = layer.w_qkv[q:q + kv]
            out[p + "self_attn.v_proj.weight"] = layer.w_qkv[q + kv:]
            out[p + "self_attn.o_proj.weight"] = layer.w_o
            out[p + "mlp.gate_proj.weight"] = layer.w_gate_up[:f]
            out[p + "mlp.up_proj.weight"] = layer.w_gate_up[f:]
            out[p + "mlp.down_proj.weight"] = layer.w_down
            out[p + "input_layernorm.weight"] = layer.attn_norm
            out[p + "post_attention_layernorm.weight"] = layer.mlp_norm
        (folder / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
        save_file(out, folder / "model.safetensors", metadata={"format": "pt"})
        return folder


def _as_bf16(array: np.ndarray, name: str) -> np.ndarray:
    if array.dtype == BF16:
        return np.ascontiguousarray(array)
    if array.dtype in (np.float16, np.float32):
        return np.ascontiguousarray(array.astype(np.float32).astype(BF16))
    raise TypeError(f"tensor {name}: dtype {array.dtype} not supported (bf16, fp16 or fp32)")


@functools.lru_cache(maxsize=1)
def _normal_quantiles() -> np.ndarray:
    """The 65536 standard-normal quantiles at ``(i + 0.5) / 65536``: none is zero."""
    dist = NormalDist()
    return np.array([dist.inv_cdf((i + 0.5) / 65536) for i in range(65536)], dtype=np.float64)  # [65536]


def _normal_bf16(shape: tuple[int, ...], std: float, seed: int, index: int, pool: Executor) -> np.ndarray:
    """Bf16 normal(0, std) samples, drawn by indexing a quantile table with uniform 16-bit integers.

    Exactly distributed as a 16-bit-quantized normal and ~10x faster than ``standard_normal`` + a bf16 cast,
    which matters for the 1b config (~1e9 values). Philox's raw output is numpy's fastest uniform source;
    chunks of ``_CHUNK`` values fill in parallel threads.
    """
    table = (_normal_quantiles() * std).astype(np.float32).astype(BF16)  # [65536]
    if not np.all(table.astype(np.float32) != 0):
        raise ValueError(f"std {std} is too small for bf16: some quantiles round to zero")
    n = int(np.prod(shape))
    out = np.empty(n, dtype=BF16)

    def fill(chunk: int) -> None:
        lo, hi = chunk * _CHUNK, min(n, (chunk + 1) * _CHUNK)
        raw = np.random.Philox(np.random.SeedSequence([seed, index, chunk])).random_raw((hi - lo + 3) // 4)
        np.take(table, raw.view(np.uint16)[:hi - lo], out=out[lo:hi])  # raw: [ceil(len/4)] u64

    list(pool.map(fill, range(-(-n // _CHUNK))))
    return out.reshape(shape)
