"""DecodeRunner on the GPU: padded graph steps give the eager tokens, padding never touches real rows, sequences
join and leave by data alone, and capturing every size twice leaks nothing."""

import gc

import numpy as np
import pytest

from rawgraphs.context import device
from rawgraphs.model import BlockAllocator, ModelConfig, Weights, make_block_tables
from rawgraphs.model.decode import DecodeModel
from rawgraphs.runner import DecodeRunner

pytestmark = pytest.mark.gpu
SIZES = (1, 2, 4, 8, 16, 24)


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig.preset("tiny")
    return DecodeModel(cfg, Weights.random(cfg, seed=21), max_batch=24)


def drive(model, step, schedule):
    """Sequences (join_step, prompt, n_new) join and leave; each step passes only the live ones."""
    alloc = BlockAllocator(model.num_blocks, seed=4)
    outs = [[] for _ in schedule]
    blocks = [[] for _ in schedule]
    t = 0
    while any(len(o) < n for o, (_, _, n) in zip(outs, schedule)):
        live = [i for i, (j, _, n) in enumerate(schedule) if j <= t and len(outs[i]) < n]
        if live:
            toks, pos = [], []
            for i in live:
                j, prompt, _ = schedule[i]
                p = t - j
                toks.append(prompt[p] if p < len(prompt) else outs[i][-1])
                pos.append(p)
                alloc.grow(blocks[i], p + 1)
            nxt = step(np.array(toks), np.array(pos), make_block_tables([blocks[i] for i in live], model.max_blocks))
            for k, i in enumerate(live):
                if pos[k] >= len(schedule[i][1]) - 1:
                    outs[i].append(int(nxt[k]))
        t += 1
    for i in range(len(schedule)):
        alloc.free(blocks[i])
    return outs


def schedule_for(rng, n, vocab):
    return [(int(rng.integers(0, 12)), list(rng.integers(1, vocab, int(rng.integers(1, 6)))),
             int(rng.integers(3, 15))) for _ in range(n)]


def test_graph_steps_give_eager_tokens_with_joins_and_leaves(model, stream, rng):
    schedule = schedule_for(rng, 19, model.cfg.vocab)  # live batch sizes wander between 1 and 19
    runner = DecodeRunner(model, SIZES, stream=stream)
    runner.capture(progress=False)
    graph_tokens = drive(model, runner.step, schedule)
    eager = DecodeRunner(model, SIZES, eager=True, stream=stream)
    assert graph_tokens == drive(model, eager.step, schedule)
    assert runner.stats.fallback_steps == 0 and runner.stats.padded_rows > 0
    assert set(runner.stats.graph_steps) > {1, 8}


def test_padding_rows_do_not_change_real_rows(model, stream, rng):
    runner = DecodeRunner(model, SIZES, stream=stream)
    runner.capture(progress=False)
    alloc = BlockAllocator(model.num_blocks)
    blocks = [alloc.grow([], 40) for _ in range(6)]
    tables = make_block_tables(blocks, model.max_blocks)
    tokens, positions = rng.integers(1, 500, 6), np.array([3, 17, 31, 0, 39, 12])
    for layer in model.layers:  # random history in every cache slot attention may read
        for cache in (layer.k_cache, layer.v_cache):
            cache.copy_from(rng.standard_normal(cache.shape).astype(cache.dtype))
    five = runner.step(tokens[:5], positions[:5], tables[:5])
    logits5 = model.read_logits(5).copy()
    six = runner.step(tokens, positions, tables)  # row 5 is now real instead of padding; both run as 8
    np.testing.assert_array_equal(five, six[:5])
    np.testing.assert_array_equal(logits5, model.read_logits(5))


def test_capturing_every_size_twice_leaks_nothing(model, stream):
    dev = device()

    def capture_all():
        r = DecodeRunner(model, SIZES, stream=stream)
        r.capture(progress=False)
        nodes = sum(rep.nodes for rep in r.reports)
        del r
        gc.collect()
        stream.synchronize()
        return nodes

    capture_all()
    free0 = dev.memory_info()[0]
    assert capture_all() > 0
    free1 = dev.memory_info()[0]
    assert abs(free0 - free1) <= 4 << 20, f"free memory moved by {free0 - free1} bytes"
