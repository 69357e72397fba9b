"""The resident decode loop: one graph launch serves request after request rung on a pinned doorbell; its tokens
equal step-by-step decoding (from staged inputs, again, and resumed from the device's state), it stops at EOS,
goes idle and comes back, refuses bad input without ringing, and frees the stream on close."""

import time

import numpy as np
import pytest
from test_loop_gpu import B, N, setup_rows, step_by_step

from rawgraphs.errors import ClosedError
from rawgraphs.model import ModelConfig, Weights
from rawgraphs.model.decode import DecodeModel
from rawgraphs.model.resident import ResidentLoop

pytestmark = pytest.mark.gpu
NEVER = -5  # an EOS no token id is


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig.preset("tiny")
    return DecodeModel(cfg, Weights.random(cfg, seed=9), max_batch=B)


def rows(model, rng, steps):
    lens, tables = setup_rows(model, rng, steps)
    tokens = rng.integers(1, model.cfg.vocab, B).astype(np.int32)
    positions = lens.astype(np.int32)
    positions[2] = -1  # an inactive row
    return tokens, positions, tables


def test_requests_equal_step_by_step_staged_again_and_resumed(model, stream, rng):
    tokens, positions, tables = rows(model, rng, 2 * N)
    want = step_by_step(model, stream, tokens, positions, tables, 2 * N, eos=NEVER)
    with ResidentLoop(model, B, N, eos=NEVER, stream=stream) as loop:
        first = loop.run(tokens, positions, tables)
        assert first == [r[:N] for r in want] and first[2] == []
        assert loop.steps_taken == N and 0 < loop.gpu_ns
        assert loop.run() == first  # the staged inputs again (the cache slots are rewritten with the same values)
        assert loop.run(resume=True) == [r[N:] for r in want]  # rows go on from the device's positions
        assert loop.launches == 1 and loop.seq == 3  # three requests, one graph launch


def test_stops_exactly_at_eos(model, stream, rng):
    tokens, positions, tables = rows(model, rng, N)
    eos = step_by_step(model, stream, tokens, positions, tables, N, eos=NEVER)[0][5]
    want = step_by_step(model, stream, tokens, positions, tables, N, eos=eos)
    with ResidentLoop(model, B, N, eos=eos, stream=stream) as loop:
        assert loop.run(tokens, positions, tables) == want
        assert want[0][-1] == eos and loop.steps_taken == max(len(r) for r in want)


def test_idle_graph_ends_and_the_next_request_launches_it(model, stream, rng):
    tokens, positions, tables = rows(model, rng, N)
    with ResidentLoop(model, B, N, eos=NEVER, stream=stream, idle_s=0.02) as loop:
        first = loop.run(tokens, positions, tables)
        time.sleep(0.2)  # the graph gives up waiting and ends: the stream drains by itself
        stream.synchronize()
        assert int(loop.ack.array[0]) & 0xff == 4  # IDLE acknowledged, the last seq kept
        assert loop.run() == first and loop.launches == 2


def test_bad_input_rings_nothing_and_close_frees_the_stream(model, stream, rng):
    tokens, positions, tables = rows(model, rng, N)
    loop = ResidentLoop(model, B, N, eos=NEVER, stream=stream)
    with pytest.raises(ValueError, match="no request has run yet"):
        loop.submit(resume=True)
    with pytest.raises(RuntimeError, match="no request in flight"):
        loop.wait()
    bad = tokens.copy()
    bad[0] = model.cfg.vocab
    with pytest.raises(ValueError, match="token ids"):
        loop.submit(bad, positions, tables)
    assert loop.seq == 0 and loop.launches == 0
    got = loop.run(tokens, positions, tables)
    loop.submit()
    with pytest.raises(RuntimeError, match="in flight"):
        loop.submit()
    loop.wait()
    assert loop.tokens() == got
    loop.close()
    loop.close()  # idempotent
    with pytest.raises(ClosedError):
        loop.submit()
    # the stream and the model work again: an eager step's tokens equal step-by-step decoding's first step
    want = step_by_step(model, stream, tokens, positions, tables, 1, eos=NEVER)
    assert [r[:1] for r in got] == want


def test_arguments_are_checked(model, stream):
    with pytest.raises(ValueError, match="idle_s"):
        ResidentLoop(model, B, N, eos=NEVER, stream=stream, idle_s=0)
    with pytest.raises(ValueError, match="max_steps"):
        ResidentLoop(model, B, 0, eos=NEVER, stream=stream)
