// silu_mul.cu: SwiGLU activation of the fused gate/up projection.
//
// silu_mul: out[b, f] = silu(gu[b, f]) * gu[b, F + f], silu(g) = g / (1 + exp(-g)); fp32 math, bf16 out.
//   grid = (ceil(F / 8 / 256), B), block = (256,), shared = 0
//   out [B, F]  bf16 (written)
//   gu  [B, 2F] bf16 (gate columns, then up columns)
//   F int32 (F % 8 == 0)
#include "common.cuh"
#include "pdl.cuh"

extern "C" __global__ void silu_mul(bf16* __restrict__ out, const bf16* __restrict__ gu, int F) {
    pdl_begin();
    const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= F) return;
    const size_t b = blockIdx.y;
    float g[8], u[8];
    load_bf16x8(gu + b * 2 * F + i, g);
    load_bf16x8(gu + b * 2 * F + F + i, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    store_bf16x8(out + b * F + i, g);
}
