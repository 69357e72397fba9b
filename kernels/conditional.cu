// conditional.cu: kernels that steer conditional graph nodes (IF / IF-ELSE / WHILE / SWITCH) from device data.
//
// cudaGraphSetConditional is a device runtime builtin that NVRTC does not declare; it links with no -rdc and
// no cudadevrt (verified on the H200), so we declare it here. A handle is a cudaGraphConditionalHandle
// (unsigned long long) made by cuGraphConditionalHandleCreate.
//
// set_if:      condition = (*flag != 0)                              grid = (1,), block = (1,)
// set_switch:  condition = clamp(*value, 0, n)  (n: no branch runs)  grid = (1,), block = (1,)
// count_down:  condition = (--*counter > 0): a WHILE body that runs *counter times     grid = (1,), block = (1,)
// decode_loop_tail: after one decode step of B rows inside a WHILE body:
//     for each active row b (positions[b] >= 0, done[b] == 0): out[step * B + b] = next[b]; tokens[b] = next[b];
//     on EOS done[b] = 1 and positions[b] = -1 (inactive from now on), else positions[b] += 1; then step += 1 and
//     condition = step < max_steps && some row is active and not done.
//   grid = (1,), block = (B rounded up to a multiple of 32, <= 1024); may be launched with PDL right after the
//   step's last kernel (it reads the loop's own state before the wait, next after it; rawgraphs/model/loop.py
//   launches it so).
//   handle u64; next [B] int32; tokens [B] int32 (next step's input, written); positions [B] int32 (advanced);
//   done [B] int32 (0/1); out [max_steps, B] int32; step [1] int32; max_steps, B, eos int32.
// loop_begin: the decode loop's inputs and state, straight from pinned host memory (h_*: mapped, read over the
//     bus; one kernel node instead of three host-to-device memcpy nodes and three memsets: see
//     rawgraphs/model/loop.py):
//     tokens[b] = h_tokens[b], positions[b] = h_positions[b], done[b] = 0 (b < B); tables[i] = h_tables[i]
//     (i < table_elems); out[i] = -1 (i < out_elems); *step = 0.          grid = (any,), block = (any,)
//   req: null (the one-shot loop), or the resident loop's request (below): DECODE does the above, RESUME only
//     resets out and step (the rows go on from the device's tokens, positions and done), STOP and IDLE nothing.
// loop_end: the loop's results back to pinned host memory (h_*: mapped, written over the bus):
//     h_out[i] = out[i] (i < out_elems); *h_step = *step.                   grid = (any,), block = (any,)
//   req: null, or the resident loop's request: then grid = (1,); a served request's results are written, then
//     h_ns[0] = its globaltimer ns (req[1] to now), then *h_ack = req[0], each write made visible to the host
//     before the next (__threadfence_system): the host reads h_out, h_step, h_ns once it sees its ack.
// bell_wait: the resident loop's doorbell (rawgraphs/model/resident.py). One thread polls the 64-bit word *bell
//     in pinned host memory (seq << 8 | cmd, written by the host after the inputs it stages) until its seq is
//     not req[0]'s (the last request served), or until idle_ns pass with none (globaltimer). Then req[0] = the
//     request (on idle: req[0]'s seq with cmd IDLE), req[1] = globaltimer now, and both WHILE handles of the
//     resident graph = (cmd is DECODE or RESUME): a STOP or an idle spell ends the graph.
//   grid = (1,), block = (1,); serve, decode u64 handles; bell [1] int64 (mapped host); req [2] int64; idle_ns.

#include "pdl.cuh"

// Resident-loop request commands (the low byte of a doorbell word; rawgraphs/model/resident.py says the same).
#define REQ_DECODE 1  // decode from the inputs staged in pinned memory
#define REQ_RESUME 2  // decode on from the device's own tokens and positions
#define REQ_STOP 3    // end the resident graph
#define REQ_IDLE 4    // written by bell_wait: no request for idle_ns, the graph ended

__device__ __forceinline__ long long globaltimer_ns() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ bool req_served(long long r) {
    const int cmd = (int)(r & 0xff);
    return cmd == REQ_DECODE || cmd == REQ_RESUME;
}

typedef unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void CUDARTAPI cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                               unsigned int value);

extern "C" __global__ void set_if(cudaGraphConditionalHandle handle, const int* __restrict__ flag) {
    cudaGraphSetConditional(handle, *flag != 0);
}

extern "C" __global__ void set_switch(cudaGraphConditionalHandle handle, const int* __restrict__ value, int n) {
    const int v = *value;
    cudaGraphSetConditional(handle, (unsigned)(v < 0 ? n : (v > n ? n : v)));
}

extern "C" __global__ void count_down(cudaGraphConditionalHandle handle, int* __restrict__ counter) {
    const int left = --*counter;
    cudaGraphSetConditional(handle, left > 0);
}

extern "C" __global__ void decode_loop_tail(cudaGraphConditionalHandle handle, const int* __restrict__ next,
                                            int* __restrict__ tokens, int* __restrict__ positions,
                                            int* __restrict__ done, int* __restrict__ out, int* __restrict__ step,
                                            int max_steps, int B, int eos) {
    __shared__ int any_live;
    const int b = threadIdx.x;
    // The loop's state (step, positions, done) is read before the wait: only this kernel writes it (the step's
    // kernels read positions, none writes them), and its previous launch ended with the previous iteration.
    // `next` is the step's output: read after the wait, the one L2 round trip left between argmax and the
    // conditional (it was three: step, then the row's state, then next).
    const int s = *step;  // every thread reads before thread 0 writes it back (barrier below)
    const int pos = b < B ? positions[b] : -1;
    const bool live = pos >= 0 && !done[b];
    if (b == 0) any_live = 0;
    pdl_wait();  // next is the step's to write until its last kernel is done
    __syncthreads();
    if (live) {
        const int t = next[b];
        out[(size_t)s * B + b] = t;
        tokens[b] = t;
        if (t == eos) {
            done[b] = 1;
            positions[b] = -1;  // finished rows become inactive: later steps skip their attention
        } else {
            positions[b] = pos + 1;
            any_live = 1;  // benign race: every writer stores 1
        }
    }
    __syncthreads();
    if (b == 0) {
        *step = s + 1;
        cudaGraphSetConditional(handle, (s + 1 < max_steps) && any_live);
    }
}

extern "C" __global__ void loop_begin(int* __restrict__ tokens, int* __restrict__ positions,
                                      int* __restrict__ tables, int* __restrict__ done, int* __restrict__ out,
                                      int* __restrict__ step, const int* __restrict__ h_tokens,
                                      const int* __restrict__ h_positions, const int* __restrict__ h_tables,
                                      int B, int table_elems, int out_elems, const long long* __restrict__ req) {
    bool stage = true;
    if (req != nullptr) {
        const long long r = *req;
        if (!req_served(r)) return;
        stage = (r & 0xff) == REQ_DECODE;
    }
    const int n = max(max(B, table_elems), out_elems);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        if (stage && i < B) {
            tokens[i] = h_tokens[i];
            positions[i] = h_positions[i];
            done[i] = 0;
        }
        if (stage && i < table_elems) tables[i] = h_tables[i];
        if (i < out_elems) out[i] = -1;
        if (i == 0) *step = 0;
    }
}

extern "C" __global__ void loop_end(int* __restrict__ h_out, int* __restrict__ h_step, const int* __restrict__ out,
                                    const int* __restrict__ step, int out_elems, const long long* __restrict__ req,
                                    long long* __restrict__ h_ack, long long* __restrict__ h_ns) {
    const long long r = req != nullptr ? *req : 0;
    if (req == nullptr || req_served(r)) {
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < out_elems; i += gridDim.x * blockDim.x) {
            h_out[i] = out[i];
            if (i == 0) *h_step = *step;
        }
    }
    if (req == nullptr) return;
    __threadfence_system();  // every thread's h_out writes reach the host before thread 0's ack (grid = 1)
    __syncthreads();
    if (threadIdx.x == 0) {
        if (req_served(r)) *(volatile long long*)h_ns = globaltimer_ns() - req[1];
        __threadfence_system();
        *(volatile long long*)h_ack = r;
    }
}

extern "C" __global__ void bell_wait(cudaGraphConditionalHandle serve, cudaGraphConditionalHandle decode,
                                     const long long* __restrict__ bell, long long* __restrict__ req,
                                     long long idle_ns) {
    const long long last = req[0];
    const long long t0 = globaltimer_ns();
    long long r, now;
    for (;;) {
        // acquire at system scope: the host wrote the staged inputs before the bell, and loop_begin reads them
        asm volatile("ld.acquire.sys.global.b64 %0, [%1];" : "=l"(r) : "l"(bell) : "memory");
        now = globaltimer_ns();
        if ((r >> 8) != (last >> 8)) break;
        if (now - t0 >= idle_ns) {
            r = (last & ~0xffLL) | REQ_IDLE;
            break;
        }
        __nanosleep(500);
    }
    req[0] = r;
    req[1] = now;
    const bool go = req_served(r);
    cudaGraphSetConditional(serve, go);
    cudaGraphSetConditional(decode, go);
}
