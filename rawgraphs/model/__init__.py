"""Llama-style decode model: config, weights, and the float64 NumPy reference."""

from .config import ModelConfig
from .blocks import BlockAllocator, make_block_tables
from .reference import ReferenceModel
from .weights import LayerWeights, Weights

__all__ = ["BlockAllocator", "LayerWeights", "ModelConfig", "ReferenceModel", "Weights", "make_block_tables"]
