"""The decode step on the GPU: weights and static buffers, and the step as one readable list of kernel launches.

Every buffer is allocated once for ``max_batch`` rows; a step for batch ``B`` uses the first ``B`` rows. Token
ids, positions and block tables are *data* in fixed buffers (seed, constraint 4), so the same list of launches
runs eagerly, is captured by stream capture, or is built as explicit graph nodes, and one graph per batch size
serves every context length. A row whose position is negative is inactive (padding): attention and the
projections skip it (no reads; its logits are zeros).

Tensor parallelism (``comm``, :mod:`rawgraphs.model.tensor_parallel`): the model is one rank's shard, and each
row-parallel projection (o, down) writes its fp32 partial sum instead of the fused residual add; an
:class:`AllReduce` entry of the step sums the partials over the ranks (NCCL), then a ``splitk_reduce`` of one
split adds the sum to the residual stream exactly as the fused kernel rounds, ``bf16(float(x) + sum)``. With
one rank the sum is the partial itself, so the step is bit-identical to the plain model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np

from ..compiler import kernel_dir
from ..context import Stream, device
from ..graph import Graph
from ..kernel import Kernel, LaunchShape, Module
from ..kernel_args import KernelArgs
from ..memory import DeviceBuffer, DeviceView, HostBuffer
from ..signature import Signature, launchable, parse_signatures
from .attn_plan import BLOCK_SIZE, attention_plan_for, workspace_elements
from .attn_plan import KERNELS as ATTENTION_KERNELS
from .config import ModelConfig
from .plans import OUT_MODES, gemv_plan, max_counters, max_workspace_bytes
from .reference import rope_tables
from .weights import Weights

__all__ = ["Launch", "AllReduce", "DecodeModel"]

BF16 = np.dtype(ml_dtypes.bfloat16)
# Kernel file -> the name expressions of its template instantiations (rmsnorm, silu_mul: fused in gemv; rope in
# attention).
KERNEL_FILES = {"embedding": (), "gemv": (), "attention": ATTENTION_KERNELS, "sample": ()}


@dataclass(frozen=True)
class Launch:
    """One kernel launch of the step: a readable name, the kernel, its launch shape and its argument block."""

    name: str
    kernel: Kernel
    shape: LaunchShape
    args: KernelArgs

    def enqueue(self, stream: Stream) -> None:
        """Launch it on ``stream`` (recorded as a kernel node when the stream is capturing)."""
        self.kernel.launch(self.shape, self.args, stream)


@dataclass(frozen=True)
class AllReduce:
    """One collective of the step: the in-place sum of ``buf``'s first ``count`` elements over ``comm``'s ranks.

    Enqueued on a capturing stream, NCCL's work is recorded into the graph like the kernels around it.
    """

    name: str
    comm: object  # rawgraphs.comm.Communicator (or a PlanCommunicator in a printed plan)
    buf: object  # fp32 [B, D] partial sums
    count: int

    def enqueue(self, stream: Stream) -> None:
        """Enqueue the all-reduce on ``stream``."""
        self.comm.all_reduce(self.buf, stream, self.count)

    def captured(self, stream: Stream) -> Graph:
        """The all-reduce alone, recorded by stream capture on ``stream`` (a child graph for explicit graphs)."""
        with Graph.capture(stream) as g:
            self.enqueue(stream)
        return g


Step = list[Launch | AllReduce]
_ADD_THREADS = 256  # splitk_reduce takes any block size
_SUFFIX = {"rms_input": ".rms", "splitk_reduce": ".reduce"}  # a projection's extra launches, by kernel


@dataclass(frozen=True)
class PlanCommunicator:
    """A communicator's rank and size without NCCL: enough for a printed plan (``plan_only``)."""

    rank: int
    size: int

    def all_reduce(self, buf, stream, count=None) -> None:
        raise RuntimeError("a PlanCommunicator only describes a plan; make a rawgraphs.comm.Communicator to run")


def _plan_view(shape, dtype=np.uint8) -> DeviceView:
    return DeviceView(0, shape, dtype)


@dataclass(frozen=True)
class _PlanKernel:
    """A kernel known by its signature only (no GPU): enough to build argument blocks for a printed plan."""

    name: str
    signature: Signature

    def args(self, **kwargs) -> KernelArgs:
        return KernelArgs(self.signature, **kwargs)


def _plan_kernels() -> dict[str, _PlanKernel]:
    sigs = {}
    for f, names in KERNEL_FILES.items():
        sigs.update(launchable(parse_signatures((kernel_dir() / f"{f}.cu").read_text()), names))
    return {name: _PlanKernel(name, sig) for name, sig in sigs.items()}


class _Layer:
    """One layer's weights and KV cache on the device (``new(shape, dtype)`` makes each buffer)."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, new):
        D, F, hd = cfg.dim, cfg.ffn_dim, cfg.head_dim
        self.w_qkv = new(((cfg.n_heads + 2 * cfg.n_kv_heads) * hd, D), BF16)  # [(H + 2 KVH) hd, D]
        self.w_o = new((D, cfg.n_heads * hd), BF16)                           # [D, H hd]
        self.w_gate_up, self.w_down = new((2 * F, D), BF16), new((D, F), BF16)  # [2F, D], [D, F]
        self.attn_norm, self.mlp_norm = new(D, BF16), new(D, BF16)          # [D]
        cache = (num_blocks, cfg.n_kv_heads, BLOCK_SIZE, hd)
        self.k_cache, self.v_cache = new(cache, BF16), new(cache, BF16)     # [NB, KVH, 16, hd]

    def load(self, lw) -> None:
        for name in ("w_qkv", "w_o", "w_gate_up", "w_down", "attn_norm", "mlp_norm"):
            getattr(self, name).copy_from(getattr(lw, name))


def rows_agree(tokens: np.ndarray, positions: np.ndarray, tables: np.ndarray) -> bool:
    """Whether decode inputs are ``[B]``, ``[B]`` and ``[B, MB]`` arrays of one ``B``."""
    B = len(tokens)
    return tokens.ndim == 1 and positions.shape == (B,) and tables.ndim == 2 and len(tables) == B


class DecodeModel:
    """A Llama-style decoder on the GPU for batches of up to ``max_batch`` rows.

    Parameters
    ----------
    cfg, weights : the model (``weights=None`` with ``plan_only=True``).
    max_batch : rows of every static buffer (the largest batch a step may have).
    num_blocks : KV-cache blocks of 16 tokens per layer (default: ``max_batch`` sequences of ``kv_tokens``).
    kv_tokens : context per sequence the default pool is sized for (default ``min(max_seq_len, 1024)``).
    plan_only : allocate nothing and load no kernel: buffers are address-0 views and kernels are signatures,
        enough to print the step's launch plan on a machine without a GPU.
    pdl : launch every kernel with programmatic dependent launch (overlaps each kernel's start with the
        previous one's tail; kernels/pdl.cuh). Results are identical either way.
    compile_options : extra NVRTC options for the kernel files, e.g. ``("-DRG_TRACE",)`` for the block trace of
        :mod:`rawgraphs.model.trace`.
    comm : a :class:`rawgraphs.comm.Communicator` when ``cfg``/``weights`` are one rank's tensor-parallel shard
        (``tensor_parallel.local_config`` / ``rank_weights``): the row-parallel projections all-reduce.
    """

    def __init__(self, cfg: ModelConfig, weights: Weights | None, max_batch: int = 1,
                 num_blocks: int | None = None, kv_tokens: int | None = None, plan_only: bool = False,
                 pdl: bool = True, comm=None, compile_options: tuple[str, ...] = ()):
        self.cfg, self.max_batch, self.pdl, self.comm = cfg, max_batch, pdl, comm
        self.max_blocks = math.ceil(cfg.max_seq_len / BLOCK_SIZE)  # block-table row length
        kv_tokens = kv_tokens or min(cfg.max_seq_len, 1024)
        self.num_blocks = num_blocks or max_batch * math.ceil(kv_tokens / BLOCK_SIZE)
        new = _plan_view if plan_only else DeviceBuffer
        self.modules = [] if plan_only else [Module.from_file(f, options=compile_options, name_expressions=names)
                                             for f, names in KERNEL_FILES.items()]
        self.kernels = _plan_kernels() if plan_only else {n: m.kernel(n) for m in self.modules for n in m.names}
        self.embed = new((cfg.vocab, cfg.dim), BF16)  # [V, D]
        tied = cfg.tie_word_embeddings
        self.lm_head = self.embed if tied else new((cfg.vocab, cfg.dim), BF16)  # [V, D]
        self.final_norm = new(cfg.dim, BF16)
        half = (self.max_blocks * BLOCK_SIZE, cfg.head_dim // 2)  # every position a block table can hold
        self.rope_cos, self.rope_sin = new(half, np.float32), new(half, np.float32)  # [T, hd/2] constants
        self.layers = [_Layer(cfg, self.num_blocks, new) for _ in range(cfg.n_layers)]
        if not plan_only:
            self._load_weights(weights)
        self._alloc_activations(new)
        self._steps: dict[int, Step] = {}
        if comm is not None and not plan_only:
            self._connect()

    def _connect(self) -> None:
        """One eager all-reduce: NCCL connects the ranks at their first collective, which is then outside
        any capture (every rank makes its model the same way, so every rank takes part)."""
        with Stream.create() as s:
            self.partial.zero(s)
            self.comm.all_reduce(self.partial, s)
            s.synchronize()

    def _load_weights(self, w: Weights) -> None:
        if (w.lm_head is w.embed) != (self.lm_head is self.embed):
            raise ValueError("weights and config disagree on tie_word_embeddings")
        self.embed.copy_from(w.embed)
        if self.lm_head is not self.embed:
            self.lm_head.copy_from(w.lm_head)
        self.final_norm.copy_from(w.final_norm)
        cos, sin = rope_tables(self.cfg.head_dim, self.cfg.rope_theta, self.rope_cos.shape[0])
        self.rope_cos.copy_from(cos)
        self.rope_sin.copy_from(sin)
        for layer, lw in zip(self.layers, w.layers, strict=True):
            layer.load(lw)

    def _alloc_activations(self, new) -> None:
        c, B = self.cfg, self.max_batch
        D, F, V, H, hd = c.dim, c.ffn_dim, c.vocab, c.n_heads, c.head_dim
        qkv_dim = (c.n_heads + 2 * c.n_kv_heads) * hd
        self.tokens = new(B, np.int32)                        # [B] input token ids
        self.positions = new(B, np.int32)                     # [B] position of the input token; <0: inactive
        self.block_tables = new((B, self.max_blocks), np.int32)  # [B, MB]
        self.x = new((B, D), BF16)                            # [B, D] residual stream
        self.qkv = new((B, qkv_dim), BF16)                    # [B, (H + 2 KVH) hd]
        self.attn = new((B, H * hd), BF16)                    # [B, H hd]
        self.gu = new((B, F), BF16)                           # [B, F] silu(gate) * up
        self.logits = new((B, V), np.float32)                 # [B, V]
        if self.comm is not None:
            self.partial = new((B, D), np.float32)            # [B, D] row-parallel partial sums (all-reduced)
        self.next_tokens = new(B, np.int32)                   # [B] greedy output
        self.normed = new((B, D), BF16)                       # [B, D] rms_input: the next projection's input
        shapes = [(qkv_dim, D), (D, H * hd), (2 * F, D), (D, F), (V, D)]
        sizes = range(1, B + 1)
        self.workspace = new(max(max_workspace_bytes(sizes, shapes), 4), np.uint8)
        n_o, n_ml = workspace_elements([attention_plan_for(c, b) for b in sizes])  # a small B may split more
        self.part_o = new(max(n_o, 1), np.float32)                     # attention split partials
        self.part_ml = new(max(n_ml, 1), np.float32)
        self.attn_counters = new(B * H, np.int32)                      # fused attention combine; kept zero
        self.split_counters = new(max(max_counters(sizes, shapes), 1), np.int32)  # in-kernel split merges; kept zero
        if new is not _plan_view:
            self.attn_counters.zero()
            self.split_counters.zero()
            device().synchronize()  # the memset lands before any (non-blocking) stream's first launch
        if new is _plan_view:
            return
        # pinned staging for inputs and outputs (async copies; stable addresses)
        self.h_tokens, self.h_positions = HostBuffer(B, np.int32), HostBuffer(B, np.int32)
        self.h_tables = HostBuffer((B, self.max_blocks), np.int32)
        self.h_next = HostBuffer(B, np.int32)

    # ---- the step -----------------------------------------------------------------------------------------
    def step_launches(self, B: int) -> Step:
        """The decode step for ``B`` rows as an ordered list of launches and, with a communicator, all-reduces
        (cached per ``B``)."""
        if not 1 <= B <= self.max_batch:
            raise ValueError(f"batch {B} is outside 1..{self.max_batch} (max_batch of this model)")
        if B not in self._steps:
            self._steps[B] = self._build_step(B)
        return self._steps[B]

    def _build_step(self, B: int) -> Step:
        c, k, out = self.cfg, self.kernels, []

        def launch(name, kernel, shape: LaunchShape, **args):
            shape = replace(shape, pdl=self.pdl)
            out.append(Launch(name, k[kernel], shape, k[kernel].args(**args)))

        def linear(name, y, x, w, N, K, mode="bf16", x_op="plain", norm=None):  # y[B, N] (mode) op(x) @ w[N, K]^T
            plan = gemv_plan(B, N, K, mode, x_op=x_op)
            for ln in plan.launches(y, x, w, self.workspace, B, N, K, norm, c.rms_norm_eps, self.positions,
                                    self.normed, self.split_counters):
                launch(name + _SUFFIX.get(ln.kernel, ""), ln.kernel, LaunchShape(ln.grid, ln.block, ln.shared),
                       **ln.args)

        def row_parallel(name, x, w, K):  # self.x[B, D] += x @ w[D, K]^T, summed over ranks
            if self.comm is None:
                linear(name, self.x, x, w, D, K, "residual")
                return
            linear(name, self.partial, x, w, D, K, "f32")                             # this rank's fp32 part
            out.append(AllReduce(name + ".all_reduce", self.comm, self.partial, B * D))  # sum over ranks
            # x = bf16(float(x) + sum): the fused residual store. Plain stream order after the collective
            # (no PDL): whatever NCCL enqueued (kernels, joins, or nothing for one rank) is finished first.
            add = LaunchShape(math.ceil(B * D / _ADD_THREADS), _ADD_THREADS)
            out.append(Launch(name + ".add", k["splitk_reduce"], add, k["splitk_reduce"].args(
                y=self.x, partial=self.partial, positions=self.positions, B=B, N=D, splits=1,
                mode=OUT_MODES["residual"])))

        # RMSNorm is fused into the projection after it (x_op) and silu_mul into gate_up's epilogue ("silu"):
        # h and gate | up never reach memory; attention applies RoPE, appends K/V and merges its splits itself.
        D, F, H, KVH, hd = c.dim, c.ffn_dim, c.n_heads, c.n_kv_heads, c.head_dim
        ap = attention_plan_for(c, B)
        launch("embed", "embedding", LaunchShape(B, 128), out=self.x, tokens=self.tokens, table=self.embed,
               V=c.vocab, D=D)
        for i, L in enumerate(self.layers):
            p = f"L{i}."
            linear(p + "qkv", self.qkv, self.x, L.w_qkv, (H + 2 * KVH) * hd, D,                # rmsnorm(x) @ Wqkv^T
                   x_op="rmsnorm", norm=L.attn_norm)
            launch(p + "attention", ap.kernel, ap.attention, **ap.args(                   # RoPE, KV append
                out=self.attn, part_o=self.part_o, part_ml=self.part_ml, counters=self.attn_counters,  # and
                qkv=self.qkv, k_cache=L.k_cache, v_cache=L.v_cache, block_tables=self.block_tables,  # combine
                positions=self.positions, max_blocks=self.max_blocks, n_kv_heads=KVH,                # fused
                rope_cos=self.rope_cos, rope_sin=self.rope_sin))
            row_parallel(p + "o_proj", self.attn, L.w_o, H * hd)                         # x += attn @ Wo^T
            linear(p + "gate_up", self.gu, self.x, L.w_gate_up, 2 * F, D, "silu",      # silu_mul(rmsnorm(x)
                   x_op="rmsnorm", norm=L.mlp_norm)                                      #          @ Wgu^T)
            row_parallel(p + "down", self.gu, L.w_down, F)                               # x += gu @ Wd^T
        linear("lm_head", self.logits, self.x, self.lm_head, c.vocab, D, "f32", "rmsnorm", self.final_norm)
        launch("argmax", "argmax", LaunchShape(B, 1024), tokens=self.next_tokens, logits=self.logits, V=c.vocab)
        return out

    def run_eager(self, B: int, stream: Stream) -> None:
        """Launch the step for ``B`` rows one kernel at a time."""
        for ln in self.step_launches(B):
            ln.enqueue(stream)

    def capture(self, B: int, stream: Stream) -> Graph:
        """The step for ``B`` rows recorded by stream capture."""
        launches = self.step_launches(B)
        with Graph.capture(stream) as g:
            for ln in launches:
                ln.enqueue(stream)
        return g

    def build_graph(self, B: int) -> Graph:
        """The step for ``B`` rows built as explicit nodes, a chain named like the launches.

        An all-reduce has no explicit node type: it is captured alone (on a side stream) into a child graph,
        embedded as a child node. NCCL enqueues nothing for an in-place sum over one rank; an empty node then
        keeps the chain and the name.
        """
        g, prev = Graph(), None
        with Stream.create() as side:
            for ln in self.step_launches(B):
                if isinstance(ln, AllReduce):
                    child = ln.captured(side)  # pinned by its node: it holds NCCL's references for the graph
                    if child.node_count():
                        prev = g.add_child(child, deps=prev, name=ln.name)
                    else:
                        child.close()
                        prev = g.add_empty(deps=prev, name=ln.name)
                else:
                    prev = g.add_kernel(ln.kernel, ln.shape, ln.args, deps=prev, name=ln.name)
        return g

    # ---- inputs and outputs -------------------------------------------------------------------------------
    def set_inputs(self, tokens, positions, block_tables, stream: Stream) -> None:
        """Stage ``B`` rows of inputs into the static buffers (async copies from pinned memory on ``stream``).

        tokens [B] int, positions [B] int (< 0: inactive row), block_tables [B, <= max_blocks] int.
        """
        B = self.stage_inputs(tokens, positions, block_tables)
        self.tokens.upload_async(self.h_tokens, 4 * B, stream)
        self.positions.upload_async(self.h_positions, 4 * B, stream)
        self.block_tables.upload_async(self.h_tables, 4 * B * self.max_blocks, stream)

    def checked_inputs(self, tokens, positions, block_tables) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``tokens``, ``positions``, ``block_tables`` as int32 arrays, or ValueError: the kernels index the
        embedding, the KV pool and the rope tables with them unchecked, so a bad id would read or write out of
        bounds on the device. Rows with a position < 0 are inactive: their token is not read."""
        tokens, positions = np.asarray(tokens, np.int32), np.asarray(positions, np.int32)
        tables = np.asarray(block_tables, np.int32)
        B = len(tokens)
        if not rows_agree(tokens, positions, tables) or B > self.max_batch or tables.shape[1] > self.max_blocks:
            raise ValueError(f"inputs must be [B], [B], [B, <= {self.max_blocks}] with B <= {self.max_batch}; "
                             f"got {tokens.shape}, {positions.shape}, {tables.shape}")
        # a row at position p reads blocks 0 .. p // 16 of its table: all must be given
        reach = min(self.cfg.max_seq_len, tables.shape[1] * BLOCK_SIZE)
        if positions.max(initial=-1) >= reach:
            raise ValueError(f"a position is past {reach}: max_seq_len is {self.cfg.max_seq_len} and a block table "
                             f"of {tables.shape[1]} blocks holds {tables.shape[1] * BLOCK_SIZE} positions")
        # one unsigned max per array (a negative id is a huge uint32): these run on every step's host path
        if tables.view(np.uint32).max(initial=0) >= self.num_blocks:
            raise ValueError(f"block ids must be in [0, {self.num_blocks}), the KV pool's blocks; got "
                             f"{tables.min()} .. {tables.max()}")
        if tokens.view(np.uint32).max(initial=0) >= self.cfg.vocab:
            bad = ((tokens < 0) | (tokens >= self.cfg.vocab)) & (positions >= 0)
            if bad.any():
                raise ValueError(f"token ids must be in [0, {self.cfg.vocab}); got {tokens[bad].tolist()}")
        return tokens, positions, tables

    def stage_inputs(self, tokens, positions, block_tables) -> int:
        """Check and write ``B`` rows of inputs into the pinned staging arrays only (a graph with memcpy nodes
        from them copies them in); returns ``B``. Do not call while a launch that copies them is pending."""
        tokens, positions, tables = self.checked_inputs(tokens, positions, block_tables)
        B = len(tokens)
        self.h_tokens.array[:B] = tokens
        self.h_positions.array[:B] = positions
        self.h_tables.array[:B] = 0
        self.h_tables.array[:B, :tables.shape[1]] = tables
        return B

    def read_tokens(self, B: int, stream: Stream) -> np.ndarray:
        """The step's greedy tokens for ``B`` rows (waits for the stream)."""
        self.next_tokens.download_async(self.h_next, 4 * B, stream)
        stream.synchronize()
        return self.h_next.array[:B].copy()

    def read_logits(self, B: int) -> np.ndarray:
        """Logits of the first ``B`` rows, fp32 ``[B, V]`` (synchronous)."""
        return self.logits.to_numpy()[:B]
