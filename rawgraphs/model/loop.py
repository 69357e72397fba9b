"""An on-device decode loop: one graph launch decodes up to N tokens for the whole batch and stops on EOS.

Graph: loop_begin (reads the staged inputs straight from pinned host memory, resets out = -1, step = 0,
done = 0) -> WHILE { decode step ; decode_loop_tail } -> loop_end (writes out and step back to pinned memory).
Kernels, not memcpy/memset nodes, move the data: with three host-to-device memcpy nodes, three memsets and
two device-to-host memcpy nodes, staging + launching this graph cost the host ~29 us at B = 1 (H200, session 1),
while a graph of 350 kernel nodes launches in ~4 us (benchmarks/graph_overheads.py).
The tail kernel (kernels/conditional.cu) appends each active row's token to ``out[step, b]``, feeds it back as
the next input, advances the row's position (an EOS makes the row inactive), and keeps the loop going while
``step < N`` and some row is still live. The host never sees a token until the loop ends (seed, constraint 3:
control flow made data-driven on the GPU), and the host's whole part of N tokens is writing the inputs and one
``cuGraphLaunch`` (:mod:`rawgraphs.model.resident` takes the launch off that path too). Block tables must already
cover ``position + N`` for every row.
"""

from __future__ import annotations

import numpy as np

from ..conditional import add_conditional
from ..context import Stream
from ..graph import Graph
from ..kernel import LaunchShape, Module
from ..memory import DeviceBuffer, HostBuffer
from .decode import DecodeModel

__all__ = ["DeviceLoop"]

_COPY_THREADS = 256


def _grid_for(elems: int) -> LaunchShape:
    """A grid-stride copy kernel's shape: one thread per element, at most 64 blocks."""
    return LaunchShape(min(64, -(-elems // _COPY_THREADS)), _COPY_THREADS)


class DeviceLoop:
    """Decode up to ``max_steps`` tokens for ``B`` rows of ``model`` in one graph launch."""

    def __init__(self, model: DecodeModel, B: int, max_steps: int, eos: int, stream: Stream):
        if max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        self.model, self.B, self.max_steps, self.eos, self.stream = model, B, max_steps, eos, stream
        self.out = DeviceBuffer((max_steps, B), np.int32)  # [N, B] tokens per step (-1: row not live)
        self.step = DeviceBuffer(1, np.int32)              # steps taken
        self.done = DeviceBuffer(B, np.int32)              # [B] 1 once a row produced EOS
        self.h_out, self.h_step = HostBuffer((max_steps, B), np.int32), HostBuffer(1, np.int32)
        self.module = Module.from_file("conditional")
        self.graph = Graph()
        self._build(self.graph)
        self.exe = self.graph.instantiate()
        self.exe.upload(stream)

    def _build(self, g: Graph) -> None:
        """The one-shot loop's graph: the decode part alone."""
        self._add_decode(g, deps=[])

    def _add_decode(self, g: Graph, deps, req=None, h_ack=None, h_ns=None, handle: int | None = None) -> None:
        """Add loop_begin -> WHILE { step ; tail } -> loop_end to ``g`` after ``deps``; keeps the WHILE node's
        :class:`Conditional` as ``self.loop``. ``req`` etc.: the resident loop's request, acknowledgement and WHILE
        handle (kernels/conditional.cu); with them, loop_end runs as one block that acknowledges last."""
        model, B, stream, mod = self.model, self.B, self.stream, self.module
        tail, begin, end = mod.kernel("decode_loop_tail"), mod.kernel("loop_begin"), mod.kernel("loop_end")
        table_elems, out_elems = B * model.max_blocks, self.max_steps * B
        init = g.add_kernel(begin, _grid_for(max(table_elems, out_elems)), begin.args(
            tokens=model.tokens, positions=model.positions, tables=model.block_tables, done=self.done,
            out=self.out, step=self.step, h_tokens=model.h_tokens.device_ptr,
            h_positions=model.h_positions.device_ptr, h_tables=model.h_tables.device_ptr, B=B,
            table_elems=table_elems, out_elems=out_elems, req=req), deps=deps, name="loop_begin")
        loop = add_conditional(g, "while", handle=handle, default=1, deps=[init], name="decode_loop")
        with Graph.capture(stream, into=loop.bodies[0]):
            model.run_eager(B, stream)
            # With PDL the tail launches while the step's argmax still runs (it waits for it first): one launch
            # latency less per token.
            tail.launch(LaunchShape(1, (B + 31) // 32 * 32, pdl=model.pdl), tail.args(
                handle=loop.handle, next=model.next_tokens, tokens=model.tokens, positions=model.positions,
                done=self.done, out=self.out, step=self.step, max_steps=self.max_steps, B=B, eos=self.eos), stream)
        shape = _grid_for(out_elems) if req is None else LaunchShape(1, _COPY_THREADS)
        g.add_kernel(end, shape, end.args(
            h_out=self.h_out.device_ptr, h_step=self.h_step.device_ptr, out=self.out, step=self.step,
            out_elems=out_elems, req=req, h_ack=h_ack, h_ns=h_ns), deps=[loop.node], name="loop_end")
        self.loop = loop

    def stage(self, tokens, positions, block_tables) -> None:
        """Check the inputs and write them into the pinned staging arrays that loop_begin reads: exactly ``B``
        rows (a row with position < 0 is inactive), or ValueError before anything is written."""
        if len(tokens) != self.B:
            raise ValueError(f"this loop decodes {self.B} rows; got {len(tokens)} (pad with inactive rows: "
                             "position -1)")
        self.model.stage_inputs(tokens, positions, block_tables)

    def start(self, tokens, positions, block_tables) -> None:
        """Stage the inputs in pinned memory and launch: all the host does for up to N tokens."""
        self.stage(tokens, positions, block_tables)
        self.exe.launch(self.stream)

    def run(self, tokens, positions, block_tables) -> list[list[int]]:
        """Feed the last prompt token of each row (position < 0: inactive row) and decode on the device;
        returns each row's tokens up to and including its EOS."""
        self.start(tokens, positions, block_tables)
        self.stream.synchronize()
        return self.tokens()

    def tokens(self) -> list[list[int]]:
        """Each row's tokens of the last run, up to and including its EOS."""
        out = self.h_out.array[:self.steps_taken]  # [steps, B]
        return [[int(t) for t in out[:, b] if t >= 0] for b in range(self.B)]

    @property
    def steps_taken(self) -> int:
        """Loop iterations of the last ``run``."""
        return int(self.h_step.array[0])
