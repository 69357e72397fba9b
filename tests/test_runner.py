"""DecodeRunner without a GPU: size selection and padding for every B, fallback policy, report formatting."""

import warnings

import numpy as np
import pytest

from rawgraphs.runner import DEFAULT_CAPTURE_SIZES, CaptureReport, DecodeRunner, NoGraphError, pad_inputs, pick_size


@pytest.mark.parametrize("B", range(1, 257))
def test_smallest_captured_size_at_least_b(B):
    size = pick_size(B, DEFAULT_CAPTURE_SIZES)
    assert size >= B and size in DEFAULT_CAPTURE_SIZES
    assert all(s < B for s in DEFAULT_CAPTURE_SIZES if s < size)


def test_sizes_edges():
    assert pick_size(37, DEFAULT_CAPTURE_SIZES) == 48
    assert pick_size(257, DEFAULT_CAPTURE_SIZES) is None
    with pytest.raises(ValueError):
        pick_size(0, DEFAULT_CAPTURE_SIZES)


def test_padding_marks_rows_inactive_and_keeps_real_rows(rng):
    tokens = rng.integers(1, 100, 37)
    positions = rng.integers(0, 500, 37)
    tables = rng.integers(0, 1000, (37, 32))
    t, p, tab = pad_inputs(tokens, positions, tables, 48)
    assert t.shape == (48,) and p.shape == (48,) and tab.shape == (48, 32)
    np.testing.assert_array_equal(t[:37], tokens)
    np.testing.assert_array_equal(p[:37], positions)
    np.testing.assert_array_equal(tab[:37], tables)
    assert (p[37:] == -1).all() and (t[37:] == 0).all() and (tab[37:] == 0).all()


@pytest.mark.parametrize("bad", [
    (np.ones(2), np.zeros(1), np.zeros((2, 4))),   # one position for two tokens: must not broadcast
    (np.ones(2), np.zeros(2), np.zeros((1, 4))),   # one table row for two tokens
    (np.ones(2), np.zeros(2), np.zeros(8)),        # a table that is not [B, MB]
    (np.ones(5), np.zeros(5), np.zeros((5, 4))),   # more rows than the size
])
def test_padding_refuses_inputs_that_do_not_agree(bad):
    with pytest.raises(ValueError, match=r"inputs must be \[B\], \[B\], \[B, MB\] with B <= 4"):
        pad_inputs(*bad, 4)


class FakeModel:
    """Records what the runner asks of the model (no GPU)."""

    def __init__(self, max_batch):
        self.max_batch, self.calls = max_batch, []

    def set_inputs(self, tokens, positions, tables, stream):
        self.calls.append(("inputs", len(tokens)))

    def run_eager(self, B, stream):
        self.calls.append(("eager", B))

    def read_tokens(self, B, stream):
        return np.arange(B, dtype=np.int32)


def inputs(B):
    return np.ones(B, np.int32), np.zeros(B, np.int32), np.zeros((B, 4), np.int32)


def test_batch_above_largest_size_raises_by_default():
    runner = DecodeRunner(FakeModel(300), (1, 2, 4), stream=object())
    with pytest.raises(NoGraphError, match="above the largest capture size 4"):
        runner.step(*inputs(5))


def test_eager_fallback_warns_once_and_counts_every_step():
    model = FakeModel(300)
    runner = DecodeRunner(model, (1, 2, 4), fallback="eager", stream=object())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert list(runner.step(*inputs(5))) == [0, 1, 2, 3, 4]
    assert len([w for w in caught if "running eagerly" in str(w.message)]) == 1
    assert runner.stats.fallback_steps == 3 and ("eager", 5) in model.calls


def test_a_batch_past_the_models_buffers_says_so_even_with_the_eager_fallback():
    runner = DecodeRunner(FakeModel(4), (1, 2, 4), fallback="eager", stream=object())
    with pytest.raises(NoGraphError, match=r"the model's buffers hold 4 rows: build the DecodeModel with max_batch "
                                           r">= 5\.$"):
        runner.step(*inputs(5))


def test_enforce_eager_runs_exact_size_without_graphs():
    model = FakeModel(8)
    runner = DecodeRunner(model, (4, 8), eager=True, stream=object())
    assert runner.capture() == []
    runner.step(*inputs(3))
    assert model.calls == [("inputs", 3), ("eager", 3)] and runner.stats.eager_steps == 1


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="max_batch"):
        DecodeRunner(FakeModel(8), (4, 16), stream=object())
    with pytest.raises(ValueError, match="fallback"):
        DecodeRunner(FakeModel(8), (4,), fallback="silent", stream=object())


def test_report_lists_every_size_and_totals():
    runner = DecodeRunner(FakeModel(8), (4, 8), stream=object())
    runner.reports = [CaptureReport(4, 10.0, 2.0, 0.5, 150, 2 << 20, 0),
                      CaptureReport(8, 11.0, 2.5, 0.5, 160, 3 << 20, 0)]
    text = runner.report().splitlines()
    assert text[0] == "captured 2 sizes"
    total = text[-1].split()
    assert total[0] == "total" and float(total[1]) == 21.0 and total[4] == "310" and float(total[5]) == 5.0
