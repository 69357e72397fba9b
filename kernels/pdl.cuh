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
// rawgraphs.model.trace). rg_trace is a u64 buffer [2 + 4 * capacity]: [0] counts the records claimed, [1]
// holds the capacity, then records {%gridid, %smid << 32 | linear block index, t0, t1} (%globaltimer, ns):
// pdl_wait writes {arrival at the wait, release from it}, rg_trace_exit {exit, 0}. Thread 0 of the block
// writes; a block that returns without waiting (attention past a row's context) leaves no record. Null (each
// module's default): nothing is written.
__device__ unsigned long long* rg_trace;

__device__ __forceinline__ unsigned long long rg_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void rg_trace_put(unsigned long long* tr, unsigned long long t0, unsigned long long t1) {
    const unsigned long long i = atomicAdd(tr, 1ull);
    if (i >= tr[1]) return;
    unsigned long long grid;
    unsigned sm;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    unsigned long long* r = tr + 2 + 4 * i;
    r[0] = grid;
    r[1] = (unsigned long long)sm << 32 | (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    r[2] = t0;
    r[3] = t1;
}

// The exit record, once every thread of the block got here (one block barrier): only for kernels whose every
// thread reaches their end (gemv).
__device__ __forceinline__ void rg_trace_exit() {
    unsigned long long* tr = rg_trace;
    if (tr == nullptr) return;
    __syncthreads();
    if (threadIdx.x + threadIdx.y + threadIdx.z == 0) rg_trace_put(tr, rg_globaltimer(), 0);
}
#endif

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#ifdef RG_TRACE
    const unsigned long long arrived = rg_globaltimer();
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef RG_TRACE
    if (rg_trace != nullptr && threadIdx.x + threadIdx.y + threadIdx.z == 0)
        rg_trace_put(rg_trace, arrived, rg_globaltimer());
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
// may be prefetched (prefetch.global.L2 only moves lines into L2, which stays coherent with the slot the
// previous kernel appends); they are loaded after the wait.

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
