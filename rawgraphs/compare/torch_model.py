"""``TorchDecoder``: the same Llama-style model with the same bf16 weights, written in plain PyTorch the way a
PyTorch user would (gpt-fast style), to measure rawgraphs against.

Static buffers (token ids, positions, a contiguous KV cache ``[L, max_batch, KVH, max_len, hd]``) let one
``step`` be run eagerly, captured by ``torch.cuda.CUDAGraph`` or compiled by ``torch.compile(mode=
"reduce-overhead")``. Rounding points follow the kernels (``ReferenceModel`` lists them): bf16 after each
rmsnorm (fp32 ``x * inv_rms * w``, one rounding, as the projections' fused x loads), projection, RoPE,
attention and silu*up; the logits are fp32 (``torch.mm(out_dtype=fp32)``). RoPE cos/sin are computed in
float64 and stored as fp32 tables, as the attention kernel computes them.

Two places where the obvious PyTorch op rounds differently from the kernels (measured on the H200 with torch
2.11, feeding torch the kernels' own inputs, ``small``):

- residual adds: ``torch.addmm(x, a, W.t())`` on bf16 CUDA tensors: ~20% of the new residual elements
  differed from the kernels' ``bf16(float(x) + fp32 sum)`` by one ulp, the rate of rounding ``a @ W^T`` to
  bf16 before the add (a double rounding; 21% in a NumPy simulation; on the CPU it rounds once). Here the
  product is taken in fp32 (``mm(out_dtype=fp32)``), added to ``x`` in fp32, rounded once.
- attention: ``F.scaled_dot_product_attention`` on bf16 tensors rounds the softmax probabilities to bf16
  before multiplying by V (~17% of outputs one ulp off). Here scores, softmax and probabilities @ V are fp32
  matmuls, rounded once, as the attention kernel.

Building a ``TorchDecoder`` also sets torch's global matmul flags to exact fp32 accumulation
(``exact_matmul_flags``): no bf16 split-K reductions in cuBLAS, no TF32.

torch is imported inside functions only: this module imports on a machine without torch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..model.config import ModelConfig
from ..model.reference import rope_tables
from ..model.weights import Weights
from .agreement import prefix_lengths

__all__ = ["CaptureStats", "TorchDecoder", "bf16_bits", "exact_matmul_flags", "key_mask", "match_length",
           "time_torch"]

BF16 = np.dtype(ml_dtypes.bfloat16)
_LAYER_FIELDS = ("w_qkv", "w_o", "w_gate_up", "w_down", "attn_norm", "mlp_norm")
MODES = ("eager", "graph", "compile")


def bf16_bits(array: np.ndarray) -> np.ndarray:
    """The bit patterns of a bf16 array as int16 (same shape, contiguous), ready for ``torch.from_numpy``.

    int16 rather than uint16: every torch version has full int16 support; ``.view(torch.bfloat16)`` reads the
    same 16 bits either way.
    """
    array = np.asarray(array)
    if array.dtype != BF16:
        raise TypeError(f"expected an ml_dtypes.bfloat16 array, got {array.dtype}")
    return np.ascontiguousarray(array).view(np.int16)


def key_mask(positions, keys):
    """Which cache slots each row may attend to: ``keys[t] <= positions[b]`` -> bool ``[B, T]``.

    Works on NumPy arrays and torch tensors alike (``positions [B]``, ``keys [T]`` = ``arange(T)``).
    """
    return keys[None, :] <= positions[:, None]  # [B, T]


def match_length(a: list[list[int]], b: list[list[int]]) -> int:
    """Steps for which two generations agree in every row: the shortest common prefix over the rows."""
    return min(prefix_lengths(a, b), default=0)


def time_torch(fn, warmup: int = 5, iters: int = 20, repeats: int = 10) -> list[float]:
    """GPU time per call of ``fn`` in microseconds on torch's current stream (``torch.cuda.Event``), one sample
    per repeat of ``iters`` calls (as ``rawgraphs.bench.timing.time_gpu``)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / iters)
    return samples


@dataclass(frozen=True)
class CaptureStats:
    """What making one graph cost: wall seconds (warm-up excluded) and device-memory deltas in bytes."""

    seconds: float
    allocated: int  # torch.cuda.memory_allocated() after - before
    reserved: int  # torch.cuda.max_memory_reserved() after - memory_reserved() before (the graph's pool)


def exact_matmul_flags() -> dict[str, bool]:
    """Make torch's matmuls accumulate in full fp32, as the kernels do, and return the flags now in force.

    Global, process-wide settings: cuBLAS may otherwise reduce split-K partial sums of bf16 GEMMs in bf16
    (``allow_bf16_reduced_precision_reduction``, default True), and fp32 matmuls (the attention here) must not
    round their inputs to TF32.
    """
    import torch

    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return {"allow_bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
            "allow_tf32": torch.backends.cuda.matmul.allow_tf32}


def _rmsnorm(x, w, eps: float):
    """fp32 math, bf16 out: ``x / sqrt(mean(x^2) + eps) * w``; ``x [B, D]`` bf16."""
    import torch

    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)  # [B, 1]
    return (xf * inv * w.float()).to(torch.bfloat16)


def _rope(x, cos, sin):
    """HF rotate-half RoPE in fp32 of ``x [B, nh, hd]`` bf16; ``cos, sin [B, 1, hd/2]`` fp32 -> bf16."""
    import torch

    x1, x2 = x.float().chunk(2, dim=-1)  # [B, nh, hd/2] each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(torch.bfloat16)


def _attention(q, keys, values, mask, scale: float):
    """Grouped-query attention in fp32 -> bf16: ``q [B, H, hd]``, ``keys, values [B, KVH, T, hd]`` bf16,
    ``mask [B, 1, 1, T]`` fp32 additive (0 / -inf); query head ``h`` reads kv head ``h // (H // KVH)``."""
    import torch

    B, H, hd = q.shape
    KVH = keys.shape[1]
    qg = q.float().view(B, KVH, H // KVH, hd)  # [B, KVH, G, hd]: a group's heads share one kv head
    scores = torch.matmul(qg, keys.float().transpose(-1, -2)) * scale + mask  # [B, KVH, G, T]
    p = torch.softmax(scores, dim=-1)  # [B, KVH, G, T]
    return torch.matmul(p, values.float()).view(B, H * hd).to(torch.bfloat16)  # [B, H*hd]


class TorchDecoder:
    """The decode model in plain PyTorch over static buffers for up to ``max_batch`` rows and ``max_len``
    positions; a step for batch ``B`` uses the first ``B`` rows (positions must be in ``[0, max_len)``).

    Parameters
    ----------
    cfg, weights : the model (the same ``Weights`` a ``DecodeModel`` loads).
    max_batch : rows of every static buffer.
    max_len : KV-cache slots per row; attention always spans all of them, masked by position (as gpt-fast).
    device : torch device.
    """

    def __init__(self, cfg: ModelConfig, weights: Weights, max_batch: int, max_len: int, device: str = "cuda"):
        import torch

        if not 1 <= max_len <= cfg.max_seq_len:
            raise ValueError(f"max_len {max_len} is outside 1..{cfg.max_seq_len} (max_seq_len)")
        self.cfg, self.max_batch, self.max_len = cfg, max_batch, max_len
        dev = self.device = torch.device(device)
        self.matmul_flags = self._set_flags()

        def load(a: np.ndarray):
            return torch.from_numpy(bf16_bits(a)).view(torch.bfloat16).to(dev)

        self.embed = load(weights.embed)  # [V, D]
        self.lm_head = self.embed if weights.lm_head is weights.embed else load(weights.lm_head)  # [V, D]
        self.final_norm = load(weights.final_norm)  # [D]
        self.layers = [{f: load(getattr(lw, f)) for f in _LAYER_FIELDS} for lw in weights.layers]
        cache = (cfg.n_layers, max_batch, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.k_cache = torch.zeros(cache, dtype=torch.bfloat16, device=dev)  # [L, MB, KVH, T, hd]
        self.v_cache = torch.zeros(cache, dtype=torch.bfloat16, device=dev)  # [L, MB, KVH, T, hd]
        cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, max_len)
        self.cos, self.sin = torch.from_numpy(cos).to(dev), torch.from_numpy(sin).to(dev)  # [T, hd/2]
        self.tokens = torch.zeros(max_batch, dtype=torch.long, device=dev)  # [MB] input token ids
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=dev)  # [MB]
        self.logits = torch.zeros((max_batch, cfg.vocab), dtype=torch.float32, device=dev)  # [MB, V]
        self.next_tokens = torch.zeros(max_batch, dtype=torch.long, device=dev)  # [MB] greedy output
        self.rows = torch.arange(max_batch, device=dev)  # [MB]
        self.key_index = torch.arange(max_len, device=dev)  # [T]
        self.graphs: dict[int, object] = {}  # B -> torch.cuda.CUDAGraph
        self.capture_stats: dict[int, CaptureStats] = {}
        self.compiled: dict[int, object] = {}  # B -> torch.compile'd step
        self.fp32_mm = self._probe_fp32_mm()
        # without mm(out_dtype=fp32) (older torch, CPU) an fp32 copy of the LM head keeps the logits exact
        self.lm_head_f32 = None if self.fp32_mm else self.lm_head.float()  # [V, D]

    def _probe_fp32_mm(self) -> bool:
        """Whether ``torch.mm(bf16, bf16, out_dtype=float32)`` exists here (torch >= 2.8)."""
        import torch

        a = torch.ones((2, 8), dtype=torch.bfloat16, device=self.device)
        try:
            return torch.mm(a, a.t(), out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError):
            return False

    def _mm_f32(self, a, w, w_f32=None):
        """``a [B, K] @ w [N, K]^T`` of bf16 tensors with fp32 accumulation and an fp32 ``[B, N]`` result.

        Without ``mm(out_dtype=fp32)`` it multiplies fp32 copies (``w_f32``, or ``w`` upcast per call):
        exact as well (bf16 products are exact in fp32), slower, and only for CPU or torch < 2.8.
        """
        import torch
        import torch.nn.functional as F

        if self.fp32_mm:
            return torch.mm(a, w.t(), out_dtype=torch.float32)
        return F.linear(a.float(), w.float() if w_f32 is None else w_f32)

    # ---- the operations a subclass may write differently (rawgraphs.compare.plain_twin) -----------------------
    def _set_flags(self) -> dict[str, bool]:
        """Put this twin's matmul flags in force (they are global: set before each capture and eager step)."""
        return exact_matmul_flags()

    def _mask(self, visible):
        """The attention mask for :meth:`_attend` from ``visible [B, 1, 1, T]`` bool: fp32 additive (0 / -inf)."""
        import torch

        return torch.zeros(visible.shape, dtype=torch.float32, device=self.device).masked_fill(~visible,
                                                                                            float("-inf"))

    def _attend(self, q, keys, values, mask, scale: float):
        """``q [B, H, hd]`` over ``keys, values [B, KVH, T, hd]`` -> ``[B, H*hd]`` bf16 (fp32 inside)."""
        return _attention(q, keys, values, mask, scale)

    def _swiglu(self, gate, up):
        """``silu(gate) * up`` in fp32, rounded once to bf16, as gate_up's epilogue."""
        import torch
        import torch.nn.functional as F

        return (F.silu(gate.float()) * up.float()).to(torch.bfloat16)

    def _logits(self, h):
        """The LM head's fp32 ``[B, V]`` logits of ``h [B, D]``."""
        return self._mm_f32(h, self.lm_head, self.lm_head_f32)

    def _residual(self, x, a, w):
        """``bf16(float(x) + a @ w^T)``: fp32 product, fp32 add, one rounding, as the kernels' residual epilogue;
        ``x [B, N]``, ``a [B, K]`` bf16, ``w [N, K]``."""
        import torch

        return torch.add(self._mm_f32(a, w), x).to(torch.bfloat16)  # fp32 + bf16 -> fp32, then one rounding

    # ---- the step -----------------------------------------------------------------------------------------
    def _step(self, B: int) -> None:
        """One decode step for rows ``0..B-1``: reads ``tokens``/``positions``, writes the caches and
        ``next_tokens``. Touches only static tensors, so it can be captured."""
        import torch.nn.functional as F

        c = self.cfg
        H, KVH, hd = c.n_heads, c.n_kv_heads, c.head_dim
        scale = 1.0 / math.sqrt(hd)
        tokens, pos, rows = self.tokens[:B], self.positions[:B], self.rows[:B]  # [B]
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]  # [B, 1, hd/2]
        mask = self._mask(key_mask(pos, self.key_index)[:, None, None, :])  # [B, 1, 1, T]
        x = F.embedding(tokens, self.embed)  # [B, D]
        for i, w in enumerate(self.layers):
            h = _rmsnorm(x, w["attn_norm"], c.rms_norm_eps)  # [B, D]
            q, k, v = F.linear(h, w["w_qkv"]).split([c.q_dim, c.kv_dim, c.kv_dim], dim=-1)
            q = _rope(q.view(B, H, hd), cos, sin)  # [B, H, hd]
            k = _rope(k.view(B, KVH, hd), cos, sin)  # [B, KVH, hd]
            k_cache, v_cache = self.k_cache[i], self.v_cache[i]  # [MB, KVH, T, hd]
            k_cache[rows, :, pos] = k
            v_cache[rows, :, pos] = v.view(B, KVH, hd)
            a = self._attend(q, k_cache[:B], v_cache[:B], mask, scale)  # [B, H*hd]
            x = self._residual(x, a, w["w_o"])  # [B, D] x + a @ Wo^T, one rounding
            h = _rmsnorm(x, w["mlp_norm"], c.rms_norm_eps)
            gate, up = F.linear(h, w["w_gate_up"]).chunk(2, dim=-1)  # [B, F] each
            m = self._swiglu(gate, up)  # [B, F]
            x = self._residual(x, m, w["w_down"])  # [B, D] x + m @ Wd^T
        h = _rmsnorm(x, self.final_norm, c.rms_norm_eps)
        logits = self._logits(h)  # [B, V] fp32
        self.logits[:B] = logits
        self.next_tokens[:B] = logits.argmax(dim=-1)  # the first maximum: lowest index on ties

    def _set_inputs(self, tokens, positions) -> int:
        import torch

        tokens, positions = np.asarray(tokens, np.int64), np.asarray(positions, np.int64)
        B = len(tokens)
        if not (1 <= B <= self.max_batch and positions.shape == (B,)):
            raise ValueError(f"need tokens, positions [B] with 1 <= B <= {self.max_batch}; "
                             f"got {tokens.shape}, {positions.shape}")
        if positions.min() < 0 or positions.max() >= self.max_len:
            raise ValueError(f"positions must lie in [0, {self.max_len}); got {positions.min()}..{positions.max()}")
        self.tokens[:B].copy_(torch.from_numpy(tokens))
        self.positions[:B].copy_(torch.from_numpy(positions))
        return B

    def _read(self, B: int) -> np.ndarray:
        return self.next_tokens[:B].cpu().numpy().astype(np.int32)  # synchronizes

    def read_logits(self, B: int) -> np.ndarray:
        """A copy of the last step's logits of rows ``0..B-1``, fp32 ``[B, V]`` (synchronizes)."""
        return self.logits[:B].to("cpu", copy=True).numpy()  # a copy on the CPU too: the buffer is reused

    def step_eager(self, tokens, positions) -> np.ndarray:
        """One eager step: ``tokens, positions [B]`` -> greedy next tokens ``int32 [B]``."""
        B = self._set_inputs(tokens, positions)
        self._set_flags()
        self._step(B)
        return self._read(B)

    def capture(self, B: int | None = None) -> CaptureStats:
        """Capture the step for ``B`` rows (default ``max_batch``) into a ``torch.cuda.CUDAGraph``.

        Three warm-up steps run on a side stream first (cuBLAS workspaces, SDPA backend choice), as the
        ``torch.cuda.graphs`` documentation asks. They rewrite cache slots at the current static positions with
        the current static tokens, which the next real step at those positions rewrites again.
        """
        import torch

        B = B or self.max_batch
        self._set_flags()  # cuBLAS picks its kernels at capture: under this twin's flags
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self._step(B)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step(B)
        torch.cuda.synchronize()
        stats = CaptureStats(time.perf_counter() - t0, torch.cuda.memory_allocated() - allocated,
                             torch.cuda.max_memory_reserved() - reserved)
        self.graphs[B], self.capture_stats[B] = graph, stats
        return stats

    def step_graph(self, tokens, positions) -> np.ndarray:
        """One step by graph replay (captured on first use for this ``B``) -> next tokens ``int32 [B]``."""
        B = self._set_inputs(tokens, positions)
        if B not in self.graphs:
            self.capture(B)
        self.graphs[B].replay()
        return self._read(B)

    def try_compile(self, B: int, budget_s: float = 120.0) -> tuple[object | None, str]:
        """``torch.compile(mode="reduce-overhead")`` of the step for ``B`` rows, warmed up (compile, record).

        Returns ``(fn, message)``: ``fn()`` runs one compiled step, or None with the reason when compiling
        raised or took longer than ``budget_s`` (a compile cannot be interrupted; the budget is checked after).
        """
        import torch

        for t in self._static_tensors():
            torch._dynamo.mark_static_address(t)  # fixed addresses: no cudagraph input copies of weights/caches
        compiled = torch.compile(self._step, mode="reduce-overhead", dynamic=False)

        def fn():
            torch.compiler.cudagraph_mark_step_begin()
            compiled(B)

        t0 = time.perf_counter()
        try:
            for _ in range(3):  # compile + warm-up, record, first replay
                fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (any compiler failure is reported, not fatal)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            return None, f"torch.compile failed after {time.perf_counter() - t0:.0f} s: {type(e).__name__}: {first}"
        seconds = time.perf_counter() - t0
        if seconds > budget_s:
            return None, f"torch.compile took {seconds:.0f} s, over its {budget_s:.0f} s budget: left out"
        self.compiled[B] = fn
        return fn, f"torch.compile(mode='reduce-overhead') ready in {seconds:.1f} s"

    def _static_tensors(self) -> list:
        weights = [self.embed, self.lm_head, self.final_norm] + [t for w in self.layers for t in w.values()]
        if self.lm_head_f32 is not None:
            weights.append(self.lm_head_f32)
        return weights + [self.k_cache, self.v_cache, self.cos, self.sin, self.tokens, self.positions,
                          self.logits, self.next_tokens, self.rows, self.key_index]

    def runner(self, B: int, mode: str):
        """A callable that enqueues one step for ``B`` rows on the current inputs: eager, graph or compile
        (the graph / compiled step must exist: ``capture(B)`` / ``try_compile(B)``)."""
        if mode == "eager":
            return lambda: (self._set_flags(), self._step(B))  # flags are global: another twin may have set its own
        if mode == "graph":
            return self.graphs[B].replay
        if mode == "compile":
            return self.compiled[B]
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")

    def generate(self, prompts: list[list[int]], n_new: int, mode: str = "graph",
                 logits: list[np.ndarray] | None = None) -> list[list[int]]:
        """Greedy-decode ``n_new`` tokens after equal-length prompts (all rows start at position 0), feeding the
        prompt token by token as ``rawgraphs.model.generate.generate`` does; ``mode`` eager / graph / compile.
        ``logits``, when given, receives every step's fp32 ``[B, V]`` logits (prompt steps included)."""
        B, P = len(prompts), len(prompts[0]) if prompts else 0
        if P == 0 or any(len(p) != P for p in prompts) or n_new < 1:
            raise ValueError("need equal-length, non-empty prompts and n_new >= 1")
        if P - 1 + n_new > self.max_len:
            raise ValueError(f"{P} prompt + {n_new} new tokens need {P - 1 + n_new} slots > max_len {self.max_len}")
        if mode == "graph" and B not in self.graphs:
            self.capture(B)
        run = self.runner(B, mode)
        out: list[list[int]] = [[] for _ in range(B)]
        for t in range(P - 1 + n_new):
            tokens = [p[t] if t < P else o[-1] for p, o in zip(prompts, out)]
            self._set_inputs(tokens, [t] * B)
            run()
            if logits is not None:
                logits.append(self.read_logits(B))
            if t >= P - 1:
                for o, nxt in zip(out, self._read(B)):
                    o.append(int(nxt))
        return out
