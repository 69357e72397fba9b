"""generate()'s host bookkeeping on the CPU, driving the NumPy reference through the DecodeModel interface:
late joins, padding rows, finished rows going inactive, and block tables that grow with the context."""

import numpy as np
import pytest

from rawgraphs.model import ModelConfig, ReferenceModel, Weights
from rawgraphs.model.generate import generate


class Reference:
    """What generate() needs of a model: pool sizes and a step function; records every step's inputs."""

    def __init__(self, cfg, weights):
        self.num_blocks, self.max_blocks = 64, cfg.max_seq_len // 16
        self.ref = ReferenceModel(cfg, weights, self.num_blocks)
        self.seen = []

    def step(self, tokens, positions, tables):
        self.seen.append((tokens.copy(), positions.copy(), tables.copy()))
        return np.argmax(self.ref.step(tokens, positions, tables), axis=1).astype(np.int32)


def setup():
    cfg = ModelConfig.preset("tiny")
    return cfg, Weights.random(cfg, seed=4)


def test_rows_join_late_finish_and_match_decoding_alone(rng):
    cfg, w = setup()
    prompts = [list(rng.integers(1, cfg.vocab, n)) for n in (3, 5)]
    together = Reference(cfg, w)
    out = generate(together, prompts + [None], 6, starts=[0, 4, 0], step=together.step)
    assert [len(t) for t in out.tokens] == [6, 6, 0]
    for b, prompt in enumerate(prompts):
        alone = Reference(cfg, w)
        assert generate(alone, [prompt], 6, step=alone.step).tokens[0] == out.tokens[b]
    assert out.steps == len(together.seen) == 4 + 5 - 1 + 6  # the late row's prompt ends last
    assert all(positions[2] == -1 for _, positions, _ in together.seen)  # the padding row is never active
    first_pos = [p[1] for _, p, _ in together.seen[:5]]
    assert first_pos == [-1, -1, -1, -1, 0]  # row 1 joins at step 4
    last = together.seen[-1][1]
    assert last[0] == -1 and last[1] == 5 + 6 - 2  # row 0 finished and went inactive; row 1 feeds its 5th new


def test_block_tables_grow_every_16_tokens(rng):
    cfg, w = setup()
    model = Reference(cfg, w)
    generate(model, [list(rng.integers(1, cfg.vocab, 2))], 40, step=model.step)
    for _, positions, tables in model.seen:  # one row, an unseeded allocator: blocks 0, 1, 2, ... in order
        n = -(-(int(positions[0]) + 1) // 16)  # blocks that hold the context after this step's append
        np.testing.assert_array_equal(tables[0, :n], np.arange(n))
        assert (tables[0, n:] == 0).all()


def test_bad_starts_and_prompts_are_refused(rng):
    cfg, w = setup()
    ref = Reference(cfg, w)
    prompts = [list(rng.integers(1, cfg.vocab, 3)) for _ in range(2)]
    for starts in ([0], [0, -2], [0, 1.5], [0, 1, 2]):  # too few (a row was dropped), negative, not an int, too many
        with pytest.raises(ValueError, match="starts must be 2 ints >= 0"):
            generate(ref, prompts, 4, starts=starts, step=ref.step)
    with pytest.raises(ValueError, match="nothing to decode"):
        generate(ref, [None, None], 4, step=ref.step)
    assert ref.seen == []  # refused before any step
    assert len(generate(ref, prompts, 2, starts=np.array([0, 1]), step=ref.step).tokens[1]) == 2
