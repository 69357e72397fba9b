"""Tensor-parallel decode on the GPU.

TP=1 runs through the very path of TP=N (a one-rank NCCL communicator, fp32 partials, all-reduce entries in the
step, the exact residual add) and must equal the plain model bit for bit: eagerly, captured, as explicit nodes,
through the runner, and in a spawned rank process. With two or more GPUs, TP=2 must give TP=1's tokens, and on
every rank the graphs must equal eager.
"""

import gc

import ml_dtypes
import numpy as np
import pytest

from rawgraphs.comm import Communicator, nccl_available, run_ranks
from rawgraphs.context import Stream
from rawgraphs.graph import Graph
from rawgraphs.memory import DeviceBuffer
from rawgraphs.model import ModelConfig, Weights
from rawgraphs.model.decode import AllReduce, DecodeModel
from rawgraphs.model.generate import generate
from rawgraphs.model.tensor_parallel import DecodeJob, decode_rank, rank_model
from rawgraphs.runner import DecodeRunner


def _gpu_count() -> int:
    from cuda.bindings import driver

    from rawgraphs.context import gpu_available
    return driver.cuDeviceGetCount()[1] if gpu_available() else 0


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not nccl_available(), reason="NCCL not installed (pip install 'rawgraphs[tp]')")]
N_GPUS = _gpu_count()
two_gpus = pytest.mark.skipif(N_GPUS < 2, reason=f"TP=2 needs 2 GPUs; this machine has {N_GPUS} (run on an "
                                                 "nvidia-h200-x2 or larger)")
MODES = ("eager", "capture", "explicit")
LOGIT_TOL = 2e-2  # bf16 activations: max |a - b| relative to max |b|, between differently split sums


@pytest.fixture(scope="module")
def one_rank(dev):
    """A one-rank communicator in this process, destroyed after the graphs that captured it."""
    comm = Communicator.single()
    yield comm
    gc.collect()
    comm.close()


def prompts_for(cfg, rng, B):
    return [list(rng.integers(1, cfg.vocab, size=int(rng.integers(2, 8)))) for _ in range(B)]


def assert_same(a, b, what):
    assert a.tokens == b.tokens, what
    for x, y in zip(a.logits, b.logits):
        np.testing.assert_array_equal(x, y, err_msg=what)


@pytest.mark.parametrize("preset, B", [("tiny", 3), ("small", 1), ("small", 5), ("small", 20)])
def test_tp1_through_nccl_is_bit_identical_to_the_plain_model(one_rank, stream, rng, preset, B):
    cfg = ModelConfig.preset(preset)
    w = Weights.random(cfg, seed=5)
    plain = DecodeModel(cfg, w, max_batch=B)
    tp1 = rank_model(w, one_rank, max_batch=B)
    prompts = prompts_for(cfg, rng, B)
    starts = [int(s) for s in rng.integers(0, 4, size=B)]
    want = generate(plain, prompts, 6, stream, starts=starts, keep_logits=True, seed=9)
    for mode in MODES:
        got = generate(tp1, prompts, 6, stream, mode=mode, starts=starts, keep_logits=True, seed=9)
        assert_same(got, want, f"TP=1 {mode} vs plain eager")


def test_tp1_runner_pads_and_replays_like_the_plain_model(one_rank, stream, rng):
    cfg = ModelConfig.preset("tiny")
    w = Weights.random(cfg, seed=6)
    prompts = prompts_for(cfg, rng, 3)
    runs = {}
    for name, model in (("plain", DecodeModel(cfg, w, max_batch=8)), ("tp1", rank_model(w, one_rank, max_batch=8))):
        runner = DecodeRunner(model, (1, 2, 4, 8), stream=stream)
        runner.capture(progress=False)
        runs[name] = generate(model, prompts, 10, keep_logits=True, step=runner.step)  # 3 rows padded to 4
        assert runner.stats.graph_steps[4] == runs[name].steps and runner.stats.padded_rows == runs[name].steps
    assert_same(runs["tp1"], runs["plain"], "TP=1 runner vs plain runner")


def test_explicit_graph_holds_each_all_reduce_as_a_named_node(one_rank):
    cfg = ModelConfig.preset("tiny")
    tp1 = rank_model(Weights.random(cfg, seed=1), one_rank, max_batch=2)
    step = tp1.step_launches(2)
    collectives = [ln.name for ln in step if isinstance(ln, AllReduce)]
    assert collectives == [f"L{i}.{p}.all_reduce" for i in range(cfg.n_layers) for p in ("o_proj", "down")]
    g = tp1.build_graph(2)
    assert g.node_count() == len(step)
    # a child graph of NCCL's captured work, or an empty node where NCCL enqueues nothing (one rank, in place)
    assert all(g.node(name).kind in ("child", "empty") for name in collectives)
    assert g.node("L0.o_proj.add").deps == (g.node("L0.o_proj.all_reduce"),)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_one_rank_all_reduce_is_the_identity_eager_and_captured(one_rank, stream, rng, dtype):
    host = rng.standard_normal((7, 33)).astype(dtype)  # [7, 33]
    host[host == 0] = 1
    buf = DeviceBuffer.from_numpy(host)
    one_rank.all_reduce(buf, stream)
    stream.synchronize()
    np.testing.assert_array_equal(buf.to_numpy(), host)
    with Graph.capture(stream) as g:
        one_rank.all_reduce(buf, stream, count=100)
    exe = g.instantiate()
    for _ in range(3):
        exe.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(buf.to_numpy(), host)
    one_rank.check_async()


def job_for(preset, B, n_new, seed=3):
    cfg = ModelConfig.preset(preset)
    prompts = prompts_for(cfg, np.random.default_rng(seed), B)
    return DecodeJob(cfg, tuple(tuple(int(t) for t in p) for p in prompts), n_new, seed)


def test_tp1_in_a_spawned_rank_process_equals_the_plain_model_in_every_mode(stream):
    job = job_for("tiny", 4, 8)  # 4 rows: the runner's capture size, so every mode runs the same plan
    (rank0,) = run_ranks(decode_rank, 1, job)
    prompts = [list(p) for p in job.prompts]
    plain = DecodeModel(job.cfg, job.weights(), max_batch=4, kv_tokens=max(map(len, prompts)) + job.n_new + 1)
    want = generate(plain, prompts, job.n_new, stream, keep_logits=True)
    assert set(rank0["modes"]) == {"eager", "capture", "explicit", "runner"}
    for mode, got in rank0["modes"].items():
        assert got["tokens"] == want.tokens, mode
        for a, b in zip(got["logits"], want.logits):
            np.testing.assert_array_equal(a, b, err_msg=mode)


def sum_rank(comm, n: int) -> tuple:
    """Rank r's random [n] fp32 data, and the all-reduced sum, eager and by graph replay (runs in each rank)."""
    mine = np.random.default_rng(100 + comm.rank).standard_normal(n).astype(np.float32)  # [n]
    with Stream.create() as s:
        buf = DeviceBuffer.from_numpy(mine)
        comm.all_reduce(buf, s)
        s.synchronize()
        eager = buf.to_numpy()
        buf.copy_from(mine)
        with Graph.capture(s) as g:
            comm.all_reduce(buf, s)
        exe = g.instantiate()
        exe.launch(s)
        s.synchronize()
        return mine, eager, buf.to_numpy()


@two_gpus
def test_two_ranks_all_reduce_to_the_same_sum_eager_and_by_graph():
    ranks = run_ranks(sum_rank, 2, 4099)
    want = ranks[0][0].astype(np.float64) + ranks[1][0]
    for _, eager, graph in ranks:
        np.testing.assert_allclose(eager, want, rtol=1e-6, atol=1e-6)  # fp32: one rounding of a 2-term sum
        np.testing.assert_array_equal(graph, eager)
    np.testing.assert_array_equal(ranks[0][1], ranks[1][1])


@two_gpus
@pytest.mark.parametrize("preset, B", [("tiny", 4), ("small", 8)])  # capture sizes: runner == eager bit for bit
def test_tp2_gives_tp1_tokens_and_graphs_equal_eager_on_every_rank(preset, B):
    job = job_for(preset, B, 12)
    tp1 = run_ranks(decode_rank, 1, job)[0]["modes"]["eager"]
    tp2 = run_ranks(decode_rank, 2, job)
    for r, rank in enumerate(tp2):
        eager = rank["modes"]["eager"]
        assert eager["tokens"] == tp1["tokens"], f"rank {r}"
        for mode, got in rank["modes"].items():
            assert got["tokens"] == eager["tokens"], (r, mode)
            for a, b in zip(got["logits"], eager["logits"]):
                np.testing.assert_array_equal(a, b, err_msg=f"rank {r} {mode} vs eager")
        for a, b in zip(eager["logits"], tp2[0]["modes"]["eager"]["logits"]):
            np.testing.assert_array_equal(a, b, err_msg=f"rank {r} vs rank 0")  # the all-reduce gives all the same
        worst = max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(eager["logits"], tp1["logits"]))
        assert worst < LOGIT_TOL, f"TP=2 vs TP=1 relative logit difference {worst:.3g}"
