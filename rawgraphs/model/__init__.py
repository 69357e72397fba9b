"""Llama-style decode model: config, weights, and the float64 NumPy reference."""

from .config import ModelConfig
from .reference import BlockAllocator, ReferenceModel, make_block_tables
from .weights import LayerWeights, Weights

__all__ = ["BlockAllocator", "LayerWeights", "ModelConfig", "ReferenceModel", "Weights", "make_block_tables"]
