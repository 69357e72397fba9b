// Paged decode attention (flash-decoding split-KV, grouped-query) with RoPE and the KV append fused in, and the
// combine of its partial results.
//
// Input is the fused QKV projection output, row b = [q (H*hd) | k (KVH*hd) | v (KVH*hd)], for the token at
// pos = positions[b]. For an active row (pos >= 0):
//   k_cache[blk, kh, off, :] = rope(k[b, kh, :], pos)     blk = block_tables[b, pos / 16], off = pos % 16
//   v_cache[blk, kh, off, :] = v[b, kh, :]
//   out[b, h, :] = softmax(rope(q[b, h, :], pos) . K[b, 0:ctx, kv(h), :]^T * scale) @ V[b, 0:ctx, kv(h), :]
//   ctx = pos + 1; token t of row b lives in block block_tables[b, t / 16], slot t % 16; kv(h) = h / (H / KVH).
//   rope is Hugging Face rotate-half with cos/sin read from rope_cos/rope_sin[pos] (fp32 tables of
//   cos/sin(pos * theta^(-2i/hd)), computed in float64: rawgraphs.model.reference.rope_tables; an fp32
//   pos * inv_freq alone would be off by up to ~2.4e-4 rad at pos 4096). rope(q) and rope(k) are rounded to
//   bf16 (as a stored q and the cache hold them). Rows with pos < 0 read no KV, append nothing, write zeros.
// Fusing RoPE and the append here (they were a kernel of their own, one block per row, ~8 us per layer at B = 1
// on the H200 for a few KB of work) saves a launch and a chain of dependent round trips per layer. The block
// whose split holds pos appends the new K/V (one block per KV head writes the cache) and uses the new token from
// shared memory, never from the cache slot it writes in the same launch.
//
// attention<HD, G, PRE>, HD in {16, 64, 128}, G in {1, 2, 4}: a template kernel, one instantiation per head dim
//   and query heads per block G, so each holds only the registers it needs; PRE = true loads each warp's first
//   K/V page into registers before the PDL wait (same results, bit for bit; more registers, so attn_plan.py
//   gives it to B <= 32).
//   grid  = (B, H / G, max_splits), block = (128) = 4 warps, no dynamic shared memory.
//   Block (b, y, s) serves query heads [y*G, y*G + G) (G divides H/KVH: all of one KV head's group, or an
//   equal share of it, so the group's K/V is read once per block) over tokens [s*part, (s+1)*part) of row b,
//   part = the row's tokens per split (attn_part: the plan's partition; for a plan with min_partition <
//   partition, a short context gets as few as min_partition tokens per split, up to 16 splits: B = 1 at
//   context 513 measured 8.1 us with 64-token splits and 9.8 us with 128, while 4096 tokens wanted 128:
//   16.8 us vs 20.7); a block whose split starts at or past ctx exits at once, so the grid is fixed for the
//   maximum context and one CUDA graph serves every length. Warps take 16-token pages in
//   turn; each lane issues hd/16 16-byte loads of K and of V per page (a page of one KV head is one
//   contiguous 16*hd*2-byte run), runs an online softmax in the log2 domain (fp32), and the 4 warps merge
//   through shared memory in a fixed order.
//   max_splits == 1: the block writes out directly (normalised bf16) and no combine is launched.
//   max_splits  > 1, counters null: the block writes unnormalised partials (fp32) to the workspace;
//   attention_combine merges them.
//   max_splits  > 1, counters given (fused combine, no second launch): a row whose context fits one
//   split is written directly by its split-0 block; otherwise every block with tokens writes its partials
//   and counts itself in counters[b, y] (one acq_rel atomic after a barrier); the last of the row's
//   n = ceil(ctx / part) blocks resets the counter to 0 (ready for the next launch or graph replay) and merges
//   the n partials in split order (the same order whichever block is last: bit-identical run to run).
//   Contexts are clamped to min(max_blocks * 16, max_splits * partition) (what the table and grid can hold).
//   Arguments:
//     out          [B, H * hd]                    bf16   (written when max_splits == 1)
//     part_o       [B, H, max_splits, hd]         fp32   workspace (unused when max_splits == 1; may be null)
//     part_ml      [B, H, max_splits, 2]          fp32   workspace: running max (log2 domain), sum of exp2
//     counters     [B, H / G]                     int32  zero before the first launch, zero after each; or null
//     qkv          [B, (H + 2 * KVH) * hd]        bf16   (before RoPE)
//     k_cache      [num_blocks, KVH, 16, hd]      bf16
//     v_cache      [num_blocks, KVH, 16, hd]      bf16
//     block_tables [B, max_blocks]                int32
//     positions    [B]                            int32
//     max_blocks   row stride of block_tables; n_heads H, n_kv_heads KVH; partition (tokens per split, a
//     multiple of 64, at most 2048); min_partition (a multiple of 64, <= partition: the fewest tokens per
//     split of a short context); max_splits (== gridDim.z); prefetch: K/V pages per warp moved into L2
//     before the PDL wait (attn_plan.py chooses it: it pays at B = 1 only); scale (1/sqrt(hd)).
//     rope_cos     [max_blocks * 16, hd / 2]     fp32   cos of position x frequency (a constant table)
//     rope_sin     [max_blocks * 16, hd / 2]     fp32   sin
//
// attention_combine: merges the partials of the splits that hold tokens in a fixed order (deterministic);
//   the split loads are issued in parallel, not as a chain (n chained L2 round trips dominated short
//   contexts).
//   grid = (B, H), block = (256), dynamic shared memory = (2 * max_splits + 256) * 4 bytes. Inactive rows
//   write zeros. Requires head_dim <= 256.
//   Arguments: out [B, H*hd] bf16; part_o, part_ml as above; positions [B] int32; max_blocks; n_heads;
//   head_dim; partition; min_partition; max_splits (the attention launch's).
//
// Measured on the H200 (benchmarks/attention_bandwidth.py, H=16, hd=128, plan for max_seq_len=4096, cold KV):
//   MHA B=64 ctx 4096: 511 us attention + 9 us combine = 4131 GB/s of KV (0.97 of 4270); B=37: 0.95, and
//   B=48 with 11 inactive rows costs the same as B=37. GQA (KVH=4, G=4) B=64 ctx 4096: 0.70. Short work is
//   latency-bound: B=1 ctx 4096 MHA 13 us + 8 us combine; any launch here costs >= ~7 us (cold loads chain).
//   B=1 MHA with the combine fused, 64 / 128 (plan) / 256 tokens per split: ctx 513 8.1 / 9.8 / 12.5 us,
//   ctx 4096 20.7 / 16.8 / 16.7 us (benchmarks/NOTES.md, session 2).

#include "common.cuh"
#include "pdl.cuh"

#define ATTN_PAGE 16     // tokens per KV-cache block
#define ATTN_WARPS 4
#define ATTN_COMBINE_THREADS 256
#define LOG2E 1.4426950408889634f
#define ATTN_NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ int attn_ctx(int pos, int max_blocks, int partition, int max_splits) {
    return min(pos + 1, min(max_blocks * ATTN_PAGE, partition * max_splits));
}

// Tokens per split for a row of ctx tokens: enough 64-token multiples for at most ATTN_SHORT_SPLITS splits (and
// at most max_splits), at least min_partition, at most the plan's partition. With min_partition == partition
// (every plan but the smallest batches) that is the partition.
#define ATTN_SHORT_SPLITS 16
__device__ __forceinline__ int attn_part(int ctx, int partition, int min_partition, int max_splits) {
    const int per = 64 * min(ATTN_SHORT_SPLITS, max_splits);
    return min(partition, max(min_partition, (ctx + per - 1) / per * 64));
}

// RoPE on this lane's 8 dims [8c, 8c + 8) of one head (rotate-half), rounded to bf16: the partner dims
// (8c +- hd/2) are lane c ^ C/2's chunk of the same token group, so every lane of the warp must call this.
template <int C>
__device__ __forceinline__ uint4 rope8(const uint4& raw, int c, const float* cos_s, const float* sin_s) {
    float x[8], p[8];
    bf16x8_to_float(raw, x);
#pragma unroll
    for (int k = 0; k < 8; ++k) p[k] = __shfl_xor_sync(0xffffffffu, x[k], C / 2);
    const int i0 = (c % (C / 2)) * 8;
#pragma unroll
    for (int k = 0; k < 8; ++k)  // first half: x0 cos - x1 sin; second half: x1 cos + x0 sin
        x[k] = c < C / 2 ? x[k] * cos_s[i0 + k] - p[k] * sin_s[i0 + k] : x[k] * cos_s[i0 + k] + p[k] * sin_s[i0 + k];
    return float_to_bf16x8(x);
}

template <int HD, int G, bool PRE>
__device__ __forceinline__ void attention_block(
        __nv_bfloat16* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_ml,
        int* __restrict__ counters, const __nv_bfloat16* __restrict__ qkv,
        __nv_bfloat16* __restrict__ k_cache, __nv_bfloat16* __restrict__ v_cache,
        const int* __restrict__ block_tables, const int* __restrict__ positions, int max_blocks, int n_heads,
        int n_kv_heads, int partition, int min_partition, int max_splits, int prefetch, float scale,
        const float* __restrict__ rope_cos, const float* __restrict__ rope_sin) {
    constexpr int C = HD / 8;       // lanes per token row (one 16-byte chunk of 8 bf16 each)
    constexpr int TPL = 32 / C;     // tokens covered by one warp-wide load
    constexpr int J = ATTN_PAGE / TPL;  // loads per lane per page (K and V each)
    __shared__ float m_s[ATTN_WARPS][G], l_s[ATTN_WARPS][G];
    __shared__ float o_s[ATTN_WARPS][G][HD];
    __shared__ float cos_s[HD / 2], sin_s[HD / 2];  // RoPE at this row's position
    __shared__ uint4 kv_new[2][C];                  // the appended token's K (after RoPE) and V

    const int b = blockIdx.x, h0 = blockIdx.y * G, split = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int c = lane % C, tg = lane / C;
    // Before the PDL wait (the kernel above only lets the next one launch): the step's inputs - positions
    // and the block table -, the RoPE angles, and an L2 prefetch of this warp's first `prefetch` old K/V
    // pages (kernels/pdl.cuh says why that is safe), overlapping the qkv projection's tail. Prefetching
    // every page of the split (512 tokens: 256 KB per block at hd 128, far more than the 60 MB L2 holds over
    // the resident blocks) evicted lines before their use: B=64 at context 4096 fell from 1.0 to 0.64 of HBM
    // bandwidth (benchmarks/attention_bandwidth.py); from B = 8 on even 2 pages per warp cost 2-15%. This
    // warp's pages are first, first + 4, ...: lane i fetches the block of the i-th one up front, so the table
    // lookup is not a dependent load ahead of every page (partition <= 2048 keeps i < 32); entries past the
    // context are fetched but never used.
    const int pos = positions[b];
    const int ctx = attn_ctx(pos, max_blocks, partition, max_splits);
    const int part = attn_part(ctx, partition, min_partition, max_splits);  // this row's tokens per split
    const int first = split * part / ATTN_PAGE + warp;
    const int my_page = first + lane * ATTN_WARPS;
    const int my_blk = my_page < max_blocks ? block_tables[(long long)b * max_blocks + my_page] : 0;
    const int t0 = split * part;
    const int n_used = (ctx + part - 1) / part;  // splits that hold tokens (0 for inactive rows)
    const bool direct = max_splits == 1 || (counters != nullptr && n_used <= 1);  // this block writes out
    if (t0 >= ctx) {  // past the end (or inactive): nothing to read
        if (split == 0 && direct) {  // this block owns the zero output
            pdl_wait();
            for (int e = threadIdx.x; e < G * HD; e += blockDim.x)
                out[((long long)b * n_heads + h0) * HD + e] = __float2bfloat16(0.f);
        }
        return;
    }
    const int group = n_heads / n_kv_heads, kh = h0 / group;
    const bool newest = pos >= t0 && pos < min(t0 + part, ctx);  // this split holds the appended token
    const long long slot = newest ? ((long long)block_tables[(long long)b * max_blocks + pos / ATTN_PAGE]
                                     * n_kv_heads + kh) * ATTN_PAGE + pos % ATTN_PAGE : 0;
    const long long angles = (long long)min(pos, max_blocks * ATTN_PAGE - 1) * (HD / 2);  // table row
    for (int i = threadIdx.x; i < HD / 2; i += blockDim.x) {
        cos_s[i] = rope_cos[angles + i];
        sin_s[i] = rope_sin[angles + i];
    }
    // PRE (attention<hd, G, true>): each warp's first K/V page is loaded into the page loop's registers before the
    // wait, so the loop starts without an L2 round trip after it. Old pages do not depend on the kernel before
    // (kernels/pdl.cuh); slots at or past t1 are masked in the loop. Holding them across the wait costs registers
    // (attention<128,1,*> 80 -> 126, 127 with the device's NVRTC), so only plans up to B = 32 take it (attn_plan.py).
    // That is at the edge: up to 128, one attention block still fits beside the qkv projection's three gemv blocks per
    // SM at B = 1 (tests/test_kernels_attn.py::test_b1_attention_fits_beside_the_qkv_projection).
    // (t1's expression, spelled here: defining t1 itself this early changed the PRE = false SASS, unmeasured)
    const bool preloaded = PRE && first * ATTN_PAGE < (newest ? pos : min(t0 + part, ctx));  // a page before t1
    uint4 kr[J], vr[J];
    if (preloaded) {
        const long long base = (((long long)__shfl_sync(0xffffffffu, my_blk, 0) * n_kv_heads + kh) * ATTN_PAGE) * HD;
#pragma unroll
        for (int j = 0; j < J; ++j) kr[j] = __ldg(reinterpret_cast<const uint4*>(k_cache + base) + j * 32 + lane);
#pragma unroll
        for (int j = 0; j < J; ++j) vr[j] = __ldg(reinterpret_cast<const uint4*>(v_cache + base) + j * 32 + lane);
    }
    {
        constexpr int LINES = ATTN_PAGE * HD * 2 / 128;  // 128-byte lines of one page's K (and of its V)
        const int t_end = min(t0 + part, ctx);
        for (int i = preloaded, page = first + preloaded * ATTN_WARPS; i < prefetch && page * ATTN_PAGE < t_end;
             ++i, page += ATTN_WARPS) {
            const long long base = (((long long)__shfl_sync(0xffffffffu, my_blk, i) * n_kv_heads + kh)
                                    * ATTN_PAGE) * HD;
            for (int l = lane; l < 2 * LINES; l += 32) {
                const char* p = (const char*)((l < LINES ? k_cache : v_cache) + base) + (l % LINES) * 128;
                asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
            }
        }
    }
    pdl_wait();
    // The qkv row (written by the projection before): every load of it is issued before any is used.
    const __nv_bfloat16* row = qkv + (long long)b * (n_heads + 2 * n_kv_heads) * HD;
    uint4 qraw[G], kraw, vraw;
#pragma unroll
    for (int g = 0; g < G; ++g) qraw[g] = *reinterpret_cast<const uint4*>(row + (h0 + g) * HD + c * 8);
    if (newest && warp == 0) {
        kraw = *reinterpret_cast<const uint4*>(row + (n_heads + kh) * HD + c * 8);
        vraw = *reinterpret_cast<const uint4*>(row + (n_heads + n_kv_heads + kh) * HD + c * 8);
    }
    __syncthreads();  // the angle table
    // q after RoPE (bf16), this lane's 8 dims of each query head, pre-scaled into the log2 domain.
    float qr[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        bf16x8_to_float(rope8<C>(qraw[g], c, cos_s, sin_s), qr[g]);
#pragma unroll
        for (int k = 0; k < 8; ++k) qr[g][k] *= scale * LOG2E;
    }
    if (newest) {  // block-uniform: warp 0 ropes the new K; the first block of the KV head's group appends
        if (warp == 0) {
            const uint4 kr = rope8<C>(kraw, c, cos_s, sin_s);
            if (tg == 0) {
                kv_new[0][c] = kr;
                kv_new[1][c] = vraw;
                if (h0 % group == 0) {
                    reinterpret_cast<uint4*>(k_cache + slot * HD)[c] = kr;
                    reinterpret_cast<uint4*>(v_cache + slot * HD)[c] = vraw;
                }
            }
        }
        __syncthreads();
    }
    // The appended token (newest block: pos == t1 - 1) is added after the pages, from shared memory: the
    // cache slot is being written in this launch. (Swapping it into the page loop cost 32 more registers.)
    const int t1 = newest ? pos : min(t0 + part, ctx);

    float m[G], l[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = ATTN_NEG_INF;
        l[g] = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[g][k] = 0.f;
    }

    for (int i = 0, page = first; page * ATTN_PAGE < t1; ++i, page += ATTN_WARPS) {
        if (i > 0 || !preloaded) {
            const int blk = __shfl_sync(0xffffffffu, my_blk, i);
            const long long base = (((long long)blk * n_kv_heads + kh) * ATTN_PAGE) * HD;
            const uint4* kp = reinterpret_cast<const uint4*>(k_cache + base);
            const uint4* vp = reinterpret_cast<const uint4*>(v_cache + base);
#pragma unroll
            for (int j = 0; j < J; ++j) kr[j] = __ldg(kp + j * 32 + lane);
#pragma unroll
            for (int j = 0; j < J; ++j) vr[j] = __ldg(vp + j * 32 + lane);
        }
        float s[G][J];
#pragma unroll
        for (int j = 0; j < J; ++j) {
            float kf[8];
            bf16x8_to_float(kr[j], kf);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float d = 0.f;
#pragma unroll
                for (int k = 0; k < 8; ++k) d = fmaf(qr[g][k], kf[k], d);
                s[g][j] = d;
            }
        }
#pragma unroll
        for (int off = C / 2; off >= 1; off /= 2)  // full dot products across the C lanes of a token row
#pragma unroll
            for (int g = 0; g < G; ++g)
#pragma unroll
                for (int j = 0; j < J; ++j) s[g][j] += __shfl_xor_sync(0xffffffffu, s[g][j], off);

        const int tok0 = page * ATTN_PAGE + tg;
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float mx = ATTN_NEG_INF;
#pragma unroll
            for (int j = 0; j < J; ++j) {
                if (tok0 + j * TPL >= t1) s[g][j] = ATTN_NEG_INF;  // slots past t1 may hold anything
                mx = fmaxf(mx, s[g][j]);
            }
#pragma unroll
            for (int off = C; off < 32; off *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_new = fmaxf(m[g], mx);  // finite: the page's first token is in range
            const float alpha = exp2f(m[g] - m_new);
            m[g] = m_new;
            l[g] *= alpha;
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[g][k] *= alpha;
        }
#pragma unroll
        for (int j = 0; j < J; ++j) {
            if (tok0 + j * TPL >= t1) continue;  // never multiply a garbage V slot (it may be NaN) by 0
            float vf[8];
            bf16x8_to_float(vr[j], vf);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float p = exp2f(s[g][j] - m[g]);
                l[g] += p;
#pragma unroll
                for (int k = 0; k < 8; ++k) acc[g][k] = fmaf(p, vf[k], acc[g][k]);
            }
        }
    }

    if (newest && warp == 0) {  // the appended token, one more online-softmax step (lanes tg == 0 add it)
        float kf[8], vf[8];
        bf16x8_to_float(kv_new[0][c], kf);
        bf16x8_to_float(kv_new[1][c], vf);
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float d = 0.f;
#pragma unroll
            for (int k = 0; k < 8; ++k) d = fmaf(qr[g][k], kf[k], d);
#pragma unroll
            for (int off = C / 2; off >= 1; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
            const float m_new = fmaxf(m[g], d), alpha = exp2f(m[g] - m_new), p = tg == 0 ? exp2f(d - m_new) : 0.f;
            m[g] = m_new;
            l[g] = fmaf(l[g], alpha, p);
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[g][k] = fmaf(acc[g][k], alpha, p * vf[k]);
        }
    }

    // Sum over the token groups of the warp (lanes with the same chunk c), then publish per warp.
#pragma unroll
    for (int off = C; off < 32; off *= 2)
#pragma unroll
        for (int g = 0; g < G; ++g) {
            l[g] += __shfl_xor_sync(0xffffffffu, l[g], off);
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[g][k] += __shfl_xor_sync(0xffffffffu, acc[g][k], off);
        }
    if (tg == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
#pragma unroll
            for (int k = 0; k < 8; ++k) o_s[warp][g][c * 8 + k] = acc[g][k];
            if (c == 0) {
                m_s[warp][g] = m[g];
                l_s[warp][g] = l[g];
            }
        }
    }
    __syncthreads();

    // Merge the warps in a fixed order. Warps that saw no page have m = -inf, l = 0, o = 0 (weight 0).
    for (int e = threadIdx.x; e < G * HD; e += blockDim.x) {
        const int g = e / HD, d = e % HD;
        float mm = m_s[0][g];
#pragma unroll
        for (int w = 1; w < ATTN_WARPS; ++w) mm = fmaxf(mm, m_s[w][g]);
        float ll = 0.f, oo = 0.f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; ++w) {
            const float wt = exp2f(m_s[w][g] - mm);
            ll = fmaf(l_s[w][g], wt, ll);
            oo = fmaf(o_s[w][g][d], wt, oo);
        }
        const long long bh = (long long)b * n_heads + h0 + g;
        if (direct) {
            out[bh * HD + d] = __float2bfloat16(oo / ll);
        } else {
            part_o[(bh * max_splits + split) * HD + d] = oo;
            if (d == 0) {
                part_ml[(bh * max_splits + split) * 2] = mm;
                part_ml[(bh * max_splits + split) * 2 + 1] = ll;
            }
        }
    }
    if (direct || counters == nullptr) return;

    // Fused combine: the last of the row's n_used blocks merges (threadFenceReduction pattern).
    if (!last_block_of(counters + (long long)b * gridDim.y + blockIdx.y, n_used)) return;
    for (int e = threadIdx.x; e < G * HD; e += blockDim.x) {
        const int g = e / HD, d = e % HD;
        const long long bh = (long long)b * n_heads + h0 + g;
        const float* ml = part_ml + bh * max_splits * 2;
        const float* po = part_o + bh * max_splits * HD + d;
        // One pass in split order with a running max (online softmax): the loads do not wait on each other,
        // so 8 splits' worth are in flight at once. L2 loads (__ldcg): other blocks wrote them in this launch.
        float mm = __ldcg(ml), ll = __ldcg(ml + 1), oo = __ldcg(po);
#pragma unroll 8
        for (int s = 1; s < n_used; ++s) {
            const float ms = __ldcg(ml + 2 * s), ls = __ldcg(ml + 2 * s + 1), os = __ldcg(po + (long long)s * HD);
            const float m_new = fmaxf(mm, ms), w_old = exp2f(mm - m_new), w_new = exp2f(ms - m_new);
            ll = fmaf(ls, w_new, ll * w_old);
            oo = fmaf(os, w_new, oo * w_old);
            mm = m_new;
        }
        out[bh * HD + d] = __float2bfloat16(oo / ll);
    }
}

// One kernel per (head dim, query heads per block, first page preloaded), instantiated by NVRTC name
// expression (rawgraphs.model.attn_plan.KERNELS, e.g. "attention<128,1,true>"): each gets only the registers
// its G and PRE need. rawgraphs reads the signature from this template's declaration (signature.py).
template <int HD, int G, bool PRE>
__global__ void __launch_bounds__(128) attention(
        __nv_bfloat16* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_ml,
        int* __restrict__ counters, const __nv_bfloat16* __restrict__ qkv, __nv_bfloat16* __restrict__ k_cache,
        __nv_bfloat16* __restrict__ v_cache, const int* __restrict__ block_tables, const int* __restrict__ positions,
        int max_blocks, int n_heads, int n_kv_heads, int partition, int min_partition, int max_splits, int prefetch,
        float scale, const float* __restrict__ rope_cos, const float* __restrict__ rope_sin) {
    pdl_launch_dependents();  // attention_block waits after reading the step's inputs
    attention_block<HD, G, PRE>(out, part_o, part_ml, counters, qkv, k_cache, v_cache, block_tables,
        positions, max_blocks, n_heads, n_kv_heads, partition, min_partition, max_splits, prefetch, scale, rope_cos,
        rope_sin);
}

extern "C" __global__ void __launch_bounds__(ATTN_COMBINE_THREADS)
attention_combine(__nv_bfloat16* __restrict__ out, const float* __restrict__ part_o,
                  const float* __restrict__ part_ml, const int* __restrict__ positions, int max_blocks,
                  int n_heads, int head_dim, int partition, int min_partition, int max_splits) {
    pdl_begin();
    extern __shared__ float sm[];
    float* m_s = sm;                   // [max_splits] split maxima (log2 domain)
    float* w_s = sm + max_splits;      // [max_splits] split sums, then weights exp2(m_s - max)
    float* red = sm + 2 * max_splits;  // [ATTN_COMBINE_THREADS] per-group partial outputs
    const int b = blockIdx.x, h = blockIdx.y;
    const long long bh = (long long)b * n_heads + h;
    const int ctx = attn_ctx(positions[b], max_blocks, partition, max_splits);
    if (ctx <= 0) {
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
            out[bh * head_dim + d] = __float2bfloat16(0.f);
        return;
    }
    const int part = attn_part(ctx, partition, min_partition, max_splits);
    const int n = (ctx + part - 1) / part;  // splits that hold tokens (all others were skipped)
    const float* ml = part_ml + bh * max_splits * 2;
    for (int s = threadIdx.x; s < n; s += blockDim.x) {  // all loads in flight at once
        m_s[s] = ml[2 * s];
        w_s[s] = ml[2 * s + 1];
    }
    __syncthreads();
    float mm = m_s[0];
    for (int s = 1; s < n; ++s) mm = fmaxf(mm, m_s[s]);
    float ll = 0.f;  // every thread sums in the same order: the same value everywhere, run to run
    for (int s = 0; s < n; ++s) ll = fmaf(w_s[s], exp2f(m_s[s] - mm), ll);
    __syncthreads();
    for (int s = threadIdx.x; s < n; s += blockDim.x) w_s[s] = exp2f(m_s[s] - mm);
    __syncthreads();

    // Thread (group gi, dim d) sums splits gi, gi + groups, ...; groups are then added in a fixed order.
    const int groups = blockDim.x / head_dim, gi = threadIdx.x / head_dim, d = threadIdx.x % head_dim;
    float oo = 0.f;
    if (gi < groups) {
        const float* po = part_o + bh * max_splits * head_dim + d;
#pragma unroll 8
        for (int s = gi; s < n; s += groups) oo = fmaf(po[(long long)s * head_dim], w_s[s], oo);
    }
    red[threadIdx.x] = oo;
    __syncthreads();
    if (threadIdx.x < head_dim) {
        float o = 0.f;
        for (int g = 0; g < groups; ++g) o += red[g * head_dim + threadIdx.x];
        out[bh * head_dim + threadIdx.x] = __float2bfloat16(o / ll);
    }
}
