"""The resident decode loop: one graph launch serves request after request rung on a pinned doorbell; its tokens
equal step-by-step decoding (from staged inputs, again, and resumed from the device's state), it stops at EOS,
goes idle and comes back, refuses bad input without ringing, and frees the stream on close."""

import os
import subprocess
import sys
import time
from pathlib import Path

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
    with pytest.raises(ValueError, match=f"decodes {B} rows; got {B - 1}"):  # stale staged rows would decode
        loop.submit(tokens[:-1], positions[:-1], tables[:-1])
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


FAULT = """
import os
import numpy as np
from rawgraphs.context import Stream
from rawgraphs.errors import CudaError
from rawgraphs.model import BlockAllocator, ModelConfig, Weights, make_block_tables
from rawgraphs.model.decode import DecodeModel
from rawgraphs.model.resident import ResidentLoop

cfg = ModelConfig.preset("tiny")
model = DecodeModel(cfg, Weights.random(cfg, seed=9), max_batch=2)
alloc = BlockAllocator(model.num_blocks, seed=1)
tables = make_block_tables([alloc.grow([], 40), alloc.grow([], 40)], model.max_blocks)
stream = Stream.create()
loop = ResidentLoop(model, 2, 8, eos=-5, stream=stream)
print("first", loop.run([3, 4], [5, 9], tables))
# a block id far past the KV pool, written where RESUME reads it (the host's checks only see staged inputs)
model.block_tables.copy_from(np.full(model.block_tables.shape, 1 << 30, np.int32))
loop.submit(resume=True)
try:
    loop.wait(timeout_s=30)
    print("no error")
except CudaError as e:
    print("raised", e.name)
except TimeoutError:
    print("timed out")
os._exit(0)  # the context is lost: skip the finalizers' driver calls
"""


def test_a_fault_inside_the_resident_graph_raises_by_name():
    """A fault in the graph ends it; wait() names the CUDA error instead of spinning to its timeout. In a child
    process: the error is sticky and takes the context with it."""
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-c", FAULT], cwd=root, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(root)})
    assert p.returncode == 0, p.stderr[-2000:]
    assert "first [[" in p.stdout, p.stdout  # the valid request was served
    assert "raised CUDA_ERROR_ILLEGAL_ADDRESS" in p.stdout, p.stdout + p.stderr[-2000:]
