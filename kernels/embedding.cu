// embedding.cu: token embedding lookup.
//
// embedding: out[b, :] = table[tokens[b], :]; a token outside [0, V) (e.g. -1 for an inactive row) -> zeros.
//   grid = (B,), block = (128,), shared = 0
//   out    [B, D] bf16      (written)
//   tokens [B]    int32
//   table  [V, D] bf16
//   V, D   int32            (D % 8 == 0)
#include "common.cuh"
#include "pdl.cuh"

extern "C" __global__ void embedding(bf16* __restrict__ out, const int* __restrict__ tokens,
                                     const bf16* __restrict__ table, int V, int D) {
    pdl_begin();
    const int b = blockIdx.x;
    const int tok = tokens[b];
    uint4* dst = reinterpret_cast<uint4*>(out + (size_t)b * D);
    const uint4* src = reinterpret_cast<const uint4*>(table + (size_t)(tok >= 0 && tok < V ? tok : 0) * D);
    const bool valid = tok >= 0 && tok < V;
    for (int i = threadIdx.x; i < D / 8; i += blockDim.x) dst[i] = valid ? src[i] : make_uint4(0, 0, 0, 0);
}
