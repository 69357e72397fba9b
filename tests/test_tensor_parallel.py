"""Tensor-parallel sharding on the CPU: shards are valid models, and the split model (partial sums added as an
all-reduce would) decodes like the whole one."""

import numpy as np
import pytest

from rawgraphs.model import BlockAllocator, ModelConfig, ReferenceModel, Weights, make_block_tables
from rawgraphs.model.tensor_parallel import TensorParallelReference, local_config, shard

CFG = ModelConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=4, ffn_dim=192, vocab=300, max_seq_len=128)


def decode(model, tokens0, steps):
    alloc = BlockAllocator(32, seed=2)
    B = len(tokens0)
    blocks = [[] for _ in range(B)]
    tokens, out = np.asarray(tokens0), []
    for pos in range(steps):
        for b in range(B):
            alloc.grow(blocks[b], pos + 1)
        logits = model.step(tokens, np.full(B, pos), make_block_tables(blocks, 8))
        out.append(logits)
        tokens = np.argmax(logits, axis=1)
    return out


def test_shards_are_models_of_the_local_config():
    w = Weights.random(CFG, seed=1)
    parts = shard(w, 2)
    local = local_config(CFG, 2)
    assert (local.n_heads, local.n_kv_heads, local.ffn_dim, local.head_dim) == (4, 2, 96, 8)
    assert all(p.cfg == local for p in parts)
    # every weight element of the split matrices lands in exactly one shard
    for name in ("w_qkv", "w_gate_up"):
        total = sum(getattr(p.layers[0], name).size for p in parts)
        assert total == getattr(w.layers[0], name).size
    np.testing.assert_array_equal(np.concatenate([p.layers[1].w_down for p in parts], axis=1), w.layers[1].w_down)
    assert parts[1].embed is w.embed and parts[0].layers[0].attn_norm is w.layers[0].attn_norm


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_split_model_equals_the_whole_in_float64(tp):
    w = Weights.random(CFG, seed=3)
    whole = decode(ReferenceModel(CFG, w, 32, bf16_activations=False), [5, 17, 250], 20)
    split = decode(TensorParallelReference(CFG, w, tp, 32, bf16_activations=False), [5, 17, 250], 20)
    for a, b in zip(whole, split):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-10)


def test_split_model_gives_the_same_greedy_tokens_with_bf16_activations():
    w = Weights.random(CFG, seed=4)
    whole = decode(ReferenceModel(CFG, w, 32), [7, 8], 24)
    split = decode(TensorParallelReference(CFG, w, 2, 32), [7, 8], 24)
    assert [list(np.argmax(a, 1)) for a in whole] == [list(np.argmax(b, 1)) for b in split]


def test_indivisible_splits_are_refused():
    with pytest.raises(ValueError, match="n_kv_heads"):
        local_config(CFG, 8)
