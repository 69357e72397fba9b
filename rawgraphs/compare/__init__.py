"""rawgraphs against plain PyTorch: the same model and weights as a gpt-fast-style ``TorchDecoder``.

Importing this package never imports torch (``TorchDecoder`` does, when constructed).
"""

from .plain_twin import PlainTorchDecoder
from .torch_model import CaptureStats, TorchDecoder, bf16_bits, key_mask, match_length, time_torch

__all__ = ["CaptureStats", "PlainTorchDecoder", "TorchDecoder", "bf16_bits", "key_mask", "match_length", "time_torch"]
