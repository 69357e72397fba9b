// rope_append: RoPE on q and k of one decode step, and k, v appended to one layer's paged KV cache.
//
// Input is the fused QKV projection output, row b = [q (H*hd) | k (KVH*hd) | v (KVH*hd)]. For an active row
// (positions[b] >= 0):
//   q_out[b, h, :]           = rope(q[b, h, :], pos)      (Hugging Face rotate-half)
//   k_cache[blk, kh, off, :] = rope(k[b, kh, :], pos)     blk = block_tables[b, pos / 16], off = pos % 16
//   v_cache[blk, kh, off, :] = v[b, kh, :]
// An inactive row (positions[b] < 0) writes zeros to q_out[b] and touches no cache slot.
//
// RoPE angles: inv_freq[i] = theta^(-2i/hd) and angle = pos * inv_freq[i] are computed in double, with
// double sin/cos (hd/2 evaluations per row, once, shared by all heads), then rounded to fp32. This matches
// the float64 reference to fp32 rounding at every position; an fp32 product pos * inv_freq alone would carry
// an absolute angle error up to ~2.4e-4 rad at pos 4096 (half an fp32 ulp of 4096), harmless for bf16 but
// free to avoid.
//
// Launch: grid = (B), block = (256), no dynamic shared memory. Requires hd even and hd <= 256.
//
// Arguments:
//   q_out        [B, H, hd]                     bf16 (written)
//   k_cache      [num_blocks, KVH, 16, hd]      bf16 (one slot per active row written)
//   v_cache      [num_blocks, KVH, 16, hd]      bf16 (one slot per active row written)
//   qkv          [B, (H + 2*KVH) * hd]          bf16
//   positions    [B]                            int32 (position of the token being decoded; < 0 = inactive)
//   block_tables [B, max_blocks]                int32
//   max_blocks   row stride of block_tables
//   n_heads H, n_kv_heads KVH, head_dim hd, theta (rope base)

#include <cuda_bf16.h>
#include "pdl.cuh"

#define ROPE_BLOCK_SIZE 16  // tokens per KV-cache block
#define ROPE_MAX_HALF 128   // hd / 2 upper bound (static shared table)
#define ROPE_PAIRS 8        // rotated pairs per thread per pass, all loaded before the first is used

// One block per row. The row's loads are issued before anything waits on them: a pass loads ROPE_PAIRS pairs
// per thread into registers, and v moves in 16-byte pieces; the angle table (double-precision sincos) is
// built before the PDL wait. A loop of dependent scalar loads made this kernel 9 us at B = 1 on the 1b model
// (ncu, session 2); the latency of one round of loads is the floor.
extern "C" __global__ void __launch_bounds__(256)
rope_append(__nv_bfloat16* __restrict__ q_out, __nv_bfloat16* __restrict__ k_cache,
            __nv_bfloat16* __restrict__ v_cache, const __nv_bfloat16* __restrict__ qkv,
            const int* __restrict__ positions, const int* __restrict__ block_tables, int max_blocks,
            int n_heads, int n_kv_heads, int head_dim, float theta) {
    // Before the PDL wait: the step's inputs (position, block table) and the angle table, which depend on
    // nothing a kernel of the step writes (kernels/pdl.cuh), overlap the qkv projection's tail.
    pdl_launch_dependents();
    __shared__ float cos_s[ROPE_MAX_HALF];
    __shared__ float sin_s[ROPE_MAX_HALF];
    const int b = blockIdx.x;
    const int pos = positions[b];
    const int half = head_dim / 2;
    const long long q_row = (long long)b * n_heads * head_dim;

    if (pos < 0) {  // inactive row: zeros out, no cache traffic
        pdl_wait();
        for (int e = threadIdx.x; e < n_heads * head_dim; e += blockDim.x)
            q_out[q_row + e] = __float2bfloat16(0.f);
        return;
    }
    const long long blk = block_tables[(long long)b * max_blocks + pos / ROPE_BLOCK_SIZE];
    const int off = pos % ROPE_BLOCK_SIZE;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const double inv_freq = exp2(-(2.0 * i / head_dim) * log2((double)theta));
        double s, c;
        sincos((double)pos * inv_freq, &s, &c);
        cos_s[i] = (float)c;
        sin_s[i] = (float)s;
    }
    pdl_wait();
    const __nv_bfloat16* x = qkv + (long long)b * (n_heads + 2 * n_kv_heads) * head_dim;
    const int pairs = (n_heads + n_kv_heads) * half;  // rotated pairs (i, i + hd/2) of every q, then k head
    float x0[ROPE_PAIRS], x1[ROPE_PAIRS];
    auto load = [&](int base) {
#pragma unroll
        for (int u = 0; u < ROPE_PAIRS; ++u) {
            const int p = base + u * blockDim.x;
            const int head = p / half, i = p % half;
            x0[u] = p < pairs ? __bfloat162float(x[head * head_dim + i]) : 0.f;
            x1[u] = p < pairs ? __bfloat162float(x[head * head_dim + i + half]) : 0.f;
        }
    };
    load(threadIdx.x);
    __syncthreads();  // the angle table

    for (int base = threadIdx.x; base < pairs; base += blockDim.x * ROPE_PAIRS) {
        if (base != threadIdx.x) load(base);
#pragma unroll
        for (int u = 0; u < ROPE_PAIRS; ++u) {
            const int p = base + u * blockDim.x;
            if (p >= pairs) break;
            const int head = p / half, i = p % half;
            const float c = cos_s[i], s = sin_s[i];
            __nv_bfloat16* dst = head < n_heads
                ? q_out + q_row + (long long)head * head_dim
                : k_cache + ((blk * n_kv_heads + (head - n_heads)) * ROPE_BLOCK_SIZE + off) * head_dim;
            dst[i] = __float2bfloat16(x0[u] * c - x1[u] * s);
            dst[i + half] = __float2bfloat16(x1[u] * c + x0[u] * s);
        }
    }
    // v is copied as is: 16-byte pieces when a head is a whole number of them (every pointer here is
    // 16-byte aligned then), else element by element.
    const __nv_bfloat16* v = x + (n_heads + n_kv_heads) * head_dim;
    const int vec = head_dim % 8 == 0 ? 8 : 1;
    for (int e = threadIdx.x * vec; e < n_kv_heads * head_dim; e += blockDim.x * vec) {
        const int kh = e / head_dim, d = e % head_dim;
        __nv_bfloat16* dst = v_cache + ((blk * n_kv_heads + kh) * ROPE_BLOCK_SIZE + off) * head_dim + d;
        if (vec == 8) *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v + e);
        else *dst = v[e];
    }
}
