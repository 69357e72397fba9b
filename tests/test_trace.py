"""The decode step's block trace (kernels/pdl.cuh with -DRG_TRACE, rawgraphs.model.trace)."""

import math

import numpy as np
import pytest

from rawgraphs.model.plans import GEMV_GRID_KERNELS
from rawgraphs.model.trace import RECORD, launch_spans


def test_spans_group_by_grid_in_launch_order(records):
    recs = records([(9, 1 << 32 | 0, 1500, 1700, 0, 0), (7, 0, 1000, 1200, 1400, 900),
                    (7, 3 << 32 | 1, 1100, 1250, 1550, 1050), (9, 2 << 32 | 1, 1600, 1800, 0, 0)])
    a, b = launch_spans(recs, ["a", "b"])
    # prologue: median of 100 and 50; busy: each block's release -> exit, 200 and 300 ns (median, longest)
    assert a[:8] == ("a", 2, (0.0, 100.0), (200.0, 250.0), (400.0, 550.0), (-100.0, 50.0), 75.0, (250.0, 300.0))
    assert math.isnan(a.stage) and math.isnan(a.units)  # no staged / summed marks recorded
    assert b.name == "b" and b.blocks == 2 and b.arrive == (500.0, 600.0) and b.release == (700.0, 800.0)
    assert all(math.isnan(t) for t in b.exit + b.enter + (b.prologue,) + b.busy)  # no entry or exit times for b
    with pytest.raises(ValueError, match="2 launches, the step has 3"):
        launch_spans(recs, ["a", "b", "c"])


def test_spans_split_a_gemv_blocks_time_at_its_marks_and_read_old_records(records):
    """stage: each block's release -> input staged, units: staged -> units stored (medians); records saved before
    the marks existed (six fields) give NaN for both and everything else as before."""
    recs = records([(7, 0, 1000, 1200, 2000, 900, 1500, 1800), (7, 1, 1100, 1300, 2200, 950, 1700, 2100),
                    (7, 2, 1100, 1300, 2200, 950, 1600, 2000)])
    (a,) = launch_spans(recs, ["a"])
    assert (a.stage, a.units) == (300.0, 400.0)  # medians of 300, 400, 300 and 300, 400, 400
    old = np.array([r[:6] for r in recs.tolist()], dtype=np.dtype(RECORD.descr[:6]))
    (b,) = launch_spans(old, ["a"])
    assert b[:8] == a[:8] and math.isnan(b.stage) and math.isnan(b.units)


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
        if ln.kernel.name in GEMV_GRID_KERNELS:  # every gemv-family block also records its entry and exit
            gemv_blocks += blocks
            assert s.exit[0] >= s.release[0] and s.exit[1] >= s.exit[0], ln.name
            assert s.enter[0] <= s.arrive[0] and s.enter[1] >= s.enter[0], ln.name
            assert 0 < s.busy[0] <= s.busy[1] <= s.exit[1] - s.release[0], ln.name
        else:
            assert math.isnan(s.exit[0]) and math.isnan(s.enter[0]), ln.name
    assert gemv_blocks and np.count_nonzero(recs["exit"]) == np.count_nonzero(recs["entered"]) == gemv_blocks
    gemv = recs[recs["entered"] != 0]
    assert np.all(gemv["entered"] <= gemv["arrived"]) and np.all(gemv["released"] <= gemv["exit"])
    # and, every block of the tiny model's rows being active, when its input was staged and its units stored
    assert np.all(gemv["released"] <= gemv["staged"]) and np.all(gemv["staged"] <= gemv["summed"])
    assert np.all(gemv["summed"] <= gemv["exit"]) and np.count_nonzero(recs["staged"]) == gemv_blocks
    assert len({int(r) >> 32 for r in recs["where"]}) > 1  # blocks on more than one SM
    trace.close()
