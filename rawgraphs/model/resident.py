"""A resident decode loop: one graph launch that stays on the GPU and serves request after request, each of up to
N tokens for the whole batch, rung on a doorbell in pinned host memory. The host's part of a request is staging
its inputs (or nothing, to go on from where the last request stopped) and one 8-byte store: no driver call.

Graph: WHILE serving { bell_wait -> loop_begin -> WHILE decoding { decode step ; decode_loop_tail } -> loop_end }.
bell_wait (kernels/conditional.cu) is one thread polling the doorbell word ``seq << 8 | cmd`` over the bus; a new
seq starts a pass, which ends with loop_end writing the tokens, the pass's GPU ns (globaltimer) and then the
request word itself back to pinned memory (the acknowledgement the host spins on). A STOP request, or ``idle_s``
without one, ends the graph; the next :meth:`ResidentLoop.submit` launches it again (``launches`` counts them).

Why: :class:`~rawgraphs.model.loop.DeviceLoop` needs one ``cuGraphLaunch`` per run, and on the device machine's
host a driver call not made for ~30 ms costs 40-70 us (benchmarks/NOTES.md, sessions 6 and 19), i.e. 0.3-0.5 us
per token at N = 128 before any staging. Here that launch happens once per idle spell instead of once per run.

While the graph is up it owns the model's step buffers and ``stream`` (work queued behind it on that stream waits
for :meth:`close` or the idle timeout); do not run the model otherwise until :meth:`close`. compute-sanitizer's
memcheck runs it; racecheck cannot (its process faults on the host's read of the acknowledgement word while the
graph runs: benchmarks/NOTES.md, session 32).
"""

from __future__ import annotations

import time
import weakref

import numpy as np

from ..conditional import add_conditional, create_handle
from ..context import Stream
from ..errors import ClosedError
from ..graph import Graph
from ..kernel import LaunchShape
from ..memory import DeviceBuffer, HostBuffer
from .decode import DecodeModel
from .loop import DeviceLoop

__all__ = ["ResidentLoop", "DECODE", "RESUME", "STOP", "IDLE"]

# request commands: a doorbell word's low byte (kernels/conditional.cu, REQ_*)
DECODE, RESUME, STOP, IDLE = 1, 2, 3, 4
_STOP_WORD = (2**54 - 1) << 8 | STOP  # a seq no request reaches: close() needs no count
_POLL_CHECK = 4096  # acknowledgement polls between two stream queries and clock reads in wait()


def _stop(bell: HostBuffer, stream: Stream) -> None:
    """Ring STOP and wait for the graph to end (the finalizer: holds no reference to the loop)."""
    bell.array[0] = _STOP_WORD
    stream.synchronize()


class ResidentLoop(DeviceLoop):
    """Serve requests of up to ``max_steps`` tokens for ``B`` rows of ``model`` from one resident graph.

    ``submit`` stages the inputs (or none, with ``resume=True``) and rings; ``wait`` spins until the graph
    acknowledges; ``run`` does both and returns the tokens, as :meth:`DeviceLoop.run` does. ``idle_s``: seconds
    without a request after which the graph ends by itself (the next request launches it again)."""

    def __init__(self, model: DecodeModel, B: int, max_steps: int, eos: int, stream: Stream, idle_s: float = 1.0):
        if not 0 < idle_s <= 3600:
            raise ValueError(f"idle_s must be in (0, 3600] seconds, got {idle_s!r}")
        self.idle_ns = int(idle_s * 1e9)
        self.bell, self.ack, self.h_ns = (HostBuffer(1, np.int64) for _ in range(3))
        for h in (self.bell, self.ack, self.h_ns):
            h.array[0] = 0
        self.req = DeviceBuffer.from_numpy(np.zeros(2, np.int64))  # [request word, globaltimer when seen]
        self.seq, self.launches, self._want, self._running = 0, 0, 0, False
        super().__init__(model, B, max_steps, eos, stream)
        self._finalizer = weakref.finalize(self, _stop, self.bell, stream)

    def _build(self, g: Graph) -> None:
        """The resident graph: WHILE serving { bell_wait -> the decode part }."""
        serve = add_conditional(g, "while", default=1, name="serve")
        body = serve.bodies[0]
        wait = self.module.kernel("bell_wait")
        decode = create_handle(body)  # no default: bell_wait sets it before every pass
        node = body.add_kernel(wait, LaunchShape(1, 1), wait.args(
            serve=serve.handle, decode=decode, bell=self.bell.device_ptr, req=self.req,
            idle_ns=self.idle_ns), name="bell_wait")
        self._add_decode(body, deps=[node], req=self.req, h_ack=self.ack.device_ptr, h_ns=self.h_ns.device_ptr,
                         handle=decode)
        self.serve = serve

    def _live(self) -> None:
        if not self._finalizer.alive:
            raise ClosedError("this ResidentLoop was closed")

    def submit(self, tokens=None, positions=None, block_tables=None, *, resume: bool = False) -> int:
        """Start a request; returns its sequence number. With inputs: decode from them (checked and staged in
        pinned memory, as :meth:`DeviceLoop.stage`). Without: ``resume=True`` goes on from the device's
        tokens and positions (each row where the last request left it), ``resume=False`` decodes again from the
        inputs staged last. The host's part is the staging and one store to the doorbell word."""
        self._live()
        if self._want:
            raise RuntimeError("a request is in flight: wait() for it before the next submit()")
        given = tokens is not None or positions is not None or block_tables is not None
        if given:
            if resume:
                raise ValueError("resume=True goes on from the device's state: give no inputs")
            self.stage(tokens, positions, block_tables)  # raises before anything is rung
        elif not self.seq:  # nothing staged yet: the first request must bring inputs (a refused one rings nothing)
            raise ValueError("no request has run yet: give tokens, positions and block_tables")
        self.seq += 1
        self._want = self.seq << 8 | (RESUME if resume else DECODE)
        self.bell.array[0] = self._want  # after the staging: bell_wait reads it with acquire semantics
        if not self._running:
            self._launch()
        return self.seq

    def _launch(self) -> None:
        self.exe.launch(self.stream)
        self.launches += 1
        self._running = True

    def wait(self, timeout_s: float = 60.0) -> None:
        """Spin until the request in flight is acknowledged (its tokens are in ``h_out``). If the graph had gone
        idle before seeing the bell, it is launched again; a fault inside the graph raises its CudaError;
        TimeoutError after ``timeout_s``."""
        self._live()
        want = self._want
        if not want:
            raise RuntimeError("no request in flight: submit() first")
        ack, deadline, n = self.ack.array, time.perf_counter() + timeout_s, 0
        while True:
            a = int(ack[0])
            if a == want:
                break
            if a & 0xff == IDLE and a >> 8 == (want >> 8) - 1:  # ended idle just before our bell: launch again
                ack[0] = 0  # the ended graph writes nothing more; the next one acknowledges our request
                self._launch()
            n += 1
            if n % _POLL_CHECK == 0:
                self.stream.query()  # a fault inside the graph ends it: raise its CudaError, not a timeout
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"request {want >> 8} not acknowledged in {timeout_s} s (last ack word "
                                       f"{a:#x}); close() stops the graph")
        self._want = 0

    @property
    def gpu_ns(self) -> int:
        """GPU ns of the last request: globaltimer from bell_wait seeing the bell to loop_end's results."""
        return int(self.h_ns.array[0])

    def start(self, tokens, positions, block_tables) -> None:
        """Stage the inputs and ring (``submit``); :meth:`wait` before reading the results."""
        self.submit(tokens, positions, block_tables)

    def run(self, tokens=None, positions=None, block_tables=None, *, resume: bool = False) -> list[list[int]]:
        """Submit, wait and return each row's tokens, up to and including its EOS."""
        self.submit(tokens, positions, block_tables, resume=resume)
        self.wait()
        return self.tokens()

    def close(self) -> None:
        """Ring STOP and wait for the graph to end (idempotent); the stream and model are free again."""
        self._running = False
        self._finalizer()

    def __enter__(self) -> ResidentLoop:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
