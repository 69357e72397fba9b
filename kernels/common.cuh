// common.cuh: small shared helpers for the decode kernels (bf16 vector load/store, warp and block reductions).
// Included read-only by several kernel files: keep it small and its names stable.
#pragma once
#include <cuda_bf16.h>

typedef __nv_bfloat16 bf16;

// Eight bf16 values (16 bytes) <-> eight floats. `p` must be 16-byte aligned.
// A bf16 is the high half of the float it widens to, so a 32-bit word of two unpacks exactly with one shift (low
// element) and one mask (high): 2 instructions where __bfloat1622float2 compiles to 3 (PRMT + IMAD.U32 for the
// high one; nvdisasm, sm_90): 1b B=1 step 678 -> 646 us (benchmarks/NOTES.md, session 13; session 14 found that
// fewer instructions alone do not explain it).
__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float f[8]) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint4 float_to_bf16x8(const float f[8]) {
    uint4 v;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return v;
}

__device__ __forceinline__ void load_bf16x8(const bf16* p, float f[8]) {
    bf16x8_to_float(*reinterpret_cast<const uint4*>(p), f);
}

__device__ __forceinline__ void store_bf16x8(bf16* p, const float f[8]) {
    *reinterpret_cast<uint4*>(p) = float_to_bf16x8(f);
}

// 16-byte streaming load that bypasses L1 allocation (weights are read once per launch). asm volatile: a plain
// asm statement has no side effects to the compiler, which may then hoist it out of its guard (`ok ? ldg_stream(p)
// : 0`) and load past an array's end (session 14 saw it in a gemv variant with memcheck).
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` is __shared__ float[32]. Fixed reduction order: deterministic run to run.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

// Whether this block is the last of `arrivals` blocks to count on `counter` (block-uniform; every thread calls it,
// after its global writes the last block is to read): the barrier orders the block's writes before thread 0's one
// acq_rel count (the cooperative-groups grid-sync pattern: one fence per block, not per thread), and the other
// blocks' writes before the last block's reads after it. The last block resets the counter to 0 for the next launch.
__device__ __forceinline__ bool last_block_of(int* counter, int arrivals) {
    __shared__ int is_last;
    __syncthreads();
    if (threadIdx.x == 0) {
        int old;
        asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
        is_last = old == arrivals - 1;
        if (is_last) *counter = 0;  // every other block has counted
    }
    __syncthreads();
    return is_last;
}
