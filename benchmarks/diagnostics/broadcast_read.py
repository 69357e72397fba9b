"""How long a B = 1 projection's blocks take to read their input once the PDL wait lets them go, and why.

Every B = 1 projection's blocks (132-396 of them) read the whole previous output (1.5 KB on small, 4 KB on 1b) the
moment griddepcontrol.wait returns: the same few L2 lines, all at once, while each block's first weight ring (16 KB
of cp.async from HBM, issued before the wait) is still in flight. This times that read alone, in a graph of
producer/consumer pairs chained by programmatic (PDL) edges, as the step chains its launches:

- ``produce``: 132 blocks write the input (and ``copies`` replicas of it), as a projection's store does;
- ``consume``: ``blocks`` blocks of 256 threads issue ``ring`` bytes of cp.async from HBM (distinct per block and
  pair), wait, then read the input (replica ``block % copies``) into shared memory; thread 0 stamps %globaltimer
  at its release, when the input is in (after a block barrier) and when its ring has landed.

Columns (us, medians over blocks and pairs): ``x`` release -> input read, ``ring`` release -> ring landed,
``span`` first release -> last block's input read (per pair), ``pair`` the graph's time per producer/consumer pair.
``copies`` = 1 is what the decode step does; ``copies`` = blocks gives every block lines of its own; ``tma`` = 1
reads the one copy with a single bulk copy (cp.async.bulk, the tensor memory accelerator) instead of every thread's
16-byte loads. If ``x`` falls with copies, the same-line reads contend; if it grows with ``ring``, the input queues
behind the weights; if it falls with ``tma``, the bulk path avoids whichever it was.

Run: ``PYTHONPATH=. python3 benchmarks/diagnostics/broadcast_read.py``.
"""

from __future__ import annotations

import sys

import numpy as np

sys.path.insert(0, "benchmarks")
from common import median, no_gpu, time_ms

from rawgraphs.context import Stream, device
from rawgraphs.graph import Graph
from rawgraphs.kernel import LaunchShape, Module
from rawgraphs.memory import DeviceBuffer

SOURCE = r"""
__device__ __forceinline__ unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void pdl() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

// x[c * n16 + i] for every replica c < copies: the previous projection's output and its copies.
extern "C" __global__ void produce(uint4* x, int n16, int copies, int pair) {
    pdl();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n16 * copies; i += gridDim.x * blockDim.x)
        x[i] = make_uint4(i, pair, 1, 2);
}

// Issue ring16 cp.async of 16 bytes (this block's slice of w for this pair), wait, read replica (block % copies)
// of x into shared memory (tma: one bulk copy by thread 0, completing on an mbarrier; else every thread loads
// 16 bytes); t[3 * block + {0, 1, 2}] = release, input in, ring landed.
extern "C" __global__ void __launch_bounds__(256) consume(const uint4* x, int n16, int copies, const uint4* w,
                                                          int ring16, int tma, unsigned long long* t,
                                                          unsigned* sink) {
    __shared__ uint4 ring[1024];
    __shared__ uint4 xs[256];
    __shared__ __align__(8) unsigned long long bar;
    const unsigned bar_s = (unsigned)__cvta_generic_to_shared(&bar);
    if (tma && threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_s) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    const uint4* mine = w + (size_t)blockIdx.x * ring16;
    for (int i = threadIdx.x; i < ring16; i += blockDim.x) {
        const unsigned s = (unsigned)__cvta_generic_to_shared(ring + i);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(mine + i) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    pdl();
    const unsigned long long t0 = now();
    const uint4* src = x + (size_t)(blockIdx.x % copies) * n16;
    if (tma) {
        if (threadIdx.x == 0) {
            const unsigned xs_s = (unsigned)__cvta_generic_to_shared(xs);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_s), "r"(n16 * 16)
                         : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(xs_s), "l"(src), "r"(n16 * 16), "r"(bar_s) : "memory");
        }
        asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n @!p bra W;\n}"
                     ::"r"(bar_s) : "memory");
    } else {
        for (int i = threadIdx.x; i < n16; i += blockDim.x) xs[i] = src[i];
    }
    __syncthreads();
    const unsigned long long t1 = now();
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    const unsigned long long t2 = now();
    if (threadIdx.x == 0) {
        t[3 * blockIdx.x] = t0;
        t[3 * blockIdx.x + 1] = t1;
        t[3 * blockIdx.x + 2] = t2;
    }
    unsigned acc = xs[threadIdx.x % n16].x;  // keep the reads
    if (ring16 > 0) acc += ring[threadIdx.x % ring16].y;
    if (acc == 0xffffffffu) *sink = acc;
}
"""

PAIRS = 32
PRODUCER = LaunchShape(132, 256, pdl=True)
CASES = [(blocks, nbytes, ring, copies, tma)
         for nbytes in (1536, 4096) for blocks in (132, 288, 396) for ring in (0, 16384)
         for copies, tma in ((1, 0), (blocks, 0), (1, 1))]


def spans(t: np.ndarray) -> dict:
    """Per-case medians (us) from stamps ``t`` of shape [pairs, blocks, 3] (release, input in, ring landed)."""
    rel, xin, ring = (t[..., i].astype(np.int64) for i in range(3))
    return {"x_us": float(np.median(xin - rel)) / 1e3, "ring_us": float(np.median(ring - rel)) / 1e3,
            "span_us": float(np.median(xin.max(axis=1) - rel.min(axis=1))) / 1e3}


def run_case(mod: Module, stream: Stream, w: DeviceBuffer, blocks: int, nbytes: int, ring: int, copies: int,
             tma: int) -> dict:
    n16, ring16 = nbytes // 16, ring // 16
    x = DeviceBuffer(n16 * copies * 16, np.uint8)
    stamps = DeviceBuffer((PAIRS, blocks, 3), np.uint64)
    sink = DeviceBuffer(1, np.uint32)
    produce, consume = mod.kernel("produce"), mod.kernel("consume")
    consumer = LaunchShape(blocks, 256, pdl=True)
    g, prev = Graph(), None
    for p in range(PAIRS):
        prev = g.add_kernel(produce, PRODUCER, dict(x=x, n16=n16, copies=copies, pair=p), deps=prev)
        wp = int(w) + (p * blocks * ring16 * 16) % (w.nbytes - blocks * ring16 * 16 + 1)  # fresh HBM lines
        prev = g.add_kernel(consume, consumer, dict(x=x, n16=n16, copies=copies, w=wp, ring16=ring16, tma=tma,
                                                    t=int(stamps) + p * blocks * 24, sink=sink), deps=prev)
    exe = g.instantiate()
    exe.upload(stream)
    pair = median(time_ms(lambda: exe.launch(stream), stream, False)) * 1e3 / PAIRS
    stream.synchronize()
    row = {"blocks": blocks, "bytes": nbytes, "ring": ring, "copies": copies, "tma": tma, **spans(stamps.to_numpy()),
           "pair_us": pair}
    exe.close()
    g.close()
    for b in (x, stamps, sink):
        b.close()
    return row


def main() -> None:
    if no_gpu("broadcast_read.py"):
        return
    mod = Module.from_source(SOURCE, "broadcast_read.cu")
    print(f"{device().name}: {PAIRS} producer/consumer pairs per graph, PDL edges; us")
    print(f"  {'blocks':>6} {'bytes':>6} {'ring':>6} {'copies':>6} {'tma':>3} {'x':>6} {'ring':>6} {'span':>6} "
          f"{'pair':>6}")
    with Stream.create() as stream, DeviceBuffer(256 << 20, np.uint8) as w:
        w.fill_bytes(1, stream)
        for case in CASES:
            r = run_case(mod, stream, w, *case)
            print(f"  {r['blocks']:6d} {r['bytes']:6d} {r['ring']:6d} {r['copies']:6d} {r['tma']:3d} {r['x_us']:6.2f} "
                  f"{r['ring_us']:6.2f} {r['span_us']:6.2f} {r['pair_us']:6.2f}", flush=True)


if __name__ == "__main__":
    main()
