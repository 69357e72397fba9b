// pdl.cuh: programmatic dependent launch (PDL, sm_90+) for the decode kernels.
//
// A kernel launched with programmatic stream serialization (LaunchShape(pdl=True)) may start while the kernel
// before it is still finishing. Every decode kernel therefore begins with pdl_begin(): it lets the *next*
// kernel launch early (launch_dependents) and then waits until the previous kernel has completed and its
// writes are visible (wait). Nothing a kernel reads from the previous kernel may be touched before the wait;
// weights can be, so the projections prefetch their weight slice into L2 first, overlapping HBM traffic with
// the previous kernel's tail. Launched without PDL, or below sm_90, both are no-ops.
// CUDA Programming Guide, "Programmatic Dependent Launch and Synchronization".
#pragma once

#ifdef RG_TRACE
// Block trace, compiled in only with -DRG_TRACE (DecodeModel(compile_options=("-DRG_TRACE",)); read by
// rawgraphs.model.trace). Thread 0 of each block that waits writes one record {%gridid, %smid << 32 | linear
// block index, arrival at the wait, release from it, exit or 0, entry or 0, staged or 0, summed or 0}
// (%globaltimer, ns); a kernel that calls rg_trace_enter() first thing and rg_trace_exit() last (gemv) adds its
// entry and exit (arrival - entry: the block's work before the wait, gemv's first cp.async ring), and one that
// calls rg_trace_mark(RG_STAGED) and rg_trace_mark(RG_SUMMED) (gemv) when its input is in shared memory (after
// the block barrier) and when thread 0's warp has stored its last unit. rg_trace, a u64 buffer: [0] records per SM
// (cap), [1] SM slots (nsm), SM s's record count at [16 + 16 s] (a line of its own: no contention between SMs),
// its records from [16 + 16 nsm + 8 cap s]. The
// slot is claimed before the wait, so the atomic's latency hides behind it. A block that returns without
// waiting (attention past a row's context) leaves no record. Null (each module's default): nothing is written.
__device__ unsigned long long* rg_trace;
__shared__ unsigned long long* rg_record;  // this block's record (thread 0), for rg_trace_exit
__shared__ unsigned long long rg_entered;  // rg_trace_enter's time (thread 0)

__device__ __forceinline__ unsigned long long rg_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Thread 0: claim this block's record (null when tracing is off, the SM has no slot or its slots are full).
__device__ __forceinline__ unsigned long long* rg_trace_claim() {
    unsigned long long* tr = rg_trace;
    if (tr == nullptr) return nullptr;
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const unsigned long long cap = tr[0], nsm = tr[1];
    if (sm >= nsm) return nullptr;
    const unsigned long long i = atomicAdd(tr + 16 + 16 * sm, 1ull);
    return i < cap ? tr + 16 + 16 * nsm + 8 * (cap * sm + i) : nullptr;
}

__device__ __forceinline__ void rg_trace_put(unsigned long long* r, unsigned long long arrived) {
    const unsigned long long released = rg_globaltimer();
    unsigned long long grid;
    unsigned sm;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    r[0] = grid;
    r[1] = (unsigned long long)sm << 32 | (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    r[2] = arrived;
    r[3] = released;
    r[4] = 0;
    r[5] = 0;
    r[6] = 0;
    r[7] = 0;
}

__device__ __forceinline__ void rg_trace_enter() {
    if (threadIdx.x + threadIdx.y + threadIdx.z == 0) rg_entered = rg_globaltimer();
}

#define RG_STAGED 6
#define RG_SUMMED 7
// Thread 0 stamps its record's field (RG_STAGED, RG_SUMMED) now; a no-op for the other threads and untraced runs.
__device__ __forceinline__ void rg_trace_mark(int field) {
    if (threadIdx.x + threadIdx.y + threadIdx.z == 0 && rg_record != nullptr) rg_record[field] = rg_globaltimer();
}

// The exit time, once every thread of the block got here (one block barrier), and rg_trace_enter's: only for
// kernels whose every thread reaches their end after their wait, and that called rg_trace_enter (gemv).
__device__ __forceinline__ void rg_trace_exit() {
    if (rg_trace == nullptr) return;
    __syncthreads();
    if (threadIdx.x + threadIdx.y + threadIdx.z == 0 && rg_record != nullptr) {
        rg_record[4] = rg_globaltimer();
        rg_record[5] = rg_entered;
    }
}
#endif

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#ifdef RG_TRACE
    const bool tracer = threadIdx.x + threadIdx.y + threadIdx.z == 0;
    const unsigned long long arrived = rg_globaltimer();  // before the claim's three dependent global accesses
    unsigned long long* record = tracer ? rg_trace_claim() : nullptr;
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef RG_TRACE
    if (tracer) {
        rg_record = record;
        if (record != nullptr) rg_trace_put(record, arrived);
    }
#endif
}

__device__ __forceinline__ void pdl_begin() {
    pdl_launch_dependents();
    pdl_wait();
}

// Between pdl_launch_dependents() and pdl_wait() a kernel may read only what no kernel of the step writes:
// weights, and the step's inputs (positions, block tables, tokens), which the host or a kernel of an earlier,
// finished graph launch wrote. Not even an earlier kernel's output is safe: every kernel lets its dependents
// launch before it waits itself, so kernel N + 1 may start while kernel N - 1 still runs. Old KV-cache entries
// are step inputs too: earlier steps wrote them, and the step's only write to a layer's cache is that layer's
// attention appending the new token's slot, which it reads from shared memory, never from the cache. So
// attention may prefetch them (prefetch.global.L2) and, in its PRE instantiations, load the first page of each
// warp before the wait (the slots at and past the new token are masked).

// Prefetch rows [n0, n0 + rows) (clamped to N) x columns [k0, k1) of a row-major bf16 [N, K] matrix into L2,
// one 128-byte line per thread per step.
__device__ __forceinline__ void prefetch_rows_l2(const void* w, int n0, int rows, int N, int K, int k0, int k1) {
    const int lines = ((k1 - k0) * 2 + 127) / 128;
    for (int i = threadIdx.x; i < rows * lines; i += blockDim.x) {
        const int r = i / lines, n = min(n0 + r, N - 1);
        const char* p = (const char*)w + ((size_t)n * K + k0) * 2 + (size_t)(i % lines) * 128;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
}
