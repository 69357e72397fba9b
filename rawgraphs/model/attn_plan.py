"""Launch shapes and workspace sizes of the attention-side decode kernels, as one pure function.

The decode step launches, per layer, one attention kernel that also applies RoPE to q and k and appends the
new K/V to the paged cache (``kernels/attention.cu``)::

    plan = attention_plan(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, batch, cfg.max_seq_len)
    attention<hd, G, pre>(out, part_o, part_ml, counters, qkv, k_cache, v_cache, block_tables, positions,
                          max_blocks, n_heads, n_kv_heads, plan.partition, plan.min_partition,
                          plan.max_splits, plan.prefetch, plan.scale, rope_cos, rope_sin)
                                               # plan.attention, name plan.kernel, arguments plan.args(...)

``attention`` is a template kernel: load its instantiations by name expression, e.g.
``Module.from_file("attention", name_expressions=KERNELS).kernel(plan.kernel)``.

``rope_cos`` / ``rope_sin`` are fp32 ``[max_blocks * 16, hd/2]`` tables (``reference.rope_tables``).

With ``counters`` (int32, ``plan.counters_shape``, zeroed once) the last block of each (row, head group)
merges the splits itself (fused combine: one launch). With ``counters`` null and ``plan.combine``, a second
launch merges them::

        attention_combine(out, part_o, part_ml, positions, max_blocks, n_heads, head_dim,
                          plan.partition, plan.min_partition, plan.max_splits)
                                                           # plan.combine_shape, plan.combine_args(...)

``part_o`` / ``part_ml`` are fp32 workspaces of ``plan.part_o_shape`` / ``plan.part_ml_shape``; size them
with :func:`workspace_elements` over every batch size that will be launched (a smaller batch may use more
splits, and so more workspace, than the largest). They need no zeroing (only the splits that hold tokens are
written and read) and may be shared by every layer, as may ``counters`` (every launch leaves it zero; size
it ``max_batch * n_heads``, which covers every plan). The grid is fixed for ``max_seq_len``: blocks past a row's
context exit at once, so one captured graph serves every length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..kernel import LaunchShape
from .blocks import BLOCK_SIZE

__all__ = ["BLOCK_SIZE", "HEAD_DIMS", "KERNELS", "AttentionPlan", "attention_kernel", "attention_plan",
           "attention_plan_for", "workspace_elements"]

HEAD_DIMS = (16, 64, 128)  # head dims attention<hd, G, pre> is instantiated for
_HEADS_PER_BLOCK = (4, 2, 1)  # its G (register-resident accumulators), largest first
_COMBINE_THREADS = 256  # attention_combine's block (ATTN_COMBINE_THREADS)
_PARTITIONS = (512, 256, 128, 64)  # tokens per split, largest first (a multiple of 4 warps * 16 tokens)
_SHORT_CONTEXT = 512  # the context a decode step must also fill the GPU at (see attention_plan)
# K/V pages per warp prefetched into L2 before the PDL wait, by batch: only a single row gains (H200, fused
# attention, isolated, 0 / 2 pages: B=1 ctx 513 9.86 / 9.42 us; B=8 ctx 513 15.9 / 18.4, ctx 4096 78.5 / 88.7;
# B=37 ctx 513 45.0 / 48.2; B=64 ctx 4096 503 / 515 us; benchmarks/NOTES.md, session 4). At B = 2 too (H100, graph
# step, session 39), context 512 / 2048: small 257.2 -> 256.6 / 310.7 -> 307.3 us, 1b 839.9 -> 839.9 / 993.4 -> 1000.3.
_PREFETCH_B1 = 2
# The largest batch whose plan takes attention<hd, G, true> (the first K/V page in registers before the PDL wait).
# H200, graph step at context 512, A/B, two rounds each, us (benchmarks/NOTES.md, sessions 16-17), 1b / small:
# B = 1 616 -> 599 / 202 -> 196; 2 1067 -> 1049 / 287 -> 276; 4 1175 -> 1146 / 318 -> 308; 8 1225 -> 1238 (the
# one loss below 64) / 334 -> 326; 16 1648 -> 1636 / 454 -> 436; 24 2173 -> 2136 / 999 -> 962; 32 2411 -> 2410 /
# 1090 -> 1066 (one round). Past it both lose: 64 3485 -> 3562 / 1558 -> 1553; 128 5949 -> 6092 / 1989 -> 2088;
# 256 10703 -> 10855 / 3171 -> 3251. At 16 instead of 32 (H100, session 39), 1b / small: B = 24 1811 -> 1931 / 587
# -> 608, B = 32 2004 -> 2084 / 639 -> 652.
_PRE_MAX_BATCH = 32
_SHORT_SPLITS = 16  # at most this many splits hold a short-context plan's row (ATTN_SHORT_SPLITS in attention.cu)
# Batches up to this take the short-context plan (splits that follow the context) even where fixed 128-token splits
# would fill the SMs at context 512. H100, graph step, A/B, three rounds (two at 2048), us, main -> short, small /
# 1b: context 512 B = 3 313.2 -> 302.0 / 1092.3 -> 1086.9, B = 8 345.8 -> 347.0 / 1369.4 -> 1338.1; context 2048
# B = 8 514.8 -> 507.4 / 1871.8 -> 1830.8 (session 38). Session 39 (two rounds, main -> fixed splits): context 512
# B = 4 311.7 -> 323.8 / 1240.2 -> 1238.8, B = 6 324.1 -> 340.7 / 1299.5 -> 1290.7; context 4080 (16 x 256 splits
# against 32 x 128) B = 4 542.0 -> 529.3 / 1835.0 -> 1876.8, B = 8 731.4 -> 740.8 / 2546.8 -> 2577.2. Up to 16
# instead, at context 512: B = 12 425.6 -> 435.7 / 1572.2 -> 1593.5, B = 16 462.9 -> 476.3 / 1732.9 -> 1732.3.
_SHORT_MAX_BATCH = 8


def attention_kernel(head_dim: int, heads_per_block: int, pre: bool) -> str:
    """The NVRTC name expression of one instantiation of attention.cu's ``attention`` template."""
    return f"attention<{head_dim},{heads_per_block},{'true' if pre else 'false'}>"


# Every instantiation a plan may name: compile attention.cu with these as name expressions.
KERNELS = tuple(attention_kernel(hd, g, pre) for hd in HEAD_DIMS for g in _HEADS_PER_BLOCK for pre in (False, True))


@dataclass(frozen=True)
class AttentionPlan:
    """How to launch attention<hd, G, pre> (RoPE and KV append fused) and attention_combine for one batch size.

    Attributes
    ----------
    kernel : the attention instantiation's name expression, ``"attention<hd,G,false>"``, or up to B = 32
        ``"attention<hd,G,true>"``, which loads each warp's first K/V page into registers before the PDL wait
        (more registers per thread; H200, context 512: 1b B = 1 step -17 us, small -6 us; see
        ``_PRE_MAX_BATCH``).
    heads_per_block : G, query heads served by one block (all of one KV head's group, or an equal share of it;
        4, 2 or 1).
    partition : tokens per split; max_splits = ceil(max_seq_len / partition).
    min_partition : the fewest tokens per split a short context gets (the kernel picks a row's split length at
        run time from its context: up to 16 splits of min_partition..partition tokens); == partition, except
        where the plan's splits would leave most SMs idle at a short context (B = 1 or 2 on 16 heads).
    prefetch : K/V pages per warp the kernel moves into L2 before its PDL wait (2 at B = 1, else 0).
    combine : whether attention_combine must run (max_splits > 1); otherwise attention writes ``out`` itself.
    part_o_shape, part_ml_shape : fp32 workspaces ``[B, H, max_splits, hd]`` and ``[B, H, max_splits, 2]``.
    counters_shape : int32 ``[B, H / G]`` arrival counters of the fused combine.
    workspace_bytes : both workspaces together (0 when no combine is needed).
    """

    kernel: str
    attention: LaunchShape
    combine_shape: LaunchShape | None
    heads_per_block: int
    partition: int
    min_partition: int
    max_splits: int
    prefetch: int
    scale: float
    part_o_shape: tuple[int, int, int, int]
    part_ml_shape: tuple[int, int, int, int]
    counters_shape: tuple[int, int]

    @property
    def combine(self) -> bool:
        return self.max_splits > 1

    def args(self, *, out, part_o, part_ml, qkv, k_cache, v_cache, block_tables, positions, max_blocks: int,
             n_kv_heads: int, rope_cos, rope_sin, counters=0) -> dict:
        """attention<hd, G, pre>'s arguments, every one filled in (pointers as buffers or ints).

        ``counters`` (int32 ``counters_shape``, zeroed once) fuses the combine; 0 leaves it to
        attention_combine (:meth:`combine_args`), which must then follow when :attr:`combine`.
        """
        return dict(out=out, part_o=part_o, part_ml=part_ml, counters=counters, qkv=qkv, k_cache=k_cache,
                    v_cache=v_cache, block_tables=block_tables, positions=positions, max_blocks=max_blocks,
                    n_heads=self.part_o_shape[1], n_kv_heads=n_kv_heads, partition=self.partition,
                    min_partition=self.min_partition, max_splits=self.max_splits, prefetch=self.prefetch,
                    scale=self.scale, rope_cos=rope_cos, rope_sin=rope_sin)

    def combine_args(self, *, out, part_o, part_ml, positions, max_blocks: int) -> dict:
        """attention_combine's arguments (launch shape :attr:`combine_shape`), for the same buffers."""
        return dict(out=out, part_o=part_o, part_ml=part_ml, positions=positions, max_blocks=max_blocks,
                    n_heads=self.part_o_shape[1], head_dim=self.part_o_shape[3], partition=self.partition,
                    min_partition=self.min_partition, max_splits=self.max_splits)

    @property
    def workspace_bytes(self) -> int:
        if not self.combine:
            return 0
        return 4 * (math.prod(self.part_o_shape) + math.prod(self.part_ml_shape))


def attention_plan(n_heads: int, n_kv_heads: int, head_dim: int, batch: int, max_seq_len: int, *,
                   num_sms: int = 132, partition: int | None = None,
                   heads_per_block: int | None = None) -> AttentionPlan:
    """Plan the attention kernels for ``batch`` rows and contexts up to ``max_seq_len`` tokens.

    The partition (tokens per split) is the largest of 512/256/128/64 that still gives at least two blocks per
    SM (``num_sms``: 132 on the H200) both at the maximum context and, down to 128 tokens per split, at a
    context of 512, so short batches spread over the GPU; a ``max_seq_len`` that fits one partition runs as a
    single pass with no combine. One block reads its split serially (~25 GB/s, ~2.6 us per 64 KB of K + V at
    hd 128; benchmarks/attention_bandwidth.py), so at context 512 a B = 8 plan sized for 4096 alone (512 tokens
    per split, one busy block per row and head) took 18.9 us per layer; 128-token splits spread the same bytes
    over 4x the blocks (1b B=8 step 1.84 -> 1.78 ms, small B=8 0.46 -> 0.41 ms). ``partition`` forces a value
    (a multiple of 64 up to 2048; then min_partition = partition), e.g. to test the split path with short
    contexts. Where the partition gives fewer blocks than SMs at context 512, and for any batch up to
    ``_SHORT_MAX_BATCH``, a row's split length follows its context at run time down to 64 tokens
    (``min_partition``): B = 1, 16 heads, context 513 took 8.1 us with 64-token splits and 9.8 us with 128, but
    20.7 vs 16.8 us at 4096 (H200, session 2). ``heads_per_block`` forces G (4, 2 or 1, dividing H/KVH; default:
    the largest that divides), e.g. to compare variants.
    """
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} has no attention kernel (one of {HEAD_DIMS})")
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"n_heads {n_heads} must be a multiple of n_kv_heads {n_kv_heads}")
    if batch < 1 or max_seq_len < 1:
        raise ValueError(f"batch ({batch}) and max_seq_len ({max_seq_len}) must be >= 1")
    group = n_heads // n_kv_heads
    g = next(d for d in _HEADS_PER_BLOCK if group % d == 0) if heads_per_block is None else heads_per_block
    if g not in _HEADS_PER_BLOCK or group % g:
        raise ValueError(f"heads_per_block {g} must be one of {_HEADS_PER_BLOCK} and divide H/KVH = {group}")
    y = n_heads // g
    min_partition = partition
    if partition is None:
        def filling(ctx: int, floor: int) -> int:  # largest partition >= floor with 2 blocks per SM at ctx
            fits = [p for p in _PARTITIONS if p >= floor]
            return next((p for p in fits if batch * y * math.ceil(ctx / p) >= 2 * num_sms), fits[-1])
        partition = min(filling(max_seq_len, _PARTITIONS[-1]), filling(min(max_seq_len, _SHORT_CONTEXT), 128))
        fills = batch * y * math.ceil(min(max_seq_len, _SHORT_CONTEXT) / partition) >= num_sms  # at context 512
        short = batch <= _SHORT_MAX_BATCH or not fills
        min_partition = _PARTITIONS[-1] if short else partition
        if short and batch * y * _SHORT_SPLITS >= num_sms:
            # No more splits than a row can use (the kernel's ATTN_SHORT_SPLITS) where that still covers the SMs
            # at the maximum context: fewer blocks past a short context to place and retire. H200 (session 13): 1b
            # B = 1 step 700.2 -> 695.2 us; isolated B = 1 attention at context 4096 19.4 -> 17.9 us, 512 9.4 -> 9.1.
            partition = max(partition, math.ceil(max_seq_len / _SHORT_SPLITS / 64) * 64)
    if not 64 <= partition <= 2048 or partition % 64:
        raise ValueError(f"partition {partition} must be a multiple of 64 in [64, 2048]")
    splits = math.ceil(max_seq_len / partition)
    return AttentionPlan(
        kernel=attention_kernel(head_dim, g, batch <= _PRE_MAX_BATCH),
        attention=LaunchShape(grid=(batch, y, splits), block=(128,)),
        combine_shape=LaunchShape(grid=(batch, n_heads), block=(_COMBINE_THREADS,),
                                  shared=4 * (2 * splits + _COMBINE_THREADS)) if splits > 1 else None,
        heads_per_block=g,
        partition=partition,
        min_partition=min_partition,
        max_splits=splits,
        prefetch=_PREFETCH_B1 if batch == 1 else 0,
        scale=1.0 / math.sqrt(head_dim),
        part_o_shape=(batch, n_heads, splits, head_dim),
        part_ml_shape=(batch, n_heads, splits, 2),
        counters_shape=(batch, y),
    )


def attention_plan_for(cfg, batch: int, max_seq_len: int | None = None, **kw) -> AttentionPlan:
    """:func:`attention_plan` from a :class:`~rawgraphs.model.config.ModelConfig` (``max_seq_len`` defaults to
    the config's)."""
    return attention_plan(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, batch,
                          cfg.max_seq_len if max_seq_len is None else max_seq_len, **kw)


def workspace_elements(plans) -> tuple[int, int]:
    """fp32 elements ``(part_o, part_ml)`` that serve every plan in ``plans`` (0 where none combines)."""
    combining = [p for p in plans if p.combine]
    return (max((math.prod(p.part_o_shape) for p in combining), default=0),
            max((math.prod(p.part_ml_shape) for p in combining), default=0))
