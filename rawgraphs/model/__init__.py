"""Llama-style decode model: config, weights, the float64 NumPy reference and paged-KV block tables.

The GPU model is :class:`rawgraphs.model.decode.DecodeModel`; the on-device loop :mod:`rawgraphs.model.loop`, and the
loop launched once and rung through pinned memory :mod:`rawgraphs.model.resident`.
"""

from .blocks import BlockAllocator, make_block_tables
from .config import ModelConfig
from .reference import ReferenceModel
from .weights import LayerWeights, Weights

__all__ = ["BlockAllocator", "LayerWeights", "ModelConfig", "ReferenceModel", "Weights", "make_block_tables"]
