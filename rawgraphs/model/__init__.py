"""Llama-style decode model: config, weights, and the float64 NumPy reference."""

from .blocks import BlockAllocator, make_block_tables
from .config import ModelConfig
from .reference import ReferenceModel
from .weights import LayerWeights, Weights

__all__ = ["BlockAllocator", "LayerWeights", "ModelConfig", "ReferenceModel", "Weights", "make_block_tables"]
