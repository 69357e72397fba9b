"""Tensor parallelism on the CPU: shards are valid models, the split model (partial sums added as an all-reduce
would) decodes like the whole one, a rank's decode step plans its collectives, and the NCCL wrapper's checks and
errors."""

import pickle

import ml_dtypes
import numpy as np
import pytest

from rawgraphs import comm
from rawgraphs.comm import Communicator, NcclError, NcclUnavailableError
from rawgraphs.context import gpu_available
from rawgraphs.errors import CudaError
from rawgraphs.memory import DeviceView
from rawgraphs.model import BlockAllocator, ModelConfig, ReferenceModel, Weights, make_block_tables
from rawgraphs.model.decode import AllReduce, DecodeModel, PlanCommunicator
from rawgraphs.model.plans import OUT_MODES, PARTIAL
from rawgraphs.model.tensor_parallel import (
    DecodeJob,
    TensorParallelReference,
    decode_rank,
    local_config,
    rank_weights,
    shard,
)

CFG = ModelConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=4, ffn_dim=192, vocab=300, max_seq_len=128)
PLAN_CFG = ModelConfig(dim=128, n_layers=2, n_heads=8, n_kv_heads=4, ffn_dim=192, vocab=300, max_seq_len=128)  # hd 16


def decode(model, tokens0, steps):
    alloc = BlockAllocator(32, seed=2)
    B = len(tokens0)
    blocks = [[] for _ in range(B)]
    tokens, out = np.asarray(tokens0), []
    for pos in range(steps):
        for b in range(B):
            alloc.grow(blocks[b], pos + 1)
        logits = model.step(tokens, np.full(B, pos), make_block_tables(blocks, 8))
        out.append(logits)
        tokens = np.argmax(logits, axis=1)
    return out


def test_shards_are_models_of_the_local_config():
    w = Weights.random(CFG, seed=1)
    parts = shard(w, 2)
    local = local_config(CFG, 2)
    assert (local.n_heads, local.n_kv_heads, local.ffn_dim, local.head_dim) == (4, 2, 96, 8)
    assert all(p.cfg == local for p in parts)
    # every weight element of the split matrices lands in exactly one shard
    for name in ("w_qkv", "w_gate_up"):
        total = sum(getattr(p.layers[0], name).size for p in parts)
        assert total == getattr(w.layers[0], name).size
    np.testing.assert_array_equal(np.concatenate([p.layers[1].w_down for p in parts], axis=1), w.layers[1].w_down)
    assert parts[1].embed is w.embed and parts[0].layers[0].attn_norm is w.layers[0].attn_norm


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_split_model_equals_the_whole_in_float64(tp):
    w = Weights.random(CFG, seed=3)
    whole = decode(ReferenceModel(CFG, w, 32, bf16_activations=False), [5, 17, 250], 20)
    split = decode(TensorParallelReference(CFG, w, tp, 32, bf16_activations=False), [5, 17, 250], 20)
    for a, b in zip(whole, split):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-10)


def test_split_model_gives_the_same_greedy_tokens_with_bf16_activations():
    w = Weights.random(CFG, seed=4)
    whole = decode(ReferenceModel(CFG, w, 32), [7, 8], 24)
    split = decode(TensorParallelReference(CFG, w, 2, 32), [7, 8], 24)
    assert [list(np.argmax(a, 1)) for a in whole] == [list(np.argmax(b, 1)) for b in split]


def test_indivisible_splits_are_refused():
    with pytest.raises(ValueError, match="n_kv_heads"):
        local_config(CFG, 8)


def test_rank_weights_is_the_rank_th_shard_and_checks_the_rank():
    w = Weights.random(CFG, seed=5)
    for r, part in enumerate(shard(w, 4)):
        mine = rank_weights(w, r, 4)
        for name, a in part.arrays().items():
            np.testing.assert_array_equal(mine.arrays()[name], a)
    with pytest.raises(ValueError, match="rank 2 is outside 0..1"):
        rank_weights(w, 2, 2)


# ---- the decode step of one rank (plan only: no GPU) ----------------------------------------------------------
def plan(tp, B=3):
    cfg = local_config(PLAN_CFG, tp) if tp else PLAN_CFG
    comm = PlanCommunicator(0, tp) if tp else None
    model = DecodeModel(cfg, None, max_batch=B, plan_only=True, comm=comm)
    return model, model.step_launches(B)


@pytest.mark.parametrize("B", [1, 3])
def test_row_parallel_projections_write_fp32_partials_then_all_reduce_then_add(B):
    model, step = plan(2, B)
    by_name = {ln.name: ln for ln in step}
    D = PLAN_CFG.dim
    for i in range(PLAN_CFG.n_layers):
        for proj in ("o_proj", "down"):
            name = f"L{i}.{proj}"
            names = [ln.name for ln in step]
            at = names.index(name)
            # the projection (and its split-K reduce, if any) ends in the partial buffer, in fp32
            last = next(ln for ln in reversed(step[:names.index(name + ".all_reduce")]) if ln.name.startswith(name))
            assert last.args.values()["y"] is model.partial and last.args.values()["mode"] == OUT_MODES["f32"]
            ar = by_name[name + ".all_reduce"]
            assert isinstance(ar, AllReduce) and ar.buf is model.partial and ar.count == B * D
            add = by_name[name + ".add"]
            assert names.index(name + ".add") == names.index(name + ".all_reduce") + 1 > at
            v = add.args.values()
            assert add.kernel.name == "splitk_reduce" and v["y"] is model.x and v["partial"] is model.partial
            assert (v["B"], v["N"], v["splits"], v["mode"]) == (B, D, 1, OUT_MODES["residual"])
            assert not add.shape.pdl  # ordered after the collective by plain stream order
            assert add.shape.grid[0] * add.shape.block[0] >= B * D
    assert model.partial.shape == (B, D) and model.partial.dtype == np.float32
    assert sum(isinstance(ln, AllReduce) for ln in step) == 2 * PLAN_CFG.n_layers


def test_plain_model_has_no_all_reduce_and_fuses_the_residual_add():
    model, step = plan(0)
    assert not any(isinstance(ln, AllReduce) for ln in step) and not hasattr(model, "partial")
    o = next(ln for ln in step if ln.name == "L0.o_proj")
    assert o.args.values()["y"] is model.x and o.args.values()["mode"] in (OUT_MODES["residual"], PARTIAL)


def test_rank_plan_is_the_plain_plan_plus_two_collectives_and_adds_per_layer():
    _, whole = plan(0)
    _, one = plan(1)
    names = [ln.name for ln in one if not ln.name.endswith((".all_reduce", ".add"))]
    assert names == [ln.name for ln in whole]
    assert len(one) == len(whole) + 4 * PLAN_CFG.n_layers


def test_a_plan_communicator_cannot_run():
    _, step = plan(2)
    ar = next(ln for ln in step if isinstance(ln, AllReduce))
    with pytest.raises(RuntimeError, match="only describes a plan"):
        ar.enqueue(None)


# ---- NCCL wrapper: errors and availability --------------------------------------------------------------------
def test_nccl_errors_are_cuda_errors_named_by_nccl():
    e = NcclError(5, "ncclAllReduce", "NCCL_ERROR_INVALID_USAGE: invalid usage")
    assert isinstance(e, CudaError) and e.name == "ncclInvalidUsage" and e.code == 5
    assert e.call == "ncclAllReduce" and "same collectives" in e.hint and "ncclInvalidUsage" in str(e)
    assert NcclError(42, "x").name == "ncclResult42"


def test_without_nccl_tensor_parallelism_says_how_to_get_it(monkeypatch):
    cupy_nccl = pytest.importorskip("cupy.cuda.nccl")
    monkeypatch.setattr(cupy_nccl, "available", False)
    assert not comm.nccl_available()
    with pytest.raises(NcclUnavailableError, match=r"rawgraphs\[tp\]"):
        comm.unique_id()
    with pytest.raises(NcclUnavailableError, match="nvidia-nccl-cu13"):
        Communicator.init(bytes(128), 0, 1)


def test_communicator_arguments_are_checked_before_nccl():
    with pytest.raises(ValueError, match="rank 2 is outside 0..1"):
        Communicator.init(bytes(128), 2, 2)
    with pytest.raises(ValueError, match="128 bytes"):
        Communicator.init(b"short", 0, 1)
    closed = Communicator(None, 0, 1)
    with pytest.raises(ValueError, match="closed"):
        closed.all_reduce(DeviceView(0, 4, np.float32), None)
    closed.close()  # idempotent


def test_run_ranks_needs_as_many_gpus_as_ranks(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ValueError, match="tensor parallelism 2 needs 2 GPUs; this machine shows 1"):
        comm.run_ranks(decode_rank, 2, None)


needs_nccl = pytest.mark.skipif(not comm.nccl_available(), reason="NCCL not installed (pip install 'rawgraphs[tp]')")


@needs_nccl
def test_unique_ids_are_128_fresh_bytes():
    a, b = comm.unique_id(), comm.unique_id()
    assert len(a) == len(b) == 128 and a != b


class RecordingComm:
    """Stands in for CuPy's NcclCommunicator: records allReduce arguments, or raises CuPy's NcclError."""

    def __init__(self, status=None):
        self.calls, self.status = [], status

    def allReduce(self, *args):
        if self.status is not None:
            from cupy.cuda import nccl
            raise nccl.NcclError(self.status)
        self.calls.append(args)


@needs_nccl
def test_all_reduce_is_an_in_place_sum_of_count_elements_on_the_stream():
    from cupy.cuda import nccl
    inner = RecordingComm()
    c = Communicator(inner, 0, 1)
    buf = DeviceView(0x1000, (4, 8), np.float32)
    c.all_reduce(buf, 77, count=16)
    c.all_reduce(DeviceView(0x2000, 6, ml_dtypes.bfloat16), 78)
    assert inner.calls == [(0x1000, 0x1000, 16, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 77),
                           (0x2000, 0x2000, 6, nccl.NCCL_BFLOAT16, nccl.NCCL_SUM, 78)]
    with pytest.raises(ValueError, match="33 elements on a buffer of 32"):
        c.all_reduce(buf, 77, count=33)
    with pytest.raises(TypeError, match="uint8"):
        c.all_reduce(DeviceView(0x3000, 8, np.uint8), 77)


@needs_nccl
def test_nccl_failures_become_nccl_errors():
    c = Communicator(RecordingComm(status=4), 0, 1)
    with pytest.raises(NcclError) as e:
        c.all_reduce(DeviceView(0x1000, 4, np.float32), 0)
    assert e.value.name == "ncclInvalidArgument" and e.value.call == "ncclAllReduce"


# ---- what each rank runs ---------------------------------------------------------------------------------------
def test_decode_job_travels_to_a_spawned_rank_and_loads_the_whole_model():
    job = DecodeJob(CFG, ((1, 2, 3), (4, 5)), n_new=4, seed=7)
    again = pickle.loads(pickle.dumps(job))
    assert again == job
    np.testing.assert_array_equal(again.weights().layers[1].w_o, Weights.random(CFG, seed=7).layers[1].w_o)


def test_demo_tp_without_gpu_prints_one_rank_s_plan(capsys):
    from rawgraphs.cli import main
    if gpu_available():
        pytest.skip("with a GPU the demo decodes instead of printing the plan")
    assert main(["demo", "--model", "1b", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "one rank of 2 (H=8 KVH=8 F=2816)" in out and "L0.o_proj.all_reduce" in out
    assert "NCCL all-reduce (sum over 2 ranks)" in out and "and 32 all-reduces per step per rank" in out


def test_demo_refuses_a_tp_that_does_not_divide_the_model():
    from rawgraphs.cli import main
    with pytest.raises(SystemExit, match="--tp 3: tensor parallelism 3 must divide n_heads"):
        main(["demo", "--model", "1b", "--tp", "3"])


@needs_nccl
@pytest.mark.skipif(gpu_available(), reason="on a GPU the communicator forms; this checks the failure report")
def test_a_rank_that_fails_is_reported_with_its_traceback(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # one (absent) GPU: the rank fails to join
    with pytest.raises(RuntimeError, match=r"rank 0 of 1 failed:\nTraceback(.|\n)*Communicator.init(.|\n)*"
                                           r"CUDA_ERROR_NO_DRIVER"):
        comm.run_ranks(decode_rank, 1, None)


# ---- benchmarks/tp_decode.py on the CPU ------------------------------------------------------------------------
def tp_decode_module():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # it imports `common`
    import tp_decode
    return tp_decode


def test_tp_decode_rows_take_the_slowest_rank_and_the_all_reduce_share():
    t = tp_decode_module()
    fast = {"eager": [1.0], "graph": [0.5], "graph w/o all-reduce": [0.4]}
    slow = {"eager": [1.2], "graph": [0.8], "graph w/o all-reduce": [0.6]}
    ranks = [{"gbs": 4000.0, "by_batch": {1: fast}}, {"gbs": 4000.0, "by_batch": {1: slow}}]
    table, rows = t.rows_for("1b", 2, ranks, [1])
    (row,) = table
    assert (row["eager ms"], row["graph ms"], row["w/o AR ms"]) == (1.2, 0.8, 0.6)
    assert row["AR share"] == "25.0%" and row["plain graph ms"] == ""
    local = local_config(t.CONFIGS["1b"], 2)
    assert row["floor ms"] == pytest.approx((local.weight_bytes() + local.kv_bytes_per_token() * 513) / 4e12 * 1e3)
    assert [r["mode"] for r in rows] == ["eager", "graph", "graph w/o all-reduce"]  # rank 0's samples
    assert all(r["tp"] == 2 and r["allreduce_share"] == pytest.approx(0.25) for r in rows)


def test_tp_decode_configs_split_over_eight_ranks():
    t = tp_decode_module()
    for cfg in t.CONFIGS.values():
        assert local_config(cfg, 8).n_kv_heads >= 1
