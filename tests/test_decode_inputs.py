"""DecodeModel's input checks, without a GPU: the kernels index the embedding, the KV pool and the rope tables with
the token ids, block ids and positions unchecked, so a bad one must be refused on the host."""

import numpy as np
import pytest

from rawgraphs.model import ModelConfig
from rawgraphs.model.decode import DecodeModel


@pytest.fixture(scope="module")
def model():
    return DecodeModel(ModelConfig.preset("tiny"), None, max_batch=4, num_blocks=40, plan_only=True)


def good(rng, B=3):
    return rng.integers(0, 512, B), rng.integers(0, 200, B), rng.integers(0, 40, (B, 16))


def test_valid_inputs_come_back_as_int32(model, rng):
    tokens, positions, tables = good(rng)
    tokens[1], positions[1] = -5, -1  # an inactive row's token is never read
    out = model.checked_inputs(tokens, positions, tables)
    assert [a.dtype for a in out] == [np.int32] * 3
    for got, want in zip(out, (tokens, positions, tables)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("field, value, match", [
    ("token", 512, r"token ids must be in \[0, 512\); got \[512\]"),
    ("token", -1, r"token ids must be in \[0, 512\); got \[-1\]"),
    ("block", 40, r"block ids must be in \[0, 40\)"),
    ("block", -2, r"block ids must be in \[0, 40\)"),
    ("position", 256, "a position is past 256"),
])
def test_out_of_range_ids_are_refused(model, rng, field, value, match):
    tokens, positions, tables = good(rng)
    {"token": tokens, "position": positions}.get(field, tables[1])[1] = value
    with pytest.raises(ValueError, match=match):
        model.checked_inputs(tokens, positions, tables)


def test_a_table_too_short_for_the_position_is_refused(model, rng):
    tokens, positions, _ = good(rng)
    positions[0] = 64  # block 4 of its sequence: a table of 4 blocks holds positions 0-63
    with pytest.raises(ValueError, match="a position is past 64: .* a block table of 4 blocks holds 64"):
        model.checked_inputs(tokens, positions, rng.integers(0, 40, (3, 4)))


@pytest.mark.parametrize("shapes", [((3,), (2,), (3, 16)), ((3,), (3,), (2, 16)), ((5,), (5,), (5, 16)),
                                    ((3,), (3,), (3, 17)), ((3, 1), (3,), (3, 16))])
def test_shapes_that_do_not_agree_are_refused(model, shapes):
    with pytest.raises(ValueError, match=r"inputs must be \[B\], \[B\], \[B, <= 16\] with B <= 4"):
        model.checked_inputs(*(np.zeros(s, np.int32) for s in shapes))
