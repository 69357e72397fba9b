// basic.cu: small float32 kernels for tests, graph demos and launch/update benchmarks.
//
// axpb:   out[i] = a * x[i] + b (no FMA)   grid = ceil(n / 256), block = 256
// add:    out[i] = x[i] + y[i]               grid = ceil(n / 256), block = 256
// fill64: out[i] = start + i * step (int64)  grid = ceil(n / 256), block = 256
// noop:   does nothing (launch-overhead benchmarks); any grid/block
//
// Arguments: out [n] float32 (int64 for fill64), x, y [n] float32, a, b float32, n int32.

extern "C" __global__ void axpb(float* __restrict__ out, const float* __restrict__ x, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __fadd_rn(__fmul_rn(a, x[i]), b);  // no FMA contraction: exact vs NumPy
}

extern "C" __global__ void add(float* __restrict__ out, const float* __restrict__ x, const float* __restrict__ y,
                               int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}

extern "C" __global__ void fill64(long long* __restrict__ out, long long start, long long step, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = start + (long long)i * step;
}

extern "C" __global__ void noop() {}
