/* device.c: the device, its context and memory, modules and launches of the fakecuda driver stand-in (README.md).
 * Device memory is host memory, so copies and fills move real bytes; a launch is checked as the driver checks it,
 * its arguments are copied, and it runs (kernels.c) or, on a capturing stream, becomes a node (stream.c). */
#define _GNU_SOURCE
#include "fakecuda.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int ctx_token, device_count = 1;
static size_t bytes_in_use;

/* ---- init, device, context ---- */
CUresult cuDriverGetVersion(int *v) {
    CHECK(v, CUDA_ERROR_INVALID_VALUE);
    *v = 13000;
    return OK;
}
static CUresult f_cuInit(unsigned flags) {
    (void)flags;
    return OK;
}
static CUresult f_cuDeviceGetCount(int *n) {
    *n = device_count;
    return OK;
}
static CUresult f_cuDeviceGet(CUdevice *d, int ordinal) {
    CHECK(ordinal >= 0 && ordinal < device_count, CUDA_ERROR_INVALID_DEVICE);
    *d = ordinal;
    return OK;
}
static CUresult f_cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d;
    snprintf(name, len, "fakecuda H200 stand-in (no GPU)");
    return OK;
}
static CUresult f_cuDeviceTotalMem(size_t *b, CUdevice d) {
    (void)d;
    *b = 150754820096ull;
    return OK;
}
static CUresult f_cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    switch (a) {
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
            *v = 9;
            break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
            *v = 0;
            break;
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
            *v = 132;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
            *v = 1024;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
            *v = 2048;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR:
            *v = 32;
            break;
        case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
            *v = 32;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
            *v = 49152;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
            *v = 232448;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
            *v = 233472;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
        case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR:
            *v = 65536;
            break;
        case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
            *v = 62914560;
            break;
        case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
            *v = 1980000;
            break;
        case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
            *v = 2619000;
            break;
        case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
            *v = 6144;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
            *v = 2147483647;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
            *v = 65535;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
            *v = 1024;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
            *v = 64;
            break;
        default:
            *v = 1;
            break; /* capability flags: the H200 has them */
    }
    return OK;
}
static CUresult f_cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    (void)d;
    memset(u, 0x5a, sizeof *u);
    return OK;
}
static CUresult f_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    CHECK(d >= 0 && d < device_count, CUDA_ERROR_INVALID_DEVICE);
    *c = (CUcontext)&ctx_token;
    return OK;
}
static CUresult f_cuDevicePrimaryCtxRelease(CUdevice d) {
    (void)d;
    return OK;
}
static CUcontext current;
static CUresult f_cuCtxSetCurrent(CUcontext c) {
    current = c;
    return OK;
}
static CUresult f_cuCtxGetCurrent(CUcontext *c) {
    *c = current;
    return OK;
}
static CUresult f_cuCtxGetDevice(CUdevice *d) {
    CHECK(current, CUDA_ERROR_INVALID_CONTEXT);
    *d = 0;
    return OK;
}
static CUresult f_cuCtxSynchronize(void) { return refuse_in_global_capture(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); }
static CUresult f_cuDeviceGetGraphMemAttribute(CUdevice d, CUgraphMem_attribute a, void *v) {
    (void)d;
    uint64_t x = (a == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH || a == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
                     ? graph_bytes_high
                     : graph_bytes_in_use;
    memcpy(v, &x, sizeof x);
    return OK;
}
static CUresult f_cuDeviceGraphMemTrim(CUdevice d) {
    (void)d;
    return OK;
}
static CUresult f_cuProfiler(void) { return OK; }

/* ---- memory ---- */
/* Live allocations (pointer -> bytes), open addressing: a free of anything else is refused as the driver refuses
 * it, and cuMemGetInfo follows what is live. */
static struct {
    uintptr_t ptr;
    size_t bytes;
} *live;
static size_t live_cap, live_n;
#define TOMB ((uintptr_t)1)
static size_t slot(uintptr_t p, size_t i) { return ((p >> 8) * 0x9E3779B97F4A7C15ull + i) & (live_cap - 1); }
static void live_add(uintptr_t p, size_t bytes) {
    if (2 * (live_n + 1) > live_cap) { /* grow and rehash */
        size_t old_cap = live_cap;
        __typeof__(live) old = live;
        live_cap = live_cap ? 2 * live_cap : 1024;
        live = zalloc(live_cap * sizeof *live);
        live_n = 0;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].ptr > TOMB) live_add(old[i].ptr, old[i].bytes);
        free(old);
    }
    size_t i = 0;
    while (live[slot(p, i)].ptr > TOMB) i++;
    live[slot(p, i)].ptr = p;
    live[slot(p, i)].bytes = bytes;
    live_n++;
}
static size_t live_remove(uintptr_t p) { /* its bytes, or 0 when p is not a live allocation */
    for (size_t i = 0; live_cap && i < live_cap && live[slot(p, i)].ptr; i++)
        if (live[slot(p, i)].ptr == p) {
            live[slot(p, i)].ptr = TOMB;
            return live[slot(p, i)].bytes;
        }
    return 0;
}
static CUresult f_cuMemAlloc(CUdeviceptr *p, size_t n) {
    CUresult r = refuse_in_global_capture(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (r) return r;
    CHECK(n > 0, CUDA_ERROR_INVALID_VALUE);
    void *m = aligned_alloc(256, (n + 255) & ~(size_t)255);
    CHECK(m, CUDA_ERROR_OUT_OF_MEMORY);
    memset(m, 0xA5, n); /* never zero: a kernel that "reads what nobody wrote" must not look right */
    *p = (CUdeviceptr)m;
    live_add((uintptr_t)m, n);
    bytes_in_use += n;
    return OK;
}
static CUresult f_cuMemFree(CUdeviceptr p) {
    CUresult r = refuse_in_global_capture(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (r) return r;
    size_t n = live_remove((uintptr_t)p);
    CHECK(n, CUDA_ERROR_INVALID_VALUE);
    free((void *)p);
    bytes_in_use -= n;
    return OK;
}
static CUresult f_cuMemGetInfo(size_t *free_b, size_t *total) {
    *total = 150754820096ull;
    *free_b = *total - bytes_in_use - graph_bytes_in_use;
    return OK;
}
static CUresult f_cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    CUresult r = refuse_in_global_capture(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (r) return r;
    *p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
    return *p ? OK : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_cuMemFreeHost(void *p) {
    free(p);
    return OK;
}
static CUresult f_cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned flags) {
    (void)flags;
    *d = (CUdeviceptr)p;
    return OK;
}

void run_memset(const CUDA_MEMSET_NODE_PARAMS *p) {
    for (size_t row = 0; row < p->height; row++) {
        char *dst = (char *)p->dst + row * p->pitch;
        for (size_t i = 0; i < p->width; i++) memcpy(dst + i * p->elementSize, &p->value, p->elementSize);
    }
}
static void *mem_of(CUmemorytype t, const void *host, CUdeviceptr dev) {
    return t == CU_MEMORYTYPE_HOST ? (void *)host : (void *)dev;
}
void run_memcpy(const CUDA_MEMCPY3D *p) {
    char *dst = mem_of(p->dstMemoryType, p->dstHost, p->dstDevice);
    const char *src = mem_of(p->srcMemoryType, p->srcHost, p->srcDevice);
    size_t h = p->Height ? p->Height : 1, d = p->Depth ? p->Depth : 1;
    for (size_t z = 0; z < d; z++)
        for (size_t y = 0; y < h; y++)
            memmove(dst + p->dstXInBytes + (y + p->dstY) * p->dstPitch + (z + p->dstZ) * p->dstPitch * p->dstHeight,
                    src + p->srcXInBytes + (y + p->srcY) * p->srcPitch + (z + p->srcZ) * p->srcPitch * p->srcHeight,
                    p->WidthInBytes);
}

static CUresult copy_async(void *dst, const void *src, size_t n, CUstream hs) {
    Node *node;
    CUresult r = stream_work(hs, CU_GRAPH_NODE_TYPE_MEMCPY, &node);
    if (r) return r;
    CUDA_MEMCPY3D p = {0};
    p.srcMemoryType = p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p.srcDevice = (CUdeviceptr)src;
    p.dstDevice = (CUdeviceptr)dst;
    p.WidthInBytes = n;
    p.Height = p.Depth = 1;
    if (node)
        node->memcpy = p;
    else
        run_memcpy(&p);
    return OK;
}
static CUresult f_cuMemcpyHtoD(CUdeviceptr d, const void *h, size_t n) { return copy_async((void *)d, h, n, NULL); }
static CUresult f_cuMemcpyDtoH(void *h, CUdeviceptr d, size_t n) { return copy_async(h, (void *)d, n, NULL); }
static CUresult f_cuMemcpyDtoD(CUdeviceptr a, CUdeviceptr b, size_t n) {
    return copy_async((void *)a, (void *)b, n, NULL);
}
static CUresult f_cuMemcpyHtoDAsync(CUdeviceptr d, const void *h, size_t n, CUstream s) {
    return copy_async((void *)d, h, n, s);
}
static CUresult f_cuMemcpyDtoHAsync(void *h, CUdeviceptr d, size_t n, CUstream s) {
    return copy_async(h, (void *)d, n, s);
}
static CUresult f_cuMemcpyDtoDAsync(CUdeviceptr a, CUdeviceptr b, size_t n, CUstream s) {
    return copy_async((void *)a, (void *)b, n, s);
}
static CUresult memset_async(CUdeviceptr d, unsigned v, unsigned elem, size_t n, CUstream hs) {
    Node *node;
    CUresult r = stream_work(hs, CU_GRAPH_NODE_TYPE_MEMSET, &node);
    if (r) return r;
    CUDA_MEMSET_NODE_PARAMS p = {.dst = d, .pitch = n * elem, .value = v, .elementSize = elem, .width = n, .height = 1};
    if (node)
        node->memset = p;
    else
        run_memset(&p);
    return OK;
}
static CUresult f_cuMemsetD8(CUdeviceptr d, unsigned char v, size_t n) { return memset_async(d, v, 1, n, NULL); }
static CUresult f_cuMemsetD32(CUdeviceptr d, unsigned v, size_t n) { return memset_async(d, v, 4, n, NULL); }
static CUresult f_cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
    return memset_async(d, v, 1, n, s);
}
static CUresult f_cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s) {
    return memset_async(d, v, 4, n, s);
}

/* ---- modules and functions ---- */
/* The cubin is kept so that names resolve as the driver resolves them: a kernel or a global that the ELF's
 * symbol table does not hold is CUDA_ERROR_NOT_FOUND, and a global has its real size. */
static size_t elf_size(const Elf64_Ehdr *h) {
    size_t end = h->e_shoff + (size_t)h->e_shnum * h->e_shentsize;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)((const char *)h + h->e_shoff);
    for (int i = 0; i < h->e_shnum; i++)
        if (sh[i].sh_type != SHT_NOBITS && sh[i].sh_offset + sh[i].sh_size > end) end = sh[i].sh_offset + sh[i].sh_size;
    return end;
}
static CUresult f_cuModuleLoadData(CUmodule *m, const void *image) {
    CHECK(image, CUDA_ERROR_INVALID_VALUE);
    CHECK(memcmp(image, ELFMAG, SELFMAG) == 0 && ((const unsigned char *)image)[EI_CLASS] == ELFCLASS64,
          CUDA_ERROR_INVALID_IMAGE); /* rawgraphs loads cubins */
    Module *mod = zalloc(sizeof(Module));
    mod->loaded = 1;
    mod->size = elf_size(image);
    mod->elf = zalloc(mod->size);
    memcpy(mod->elf, image, mod->size);
    *m = (CUmodule)mod;
    return OK;
}
static CUresult f_cuModuleUnload(CUmodule m) {
    CHECK(m && ((Module *)m)->loaded, CUDA_ERROR_INVALID_HANDLE);
    Module *mod = (Module *)m;
    mod->loaded = 0;
    for (size_t i = 0; i < mod->nglobals; i++) free(mod->globals[i]);
    free(mod->globals);
    free(mod->elf);
    mod->globals = NULL;
    mod->elf = NULL;
    return OK;
}
static CUresult f_cuModuleGetFunction(CUfunction *f, CUmodule hm, const char *name) {
    Module *m = (Module *)hm;
    CHECK(m && m->loaded, CUDA_ERROR_INVALID_HANDLE);
    Function *fn = zalloc(sizeof(Function));
    fn->module = m;
    snprintf(fn->name, sizeof fn->name, "%s", name);
    if (function_layout(fn)) {
        free(fn);
        return CUDA_ERROR_NOT_FOUND;
    }
    *f = (CUfunction)fn;
    return OK;
}
static CUresult f_cuModuleGetGlobal(CUdeviceptr *d, size_t *bytes, CUmodule hm, const char *name) {
    Module *m = (Module *)hm;
    CHECK(m && m->loaded, CUDA_ERROR_INVALID_HANDLE);
    size_t size;
    void *p = module_global(m, name, &size);
    CHECK(p, CUDA_ERROR_NOT_FOUND);
    if (d) *d = (CUdeviceptr)p;
    if (bytes) *bytes = size;
    return OK;
}
static CUresult f_cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
    CHECK(f, CUDA_ERROR_INVALID_HANDLE);
    Function *fn = (Function *)f;
    switch (a) {
        case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
            *v = fn->max_threads;
            break;
        case CU_FUNC_ATTRIBUTE_NUM_REGS:
            *v = fn->regs;
            break;
        case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
            *v = fn->static_smem;
            break;
        case CU_FUNC_ATTRIBUTE_PTX_VERSION:
        case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
            *v = 90;
            break;
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
            *v = ((Function *)f)->max_dynamic_smem;
            break;
        default:
            *v = 0;
            break;
    }
    return OK;
}
static CUresult f_cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
    CHECK(f, CUDA_ERROR_INVALID_HANDLE);
    if (a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
        CHECK(v >= 0 && v <= 232448 - ((Function *)f)->static_smem, CUDA_ERROR_INVALID_VALUE); /* opt-in limit */
        ((Function *)f)->max_dynamic_smem = v;
    }
    if (a == CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED) {
        CHECK(v == 0 || v == 1, CUDA_ERROR_INVALID_VALUE);
        ((Function *)f)->nonportable = v;
    }
    return OK;
}
static int min_int(int a, int b) { return a < b ? a : b; }
static CUresult f_cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int block, size_t smem) {
    Function *fn = (Function *)f;
    CHECK(fn && block > 0 && block <= fn->max_threads, CUDA_ERROR_INVALID_VALUE);
    int warps = (block + 31) / 32, regs_per_warp = ((fn->regs * 32 + 255) / 256) * 256;
    size_t shared = smem + fn->static_smem;
    *n = min_int(min_int(64 / warps, 32), 65536 / (regs_per_warp * warps));
    if (shared) *n = min_int(*n, (int)(233472 / (shared + 1024))); /* 1 KiB per block is the system's */
    return OK;
}

/* ---- launches ---- */
/* The driver's launch checks, then a copy of the arguments (which reads every one the kernel declares). */
CUresult make_call(KernelCall *k, const CUDA_KERNEL_NODE_PARAMS *p) {
    CHECK(p, CUDA_ERROR_INVALID_VALUE);
    Function *f = (Function *)p->func;
    CHECK(f && f->module->loaded, CUDA_ERROR_INVALID_HANDLE);
    CHECK(p->gridDimX && p->gridDimY && p->gridDimZ && p->blockDimX && p->blockDimY && p->blockDimZ,
          CUDA_ERROR_INVALID_VALUE);
    CHECK(p->blockDimZ <= 64 && p->gridDimY <= 65535 && p->gridDimZ <= 65535, CUDA_ERROR_INVALID_VALUE);
    CHECK((unsigned long long)p->blockDimX * p->blockDimY * p->blockDimZ <= (unsigned)f->max_threads,
          CUDA_ERROR_INVALID_VALUE);
    CHECK((int)p->sharedMemBytes <= f->max_dynamic_smem, CUDA_ERROR_INVALID_VALUE);
    CHECK(p->sharedMemBytes + f->static_smem <= 232448, CUDA_ERROR_INVALID_VALUE);
    CHECK(!(p->kernelParams && p->extra), CUDA_ERROR_INVALID_VALUE);
    return kernel_call_make(k, p);
}
/* The launch attributes rawgraphs sets, checked as the driver checks them: a cluster divides the grid in every
 * dimension and holds at most 8 blocks (the portable limit), or 16 (H100/H200) once the function is opted in to
 * non-portable sizes; programmatic serialization is 0 or 1. */
CUresult check_attribute(const KernelCall *k, CUlaunchAttributeID id, const CUlaunchAttributeValue *v) {
    CHECK(id < 32, CUDA_ERROR_INVALID_VALUE);
    if (id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
        unsigned c[3] = {v->clusterDim.x, v->clusterDim.y, v->clusterDim.z};
        for (int i = 0; i < 3; i++) CHECK(c[i] && k->grid[i] % c[i] == 0, CUDA_ERROR_INVALID_CLUSTER_SIZE);
        CHECK(c[0] * c[1] * c[2] <= (k->func->nonportable ? 16u : 8u), CUDA_ERROR_INVALID_CLUSTER_SIZE);
    }
    if (id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        CHECK(v->programmaticStreamSerializationAllowed <= 1, CUDA_ERROR_INVALID_VALUE);
    return OK;
}
static CUresult launch(const CUDA_KERNEL_NODE_PARAMS *p, CUstream hs, const CUlaunchAttribute *attrs, unsigned nattrs) {
    KernelCall k;
    CUresult r = make_call(&k, p);
    if (r) return r;
    for (unsigned i = 0; i < nattrs && !r; i++) r = check_attribute(&k, attrs[i].id, &attrs[i].value);
    Node *n = NULL;
    if (!r) r = stream_work(hs, CU_GRAPH_NODE_TYPE_KERNEL, &n);
    if (r) {
        kernel_call_free(&k);
        return r;
    }
    if (n) { /* a captured launch's attributes become the node's */
        n->kernel = k;
        for (unsigned i = 0; i < nattrs; i++) n->attrs[attrs[i].id] = attrs[i].value;
        return OK;
    }
    kernel_call_run(&k);
    kernel_call_free(&k);
    return OK;
}
static CUresult f_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned smem, CUstream s, void **params, void **extra) {
    CUDA_KERNEL_NODE_PARAMS p = {.func = f,
                                 .gridDimX = gx,
                                 .gridDimY = gy,
                                 .gridDimZ = gz,
                                 .blockDimX = bx,
                                 .blockDimY = by,
                                 .blockDimZ = bz,
                                 .sharedMemBytes = smem,
                                 .kernelParams = params,
                                 .extra = extra};
    return launch(&p, s, NULL, 0);
}
static CUresult f_cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    CHECK(c, CUDA_ERROR_INVALID_VALUE);
    CHECK(c->numAttrs == 0 || c->attrs, CUDA_ERROR_INVALID_VALUE);
    CUDA_KERNEL_NODE_PARAMS p = {.func = f,
                                 .gridDimX = c->gridDimX,
                                 .gridDimY = c->gridDimY,
                                 .gridDimZ = c->gridDimZ,
                                 .blockDimX = c->blockDimX,
                                 .blockDimY = c->blockDimY,
                                 .blockDimZ = c->blockDimZ,
                                 .sharedMemBytes = c->sharedMemBytes,
                                 .kernelParams = params,
                                 .extra = extra};
    return launch(&p, c->hStream, c->attrs, c->numAttrs);
}

static CUresult f_cuGetErrorString(CUresult e, const char **s) {
    static char buf[64];
    snprintf(buf, sizeof buf, "fakecuda error %d", (int)e);
    *s = buf;
    return OK;
}
static CUresult f_cuGetErrorName(CUresult e, const char **s) {
    static char buf[64];
    snprintf(buf, sizeof buf, "CUDA_ERROR_%d", (int)e);
    *s = buf;
    return OK;
}

// clang-format off
const Entry device_entries[] = {
    E(cuInit, 2000), {"cuDriverGetVersion", 2020, (void *)cuDriverGetVersion}, E(cuDeviceGetCount, 2000),
    E(cuDeviceGet, 2000), E(cuDeviceGetName, 2000), E(cuDeviceTotalMem, 3020), E(cuDeviceGetAttribute, 2000),
    E(cuDeviceGetUuid, 11040), E(cuDevicePrimaryCtxRetain, 7000), E(cuDevicePrimaryCtxRelease, 11000),
    E(cuCtxSetCurrent, 4000), E(cuCtxGetCurrent, 4000), E(cuCtxGetDevice, 2000), E(cuCtxSynchronize, 2000),
    E(cuDeviceGetGraphMemAttribute, 11040), E(cuDeviceGraphMemTrim, 11040), E(cuGetErrorString, 6000),
    E(cuGetErrorName, 6000), {"cuProfilerStart", 4000, (void *)f_cuProfiler},
    {"cuProfilerStop", 4000, (void *)f_cuProfiler}, E(cuMemAlloc, 3020), E(cuMemFree, 3020), E(cuMemGetInfo, 3020),
    E(cuMemHostAlloc, 2020), E(cuMemFreeHost, 2000), E(cuMemHostGetDevicePointer, 3020), E(cuMemcpyHtoD, 3020),
    E(cuMemcpyDtoH, 3020), E(cuMemcpyDtoD, 3020), E(cuMemcpyHtoDAsync, 3020), E(cuMemcpyDtoHAsync, 3020),
    E(cuMemcpyDtoDAsync, 3020), E(cuMemsetD8, 3020), E(cuMemsetD32, 3020), E(cuMemsetD8Async, 3020),
    E(cuMemsetD32Async, 3020), E(cuModuleLoadData, 2000), E(cuModuleUnload, 2000), E(cuModuleGetFunction, 2000),
    E(cuModuleGetGlobal, 3020), E(cuFuncGetAttribute, 2020), E(cuFuncSetAttribute, 9000),
    E(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050), E(cuLaunchKernel, 4000), E(cuLaunchKernelEx, 11060),
    {NULL, 0, NULL},
};
// clang-format on
