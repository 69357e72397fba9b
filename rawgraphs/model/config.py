"""``ModelConfig``: the shape of a Llama-style decoder, from a preset or a Hugging Face ``config.json``."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

__all__ = ["ModelConfig"]

BF16_BYTES = 2

_PRESETS = {
    "tiny": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 192, "vocab": 512,
             "max_seq_len": 256},
    "small": {"dim": 768, "n_layers": 12, "n_heads": 12, "n_kv_heads": 12, "ffn_dim": 2048, "vocab": 32000,
              "max_seq_len": 4096},
    "1b": {"dim": 2048, "n_layers": 16, "n_heads": 16, "n_kv_heads": 16, "ffn_dim": 5632, "vocab": 32000,
           "max_seq_len": 4096},
}

# rope_scaling types that leave HF Llama's RoPE unchanged; anything else would change the math we implement.
_PLAIN_ROPE = {None, "default", "none"}


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-style decoder; validated at construction.

    Parameters
    ----------
    dim, n_layers, n_heads, n_kv_heads, ffn_dim, vocab
        D, L, H, KVH (``H % KVH == 0``), F, V.
    head_dim
        hd; ``None`` derives ``dim // n_heads`` (then ``dim % n_heads`` must be 0). Must be even (RoPE).
    rms_norm_eps, rope_theta, max_seq_len, tie_word_embeddings
        As in Hugging Face ``LlamaConfig``.
    block_size
        Tokens per KV-cache block; the kernels assume 16.
    """

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 4096
    tie_word_embeddings: bool = False
    block_size: int = 16

    def __post_init__(self):
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim is None:
            if self.dim % self.n_heads:
                raise ValueError(f"dim ({self.dim}) must be a multiple of n_heads ({self.n_heads}) "
                                 "when head_dim is not given")
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if not isinstance(self.head_dim, int) or self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"head_dim must be a positive even int (RoPE rotates halves), "
                             f"got {self.head_dim!r}")
        if self.block_size != 16:
            raise ValueError(f"block_size must be 16 (the kernels' KV block), got {self.block_size}")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise ValueError(f"ModelConfig.{name} must be a finite number > 0, got {value!r}")

    @classmethod
    def preset(cls, name: str) -> ModelConfig:
        """One of ``"tiny"`` (CPU tests), ``"small"`` (125M-class), ``"1b"``."""
        if name not in _PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(_PRESETS)}")
        return cls(**_PRESETS[name])

    @classmethod
    def from_hf(cls, source: str | PathLike | Mapping) -> ModelConfig:
        """Parse a Hugging Face ``LlamaForCausalLM`` config: a dict, a ``config.json`` path or its folder."""
        if isinstance(source, Mapping):
            hf = dict(source)
        else:
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            hf = json.loads(path.read_text())
        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                               "vocab_size") if k not in hf]
        if missing:
            raise ValueError(f"HF config lacks {missing}; is it a LlamaForCausalLM config.json?")
        arch, mtype = hf.get("architectures") or ["LlamaForCausalLM"], hf.get("model_type", "llama")
        if "LlamaForCausalLM" not in arch or mtype != "llama":
            raise ValueError(f"architectures {arch} / model_type {mtype!r}: only LlamaForCausalLM ('llama') is "
                             "implemented (other families differ in attention, norms or activations)")
        if hf.get("sliding_window") is not None:
            raise ValueError("sliding_window is not supported: attention reads the whole context")
        scaling = hf.get("rope_scaling")
        if scaling is not None and not isinstance(scaling, Mapping):
            raise ValueError(f"rope_scaling must be null or an object, got {scaling!r}")
        kind = (scaling.get("rope_type", scaling.get("type")) if scaling else None)
        if kind not in _PLAIN_ROPE:
            raise ValueError(f"rope_scaling type {kind!r} is not supported: only plain RoPE "
                             f"(rope_scaling null or type 'default') is implemented")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported: the MLP is SiLU-gated")
        if hf.get("attention_bias") or hf.get("mlp_bias"):
            raise ValueError("attention_bias / mlp_bias are not supported: the projections have no bias")
        heads = hf["num_attention_heads"]
        kv_heads = hf.get("num_key_value_heads")
        for key in ("rms_norm_eps", "rope_theta"):
            if key in hf and (not isinstance(hf[key], (int, float)) or isinstance(hf[key], bool)):
                raise ValueError(f"HF config's {key} must be a number, got {hf[key]!r}")
        return cls(
            dim=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"],
            n_heads=heads,
            n_kv_heads=heads if kv_heads is None else kv_heads,
            ffn_dim=hf["intermediate_size"],
            vocab=hf["vocab_size"],
            head_dim=hf.get("head_dim"),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(hf.get("rope_theta", 10000.0)),
            max_seq_len=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        )

    def to_hf(self) -> dict:
        """The equivalent Hugging Face ``LlamaForCausalLM`` ``config.json`` dict."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.ffn_dim,
            "vocab_size": self.vocab,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_seq_len,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "bfloat16",
        }

    def replace(self, **changes) -> ModelConfig:
        """A copy with some fields changed (re-validated; ``head_dim`` re-derived unless given)."""
        if "head_dim" not in changes and ({"dim", "n_heads"} & changes.keys()):
            changes["head_dim"] = None
        return dataclasses.replace(self, **changes)

    @property
    def q_dim(self) -> int:
        """Width of the query projection, ``H * hd``."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections, ``KVH * hd``."""
        return self.n_kv_heads * self.head_dim

    @property
    def qkv_dim(self) -> int:
        """Rows of the fused QKV weight, ``(H + 2*KVH) * hd``."""
        return self.q_dim + 2 * self.kv_dim

    def layer_params(self) -> int:
        """Parameters of one decoder layer (fused QKV, O, gate/up, down, two norms)."""
        d, f = self.dim, self.ffn_dim
        return self.qkv_dim * d + d * self.q_dim + 2 * f * d + d * f + 2 * d

    def param_count(self) -> int:
        """Distinct parameters: embedding, layers, final norm and (when untied) the LM head."""
        head = 0 if self.tie_word_embeddings else self.vocab * self.dim
        return self.vocab * self.dim + self.n_layers * self.layer_params() + self.dim + head

    def weight_bytes(self) -> int:
        """Bf16 weight bytes one decode step streams: every layer, final norm and the LM head.

        The embedding gather reads only B rows and is left out (the LM head is counted even when tied).
        """
        return BF16_BYTES * (self.n_layers * self.layer_params() + self.dim + self.vocab * self.dim)

    def kv_bytes_per_token(self) -> int:
        """Bf16 K and V bytes one token occupies across all layers."""
        return 2 * self.n_layers * self.kv_dim * BF16_BYTES
