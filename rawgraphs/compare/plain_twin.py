"""``PlainTorchDecoder``: the model as a PyTorch user writes it with torch's defaults, the baseline the speed target is
read against.

``TorchDecoder`` rounds where the kernels round, so its tokens can be checked against rawgraphs': that costs it fp32
residual products and logits (``mm(out_dtype=fp32)``), fp32 attention matmuls, fp32 SwiGLU, and cuBLAS without its
reduced-precision split-K (``exact_matmul_flags``), none of which a PyTorch user would choose. The plain twin keeps the
same structure, weights, static buffers and cache, and changes only those: ``torch.addmm`` on bf16 for the residual
projections, ``F.scaled_dot_product_attention`` (grouped-query) over the masked cache, ``silu(gate) * up`` in bf16, a
bf16 LM head read as fp32, and torch's default matmul flags. It rounds differently from the kernels (one bf16 ulp in
~17-20% of some ops' outputs, benchmarks/twin_ops.py), so it is timed, not token-checked.
"""

from __future__ import annotations

from .torch_model import TorchDecoder

__all__ = ["PlainTorchDecoder", "default_matmul_flags"]


def default_matmul_flags() -> dict[str, bool]:
    """Put torch's default matmul flags in force and return them: cuBLAS may reduce bf16 split-K partial sums in bf16
    (``allow_bf16_reduced_precision_reduction``); fp32 matmuls stay fp32 (``allow_tf32`` False); cuDNN may use TF32."""
    import torch

    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = True
    return {"allow_bf16_reduced_precision_reduction": True, "allow_tf32": False}


class PlainTorchDecoder(TorchDecoder):
    """:class:`~rawgraphs.compare.torch_model.TorchDecoder` with the operations a PyTorch user would write."""

    def _set_flags(self) -> dict[str, bool]:
        return default_matmul_flags()

    def _mask(self, visible):
        return visible  # [B, 1, 1, T] bool, True where a key may be attended: SDPA's boolean mask

    def _attend(self, q, keys, values, mask, scale: float):
        import torch.nn.functional as F

        B, H, hd = q.shape
        out = F.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=mask, scale=scale,
                                             enable_gqa=True)  # [B, H, 1, hd]
        return out.reshape(B, H * hd)

    def _swiglu(self, gate, up):
        import torch.nn.functional as F

        return F.silu(gate) * up

    def _logits(self, h):
        import torch.nn.functional as F

        return F.linear(h, self.lm_head).float()

    def _residual(self, x, a, w):
        import torch

        return torch.addmm(x, a, w.t())
