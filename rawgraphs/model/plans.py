"""Launch plans for the projection kernels of ``kernels/gemv.cu`` (pure functions: no GPU, no driver).

``gemv_plan(B, N, K, out)`` picks the kernel, grid, block and split-K factor for
``y[B, N] = x[B, K] @ W[N, K]^T`` on an H200-class GPU (132 SMs):

- ``B == 1``: ``gemv``, one wave of 8-warp blocks, at most 3 per SM (``SMS * 24`` warps; its 64 registers would
  fit 4, and unused shared memory keeps a fourth off); one warp owns each whole weight row (the unit stream; where
  gate/up pairs are few, two warps share a pair in the general body) and streams it through a per-warp cp.async
  ring (8 x 512 bytes in flight, the first ring issued before the PDL wait). Forced onto larger B, groups of up to
  8 warps share a short N's rows (``parts``). Where the plan is the unit stream (every B = 1 projection of the
  decode step), ``gemv_unit`` runs it: the same plan and bytes, in a kernel that holds only that path (3064 SASS
  instructions and 48 registers against gemv's 7024 and 64 with NVRTC 13.0, as ``gemv_rows2/3`` hold only B = 2 /
  3's).
- ``B = 2``, and ``B = 3`` for ``K >= 2048``, where the ``B = 1`` plan is gemv's unit stream (one warp per row, one
  K range) and the B x rows fit beside the rings (``rows_fit``): ``gemv_rows2`` / ``gemv_rows3``, the same grid
  streaming each weight chunk once for all B rows (``dot8_rows``). H200, decode step at context 512, against
  ``gemv_mma``: 1b B = 2 / 3 1057 / 1118 -> 777 / 1050 us (qkv, o, gate_up and the LM head each cheaper at B = 3);
  small B = 2 276.5 -> 274.7 (and 294.3 -> 255.4 on the H100 once its o and down took the unit stream at B = 1,
  session 38), but B = 3 300 -> 331 (each of its K = 768 projections dearer: 3 chunks a row leave the extra rows'
  arithmetic and reductions exposed); B = 4 lost on both (1b 1145 -> 1200, small 307 -> 372).
- otherwise ``2 <= B <= 16`` (``B <= 3`` for weights of ``TC_LARGE_WEIGHT`` elements or more, ``B = 2`` for those
  of ``K >= ROWS3_MIN_K`` that ``gemv_rows3`` cannot hold, like 1b's down projection): ``gemv_mma``, 16
  weight rows per 256-thread block streamed straight into tensor-core fragments (4 x 2 16-byte loads in flight per
  lane, 3 blocks per SM, or 2 where ``two_per_sm`` says); each weight row is read once per launch.
- ``B > 16``, and ``B >= 4`` for those large weights (``B = 3`` too for those of ``K >= ROWS3_MIN_K`` that
  ``gemv_rows3`` does not take) (``tc_fits``): ``gemm_tc``, 64 x 64 output tiles on tensor
  cores (mma.sync bf16, fp32 accumulate; the kernel takes 32-row tiles itself at B <= 32, on the same grid), K tiles
  of x and W streamed through a ``TC_STAGES``-deep cp.async pipeline in ``TC_SHARED`` bytes of shared memory (4
  blocks of 8 warps per SM), or 2 blocks per SM where ``two_per_sm`` says. At ``B <= TC_NARROW_MAX_B`` the plans
  take ``gemm_tc_narrow`` instead: 32-row tiles, a split merge that stages only the batch rows, and the x tiles
  issued before the fused RMSNorm's row sums.

These choices follow measurements on the H200 (benchmarks/gemv_bandwidth.py --alternatives, benchmarks/NOTES.md):
at B = 1 the one-wave ``gemv`` took the 1b decode step from 0.97 to 0.83 ms (graph, context 512) where the
previous 4-rows-per-block GEMV and the same kernel with half the grid (16 warps per SM, uncapped, 1.18 ms) lost
(session 11: 3 blocks per SM, capped, beat 4: 1b 0.716 -> 0.700 ms); at B = 8
``gemv_mma`` takes 40-50% less time than B passes of a CUDA-core GEMV; at B = 64 and 256 ``gemm_tc`` wins.

When the grid would leave SMs idle (``gemm_tc``: fewer than ``tc_target_blocks(B)`` blocks; ``gemv_mma``: fewer than
``MMA_SPLIT_TARGET``, and at B <= ``MMA_UNSPLIT_MAX_B`` at least ``MMA_MERGE_MIN`` row blocks) the K range is split;
``gemv`` splits only where its x row would not fit in shared memory (K > 7424). The main kernel then writes fp32
partials to a **workspace** (``plan.workspace_bytes``), which are added in a fixed order (bit-identical run to run)
before the output is applied: ``gemv`` writes ``[splits, B, N]`` and a ``splitk_reduce`` launch follows (as for
``gemv_mma`` grids of fewer than ``MMA_MERGE_MIN`` row blocks); in other ``gemv_mma`` grids (the same layout) and
``gemm_tc`` (one 64 x 64 slab per tile and split) the last of a tile's blocks to finish (an atomic count in
``counters``: ``plan.counters`` int32 zeros that the kernel leaves zero) sums them itself, saving the launch. The decode
step allocates one workspace of ``max_workspace_bytes(...)`` and one counter array of ``max_counters(...)`` over every
projection and batch size it launches, and shares them between projections (they run one after the other on one stream).

Output modes (``out``): ``"bf16"`` y bf16; ``"residual"`` y bf16 updated in place, ``y += x @ W^T``; ``"f32"``
y fp32 (logits); ``"silu"`` the SwiGLU of a fused gate/up weight ``[2F, K]`` (gate rows, then up): y bf16
``[B, F]`` = ``bf16(silu(gate) * up)`` of the bf16-rounded projections, kernels/silu_mul.cu's math applied once
per element in the projection's epilogue (the down projection then reads plain x instead of redoing silu in
every block: at B = 8 that redundant silu made 1b's down cost 34.7 us for 5.4 us of bytes, H200, session 6).

Input ops (``x_op``) fuse the kernel before the projection into its x loads, saving a launch and a round trip:
``"plain"`` x[B, K] as stored; ``"rmsnorm"`` ``bf16(rmsnorm(x[B, K]) * norm)`` (``launches(norm=, eps=)``; each
block computes its rows' inverse RMS over all of K; ``gemm_tc`` of more than 16 rows instead gets one ``rms_input``
launch before it that normalises the rows once), rounded to bf16 exactly where kernels/rmsnorm.cu stores.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import NamedTuple

__all__ = ["CAP_MIN_B", "MMA_MERGE_MIN", "MMA_SPLIT_TARGET", "MMA_UNSPLIT_MAX_B", "OUT_MODES", "PARTIAL",
           "RMS_INPUT_MIN_B", "TC_KERNELS", "TC_NARROW_MAX_B", "TC_SHARED", "TC_TWO_PER_SM_SHARED",
           "TWO_PER_SM_SHARED", "X_OPS", "SMS", "ROWS_KERNELS", "UNIT_KERNEL", "MMA_KERNELS", "mma_kernel", "GemvPlan",
           "Launch", "gemv_plan", "max_counters", "max_workspace_bytes", "rows_fit", "tc_fits", "tc_target_blocks",
           "two_per_sm"]

OUT_MODES = {"bf16": 0, "residual": 1, "f32": 2, "silu": 4}  # the `mode` argument of kernels/gemv.cu
PARTIAL = 3  # mode: write fp32 partials of one K split
X_OPS = {"plain": 0, "rmsnorm": 1}  # the `x_op` argument of kernels/gemv.cu
SMS = 132  # streaming multiprocessors of the H200
TC_TILE = 64  # gemm_tc output tile edge (TC_M == TC_N in gemv.cu)
TC_THREADS = 256  # gemm_tc's block (8 warps; TC_THREADS in gemv.cu)
MMA_ROWS = 16  # weight rows per gemv_mma block
MMA_KERNELS = ("gemv_mma", "gemv_mma16", "gemv_mma32")  # batch rows per pass 8 / 16 / 32; each runs any B


def mma_kernel(B: int) -> str:
    """The narrowest ``gemv_mma`` kernel whose pass holds all ``B`` rows (the widest for more than 32)."""
    return MMA_KERNELS[0 if B <= 8 else 1 if B <= 16 else 2]


# gemv_mma splits K for grids below MMA_SPLIT_TARGET blocks, into chunks of at least MMA_MIN_CHUNK elements. With a
# splitk_reduce launch after the split, 128 blocks (1b's o and down) unsplit beat 2 or 3 splits, and the target was
# SMS // 2; merged in the kernel, 2 x SMS took 1b B = 4 / 8 / 16 from 1128 / 1251 / 1614 to 1059 / 1189 / 1508 us
# (graph, context 512, H200, session 20). Chunks of 256 (small's K = 768 split too) lost: small B = 8 321 -> 406 us.
# Grids of fewer than MMA_MERGE_MIN row blocks keep the splitk_reduce launch: merged, small's down (48 blocks x 2
# splits) took small B = 4 / 8 / 16 from 300 / 320 / 427 to 309 / 332 / 438 us (same session). Up to B =
# MMA_UNSPLIT_MAX_B they are not split at all, so no reduce launch follows: small B = 4 / 8 324.1 / 348.8 -> 320.0 /
# 346.7 us and 325.5 -> 323.0 at B = 4 again; at B = 12 / 16 unsplit lost, 424.9 / 461.4 -> 438.6 / 475.8 us (H100,
# session 38; medians of three rounds). The target, re-measured on 1b B = 4 / 6 / 8 (H100, session 39, two calls
# of two rounds, main 1221-33 / 1283-95 / 1326-36 us): 3 x SMS (qkv 2 splits, down 4) +9.6 / +9.9 / +8.7%; 4 x SMS
# with chunks of 512 (qkv 2, o 4, down 5) +9.4% at each; SMS (down 2) +4.2 / +3.8 / +0.7%; 128 (o and down
# unsplit) +5.3 / +5.0 / +4.6%.
MMA_SPLIT_TARGET, MMA_MIN_CHUNK, MMA_MERGE_MIN, MMA_UNSPLIT_MAX_B = 2 * SMS, 1024, SMS // 2, 8
# gemv_mma runs B = 2-16 (but gemv_rows2/3's B = 2-3), except that above TC_LARGE_MIN_B rows a weight of at least
# TC_LARGE_WEIGHT elements (8 MB of bf16) takes gemm_tc: 1b's five projections and either model's LM head. H100,
# graph step at context 512, A/B, two rounds each, us (session 39), main -> gemm_tc at B = 9-16 for: every
# projection, small / 1b, B = 12 429.2 -> 486.5 / 1574.8 -> 1487.8, B = 16 463.8 -> 506.2 / 1728.0 -> 1588.6; only
# K >= 2048, 1b B = 12 / 16 1569.3 -> 1480.3 / 1723.0 -> 1591.1 (small's down alone +1.9 / +0.6%); only the LM head,
# small 424.2 -> 417.4 / 460.8 -> 452.7 (N >= 4096, small's gate_up with it, +6.3 / +3.4%). From B = 5 K >= 2048
# lost: 1b B = 6 / 8 +1.4 / +4.2%, small +10.6 / +5.1%; only 1b's o and down from B = 5, +4.3 / +5.8%. Within the
# new range main's gemm_tc cap (two_per_sm) and split target (tc_target_blocks) held: 1b B = 12 / 16 uncapped +0.6 /
# +1.1%, 2 x SMS +2.0 / +4.7%. With gemm_tc normalising its own rows up to B = 16 (RMS_INPUT_MIN_B), from B = 5
# won (session 40, three rounds, main -> from B = 5 / and uncapped below 9, CAP_MIN_B): 1b B = 5 / 6 / 7 / 8
# 1259.3 / 1287.5 / 1330.3 / 1330.3 -> 1198.9 / 1225.5 / 1264.5 / 1330.5 and 1198.1 / 1225.8 / 1264.1 / 1304.0 (-4.9
# / -4.8 / -5.0 / -2.0%), small (its LM head) -0.2 to -0.7%. From B = 4 too (the next call, three rounds): 1b B = 4
# 1233.9 -> 1173.4 (-4.8%), small 311.0 -> 309.2 (-0.6%); B = 8-16 within 0.1%. With gemm_tc_narrow (session 42,
# H100, one round): from B = 3 where gemv_rows3 does not take the weight (1b's down, small's LM head) 1b B = 3 -3.3%,
# small +0.7% (its LM head, K = 768); in place of gemv_rows3 too, 1b -2.1%. So at B = 3 only for K >= ROWS3_MIN_K:
# 1b's down, 1b B = 3 1115.9 -> 1084.2 us (-2.8%) in the next call, small and B = 2 within 0.1%.
MMA_MAX_B, TC_LARGE_MIN_B, TC_LARGE_WEIGHT = 16, 3, 2048 * 2048
# An rmsnorm-fused gemm_tc of at least RMS_INPUT_MIN_B rows gets an rms_input launch that normalises its rows
# once (``launches(normed=)``); up to B = 16 every block normalises its own rows instead, one launch fewer per fused
# projection (1b at B = 9-16: 83 launches a step instead of 116). H100, graph step at context 512, A/B, two rounds,
# us (session 40), main -> fused up to 16 / 32: 1b B = 12 1489.3 -> 1471.7 / 1471.3, B = 16 1596.8 -> 1549.4 /
# 1549.2, B = 24 1819.2 -> 1818.6 / 1857.2, B = 32 2008.4 -> 2009.7 / 2023.2; small within 0.5% up to 16, B = 24 /
# 32 +2.6 / +4.8% fused up to 32. Session 19 (H200) chose rms_input for B > 16 (-7 to -30% there).
RMS_INPUT_MIN_B = 17
# gemv_mma*: unused dynamic shared memory that caps it at 2 blocks per SM (4.6-16.6 KiB of static arrays + 80 KiB, a
# third block would need 3 x 85.6 KiB or more of the SM's 228, counting the 1 KiB per block the driver reserves; two
# of gemv_mma32's fit in 2 x 97.6). A GPU test reads the occupancy back
# (tests/test_kernels_proj.py::test_plans_blocks_per_sm), a CPU test checks it against ptxas -v.
TWO_PER_SM_SHARED = 80 * 1024
# gemm_tc: its pipeline's dynamic shared memory (TC_STAGES x (x tile + W tile), rows padded to 72 elements; 4
# blocks of 8 warps per SM, as its 64 registers also allow), and the larger request that caps it at 2 (3 x 81 KiB >
# 228 KiB).
TC_STAGES = 3
TC_SHARED = TC_STAGES * 2 * TC_TILE * (TC_TILE + 8) * 2
TC_TWO_PER_SM_SHARED = 80 * 1024
CAP_MIN_B = 9  # gemv_mma and gemm_tc take the 2-per-SM cap from this batch (two_per_sm)
# gemm_tc_narrow (gemv.cu): gemm_tc with 32-row tiles, a split merge that stages only the batch rows in shared
# memory, and its x tiles issued before X_RMSNORM's row sums; the plans take it for gemm_tc's projections of at
# most TC_NARROW_MAX_B rows. H100, graph step at context 512, A/B, three rounds (session 41): 1b B = 4 / 8 / 12 / 16
# -4.4 / -4.0 / -2.2 / -1.2%, small within +-0.3%. Up to B = 32 it lost (small B = 17-32 +1.4 to +5.2%, 1b B = 24 /
# 32 +1.1 / +3.5%); the figures and the branches tried are in gemv.cu's comment on the kernel.
TC_NARROW_MAX_B = 16
TC_ROWS = {"gemm_tc": TC_TILE, "gemm_tc_narrow": 32}  # the tensor-core kernels' row tiles (gemm_tc: 64 in its grid)
TC_KERNELS = tuple(TC_ROWS)
REDUCE_THREADS = 256
GEMV_WARPS_PER_SM = 24  # gemv: warps per SM in its one wave (3 blocks x 8 warps; see GEMV_THREE_PER_SM_SHARED)
# gemv: dynamic shared bytes at least, so an SM holds 3 of its blocks, not the 4 its registers allow (4 x 59 KiB
# with the static part and the driver's 1 KiB per block > 228 KiB). The room left lets the next kernel's blocks
# start under PDL; without the cap the block scheduler stacks 4 on some SMs, which finish last. Decode step, graph,
# B = 1 (H200, session 11): 1b 716 -> 700 us, small 230 -> 224; 24 warps per SM without the cap 819 / 235 us.
GEMV_THREE_PER_SM_SHARED = 58 * 1024
GEMV_BLOCK_WARPS = 8  # gemv: warps per block
GEMV_CHUNK = 256  # gemv: K elements per streamed chunk (PIPE_CHUNK in gemv.cu)
# gemv: slots of one warp's cp.async ring (PIPE_STAGES in gemv.cu), PIPE_STAGES - 1 chunks of 512 bytes in flight,
# all issued before the PDL wait. Deeper rings (same 58 KiB per block) lost: 1b B = 1 step 8 / 9 / 10 slots 676.8 /
# 680.5 / 683.1 us (H200, session 13, one call); 12 / 14 slots 685.5 / 700.6 against 681.5 at 10 (another call).
GEMV_STAGES = 8
GEMV_RING = GEMV_STAGES * 512  # gemv: bytes of one warp's cp.async ring (PIPE_STAGES x PIPE_CHUNK bf16)
GEMV_RED = 64  # gemv: bytes of one warp's unit partials (RED_UNITS = 8 units x 2 rows, fp32)
# gemv: rings + x row at most, in dynamic shared bytes; sets the K split (x fits unsplit up to K = 7424). Once under
# the 48 KiB that needs no opt-in; every launch now asks for GEMV_THREE_PER_SM_SHARED (opted in by Kernel.prepare).
GEMV_SHARED = 47 * 1024
ROWS_MAX = 3  # the most batch rows a unit stream carries (GEMV_ROWS_MAX in gemv.cu)
ROWS_KERNELS = {R: f"gemv_rows{R}" for R in range(2, ROWS_MAX + 1)}  # the unit stream of R rows: one kernel per R
UNIT_KERNEL = "gemv_unit"  # B = 1's unit stream alone (one warp per row, one K range): every B = 1 decode projection
GEMV_GRID_KERNELS = ("gemv", UNIT_KERNEL, *ROWS_KERNELS.values())  # gemv's grid, block, shared memory and arguments
ROWS3_MIN_K = 2048  # gemv_rows3 runs only from this K up (8 chunks a row; see the module docstring)


class Launch(NamedTuple):
    """One launch of a plan: kernel name in ``gemv.cu``, grid, block, dynamic shared bytes, arguments."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    args: dict


@dataclass(frozen=True)
class GemvPlan:
    """How to launch one projection. ``kernel, grid, block, shared, splits`` describe the main launch; with
    ``splits > 1`` it writes partials: ``gemv`` (and ``gemv_mma`` on fewer than ``MMA_MERGE_MIN`` row blocks) with
    ``mode == PARTIAL``, and ``splitk_reduce`` follows; ``gemm_tc`` and other ``gemv_mma`` grids with the output's
    mode, merging them in the kernel (``counters`` > 0)."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    splits: int
    k_chunk: int  # K elements per split (multiple of 64)
    mode: int  # the main kernel's mode argument
    out_mode: int  # the requested output mode (OUT_MODES value)
    x_op: int  # the input op (X_OPS value)
    workspace_bytes: int  # fp32 partials ([splits, B, N]; gemm_tc [tiles, splits, 64, 64]); 0 when splits == 1
    reduce_grid: tuple[int, int, int] | None  # splitk_reduce's grid, None when no reduce launch follows
    parts: int = 1  # gemv: warps per weight row (its `parts` argument)
    counters: int = 0  # a split merged in the kernel: int32 tile counters it needs (zeros; it leaves them zero)

    def launches(self, y, x, w, workspace, B: int, N: int, K: int, norm=None, eps: float = 0.0,
                 positions=None, normed=None, counters=None) -> list[Launch]:
        """The launches, in order, with every argument of each kernel filled in.

        ``y``, ``x``, ``w``, ``workspace``, ``norm``, ``positions``, ``normed`` are whatever the launcher accepts as
        pointers (buffers or ints); ``workspace`` may be None when ``splits == 1``; ``norm [K]`` and ``eps`` serve
        ``x_op == "rmsnorm"``. ``positions`` (int32 ``[B]``, None: every row active) marks inactive rows (``< 0``):
        they read no input and come out as zeros (``"residual"``: y unchanged). ``normed`` (bf16 ``[B, K]``) lets an
        rmsnorm-fused ``gemm_tc`` of ``B >= RMS_INPUT_MIN_B`` rows multiply rows an ``rms_input`` launch before it
        normalised once (the same bits) instead of normalising them in every block. ``counters`` (int32
        ``[plan.counters]``, zeros) serves a plan that merges its splits in the kernel (``plan.counters > 0``).
        """
        if self.x_op == X_OPS["rmsnorm"] and norm is None:
            raise ValueError("an rmsnorm-fused projection needs the norm weight")
        if self.splits > 1 and (workspace is None or self.counters and counters is None):
            need = f" and int32 counters [{self.counters}] of zeros" if self.counters else ""
            raise ValueError(f"this plan splits K {self.splits} ways and needs a workspace of "
                             f"{self.workspace_bytes} bytes{need}")
        positions = 0 if positions is None else positions
        main = dict(x=x, w=w, norm=0 if norm is None else norm, positions=positions, B=B, N=N, K=K,
                    k_chunk=self.k_chunk, eps=eps, x_op=self.x_op)
        pre = []
        if self.kernel in GEMV_GRID_KERNELS:
            main["parts"] = self.parts
        elif self.kernel in TC_KERNELS or self.kernel in MMA_KERNELS:
            main.update(partial=workspace if self.counters else 0, counters=counters if self.counters else 0)
        if (self.kernel in TC_KERNELS and normed is not None and self.x_op == X_OPS["rmsnorm"]
                and B >= RMS_INPUT_MIN_B):
            pre = [Launch("rms_input", (math.ceil(B / 4), 1, 1), (128, 1, 1), 0,
                          dict(h=normed, x=x, norm=norm, positions=positions, B=B, K=K, eps=eps))]
            main.update(x=normed, norm=0, x_op=X_OPS["plain"])
        if self.reduce_grid is None:
            return pre + [Launch(self.kernel, self.grid, self.block, self.shared, dict(y=y, mode=self.mode, **main))]
        return pre + [Launch(self.kernel, self.grid, self.block, self.shared,
                             dict(y=workspace, mode=PARTIAL, **main)),
                      Launch("splitk_reduce", self.reduce_grid, (REDUCE_THREADS, 1, 1), 0,
                             dict(y=y, partial=workspace, positions=positions, B=B, N=N, splits=self.splits,
                                  mode=self.out_mode))]


def _splits(blocks: int, K: int, target: int, min_chunk: int, force: int | None) -> tuple[int, int]:
    """(splits, k_chunk): enough K splits to reach about ``target`` blocks, each at least ``min_chunk`` long
    (or about ``force`` splits)."""
    want = math.ceil(target / blocks) if blocks < target else 1
    splits = max(1, min(want, K // min_chunk)) if force is None else max(1, min(force, K // 8))
    k_chunk = math.ceil(math.ceil(K / splits) / 64) * 64
    return math.ceil(K / k_chunk), k_chunk


def tc_target_blocks(B: int) -> int:
    """gemm_tc's grid target (K is split until the grid reaches it): ``3 * SMS`` blocks while the batch fits one
    64-row tile, else ``2 * SMS``. A block streams one 64 x 64 weight tile ahead, so blocks in flight set the
    bandwidth; with one row tile a third block per SM took the 1b graph step at context 512 from 2.33 / 2.94 /
    4.11 ms to 2.21 / 2.73 / 3.79 ms at B = 24 / 37 / 64, while at B = 128 (two row tiles: every weight tile
    already read twice) it lost 2% (6.93 -> 7.09 ms; H200, session 4). 2 x SMS at B <= 64 again lost on the H100
    (session 39, two rounds): 1b B = 24 / 32 / 64 1811 / 2004 / 3144 -> 1897 / 2115 / 3321 us, small within 0.1%."""
    return (3 if B <= TC_TILE else 2) * SMS


def two_per_sm(B: int, blocks: int) -> bool:
    """Whether ``gemv_mma`` or a ``gemm_tc`` kernel runs capped at 2 blocks per SM (``TWO_PER_SM_SHARED``,
    ``TC_TWO_PER_SM_SHARED``) instead of the 3 or 4 its registers allow: for grids that fit one wave at 2 per SM, at
    B >= CAP_MIN_B.

    Measured in the decode step (graph, context 512, H200, the same kernel with and without the cap):
    - gemv_mma (session 11): small B = 8 / 16 356 / 501 -> 343 / 461 us (qkv, gate_up, and o and down after their
      K split); 1b B = 8 / 16 1262 / 1707 -> 1251 / 1659 us (o and down). At B = 2 / 4 the cap lost on small
      (293 / 322 -> 295 / 327 us). An 8-slab gemv_mma (123 registers, so also 2 blocks per SM) matched the cap on
      small but lost on 1b (B = 8 1321 us).
    - gemm_tc (session 12; 4 blocks per SM uncapped): 1b B = 32 / 64 2.70 / 3.63 -> 2.39 / 3.51 ms (o: 256
      blocks), small B = 32 / 64 1.12 / 1.65 -> 1.09 / 1.56 ms (every projection but the LM head).
    - Re-measured on the H100 (session 39, two rounds; main 8 -> 4 / 12): small B = 4 / 6 / 8 307.6 / 323.8 / 346.4
      -> 304.6 / 329.8 / 346.6 (from 4) and 348.1 at 8 (from 12); 1b 1245 / 1299 / 1342 -> 1230 / 1286 / 1344 (from
      4) and 1360 at 8 (from 12). From 4 wins 1b B = 4-6 by 1.0-1.2% but loses small B = 6 by 1.9%; kept at 8.
      Session 40, three rounds: small B = 4-7 -1.1 / -1.1 / +1.4 / -0.8% (B = 6 lost again), 1b B = 4 -0.9%.
      Session 42 (three rounds, after gemv_mma's early weight slabs and batched row sums): from 9, not 8, small B = 8
      335.6 -> 325.6 us (-2.9%; -4.6% in the call before, without the batched row sums), B = 6-16 otherwise within
      0.2%; never capped (gemv_mma runs up to B = 16) lost small B = 12 / 14 / 16 by 2.9 / 3.5 / 1.2%, and capping
      only grids of more than 132 blocks lost B = 8 by 1.2% (won B = 9 / 10 by 0.6%).
    - gemm_tc at B = 4-8 (1b's projections, either LM head; TC_LARGE_MIN_B) is left uncapped: 1b B = 8 1330.5 ->
      1304.0 us (its o, 256 blocks; H100, session 40). Uncapped up to 16 too was mixed: 1b B = 12 / 16 1438.2 /
      1519.3 -> 1432.1 / 1526.4 us (three rounds), small within 0.3%.
    Our reading (not measured): such a grid is one wave either way, but allowed more per SM the block scheduler
    can stack them on the SMs that free first (under PDL the previous kernel still holds the others), and those
    SMs finish last; capped, the blocks spread.
    """
    return B >= CAP_MIN_B and blocks <= 2 * SMS


def tc_fits(B: int, N: int, K: int) -> bool:
    """Whether a projection of ``B > 1`` rows runs ``gemm_tc`` rather than ``gemv_mma``: above ``MMA_MAX_B`` rows,
    or above ``TC_LARGE_MIN_B`` for a weight of at least ``TC_LARGE_WEIGHT`` elements (N * K), or at
    ``TC_LARGE_MIN_B`` rows for such a weight with ``K >= ROWS3_MIN_K`` (where ``gemv_plan`` tries ``gemv_rows3``
    first: the weights whose rows it cannot hold, 1b's down)."""
    if B > MMA_MAX_B:
        return True
    return N * K >= TC_LARGE_WEIGHT and (B > TC_LARGE_MIN_B or B == TC_LARGE_MIN_B and K >= ROWS3_MIN_K)


def rows_fit(B: int, K: int) -> bool:
    """Whether ``gemv_rows2/3``' unit stream holds ``B`` x rows of ``K`` beside its rings (``8 * GEMV_STAGES * 512 +
    2 * B * K`` bytes, what the kernel checks) within gemv's three-blocks-per-SM shared memory, so it keeps gemv's
    occupancy (its 80 registers allow 3 blocks of 8 warps per SM)."""
    return GEMV_BLOCK_WARPS * GEMV_RING + 2 * B * K <= GEMV_THREE_PER_SM_SHARED


def gemv_plan(B: int, N: int, K: int, out: str = "bf16", kernel: str | None = None,
              splits: int | None = None, x_op: str = "plain") -> GemvPlan:
    """The launch plan for ``y[B, N] (out) op(x)[B, K] @ W[N, K]^T``; ``K % 8 == 0`` (16-byte rows); ``out ==
    "silu"`` needs N even (gate rows, then up) and gives y ``[B, N / 2]``.

    ``kernel`` and ``splits`` override the choice (every kernel but ``gemv_unit`` is correct for every ``B``; tests
    and the benchmark compare them). ``gemv_unit`` runs only B = 1's unit stream: asked for elsewhere, ValueError.
    """
    if B < 1 or N < 1 or K < 8 or K % 8:
        raise ValueError(f"gemv needs B >= 1, N >= 1 and K a positive multiple of 8; got B={B}, N={N}, K={K}")
    if out not in OUT_MODES:
        raise ValueError(f"out must be one of {sorted(OUT_MODES)}, got {out!r}")
    if out == "silu" and N % 2:
        raise ValueError(f"out='silu' needs an even N (gate rows, then up rows); got N={N}")
    if x_op not in X_OPS:
        raise ValueError(f"x_op must be one of {sorted(X_OPS)}, got {x_op!r}")
    if kernel is None and splits is None and (B == 2 or B == ROWS_MAX and K >= ROWS3_MIN_K) and rows_fit(B, K):
        unit = gemv_plan(1, N, K, out, x_op=x_op)
        if unit.parts == 1 and unit.splits == 1:  # the unit stream, each weight chunk read once for the B rows
            return replace(unit, kernel=ROWS_KERNELS[B])
    if kernel == UNIT_KERNEL or (kernel is None and B == 1):
        plan = gemv_plan(B, N, K, out, "gemv", splits, x_op)
        if B == 1 and plan.parts == 1 and plan.splits == 1:  # gemv.cu's unit-stream condition
            return replace(plan, kernel=UNIT_KERNEL)
        if kernel == UNIT_KERNEL:
            raise ValueError(f"gemv_unit runs only B = 1's unit stream (one warp per row, one K range); "
                             f"B={B}, N={N}, K={K}, splits={plan.splits} needs gemv: pass kernel='gemv' or None")
        return plan
    if kernel is None:
        kernel = ("gemv" if B == 1 else mma_kernel(B) if not tc_fits(B, N, K)
                  else "gemm_tc_narrow" if B <= TC_NARROW_MAX_B else "gemm_tc")
    shared, parts = 0, 1
    if kernel in GEMV_GRID_KERNELS:  # gemv_rows2/3: gemv's plan at B; the kernel picks the unit stream or not
        # One wave of at most 3 blocks per SM: each group of `parts` warps owns ceil(N / groups) whole rows, so every
        # warp streams the same bytes; a short N splits each row's chunks over 2-8 warps instead of leaving
        # warps idle. 3 capped blocks per SM beat 4 (GEMV_THREE_PER_SM_SHARED); 2 uncapped blocks' worth of warps
        # lost 45% (1b B = 1, session 2: probably the same stacking as 3 uncapped, benchmarks/NOTES.md).
        # B = 1 keeps one warp per row, so a short N too runs the unit stream, with no partials' round: small's o
        # and down (K = 768 / 2048, 2 / 4 warps per row before) on 96 blocks took small's step 207.1 -> 201.7 us
        # at B = 1 and 294.3 -> 255.4 us at B = 2 (gemv_rows2 takes B = 1's plan); 1b unchanged (H100, session 38).
        # Short rows of long K at B = 1 are not measured either way.
        chunks = math.ceil(K / GEMV_CHUNK)
        target = SMS * GEMV_WARPS_PER_SM
        while B > 1 and parts < 8 and N * parts * 2 <= target and parts * 2 <= chunks:
            parts *= 2
        block = (32 * GEMV_BLOCK_WARPS, 1, 1)
        rings = GEMV_BLOCK_WARPS * (GEMV_RING + GEMV_RED)
        x_limit = (GEMV_SHARED - rings) // 2 // 64 * 64  # K elements of x per split
        splits, k_chunk = _splits(1, K, 1, 8, splits if splits is not None else math.ceil(K / x_limit))
        units, unit_chunks = N, chunks
        if out == "silu" and splits == 1:
            # A group owns gate/up row pairs: twice the warps per pair keeps every warp's share of the bytes
            # what it is for rows.
            units, unit_chunks, parts = N // 2, 2 * chunks, min(8, 2 * parts)
        if units * parts <= target:  # one unit per group, within one wave
            groups = units
        elif splits == 1:
            # More units than groups: a grid of exactly GEMV_WARPS_PER_SM warps per SM, the most the cap lets
            # in, so every SM gets the same share however the blocks are placed (ceil(units / rows per group)
            # blocks left some SMs 4 blocks and others 1-3 in the decode step, rawgraphs.model.trace, and those SMs
            # finished last; measured at 4 blocks per SM), and 1 or 2 warps per unit, whichever leaves the
            # busiest warp fewer chunks (ties: 1). 1b B = 1 step 0.728 -> 0.715 ms (LM head 32.9 -> 31.7 us); 4 or
            # 8 warps per unit lost (0.759 ms, LM head 43.1 us: a warp reduction and a shared-memory round per
            # chunk). H200, session 9. At B = 1 one warp per unit, so that gemv's unit stream (gemv.cu, session 15:
            # 1b 644 -> 622 us, its LM head going from 2 warps per unit to 1) serves them.
            parts = 1 if B == 1 else min((p for p in (1, 2) if p <= unit_chunks),
                                         key=lambda p: (math.ceil(units * p / target) * math.ceil(unit_chunks / p), p))
            groups = target // parts
        else:
            groups = math.ceil(units / math.ceil(units * parts / target))
        grid = (math.ceil(groups * parts / GEMV_BLOCK_WARPS), splits, 1)
        shared = max(rings + 2 * k_chunk, GEMV_THREE_PER_SM_SHARED)
    elif kernel in MMA_KERNELS:
        block, tiles = (256, 1, 1), math.ceil(N / MMA_ROWS)
        if splits is None and tiles < MMA_MERGE_MIN and B <= MMA_UNSPLIT_MAX_B:
            splits = 1
        splits, k_chunk = _splits(tiles, K, MMA_SPLIT_TARGET, MMA_MIN_CHUNK, splits)
        grid = (tiles, splits, 1)
        if two_per_sm(B, tiles * splits):
            shared = TWO_PER_SM_SHARED
    elif kernel in TC_KERNELS:
        block, tm, tn = (TC_THREADS, 1, 1), math.ceil(B / TC_ROWS[kernel]), math.ceil(N / TC_TILE)
        splits, k_chunk = _splits(tm * tn, K, tc_target_blocks(B), 256, splits)
        grid = (tm, tn, splits)
        shared = TC_TWO_PER_SM_SHARED if two_per_sm(B, tm * tn * splits) else TC_SHARED
    else:
        raise ValueError(f"unknown gemv kernel {kernel!r}; one of gemv, gemv_unit, gemv_rows2, gemv_rows3, "
                         f"{', '.join(MMA_KERNELS)}, gemm_tc, gemm_tc_narrow")
    mode = OUT_MODES[out]
    if splits == 1:
        return GemvPlan(kernel, grid, block, shared, 1, k_chunk, mode, mode, X_OPS[x_op], 0, None, parts)
    if kernel in TC_KERNELS or kernel in MMA_KERNELS and grid[0] >= MMA_MERGE_MIN:
        # each tile's last block to finish adds the splits and stores y (tc_merge_splits / mma_merge_splits)
        tiles = grid[0] * (grid[1] if kernel in TC_KERNELS else 1)
        per_split = tiles * TC_ROWS[kernel] * TC_TILE if kernel in TC_KERNELS else B * N  # fp32 partials of one split
        return GemvPlan(kernel, grid, block, shared, splits, k_chunk, mode, mode, X_OPS[x_op], 4 * splits * per_split,
                        None, parts, tiles)
    reduce_grid = (math.ceil(B * (N // 2 if out == "silu" else N) / REDUCE_THREADS), 1, 1)
    return GemvPlan(kernel, grid, block, shared, splits, k_chunk, PARTIAL, mode, X_OPS[x_op], 4 * splits * B * N,
                    reduce_grid, parts)


def _plans(batch_sizes: Iterable[int], shapes: Iterable[tuple[int, int]]) -> list[GemvPlan]:
    shapes = list(shapes)
    return [gemv_plan(B, N, K) for B in batch_sizes for N, K in shapes]


def max_workspace_bytes(batch_sizes: Iterable[int], shapes: Iterable[tuple[int, int]]) -> int:
    """The largest split-K workspace of any ``(N, K)`` in ``shapes`` at any of ``batch_sizes``."""
    return max((p.workspace_bytes for p in _plans(batch_sizes, shapes)), default=0)


def max_counters(batch_sizes: Iterable[int], shapes: Iterable[tuple[int, int]]) -> int:
    """The most split-merge counters (``plan.counters``) of any ``(N, K)`` in ``shapes`` at any of ``batch_sizes``."""
    return max((p.counters for p in _plans(batch_sizes, shapes)), default=0)
