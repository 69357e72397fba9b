"""The on-device decode loop: tokens equal step-by-step decoding, and it stops exactly at EOS or at N."""

import numpy as np
import pytest

from rawgraphs.model import BlockAllocator, ModelConfig, Weights, make_block_tables
from rawgraphs.model.decode import DecodeModel
from rawgraphs.model.generate import model_step
from rawgraphs.model.loop import DeviceLoop

pytestmark = pytest.mark.gpu
B, N = 5, 24


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig.preset("tiny")
    return DecodeModel(cfg, Weights.random(cfg, seed=8), max_batch=B)


def setup_rows(model, rng, steps=N):
    """Random KV history; returns each row's length and block tables covering length + ``steps``."""
    for layer in model.layers:  # random history in every cache slot (positions below lens are read, not written)
        for cache in (layer.k_cache, layer.v_cache):
            cache.copy_from(rng.standard_normal(cache.shape).astype(cache.dtype))
    alloc = BlockAllocator(model.num_blocks, seed=1)
    lens = rng.integers(1, 9, B)
    blocks = [alloc.grow([], int(n) + steps + 1) for n in lens]
    tables = make_block_tables(blocks, model.max_blocks)
    return lens, tables


def step_by_step(model, stream, tokens, positions, tables, steps, eos):
    step = model_step(model, B, stream, "capture")
    out = [[] for _ in range(B)]
    tokens, positions = tokens.copy(), positions.copy()
    for _ in range(steps):
        nxt = step(tokens, positions, tables)
        for b in range(B):
            if positions[b] >= 0:
                out[b].append(int(nxt[b]))
                tokens[b] = nxt[b]
                positions[b] = -1 if nxt[b] == eos else positions[b] + 1
    return out


def test_loop_tokens_equal_step_by_step_and_stop_at_n(model, stream, rng):
    lens, tables = setup_rows(model, rng)
    tokens = rng.integers(1, model.cfg.vocab, B).astype(np.int32)
    positions = lens.astype(np.int32)
    positions[3] = -1  # an inactive row
    loop = DeviceLoop(model, B, N, eos=-5, stream=stream)  # an EOS that never comes: runs N steps
    got = loop.run(tokens, positions, tables)
    assert loop.steps_taken == N
    want = step_by_step(model, stream, tokens, positions, tables, N, eos=-5)
    assert got == want and got[3] == [] and all(len(got[b]) == N for b in (0, 1, 2, 4))
    with pytest.raises(ValueError, match=f"decodes {B} rows; got {B - 2}"):  # rows 3-4 would reuse stale inputs
        loop.run(tokens[:-2], positions[:-2], tables[:-2])


def test_loop_stops_exactly_at_eos_per_row(model, stream, rng):
    lens, tables = setup_rows(model, rng)
    tokens = rng.integers(1, model.cfg.vocab, B).astype(np.int32)
    positions = lens.astype(np.int32)
    free_run = step_by_step(model, stream, tokens, positions, tables, N, eos=-5)
    # plant EOS: pick the token row 0 emits at step 6 as EOS; every row stops at its first occurrence of it
    eos = free_run[0][6]
    want = step_by_step(model, stream, tokens, positions, tables, N, eos=eos)
    loop = DeviceLoop(model, B, N, eos=eos, stream=stream)
    got = loop.run(tokens, positions, tables)
    assert got == want
    assert got[0][-1] == eos and len(got[0]) <= 7
    last = max(len(r) for r in want)
    assert loop.steps_taken == last  # the loop ended when the last live row hit EOS (or N)
