// device_update.cu: kernels that change a *device-updatable* kernel node of the running graph from the device.
//
// cudaGraphKernelNodeSetGridDim / cudaGraphKernelNodeSetParam are device runtime builtins; the CUDA wheels ship
// no crt/ headers for cuda_device_runtime_api.h under NVRTC, so we declare them here. A node handle
// (cudaGraphDeviceNode_t) comes from Graph.make_device_updatable(node).
//
// set_grid_from:   grid.x of `node` = max(1, ceil(*count / per_block))        grid = (1,), block = (1,)
// set_scalar_from: bytes [offset, offset + 4) of `node`'s parameters = *value  grid = (1,), block = (1,)
//   node u64 (device node handle); count [1] int32; per_block int32; value [1] float32; offset u64 (bytes).
// apply_updates:   a batch of node updates, each a cudaGraphKernelNodeUpdate (40 bytes: node u64, field u32
//   + 4 pad, then for a parameter update pValue u64, offset u64, size u64; rawgraphs/device_update.py builds
//   them), split evenly over the threads, each applying its share with cudaGraphKernelNodeUpdatesApply; updates
//   and every pValue must be readable by the device (rawgraphs passes mapped pinned host memory).
//   grid = (any,), block = (any,): one thread applies the whole batch in order, count threads one update each.

struct CUgraphDeviceUpdatableNode_st;
typedef struct CUgraphDeviceUpdatableNode_st* cudaGraphDeviceNode_t;
extern "C" __device__ __cudart_builtin__ cudaError_t CUDARTAPI cudaGraphKernelNodeSetGridDim(cudaGraphDeviceNode_t node,
                                                                                           dim3 gridDim);
extern "C" __device__ __cudart_builtin__ cudaError_t CUDARTAPI cudaGraphKernelNodeSetParam(cudaGraphDeviceNode_t node,
                                                                                         size_t offset,
                                                                                         const void* value,
                                                                                         size_t size);

extern "C" __global__ void set_grid_from(cudaGraphDeviceNode_t node, const int* __restrict__ count, int per_block) {
    const int blocks = (*count + per_block - 1) / per_block;
    cudaGraphKernelNodeSetGridDim(node, dim3(blocks > 0 ? blocks : 1, 1, 1));
}

extern "C" __global__ void set_scalar_from(cudaGraphDeviceNode_t node, const float* __restrict__ value,
                                           unsigned long long offset) {
    cudaGraphKernelNodeSetParam(node, (size_t)offset, value, sizeof(float));
}

// cudaGraphKernelNodeUpdate is one of NVRTC's built-in types (driver_types.h); the builtin itself is declared here.
static_assert(sizeof(cudaGraphKernelNodeUpdate) == 40, "rawgraphs/device_update.py packs 40-byte updates");
extern "C" __device__ __cudart_builtin__ cudaError_t CUDARTAPI cudaGraphKernelNodeUpdatesApply(
    const cudaGraphKernelNodeUpdate* updates, size_t updateCount);

extern "C" __global__ void apply_updates(const cudaGraphKernelNodeUpdate* __restrict__ updates,
                                         unsigned long long count) {
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long per = (count + threads - 1) / threads;
    const unsigned long long i0 = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) * per;
    if (i0 < count) cudaGraphKernelNodeUpdatesApply(updates + i0, (size_t)min(per, count - i0));
}
