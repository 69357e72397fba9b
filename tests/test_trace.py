"""The decode step's block trace (kernels/pdl.cuh with -DRG_TRACE, rawgraphs.model.trace)."""

import math

import numpy as np
import pytest

from rawgraphs.model.trace import RECORD, launch_spans


def records(rows):
    return np.array(rows, dtype=RECORD)


def test_spans_group_by_grid_in_launch_order():
    recs = records([(9, 1 << 32 | 0, 1500, 1700, 0, 0), (7, 0, 1000, 1200, 1400, 900),
                    (7, 3 << 32 | 1, 1100, 1250, 1550, 1050), (9, 2 << 32 | 1, 1600, 1800, 0, 0)])
    a, b = launch_spans(recs, ["a", "b"])
    # prologue: median of 100 and 50; busy: each block's release -> exit, 200 and 300 ns (median, longest)
    assert a == ("a", 2, (0.0, 100.0), (200.0, 250.0), (400.0, 550.0), (-100.0, 50.0), 75.0, (250.0, 300.0))
    assert b.name == "b" and b.blocks == 2 and b.arrive == (500.0, 600.0) and b.release == (700.0, 800.0)
    assert all(math.isnan(t) for t in b.exit + b.enter + (b.prologue,) + b.busy)  # no entry or exit times for b
    with pytest.raises(ValueError, match="2 launches, the step has 3"):
        launch_spans(recs, ["a", "b", "c"])


@pytest.mark.gpu
def test_traced_step_records_every_block_and_changes_no_result(stream, rng):
    from rawgraphs.model import ModelConfig, Weights
    from rawgraphs.model.decode import DecodeModel
    from rawgraphs.model.generate import generate
    from rawgraphs.model.trace import BlockTrace

    cfg = ModelConfig.preset("tiny")
    w = Weights.random(cfg, seed=4)
    plain, traced = DecodeModel(cfg, w), DecodeModel(cfg, w, compile_options=("-DRG_TRACE",))
    with pytest.raises(ValueError, match="RG_TRACE"):
        BlockTrace(plain.modules)
    trace = BlockTrace(traced.modules)
    prompt = [list(rng.integers(1, cfg.vocab, 5))]
    want = generate(plain, prompt, 4, stream, keep_logits=True, seed=1)
    got = generate(traced, prompt, 4, stream, keep_logits=True, seed=1)
    assert got.tokens == want.tokens
    for a, b in zip(got.logits, want.logits):
        np.testing.assert_array_equal(a, b)

    launches = traced.step_launches(1)
    trace.reset()
    traced.run_eager(1, stream)
    stream.synchronize()
    recs = trace.records()
    spans = launch_spans(recs, [ln.name for ln in launches])
    gemv_blocks = 0
    for ln, s in zip(launches, spans):
        blocks = math.prod(ln.shape.grid)
        if "attention" in ln.name:  # splits past the context return without waiting: no record
            assert 1 <= s.blocks <= blocks, ln.name
        else:
            assert s.blocks == blocks, ln.name
        assert s.release[0] >= s.arrive[0] and s.release[1] >= s.release[0], ln.name
        if ln.kernel.name == "gemv":  # every gemv block also records its entry and exit
            gemv_blocks += blocks
            assert s.exit[0] >= s.release[0] and s.exit[1] >= s.exit[0], ln.name
            assert s.enter[0] <= s.arrive[0] and s.enter[1] >= s.enter[0], ln.name
            assert 0 < s.busy[0] <= s.busy[1] <= s.exit[1] - s.release[0], ln.name
        else:
            assert math.isnan(s.exit[0]) and math.isnan(s.enter[0]), ln.name
    assert gemv_blocks and np.count_nonzero(recs["exit"]) == np.count_nonzero(recs["entered"]) == gemv_blocks
    gemv = recs[recs["entered"] != 0]
    assert np.all(gemv["entered"] <= gemv["arrived"]) and np.all(gemv["released"] <= gemv["exit"])
    assert len({int(r) >> 32 for r in recs["where"]}) > 1  # blocks on more than one SM
    trace.close()
