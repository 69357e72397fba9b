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

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
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
