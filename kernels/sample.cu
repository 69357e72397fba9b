// sample.cu: next-token selection from fp32 logits.
//
// argmax:       tokens[b] = argmax_v logits[b, v] (lowest index on ties; NaN never wins).
// sample:       Gumbel-max temperature sampling: tokens[b] = argmax_v logits[b, v] / temperature + G(b, v),
//               G = -log(-log(u)), u in (0, 1) from a counter-based hash of (seed, step, row b, index v), so a
//               token depends only on those values, never on launch order. temperature <= 0 -> greedy argmax.
//               Reads *seed and *step from device memory; it does not change them.
// advance_step: *step += 1 (launch once after each sample launch, grid = (1,), block = (1,)).
//   argmax/sample: grid = (B,), block = (1024,) (any multiple of 32 up to 1024), shared = 0
//   tokens [B]    int32 (written)
//   logits [B, V] fp32
//   seed   [1]    uint64 (device memory), step [1] int32 (device memory), temperature float32, V int32
//
// The hash (the NumPy equivalent lives in tests/test_kernels_proj.py; keep them in step):
//   mix(z)  = splitmix64 finalizer of z + 0x9E3779B97F4A7C15
//   rowkey  = mix(seed ^ mix((uint64(uint32(step)) << 32) | uint32(b)))
//   r       = mix(rowkey + v)
//   u       = (float(r >> 41) + 0.5f) * 2^-23      (exact in fp32)
#include "common.cuh"
#include <math_constants.h>
#include "pdl.cuh"

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// Block-wide argmax of (value, index) pairs; thread 0 writes the index (0 when every value was NaN).
__device__ __forceinline__ void block_argmax_store(float bv, int bi, int* out) {
    __shared__ float sv[32];
    __shared__ int si[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, bv, o);
        const int i = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(v, i, bv, bi)) { bv = v; bi = i; }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        bv = lane < (int)(blockDim.x >> 5) ? sv[lane] : -CUDART_INF_F;
        bi = lane < (int)(blockDim.x >> 5) ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v = __shfl_xor_sync(0xffffffffu, bv, o);
            const int i = __shfl_xor_sync(0xffffffffu, bi, o);
            if (better(v, i, bv, bi)) { bv = v; bi = i; }
        }
        if (lane == 0) *out = bi == 0x7fffffff ? 0 : bi;
    }
}

#define ROW_UNROLL 8  // float4 loads in flight per thread per pass

// This thread's best (score(v, i), i) over row[0, V): 16-byte loads, ROW_UNROLL of them issued before the first
// is compared (a loop of one dependent scalar load per step made argmax 14.5 us for one 32000-wide row; ncu,
// session 2), or one element at a time when rows are not 16-byte aligned (V % 4 != 0).
template <typename Score>
__device__ __forceinline__ void row_best(const float* __restrict__ row, int V, Score score, float& bv, int& bi) {
    bv = -CUDART_INF_F;
    bi = 0x7fffffff;
    if (V % 4 == 0) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
        const int n4 = V / 4;
        for (int base = threadIdx.x; base < n4; base += blockDim.x * ROW_UNROLL) {
            float4 q[ROW_UNROLL];
#pragma unroll
            for (int u = 0; u < ROW_UNROLL; ++u) {
                const int j = base + u * blockDim.x;
                q[u] = j < n4 ? __ldg(r4 + j) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < ROW_UNROLL; ++u) {
                const int j = base + u * blockDim.x;
                if (j >= n4) break;
                const float e[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    const float v = score(e[t], 4 * j + t);
                    if (better(v, 4 * j + t, bv, bi)) { bv = v; bi = 4 * j + t; }
                }
            }
        }
    } else {
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const float v = score(row[i], i);
            if (better(v, i, bv, bi)) { bv = v; bi = i; }
        }
    }
}

extern "C" __global__ void argmax(int* __restrict__ tokens, const float* __restrict__ logits, int V) {
    pdl_begin();
    float bv;
    int bi;
    row_best(logits + (size_t)blockIdx.x * V, V, [](float v, int) { return v; }, bv, bi);
    block_argmax_store(bv, bi, tokens + blockIdx.x);
}

extern "C" __global__ void sample(int* __restrict__ tokens, const float* __restrict__ logits,
                                  const unsigned long long* __restrict__ seed, const int* __restrict__ step,
                                  float temperature, int V) {
    pdl_begin();
    const int b = blockIdx.x;
    const bool greedy = !(temperature > 0.0f);
    const unsigned long long key =
        mix64(*seed ^ mix64(((unsigned long long)(unsigned)*step << 32) | (unsigned)b));
    auto gumbel = [=](float v, int i) {
        if (greedy) return v;
        const unsigned long long r = mix64(key + (unsigned long long)i);
        const float u = ((float)(r >> 41) + 0.5f) * 1.1920928955078125e-07f;  // 2^-23
        return v / temperature - logf(-logf(u));
    };
    float bv;
    int bi;
    row_best(logits + (size_t)b * V, V, gumbel, bv, bi);
    block_argmax_store(bv, bi, tokens + b);
}

extern "C" __global__ void advance_step(int* step) {
    pdl_begin();
    if (threadIdx.x == 0 && blockIdx.x == 0) *step += 1;
}
