"""attention<hd,G,pre>, hd 16 / 64 / 128 (RoPE and KV append fused; separate or fused combine) and
attention_combine: CPU compile/plan checks and GPU checks vs the float64 NumPy reference (bf16 tolerance: 1e-2
relative, plus an absolute 1e-2 of the output's scale)."""

import math
import re
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from rawgraphs.compiler import compile_file, kernel_dir, resource_usage
from rawgraphs.model import ModelConfig, attn_plan
from rawgraphs.model import reference as ref
from rawgraphs.model.attn_plan import KERNELS, attention_kernel, attention_plan, attention_plan_for, workspace_elements
from rawgraphs.model.plans import gemv_plan
from rawgraphs.signature import launchable, parse_signatures

BF16 = ml_dtypes.bfloat16
PAGE = 16


# ---------------------------------------------------------------- CPU

@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_compiles(arch):
    prog = compile_file("attention", arch=arch, name_expressions=KERNELS)
    assert prog.cubin[:4] == b"\x7fELF"
    assert sorted(prog.lowered) == sorted(KERNELS) and len(set(prog.lowered.values())) == 18  # 3 hd x 3 G x pre
    assert all(sym.encode() in prog.cubin for sym in prog.lowered.values())


def test_signatures():
    sigs = parse_signatures((kernel_dir() / "attention.cu").read_text())
    assert set(sigs) == {"attention", "attention_combine"}
    assert sigs["attention"].template and not sigs["attention_combine"].template
    names = launchable(sigs, KERNELS)
    assert set(names) == {*KERNELS, "attention_combine"} and "attention" not in names  # a bare template is not
    assert KERNELS[0] == "attention<16,4,false>" and attention_kernel(128, 1, True) in KERNELS
    for name, sig in names.items():
        if name != "attention_combine":
            assert sig.name == name and sig.params == sigs["attention"].params
            assert sig.names == ("out", "part_o", "part_ml", "counters", "qkv", "k_cache", "v_cache",
                                 "block_tables", "positions", "max_blocks", "n_heads", "n_kv_heads", "partition",
                                 "min_partition", "max_splits", "prefetch", "scale", "rope_cos", "rope_sin")


def test_short_split_cap_matches_the_kernel():
    """attn_plan caps a short-context row at the splits the kernel fills (ATTN_SHORT_SPLITS): a change on one side
    only would plan splits the kernel never uses, or fewer than it needs."""
    src = (kernel_dir() / "attention.cu").read_text()
    assert int(re.search(r"#define ATTN_SHORT_SPLITS (\d+)", src).group(1)) == attn_plan._SHORT_SPLITS


@pytest.mark.parametrize("preset", ["small", "1b"])
def test_b1_attention_fits_beside_the_qkv_projection(preset):
    """At B = 1 attention starts (PDL) while the qkv projection holds its 3 gemv_unit blocks per SM (the plans' cap); an
    SM has room for one attention block beside them only while registers (allocated per warp, 8 per thread at a
    time) and shared memory allow: 3 x 256 threads x 64 + 128 threads x 128 = 64K registers at 1b. The preloading
    instantiation (126 registers at hd 128) is at that edge; a kernel that grows past it waits for the projection."""
    cfg = ModelConfig.preset(preset)
    plan = attention_plan_for(cfg, 1)
    qkv = gemv_plan(1, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, cfg.dim, x_op="rmsnorm")
    gemv_regs, gemv_static = resource_usage("gemv")[qkv.kernel]  # gemv_unit
    regs, static = resource_usage("attention", name_expressions=KERNELS)[plan.kernel]
    def allocated(r: int, threads: int) -> int:
        return -(-r // 8) * 8 * threads
    assert 3 * allocated(gemv_regs, qkv.block[0]) + allocated(regs, plan.attention.block[0]) <= 65536
    assert 3 * (qkv.shared + gemv_static + 1024) + static + plan.attention.shared + 1024 <= 228 * 1024


def test_plan_args_fill_the_signatures():
    sigs = parse_signatures((kernel_dir() / "attention.cu").read_text())
    p = attention_plan(16, 4, 64, batch=3, max_seq_len=1000)
    a = p.args(out=1, part_o=2, part_ml=3, qkv=4, k_cache=5, v_cache=6, block_tables=7, positions=8,
               max_blocks=63, n_kv_heads=4, rope_cos=9, rope_sin=10)
    assert tuple(a) == sigs["attention"].names and a["counters"] == 0  # no counters: the combine is separate
    assert (a["n_heads"], a["partition"], a["min_partition"], a["max_splits"], a["prefetch"]) == (
        16, p.partition, p.min_partition, p.max_splits, 0) and a["scale"] == pytest.approx(0.125)
    c = p.combine_args(out=1, part_o=2, part_ml=3, positions=8, max_blocks=63)
    assert tuple(c) == sigs["attention_combine"].names
    assert (c["n_heads"], c["head_dim"], c["max_splits"]) == (16, 64, p.max_splits)


def test_plan_shapes():
    p = attention_plan(16, 16, 128, batch=1, max_seq_len=4096)
    assert p.kernel == "attention<128,1,true>" and p.heads_per_block == 1  # B = 1: the first page preloaded
    assert [attention_plan(16, 16, 128, batch=b, max_seq_len=4096).kernel for b in (2, 32, 33, 64)] == \
        ["attention<128,1,true>"] * 2 + ["attention<128,1,false>"] * 2  # PRE up to B = 32
    assert p.attention.grid == (1, 16, 4096 // p.partition) and p.combine
    assert p.part_o_shape == (1, 16, p.max_splits, 128) and p.part_ml_shape == (1, 16, p.max_splits, 2)
    assert p.counters_shape == (1, 16)
    assert p.prefetch == 2 and attention_plan(16, 16, 128, batch=2, max_seq_len=4096).prefetch == 0
    assert attention_plan(16, 4, 128, batch=3, max_seq_len=4096).counters_shape == (3, 4)  # G = 4
    assert p.workspace_bytes == 4 * (16 * p.max_splits * 130)
    assert p.combine_shape.grid == (1, 16, 1) and p.combine_shape.shared == 4 * (2 * p.max_splits + 256)
    # a short batch's plan: at most 16 splits (ATTN_SHORT_SPLITS), which still cover every SM at the maximum
    # context
    assert p.max_splits == 16 and 1 * 16 * p.max_splits >= 132
    big = attention_plan(16, 16, 128, batch=64, max_seq_len=4096)
    assert big.partition == 512 and big.max_splits == 8
    # a batch that fills the GPU at the maximum context but not at 512 tokens gets shorter splits
    assert [attention_plan(16, 16, 128, batch=b, max_seq_len=4096).partition for b in (1, 2, 8, 16, 32)] == \
        [256, 256, 256, 256, 512]
    assert attention_plan(16, 4, 128, batch=1, max_seq_len=4096).partition == 64  # G = 4: 4 blocks per split
    # below one block per SM at context 512, or up to B = 8, a row's split length follows its context down to 64
    # tokens
    assert [attention_plan(16, 16, 128, batch=b, max_seq_len=4096).min_partition for b in (1, 2, 4, 8, 9)] == \
        [64, 64, 64, 64, 256]
    assert attention_plan(16, 16, 128, batch=1, max_seq_len=4096, partition=256).min_partition == 256  # forced
    single = attention_plan(16, 4, 128, batch=128, max_seq_len=512)
    assert single.max_splits == 1 and not single.combine and single.workspace_bytes == 0
    assert single.combine_shape is None and single.attention.grid == (128, 4, 1)


@pytest.mark.parametrize("h, kvh, g", [(16, 4, 4), (16, 2, 4), (6, 2, 1), (16, 16, 1), (14, 2, 1), (8, 4, 2),
                                       (12, 2, 2)])
def test_plan_heads_per_block(h, kvh, g):
    p = attention_plan(h, kvh, 64, batch=2, max_seq_len=256)
    assert p.heads_per_block == g and p.attention.grid[1] == h // g and p.kernel == f"attention<64,{g},true>"
    assert (h // kvh) % g == 0  # a block never straddles two KV heads


def test_workspace_elements_covers_every_batch():
    plans = [attention_plan(16, 16, 128, b, 128) for b in range(1, 18)]
    assert not plans[-1].combine and plans[8].combine  # B=17 runs one pass, B=9 splits: max is not at the end
    o, ml = workspace_elements(plans)
    assert o == max(math.prod(p.part_o_shape) for p in plans if p.combine) > 0
    assert ml == max(math.prod(p.part_ml_shape) for p in plans if p.combine)
    assert workspace_elements([plans[-1]]) == (0, 0)


def test_plan_rejects():
    with pytest.raises(ValueError, match="head_dim"):
        attention_plan(16, 16, 96, batch=1, max_seq_len=128)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        attention_plan(16, 3, 64, batch=1, max_seq_len=128)
    with pytest.raises(ValueError, match="heads_per_block"):
        attention_plan(16, 8, 64, batch=1, max_seq_len=128, heads_per_block=4)
    with pytest.raises(ValueError, match="partition"):
        attention_plan(16, 16, 64, batch=1, max_seq_len=128, partition=100)


# ---------------------------------------------------------------- GPU helpers

def _bf16(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(BF16)


def _paged_case(rng, batch, kvh, hd, max_seq_len, ctx_lens):
    """Shuffled block tables, random caches, and NaN in every slot no row may read - including each row's
    newest slot, which the kernel must take from qkv, not from the cache it appends to."""
    max_blocks = math.ceil(max_seq_len / PAGE)
    num_blocks = batch * max_blocks + 3
    tables = rng.permutation(num_blocks)[:batch * max_blocks].reshape(batch, max_blocks).astype(np.int32)
    k_cache = np.full((num_blocks, kvh, PAGE, hd), np.nan, BF16)  # [NB, KVH, 16, hd]
    v_cache = np.full((num_blocks, kvh, PAGE, hd), np.nan, BF16)
    for b, n in enumerate(ctx_lens):
        t = np.arange(max(n - 1, 0))
        k_cache[tables[b, t // PAGE], :, t % PAGE] = _bf16(rng, (len(t), kvh, hd))
        v_cache[tables[b, t // PAGE], :, t % PAGE] = _bf16(rng, (len(t), kvh, hd))
    return k_cache, v_cache, tables


@pytest.fixture(scope="module")
def attn_mod(dev):
    from rawgraphs.kernel import Module
    return Module.from_file("attention", name_expressions=KERNELS)


def run_attention(mod, stream, qkv, k_cache, v_cache, tables, positions, plan, theta, counters=None):
    """Launch attention, then attention_combine, or with ``counters`` (int32 [B, H/G] device buffer) the fused
    combine as the decode step does -> (out [B, H*hd] bf16 from a poisoned buffer, k_cache, v_cache after)."""
    from rawgraphs.memory import DeviceBuffer
    batch, kvh, hd = qkv.shape[0], k_cache.shape[1], k_cache.shape[3]
    n_heads = qkv.shape[1] // hd - 2 * kvh
    out = DeviceBuffer((batch, n_heads * hd), BF16)
    out.fill_bytes(0xFF)
    part_o = DeviceBuffer(plan.part_o_shape, np.float32)
    part_ml = DeviceBuffer(plan.part_ml_shape, np.float32)
    part_o.fill_bytes(0xFF)
    part_ml.fill_bytes(0xFF)
    host = {"qkv": qkv, "k_cache": k_cache, "v_cache": v_cache, "block_tables": tables, "positions": positions}
    bufs = {n: DeviceBuffer.from_numpy(np.ascontiguousarray(a)) for n, a in host.items()}
    cos, sin = (DeviceBuffer.from_numpy(t) for t in ref.rope_tables(hd, theta, tables.shape[1] * PAGE))
    k = mod.kernel(plan.kernel)
    k.launch(plan.attention, k.args(**plan.args(out=out, part_o=part_o, part_ml=part_ml,
                                                counters=0 if counters is None else counters, **bufs,
                                                max_blocks=tables.shape[1], n_kv_heads=kvh, rope_cos=cos,
                                                rope_sin=sin)), stream)
    if plan.combine and counters is None:
        c = mod.kernel("attention_combine")
        c.launch(plan.combine_shape, c.args(**plan.combine_args(out=out, part_o=part_o, part_ml=part_ml,
                                                                positions=bufs["positions"],
                                                                max_blocks=tables.shape[1])), stream)
    stream.synchronize()
    return out.to_numpy(), bufs["k_cache"].to_numpy(), bufs["v_cache"].to_numpy()


# ---------------------------------------------------------------- GPU: attention

ATTN_CASES = [
    # batch, H, KVH, hd, max_seq_len, ctx_lens (<= 0: inactive), forced partition
    (1, 16, 16, 128, 4096, [4096], None),
    (1, 16, 16, 128, 4096, [513], None),  # runtime split length: 9 splits of 64 tokens
    (2, 16, 16, 128, 4096, [1000, 2500], None),  # 16 splits of 64; 20 of 128 (the plan's partition)
    (1, 16, 4, 128, 4096, [1], None),
    (1, 8, 2, 64, 1024, [60], None),  # B = 1, hd 64, G = 4: the preloaded page holds the new token's slot
    (1, 4, 4, 16, 256, [17], None),  # B = 1, hd 16: the new token first in its page (warp 0 preloads page 0)
    (3, 16, 4, 128, 4096, [17, 4096, 100], None),
    (8, 8, 8, 64, 1024, [1, 15, 16, 17, 100, 513, 1024, 0], None),
    (8, 16, 4, 64, 1024, [1, 15, 16, 17, 100, 513, 1024, 0], 64),
    (8, 16, 16, 128, 512, [512, 1, 33, 0, 255, 256, 257, 48], 512),  # single pass, no combine
    (37, 4, 2, 16, 256, "random", None),  # tiny
    (37, 4, 2, 16, 256, "random", 256),  # tiny, single pass
    (3, 6, 2, 64, 300, [300, 299, 64], None),  # group of 3: one head per block
    (5, 12, 2, 64, 1000, [1000, 999, 1, 0, 640], None),  # group of 6: two heads per block
    (2, 8, 4, 128, 2048, [2048, 77], None),  # hd128, G = 2
    (4, 4, 4, 16, 256, [256, 1, 0, 100], None),  # hd16, G = 1
    (2, 8, 2, 16, 128, [128, 31], None),  # hd16, G = 4
    (3, 16, 2, 128, 700, [700, 129, 1], None),  # G = 8: two blocks per KV head
]


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["combine", "fused"])
@pytest.mark.parametrize("batch, n_heads, kvh, hd, max_seq_len, ctx_lens, partition", ATTN_CASES)
def test_attention_matches_reference(attn_mod, stream, rng, batch, n_heads, kvh, hd, max_seq_len, ctx_lens,
                                     partition, fused):
    from rawgraphs.context import device
    from rawgraphs.memory import DeviceBuffer
    if ctx_lens == "random":
        ctx_lens = list(rng.integers(1, max_seq_len + 1, batch))
        ctx_lens[::5] = [0] * len(ctx_lens[::5])  # every fifth row inactive
    ctx_lens = np.asarray(ctx_lens, np.int64)
    positions = np.where(ctx_lens > 0, ctx_lens - 1, -1).astype(np.int32)  # [B]
    theta = 500000.0 if hd == 128 else 10000.0
    qkv = _bf16(rng, (batch, (n_heads + 2 * kvh) * hd))  # [B, (H + 2KVH) hd], before RoPE
    qkv[:, :n_heads * hd] *= 2  # peakier softmax
    k_cache, v_cache, tables = _paged_case(rng, batch, kvh, hd, max_seq_len, ctx_lens)
    plan = attention_plan(n_heads, kvh, hd, batch, max_seq_len, partition=partition)
    counters = None
    if fused:  # one buffer over every run below: each launch must leave it zero (graph replays rely on it)
        counters = DeviceBuffer(plan.counters_shape, np.int32)
        counters.zero()
        device().synchronize()

    out, got_k, got_v = run_attention(attn_mod, stream, qkv, k_cache, v_cache, tables, positions, plan, theta,
                                      counters)  # [B, H*hd]
    q, k, v = np.split(qkv, [n_heads * hd, (n_heads + kvh) * hd], axis=1)
    want_k, want_v = k_cache.copy(), v_cache.copy()  # the reference appends rope(k) rounded to bf16, and v
    ref.append_kv(want_k, want_v, ref.rope(k.reshape(batch, kvh, hd), positions, theta), v.reshape(batch, kvh, hd),
                  tables, positions)
    q_rot = ref.rope(q.reshape(batch, n_heads, hd), positions, theta).astype(BF16)  # as a stored q holds it
    want = ref.paged_attention(q_rot, want_k, want_v, tables, ctx_lens).reshape(batch, n_heads * hd)
    got = out.astype(np.float64)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    assert (got[ctx_lens <= 0] == 0).all()  # inactive rows: exact zeros

    # the cache: v appended exactly, rope(k) within bf16 rounding, every other slot (NaN or not) untouched
    assert got_v.tobytes() == want_v.tobytes()
    appended = np.zeros(k_cache.shape[:1] + k_cache.shape[2:3], bool)  # [NB, 16]
    for b, pos in enumerate(positions):
        if pos >= 0:
            appended[tables[b, pos // PAGE], pos % PAGE] = True
    mask = np.broadcast_to(appended[:, None, :, None], k_cache.shape)
    assert got_k[~mask].tobytes() == k_cache[~mask].tobytes()
    np.testing.assert_allclose(got_k[mask].astype(np.float64), want_k[mask].astype(np.float64), rtol=1e-2,
                               atol=1e-2)

    if fused:
        assert (counters.to_numpy() == 0).all()

    for _ in range(2):  # bit-identical run to run (fixed merge order; the counters only pick the merging block)
        again = run_attention(attn_mod, stream, qkv, k_cache, v_cache, tables, positions, plan, theta, counters)
        assert again[0].tobytes() == out.tobytes() and again[1].tobytes() == got_k.tobytes()
    if plan.kernel.endswith("true>"):  # the first pages loaded before the wait or in the loop: the same bytes
        plain = replace(plan, kernel=plan.kernel.replace("true>", "false>"))
        again = run_attention(attn_mod, stream, qkv, k_cache, v_cache, tables, positions, plain, theta, counters)
        assert again[0].tobytes() == out.tobytes() and again[1].tobytes() == got_k.tobytes()


@pytest.mark.gpu
def test_template_instantiations_load_by_name_expression(attn_mod, stream, rng):
    """A module holds the instantiations it was compiled with, by name expression; a bare template, one not
    compiled in, or a plain kernel spelled as a template is refused by name, and the module stays usable."""
    from rawgraphs.kernel import Module
    plan = attention_plan(4, 4, 64, batch=40, max_seq_len=256)
    assert plan.kernel == "attention<64,1,false>"
    one = Module.from_file("attention", name_expressions=(plan.kernel,))
    assert set(one.names) == {plan.kernel, "attention_combine"}
    with pytest.raises(KeyError, match=r"template kernel.*attention<64,1,false>"):
        one.kernel("attention")
    with pytest.raises(KeyError, match=r"template kernel"):
        one.kernel("attention<128,1,true>")
    with pytest.raises(KeyError, match="not a template kernel"):
        one.kernel("attention_combine<1>")
    ctx_lens = np.array([1, 17, 200, 0, 64] * 8)
    positions = np.where(ctx_lens > 0, ctx_lens - 1, -1).astype(np.int32)
    qkv = _bf16(rng, (40, (4 + 2 * 4) * 64))
    k_cache, v_cache, tables = _paged_case(rng, 40, 4, 64, 256, ctx_lens)
    got = run_attention(one, stream, qkv, k_cache, v_cache, tables, positions, plan, 10000.0)
    want = run_attention(attn_mod, stream, qkv, k_cache, v_cache, tables, positions, plan, 10000.0)
    assert one.program.lowered[plan.kernel] == attn_mod.program.lowered[plan.kernel]  # one mangled symbol
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want)) and np.abs(got[0].astype(float)).max() > 0
