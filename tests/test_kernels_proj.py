"""Projection-side decode kernels: embedding, rmsnorm, gemv (+ plans), silu_mul, argmax/sample.

CPU tests: every kernel file compiles for sm_80 and sm_90, signatures, launch plans, the sampling hash.
GPU tests (``-m gpu``): each kernel against ``rawgraphs.model.reference`` on random (never zero) data with
poisoned outputs. Tolerances: bf16 outputs ``rtol = atol = 1e-2`` (outputs are O(1)); fp32 logits
``rtol = 1e-5, atol = 1e-4`` (fp32 accumulation over K <= 5632 of O(1) sums); tokens and copies exact.
GEMV results must be bit-identical across two runs (split-K reduces in a fixed order).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from rawgraphs.compiler import compile_file, kernel_dir, resource_usage
from rawgraphs.model import reference as ref
from rawgraphs.model.plans import (
    GEMV_CHUNK,
    GEMV_RING,
    GEMV_SHARED,
    GEMV_STAGES,
    GEMV_THREE_PER_SM_SHARED,
    MMA_KERNELS,
    MMA_MERGE_MIN,
    MMA_SPLIT_TARGET,
    MMA_UNSPLIT_MAX_B,
    OUT_MODES,
    PARTIAL,
    RMS_INPUT_MIN_B,
    ROWS_KERNELS,
    ROWS_MAX,
    SMS,
    TC_KERNELS,
    TC_SHARED,
    TC_STAGES,
    TC_TWO_PER_SM_SHARED,
    TWO_PER_SM_SHARED,
    UNIT_KERNEL,
    X_OPS,
    gemv_plan,
    max_counters,
    max_workspace_bytes,
    mma_kernel,
    rows_fit,
    tc_target_blocks,
    two_per_sm,
)

BF16 = ml_dtypes.bfloat16
FILES = ["embedding", "rmsnorm", "gemv", "silu_mul", "sample"]
# (N, K): 1b qkv / o / gate_up / down / lm_head, small qkv / o, a split-K gemv, tiny, ragged (N % 4, K % 64).
GEMV_SHAPES = [(6144, 2048), (2048, 2048), (11264, 2048), (2048, 5632), (32000, 2048), (2304, 768),
               (768, 768), (768, 2048), (64, 64), (99, 40)]
BATCHES = [1, 2, 3, 4, 8, 12, 16, 24, 37, 64, 256]  # 12: gemm_tc for large weights only; 24: its 32-row tiles
VARIANTS = [("gemv", None), ("gemv", 3), ("gemv_rows2", None), ("gemv_rows3", None), ("gemv_mma", 1), ("gemv_mma", 3),
            ("gemv_mma16", 1), ("gemv_mma32", 3),
            ("gemm_tc", None), ("gemm_tc_narrow", None)]


# ---------------------------------------------------------------- CPU: compile, signatures, plans, hash

@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", FILES)
def test_compiles(name, arch):
    program = compile_file(name, arch=arch, use_cache=False)
    assert program.arch == arch and len(program.cubin) > 0


def test_signatures():
    from rawgraphs.compiler import kernel_dir
    from rawgraphs.signature import parse_signatures

    sigs = {}
    for name in FILES:
        sigs.update(parse_signatures((kernel_dir() / f"{name}.cu").read_text()))
    expect = {
        "embedding": "out: ptr, tokens: ptr, table: ptr, V: i32, D: i32",
        "rmsnorm": "out: ptr, x: ptr, w: ptr, eps: f32, D: i32",
        "add_rmsnorm": "out: ptr, residual: ptr, x: ptr, w: ptr, eps: f32, D: i32",
        "gemv": "y: ptr, x: ptr, w: ptr, norm: ptr, positions: ptr, B: i32, N: i32, K: i32, k_chunk: i32, "
                "mode: i32, eps: f32, x_op: i32, parts: i32",
        **{k: "y: ptr, x: ptr, w: ptr, norm: ptr, positions: ptr, B: i32, N: i32, K: i32, k_chunk: i32, "
              "mode: i32, eps: f32, x_op: i32, parts: i32" for k in ROWS_KERNELS.values()},
        **{k: "y: ptr, x: ptr, w: ptr, norm: ptr, positions: ptr, B: i32, N: i32, K: i32, k_chunk: i32, "
              "mode: i32, eps: f32, x_op: i32, partial: ptr, counters: ptr" for k in MMA_KERNELS},
        "gemm_tc": "y: ptr, x: ptr, w: ptr, norm: ptr, positions: ptr, B: i32, N: i32, K: i32, k_chunk: i32, "
                   "mode: i32, eps: f32, x_op: i32, partial: ptr, counters: ptr",
        "gemm_tc_narrow": "y: ptr, x: ptr, w: ptr, norm: ptr, positions: ptr, B: i32, N: i32, K: i32, "
                          "k_chunk: i32, mode: i32, eps: f32, x_op: i32, partial: ptr, counters: ptr",
        "splitk_reduce": "y: ptr, partial: ptr, positions: ptr, B: i32, N: i32, splits: i32, mode: i32",
        "rms_input": "h: ptr, x: ptr, norm: ptr, positions: ptr, B: i32, K: i32, eps: f32",
        "silu_mul": "out: ptr, gu: ptr, F: i32",
        "argmax": "tokens: ptr, logits: ptr, V: i32",
        "sample": "tokens: ptr, logits: ptr, seed: ptr, step: ptr, temperature: f32, V: i32",
        "advance_step": "step: ptr",
    }
    for name, params in expect.items():
        assert str(sigs[name]) == f"{name}({params})"


def runs_gemm_tc(B: int, N: int, K: int) -> bool:
    """gemm_tc's range, stated apart from plans.tc_fits: above 16 rows, or from 4 for a weight of 2048^2 elements
    or more (session 39's and 40's A/B), or at 3 for such a weight of K >= 2048 (where gemv_rows3 goes first)."""
    return B > 16 or N * K >= 2048 * 2048 and (B >= 4 or B == 3 and K >= 2048)


CAPPED_FROM = 9  # the batch from which two_per_sm caps, stated apart from plans.CAP_MIN_B (session 42's A/B)


def tc_kernel(B: int) -> str:
    """Which of the two runs gemm_tc's projections: gemm_tc_narrow (32-row tiles, staged merge) up to 16 rows."""
    return "gemm_tc_narrow" if B <= 16 else "gemm_tc"


def gemv_used_shared(k_chunk: int) -> int:
    """Shared bytes a gemv block uses: 8 warps' cp.async rings and unit partials (64 bytes a warp), and the bf16 x
    row of its K split."""
    return 8 * (GEMV_RING + 64) + 2 * k_chunk


@pytest.mark.parametrize("B", BATCHES)
@pytest.mark.parametrize("N,K", GEMV_SHAPES)
def test_gemv_plan(B, N, K):
    plan = gemv_plan(B, N, K, "residual")
    unit = gemv_plan(1, N, K, "residual")
    rows = (B == 2 or B == 3 and K >= 2048) and unit.parts == 1 and unit.splits == 1 and rows_fit(B, K)
    assert rows_fit(B, K) == (8 * GEMV_RING + 2 * B * K <= 58 * 1024)
    tc = runs_gemm_tc(B, N, K)
    b1 = gemv_plan(1, N, K, "residual", "gemv")  # gemv_unit where it is the unit stream (one warp a row, one range)
    b1_kernel = UNIT_KERNEL if b1.parts == 1 and b1.splits == 1 else "gemv"
    assert plan.kernel == (b1_kernel if B == 1 else ROWS_KERNELS[B] if rows else tc_kernel(B) if tc else mma_kernel(B))
    tile_rows = 32 if plan.kernel == "gemm_tc_narrow" else 64  # a tensor-core tile's batch rows
    if rows:  # B = 1's unit stream, every row at once: the same grid and shared memory
        assert plan == replace(unit, kernel=ROWS_KERNELS[B]) and rows_fit(B, K)
        assert plan.launches("y", "x", "w", None, B, N, K)[0].args["parts"] == 1
        return
    # The splits cover K exactly once, none empty.
    assert plan.k_chunk % 64 == 0 and plan.splits * plan.k_chunk >= K > (plan.splits - 1) * plan.k_chunk
    assert plan.grid[2 if tc else 1] == plan.splits
    if B == 1:  # gemv_unit is gemv's plan in all but the kernel
        assert plan == replace(b1, kernel=plan.kernel)
    if plan.kernel in ("gemv", UNIT_KERNEL):  # one wave of 8-warp blocks; groups of `parts` warps own whole rows
        groups = plan.grid[0] * 8 // plan.parts
        assert plan.block == (256, 1, 1) and plan.parts in (1, 2, 4, 8) and groups * plan.parts <= SMS * 24
        assert math.ceil(N / groups) == math.ceil(N * plan.parts / (SMS * 24)) and plan.parts <= math.ceil(K / 256)
        used = gemv_used_shared(plan.k_chunk)  # the rest caps the SM at 3 blocks
        assert plan.splits == 1 and used <= GEMV_SHARED and plan.shared == max(used, GEMV_THREE_PER_SM_SHARED)
        assert plan.launches("y", "x", "w", None, B, N, K)[0].args["parts"] == plan.parts
    else:
        rows_per_block = 64 if tc else 16
        assert plan.grid[1 if tc else 0] * rows_per_block >= N
        capped = two_per_sm(B, math.prod(plan.grid))
        assert capped == (B >= CAPPED_FROM and math.prod(plan.grid) <= 2 * SMS)
        if not tc:
            assert plan.shared == (TWO_PER_SM_SHARED if capped else 0)
        else:
            assert plan.shared == (TC_TWO_PER_SM_SHARED if capped else TC_SHARED)
            assert plan.grid[0] == math.ceil(B / tile_rows)
        blocks = math.prod(plan.grid) // plan.splits
        limit = MMA_SPLIT_TARGET if plan.kernel in MMA_KERNELS else tc_target_blocks(B)
        assert plan.splits == 1 or blocks < limit
        if plan.kernel in MMA_KERNELS and B <= MMA_UNSPLIT_MAX_B:  # small grids unsplit: no reduce launch
            assert plan.splits == 1 or blocks >= MMA_MERGE_MIN
    launches = plan.launches("y", "x", "w", "ws", B, N, K, counters="c")
    assert launches[0].args["norm"] == 0 and launches[0].args["x_op"] == X_OPS["plain"]
    if plan.splits == 1:
        assert plan.mode == OUT_MODES["residual"] and plan.workspace_bytes == 0 and len(launches) == 1
        assert launches[0].args["y"] == "y" and plan.counters == 0
        if plan.kernel in (*TC_KERNELS, *MMA_KERNELS):
            assert (launches[0].args["partial"], launches[0].args["counters"]) == (0, 0)
    elif plan.reduce_grid is None:  # gemm_tc, or gemv_mma on MMA_MERGE_MIN row blocks: the last split merges
        tiles = plan.grid[0] * (plan.grid[1] if tc else 1)
        slabs = plan.splits * tiles * tile_rows * 64 if tc else plan.splits * B * N  # fp32: a tile's rows x 64
        assert plan.mode == OUT_MODES["residual"] and plan.reduce_grid is None and plan.counters == tiles
        assert plan.workspace_bytes == 4 * slabs and len(launches) == 1
        assert (launches[0].args["y"], launches[0].args["partial"], launches[0].args["counters"]) == ("y", "ws", "c")
        assert launches[0].args["mode"] == OUT_MODES["residual"]
        with pytest.raises(ValueError, match="counters"):
            plan.launches("y", "x", "w", "ws", B, N, K)
    else:
        assert plan.mode == PARTIAL and plan.workspace_bytes == 4 * plan.splits * B * N
        main, red = launches
        assert main.args["y"] == "ws" and main.args["mode"] == PARTIAL
        assert red.kernel == "splitk_reduce" and red.args["partial"] == "ws" and red.args["y"] == "y"
        assert red.args["mode"] == OUT_MODES["residual"] and red.grid[0] * red.block[0] >= B * N
        with pytest.raises(ValueError, match="workspace"):
            plan.launches("y", "x", "w", None, B, N, K)



def test_gemm_tc_splits_until_three_blocks_per_sm_for_one_row_tile():
    assert tc_target_blocks(64) == 3 * SMS and tc_target_blocks(65) == 2 * SMS
    qkv = gemv_plan(37, 6144, 2048, "bf16", x_op="rmsnorm")  # 96 column tiles: 5 splits reach 3 x 132 blocks
    assert qkv.kernel == "gemm_tc" and qkv.grid == (1, 96, 5) and qkv.splits == 5
    assert gemv_plan(128, 6144, 2048).grid == (2, 96, 2)  # two row tiles: 2 x 132

def test_gemm_tc_input_is_normalised_once_by_rms_input_when_given_a_buffer():
    """With ``normed``, an rmsnorm-fused gemm_tc plan launches rms_input first (one warp per row) and multiplies the
    rows it wrote as stored; without it (or for other x_ops and kernels) the launches are as before."""
    plan = gemv_plan(37, 6144, 2048, "bf16", x_op="rmsnorm")
    rms, main = plan.launches("y", "x", "w", "ws", 37, 6144, 2048, norm="g", eps=1e-5, positions="p", normed="h",
                              counters="c")
    assert (rms.kernel, rms.grid, rms.block, rms.shared) == ("rms_input", (10, 1, 1), (128, 1, 1), 0)
    assert rms.args == dict(h="h", x="x", norm="g", positions="p", B=37, K=2048, eps=1e-5)
    assert main.kernel == "gemm_tc" and (main.args["x"], main.args["norm"], main.args["x_op"]) == ("h", 0, 0)
    fused = plan.launches("y", "x", "w", "ws", 37, 6144, 2048, norm="g", counters="c")
    assert [ln.kernel for ln in fused] == ["gemm_tc"] and fused[0].args["x_op"] == X_OPS["rmsnorm"]
    plain = gemv_plan(37, 6144, 2048, "bf16").launches("y", "x", "w", "ws", 37, 6144, 2048, normed="h", counters="c")
    assert [ln.kernel for ln in plain] == ["gemm_tc"] and plain[0].args["x"] == "x"
    small = gemv_plan(4, 2304, 768, "bf16", x_op="rmsnorm").launches("y", "x", "w", "ws", 4, 2304, 768, "g",
                                                                     normed="h")
    assert small[0].kernel == "gemv_mma" and small[0].args["x"] == "x"
    for B in (RMS_INPUT_MIN_B - 1, RMS_INPUT_MIN_B):  # below it gemm_tc(_narrow) normalises its rows in every block
        lns = gemv_plan(B, 6144, 2048, "bf16", x_op="rmsnorm").launches("y", "x", "w", "ws", B, 6144, 2048, "g",
                                                                        normed="h", counters="c")
        assert [ln.kernel for ln in lns] == ["rms_input"] * (B >= RMS_INPUT_MIN_B) + [tc_kernel(B)]
        assert (lns[-1].args["x"], lns[-1].args["x_op"]) == (("h", 0) if B >= RMS_INPUT_MIN_B else ("x", 1))


def test_gemv_plan_x_op():
    plan = gemv_plan(1, 768, 2048, "residual", splits=2, x_op="rmsnorm")
    main, red = plan.launches("y", "x", "w", "ws", 1, 768, 2048, norm="g", eps=1e-5)
    assert plan.x_op == X_OPS["rmsnorm"] and main.args["x_op"] == X_OPS["rmsnorm"] and main.args["eps"] == 1e-5
    assert main.args["norm"] == "g" and main.args["x"] == "x" and "x_op" not in red.args


def test_b1_plans_take_the_unit_stream():
    """Which B = 1 projections of the decode step run gemv's unit stream (one warp per unit, one K range): every
    projection of 1b and small: B = 1 keeps one warp per row (the LM head too, where B > 1 plans may take 2; small's
    short o and down too, where B > 1 plans take 2 and 4)."""
    from rawgraphs.model.config import ModelConfig

    def unit_stream(plan):
        return plan.kernel == UNIT_KERNEL and plan.parts == 1 and plan.splits == 1

    for preset in ("1b", "small"):
        c = ModelConfig.preset(preset)
        q = c.n_heads * c.head_dim + 2 * c.n_kv_heads * c.head_dim
        shapes = {"qkv": (q, c.dim, "bf16"), "o": (c.dim, c.n_heads * c.head_dim, "residual"),
                  "gate_up": (2 * c.ffn_dim, c.dim, "silu"), "down": (c.dim, c.ffn_dim, "residual"),
                  "lm_head": (c.vocab, c.dim, "f32")}
        for name, (N, K, out) in shapes.items():
            assert unit_stream(gemv_plan(1, N, K, out)), (preset, name)
    assert gemv_plan(1, 32000, 2048, "f32").parts == 1 and gemv_plan(2, 32000, 2048, "f32", "gemv").parts == 2
    assert gemv_plan(1, 768, 2048, "residual").parts == 1 and gemv_plan(2, 768, 2048, "residual", "gemv").parts == 4


@pytest.mark.parametrize("B,N,K,out,splits", [(2, 768, 768, "bf16", None), (1, 128, 9000, "f32", None),
                                              (1, 2048, 2048, "bf16", 2), (1, 384, 64, "silu", None)])
def test_gemv_unit_refuses_what_it_does_not_run(B, N, K, out, splits):
    """gemv_unit runs only B = 1's unit stream: asked for any other plan (B > 1, a K split, 2 warps a gate/up pair)
    gemv_plan says to run gemv instead, and gemv's own plan there is what it would have been."""
    with pytest.raises(ValueError, match=r"gemv_unit runs only B = 1's unit stream.*needs gemv"):
        gemv_plan(B, N, K, out, UNIT_KERNEL, splits)
    assert gemv_plan(B, N, K, out, "gemv", splits).kernel == "gemv"


@pytest.mark.parametrize("B", BATCHES)
@pytest.mark.parametrize("N,K", [(11264, 2048), (4096, 768), (384, 64), (198, 40), (128, 9000)])
def test_gemv_plan_silu(B, N, K):
    """out="silu" (gate/up pairs): the same grid and split-K as the bf16 plan; gemv gives a pair twice the warps
    a row gets where every pair has a group of its own, and in every case no warp streams more bytes than it does
    for rows; the reduce covers the B x N/2 outputs."""
    row, plan = gemv_plan(B, N, K, "bf16"), gemv_plan(B, N, K, "silu")
    # pairs may give a row 2 warps where rows have 1: then gemv_mma
    if ROWS_KERNELS.get(B) in (plan.kernel, row.kernel):
        unit = gemv_plan(1, N, K, "silu")
        assert (plan.kernel == ROWS_KERNELS[B]) == (unit.parts == 1 and unit.splits == 1 and rows_fit(B, K))
        assert plan.kernel in MMA_KERNELS or (plan.grid, plan.parts, plan.shared) == (unit.grid, 1, unit.shared)
        return
    gemv_family = {UNIT_KERNEL: "gemv"}  # a gate/up pair may take 2 warps (gemv) where a row runs gemv_unit
    assert (gemv_family.get(plan.kernel, plan.kernel), plan.splits, plan.k_chunk, plan.workspace_bytes) == (
        gemv_family.get(row.kernel, row.kernel), row.splits, row.k_chunk, row.workspace_bytes)
    merged = plan.reduce_grid is None  # no splitk_reduce after it
    assert plan.out_mode == OUT_MODES["silu"] and plan.mode == (OUT_MODES["silu"] if merged else PARTIAL)
    if plan.kernel in ("gemv", UNIT_KERNEL) and plan.splits == 1:
        if N // 2 * min(8, 2 * row.parts) <= SMS * 24:  # one pair per group: twice a row's warps
            assert plan.parts == min(8, 2 * row.parts)
        else:  # more pairs than groups: 1 or 2 warps a pair, as for rows (below: no warp streams more)
            assert plan.parts in (1, 2)
        groups = plan.grid[0] * 8 // plan.parts  # every pair owned, within one wave
        assert groups * plan.parts <= SMS * 24 and groups * math.ceil(N // 2 / groups) >= N // 2
        chunks = math.ceil(K / 256)  # per row; a warp's chunks: its units x its share of a unit
        mine = math.ceil(N // 2 / groups) * math.ceil(2 * chunks / plan.parts)
        assert mine <= math.ceil(N / (row.grid[0] * 8 // row.parts)) * math.ceil(chunks / row.parts)
    else:
        assert plan.grid == row.grid and plan.parts == row.parts
    if not merged:
        red = plan.launches("y", "x", "w", "ws", B, N, K)[1]
        assert red.args["mode"] == OUT_MODES["silu"] and red.grid[0] * 256 >= B * N // 2 > (red.grid[0] - 1) * 256
    with pytest.raises(ValueError, match="even N"):
        gemv_plan(B, N + 1, K, "silu")


@pytest.mark.parametrize("B,N,K,out,capped", [
    (9, 2304, 768, "bf16", True),       # small qkv: 144 blocks
    (8, 2304, 768, "bf16", False),      # B < 9
    (16, 4096, 768, "silu", True),      # small gate_up: 256 blocks
    (10, 768, 2048, "residual", True),  # small down: 48 rows of blocks, K split in two (96 blocks)
    (8, 2048, 5632, "residual", False),  # 1b down: 128 blocks x 3 splits
    (12, 2048, 2048, "residual", True),  # gemm_tc (a weight of 2048^2 elements from B = 9), 1b o: 32 x 8 splits
    (8, 2048, 2048, "residual", False),  # gemm_tc (a weight of 2048^2 elements from B = 4), 1b o: 256 blocks
    (8, 6144, 2048, "bf16", False),     # 1b qkv: 384 blocks
    (8, 32000, 768, "f32", False),       # LM head: 2000 blocks
    (32, 2048, 2048, "residual", True),  # gemm_tc, 1b o: 32 column tiles x 8 splits = 256 blocks
    (64, 4096, 768, "silu", True),      # gemm_tc, small gate_up: 192 blocks
    (256, 2304, 768, "bf16", False),    # gemm_tc, small qkv, 4 row tiles x 36 x 2 splits = 288 blocks
    (256, 768, 768, "residual", True),  # gemm_tc, small o, 4 x 12 x 3 = 144 blocks
    (37, 6144, 2048, "bf16", False),    # gemm_tc, 1b qkv: 480 blocks
    (64, 32000, 768, "f32", False),      # gemm_tc, LM head: 500 blocks
])
def test_two_per_sm_plan(B, N, K, out, capped):
    """gemv_mma and gemm_tc are capped at 2 blocks per SM (unused dynamic shared memory) exactly where
    two_per_sm says: grids of at most 2 x 132 blocks at B >= 9."""
    plan = gemv_plan(B, N, K, out)
    tc = runs_gemm_tc(B, N, K)
    assert plan.kernel == (tc_kernel(B) if tc else mma_kernel(B))
    if not tc:
        assert plan.shared == (TWO_PER_SM_SHARED if capped else 0)
    else:
        assert plan.shared == (TC_TWO_PER_SM_SHARED if capped else TC_SHARED)
    assert (B >= CAPPED_FROM and math.prod(plan.grid) <= 2 * SMS) == capped
    assert all(ln.shared == plan.shared for ln in plan.launches("y", "x", "w", "ws", B, N, K, counters="c")[:1])


def h200_blocks_per_sm(registers: int, static: int, dynamic: int, threads: int = 256) -> int:
    """The occupancy calculator's answer on an H200 (sm_90: 64K registers, 228 KiB of shared memory and 2048
    threads per SM, 1 KiB of shared memory reserved per block). test_plans_blocks_per_sm checks the plans
    against the driver itself on the GPU; this checks them in CI against what ptxas says the kernels use."""
    return min(65536 // (registers * threads), 228 * 1024 // (static + dynamic + 1024), 2048 // threads)


def test_gemv_ring_constants_match_the_kernel():
    """plans.py sizes gemv's and gemm_tc's shared memory from the rings the kernel declares: a change on one side
    only would overrun the launch's shared memory or waste it."""
    src = (kernel_dir() / "gemv.cu").read_text()
    assert int(re.search(r"#define PIPE_STAGES (\d+)", src).group(1)) == GEMV_STAGES
    assert int(re.search(r"#define PIPE_CHUNK (\d+)", src).group(1)) == GEMV_CHUNK
    assert int(re.search(r"#define GEMV_ROWS_MAX (\d+)", src).group(1)) == ROWS_MAX
    assert GEMV_RING == GEMV_STAGES * GEMV_CHUNK * 2
    # gemm_tc's pipeline: TC_STAGES x (x tile + W tile) of 64 rows padded to TC_LD elements
    assert int(re.search(r"#define TC_STAGES (\d+)", src).group(1)) == TC_STAGES
    assert int(re.search(r"#define TC_LD \(TC_K \+ (\d+)\)", src).group(1)) == 8
    assert TC_SHARED == TC_STAGES * 2 * 64 * (64 + 8) * 2


def test_gemv_splits_k_only_past_its_x_row():
    """gemv stages a whole x row (K split) per block: K splits only where rings + x would pass GEMV_SHARED."""
    longest = (GEMV_SHARED - gemv_used_shared(0)) // 2 // 64 * 64
    assert longest == 7424
    assert gemv_plan(1, 2048, longest).splits == 1 and gemv_plan(1, 2048, longest + 64).splits == 2


@pytest.mark.parametrize("B", [2, 3])
def test_stated_splits_override_the_unit_stream(B):
    """``splits=`` overrides the plan's choice at every B: at B = 2-3 it leaves gemv_rows2/3 (which never split) for
    gemv_mma, or gemm_tc_narrow at B = 3 for this large weight of K >= 2048."""
    assert gemv_plan(B, 4096, 4096).kernel == ROWS_KERNELS[B]
    plan = gemv_plan(B, 4096, 4096, splits=4)
    assert plan.kernel == ("gemm_tc_narrow" if B == 3 else "gemv_mma") and plan.splits == 4


def test_occupancy_caps_hold_for_the_compiled_kernels():
    """The shared-memory caps of plans.py give the blocks per SM they claim for the kernels as compiled now (a
    kernel that grew its static shared memory or registers would silently change them): gemv 3 (4 uncapped),
    gemv_mma 2 under its cap (3 uncapped), gemm_tc 2 under its cap (4 of 8 warps by its
    registers and its pipeline's shared memory)."""
    use = resource_usage("gemv")
    for N, K, out in [(6144, 2048, "bf16"), (2048, 5632, "residual"), (32000, 2048, "f32"), (11264, 2048, "silu")]:
        plan = gemv_plan(1, N, K, out)
        used = gemv_used_shared(plan.k_chunk)
        assert h200_blocks_per_sm(*use["gemv"], plan.shared) == 3 < h200_blocks_per_sm(*use["gemv"], used) == 4
    for B, N, K in [(2, 2048, 5632), (3, 6144, 2048), (3, 32000, 2048)]:  # gemv_rows2/3: 3 by registers and the cap
        plan = gemv_plan(B, N, K)
        assert plan.kernel == ROWS_KERNELS[B] and h200_blocks_per_sm(*use[plan.kernel], plan.shared) == 3
    capped = gemv_plan(9, 2304, 768)
    assert capped.shared == TWO_PER_SM_SHARED
    for kernel in MMA_KERNELS:  # each pass width's static arrays + the cap's request: 2 blocks, 3 without it
        assert h200_blocks_per_sm(*use[kernel], capped.shared) == 2 < h200_blocks_per_sm(*use[kernel], 0) == 3
    capped = gemv_plan(32, 2048, 2048)
    assert capped.kernel == "gemm_tc" and capped.shared == TC_TWO_PER_SM_SHARED
    tc = h200_blocks_per_sm(*use["gemm_tc"], capped.shared, threads=256)
    assert tc == 2 < h200_blocks_per_sm(*use["gemm_tc"], TC_SHARED, threads=256) == 4


@pytest.mark.parametrize("kernel,rows,threads",
                         [("gemv", 8, 256), ("gemv_mma", 16, 256), ("gemm_tc", 64, 256), ("gemm_tc_narrow", 64, 256)])
def test_gemv_plan_override(kernel, rows, threads):
    plan = gemv_plan(5, 2048, 5632, "f32", kernel=kernel, splits=3)
    grid = (1, 2048 // rows, 3) if kernel in TC_KERNELS else (2048 // rows, 3, 1)  # gemv: 1 warp a row
    assert (plan.kernel, plan.grid, plan.block) == (kernel, grid, (threads, 1, 1))
    mode = PARTIAL if kernel == "gemv" else OUT_MODES["f32"]  # gemv_mma and gemm_tc merge their splits themselves
    assert plan.k_chunk == 1920 and plan.mode == mode and plan.out_mode == OUT_MODES["f32"]
    with pytest.raises(ValueError, match="unknown gemv kernel"):
        gemv_plan(1, 64, 64, kernel="gemv_fast")


def test_gemv_plan_rejects_bad_shapes():
    with pytest.raises(ValueError, match="multiple of 8"):
        gemv_plan(1, 64, 60)
    with pytest.raises(ValueError, match="out must be"):
        gemv_plan(1, 64, 64, "fp16")
    with pytest.raises(ValueError, match="x_op must be"):
        gemv_plan(1, 64, 64, x_op="gelu")
    with pytest.raises(ValueError, match="norm weight"):
        gemv_plan(1, 64, 64, x_op="rmsnorm").launches("y", "x", "w", None, 1, 64, 64)
    want = gemv_plan(64, 2048, 2048)
    assert max_workspace_bytes([1, 64], [(2048, 2048), (768, 2048)]) == want.workspace_bytes
    assert max_counters([1, 64], [(2048, 2048), (768, 2048)]) == want.counters == 32


M64 = (1 << 64) - 1


def mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer of ``z + golden``, on uint64 arrays (wrapping), as ``mix64`` in sample.cu."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sample_reference(logits: np.ndarray, seed: int, step: int, temperature: float) -> np.ndarray:
    """Exact NumPy equivalent of the ``sample`` kernel (fp32 math, same hash, lowest index on ties)."""
    logits = np.asarray(logits, np.float32)  # [B, V]
    if not temperature > 0:
        return ref.argmax(logits)
    B, V = logits.shape
    rows = np.arange(B, dtype=np.uint64)
    key = mix64(np.uint64(seed) ^ mix64((np.uint64(step & 0xFFFFFFFF) << np.uint64(32)) | rows))  # [B]
    r = mix64(key[:, None] + np.arange(V, dtype=np.uint64)[None, :])  # [B, V]
    u = ((r >> np.uint64(41)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -23)
    score = logits / np.float32(temperature) - np.log(-np.log(u))  # [B, V] fp32
    return np.argmax(score, axis=1).astype(np.int32)  # first maximum: lowest index on ties


def test_hash_matches_splitmix64():
    # splitmix64 seeded with 0 yields 0xE220A8397B1DCDAF first: mix64 is its output function.
    with np.errstate(over="ignore"):
        assert int(mix64(np.array([0], np.uint64))[0]) == 0xE220A8397B1DCDAF


# ---------------------------------------------------------------- GPU helpers

def bf16(a) -> np.ndarray:
    return np.asarray(a, np.float32).astype(BF16)


def poisoned(shape, dtype, stream):
    from rawgraphs.memory import DeviceBuffer
    buf = DeviceBuffer(shape, dtype)
    buf.fill_bytes(0xFF, stream)  # NaN in bf16 and fp32: any element left unwritten fails the comparison
    return buf


def upload(host):
    """A device copy of ``host``, complete before any stream's later work (a pageable cuMemcpyHtoD may return
    before its DMA lands, and our streams are non-blocking)."""
    from rawgraphs.context import device
    from rawgraphs.memory import DeviceBuffer
    buf = DeviceBuffer.from_numpy(np.ascontiguousarray(host))
    device().synchronize()
    return buf


def launch(module, name, grid, block, stream, shared=0, **args):
    from rawgraphs.kernel import LaunchShape
    k = module.kernel(name)
    k.launch(LaunchShape(grid, block, shared), k.args(**args), stream)


def run_gemv(module, y, x, w, B, N, K, out, stream, kernel=None, splits=None, x_op="plain", norm=None, eps=0.0,
             positions=None):
    """Launch the plan for one projection (workspace poisoned too) and return the plan."""
    plan = gemv_plan(B, N, K, out, kernel, splits, x_op)
    ws = poisoned((max(plan.workspace_bytes, 1),), np.uint8, stream) if plan.splits > 1 else None
    counters = upload(np.zeros(max(plan.counters, 1), np.int32))
    for step in plan.launches(y, x, w, ws, B, N, K, norm, eps, positions, counters=counters):
        launch(module, step.kernel, step.grid, step.block, stream, step.shared, **step.args)
    return plan


def fused_input(x, g, eps, x_op):
    """The bf16 tensor a projection with ``x_op`` multiplies: what rmsnorm.cu would store."""
    return ref.to_bf16(ref.rmsnorm(x, g, eps)) if x_op == "rmsnorm" else x


def projected(h, w, out):
    """The reference of a projection of h: ``linear``, or for ``out == "silu"`` silu_mul of its bf16 rounding."""
    return ref.silu_mul(ref.to_bf16(ref.linear(h, w))) if out == "silu" else ref.linear(h, w)


@pytest.fixture(scope="module")
def mods():
    from rawgraphs.kernel import Module
    return {name: Module.from_file(name) for name in FILES}


# ---------------------------------------------------------------- GPU: embedding, rmsnorm, silu_mul

@pytest.mark.gpu
@pytest.mark.parametrize("V,D", [(512, 64), (32000, 2048)])
def test_embedding(mods, stream, rng, V, D):
    table = bf16(rng.standard_normal((V, D)))  # [V, D]
    tokens = rng.integers(0, V, size=37).astype(np.int32)  # [B]
    tokens[[0, 5, 36]] = -1  # inactive rows
    tokens[7] = V - 1
    out = poisoned((37, D), BF16, stream)
    launch(mods["embedding"], "embedding", (37,), (128,), stream, out=out, tokens=upload(tokens),
           table=upload(table), V=V, D=D)
    stream.synchronize()
    want = ref.embedding(np.maximum(tokens, 0), table)  # [B, D]
    want[tokens < 0] = 0.0
    np.testing.assert_array_equal(out.to_numpy().astype(np.float64), want)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 3, 37, 256])
@pytest.mark.parametrize("D", [64, 768, 2048])
def test_rmsnorm_and_add_rmsnorm(mods, stream, rng, B, D):
    eps = 1e-5
    x = bf16(rng.standard_normal((B, D)))  # [B, D]
    res = bf16(rng.standard_normal((B, D)) * 2.0)  # [B, D]
    w = bf16(rng.uniform(0.5, 1.5, D))  # [D]
    out = poisoned((B, D), BF16, stream)
    launch(mods["rmsnorm"], "rmsnorm", (B,), (256,), stream, out=out, x=upload(x), w=upload(w), eps=eps, D=D)
    stream.synchronize()
    np.testing.assert_allclose(out.to_numpy().astype(np.float64), ref.rmsnorm(x, w, eps),
                               rtol=1e-2, atol=1e-2)

    out2, residual = poisoned((B, D), BF16, stream), upload(res)
    launch(mods["rmsnorm"], "add_rmsnorm", (B,), (256,), stream, out=out2, residual=residual, x=upload(x),
           w=upload(w), eps=eps, D=D)
    stream.synchronize()
    summed = ref.to_bf16(res.astype(np.float64) + x.astype(np.float64))  # [B, D]: fp32 add, one bf16 rounding
    np.testing.assert_array_equal(residual.to_numpy().astype(np.float64), summed)
    np.testing.assert_allclose(out2.to_numpy().astype(np.float64), ref.rmsnorm(summed, w, eps),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 37, 256])
@pytest.mark.parametrize("F", [192, 5632])
def test_silu_mul(mods, stream, rng, B, F):
    gu = bf16(rng.standard_normal((B, 2 * F)) * 3.0)  # [B, 2F]
    out = poisoned((B, F), BF16, stream)
    launch(mods["silu_mul"], "silu_mul", (math.ceil(F / 8 / 256), B), (256,), stream,
           out=out, gu=upload(gu), F=F)
    stream.synchronize()
    np.testing.assert_allclose(out.to_numpy().astype(np.float64), ref.silu_mul(gu), rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------- GPU: gemv

@pytest.mark.gpu
@pytest.mark.parametrize("N,K", GEMV_SHAPES)
def test_gemv(mods, stream, rng, N, K):
    w = bf16(rng.standard_normal((N, K)) / math.sqrt(K))  # [N, K]: outputs O(1)
    wd = upload(w)
    for B in BATCHES:
        x = bf16(rng.standard_normal((B, K)))  # [B, K]
        xd = upload(x)
        want = ref.linear(x, w)  # [B, N]
        res = bf16(rng.standard_normal((B, N)))  # [B, N]
        outs = {}
        for out, dtype in (("bf16", BF16), ("f32", np.float32), ("residual", BF16)):
            runs = []
            for _ in range(2):
                y = upload(res) if out == "residual" else poisoned((B, N), dtype, stream)
                plan = run_gemv(mods["gemv"], y, xd, wd, B, N, K, out, stream)
                stream.synchronize()
                runs.append(y.to_numpy())
            assert runs[0].tobytes() == runs[1].tobytes(), f"B={B} {out} {plan}: not bit-identical"
            outs[out] = runs[0].astype(np.float64)
        where = f"B={B} N={N} K={K} plan={gemv_plan(B, N, K)}"
        np.testing.assert_allclose(outs["bf16"], want, rtol=1e-2, atol=1e-2, err_msg=where)
        np.testing.assert_allclose(outs["f32"], want, rtol=1e-5, atol=1e-4, err_msg=where)
        np.testing.assert_allclose(outs["residual"], res.astype(np.float64) + want, rtol=1e-2, atol=1e-2,
                                   err_msg=where)
        for kernel, splits in VARIANTS:  # every kernel is correct at every B, with and without split-K
            y = poisoned((B, N), BF16, stream)
            plan = run_gemv(mods["gemv"], y, xd, wd, B, N, K, "bf16", stream, kernel, splits)
            stream.synchronize()
            np.testing.assert_allclose(y.to_numpy().astype(np.float64), want, rtol=1e-2, atol=1e-2,
                                       err_msg=f"B={B} N={N} K={K} {plan}")


@pytest.mark.gpu
@pytest.mark.parametrize("N,K", [(11264, 2048), (4096, 768), (384, 64), (198, 40), (128, 9000)])
def test_gemv_silu(mods, stream, rng, N, K):
    """out="silu": weight rows n (gate) and n + N/2 (up) give y[b, n] = bf16(silu(g) * u) of their bf16-rounded
    sums, for every kernel, with and without split-K (the reduce pairs them), bit-identical run to run; 1b and
    small gate_up, tiny, an odd pair count, and a K that makes gemv split."""
    w = bf16(rng.standard_normal((N, K)) / math.sqrt(K))  # [N, K]: gate rows, then up rows; sums O(1)
    wd = upload(w)
    for B in [1, 2, 3, 4, 8, 16, 37, 64]:
        x = bf16(rng.standard_normal((B, K)))  # [B, K]
        xd = upload(x)
        want = projected(x, w, "silu")  # [B, N/2]
        for kernel, splits in [(None, None), *VARIANTS]:
            runs = []
            for _ in range(2):
                y = poisoned(want.shape, BF16, stream)
                plan = run_gemv(mods["gemv"], y, xd, wd, B, N, K, "silu", stream, kernel, splits)
                stream.synchronize()
                runs.append(y.to_numpy())
            assert runs[0].tobytes() == runs[1].tobytes(), f"B={B} {plan}: not bit-identical"
            np.testing.assert_allclose(runs[0].astype(np.float64), want, rtol=1e-2, atol=1e-2,
                                       err_msg=f"B={B} N={N} K={K} {plan}")


FUSED_SHAPES = [(2304, 768), (768, 2048), (2048, 5632), (99, 40)]  # small qkv / down-like, 1b down, ragged


@pytest.mark.gpu
@pytest.mark.parametrize("N,K", FUSED_SHAPES)
def test_gemv_fused_input(mods, stream, rng, N, K):
    """x_op="rmsnorm" fuses rmsnorm into the x loads: the result is the projection of the bf16 tensor the
    separate kernel would have stored (reference: op in float64, rounded to bf16, then linear)."""
    x_op = "rmsnorm"
    eps = 1e-5
    w = bf16(rng.standard_normal((N, K)) / math.sqrt(K))  # [N, K]
    wd = upload(w)
    g = bf16(rng.uniform(0.5, 1.5, K))  # [K] norm weight
    gd = upload(g)
    for B in [1, 3, 16, 37]:
        x = bf16(rng.standard_normal((B, K)) * 3.0)  # [B, K]
        h = fused_input(x, g, eps, x_op)  # [B, K]
        want = ref.linear(h, w)  # [B, N]
        xd = upload(x)
        for kernel, splits in [(None, None), *VARIANTS]:
            runs = []
            for _ in range(2):
                y = poisoned((B, N), np.float32, stream)
                plan = run_gemv(mods["gemv"], y, xd, wd, B, N, K, "f32", stream, kernel, splits, x_op, gd, eps)
                stream.synchronize()
                runs.append(y.to_numpy())
            assert runs[0].tobytes() == runs[1].tobytes(), f"B={B} {plan}: not bit-identical"
            # fp32 output: error is the 1-ulp bf16 flips of h where the GPU's inverse RMS differs in its
            # last bit (~2^-8 relative on a few elements) plus fp32 accumulation.
            np.testing.assert_allclose(runs[0].astype(np.float64), want, rtol=1e-2, atol=1e-2,
                                       err_msg=f"B={B} N={N} K={K} {x_op} {plan}")


@pytest.mark.gpu
@pytest.mark.parametrize("x_op,out", [("plain", "f32"), ("rmsnorm", "f32"), ("rmsnorm", "silu")])
@pytest.mark.parametrize("N,K", [(2048, 5632), (2304, 768), (98, 40), (64, 9000)])
def test_gemv_any_grid(mods, stream, rng, N, K, x_op, out):
    """gemv's warp groups stride over the rows (out="silu": gate/up row pairs), so any grid and any warps per
    row are correct, and a row is summed in the same order whichever group owns it: one block (every ring
    wrapping across rows), 3 blocks and twice the planned grid give the planned grid's bytes (K = 9000 splits:
    x fits in halves); 1, 2 and 8 warps per row match the reference."""
    eps = 1e-5
    w = bf16(rng.standard_normal((N, K)) / math.sqrt(K))  # [N, K]
    g = bf16(rng.uniform(0.5, 1.5, K))  # [K] norm weight
    B = 3
    x = bf16(rng.standard_normal((B, K)) * 3.0)  # [B, K]
    h = fused_input(x, g, eps, x_op)  # [B, K]: the input the kernel multiplies
    want = projected(h, w, out)  # [B, N] or [B, N/2]
    wd, xd, gd = upload(w), upload(x), upload(g)
    plan = gemv_plan(B, N, K, out, "gemv", x_op=x_op)
    ws = poisoned((max(plan.workspace_bytes, 1),), np.uint8, stream)
    tol = dict(rtol=1e-5, atol=1e-4) if x_op == "plain" else dict(rtol=1e-2, atol=1e-2)
    runs = []
    for parts, blocks in ((plan.parts, plan.grid[0]), (plan.parts, 1), (plan.parts, 3), (plan.parts, 2 * plan.grid[0]),
                          (1, 5), (2, 7), (8, plan.grid[0])):
        y = poisoned(want.shape, np.float32 if out == "f32" else BF16, stream)
        for step in replace(plan, grid=(blocks, *plan.grid[1:]), parts=parts).launches(y, xd, wd, ws, B, N, K, gd,
                                                                                      eps):
            launch(mods["gemv"], step.kernel, step.grid, step.block, stream, step.shared, **step.args)
        stream.synchronize()
        got = y.to_numpy()
        where = f"parts={parts} blocks={blocks} plan={plan}"
        np.testing.assert_allclose(got.astype(np.float64), want, err_msg=where, **tol)
        if parts == plan.parts:
            runs.append(got)
            assert runs[-1].tobytes() == runs[0].tobytes(), where + f": differs from {plan.grid[0]} blocks"


@pytest.mark.gpu
@pytest.mark.parametrize("x_op,out", [("plain", "f32"), ("rmsnorm", "residual"), ("rmsnorm", "silu")])
@pytest.mark.parametrize("N,K", [(2048, 5632), (11264, 2048), (2304, 768), (98, 40)])
def test_gemv_unit_stream(mods, stream, rng, N, K, x_op, out):
    """At B = 1 with one warp per unit and one K range gemv runs its unit stream (gemv_unit_body), and so does
    gemv_unit (the kernel the plans pick there); the bytes of both are those of gemv's general body summing the same
    row (row 0 of B = 2, one warp per unit), on the plan's grid, on 1 block (every ring wrapping across units) and on
    3, and match the reference. Launched by hand outside its domain (B = 2), gemv_unit stores nothing."""
    eps = 1e-5
    w = bf16(rng.standard_normal((N, K)) / math.sqrt(K))  # [N, K]
    g = bf16(rng.uniform(0.5, 1.5, K))  # [K] norm weight
    x = bf16(rng.standard_normal((2, K)) * 3.0)  # [2, K]: row 0 is the B = 1 input
    res = bf16(rng.standard_normal((2, N // 2 if out == "silu" else N)))  # [2, N] residual (out="residual")
    want = projected(fused_input(x[:1], g, eps, x_op), w, out)  # [1, N] or [1, N/2]
    wd, xd, gd = upload(w), upload(x), upload(g)
    plan = gemv_plan(1, N, K, out, "gemv", x_op=x_op)
    want_dtype = np.float32 if out == "f32" else BF16

    def run(B, blocks, kernel="gemv", rows=1):  # one warp per unit, one K range: the unit stream's case at B = 1
        y = upload(res[:B]) if out == "residual" else poisoned((B, *want.shape[1:]), want_dtype, stream)
        p = replace(gemv_plan(B, N, K, out, "gemv", splits=1, x_op=x_op), grid=(blocks, 1, 1), parts=1, kernel=kernel)
        for step in p.launches(y, xd, wd, None, B, N, K, gd, eps):
            launch(mods["gemv"], step.kernel, step.grid, step.block, stream, step.shared, **step.args)
        stream.synchronize()
        return y.to_numpy()[:rows]

    general = run(2, plan.grid[0])  # B = 2: the general body
    base = res[:1].astype(np.float64) if out == "residual" else 0.0
    np.testing.assert_allclose(general.astype(np.float64), base + want, rtol=1e-2, atol=1e-2)
    unit = plan.parts == 1 and plan.splits == 1  # else (a short gate/up N) two warps a pair: gemv, not gemv_unit
    assert gemv_plan(1, N, K, out, x_op=x_op) == (replace(plan, kernel=UNIT_KERNEL) if unit else plan)
    for kernel in ("gemv", UNIT_KERNEL):
        for blocks in (plan.grid[0], 1, 3):
            got = run(1, blocks, kernel)
            assert got.tobytes() == general.tobytes(), f"{kernel} blocks={blocks} {plan}: differs from the general body"
    outside = run(2, plan.grid[0], UNIT_KERNEL, rows=2)
    assert outside.tobytes() == (res[:2].tobytes() if out == "residual" else b"\xff" * outside.nbytes)


@pytest.mark.gpu
@pytest.mark.parametrize("x_op,out", [("plain", "f32"), ("rmsnorm", "residual"), ("rmsnorm", "silu")])
@pytest.mark.parametrize("N,K", [(2048, 5632), (11264, 2048), (2304, 768), (98, 40)])
def test_gemv_rows_unit_stream(mods, stream, rng, N, K, x_op, out):
    """gemv_rows2 / gemv_rows3 at B = 2 / 3 stream each weight chunk once for every row: row b's bytes are gemv's at
    B = 1 on x[b] alone (the unit stream), on the plan's grid, 1 block (rings wrapping across units) and 3, with rows
    inactive in between (zeros, or the residual untouched); at B = 4 (past GEMV_ROWS_MAX, gemv_rows3) and where the
    rows do not fit its shared memory (1b down at B = 3) the general body gives the same bytes."""
    eps = 1e-5
    w = bf16(rng.standard_normal((N, K)) / math.sqrt(K))  # [N, K]
    g = bf16(rng.uniform(0.5, 1.5, K))  # [K] norm weight
    x = bf16(rng.standard_normal((4, K)) * 3.0)  # [4, K]
    res = bf16(rng.standard_normal((4, N // 2 if out == "silu" else N)))  # [4, N] residual (out="residual")
    wd, gd = upload(w), upload(g)
    dtype = np.float32 if out == "f32" else BF16

    def run(rows, plan, blocks, positions=None):  # -> y [len(rows), ...] from a poisoned (or residual) buffer
        B = len(rows)
        y = upload(res[rows]) if out == "residual" else poisoned(res[rows].shape, dtype, stream)
        pd = upload(positions) if positions is not None else None
        for step in replace(plan, grid=(blocks, *plan.grid[1:])).launches(y, upload(x[rows]), wd, None, B, N, K, gd,
                                                                           eps, pd):
            launch(mods["gemv"], step.kernel, step.grid, step.block, stream, step.shared, **step.args)
        stream.synchronize()
        return y.to_numpy()

    one = gemv_plan(1, N, K, out, x_op=x_op)
    single = np.concatenate([run([b], one, one.grid[0]) for b in range(4)])  # [4, ...]: B = 1, row by row
    want = projected(fused_input(x, g, eps, x_op), w, out) + (res.astype(np.float64) if out == "residual" else 0)
    np.testing.assert_allclose(single.astype(np.float64), want, rtol=1e-2, atol=1e-2)
    for B in (2, 3, 4):
        plan = gemv_plan(B, N, K, out, ROWS_KERNELS[min(B, ROWS_MAX)], x_op=x_op)
        if gemv_plan(B, N, K, out, x_op=x_op).kernel == plan.kernel:
            assert plan == gemv_plan(B, N, K, out, x_op=x_op)
        for blocks in (plan.grid[0], 1, 3):
            got = run(list(range(B)), plan, blocks)
            assert got.tobytes() == single[:B].tobytes(), f"B={B} blocks={blocks} {plan}: not B = 1's bytes"
        positions = np.arange(B, dtype=np.int32) + 7
        positions[1::2] = -1  # rows 1 (and 3) inactive
        got = run(list(range(B)), plan, plan.grid[0], positions)
        base = res[:B] if out == "residual" else np.zeros_like(single[:B])
        on = positions >= 0
        assert got[on].tobytes() == single[:B][on].tobytes() and got[~on].tobytes() == base[~on].astype(dtype).tobytes()


@pytest.mark.gpu
def test_plans_blocks_per_sm(mods):
    """The occupancy the plans are built on, read back from the driver: gemv 3 blocks per SM under its
    shared-memory cap (the one-wave grid of plans.py; 4 by its registers alone), gemv_mma 3, or 2 under the plan's
    cap, gemm_tc 4 (8 warps; registers and shared memory), or 2 under the cap (test_gemv runs the capped plans)."""
    from rawgraphs.kernel import LaunchShape

    def blocks(plan):
        return mods["gemv"].kernel(plan.kernel).blocks_per_sm(LaunchShape(plan.grid, plan.block, plan.shared))

    assert blocks(gemv_plan(1, 2048, 2048)) == 3 and blocks(gemv_plan(1, 2048, 5632, "residual")) == 3
    assert blocks(gemv_plan(4, 4096, 768, "silu")) == 3  # gemv_mma, 256 blocks: uncapped below B = 9
    uncapped = gemv_plan(8, 2048, 2048)  # gemm_tc_narrow below the cap's batch
    assert uncapped.kernel == "gemm_tc_narrow" and math.prod(uncapped.grid) <= 2 * SMS and blocks(uncapped) == 4
    capped = gemv_plan(12, 2048, 2048)
    assert capped.kernel == "gemm_tc_narrow" and capped.shared == TC_TWO_PER_SM_SHARED and blocks(capped) == 2
    rows = gemv_plan(3, 6144, 2048)
    assert rows.kernel == "gemv_rows3" and blocks(rows) == 3 and blocks(gemv_plan(2, 2048, 5632, "residual")) == 3
    capped = gemv_plan(9, 2304, 768)
    assert capped.shared == TWO_PER_SM_SHARED and blocks(capped) == 2
    assert blocks(gemv_plan(37, 6144, 2048)) == 4
    capped = gemv_plan(32, 2048, 2048)
    assert capped.kernel == "gemm_tc" and capped.shared == TC_TWO_PER_SM_SHARED and blocks(capped) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("x_op", ["plain", "rmsnorm"])
@pytest.mark.parametrize("N,K", [(2304, 768), (768, 2048), (98, 40)])
def test_gemv_skips_inactive_rows(mods, stream, rng, N, K, x_op):
    """Rows with positions < 0 read no input (their x is NaN here) and come out as zeros (bf16, f32) or leave
    the residual bit-for-bit as it was; the active rows match the reference, for every kernel and split-K."""
    eps = 1e-5
    w = bf16(rng.standard_normal((N, K)) / math.sqrt(K))  # [N, K]
    g = bf16(rng.uniform(0.5, 1.5, K))  # [K] norm weight
    wd, gd = upload(w), upload(g)
    for B in [1, 2, 3, 4, 16, 37]:
        positions = rng.integers(0, 100, size=B).astype(np.int32)  # [B]
        positions[rng.permutation(B)[:max(1, B // 3)]] = -1  # a third of the rows inactive (B = 1: the row)
        off = positions < 0
        x = bf16(rng.standard_normal((B, K)) * 3.0)  # [B, K]
        h = fused_input(x, g, eps, x_op)  # [B, K]
        x[off] = np.nan  # an inactive row's input must never be read
        xd, pd = upload(x), upload(positions)
        res = bf16(rng.standard_normal((B, N)))  # [B, N]
        for kernel, splits in VARIANTS:
            for out, dtype in (("bf16", BF16), ("f32", np.float32), ("residual", BF16), ("silu", BF16)):
                want = projected(h, w, out)  # [B, N] or [B, N/2]
                y = upload(res) if out == "residual" else poisoned(want.shape, dtype, stream)
                plan = run_gemv(mods["gemv"], y, xd, wd, B, N, K, out, stream, kernel, splits, x_op, gd, eps, pd)
                stream.synchronize()
                got, where = y.to_numpy().astype(np.float64), f"B={B} {out} {x_op} {plan}"
                base = res.astype(np.float64) if out == "residual" else np.zeros(want.shape)
                np.testing.assert_allclose(got[~off], (base + want)[~off], rtol=1e-2, atol=1e-2, err_msg=where)
                np.testing.assert_array_equal(got[off], base[off], err_msg=where)


@pytest.mark.gpu
@pytest.mark.parametrize("N,K,out", [(6144, 2048, "bf16"), (4096, 768, "silu"), (32000, 768, "f32")])
def test_rms_input_gives_gemm_tc_the_rows_it_normalises_itself(mods, stream, rng, N, K, out):
    """rms_input writes each active row's X_RMSNORM input (rmsnorm.cu's rounding), and gemm_tc multiplying those
    rows as stored gives the same bytes as gemm_tc normalising them itself, at B = 37 (one row tile, split K) and
    130 (three row tiles), with a third of the rows inactive (their x is NaN: never read)."""
    eps = 1e-5
    w, g = bf16(rng.standard_normal((N, K)) / math.sqrt(K)), bf16(rng.uniform(0.5, 1.5, K))  # [N, K], [K]
    wd, gd = upload(w), upload(g)
    for B in (37, 130):
        positions = rng.integers(0, 100, size=B).astype(np.int32)  # [B]
        positions[rng.permutation(B)[:B // 3]] = -1
        off = positions < 0
        x = bf16(rng.standard_normal((B, K)) * 3.0)  # [B, K]
        h = fused_input(np.where(off[:, None], 0, x), g, eps, "rmsnorm")  # [B, K] the reference input
        x[off] = np.nan
        xd, pd = upload(x), upload(positions)
        plan = gemv_plan(B, N, K, out, x_op="rmsnorm")
        assert plan.kernel == "gemm_tc"
        ws = poisoned(max(plan.workspace_bytes, 4), np.uint8, stream)
        counters = upload(np.zeros(max(plan.counters, 1), np.int32))
        outs = []
        for normed in (None, poisoned((B, K), BF16, stream)):
            y = poisoned((B, N // 2 if out == "silu" else N), np.float32 if out == "f32" else BF16, stream)
            for ln in plan.launches(y, xd, wd, ws, B, N, K, gd, eps, pd, normed, counters):
                launch(mods["gemv"], ln.kernel, ln.grid, ln.block, stream, ln.shared, **ln.args)
            stream.synchronize()
            outs.append(y.to_numpy())
        got_h = normed.to_numpy().astype(np.float64)
        np.testing.assert_allclose(got_h[~off], h[~off].astype(np.float64), rtol=1e-2, atol=1e-2)
        assert outs[1].tobytes() == outs[0].tobytes(), f"B={B} {out}: rms_input's rows changed gemm_tc's bytes"
        np.testing.assert_allclose(outs[1][~off].astype(np.float64), projected(h, w, out)[~off], rtol=1e-2,
                                   atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,batches", [("gemm_tc", (24, 37, 130)), ("gemm_tc_narrow", (4, 12, 37, 130)),
                                            ("gemv_mma", (5, 16)), ("gemv_mma16", (5, 16)),
                                            ("gemv_mma32", (16, 37))])
@pytest.mark.parametrize("N,K,out,x_op", [(6144, 2048, "residual", "rmsnorm"), (4096, 768, "silu", "rmsnorm"),
                                          (2048, 5632, "f32", "plain"), (98, 200, "bf16", "plain")])
def test_split_k_merges_in_the_kernel_as_splitk_reduce_would(mods, stream, rng, N, K, out, x_op, kernel, batches):
    """A split gemm_tc's (gemv_mma's) last block per tile (row block) sums the splits in splitk_reduce's order, so
    its bytes equal the two-launch path (mode PARTIAL, then splitk_reduce): gemm_tc at B = 24 (a 32-row tile), 37
    (one 64-row tile) and 130 (three; a ragged last tile), gemm_tc_narrow (32-row tiles whose merge stages only the
    batch rows) at B = 4, 12, 37 and 130, gemv_mma at B = 5 and 16, with a third of the rows inactive
    (x NaN: never read; "residual" leaves them as they were). The counters come back zero, so launching again gives
    the same bytes."""
    eps = 1e-5
    w, g = bf16(rng.standard_normal((N, K)) / math.sqrt(K)), bf16(rng.uniform(0.5, 1.5, K))  # [N, K], [K]
    wd, gd = upload(w), upload(g)
    n_out = N // 2 if out == "silu" else N
    for B in batches:
        positions = rng.integers(0, 100, size=B).astype(np.int32)  # [B]
        positions[rng.permutation(B)[:B // 3]] = -1
        off = positions < 0
        x = bf16(rng.standard_normal((B, K)) * 3.0)  # [B, K]
        h = fused_input(np.where(off[:, None], 0, x), g, eps, x_op)  # [B, K] the reference input
        x[off] = np.nan
        y0 = bf16(rng.standard_normal((B, n_out)))  # [B, n_out] the residual stream ("residual")
        xd, pd = upload(x), upload(positions)
        plan = gemv_plan(B, N, K, out, kernel, splits=min(4, K // 8), x_op=x_op)
        tiles = plan.grid[0] * (plan.grid[1] if kernel in TC_KERNELS else 1)
        if plan.reduce_grid is not None:  # gemv_mma's plans keep the reduce launch for small grids: merge anyway
            assert kernel in MMA_KERNELS and tiles < MMA_MERGE_MIN and plan.mode == PARTIAL
            plan = replace(plan, mode=plan.out_mode, reduce_grid=None, counters=tiles)
        assert plan.splits > 1 and plan.counters == tiles and plan.reduce_grid is None
        two = replace(plan, mode=PARTIAL, counters=0, workspace_bytes=4 * plan.splits * B * N,
                      reduce_grid=(math.ceil(B * n_out / 256), 1, 1))
        counters = upload(np.zeros(plan.counters, np.int32))
        outs = []
        for p in (two, plan, plan):
            ws = poisoned(max(p.workspace_bytes, 4), np.uint8, stream)
            y = upload(y0) if out == "residual" else poisoned((B, n_out), np.float32 if out == "f32" else BF16,
                                                               stream)
            steps = p.launches(y, xd, wd, ws, B, N, K, gd, eps, pd, counters=counters)
            assert [s.kernel for s in steps] == ([kernel, "splitk_reduce"] if p is two else [kernel])
            for ln in steps:
                launch(mods["gemv"], ln.kernel, ln.grid, ln.block, stream, ln.shared, **ln.args)
            stream.synchronize()
            outs.append(y.to_numpy())
            assert not counters.to_numpy().any(), f"B={B} {out}: tile counters left nonzero"
        where = f"{kernel} B={B} N={N} K={K} {out} splits={plan.splits}"
        assert outs[1].tobytes() == outs[0].tobytes(), where + ": merged bytes differ from splitk_reduce's"
        assert outs[2].tobytes() == outs[1].tobytes(), where + ": a second launch differs"
        want = projected(h, w, out)
        if out == "residual":
            want = np.where(off[:, None], y0.astype(np.float64), y0.astype(np.float64) + want)
        tol = dict(rtol=1e-5, atol=1e-4) if out == "f32" and x_op == "plain" else dict(rtol=1e-2, atol=1e-2)
        np.testing.assert_allclose(outs[1].astype(np.float64), want, err_msg=where, **tol)


# ---------------------------------------------------------------- GPU: argmax, sample

@pytest.mark.gpu
@pytest.mark.parametrize("B,V", [(1, 512), (37, 32000), (256, 32000), (5, 32001)])  # 32001: scalar path
def test_argmax(mods, stream, rng, B, V):
    logits = rng.standard_normal((B, V)).astype(np.float32)  # [B, V]
    logits[0, [V // 3, V // 2, V - 1]] = 100.0  # a three-way tie: the lowest index wins
    tokens = poisoned((B,), np.int32, stream)
    launch(mods["sample"], "argmax", (B,), (1024,), stream, tokens=tokens, logits=upload(logits), V=V)
    stream.synchronize()
    got = tokens.to_numpy()
    assert got[0] == V // 3
    np.testing.assert_array_equal(got, ref.argmax(logits))


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
@pytest.mark.parametrize("B,V", [(3, 512), (37, 32000), (2, 1001)])  # 1001: scalar path
def test_sample(mods, stream, rng, B, V, temperature):
    logits = (rng.standard_normal((B, V)) * 2.0).astype(np.float32)  # [B, V]
    seed_value, step_value = 0x1234_5678_9ABC_DEF0, 41
    seed = upload(np.array([seed_value], np.uint64))
    step = upload(np.array([step_value], np.int32))
    ld = upload(logits)
    steps = []
    for s in range(2):
        tokens = poisoned((B,), np.int32, stream)
        launch(mods["sample"], "sample", (B,), (1024,), stream, tokens=tokens, logits=ld, seed=seed,
               step=step, temperature=temperature, V=V)
        launch(mods["sample"], "advance_step", (1,), (1,), stream, step=step)
        stream.synchronize()
        got = tokens.to_numpy()
        np.testing.assert_array_equal(got, sample_reference(logits, seed_value, step_value + s, temperature))
        steps.append(got)
    assert int(step.to_numpy()[0]) == step_value + 2
    if temperature > 1.0:
        assert (steps[0] != steps[1]).any()  # a new step draws new noise
    if temperature == 0.0:
        np.testing.assert_array_equal(steps[0], ref.argmax(logits))
