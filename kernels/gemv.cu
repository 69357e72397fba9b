// gemv.cu: decode projections y[B, N] = x[B, K] @ W[N, K]^T, bf16 weights and activations, fp32 accumulation.
// Launch shapes are chosen by rawgraphs/model/plans.py (gemv_plan); read it before launching by hand.
//
// mode selects the output (every kernel here takes it):
//   0 OUT_BF16      y bf16 [B, N]            y = x @ W^T
//   1 OUT_RESIDUAL  y bf16 [B, N] in place   y = y + x @ W^T   (residual add fused: o_proj, down_proj)
//   2 OUT_F32       y fp32 [B, N]            y = x @ W^T       (LM head logits)
//   3 OUT_PARTIAL   y fp32 [splits, B, N]    y[s] = partial sum over split s's K range (split-K of gemv:
//                                            splitk_reduce then sums the splits in order and applies 0/1/2/4;
//                                            gemv_mma and gemm_tc merge their splits in the kernel instead)
//   4 OUT_SILU      y bf16 [B, N / 2]        the SwiGLU of a fused gate/up projection: weight rows n (gate) and
//                                            n + N/2 (up) are computed together and y[b, n] = bf16(silu(g) * u)
//                                            with g, u rounded to bf16 first (what OUT_BF16 would store, then
//                                            silu_mul.cu's math), so silu runs once per element, not once per
//                                            block of the down projection that reads it. N even.
//
// Kernels (gemv_plan picks one by B; each but gemv_unit is correct for every B, and tests check each at every B):
// gemv (B = 1): one-wave weight-streaming GEMV on CUDA cores (see "gemv:" below). Groups of `parts` warps own
//   whole weight rows and stream them through per-warp cp.async rings in shared memory, the first ring's
//   worth issued before the PDL wait; x (after x_op) is staged once per block. A larger B runs one pass per
//   batch row.
//   grid = (blocks, splits) (any count: warp groups stride over the rows), block = (32 * warps,) (warps <= 8,
//   a multiple of parts), dynamic shared >= warps * (PIPE_STAGES * 512 + 64) + 2 * k_chunk bytes;
//   extra argument parts int32 (1, 2, 4, 8): warps per row (OUT_SILU: per gate/up row pair). B = 1 with parts = 1
//   and one K range (the decode step's projections, but small's o and down) runs the unit stream (gemv_unit_body):
//   the same units in the same order and the same output bytes as the general body.
// gemv_unit (B = 1 where the plan is the unit stream: every B = 1 projection of the decode step): that unit stream and
//   nothing else (see "gemv_unit" below); gemv's grid, block, shared memory and arguments.
// gemv_rows2 / gemv_rows3 (B = 2, and B = 3 for K >= 2048, where B = 1 would run the unit stream and the B x rows
//   fit): gemv's unit stream for all B rows at once, each weight chunk read once (see "gemv_rows2 / gemv_rows3:"
//   below); gemv's grid, block, shared memory and arguments.
// gemv_mma / gemv_mma16 / gemv_mma32 (2 <= B <= 16 otherwise, B <= 3 for N * K >= 2048^2 less gemm_tc_narrow's;
//   8 / 16 / 32 batch rows a pass, each correct for any B; the plans take the narrowest that holds B in one pass):
//   GEMV on tensor cores, W streamed from global memory straight into mma.sync A fragments (8 x 16-byte loads in
//   flight per lane), x^T as the B operand. Below, "gemv_mma" names all three.
//   grid = (ceil(N / 16), splits), block = (256,) exactly, shared = 0 or unused (static arrays); OUT_SILU: a block owns
//   8 gate rows and their 8 up rows (same grid). splits > 1 (but mode OUT_PARTIAL): the blocks write their sums to
//   partial fp32 [splits, B, N] (OUT_PARTIAL's layout) and the last of a row block's splits to finish adds them in
//   split order and stores y (splitk_reduce's bits, without its launch); extra arguments partial and counters int32
//   [ceil(N / 16)] (zeros before the first launch, zeros again after each), may be null when splits == 1.
// gemm_tc (B > 16; gemm_tc_narrow below): tiled skinny GEMM on tensor cores (mma.sync m16n8k16 bf16, fp32
//   accumulate). A block owns a 64 (batch; 32 when B <= 32) x 64 (weight rows) tile and one K range; 64-wide K
//   tiles of x and W stream through a TC_STAGES-deep (TC_STAGES32 at 32-row tiles) cp.async pipeline in shared
//   memory (the first W tiles issued before the PDL wait; X_RMSNORM applied in place to each landed x tile).
//   grid = (ceil(B / 64), ceil(N / 64), splits), block = (256,) exactly, dynamic shared >= TC_SHARED bytes (55296;
//   more only to cap blocks per SM); OUT_SILU: a tile holds 32 gate rows and their 32 up rows (same grid).
//   splits > 1 (but mode OUT_PARTIAL): the last of a tile's blocks sums the splits' fp32 tiles and applies mode
//   itself, as gemv_mma does (tc_merge_splits); extra arguments partial fp32 [tiles * splits * 64 * 64] and counters
//   int32 [tiles] (tiles = ceil(B / 64) * ceil(N / 64); zeros before the first launch, zeros again after each),
//   may be null when splits == 1.
// gemm_tc_narrow (4 <= B <= 16 for N * K >= 2048^2, and B = 3 where K >= 2048 but gemv_rows3 can't hold the rows):
//   gemm_tc with 32-row tiles for every B (grid = (ceil(B / 32), ceil(N / 64), splits)), a split merge that stages
//   only the batch rows in shared memory, and the first x tiles issued before X_RMSNORM's row sums (see
//   "gemm_tc_narrow:" below). gemm_tc's arguments.
// splitk_reduce: y = epilogue(sum_{s < splits} partial[s]) in fixed order (bit-identical run to run).
//   grid = (ceil(B * N / 256),) (OUT_SILU: ceil(B * N / 2 / 256)), block = (256,), shared = 0
// rms_input: X_RMSNORM's input rows, once, for gemm_tc to multiply as stored (see "rms_input:" below).
//
// x_op selects the input the projection multiplies (gemv, gemv_mma, gemm_tc; fuses the kernel before it):
//   0 X_PLAIN    x [B, K] bf16 as stored
//   1 X_RMSNORM  x [B, K] bf16, input = bf16(x * inv_rms(x[b]) * norm)  (rmsnorm.cu's math and rounding;
//                                                   every block computes its batch rows' inv_rms over all of K)
//
// Inactive rows: positions int32 [B] (may be null: every row active); a row with positions[b] < 0 reads no
//   input: OUT_BF16 / OUT_F32 / OUT_SILU store zeros for it, OUT_RESIDUAL leaves y as it is, OUT_PARTIAL writes nothing
//   (splitk_reduce and the in-kernel merges, given the same positions, skip the row too). Padding rows of a captured
//   batch cost no reads.
//
// Arguments: y (see mode), x (see x_op) bf16, w [N, K] bf16, norm [K] bf16 (X_RMSNORM; else may be null),
//   positions int32 [B] (may be null), B, N, K int32 (K % 8 == 0, pointers 16-byte aligned), k_chunk int32:
//   K elements per split (a multiple of 8; split s covers [s * k_chunk, min(K, (s + 1) * k_chunk))), mode int32,
//   eps float (X_RMSNORM), x_op int32.
//   splitk_reduce: partial [splits, B, N] fp32, positions, B, N, splits int32, mode 0/1/2/4.
#include "common.cuh"
#include "pdl.cuh"

#define OUT_BF16 0
#define OUT_RESIDUAL 1
#define OUT_F32 2
#define OUT_PARTIAL 3
#define OUT_SILU 4

#define X_PLAIN 0
#define X_RMSNORM 1

// gemv_mma: 32-wide K slabs in flight per lane (2 x 16 bytes each). 4 fit in 80 registers, so 3 blocks share an
// SM (__launch_bounds__(256, 3)); 8 needed 123 (2 blocks per SM). 1b B = 8 graph 1.42 -> 1.26 ms: qkv (384 blocks),
// gate_up (704) and the LM head (2000) run in fewer waves. small B = 8 went 0.34 -> 0.36 ms by the occupancy, not
// the depth: plans.py caps such grids at 2 blocks per SM again (two_per_sm). Also measured: 2 slabs at 4 blocks
// per SM (1.27 ms), 4 slabs at 2 (1.30 ms). H200 A/B tables: benchmarks/NOTES.md, sessions 10, 11. Staging x in
// shared memory lost (1.47-1.52 ms): x's loads inside the MMA loop are not what limits B = 8.
#define GEMV_MMA_UNROLL 4

// Write one output element; `split` selects the partial slab for OUT_PARTIAL.
__device__ __forceinline__ void store_out(void* y, int mode, int split, int B, int N, int b, int n, float v) {
    const size_t i = (size_t)b * N + n;
    if (mode == OUT_BF16) {
        static_cast<bf16*>(y)[i] = __float2bfloat16(v);
    } else if (mode == OUT_RESIDUAL) {
        bf16* r = static_cast<bf16*>(y);
        r[i] = __float2bfloat16(__bfloat162float(r[i]) + v);
    } else if (mode == OUT_F32) {
        static_cast<float*>(y)[i] = v;
    } else {
        static_cast<float*>(y)[(size_t)split * B * N + i] = v;
    }
}

__device__ __forceinline__ bool row_active(const int* __restrict__ positions, int b) {
    return positions == nullptr || __ldg(positions + b) >= 0;
}

// store_out for a row that may be inactive: zeros for OUT_BF16 / OUT_F32, nothing for OUT_RESIDUAL / OUT_PARTIAL.
__device__ __forceinline__ void store_row(void* y, int mode, int split, int B, int N, int b, int n, float v,
                                          bool active) {
    if (active) store_out(y, mode, split, B, N, b, n, v);
    else if (mode == OUT_BF16 || mode == OUT_F32) store_out(y, mode, split, B, N, b, n, 0.0f);
}

// OUT_SILU's value for the sums g (gate row) and u (its up row): silu_mul.cu's math on their bf16 roundings.
__device__ __forceinline__ float silu_of(float g, float u) {
    g = __bfloat162float(__float2bfloat16(g));
    u = __bfloat162float(__float2bfloat16(u));
    return g / (1.0f + expf(-g)) * u;
}

// OUT_SILU's store: y[b, n] of bf16 [B, P] from the sums g (weight row n) and u (row n + P).
__device__ __forceinline__ void store_silu(void* y, int P, int b, int n, float g, float u, bool active) {
    static_cast<bf16*>(y)[(size_t)b * P + n] = __float2bfloat16(active ? silu_of(g, u) : 0.0f);
}

// Output n of batch row b: store_row, or for OUT_SILU the pair (g, u) of weight rows n and n + N/2.
__device__ __forceinline__ void store_unit(void* y, int mode, int split, int B, int N, int b, int n, float g,
                                           float u, bool active) {
    if (mode == OUT_SILU) store_silu(y, N / 2, b, n, g, u, active);
    else store_row(y, mode, split, B, N, b, n, g, active);
}

// A split's sums for output n of row b into partial [splits, B, N] (OUT_PARTIAL's layout; OUT_SILU's pair: g at
// n, u at n + half), for reduce_unit; inactive rows write nothing.
__device__ __forceinline__ void store_split(float* partial, int split, int B, int N, int b, int n, int half, float g,
                                            float u, bool active) {
    if (!active) return;
    store_out(partial, OUT_PARTIAL, split, B, N, b, n, g);
    if (half) store_out(partial, OUT_PARTIAL, split, B, N, b, n + half, u);
}

// Output n of row b (mode; OUT_SILU: the pair n, n + N/2) from the splits' sums in partial [splits, B, N], added in
// split order (bit-identical run to run). L2 loads (__ldcg): a merging block reads what its launch's blocks wrote.
// OUT_RESIDUAL's y is loaded before the sums, so its round trip overlaps theirs (store_out's bits).
__device__ __forceinline__ void reduce_unit(void* y, const float* __restrict__ partial, int B, int N, int splits,
                                            int mode, int b, int n, bool active) {
    const size_t total = (size_t)B * N, i = (size_t)b * N + n;
    bf16* r = static_cast<bf16*>(y) + i;
    const float prior = mode == OUT_RESIDUAL && active ? __bfloat162float(*r) : 0.0f;
    const float* p = partial + i;
    float s = 0.0f, u = 0.0f;
#pragma unroll 4
    for (int k = 0; active && k < splits; ++k) s += __ldcg(p + k * total);
#pragma unroll 4
    for (int k = 0; active && mode == OUT_SILU && k < splits; ++k) u += __ldcg(p + k * total + N / 2);
    if (mode != OUT_RESIDUAL) store_unit(y, mode, 0, B, N, b, n, s, u, active);
    else if (active) *r = __float2bfloat16(prior + s);
}

// How a tile of `tile` weight rows maps to outputs. OUT_SILU: its first tile / 2 rows are gate rows and the rest
// their up rows, `half` = N / 2 rows further on; `rows` = N / 2 outputs per batch row, `outs` = tile / 2 per tile.
struct TileRows {
    int half, rows, outs;
};
__device__ __forceinline__ TileRows tile_rows(int mode, int N, int tile) {
    const int half = mode == OUT_SILU ? N / 2 : 0;
    return {half, half ? half : N, half ? tile / 2 : tile};
}

// X_RMSNORM of eight input elements: bf16(x * inv * g), rmsnorm.cu's math and rounding (gv: the 8 norm weights).
__device__ __forceinline__ uint4 rmsnorm_x8(const uint4& v, const uint4& gv, float inv) {
    float f[8], g[8];
    bf16x8_to_float(v, f);
    bf16x8_to_float(gv, g);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = f[j] * inv * g[j];
    return float_to_bf16x8(f);
}

// Eight input elements [k, k + 8) of batch row b, transformed by x_op (inv: the row's inverse RMS, X_RMSNORM).
__device__ __forceinline__ uint4 load_x8(const bf16* __restrict__ x, const bf16* __restrict__ norm, int x_op,
                                         float inv, int b, int K, int k) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(x + (size_t)b * K + k));
    if (x_op == X_PLAIN) return v;
    float f[8], g[8];  // rmsnorm_x8, spelled out: its order keeps gemv_mma's and gemm_tc's SASS as it was
    bf16x8_to_float(v, f);
    bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(norm + k)), g);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = f[j] * inv * g[j];
    return float_to_bf16x8(f);
}

// ss plus the squares of eight bf16 elements, in order.
__device__ __forceinline__ float sumsq8(const uint4& v, float ss) {
    float f[8];
    bf16x8_to_float(v, f);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
    return ss;
}

// Sum of squares of this lane's share of row x[b, 0:K) (lanes of `lanes` threads starting at index `t`).
__device__ __forceinline__ float row_sumsq(const bf16* __restrict__ x, int b, int K, int t, int lanes) {
    float ss = 0.0f;
    for (int i = t * 8; i < K; i += lanes * 8)
        ss = sumsq8(__ldg(reinterpret_cast<const uint4*>(x + (size_t)b * K + i)), ss);
    return ss;
}

// row_sumsq for a warp (lanes 0-31), with eight of a lane's loads issued before their squares are added: a warp's
// pass over a long row waits one L2 round trip per 8 loads instead of one per load (K = 2048: 8 loads a lane). The
// same sums in the same order as row_sumsq(x, b, K, lane, 32). Not merged into row_sumsq: that changed the SASS of
// gemv and gemv_rows2/3 (stage_x, the B = 1-3 path), whose loop runs once per thread at K = 2048.
// BATCHED: a short last group's loads are issued together too (zeros past the row: fmaf(0, 0, ss) == ss, the same
// sums), where the loop of single loads after the groups runs serially, one round trip a load (small's K = 768: 3 a
// lane, nvdisasm of rms_input): gemv_mma and rms_input. gemm_tc and gemm_tc_narrow keep that loop (their SASS
// unchanged): the batched one cost gemm_tc 1b B = 64 1.4% though never run there (x_op is plain above 16 rows), and
// gemm_tc_narrow 1b B = 16 0.5% (H100, sessions 41 and 42, branches rowsum-batched and rowsum-batched2).
// Measured (H100, graph step at context 512, A/B, three rounds, session 42): small B = 3 / 4 / 8 / 16 / 24 / 64 / 128
// -2.5 / -1.5 / -2.2 / -1.6 / -0.8 / -0.5 / -0.3%, 1b B = 3 / 4 -0.8 / -0.3%, 1b B = 8-128 within +0.2%.
template <bool BATCHED>
__device__ __forceinline__ float warp_row_sumsq(const bf16* __restrict__ x, int b, int K, int lane) {
    const uint4* row = reinterpret_cast<const uint4*>(x + (size_t)b * K);
    const int n = K / 8;  // 16-byte loads in the row
    float ss = 0.0f;
    int i = lane;
    for (; i + 7 * 32 < n || BATCHED && i < n; i += 8 * 32) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u)
            v[u] = !BATCHED || i + u * 32 < n ? __ldg(row + i + u * 32) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 8; ++u) ss = sumsq8(v[u], ss);
    }
    for (; i < n; i += 32) ss = sumsq8(__ldg(row + i), ss);  // !BATCHED: the last loads, one at a time
    return ss;
}

// The input scale of rows b0 + r, r < rows, in two steps. rows_active: scale_s[r] = 1 for an active row
// (r < nb), 0 otherwise (read as zeros); one thread per row, no barrier, and it reads only positions, so it
// runs before the PDL wait (pdl.cuh) and its latency hides behind the previous kernel.
__device__ __forceinline__ void rows_active(float* scale_s, const int* __restrict__ positions, int b0, int nb,
                                            int rows) {
    for (int r = threadIdx.x; r < rows; r += blockDim.x)
        scale_s[r] = r < nb && row_active(positions, b0 + r) ? 1.0f : 0.0f;
}

// rows_scale, after rows_active and the PDL wait: X_RMSNORM turns each active row's 1 into
// 1 / sqrt(mean(x[b0 + r]^2) + eps) (> 0), one warp per row in a fixed order (deterministic). Barriers around.
template <bool BATCHED>
__device__ __forceinline__ void rows_scale(float* scale_s, const bf16* __restrict__ x, int x_op, int b0, int rows,
                                           int K, float eps) {
    __syncthreads();
    if (x_op != X_RMSNORM) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int r = warp; r < rows; r += nwarps) {
        if (scale_s[r] == 0.0f) continue;  // warp-uniform
        const float ss = warp_sum(warp_row_sumsq<BATCHED>(x, b0 + r, K, lane));
        __syncwarp();  // every lane's read of scale_s[r] above is ordered before lane 0 overwrites it (racecheck)
        if (lane == 0) scale_s[r] = rsqrtf(ss / (float)K + eps);
    }
    __syncthreads();
}

#define TC_M 64
#define TC_N 64
#define TC_K 64
#define TC_LD (TC_K + 8)  // padded row (144 bytes): fragment loads hit 32 distinct banks
#define TC_LDC (TC_N + 4)
#define TC_THREADS 256  // gemm_tc's block: 8 warps
// gemm_tc's pipeline: TC_STAGES K tiles of x and W in flight per block through cp.async (TC_STAGES - 1 ahead of
// the tile being multiplied), in dynamic shared memory (TC_SHARED bytes at least: plans.py's TC_SHARED). 32-row
// tiles take TC_STAGES32 stages in the same bytes: their x tile is half the size.
#define TC_STAGES 3
#define TC_STAGES32 4
#define TC_TILE_ELEMS (TC_M * TC_LD)  // one operand tile, padded rows
#define TC_SHARED (TC_STAGES * 2 * TC_TILE_ELEMS * 2)

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Wait until at most `n` of this thread's committed cp.async groups are pending.
template <int n>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(n) : "memory"); }

// cp.async of 16 bytes, or 16 zero bytes where !ok (src-size 0: nothing is read; src stays a valid address).
__device__ __forceinline__ void cp_async16_or_zero(void* dst, const void* src, bool ok) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(ok ? 16 : 0) : "memory");
}

// A thread's cp.async share of one operand tile, C chunks of 16 bytes: chunk i is tile row threadIdx.x / 8 + 32 i,
// columns 8 (threadIdx.x % 8) .. + 7 of the K tile (x_tile_norm's map too). A chunk's source row and whether it exists
// hold for the block's whole K range, so they are worked out once and a tile's copy only adds its K offset. Worked out
// per tile (row, SiLU pairing, 64-bit products, clipping), the main loop took ~150 SASS instructions a tile around
// its 28 ldmatrix / MMA; now ~115 (plain x, NVRTC 13.0, session 21). H200, graph step at context 512 (session 22):
// B = 17-32 (32-row tiles) 1.1-1.9% faster, B = 64-256 0.0-0.7% slower (64-row tiles hold 4 pointers: an 8-byte
// spill outside the loop on NVRTC 13.0). 32-bit offsets from the operand's base, or one pointer plus a block-uniform
// stride, kept the registers but not the saving (whole loop body 256 -> 251-252 instructions at TM = 64, 183 ->
// 172-174 at TM = 32, against 226 / 149 with pointers); the offsets, measured, gained B = 17-32 only 0.1-0.6%.
template <int C>
struct TileCopy {
    const bf16* src[C];  // the chunk's row at column k0 + 8 (threadIdx.x % 8), or the operand's base where !ok
    bool ok[C];          // the row exists (W: inside the weight; x: an active batch row)
    int col;             // the chunk's column at tile 0, k0 + 8 (threadIdx.x % 8)
};

// W rows [row0, row0 + 64) of w[rows, K] (half > 0, OUT_SILU: tile rows r < 32 are gate rows row0 + r, rows r >= 32
// the matching up rows half + row0 + r - 32; rows = half), from column k0.
__device__ __forceinline__ TileCopy<TC_M * 8 / TC_THREADS> w_tile_copy(const bf16* w, int row0, int rows, int half,
                                                                      int K, int k0) {
    TileCopy<TC_M * 8 / TC_THREADS> tc;
    tc.col = k0 + (threadIdx.x % 8) * 8;
#pragma unroll
    for (int i = 0; i < TC_M * 8 / TC_THREADS; ++i) {
        const int r = threadIdx.x / 8 + 32 * i;
        const int n = row0 + (half ? r % 32 : r), row = n + (half && r >= 32 ? half : 0);
        tc.ok[i] = n < rows;
        tc.src[i] = tc.ok[i] ? w + (size_t)row * K + tc.col : w;
    }
    return tc;
}

// x rows [row0, row0 + TM), as stored; rows whose scale sc[i] is 0 (inactive, or past B) are not read.
template <int TM>
__device__ __forceinline__ TileCopy<TM * 8 / TC_THREADS> x_tile_copy(const bf16* x, const float* sc, int row0, int K,
                                                                    int k0) {
    TileCopy<TM * 8 / TC_THREADS> tc;
    tc.col = k0 + (threadIdx.x % 8) * 8;
#pragma unroll
    for (int i = 0; i < TM * 8 / TC_THREADS; ++i) {
        tc.ok[i] = sc[i] != 0.0f;
        tc.src[i] = tc.ok[i] ? x + (size_t)(row0 + threadIdx.x / 8 + 32 * i) * K + tc.col : x;
    }
    return tc;
}

// cp.async K tile t of a TileCopy into dst ([rows][TC_LD]): rows that do not exist and columns past k1 are zeros.
template <int C>
__device__ __forceinline__ void tile_async(bf16* dst, const TileCopy<C>& tc, int t, int k1) {
    const bool col_ok = tc.col + t * TC_K < k1;
    bf16* d = dst + (threadIdx.x / 8) * TC_LD + (threadIdx.x % 8) * 8;
#pragma unroll
    for (int i = 0; i < C; ++i) {
        const bool ok = tc.ok[i] && col_ok;
        cp_async16_or_zero(d + 32 * i * TC_LD, ok ? tc.src[i] + t * TC_K : tc.src[i], ok);
    }
}

// X_RMSNORM on this thread's own chunks of a landed x tile (g: the 8 norm weights of its column).
template <int TM>
__device__ __forceinline__ void x_tile_norm(bf16* xs, const float sc[TM * 8 / TC_THREADS], const uint4& g) {
#pragma unroll
    for (int i = 0; i < TM * 8 / TC_THREADS; ++i) {
        const int c = threadIdx.x + i * TC_THREADS;
        uint4* p = reinterpret_cast<uint4*>(xs + (c / 8) * TC_LD + (c % 8) * 8);
        if (sc[i] != 0.0f) *p = rmsnorm_x8(*p, g, sc[i]);
    }
}

// D[16x8] += A[16x16] (row-major) * B[16x8] (col-major), bf16 in, fp32 accumulate (PTX ISA: mma.m16n8k16).
__device__ __forceinline__ void mma_bf16_16816(float d[4], const unsigned a[4], const unsigned b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8 x 8 bf16 matrices from shared memory, one row address per lane (lanes 8m..8m+7: rows of matrix m); lane
// (g, t) gets row g, columns 2t, 2t + 1 of each (PTX ISA: ldmatrix): the mma.m16n8k16 fragment layout.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const bf16* row) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

// rms_input: h[b] = X_RMSNORM's input row, bf16(x[b] * inv_rms(x[b]) * norm), for each active row (positions[b] >= 0
// or positions null; other rows are not written): gemm_tc then multiplies h as stored (X_PLAIN) instead of every
// block of its grid computing the rows' scales (each read all 64 rows x K of x from L2 for them: at B = 64 and
// K = 2048, 256 KB per block) and normalising each x tile it loads; plans.py launches it from B = 17
// (RMS_INPUT_MIN_B: below it the extra launch cost more than the blocks' scales). One warp per row, with rows_scale's
// sum and rmsnorm_x8's rounding: the same bits gemm_tc's X_RMSNORM multiplies (rmsnorm.cu's kernel sums a row over a
// block in another order and takes no positions, so it is not used here). grid = (ceil(B / 4),), block = (128,).
// Arguments: h bf16 [B, K], x bf16 [B, K], norm bf16 [K], positions int32 [B] (may be null), B, K, eps.
extern "C" __global__ void __launch_bounds__(128) rms_input(bf16* __restrict__ h, const bf16* __restrict__ x,
                                                            const bf16* __restrict__ norm,
                                                            const int* __restrict__ positions, int B, int K,
                                                            float eps) {
    const int b = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const bool on = b < B && row_active(positions, b);  // before the wait (pdl.cuh)
    pdl_begin();
    if (!on) return;
    const float inv = rsqrtf(warp_sum(warp_row_sumsq<true>(x, b, K, lane)) / (float)K + eps);
    const uint4* row = reinterpret_cast<const uint4*>(x + (size_t)b * K);
    uint4* out = reinterpret_cast<uint4*>(h + (size_t)b * K);
    for (int i = lane; i < K / 8; i += 32)
        out[i] = rmsnorm_x8(__ldg(row + i), __ldg(reinterpret_cast<const uint4*>(norm) + i), inv);
}

// gemm_tc's split K, merged by the tile's last block instead of a splitk_reduce launch after it: every block
// stores its TM x 64 fp32 sums (cs, [TM][TC_LDC] in shared memory) to its slab of partial ([tiles][splits][TM][64],
// tile = blockIdx.y * gridDim.x + blockIdx.x) and counts itself in counters[tile] (one acq_rel atomic after a
// barrier: attention's fused combine); the last block to count resets the counter to 0 for the next launch and
// sums the tile's slabs in split order (0.0f + s0 + s1 + ...: splitk_reduce's order and bits) into cs. Returns
// whether this block is that last one (block-uniform) and so stores the outputs.
// NARROW (gemm_tc_narrow): only the slab rows that hold batch rows (mrows of them) are stored, and the last block
// copies as many slabs' rows as fit in the pipeline's free shared memory past cs with cp.async, all in flight at
// once (every split of a 1b projection's tile in one round at B <= 16), before adding them there: one L2 round trip
// a round instead of one per two slabs, the merge being on the launch's critical path (its last tile). Not in
// gemm_tc: there the same code (executed or not) cost B = 24-64 1-4% (H100, session 41).
template <int TM, bool NARROW>
__device__ __forceinline__ bool tc_merge_splits(float* cs, float* __restrict__ partial, int* __restrict__ counters,
                                                int mrows) {
    constexpr int QUADS = TM * TC_N / 4, PER = QUADS / TC_THREADS;  // float4s per slab, per thread
    constexpr int ROOM = (TC_SHARED - TM * TC_LDC * 4) / 16;         // NARROW: float4s of staging past cs
    const int tile = blockIdx.y * gridDim.x + blockIdx.x, splits = gridDim.z;
    const int q = mrows * (TC_N / 4);  // NARROW: float4s of a slab that are stored and summed
    float4* slabs = reinterpret_cast<float4*>(partial) + (size_t)tile * splits * QUADS;
    // thread t owns float4s e = t + TC_THREADS i: row e / 16, columns 4 (e % 16) .. + 3 of cs
    auto at = [cs](int e) { return reinterpret_cast<float4*>(cs + (e / (TC_N / 4)) * TC_LDC + (e % (TC_N / 4)) * 4); };
    float4* mine = slabs + (size_t)blockIdx.z * QUADS;  // this split's slab
#pragma unroll
    for (int i = 0; i < PER; ++i)  // NARROW: only the rows that hold batch rows
        if (!NARROW || threadIdx.x + i * TC_THREADS < q)
            __stcg(mine + threadIdx.x + i * TC_THREADS, *at(threadIdx.x + i * TC_THREADS));
    if (!last_block_of(counters + tile, splits)) return false;
    float4 v[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (NARROW) {
        float4* staged = reinterpret_cast<float4*>(cs + TM * TC_LDC);  // [per_round][q]
        const int per_round = max(1, ROOM / q);
        for (int s0 = 0; s0 < splits; s0 += per_round) {
            const int n = min(per_round, splits - s0);
            for (int s = 0; s < n; ++s)  // cp.async.cg: from L2, where the other blocks wrote
                for (int e = threadIdx.x; e < q; e += TC_THREADS)
                    cp_async16(staged + s * q + e, slabs + (size_t)(s0 + s) * QUADS + e);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
#pragma unroll
            for (int i = 0; i < PER; ++i) {
                const int e = threadIdx.x + i * TC_THREADS;
                if (e >= q) continue;
#pragma unroll 4
                for (int s = 0; s < n; ++s) {
                    const float4 p = staged[s * q + e];
                    v[i].x += p.x, v[i].y += p.y, v[i].z += p.z, v[i].w += p.w;
                }
            }
            __syncthreads();  // the staging is refilled next round
        }
    } else {
#pragma unroll 2
        for (int s = 0; s < splits; ++s) {  // 2 x PER independent L2 loads (__ldcg: other blocks wrote them) in flight
#pragma unroll
            for (int i = 0; i < PER; ++i) {
                const float4 p = __ldcg(slabs + (size_t)s * QUADS + threadIdx.x + i * TC_THREADS);
                v[i].x += p.x, v[i].y += p.y, v[i].z += p.z, v[i].w += p.w;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < PER; ++i)  // NARROW: rows past the batch keep this block's own sums, never stored
        if (!NARROW || threadIdx.x + i * TC_THREADS < q) *at(threadIdx.x + i * TC_THREADS) = v[i];
    __syncthreads();
    return true;
}

// gemm_tc's stores from cs ([TM][TC_LDC] fp32 sums; OUT_SILU: g in column n, u in n + outs). Thread t owns the
// 8-output chunks t + TC_THREADS i of the tile (row c / (outs / 8)) and stores each with one 16-byte store (two for
// fp32); OUT_RESIDUAL's loads of y for all its chunks are issued before any add: one L2 round trip a thread, where
// one per output made a split tile's merge (above) 2-3x dearer than splitk_reduce's launch. Chunks past B or rows, y
// rows that are not 16-byte aligned and OUT_PARTIAL go element by element (store_unit); the bits are the same.
template <int TM>
__device__ __forceinline__ void tc_store(void* y, const float* cs, const float* scale_s, int mode, int B, int N,
                                         int m0, int n0, const TileRows& tr) {
    constexpr int MAXC = TM * TC_N / 8 / TC_THREADS;  // chunks a thread at most
    const int per_row = tr.outs / 8, chunks = TM * per_row, ld = tr.half ? tr.half : N;  // ld: y's row
    const bool aligned = ld % 8 == 0 && mode != OUT_PARTIAL;
    uint4 res[MAXC];
#pragma unroll
    for (int i = 0; i < MAXC; ++i) {
        const int c = threadIdx.x + i * TC_THREADS, m = c / per_row, n = (c % per_row) * 8;
        res[i] = make_uint4(0, 0, 0, 0);
        if (mode == OUT_RESIDUAL && aligned && c < chunks && m0 + m < B && n0 + n + 8 <= tr.rows && scale_s[m] != 0.0f)
            res[i] = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(y) + (size_t)(m0 + m) * ld + n0 + n);
    }
#pragma unroll
    for (int i = 0; i < MAXC; ++i) {
        const int c = threadIdx.x + i * TC_THREADS, m = c / per_row, n = (c % per_row) * 8;
        if (c >= chunks || m0 + m >= B) continue;
        const float* v = cs + m * TC_LDC + n;
        const bool on = scale_s[m] != 0.0f;
        if (!aligned || n0 + n + 8 > tr.rows) {
            for (int j = 0; j < 8 && n0 + n + j < tr.rows; ++j)
                store_unit(y, mode, blockIdx.z, B, N, m0 + m, n0 + n + j, v[j], tr.half ? v[j + tr.outs] : 0.0f, on);
            continue;
        }
        const size_t at = (size_t)(m0 + m) * ld + n0 + n;
        float f[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = on ? (mode == OUT_SILU ? silu_of(v[j], v[j + tr.outs]) : v[j]) : 0.0f;
        if (mode == OUT_F32) {
            float4* o = reinterpret_cast<float4*>(static_cast<float*>(y) + at);
            o[0] = make_float4(f[0], f[1], f[2], f[3]);
            o[1] = make_float4(f[4], f[5], f[6], f[7]);
        } else if (mode == OUT_RESIDUAL) {
            if (!on) continue;  // y as it was
            float r[8];
            bf16x8_to_float(res[i], r);
#pragma unroll
            for (int j = 0; j < 8; ++j) r[j] += f[j];
            *reinterpret_cast<uint4*>(static_cast<bf16*>(y) + at) = float_to_bf16x8(r);
        } else {  // OUT_BF16, OUT_SILU
            *reinterpret_cast<uint4*>(static_cast<bf16*>(y) + at) = float_to_bf16x8(f);
        }
    }
}

// gemm_tc's body for row tiles of TM = 64 or 32 batch rows: the 8 warps split the tile into TM / 16 rows of warps
// (16 batch rows each) by NW = 8 / (TM / 16) columns (64 / NW weight rows each): warp w owns rows 16 (w / NW) and
// weight rows (w % NW) 64 / NW of the tile, one m16 by NJ = 8 / NW n8 MMA fragments. NARROW: gemm_tc_narrow's
// merge (tc_merge_splits) and x tiles issued before X_RMSNORM's row sums.
template <int TM, bool NARROW>
__device__ __forceinline__ void gemm_tc_body(void* y, const bf16* __restrict__ x, const bf16* __restrict__ w,
                                             const bf16* __restrict__ norm, const int* __restrict__ positions, int B,
                                             int N, int K, int k_chunk, int mode, float eps, int x_op,
                                             float* __restrict__ partial, int* __restrict__ counters) {
    constexpr int NW = 8 / (TM / 16), NJ = 8 / NW, XC = TM * 8 / TC_THREADS;  // warp columns, n8 frags, x chunks
    __shared__ float scale_s[TC_M];
    extern __shared__ __align__(16) unsigned char tc_raw[];
    // STAGES of [x tile [TM][TC_LD] | W tile [64][TC_LD]]: with TM = 32 a stage is 3/4 of a 64-row one, so 4 fit
    // in TC_SHARED (exactly) and 3 K tiles are in flight ahead of the one being multiplied instead of 2, at the same
    // 4 blocks per SM. A W tile's latency, not the SM's issue rate, paces these blocks (session 21's ncu: 18 cycles
    // per issued instruction a warp; 1b's LM head at B = 4-8 streams at ~0.75 of copy bandwidth on gemm_tc). H100,
    // graph step at context 512, A/B, three rounds (session 41): 3 -> 4 stages took small B = 24 / 32 573 / 628 ->
    // 563 / 614 us (-1.9 / -2.4%) and 1b B = 4 / 24 / 32 1171 / 1772 / 1965 -> 1153 / 1734 / 1935 (-1.6 / -2.2 /
    // -1.5%); B = 8-16 and 64 within +-0.4%, but small B = 64 +0.8% (its 64-row tiles run the code they did).
    constexpr int STAGES = TM == 32 ? TC_STAGES32 : TC_STAGES, STAGE = (TM + TC_M) * TC_LD;
    static_assert(STAGES * STAGE * 2 <= TC_SHARED, "gemm_tc's stages exceed TC_SHARED");
    bf16* stages = reinterpret_cast<bf16*>(tc_raw);
    float* cs = reinterpret_cast<float*>(tc_raw);     // [64][TC_LDC], after the main loop

    const TileRows tr = tile_rows(mode, N, TC_N);  // OUT_SILU: 32 gate/up row pairs
    const int half = tr.half, rows = tr.rows, outs = tr.outs;
    const int m0 = blockIdx.x * TM, n0 = blockIdx.y * outs;
    const int k0 = blockIdx.z * k_chunk, k1 = min(K, k0 + k_chunk);
    const int tiles = (k1 - k0 + TC_K - 1) / TC_K;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = (warp / NW) * 16, wn = (warp % NW) * (TC_N / NW);  // this warp's 16 x (8 NJ) output tile
    const int g = lane >> 2, t2 = (lane & 3) * 2;           // mma fragment coordinates
    rows_active(scale_s, positions, m0, min(TM, B - m0), TM);
    // Weights do not depend on the kernel before (pdl.cuh): the first STAGES - 1 W tiles go out before the wait,
    // as one cp.async group; then one group per x tile. Every later iteration commits one group (W and x of the tile
    // STAGES - 1 ahead, or nothing past the end), so tile t has landed once at most STAGES - 2 are pending.
    const auto wc = w_tile_copy(w, n0, rows, half, K, k0);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
        if (s < tiles) tile_async(stages + s * STAGE + TM * TC_LD, wc, s, k1);
    cp_async_commit();
    pdl_begin();
    // NARROW: the first x tiles go out before X_RMSNORM's row sums, which then overlap their L2 round trip: the
    // copies need only which rows are active (rows_active's 1 or 0, read after a barrier and before rows_scale's
    // barrier lets lane 0 of a row's warp overwrite it with the scale).
    if (NARROW) __syncthreads();
    else rows_scale<false>(scale_s, x, x_op, m0, TM, K, eps);
    float sc[XC];
#pragma unroll
    for (int i = 0; i < XC; ++i) sc[i] = scale_s[(threadIdx.x + i * TC_THREADS) / 8];
    const auto xc = x_tile_copy<TM>(x, sc, m0, K, k0);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles) tile_async(stages + s * STAGE, xc, s, k1);
        cp_async_commit();
    }
    if (NARROW) {
        rows_scale<false>(scale_s, x, x_op, m0, TM, K, eps);
#pragma unroll
        for (int i = 0; i < XC; ++i) sc[i] = scale_s[(threadIdx.x + i * TC_THREADS) / 8];
    }
    // X_RMSNORM: this thread's 8 norm weights of the next tile, loaded a tile ahead (the same column in all its chunks)
    const int ncol = k0 + (threadIdx.x % 8) * 8;
    const bool rms = x_op == X_RMSNORM;
    uint4 g_next = rms && ncol < k1 ? __ldg(reinterpret_cast<const uint4*>(norm + ncol)) : make_uint4(0, 0, 0, 0);

    float acc[NJ][4];  // [n8 frag][4]
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

    for (int t = 0, st = 0, ahead_st = STAGES - 1; t < tiles; ++t) {  // st, ahead_st: t and t + STAGES - 1's
        bf16* xt = stages + st * STAGE;
        const bf16* wt = xt + TM * TC_LD;
        cp_async_wait<STAGES - 2>();  // this thread's copies of tile t have landed
        __syncthreads();                 // everyone's have; everyone is done with tile t - 1's buffers
        if (rms) {  // block-uniform
            const uint4 gv = g_next;
            const int nk = ncol + (t + 1) * TC_K;
            if (t + 1 < tiles && nk < k1) g_next = __ldg(reinterpret_cast<const uint4*>(norm + nk));
            x_tile_norm<TM>(xt, sc, gv);
        }
        const int ahead = t + STAGES - 1;  // into the buffers tile t - 1 used
        if (ahead < tiles) {
            bf16* xa = stages + ahead_st * STAGE;
            tile_async(xa + TM * TC_LD, wc, ahead, k1);
            tile_async(xa, xc, ahead, k1);
        }
        cp_async_commit();
        st = st + 1 == STAGES ? 0 : st + 1;
        ahead_st = ahead_st + 1 == STAGES ? 0 : ahead_st + 1;
        if (rms) __syncthreads();  // the normalised tile, before any warp reads another thread's chunks
#pragma unroll
        for (int kk = 0; kk < TC_K; kk += 16) {
            // ldmatrix: A (x rows) lanes 0-15 rows 0-15 at k, 16-31 the same rows at k + 8 -> a0..a3; B (W rows) lanes
            // 0-7 / 8-15 n-tile j at k / k + 8, 16-31 n-tile j + 1 -> b[j][0..1], b[j + 1][0..1]. The registers hold
            // what 32-bit loads of rows g, g + 8 at columns t2, t2 + 8 would: 4 instructions instead of 16.
            unsigned a[4], b[NJ][2];
            ldmatrix_x4(a, xt + (wm + (lane & 15)) * TC_LD + kk + (lane >> 4) * 8);
#pragma unroll
            for (int j = 0; j < NJ; j += 2) {
                unsigned r[4];
                ldmatrix_x4(r, wt + (wn + j * 8 + (lane & 7) + (lane >> 4) * 8) * TC_LD + kk + ((lane >> 3) & 1) * 8);
                b[j][0] = r[0];
                b[j][1] = r[1];
                b[j + 1][0] = r[2];
                b[j + 1][1] = r[3];
            }
#pragma unroll
            for (int j = 0; j < NJ; ++j) mma_bf16_16816(acc[j], a, b[j]);
        }
    }
    cp_async_wait<0>();  // only empty groups remain; the buffers become cs after the barrier
    __syncthreads();

#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        float* c = cs + (wm + g) * TC_LDC + wn + j * 8 + t2;
        c[0] = acc[j][0];
        c[1] = acc[j][1];
        c[8 * TC_LDC] = acc[j][2];
        c[8 * TC_LDC + 1] = acc[j][3];
    }
    __syncthreads();
    if (gridDim.z > 1 && mode != OUT_PARTIAL && !tc_merge_splits<TM, NARROW>(cs, partial, counters, min(TM, B - m0)))
        return;
    tc_store<TM>(y, cs, scale_s, mode, B, N, m0, n0, tr);
}

// B <= 32 runs 32-row tiles: the same grid (one row tile either way) with half the x tile and half the MMAs, which
// for B = 17-32 would multiply rows of zeros. 8 warps of one m16 fragment row each at 64 registers
// (__launch_bounds__(256, 4); unasked, NVRTC 13.0 / 13.5 give 76 / 80, i.e. 3 blocks per SM, which lost 1b B = 24 / 32
// by 2-4%): 4 blocks = 32 warps per SM, as the pipeline's shared memory also allows. 4 warps of 32 x 32 (126
// registers, 16 warps per SM) were 1-6% slower at B = 17-64 and within 1% at 128-256 (graph step, context 512, H200,
// session 21: 1b B = 24 / 64 / 128 1652 / 2721 / 4545 -> 1598 / 2582 / 4557 us, small B = 256 2373 -> 2392).
extern "C" __global__ void __launch_bounds__(TC_THREADS, 4) gemm_tc(void* y, const bf16* __restrict__ x,
                                                                    const bf16* __restrict__ w,
                                                                    const bf16* __restrict__ norm,
                                                                    const int* __restrict__ positions, int B, int N,
                                                                    int K, int k_chunk, int mode, float eps, int x_op,
                                                                    float* __restrict__ partial,
                                                                    int* __restrict__ counters) {
    if (B <= 32 && gridDim.x == 1)
        gemm_tc_body<32, false>(y, x, w, norm, positions, B, N, K, k_chunk, mode, eps, x_op, partial, counters);
    else
        gemm_tc_body<64, false>(y, x, w, norm, positions, B, N, K, k_chunk, mode, eps, x_op, partial, counters);
}

// gemm_tc_narrow: gemm_tc with 32-row tiles for every B (grid = (ceil(B / 32), ceil(N / 64), splits)), the merge
// of only the batch rows staged in shared memory, and the x tiles issued before X_RMSNORM's row sums; the plans
// take it at B <= 16 (plans.py's TC_NARROW_MAX_B). Same arguments, partial [tiles * splits * 32 * 64] at least.
// H100, graph step at context 512, A/B, three rounds (session 41): 1b B = 4 / 8 / 12 / 16 1169 / 1315 / 1442 / 1556
// -> 1118 / 1261 / 1410 / 1536 us (-4.4 / -4.0 / -2.2 / -1.2%); small (only its LM head) within +-0.3%. Up to B =
// 32 it lost: small B = 17-32 +1.4 to +5.2%, 1b B = 24 / 32 +1.1 / +3.5%. A kernel of its own because the same code
// inside gemm_tc, though run only at B <= 16, cost B = 24-64 0.5-4% (branches tc-mr2g, tc-mr2g-ex); gemm_tc's SASS
// is what it was before (sass_count.py --same-as).
extern "C" __global__ void __launch_bounds__(TC_THREADS, 4) gemm_tc_narrow(void* y, const bf16* __restrict__ x,
                                                                           const bf16* __restrict__ w,
                                                                           const bf16* __restrict__ norm,
                                                                           const int* __restrict__ positions, int B,
                                                                           int N, int K, int k_chunk, int mode,
                                                                           float eps, int x_op,
                                                                           float* __restrict__ partial,
                                                                           int* __restrict__ counters) {
    gemm_tc_body<32, true>(y, x, w, norm, positions, B, N, K, k_chunk, mode, eps, x_op, partial, counters);
}

// gemv_mma: weight-streaming GEMV on tensor cores ("swap AB": W is the 16-row A operand, x^T the 8-column
// B operand). Lane (g, t) of a warp loads 16 bytes of weight rows g and g + 8 at k = base + 8t and 16 bytes
// of batch row g at the same k: one load pair feeds two m16n8k16 MMAs, because the sum over k does not care
// which physical k each fragment slot holds as long as A and B use the same map (slots k = 2t, 2t+1 and
// 2t+8, 2t+9 of MMA j <- base + 8t + 4j + {0, 1} and {2, 3}). A block = 8 warps owns 16 weight rows; the warps
// interleave over 32-wide K slabs, GEMV_MMA_UNROLL slabs (2 x 16 bytes each) in flight per lane, then the
// block reduces in fixed order. OUT_SILU: rows g and g + 8 are gate row n0 + g and its up row n0 + g + N/2.
template <int NT>  // n8 batch tiles per pass: batch rows per pass = 8 * NT
__device__ __forceinline__ void gemv_mma_pass(void* y, const bf16* __restrict__ x, const bf16* __restrict__ w,
                                              const bf16* __restrict__ norm, const int* __restrict__ positions,
                                              int b0, int nb, int B, int N, int K, int k0, int k1, int mode,
                                              float eps, int x_op, float* partial) {
    __shared__ float red[8][16][8 * NT + 1];  // [warp][weight row][batch column], padded
    __shared__ float scale_s[8 * NT];         // rows_scale of the pass's rows
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t8 = (lane & 3) * 8;
    rows_active(scale_s, positions, b0, nb, 8 * NT);
    const TileRows tr = tile_rows(mode, N, 16);  // OUT_SILU: 8 gate/up row pairs
    const int half = tr.half, rows = tr.rows, outs = tr.outs;
    const int n0 = blockIdx.x * outs;
    const int nlo = min(n0 + g, rows - 1);  // rows past the end: loaded, never stored
    const bf16* wlo = w + (size_t)nlo * K;
    const bf16* whi = w + (size_t)(half ? nlo + half : min(n0 + g + 8, N - 1)) * K;
    constexpr int ROUND = 32 * 8;  // K covered by the 8 warps' slabs side by side
    uint4 lo[GEMV_MMA_UNROLL], hi[GEMV_MMA_UNROLL];
    auto load_w = [&](int kb) {
#pragma unroll
        for (int u = 0; u < GEMV_MMA_UNROLL; ++u) {
            const int k = kb + u * ROUND + t8;
            const bool ok = k < k1;
            lo[u] = ok ? ldg_stream(wlo + k) : make_uint4(0, 0, 0, 0);
            hi[u] = ok ? ldg_stream(whi + k) : make_uint4(0, 0, 0, 0);
        }
    };
    // The first slabs are loaded before the wait and X_RMSNORM's row sums, whose round trips then overlap theirs,
    // instead of after them (the L2 prefetch had brought them no nearer than L2). 16 bytes of spill (80 registers;
    // 32 before the batched row sums, 8 before this). H100, graph step at context 512, A/B, two rounds (session 41):
    // small B = 3 / 4 / 16 304.6 / 306.7 / 457.2 -> 285.9 / 285.6 / 438.8 us (-6.2 / -6.9 / -4.0%), B = 8 -0.2% (its
    // grids capped at 2 blocks per SM), B = 24 / 64 within 0.1%; 1b B = 3 +1.7% (1088.4 -> 1106.5: its down, split 3
    // ways over K = 5632, was 1b's one gemv_mma launch there until gemm_tc_narrow took it in session 42), 1b B = 4-64
    // within 0.1% (no gemv_mma).
    const int kb0 = k0 + warp * 32;
    load_w(kb0);
    if (b0 == 0) pdl_begin();  // the weights' L2 prefetch and the first pass's row flags precede the wait
    rows_scale<true>(scale_s, x, x_op, b0, 8 * NT, K, eps);
    float sc[NT];  // the scale of this lane's batch rows g + 8i, in registers for the stream loop
#pragma unroll
    for (int i = 0; i < NT; ++i) sc[i] = scale_s[g + 8 * i];
    float d[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.0f;

    for (int kb = kb0; kb < k1; kb += ROUND * GEMV_MMA_UNROLL) {
        if (kb != kb0) load_w(kb);
#pragma unroll
        for (int u = 0; u < GEMV_MMA_UNROLL; ++u) {
            if (kb + u * ROUND >= k1) break;  // warp-uniform
            const int k = kb + u * ROUND + t8;
#pragma unroll
            for (int i = 0; i < NT; ++i) {
                const int b = g + 8 * i;
                const uint4 xv = sc[i] != 0.0f && k < k1 ? load_x8(x, norm, x_op, sc[i], b0 + b, K, k)
                                                          : make_uint4(0, 0, 0, 0);
                const unsigned a0[4] = {lo[u].x, hi[u].x, lo[u].y, hi[u].y}, b0f[2] = {xv.x, xv.y};
                const unsigned a1[4] = {lo[u].z, hi[u].z, lo[u].w, hi[u].w}, b1f[2] = {xv.z, xv.w};
                mma_bf16_16816(d[i], a0, b0f);
                mma_bf16_16816(d[i], a1, b1f);
            }
        }
    }

    const int t2 = (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < NT; ++i) {  // D fragment: rows g, g + 8; columns (batch) 8i + t2, + 1
        red[warp][g][8 * i + t2] = d[i][0];
        red[warp][g][8 * i + t2 + 1] = d[i][1];
        red[warp][g + 8][8 * i + t2] = d[i][2];
        red[warp][g + 8][8 * i + t2 + 1] = d[i][3];
    }
    __syncthreads();
    // outputs per block: outs; OUT_SILU: g in red row r, u in r + 8
    for (int e = threadIdx.x; e < outs * 8 * NT; e += blockDim.x) {
        const int r = e / (8 * NT), c = e % (8 * NT);
        float s = 0.0f, u = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) s += red[i][r][c];
        if (half) {
#pragma unroll
            for (int i = 0; i < 8; ++i) u += red[i][r + 8][c];
        }
        if (c < nb && n0 + r < rows) {
            const bool on = scale_s[c] != 0.0f, merge = gridDim.y > 1 && mode != OUT_PARTIAL;  // gemv_mma's
            if (merge) store_split(partial, blockIdx.y, B, N, b0 + c, n0 + r, half, s, u, on);
            else store_unit(y, mode, blockIdx.y, B, N, b0 + c, n0 + r, s, u, on);
        }
    }
    __syncthreads();  // red is reused by the next pass
}

// gemv_mma's split K: the last of a row block's splits to count stores its outputs from every split's sums
// (reduce_unit).
__device__ __forceinline__ void mma_merge_splits(void* y, const float* partial, int* counters, const int* positions,
                                              int B, int N, int mode) {
    if (!last_block_of(counters + blockIdx.x, gridDim.y)) return;
    const TileRows tr = tile_rows(mode, N, 16);
    for (int e = threadIdx.x; e < tr.outs * B; e += blockDim.x) {
        const int b = e / tr.outs, n = blockIdx.x * tr.outs + e % tr.outs;
        if (n < tr.rows) reduce_unit(y, partial, B, N, gridDim.y, mode, b, n, row_active(positions, b));
    }
}

template <int NT>
__device__ __forceinline__ void gemv_mma_all(void* y, const bf16* x, const bf16* w, const bf16* norm,
                                             const int* positions, int B, int N, int K, int k0, int k1, int mode,
                                             float eps, int x_op, float* partial) {
    for (int b0 = 0; b0 < B; b0 += 8 * NT)
        gemv_mma_pass<NT>(y, x, w, norm, positions, b0, min(8 * NT, B - b0), B, N, K, k0, k1, mode, eps, x_op,
                          partial);
}

// One kernel per pass width (gemv_mma: 8 rows a pass, gemv_mma16: 16, gemv_mma32: 32), so that each holds only its
// own pass's code and static shared memory (4.6 / 8.6 / 16.6 KiB, where one kernel of all three held 30 KiB); each
// runs any B in passes of its width. plans.py picks the narrowest that holds B in one pass (mma_kernel). The three
// entry points are spelled out, not made by a macro: rawgraphs.signature reads each one's parameters from this text.
template <int NT>
__device__ __forceinline__ void gemv_mma_body(void* y, const bf16* __restrict__ x, const bf16* __restrict__ w,
                                              const bf16* __restrict__ norm, const int* __restrict__ positions,
                                              int B, int N, int K, int k_chunk, int mode, float eps, int x_op,
                                              float* __restrict__ partial, int* __restrict__ counters) {
    const int k0 = blockIdx.y * k_chunk, k1 = min(K, k0 + k_chunk);
    if (mode == OUT_SILU) {  // weights: pre-wait (OUT_SILU: the block's 8 gate rows and their up rows)
        prefetch_rows_l2(w, blockIdx.x * 8, 8, N / 2, K, k0, k1);
        prefetch_rows_l2(w + (size_t)(N / 2) * K, blockIdx.x * 8, 8, N / 2, K, k0, k1);
    } else {
        prefetch_rows_l2(w, blockIdx.x * 16, 16, N, K, k0, k1);
    }
    gemv_mma_all<NT>(y, x, w, norm, positions, B, N, K, k0, k1, mode, eps, x_op, partial);
    if (gridDim.y > 1 && mode != OUT_PARTIAL) mma_merge_splits(y, partial, counters, positions, B, N, mode);
}

extern "C" __global__ void __launch_bounds__(256, 3) gemv_mma(void* y, const bf16* __restrict__ x,
                                                              const bf16* __restrict__ w,
                                                              const bf16* __restrict__ norm,
                                                              const int* __restrict__ positions, int B, int N,
                                                              int K, int k_chunk, int mode, float eps, int x_op,
                                                              float* __restrict__ partial,
                                                              int* __restrict__ counters) {
    gemv_mma_body<1>(y, x, w, norm, positions, B, N, K, k_chunk, mode, eps, x_op, partial, counters);
}

extern "C" __global__ void __launch_bounds__(256, 3) gemv_mma16(void* y, const bf16* __restrict__ x,
                                                                const bf16* __restrict__ w,
                                                                const bf16* __restrict__ norm,
                                                                const int* __restrict__ positions, int B, int N,
                                                                int K, int k_chunk, int mode, float eps, int x_op,
                                                                float* __restrict__ partial,
                                                                int* __restrict__ counters) {
    gemv_mma_body<2>(y, x, w, norm, positions, B, N, K, k_chunk, mode, eps, x_op, partial, counters);
}

extern "C" __global__ void __launch_bounds__(256, 3) gemv_mma32(void* y, const bf16* __restrict__ x,
                                                                const bf16* __restrict__ w,
                                                                const bf16* __restrict__ norm,
                                                                const int* __restrict__ positions, int B, int N,
                                                                int K, int k_chunk, int mode, float eps, int x_op,
                                                                float* __restrict__ partial,
                                                                int* __restrict__ counters) {
    gemv_mma_body<4>(y, x, w, norm, positions, B, N, K, k_chunk, mode, eps, x_op, partial, counters);
}

// ---- gemv: one-wave weight streaming with per-warp cp.async rings ------------------------------------------
// A group of `parts` warps owns whole weight rows n = group, group + groups, ... (groups: all groups of the grid);
// warp p of a group streams chunks p, p + parts, ... of each row (256 elements of the K range per chunk; lane l
// holds elements [8l, 8l + 8), 16 bytes) through a private shared-memory ring of PIPE_STAGES slots with
// cp.async, PIPE_STAGES - 1 chunks in flight per warp. The first ring's worth is issued before the PDL wait
// (weights never depend on the previous kernel). x (after x_op) is staged once per pass in shared memory.
// Warps run independently (no barrier inside the stream); each row ends in a fixed-order warp reduction and,
// with parts > 1, a fixed-order sum of the group's partials after a block barrier every RED_UNITS units
// (deterministic, and independent of the grid: a row is summed the same way whichever group owns it). Block
// barriers only: per-group named barriers (bar.sync id, count) made compute-sanitizer's racecheck report
// hazards it cannot see through (benchmarks/NOTES.md, sessions 7 and 9).
// OUT_SILU: a group owns units of two rows, gate row n and up row n + N/2, streamed as one sequence of
// 2 x chunks chunks (the warps of the group share them as they share a row's) into two accumulators.
#define PIPE_STAGES 8  // GEMV_STAGES in plans.py (deeper rings lost, H200)
#define PIPE_CHUNK 256
#define RED_UNITS 8  // units per reduction round (parts > 1): red holds [2][RED_UNITS][warps] fp32

// a + w[0:8] . x[0:8], in element order (8 bf16 each, 16-byte aligned shared memory): one lane's share of a chunk.
__device__ __forceinline__ float dot8(float a, const bf16* w, const bf16* x) {
    float wf[8], xf[8];
    bf16x8_to_float(*reinterpret_cast<const uint4*>(w), wf);
    bf16x8_to_float(*reinterpret_cast<const uint4*>(x), xf);
#pragma unroll
    for (int e = 0; e < 8; ++e) a = fmaf(wf[e], xf[e], a);
    return a;
}

// a[r] = dot8(a[r], w, x + r * K) for R rows of x: the 8 weights are widened once for every row.
template <int R>
__device__ __forceinline__ void dot8_rows(float (&a)[R], const bf16* w, const bf16* x, int K) {
    float wf[8];
    bf16x8_to_float(*reinterpret_cast<const uint4*>(w), wf);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float xf[8];
        bf16x8_to_float(*reinterpret_cast<const uint4*>(x + (size_t)r * K), xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) a[r] = fmaf(wf[e], xf[e], a[r]);
    }
}

// The issue side of one warp's ring: its chunks of its rows in order, one commit group per chunk (empty past
// the end, so the wait count stays fixed).
// PAIRS (OUT_SILU): a unit is two rows; this warp's chunks j >= jsplit are in the second. A compile-time switch:
// a per-chunk select in every projection cost qkv ~2 us and the LM head ~5 us per launch (H200, session 7).
template <bool PAIRS>
struct RowStream {
    bf16* ring;  // [PIPE_STAGES][PIPE_CHUNK] this warp's slots
    int K, k0, k1, stride, part, parts, mine;  // mine: chunks of a unit (row or row pair) this warp streams
    int chunks, jsplit;  // PAIRS: chunks of one row; this warp's chunks of the unit's first row
    size_t half;         // PAIRS: elements from a unit's first row to its second
    int left, j, slot;  // chunks still to issue, the next one's index among this warp's chunks of its unit, slot
    const bf16* row;    // the next chunk's unit (its first row)

    __device__ __forceinline__ void issue() {
        if (left > 0) {
            int c = part + j * parts;
            const bf16* r = row;
            if (PAIRS && j >= jsplit) {  // the unit's second row
                c -= chunks;
                r += half;
            }
            const int k = k0 + c * PIPE_CHUNK + (threadIdx.x & 31) * 8;
            if (k < k1) cp_async16(ring + slot * PIPE_CHUNK + (threadIdx.x & 31) * 8, r + k);
            --left;
            if (++j == mine) {  // unit done: this warp's next unit
                j = 0;
                row += (size_t)stride * K;
            }
        }
        // A compare and a select, not (slot + 1) % PIPE_STAGES (a signed remainder, several instructions, twice per
        // chunk). Decode step, graph, B = 1 (H200, session 13, two rounds): 1b 701.4 -> 676.8 us, small 224.8 ->
        // 220.9 us. Not a rule that fewer instructions are faster: session 14 cut the plain row loop from 141 to
        // 117 per 2 chunks (branch gemv-lean-bf16) for 1b -2 / small +2.6 us (benchmarks/NOTES.md).
        slot = slot == PIPE_STAGES - 1 ? 0 : slot + 1;
        cp_async_commit();
    }
};

// X_RMSNORM: this thread's first 8 norm weights of the K range [k0, k1), for stage_x, read before the block's sum of
// squares rather than after it. Written before the PDL wait (weights never depend on the kernel before, pdl.cuh),
// but ptxas schedules the load after it (nvdisasm: after ACQBULK, among block_sum's shuffles), as __ldg or as
// ldg_stream's asm volatile: what it gains is the overlap with the sum of squares.
template <int XOP>
__device__ __forceinline__ uint4 norm_first(const bf16* __restrict__ norm, int k0, int k1) {
    const int k = k0 + threadIdx.x * 8;
    return XOP == X_RMSNORM && k < k1 ? ldg_stream(norm + k) : make_uint4(0, 0, 0, 0);
}

// xs[0, k1 - k0) = x[b, k0:k1) after x_op; g_first: norm_first's weights.
template <int XOP>
__device__ __forceinline__ void stage_x(bf16* xs, const bf16* __restrict__ x, const bf16* __restrict__ norm,
                                        int b, int K, int k0, int k1, float eps, float* scratch, uint4 g_first) {
    const float inv = XOP == X_RMSNORM
        ? rsqrtf(block_sum(row_sumsq(x, b, K, threadIdx.x, blockDim.x), scratch) / (float)K + eps) : 1.0f;
    for (int k = k0 + threadIdx.x * 8; k < k1; k += blockDim.x * 8) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(x + (size_t)b * K + k));
        const uint4 g = k == k0 + (int)threadIdx.x * 8 ? g_first : __ldg(reinterpret_cast<const uint4*>(norm + k));
        *reinterpret_cast<uint4*>(xs + (k - k0)) = XOP == X_RMSNORM ? rmsnorm_x8(v, g, inv) : v;
    }
}

// block_sum of R values at once, one barrier pair for all of them: scratch[r * nwarps + warp] (R * nwarps <= 32, the
// 32 floats of scratch: gemv_rows2/3's 8 warps, R <= 3). Each value summed in block_sum's order (the same bits).
template <int R>
__device__ __forceinline__ void block_sum_rows(float (&v)[R], float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = warp_sum(v[r]);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) scratch[r * nwarps + warp] = v[r];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = warp_sum(lane < nwarps ? scratch[r * nwarps + lane] : 0.0f);
}

// gemv_rows2/3 (R > 1): xs[r * K, (r + 1) * K) = x[r] after x_op for every active row r, as R calls of stage_x would
// give (the same sums in the same order, the same bits), but the R rows' sums of squares in one pass, R loads in
// flight a step, and one block_sum_rows: R stage_x calls wait R times for a block reduction and an L2 round trip
// after it, one row after another. A thread's first 16 bytes of each row stay in registers from the sums to the
// store (at K = 2048 all of them: no second read of x), and the norm weights are loaded once for all rows.
template <int XOP, int R>
__device__ __forceinline__ void stage_rows(bf16* xs, const bf16* __restrict__ x, const bf16* __restrict__ norm,
                                           const bool (&on)[R], int K, float eps, float* scratch, uint4 g_first) {
    const int k0 = threadIdx.x * 8, step = blockDim.x * 8;
    uint4 first[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
        first[r] = on[r] && k0 < K ? __ldg(reinterpret_cast<const uint4*>(x + (size_t)r * K + k0))
                                   : make_uint4(0, 0, 0, 0);
    float inv[R];
    if (XOP == X_RMSNORM) {
#pragma unroll
        for (int r = 0; r < R; ++r) inv[r] = k0 < K ? sumsq8(first[r], 0.0f) : 0.0f;  // row_sumsq's first step
        for (int k = k0 + step; k < K; k += step) {
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (on[r]) inv[r] = sumsq8(__ldg(reinterpret_cast<const uint4*>(x + (size_t)r * K + k)), inv[r]);
        }
        block_sum_rows<R>(inv, scratch);
#pragma unroll
        for (int r = 0; r < R; ++r) inv[r] = rsqrtf(inv[r] / (float)K + eps);
    }
    for (int k = k0; k < K; k += step) {
        const uint4 g = XOP != X_RMSNORM ? make_uint4(0, 0, 0, 0)
            : k == k0 ? g_first : __ldg(reinterpret_cast<const uint4*>(norm + k));
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (!on[r]) continue;
            const uint4 v = k == k0 ? first[r] : __ldg(reinterpret_cast<const uint4*>(x + (size_t)r * K + k));
            *reinterpret_cast<uint4*>(xs + (size_t)r * K + k) = XOP == X_RMSNORM ? rmsnorm_x8(v, g, inv[r]) : v;
        }
    }
}

// One pass per batch row: x[b] staged as xs[k1 - k0] after the PDL wait.
template <int XOP, bool PAIRS>
__device__ __forceinline__ void gemv_body(void* y, const bf16* __restrict__ x, const bf16* __restrict__ w,
                                          const bf16* __restrict__ norm, const int* __restrict__ positions,
                                          int B, int N, int K, int k0, int k1, int mode, float eps, int parts) {
    extern __shared__ __align__(16) unsigned char pipe_raw[];
    __shared__ float scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int part = warp % parts, per_block = nwarps / parts;
    const int group = blockIdx.x * per_block + warp / parts, groups = gridDim.x * per_block;
    const int kc = k1 - k0, chunks = (kc + PIPE_CHUNK - 1) / PIPE_CHUNK;
    const int units = PAIRS ? N / 2 : N, unit_chunks = PAIRS ? 2 * chunks : chunks;
    const int mine = part < unit_chunks ? (unit_chunks - part + parts - 1) / parts : 0;
    const int jsplit = PAIRS ? (part < chunks ? (chunks - part + parts - 1) / parts : 0) : mine;
    const int rows = group < units ? (units - 1 - group) / groups + 1 : 0;  // this group's units
    const int busiest = (units - 1) / groups + 1;                            // group 0's
    bf16* rings = reinterpret_cast<bf16*>(pipe_raw);      // [nwarps][PIPE_STAGES][PIPE_CHUNK]
    bf16* xs = rings + nwarps * PIPE_STAGES * PIPE_CHUNK;  // [kc] the pass's input row
    float* red = reinterpret_cast<float*>(xs + kc);        // [2][RED_UNITS][nwarps] partials g, u (parts > 1)
    RowStream<PAIRS> st{rings + warp * PIPE_STAGES * PIPE_CHUNK, K, k0, k1, groups, part, parts, mine, chunks,
                        jsplit, (size_t)units * K, 0, 0, 0, nullptr};
    for (int b = 0; b < B; ++b) {
        st.left = rows * mine;
        st.j = st.slot = 0;
        st.row = w + (size_t)group * K;
#pragma unroll
        for (int i = 0; i < PIPE_STAGES - 1; ++i) st.issue();
        const bool on = row_active(positions, b);  // positions may be read before the wait (pdl.cuh)
        if (b == 0) pdl_begin();  // the first ring is in flight before the wait; x is read after it
        if (!on) {  // block-uniform: no input read, zeros stored (store_row)
            cp_async_wait<0>();
            for (int n = group; n < units && part == 0 && lane == 0; n += groups)
                store_unit(y, mode, blockIdx.y, B, N, b, n, 0.0f, 0.0f, false);
            continue;
        }
        __syncthreads();          // xs is free (every warp finished the previous pass)
        stage_x<XOP>(xs, x, norm, b, K, k0, k1, eps, scratch, norm_first<XOP>(norm, k0, k1));
        __syncthreads();
#ifdef RG_TRACE
        if (b == 0) rg_trace_mark(RG_STAGED);
#endif
        int slot = 0;
        // One chunk: wait for it, refill the slot the previous chunk used, a += w . x over this lane's 8.
        auto chunk = [&](int c, float& a) {
            cp_async_wait<PIPE_STAGES - 2>();
            st.issue();
            const int kk = c * PIPE_CHUNK + lane * 8;
            if (k0 + kk < k1) a = dot8(a, st.ring + slot * PIPE_CHUNK + lane * 8, xs + kk);
            slot = slot == PIPE_STAGES - 1 ? 0 : slot + 1;
        };
        // Units in rounds of RED_UNITS (a count that is the same for every warp of the grid, so every warp
        // meets the same block barriers): parts > 1 leaves each warp's partial of each unit in red, and after the
        // round's barrier lane i of the group's first warp sums unit r0 + i over the parts in order.
        for (int r0 = 0; r0 < busiest; r0 += RED_UNITS) {
            const int r1 = min(rows, r0 + RED_UNITS);
            for (int r = r0; r < r1; ++r) {
                float acc = 0.0f, acc_u = 0.0f;  // the unit's first row; its second (PAIRS)
                for (int j = 0; j < jsplit; ++j) chunk(part + j * parts, acc);
                if (PAIRS) {
                    for (int j = jsplit; j < mine; ++j) chunk(part + j * parts - chunks, acc_u);
                    acc_u = warp_sum(acc_u);
                }
                acc = warp_sum(acc);
                if (parts == 1) {
                    if (lane == 0) store_unit(y, mode, blockIdx.y, B, N, b, group + r * groups, acc, acc_u, true);
                } else if (lane == 0) {
                    red[(r - r0) * nwarps + warp] = acc;
                    if (PAIRS) red[(RED_UNITS + r - r0) * nwarps + warp] = acc_u;
                }
            }
            if (parts == 1) continue;  // grid-uniform
            __syncthreads();
            if (part == 0 && lane < r1 - r0) {
                float v = 0.0f, u = 0.0f;
                for (int p = 0; p < parts; ++p) {
                    v += red[lane * nwarps + warp + p];
                    if (PAIRS) u += red[(RED_UNITS + lane) * nwarps + warp + p];
                }
                store_unit(y, mode, blockIdx.y, B, N, b, group + (r0 + lane) * groups, v, u, true);
            }
            // red is free for the next round (the next pass begins with a barrier of its own)
            if (r0 + RED_UNITS < busiest) __syncthreads();
        }
        cp_async_wait<0>();  // only empty groups remain; the next pass starts from a quiet ring
    }
#ifdef RG_TRACE
    rg_trace_mark(RG_SUMMED);
#endif
}

// ---- gemv at B = 1 with one warp per unit and one K range: the unit stream --------------------------------------
// gemv_body's row stream without what this case does not need: no pass per batch row, no reduction rounds, one
// barrier before the units (x staged), and the issue side walks a unit with a running offset and moves to its
// next unit (n + groups) when the unit's chunks are issued, instead of recomputing each chunk's index from
// (part, j, parts, jsplit). Each unit is summed by one warp in chunk order, as gemv_body sums it with parts = 1:
// the same bytes. Decode step, graph, B = 1 (H200, session 15, three rounds in one call, with the plans' one warp
// per unit): 1b 645.2 / 643.3 / 644.5 -> 622.1 / 621.7 / 622.3 us, small 213.2 / 212.4 / 212.6 -> 204.2 / 204.5 /
// 204.5 us. Not by instruction count: its row loop is 150-165 SASS per 2 chunks against the general body's 137-141.
// At B = 1 it keeps all PIPE_STAGES chunks of its ring in flight (gemv_body: PIPE_STAGES - 1; see AHEAD below).
// What it gains by is not isolated (the barrier before staging, the rounds, the chunk index are all gone at once).
template <bool PAIRS>
struct UnitStream {
    bf16* ring;  // [PIPE_STAGES][PIPE_CHUNK] this warp's slots, offset by this lane's 8 elements
    const bf16* w;
    int K, units, groups, mine, chunks;  // mine: chunks of a unit (PAIRS: both rows); chunks: of one row
    size_t half;                         // PAIRS: elements from a unit's first row to its second
    int unit, j, k, slot;  // the unit being issued, its next chunk and this lane's element of it, the ring slot
    const bf16* row;       // the row being issued

    __device__ __forceinline__ void start(int u) {  // u >= units: the end (nothing more is loaded)
        unit = u;
        j = 0;
        k = (threadIdx.x & 31) * 8;
        row = w + (size_t)u * K;
    }
    __device__ __forceinline__ void issue() {
        if (unit < units) {
            if (k < K) cp_async16(ring + slot * PIPE_CHUNK, row + k);
            k += PIPE_CHUNK;
            if (++j == mine) {
                start(unit + groups);
            } else if (PAIRS && j == chunks) {  // the unit's second row
                row += half;
                k = (threadIdx.x & 31) * 8;
            }
        }
        slot = slot == PIPE_STAGES - 1 ? 0 : slot + 1;
        cp_async_commit();
    }
};

template <int XOP, bool PAIRS, int R>
__device__ __forceinline__ void gemv_unit_body(void* y, const bf16* __restrict__ x, const bf16* __restrict__ w,
                                               const bf16* __restrict__ norm, const int* __restrict__ positions,
                                               int N, int K, int mode, float eps) {
    extern __shared__ __align__(16) unsigned char pipe_raw[];
    __shared__ float scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    // R > 1: warp w of block b takes units w * blocks + b + i * groups, so the units left over after whole rounds
    // (units % groups) go to warp 0 of every block, then warp 1, ...: blocks differ by one unit at most (b * nwarps + w
    // gives them to every warp of the first blocks, whose SMs then carry up to nwarps more). H200, graph step at
    // context 512, A/B, two rounds in each of two calls (session 27): 1b B = 2 750.0 -> 730.1 and 743.7 -> 728.2 us,
    // small B = 2 278.6 -> 279.4 and 276.5 -> 275.1, 1b B = 3 1014.6 -> 1016.7; at R = 1 it was 594.5 -> 597.8 us
    // (1b), 197.2 -> 199.1 (small), so R = 1 keeps the block-major order.
    const int group = R == 1 ? blockIdx.x * nwarps + warp : warp * gridDim.x + blockIdx.x;
    const int groups = gridDim.x * nwarps;
    const int chunks = (K + PIPE_CHUNK - 1) / PIPE_CHUNK, units = PAIRS ? N / 2 : N;
    bf16* rings = reinterpret_cast<bf16*>(pipe_raw);      // [nwarps][PIPE_STAGES][PIPE_CHUNK]
    bf16* xs = rings + nwarps * PIPE_STAGES * PIPE_CHUNK;  // [R][K] the input rows
    bool on[R];  // positions may be read before the wait (pdl.cuh)
#pragma unroll
    for (int r = 0; r < R; ++r) on[r] = row_active(positions, r);
    bool any = on[0];  // spelled so, gemv's R = 1 SASS is what it was before R (`any |= on[r]` changed it)
#pragma unroll
    for (int r = 1; r < R; ++r) any = any || on[r];
    UnitStream<PAIRS> st{rings + warp * PIPE_STAGES * PIPE_CHUNK + lane * 8, w, K, units, groups,
                         PAIRS ? 2 * chunks : chunks, chunks, (size_t)units * K};  // the rest zero (slot 0)
    st.start(any ? group : units);  // a batch of inactive rows loads nothing
    // R = 1: the whole ring in flight before the wait, each slot refilled after its dot; R > 1: PIPE_STAGES - 1, the
    // next chunk issued before the dot, as gemv_body. H200, decode step at context 512, A/B, three rounds (session
    // 17): 1b B = 1 602.9 -> 596.0 us (its units are 8 or more chunks: the first is wholly in flight before the
    // wait), small B = 1 195.8 -> 196.8 (3-chunk units: all in flight either way); at R = 2 it lost on both (1b
    // 744.1 -> 750.4, small 270.7 -> 272.3).
    constexpr int AHEAD = R == 1 ? PIPE_STAGES : PIPE_STAGES - 1;
#pragma unroll
    for (int i = 0; i < AHEAD; ++i) st.issue();
    const uint4 g_first = norm_first<XOP>(norm, 0, K);
    pdl_begin();  // the first ring and the norm weights are in flight before the wait; x is read after it
    // OUT_RESIDUAL: lane i loads y[r, n] of this warp's unit i (i < 32) now, in flight while x is staged, and the
    // store adds it from a shuffle instead of waiting on an L2 round trip after each unit's sum (later units load
    // theirs at the store).
    float res[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int n = group + lane * groups;
        res[r] = mode == OUT_RESIDUAL && on[r] && n < units
            ? __bfloat162float(static_cast<const bf16*>(y)[(size_t)r * N + n]) : 0.0f;
    }
    if (any) {
        // An inactive row's xs is not written: its sums are computed, not stored.
        if constexpr (R == 1) {
            if (on[0]) stage_x<XOP>(xs, x, norm, 0, K, 0, K, eps, scratch, g_first);
        } else {
            stage_rows<XOP, R>(xs, x, norm, on, K, eps, scratch, g_first);
        }
        __syncthreads();
#ifdef RG_TRACE
        rg_trace_mark(RG_STAGED);
#endif
        int slot = 0;
        // One chunk: wait for it and a += w . x over this lane's 8 (R rows); the refill (AHEAD chunks on) goes into
        // the slot the previous chunk used, or with the whole ring in flight into this chunk's own slot after its
        // dot (each lane reads and refills only its own 16 bytes of a slot, so no barrier either way).
        auto chunk = [&](int c, float (&a)[R]) {
            cp_async_wait<AHEAD - 1>();
            if (AHEAD < PIPE_STAGES) st.issue();
            const int kk = c * PIPE_CHUNK + lane * 8;
            if (kk < K) dot8_rows<R>(a, st.ring + slot * PIPE_CHUNK, xs + kk, K);
            if (AHEAD == PIPE_STAGES) st.issue();
            slot = slot == PIPE_STAGES - 1 ? 0 : slot + 1;
        };
        for (int n = group, i = 0; n < units; n += groups, ++i) {
            float acc[R] = {}, acc_u[R] = {};  // the unit's first row; its second (PAIRS)
            for (int c = 0; c < chunks; ++c) chunk(c, acc);
            if (PAIRS) {
                for (int c = 0; c < chunks; ++c) chunk(c, acc_u);
#pragma unroll
                for (int r = 0; r < R; ++r) acc_u[r] = warp_sum(acc_u[r]);
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                acc[r] = warp_sum(acc[r]);
                const float pre = __shfl_sync(0xffffffffu, res[r], i & 31);
                if (lane == 0 && mode == OUT_RESIDUAL && i < 32) {
                    if (on[r]) static_cast<bf16*>(y)[(size_t)r * N + n] = __float2bfloat16(pre + acc[r]);
                } else if (lane == 0) {
                    store_unit(y, mode, 0, R, N, r, n, acc[r], acc_u[r], on[r]);
                }
            }
        }
#ifdef RG_TRACE
        rg_trace_mark(RG_SUMMED);
#endif
    } else {  // block-uniform: no input read, zeros stored (store_row)
        for (int n = group; n < units && lane == 0; n += groups) {
#pragma unroll
            for (int r = 0; r < R; ++r) store_unit(y, mode, 0, R, N, r, n, 0.0f, 0.0f, false);
        }
    }
    cp_async_wait<0>();  // only empty groups remain
}

// Whether a launch is the unit stream's case of R batch rows (grid-uniform): B = R, one warp per unit, one K range.
template <int R>
__device__ __forceinline__ bool unit_stream_case(int B, int parts, int k_chunk, int K) {
    return B == R && parts == 1 && gridDim.y == 1 && k_chunk >= K;
}

// The unit stream of R batch rows, by x_op and mode.
template <int R>
__device__ __forceinline__ void gemv_units(void* y, const bf16* x, const bf16* w, const bf16* norm,
                                           const int* positions, int N, int K, int mode, float eps, int x_op) {
    if (mode == OUT_SILU && x_op == X_RMSNORM)
        gemv_unit_body<X_RMSNORM, true, R>(y, x, w, norm, positions, N, K, mode, eps);
    else if (mode == OUT_SILU)
        gemv_unit_body<X_PLAIN, true, R>(y, x, w, norm, positions, N, K, mode, eps);
    else if (x_op == X_RMSNORM)
        gemv_unit_body<X_RMSNORM, false, R>(y, x, w, norm, positions, N, K, mode, eps);
    else
        gemv_unit_body<X_PLAIN, false, R>(y, x, w, norm, positions, N, K, mode, eps);
}

// gemv_body by x_op and mode: any B, parts and K split.
__device__ __forceinline__ void gemv_general(void* y, const bf16* x, const bf16* w, const bf16* norm,
                                             const int* positions, int B, int N, int K, int k0, int k1, int mode,
                                             float eps, int x_op, int parts) {
    if (mode == OUT_SILU && x_op == X_RMSNORM) {  // the decode step's gate_up
        gemv_body<X_RMSNORM, true>(y, x, w, norm, positions, B, N, K, k0, k1, mode, eps, parts);
    } else if (mode == OUT_SILU) {
        gemv_body<X_PLAIN, true>(y, x, w, norm, positions, B, N, K, k0, k1, mode, eps, parts);
    } else if (x_op == X_RMSNORM) {
        gemv_body<X_RMSNORM, false>(y, x, w, norm, positions, B, N, K, k0, k1, mode, eps, parts);
    } else {
        gemv_body<X_PLAIN, false>(y, x, w, norm, positions, B, N, K, k0, k1, mode, eps, parts);
    }
}

// 64 registers at most: 4 blocks of 8 warps would fit an SM; plans.py runs 3 (GEMV_THREE_PER_SM_SHARED).
extern "C" __global__ void __launch_bounds__(256, 4) gemv(void* y, const bf16* __restrict__ x,
                                                          const bf16* __restrict__ w, const bf16* __restrict__ norm,
                                                          const int* __restrict__ positions, int B, int N, int K,
                                                          int k_chunk, int mode, float eps, int x_op, int parts) {
#ifdef RG_TRACE
    rg_trace_enter();
#endif
    const int k0 = blockIdx.y * k_chunk, k1 = min(K, k0 + k_chunk);
    if (unit_stream_case<1>(B, parts, k_chunk, K))
        gemv_units<1>(y, x, w, norm, positions, N, K, mode, eps, x_op);
    else
        gemv_general(y, x, w, norm, positions, B, N, K, k0, k1, mode, eps, x_op, parts);
#ifdef RG_TRACE
    rg_trace_exit();
#endif
}

// gemv_unit (B = 1, parts = 1, one K range: every B = 1 projection of the decode step): gemv's unit stream and
// nothing else, so the kernel holds only the path it runs (3064 SASS instructions and 48 registers, against gemv's
// 7024 and 64, NVRTC 13.0), as gemv_rows2 / gemv_rows3 do for B = 2 / 3. Outside that domain it stores nothing:
// gemv_plan never launches it there and refuses to when asked (run gemv instead). Same grid, block, shared memory
// and arguments as gemv, and the same output bytes (the units in the same order).
extern "C" __global__ void __launch_bounds__(256, 4) gemv_unit(void* y, const bf16* __restrict__ x,
                                                               const bf16* __restrict__ w,
                                                               const bf16* __restrict__ norm,
                                                               const int* __restrict__ positions, int B, int N,
                                                               int K, int k_chunk, int mode, float eps, int x_op,
                                                               int parts) {
#ifdef RG_TRACE
    rg_trace_enter();
#endif
    if (unit_stream_case<1>(B, parts, k_chunk, K))
        gemv_units<1>(y, x, w, norm, positions, N, K, mode, eps, x_op);
#ifdef RG_TRACE
    rg_trace_exit();
#endif
}

// gemv_rows2 / gemv_rows3 (B = R = 2 / 3): gemv's unit stream over all R rows at once: each weight chunk is read once
// and multiplied by the R staged x rows (dot8_rows), where gemv_mma's tensor-core passes cost more. It needs B = R,
// parts = 1, one K range and dynamic shared memory of at least warps * PIPE_STAGES * 512 + B * K * 2 bytes (the rings
// and the B x rows); otherwise, and for any other B, it runs gemv's general body, so it is correct for every B and
// launch. One kernel per R, so that each compiles apart: until session 43 one 211 KB kernel held both; split and with
// stage_rows, 1b B = 2 / 3 -5.4 / -11.3% and small B = 2 -10.4% (the split alone -4.7 / -9.1 / -5.4%; H100, session
// 44). Same arguments as gemv. 80 registers at most: 3 blocks of 8 warps per SM. Each row's sum is gemv's at B = 1
// (chunk order, the same bytes). Its chunk loop grows by ~17 instructions a row (one 16-byte x load, 8 widenings, 8
// FMAs) and each unit by a warp reduction and a store a row, so it pays while the weight bytes, not the issue, bound
// the launch: H200, decode step, context 512 (session 17, A/B with gemv_mma): 1b B = 2 1057 -> 777 us, B = 3 1118 ->
// 1050; small B = 2 276.5 -> 274.7, B = 3 300 -> 331 (K = 768: 3 chunks a row); B = 4 lost on both (1b 1145 -> 1200,
// small 307 -> 372), so it stops at 3 rows (plans.py says where it runs).
#define GEMV_ROWS_MAX 3

__device__ __forceinline__ unsigned dynamic_smem_size() {
    unsigned s;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(s));
    return s;
}

template <int R>
__device__ __forceinline__ void gemv_rows_body(void* y, const bf16* __restrict__ x, const bf16* __restrict__ w,
                                               const bf16* __restrict__ norm, const int* __restrict__ positions,
                                               int B, int N, int K, int k_chunk, int mode, float eps, int x_op,
                                               int parts) {
#ifdef RG_TRACE
    rg_trace_enter();
#endif
    const int k0 = blockIdx.y * k_chunk, k1 = min(K, k0 + k_chunk);
    const unsigned need = (blockDim.x >> 5) * PIPE_STAGES * PIPE_CHUNK * 2 + (unsigned)B * K * 2;
    if (unit_stream_case<R>(B, parts, k_chunk, K) && dynamic_smem_size() >= need)
        gemv_units<R>(y, x, w, norm, positions, N, K, mode, eps, x_op);
    else
        gemv_general(y, x, w, norm, positions, B, N, K, k0, k1, mode, eps, x_op, parts);
#ifdef RG_TRACE
    rg_trace_exit();
#endif
}

extern "C" __global__ void __launch_bounds__(256, 3) gemv_rows2(void* y, const bf16* __restrict__ x,
                                                                const bf16* __restrict__ w,
                                                                const bf16* __restrict__ norm,
                                                                const int* __restrict__ positions, int B, int N,
                                                                int K, int k_chunk, int mode, float eps, int x_op,
                                                                int parts) {
    gemv_rows_body<2>(y, x, w, norm, positions, B, N, K, k_chunk, mode, eps, x_op, parts);
}

extern "C" __global__ void __launch_bounds__(256, 3) gemv_rows3(void* y, const bf16* __restrict__ x,
                                                                const bf16* __restrict__ w,
                                                                const bf16* __restrict__ norm,
                                                                const int* __restrict__ positions, int B, int N,
                                                                int K, int k_chunk, int mode, float eps, int x_op,
                                                                int parts) {
    gemv_rows_body<GEMV_ROWS_MAX>(y, x, w, norm, positions, B, N, K, k_chunk, mode, eps, x_op, parts);
}

extern "C" __global__ void splitk_reduce(void* y, const float* __restrict__ partial,
                                         const int* __restrict__ positions, int B, int N, int splits, int mode) {
    const int outs = mode == OUT_SILU ? N / 2 : N;  // outputs per batch row (OUT_SILU: g in n, u in n + N/2)
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int b = (int)(i / outs), n = (int)(i % outs);
    const bool active = i < (size_t)B * outs && row_active(positions, b);  // before the wait (pdl.cuh)
    pdl_begin();
    if (i < (size_t)B * outs) reduce_unit(y, partial, B, N, splits, mode, b, n, active);
}
