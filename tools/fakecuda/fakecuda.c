/* fakecuda: a CPU stand-in for libcuda.so.1, so that rawgraphs' host code can run end to end on a machine without
 * a GPU.  It is a checking tool, not an emulator of kernels:
 *   - memory is host memory (cuMemAlloc is aligned_alloc), so copies, fills and buffers round-trip real bytes;
 *   - kernel launches run nothing, but their configuration is checked and, inside a capture, they become nodes;
 *   - stream capture follows the driver's rules that rawgraphs relies on (fork/join through events, unjoined
 *     streams, invalidation by a synchronising call, legacy-stream work and allocation inside a global capture);
 *   - graphs, executables, conditional handles and bodies, memset/memcpy/alloc nodes behave as handles with the
 *     driver's checks (a launched executable runs its memset and memcpy nodes; kernels and conditionals do nothing);
 *   - every entry point cuda.bindings asks for and this file does not implement answers CUDA_ERROR_NOT_SUPPORTED
 *     and names itself on stderr, so nothing runs on an uninitialised output.
 * Build: tools/fakecuda/build.sh.  Use: LD_LIBRARY_PATH=<dir of libcuda.so.1> python -m pytest -m gpu ...
 * Written against cuda.h 13.0 and the entry-point versions cuda-bindings 13.3 requests. */
#define _GNU_SOURCE
#include "fakecuda.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OK CUDA_SUCCESS
#define CHECK(cond, err) do { if (!(cond)) return (err); } while (0)

static void *zalloc(size_t n) { void *p = calloc(1, n ? n : 1); if (!p) abort(); return p; }
static double now_ms(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* ---- handles ---- */
typedef struct Graph Graph;
typedef struct Capture Capture;
typedef struct Node {
    CUgraphNodeType type; Graph *graph; struct Node **deps; size_t ndeps; int disabled;
    KernelCall kernel; CUkernelNodeAttrValue attrs[32]; CUDA_MEMSET_NODE_PARAMS memset; CUDA_MEMCPY3D memcpy;
    Graph *child; Graph **bodies; unsigned nbodies; CUgraphConditionalHandle handle; CUgraphConditionalNodeType cond;
    CUdeviceptr dptr; size_t bytes;
} Node;
struct Graph { Node **nodes; size_t n, cap; Node *parent; };
/* An executable owns a clone of its graph (the driver's copy): the source graph may be changed or destroyed.
 * `names` are the source's node handles, which per-node updates name; they are compared, never followed. */
struct Exec { Graph *source, *own; Node **names; size_t n; };
typedef struct Stream { Capture *cap; Node **deps; size_t ndeps; int joined; int destroyed; CUgraphEdgeData *edges; } Stream;
struct Capture { Graph *graph; int invalid, ended; int global; unsigned long long id; Stream *origin; int owns_graph; };
typedef struct Event { double t; int recorded; Capture *cap; Stream *from; Node **deps; size_t ndeps; } Event;

static int ctx_token, device_count = 1;
static unsigned long long next_capture_id = 1, next_cond_handle = 1;
static size_t bytes_in_use, graph_bytes_in_use, graph_bytes_high;
static int global_captures;  /* captures in CU_STREAM_CAPTURE_MODE_GLOBAL now active */

static int is_legacy(CUstream s) { return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD; }
static Stream *S(CUstream s) { return is_legacy(s) ? NULL : (Stream *)s; }

static void node_list_copy(Node ***dst, size_t *n, Node *const *src, size_t k) {
    free(*dst); *dst = k ? zalloc(k * sizeof(Node *)) : NULL; if (k) memcpy(*dst, src, k * sizeof(Node *)); *n = k;
}

static Node *graph_add(Graph *g, CUgraphNodeType type, const CUgraphNode *deps, size_t ndeps) {
    Node *n = zalloc(sizeof(Node));
    n->type = type; n->graph = g;
    node_list_copy(&n->deps, &n->ndeps, (Node *const *)deps, ndeps);
    if (g->n == g->cap) { g->cap = g->cap ? 2 * g->cap : 16; g->nodes = realloc(g->nodes, g->cap * sizeof(Node *)); }
    g->nodes[g->n++] = n;
    return n;
}

static CUresult check_deps(Graph *g, const CUgraphNode *deps, size_t ndeps) {
    CHECK(g, CUDA_ERROR_INVALID_VALUE);
    CHECK(ndeps == 0 || deps, CUDA_ERROR_INVALID_VALUE);
    for (size_t i = 0; i < ndeps; i++) {
        CHECK(deps[i] && ((Node *)deps[i])->graph == g, CUDA_ERROR_INVALID_VALUE);
        for (size_t j = 0; j < i; j++) CHECK(deps[i] != deps[j], CUDA_ERROR_INVALID_VALUE);
    }
    return OK;
}

static void graph_free(Graph *g);
static void node_free(Node *n) {
    for (unsigned i = 0; i < n->nbodies; i++) graph_free(n->bodies[i]);
    if (n->child) graph_free(n->child);
    kernel_call_free(&n->kernel);
    if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && n->dptr) {
        free((void *)n->dptr); graph_bytes_in_use -= n->bytes;
    }
    free(n->bodies); free(n->deps); free(n);
}
static void graph_free(Graph *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n; i++) node_free(g->nodes[i]);
    free(g->nodes); free(g);
}

/* ---- init, device, context ---- */
CUresult cuDriverGetVersion(int *v) { CHECK(v, CUDA_ERROR_INVALID_VALUE); *v = 13000; return OK; }
static CUresult f_cuInit(unsigned flags) { (void)flags; return OK; }
static CUresult f_cuDeviceGetCount(int *n) { *n = device_count; return OK; }
static CUresult f_cuDeviceGet(CUdevice *d, int ordinal) {
    CHECK(ordinal >= 0 && ordinal < device_count, CUDA_ERROR_INVALID_DEVICE); *d = ordinal; return OK;
}
static CUresult f_cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d; snprintf(name, len, "fakecuda H200 stand-in (no GPU)"); return OK;
}
static CUresult f_cuDeviceTotalMem(size_t *b, CUdevice d) { (void)d; *b = 150754820096ull; return OK; }
static CUresult f_cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *v = 32; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 233472; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR:
        *v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 62914560; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *v = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *v = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *v = 6144; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *v = 64; break;
    default: *v = 1; break;  /* capability flags: the H200 has them */
    }
    return OK;
}
static CUresult f_cuDeviceGetUuid(CUuuid *u, CUdevice d) { (void)d; memset(u, 0x5a, sizeof *u); return OK; }
static CUresult f_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    CHECK(d >= 0 && d < device_count, CUDA_ERROR_INVALID_DEVICE); *c = (CUcontext)&ctx_token; return OK;
}
static CUresult f_cuDevicePrimaryCtxRelease(CUdevice d) { (void)d; return OK; }
static CUcontext current;
static CUresult f_cuCtxSetCurrent(CUcontext c) { current = c; return OK; }
static CUresult f_cuCtxGetCurrent(CUcontext *c) { *c = current; return OK; }
static CUresult f_cuCtxGetDevice(CUdevice *d) { CHECK(current, CUDA_ERROR_INVALID_CONTEXT); *d = 0; return OK; }
static CUresult f_cuCtxSynchronize(void) {
    CHECK(global_captures == 0, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); return OK;
}
static CUresult f_cuDeviceGetGraphMemAttribute(CUdevice d, CUgraphMem_attribute a, void *v) {
    (void)d;
    uint64_t x = (a == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH || a == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
        ? graph_bytes_high : graph_bytes_in_use;
    memcpy(v, &x, sizeof x); return OK;
}
static CUresult f_cuDeviceGraphMemTrim(CUdevice d) { (void)d; return OK; }
static CUresult f_cuProfiler(void) { return OK; }

/* The capture-side rule every synchronous or legacy-stream call obeys: in a global-mode capture it is refused and
 * the capture is invalidated (the driver invalidates every capture it would have synchronised with). */
static Capture *captures[64];
static int ncaptures;
static CUresult refuse_in_global_capture(CUresult err) {
    if (global_captures == 0) return OK;
    for (int i = 0; i < ncaptures; i++) if (captures[i]->global) captures[i]->invalid = 1;
    return err;
}

/* ---- memory ---- */
static CUresult f_cuMemAlloc(CUdeviceptr *p, size_t n) {
    CUresult r = refuse_in_global_capture(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); if (r) return r;
    CHECK(n > 0, CUDA_ERROR_INVALID_VALUE);
    void *m = aligned_alloc(256, (n + 255) & ~(size_t)255); CHECK(m, CUDA_ERROR_OUT_OF_MEMORY);
    memset(m, 0xA5, n);  /* never zero: a kernel that "reads what nobody wrote" must not look right */
    *p = (CUdeviceptr)m; bytes_in_use += n; return OK;
}
static CUresult f_cuMemFree(CUdeviceptr p) {
    CUresult r = refuse_in_global_capture(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); if (r) return r;
    free((void *)p); return OK;
}
static CUresult f_cuMemGetInfo(size_t *free_b, size_t *total) {
    *total = 150754820096ull; *free_b = *total - bytes_in_use - graph_bytes_in_use; return OK;
}
static CUresult f_cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags; CUresult r = refuse_in_global_capture(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); if (r) return r;
    *p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095); return *p ? OK : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_cuMemFreeHost(void *p) { free(p); return OK; }
static CUresult f_cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned flags) {
    (void)flags; *d = (CUdeviceptr)p; return OK;
}

/* Stream-ordered work: on a capturing stream it becomes a node after the stream's current dependencies; on a
 * plain stream it runs now (this machine has no queue).  Returns the node, or NULL when it ran eagerly. */
static CUresult stream_work(CUstream hs, CUgraphNodeType type, Node **out) {
    Stream *s = S(hs); *out = NULL;
    if (s && s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
    if (!s) return refuse_in_global_capture(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    if (!s->cap) return OK;
    if (s->cap->invalid) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    Node *n = graph_add(s->cap->graph, type, (const CUgraphNode *)s->deps, s->ndeps);
    node_list_copy(&s->deps, &s->ndeps, &n, 1);
    s->joined = 0; *out = n;
    return OK;
}

static void run_memset(const CUDA_MEMSET_NODE_PARAMS *p) {
    for (size_t row = 0; row < p->height; row++) {
        char *dst = (char *)p->dst + row * p->pitch;
        for (size_t i = 0; i < p->width; i++) memcpy(dst + i * p->elementSize, &p->value, p->elementSize);
    }
}
static void *mem_of(CUmemorytype t, const void *host, CUdeviceptr dev) {
    return t == CU_MEMORYTYPE_HOST ? (void *)host : (void *)dev;
}
static void run_memcpy(const CUDA_MEMCPY3D *p) {
    char *dst = mem_of(p->dstMemoryType, p->dstHost, p->dstDevice);
    const char *src = mem_of(p->srcMemoryType, p->srcHost, p->srcDevice);
    size_t h = p->Height ? p->Height : 1, d = p->Depth ? p->Depth : 1;
    for (size_t z = 0; z < d; z++) for (size_t y = 0; y < h; y++)
        memmove(dst + p->dstXInBytes + (y + p->dstY) * p->dstPitch + (z + p->dstZ) * p->dstPitch * p->dstHeight,
                src + p->srcXInBytes + (y + p->srcY) * p->srcPitch + (z + p->srcZ) * p->srcPitch * p->srcHeight,
                p->WidthInBytes);
}

static CUresult copy_async(void *dst, const void *src, size_t n, CUstream hs) {
    Node *node; CUresult r = stream_work(hs, CU_GRAPH_NODE_TYPE_MEMCPY, &node); if (r) return r;
    CUDA_MEMCPY3D p = {0};
    p.srcMemoryType = p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p.srcDevice = (CUdeviceptr)src; p.dstDevice = (CUdeviceptr)dst; p.WidthInBytes = n; p.Height = p.Depth = 1;
    if (node) node->memcpy = p; else run_memcpy(&p);
    return OK;
}
static CUresult f_cuMemcpyHtoD(CUdeviceptr d, const void *h, size_t n) { return copy_async((void *)d, h, n, NULL); }
static CUresult f_cuMemcpyDtoH(void *h, CUdeviceptr d, size_t n) { return copy_async(h, (void *)d, n, NULL); }
static CUresult f_cuMemcpyDtoD(CUdeviceptr a, CUdeviceptr b, size_t n) { return copy_async((void *)a, (void *)b, n, NULL); }
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
    Node *node; CUresult r = stream_work(hs, CU_GRAPH_NODE_TYPE_MEMSET, &node); if (r) return r;
    CUDA_MEMSET_NODE_PARAMS p = {.dst = d, .pitch = n * elem, .value = v, .elementSize = elem, .width = n, .height = 1};
    if (node) node->memset = p; else run_memset(&p);
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
          CUDA_ERROR_INVALID_IMAGE);  /* rawgraphs loads cubins */
    Module *mod = zalloc(sizeof(Module)); mod->loaded = 1;
    mod->size = elf_size(image); mod->elf = zalloc(mod->size); memcpy(mod->elf, image, mod->size);
    *m = (CUmodule)mod; return OK;
}
static CUresult f_cuModuleUnload(CUmodule m) {
    CHECK(m && ((Module *)m)->loaded, CUDA_ERROR_INVALID_HANDLE);
    ((Module *)m)->loaded = 0; free(((Module *)m)->elf); ((Module *)m)->elf = NULL; return OK;
}
static CUresult f_cuModuleGetFunction(CUfunction *f, CUmodule hm, const char *name) {
    Module *m = (Module *)hm; CHECK(m && m->loaded, CUDA_ERROR_INVALID_HANDLE);
    Function *fn = zalloc(sizeof(Function)); fn->module = m;
    snprintf(fn->name, sizeof fn->name, "%s", name);
    if (function_layout(fn)) { free(fn); return CUDA_ERROR_NOT_FOUND; }
    *f = (CUfunction)fn; return OK;
}
static CUresult f_cuModuleGetGlobal(CUdeviceptr *d, size_t *bytes, CUmodule hm, const char *name) {
    Module *m = (Module *)hm; CHECK(m && m->loaded, CUDA_ERROR_INVALID_HANDLE);
    const Elf64_Sym *sym = elf_symbol(m, name, NULL);
    CHECK(sym && ELF64_ST_TYPE(sym->st_info) == STT_OBJECT, CUDA_ERROR_NOT_FOUND);
    size_t n = sym->st_size ? sym->st_size : 1;
    void *p = aligned_alloc(256, (n + 255) & ~(size_t)255); memset(p, 0, n);  /* zero-initialised, as in C */
    if (d) *d = (CUdeviceptr)p;
    if (bytes) *bytes = sym->st_size;
    return OK;
}
static CUresult f_cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
    CHECK(f, CUDA_ERROR_INVALID_HANDLE);
    Function *fn = (Function *)f;
    switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = fn->max_threads; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = fn->regs; break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *v = fn->static_smem; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *v = 90; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = ((Function *)f)->max_dynamic_smem; break;
    default: *v = 0; break;
    }
    return OK;
}
static CUresult f_cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
    CHECK(f, CUDA_ERROR_INVALID_HANDLE);
    if (a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
        CHECK(v >= 0 && v <= 232448, CUDA_ERROR_INVALID_VALUE); ((Function *)f)->max_dynamic_smem = v;
    }
    return OK;
}
static int min_int(int a, int b) { return a < b ? a : b; }
static CUresult f_cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int block, size_t smem) {
    Function *fn = (Function *)f; CHECK(fn && block > 0 && block <= fn->max_threads, CUDA_ERROR_INVALID_VALUE);
    int warps = (block + 31) / 32, regs_per_warp = ((fn->regs * 32 + 255) / 256) * 256;
    size_t shared = smem + fn->static_smem;
    *n = min_int(min_int(64 / warps, 32), 65536 / (regs_per_warp * warps));
    if (shared) *n = min_int(*n, (int)(233472 / (shared + 1024)));  /* 1 KiB per block is the system's */
    return OK;
}

/* ---- launches ---- */
/* The driver's launch checks, then a copy of the arguments (which reads every one the kernel declares). */
static CUresult make_call(KernelCall *k, const CUDA_KERNEL_NODE_PARAMS *p) {
    CHECK(p, CUDA_ERROR_INVALID_VALUE);
    Function *f = (Function *)p->func;
    CHECK(f && f->module->loaded, CUDA_ERROR_INVALID_HANDLE);
    CHECK(p->gridDimX && p->gridDimY && p->gridDimZ && p->blockDimX && p->blockDimY && p->blockDimZ,
          CUDA_ERROR_INVALID_VALUE);
    CHECK(p->blockDimZ <= 64 && p->gridDimY <= 65535 && p->gridDimZ <= 65535, CUDA_ERROR_INVALID_VALUE);
    CHECK((unsigned long long)p->blockDimX * p->blockDimY * p->blockDimZ <= (unsigned)f->max_threads,
          CUDA_ERROR_INVALID_VALUE);
    CHECK(p->sharedMemBytes + f->static_smem <= 49152 || (int)p->sharedMemBytes <= f->max_dynamic_smem,
          CUDA_ERROR_INVALID_VALUE);
    CHECK(p->sharedMemBytes + f->static_smem <= 232448, CUDA_ERROR_INVALID_VALUE);
    CHECK(!(p->kernelParams && p->extra), CUDA_ERROR_INVALID_VALUE);
    return kernel_call_make(k, p);
}
static CUresult launch(const CUDA_KERNEL_NODE_PARAMS *p, CUstream hs, const CUlaunchAttribute *attrs, unsigned nattrs) {
    KernelCall k; CUresult r = make_call(&k, p); if (r) return r;
    for (unsigned i = 0; i < nattrs; i++) CHECK(attrs[i].id < 32, CUDA_ERROR_INVALID_VALUE);
    Node *n; r = stream_work(hs, CU_GRAPH_NODE_TYPE_KERNEL, &n);
    if (r) { kernel_call_free(&k); return r; }
    if (n) {  /* a captured launch's attributes become the node's */
        n->kernel = k;
        for (unsigned i = 0; i < nattrs; i++) n->attrs[attrs[i].id] = attrs[i].value;
        return OK;
    }
    kernel_call_run(&k); kernel_call_free(&k); return OK;
}
static CUresult f_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned smem, CUstream s, void **params, void **extra) {
    CUDA_KERNEL_NODE_PARAMS p = {.func = f, .gridDimX = gx, .gridDimY = gy, .gridDimZ = gz, .blockDimX = bx,
        .blockDimY = by, .blockDimZ = bz, .sharedMemBytes = smem, .kernelParams = params, .extra = extra};
    return launch(&p, s, NULL, 0);
}
static CUresult f_cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    CHECK(c, CUDA_ERROR_INVALID_VALUE);
    CHECK(c->numAttrs == 0 || c->attrs, CUDA_ERROR_INVALID_VALUE);
    CUDA_KERNEL_NODE_PARAMS p = {.func = f, .gridDimX = c->gridDimX, .gridDimY = c->gridDimY,
        .gridDimZ = c->gridDimZ, .blockDimX = c->blockDimX, .blockDimY = c->blockDimY, .blockDimZ = c->blockDimZ,
        .sharedMemBytes = c->sharedMemBytes, .kernelParams = params, .extra = extra};
    return launch(&p, c->hStream, c->attrs, c->numAttrs);
}

/* ---- streams and capture ---- */
static CUresult f_cuStreamCreate(CUstream *s, unsigned flags) { (void)flags; *s = zalloc(sizeof(Stream)); return OK; }
static CUresult f_cuStreamCreateWithPriority(CUstream *s, unsigned flags, int prio) {
    (void)prio; return f_cuStreamCreate(s, flags);
}
static void leave_capture(Stream *s) { s->cap = NULL; free(s->deps); s->deps = NULL; s->ndeps = 0; }
static Stream *members[4096];
static int nmembers;
static void capture_members_leave(Capture *c) {
    for (int i = 0; i < nmembers; i++) if (members[i] && members[i]->cap == c) { leave_capture(members[i]); members[i] = 0; }
    for (int i = 0; i < ncaptures; i++) if (captures[i] == c) captures[i] = captures[--ncaptures];
    if (c->global) global_captures--;
}
static void join(Stream *s, Capture *c) {
    s->cap = c; s->joined = 1;
    for (int i = 0; i < nmembers; i++) if (!members[i]) { members[i] = s; return; }
    if (nmembers < 4096) members[nmembers++] = s;
}
static CUresult f_cuStreamDestroy(CUstream hs) {
    Stream *s = S(hs); CHECK(s && !s->destroyed, CUDA_ERROR_INVALID_HANDLE);
    if (s->cap) { s->cap->invalid = 1; for (int i = 0; i < nmembers; i++) if (members[i] == s) members[i] = 0; leave_capture(s); }
    s->destroyed = 1; return OK;  /* kept allocated: a later use must answer INVALID_HANDLE, not crash */
}
static CUresult sync_stream(CUstream hs) {
    Stream *s = S(hs);
    if (s && s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
    if (s && s->cap) { s->cap->invalid = 1; return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; }
    if (!s) return refuse_in_global_capture(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    return OK;
}
static CUresult f_cuStreamSynchronize(CUstream s) { return sync_stream(s); }
static CUresult f_cuStreamQuery(CUstream s) { return sync_stream(s); }
static CUresult begin(Stream *s, Graph *g, int owns, const CUgraphNode *deps, size_t ndeps, CUstreamCaptureMode mode) {
    CHECK(!s->cap, CUDA_ERROR_ILLEGAL_STATE);
    CHECK(ncaptures < 64, CUDA_ERROR_NOT_SUPPORTED);
    Capture *c = zalloc(sizeof(Capture));
    c->graph = g; c->owns_graph = owns; c->id = next_capture_id++; c->origin = s;
    c->global = mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    global_captures += c->global; captures[ncaptures++] = c;
    join(s, c); node_list_copy(&s->deps, &s->ndeps, (Node *const *)deps, ndeps);
    return OK;
}
static CUresult f_cuStreamBeginCapture(CUstream hs, CUstreamCaptureMode mode) {
    Stream *s = S(hs); CHECK(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); CHECK(!s->destroyed, CUDA_ERROR_INVALID_HANDLE);
    return begin(s, zalloc(sizeof(Graph)), 1, NULL, 0, mode);
}
static CUresult f_cuStreamBeginCaptureToGraph(CUstream hs, CUgraph g, const CUgraphNode *deps,
                                              const CUgraphEdgeData *edges, size_t ndeps, CUstreamCaptureMode mode) {
    (void)edges; Stream *s = S(hs); CHECK(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CUresult r = check_deps((Graph *)g, deps, ndeps); if (r) return r;
    return begin(s, (Graph *)g, 0, deps, ndeps, mode);
}
static CUresult f_cuStreamEndCapture(CUstream hs, CUgraph *out) {
    Stream *s = S(hs); CHECK(s && s->cap, CUDA_ERROR_ILLEGAL_STATE);
    Capture *c = s->cap;
    CHECK(c->origin == s, CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    CUresult r = OK;
    for (int i = 0; i < nmembers; i++)
        if (members[i] && members[i] != s && members[i]->cap == c && !members[i]->joined) r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    if (c->invalid && !r) r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    capture_members_leave(c);
    if (r) { if (c->owns_graph) graph_free(c->graph); *out = NULL; }
    else *out = (CUgraph)c->graph;
    c->ended = 1; return r;  /* kept: events recorded in it still name it */
}
static CUresult f_cuStreamIsCapturing(CUstream hs, CUstreamCaptureStatus *st) {
    Stream *s = S(hs);
    if (!s) { *st = CU_STREAM_CAPTURE_STATUS_NONE; return refuse_in_global_capture(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT); }
    CHECK(!s->destroyed, CUDA_ERROR_INVALID_HANDLE);
    *st = !s->cap ? CU_STREAM_CAPTURE_STATUS_NONE
        : s->cap->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return OK;
}
static CUresult f_cuStreamGetCaptureInfo(CUstream hs, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                         const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps) {
    CUresult r = f_cuStreamIsCapturing(hs, st); if (r) return r;
    Stream *s = S(hs);
    if (id) *id = s && s->cap ? s->cap->id : 0;
    if (g) *g = s && s->cap ? (CUgraph)s->cap->graph : NULL;
    if (deps) *deps = s && s->cap ? (const CUgraphNode *)s->deps : NULL;
    if (edges) {  /* default edges, one per dependency (cuda.bindings reads numDependencies of them) */
        free(s ? s->edges : NULL);
        if (s) s->edges = zalloc((s->ndeps + 1) * sizeof(CUgraphEdgeData));
        *edges = s ? s->edges : NULL;
    }
    if (ndeps) *ndeps = s && s->cap ? s->ndeps : 0;
    return OK;
}
static CUresult f_cuStreamUpdateCaptureDependencies(CUstream hs, CUgraphNode *deps, const CUgraphEdgeData *edges,
                                                    size_t n, unsigned flags) {
    (void)edges; Stream *s = S(hs); CHECK(s && s->cap, CUDA_ERROR_ILLEGAL_STATE);
    CUresult r = check_deps(s->cap->graph, deps, n); if (r) return r;
    if (flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES) node_list_copy(&s->deps, &s->ndeps, (Node *const *)deps, n);
    else {
        Node **all = zalloc((s->ndeps + n) * sizeof(Node *));
        memcpy(all, s->deps, s->ndeps * sizeof(Node *)); memcpy(all + s->ndeps, deps, n * sizeof(Node *));
        free(s->deps); s->deps = all; s->ndeps += n;
    }
    return OK;
}

/* ---- events ---- */
static CUresult f_cuEventCreate(CUevent *e, unsigned flags) { (void)flags; *e = zalloc(sizeof(Event)); return OK; }
static CUresult f_cuEventDestroy(CUevent e) { CHECK(e, CUDA_ERROR_INVALID_HANDLE); Event *ev = (Event *)e; free(ev->deps); free(ev); return OK; }
static CUresult f_cuEventRecord(CUevent he, CUstream hs) {
    Event *e = (Event *)he; Stream *s = S(hs); CHECK(e, CUDA_ERROR_INVALID_HANDLE);
    if (s && s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
    if (s && s->cap) {
        if (s->cap->invalid) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        e->cap = s->cap; e->from = s; node_list_copy(&e->deps, &e->ndeps, s->deps, s->ndeps); return OK;
    }
    if (!s) { CUresult r = refuse_in_global_capture(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT); if (r) return r; }
    e->cap = NULL; e->t = now_ms(); e->recorded = 1; return OK;
}
static CUresult f_cuEventRecordWithFlags(CUevent e, CUstream s, unsigned flags) { (void)flags; return f_cuEventRecord(e, s); }
static CUresult f_cuStreamWaitEvent(CUstream hs, CUevent he, unsigned flags) {
    (void)flags; Event *e = (Event *)he; Stream *s = S(hs); CHECK(e, CUDA_ERROR_INVALID_HANDLE);
    if (s && s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
    if (!e->cap || e->cap->ended) {
        if (s && s->cap) return OK;  /* an event from outside the capture: no edge */
        return s ? OK : refuse_in_global_capture(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    }
    if (e->cap->invalid) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    CHECK(s, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    if (!s->cap) { join(s, e->cap); s->joined = 0; node_list_copy(&s->deps, &s->ndeps, e->deps, e->ndeps); return OK; }
    CHECK(s->cap == e->cap, CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    Node **all = zalloc((s->ndeps + e->ndeps) * sizeof(Node *)); size_t k = s->ndeps;
    memcpy(all, s->deps, k * sizeof(Node *));
    for (size_t i = 0; i < e->ndeps; i++) {
        int seen = 0; for (size_t j = 0; j < k; j++) seen |= all[j] == e->deps[i];
        if (!seen) all[k++] = e->deps[i];
    }
    free(s->deps); s->deps = all; s->ndeps = k;
    /* the stream the event came from is joined if it did nothing after the record */
    Stream *from = e->from;
    if (from && from != s && from->cap == s->cap && from->ndeps == e->ndeps
        && (from->ndeps == 0 || memcmp(from->deps, e->deps, from->ndeps * sizeof(Node *)) == 0)) from->joined = 1;
    return OK;
}
static CUresult wait_host(CUevent he) {
    Event *e = (Event *)he; CHECK(e, CUDA_ERROR_INVALID_HANDLE);
    if (e->cap) { e->cap->invalid |= !e->cap->ended; return CUDA_ERROR_CAPTURED_EVENT; }  /* last recorded in a capture */
    return OK;
}
static CUresult f_cuEventSynchronize(CUevent e) {
    CUresult r = wait_host(e); return r ? r : refuse_in_global_capture(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
}
static CUresult f_cuEventQuery(CUevent e) { return wait_host(e); }
static CUresult f_cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    Event *x = (Event *)a, *y = (Event *)b; CHECK(x && y, CUDA_ERROR_INVALID_HANDLE);
    CHECK(x->recorded && y->recorded, CUDA_ERROR_INVALID_HANDLE);
    *ms = (float)(y->t - x->t); return OK;
}

/* ---- graphs ---- */
static CUresult f_cuGraphCreate(CUgraph *g, unsigned flags) { CHECK(flags == 0, CUDA_ERROR_INVALID_VALUE); *g = zalloc(sizeof(Graph)); return OK; }
static CUresult f_cuGraphDestroy(CUgraph g) {
    CHECK(g, CUDA_ERROR_INVALID_VALUE); CHECK(!((Graph *)g)->parent, CUDA_ERROR_INVALID_VALUE);
    graph_free((Graph *)g); return OK;
}
static CUresult add_node(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps, size_t n, CUgraphNodeType type, Node **node) {
    CHECK(out, CUDA_ERROR_INVALID_VALUE);
    CUresult r = check_deps((Graph *)hg, deps, n); if (r) return r;
    *node = graph_add((Graph *)hg, type, deps, n); *out = (CUgraphNode)*node; return OK;
}
static CUresult f_cuGraphAddKernelNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                       const CUDA_KERNEL_NODE_PARAMS *p) {
    KernelCall k; CUresult r = make_call(&k, p); if (r) return r;
    Node *node; r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_KERNEL, &node);
    if (r) { kernel_call_free(&k); return r; }
    node->kernel = k; return OK;
}
static CUresult f_cuGraphKernelNodeGetParams(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS *p) {
    Node *node = (Node *)n; CHECK(node && node->type == CU_GRAPH_NODE_TYPE_KERNEL, CUDA_ERROR_INVALID_VALUE);
    kernel_call_params(&node->kernel, p); return OK;
}
static CUresult f_cuGraphKernelNodeSetParams(CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p) {
    Node *node = (Node *)n; CHECK(node && node->type == CU_GRAPH_NODE_TYPE_KERNEL, CUDA_ERROR_INVALID_VALUE);
    KernelCall k; CUresult r = make_call(&k, p); if (r) return r;
    kernel_call_free(&node->kernel); node->kernel = k; return OK;
}
static CUresult f_cuGraphKernelNodeSetAttribute(CUgraphNode hn, CUkernelNodeAttrID id, const CUkernelNodeAttrValue *v) {
    Node *n = (Node *)hn;
    CHECK(n && n->type == CU_GRAPH_NODE_TYPE_KERNEL && v && id < 32, CUDA_ERROR_INVALID_VALUE);
    n->attrs[id] = *v;
    if (id == CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE)  /* the handle device-side updates name */
        n->attrs[id].deviceUpdatableKernelNode.devNode = v->deviceUpdatableKernelNode.deviceUpdatable ? (CUgraphDeviceNode)n : NULL;
    return OK;
}
static CUresult f_cuGraphKernelNodeGetAttribute(CUgraphNode hn, CUkernelNodeAttrID id, CUkernelNodeAttrValue *v) {
    Node *n = (Node *)hn;
    CHECK(n && n->type == CU_GRAPH_NODE_TYPE_KERNEL && v && id < 32, CUDA_ERROR_INVALID_VALUE);
    *v = n->attrs[id]; return OK;
}
static CUresult f_cuGraphAddMemsetNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                       const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx) {
    (void)ctx; CHECK(p && p->dst && (p->elementSize == 1 || p->elementSize == 2 || p->elementSize == 4), CUDA_ERROR_INVALID_VALUE);
    CHECK(p->height <= 1 || p->pitch >= p->width * p->elementSize, CUDA_ERROR_INVALID_VALUE);
    Node *node; CUresult r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEMSET, &node); if (r) return r;
    node->memset = *p; return OK;
}
static CUresult f_cuGraphAddMemcpyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                       const CUDA_MEMCPY3D *p, CUcontext ctx) {
    (void)ctx; CHECK(p && p->WidthInBytes, CUDA_ERROR_INVALID_VALUE);
    Node *node; CUresult r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEMCPY, &node); if (r) return r;
    node->memcpy = *p; return OK;
}
static CUresult f_cuGraphAddEmptyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n) {
    Node *node; return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_EMPTY, &node);
}
static Graph *clone(const Graph *g, Node *parent);
typedef struct Exec Exec;
static Node *exec_node(Exec *e, CUgraphNode n);
static Exec *live_execs[1024];
static CUresult f_cuGraphAddChildGraphNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUgraph child) {
    CHECK(child && child != g, CUDA_ERROR_INVALID_VALUE);
    Node *node; CUresult r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_GRAPH, &node); if (r) return r;
    node->child = clone((Graph *)child, node); return OK;
}
static CUresult f_cuGraphAddEventRecordNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUevent e) {
    CHECK(e, CUDA_ERROR_INVALID_VALUE); Node *node; return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_EVENT_RECORD, &node);
}
static CUresult f_cuGraphAddEventWaitNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUevent e) {
    CHECK(e, CUDA_ERROR_INVALID_VALUE); Node *node; return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_WAIT_EVENT, &node);
}
static CUresult f_cuGraphAddMemAllocNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                         CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    CHECK(p && p->bytesize, CUDA_ERROR_INVALID_VALUE);
    Node *node; CUresult r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEM_ALLOC, &node); if (r) return r;
    node->bytes = p->bytesize; node->dptr = (CUdeviceptr)aligned_alloc(256, (p->bytesize + 255) & ~(size_t)255);
    graph_bytes_in_use += p->bytesize;
    if (graph_bytes_in_use > graph_bytes_high) graph_bytes_high = graph_bytes_in_use;
    p->dptr = node->dptr; return OK;
}
static CUresult f_cuGraphAddMemFreeNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUdeviceptr d) {
    CHECK(d, CUDA_ERROR_INVALID_VALUE); Node *node; return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEM_FREE, &node);
}
static struct { Graph *graph; unsigned value; int assign; } handle_defaults[4096];
static CUresult f_cuGraphConditionalHandleCreate(CUgraphConditionalHandle *h, CUgraph g, CUcontext ctx,
                                                 unsigned def, unsigned flags) {
    (void)ctx; CHECK(g && h, CUDA_ERROR_INVALID_VALUE); CHECK(next_cond_handle < 4096, CUDA_ERROR_OUT_OF_MEMORY);
    handle_defaults[next_cond_handle].graph = (Graph *)g; handle_defaults[next_cond_handle].value = def;
    handle_defaults[next_cond_handle].assign = (flags & CU_GRAPH_COND_ASSIGN_DEFAULT) != 0;
    conditional_set(next_cond_handle, 0);
    *h = next_cond_handle++; return OK;
}
/* At the start of each launch a handle made with CU_GRAPH_COND_ASSIGN_DEFAULT takes its default. */
static void handles_start(Graph *g) {
    for (unsigned long long h = 1; h < next_cond_handle; h++)
        if (handle_defaults[h].graph == g && handle_defaults[h].assign) conditional_set(h, handle_defaults[h].value);
}
static CUresult f_cuGraphAddNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges,
                                 size_t n, CUgraphNodeParams *p) {
    (void)edges; CHECK(p, CUDA_ERROR_INVALID_VALUE);
    if (p->type == CU_GRAPH_NODE_TYPE_KERNEL) {
        CUDA_KERNEL_NODE_PARAMS k;
        memcpy(&k, &p->kernel, sizeof k);
        return f_cuGraphAddKernelNode(out, g, deps, n, &k);
    }
    if (p->type == CU_GRAPH_NODE_TYPE_EMPTY) return f_cuGraphAddEmptyNode(out, g, deps, n);
    CHECK(p->type == CU_GRAPH_NODE_TYPE_CONDITIONAL, CUDA_ERROR_NOT_SUPPORTED);
    CUDA_CONDITIONAL_NODE_PARAMS *c = &p->conditional;
    CHECK(c->handle, CUDA_ERROR_INVALID_VALUE);
    CHECK(c->type == CU_GRAPH_COND_TYPE_SWITCH ? c->size >= 1 : (c->size == 1 || (c->type == CU_GRAPH_COND_TYPE_IF && c->size == 2)),
          CUDA_ERROR_INVALID_VALUE);
    Node *node; CUresult r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_CONDITIONAL, &node); if (r) return r;
    node->handle = c->handle; node->cond = c->type;
    node->nbodies = c->size; node->bodies = zalloc(c->size * sizeof(Graph *));
    for (unsigned i = 0; i < c->size; i++) { node->bodies[i] = zalloc(sizeof(Graph)); node->bodies[i]->parent = node; }
    c->phGraph_out = (CUgraph *)node->bodies;  /* the driver's own array, as in cuda.h */
    return OK;
}
static CUresult f_cuGraphGetNodes(CUgraph hg, CUgraphNode *nodes, size_t *n) {
    Graph *g = (Graph *)hg; CHECK(g && n, CUDA_ERROR_INVALID_VALUE);
    if (nodes) { size_t k = *n < g->n ? *n : g->n; memcpy(nodes, g->nodes, k * sizeof(Node *)); *n = k; }
    else *n = g->n;
    return OK;
}
static CUresult f_cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType *t) {
    CHECK(n, CUDA_ERROR_INVALID_VALUE); *t = ((Node *)n)->type; return OK;
}
static CUresult f_cuGraphNodeGetDependencies(CUgraphNode hn, CUgraphNode *deps, CUgraphEdgeData *edges, size_t *n) {
    Node *node = (Node *)hn; CHECK(node && n, CUDA_ERROR_INVALID_VALUE);
    if (deps) {
        size_t k = *n < node->ndeps ? *n : node->ndeps; memcpy(deps, node->deps, k * sizeof(Node *));
        if (edges) memset(edges, 0, k * sizeof *edges);
        *n = k;
    } else *n = node->ndeps;
    return OK;
}
static CUresult f_cuGraphDestroyNode(CUgraphNode hn) {
    Node *node = (Node *)hn; CHECK(node, CUDA_ERROR_INVALID_VALUE);
    Graph *g = node->graph; size_t j = 0;
    for (size_t i = 0; i < g->n; i++) if (g->nodes[i] != node) g->nodes[j++] = g->nodes[i];
    g->n = j;
    for (size_t i = 0; i < g->n; i++) {   /* edges into the removed node go with it */
        Node *m = g->nodes[i]; size_t k = 0;
        for (size_t d = 0; d < m->ndeps; d++) if (m->deps[d] != node) m->deps[k++] = m->deps[d];
        m->ndeps = k;
    }
    node_free(node); return OK;
}
static CUresult f_cuGraphDebugDotPrint(CUgraph hg, const char *path, unsigned flags) {
    (void)flags; Graph *g = (Graph *)hg; CHECK(g && path, CUDA_ERROR_INVALID_VALUE);
    FILE *f = fopen(path, "w"); CHECK(f, CUDA_ERROR_OPERATING_SYSTEM);
    fprintf(f, "digraph fakecuda {\n");
    for (size_t i = 0; i < g->n; i++) {
        Node *n = g->nodes[i];
        fprintf(f, "  n%p [label=\"%s\"];\n", (void *)n,
                n->type == CU_GRAPH_NODE_TYPE_KERNEL ? n->kernel.func->name : "node");
        for (size_t d = 0; d < n->ndeps; d++) fprintf(f, "  n%p -> n%p;\n", (void *)n->deps[d], (void *)n);
    }
    fprintf(f, "}\n"); fclose(f); return OK;
}
static Graph *clone(const Graph *g, Node *parent) {
    Graph *c = zalloc(sizeof(Graph)); c->parent = parent;
    for (size_t i = 0; i < g->n; i++) {
        Node *src = g->nodes[i], *dst = graph_add(c, src->type, NULL, 0);
        Node **deps = zalloc((src->ndeps + 1) * sizeof(Node *));
        for (size_t d = 0; d < src->ndeps; d++)
            for (size_t k = 0; k < i; k++) if (g->nodes[k] == src->deps[d]) deps[d] = c->nodes[k];
        free(dst->deps); dst->deps = deps; dst->ndeps = src->ndeps;
        kernel_call_copy(&dst->kernel, &src->kernel); dst->memset = src->memset; dst->memcpy = src->memcpy;
        dst->handle = src->handle; dst->cond = src->cond; memcpy(dst->attrs, src->attrs, sizeof dst->attrs);
        if (src->child) dst->child = clone(src->child, dst);
        if (src->nbodies) {
            dst->nbodies = src->nbodies; dst->bodies = zalloc(src->nbodies * sizeof(Graph *));
            for (unsigned b = 0; b < src->nbodies; b++) dst->bodies[b] = clone(src->bodies[b], dst);
        }
    }
    return c;
}

/* ---- executables ---- */
static int conditional_body_ok(const Graph *g) {
    for (size_t i = 0; i < g->n; i++) {
        CUgraphNodeType t = g->nodes[i]->type;
        if (t != CU_GRAPH_NODE_TYPE_KERNEL && t != CU_GRAPH_NODE_TYPE_EMPTY && t != CU_GRAPH_NODE_TYPE_GRAPH
            && t != CU_GRAPH_NODE_TYPE_MEMSET && t != CU_GRAPH_NODE_TYPE_MEMCPY && t != CU_GRAPH_NODE_TYPE_CONDITIONAL)
            return 0;
    }
    return 1;
}
static Node *first_bad_body_node(const Graph *g) {
    for (size_t i = 0; i < g->n; i++) {
        Node *n = g->nodes[i];
        for (unsigned b = 0; b < n->nbodies; b++) {
            if (!conditional_body_ok(n->bodies[b])) return n;
            Node *inner = first_bad_body_node(n->bodies[b]); if (inner) return inner;
        }
    }
    return NULL;
}
static CUresult instantiate(CUgraphExec *out, CUgraph hg, CUgraphNode *err_node) {
    Graph *g = (Graph *)hg; CHECK(g && out, CUDA_ERROR_INVALID_VALUE);
    Node *bad = first_bad_body_node(g);
    if (bad) { if (err_node) *err_node = (CUgraphNode)bad; return CUDA_ERROR_NOT_SUPPORTED; }
    Exec *e = zalloc(sizeof(Exec)); e->source = g; e->own = clone(g, NULL); e->n = g->n;
    e->names = zalloc((g->n + 1) * sizeof(Node *)); memcpy(e->names, g->nodes, g->n * sizeof(Node *));
    for (int i = 0; i < 1024; i++) if (!live_execs[i]) { live_execs[i] = e; break; }
    *out = (CUgraphExec)e; return OK;
}
/* Device-side updates (kernels/device_update.cu) name a node of whichever live executable holds it. */
KernelCall *device_node(void *dev_node, int **disabled) {
    for (int i = 0; i < 1024; i++) {
        Node *n = live_execs[i] ? exec_node(live_execs[i], (CUgraphNode)dev_node) : NULL;
        if (n && n->type == CU_GRAPH_NODE_TYPE_KERNEL) { *disabled = &n->disabled; return &n->kernel; }
    }
    return NULL;
}
static CUresult f_cuGraphInstantiate(CUgraphExec *out, CUgraph g, unsigned long long flags) {
    (void)flags; return instantiate(out, g, NULL);
}
static CUresult f_cuGraphInstantiateWithParams(CUgraphExec *out, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    CHECK(p, CUDA_ERROR_INVALID_VALUE);
    p->hErrNode_out = NULL;
    CUresult r = instantiate(out, g, &p->hErrNode_out);
    p->result_out = r ? CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED : CUDA_GRAPH_INSTANTIATE_SUCCESS;
    return r;
}
static CUresult f_cuGraphExecDestroy(CUgraphExec he) {
    Exec *e = (Exec *)he; CHECK(e, CUDA_ERROR_INVALID_VALUE);
    for (int i = 0; i < 1024; i++) if (live_execs[i] == e) live_execs[i] = NULL;
    graph_free(e->own); free(e->names); free(e); return OK;
}
static Node *exec_node(Exec *e, CUgraphNode n) {
    for (size_t i = 0; i < e->n; i++) if (e->names[i] == (Node *)n) return e->own->nodes[i];
    return NULL;
}
static CUresult f_cuGraphExecKernelNodeSetParams(CUgraphExec he, CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS *p) {
    Exec *e = (Exec *)he; CHECK(e, CUDA_ERROR_INVALID_VALUE);
    Node *n = exec_node(e, hn); CHECK(n && n->type == CU_GRAPH_NODE_TYPE_KERNEL, CUDA_ERROR_INVALID_VALUE);
    KernelCall k; CUresult r = make_call(&k, p); if (r) return r;
    kernel_call_free(&n->kernel); n->kernel = k; return OK;
}
static CUresult f_cuGraphExecMemsetNodeSetParams(CUgraphExec he, CUgraphNode hn, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext c) {
    (void)c; Exec *e = (Exec *)he; CHECK(e && p, CUDA_ERROR_INVALID_VALUE);
    Node *n = exec_node(e, hn); CHECK(n && n->type == CU_GRAPH_NODE_TYPE_MEMSET, CUDA_ERROR_INVALID_VALUE);
    n->memset = *p; return OK;
}
static CUresult f_cuGraphNodeSetEnabled(CUgraphExec he, CUgraphNode hn, unsigned on) {
    (void)on; Exec *e = (Exec *)he; CHECK(e, CUDA_ERROR_INVALID_VALUE);
    Node *n = exec_node(e, hn); CHECK(n, CUDA_ERROR_INVALID_VALUE);
    CHECK(n->type == CU_GRAPH_NODE_TYPE_KERNEL || n->type == CU_GRAPH_NODE_TYPE_MEMSET || n->type == CU_GRAPH_NODE_TYPE_MEMCPY,
          CUDA_ERROR_INVALID_VALUE);
    n->disabled = !on; return OK;
}
static long index_in(const Graph *g, const Node *n) {
    for (size_t i = 0; i < g->n; i++) if (g->nodes[i] == n) return (long)i;
    return -1;
}
static int has_dep(const Graph *g, const Node *n, long dep) {
    for (size_t d = 0; d < n->ndeps; d++) if (index_in(g, n->deps[d]) == dep) return 1;
    return 0;
}
/* Nodes pair up by position. An edge in one graph and not the other is TOPOLOGY_CHANGED, reported at the edge's
 * source node in the new graph (as the driver does). */
static CUresult f_cuGraphExecUpdate(CUgraphExec he, CUgraph hg, CUgraphExecUpdateResultInfo *info) {
    Exec *e = (Exec *)he; Graph *g = (Graph *)hg; CHECK(e && g && info, CUDA_ERROR_INVALID_VALUE);
    memset(info, 0, sizeof *info);
    info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    if (g->n != e->n) return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    for (size_t i = 0; i < g->n; i++) {
        Node *mine = e->own->nodes[i], *new = g->nodes[i];
        if (new->type != mine->type) {
            info->result = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED; info->errorNode = (CUgraphNode)new;
            return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
        }
        for (size_t d = 0; d < mine->ndeps; d++) {
            long j = index_in(e->own, mine->deps[d]);
            if (!has_dep(g, new, j)) { info->errorNode = (CUgraphNode)g->nodes[j]; return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE; }
        }
        for (size_t d = 0; d < new->ndeps; d++)
            if (!has_dep(e->own, mine, index_in(g, new->deps[d]))) {
                info->errorNode = (CUgraphNode)new->deps[d]; return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
            }
    }
    for (size_t i = 0; i < g->n; i++) {  /* node handles stay those of the graph it was instantiated from */
        Node *src = g->nodes[i], *dst = e->own->nodes[i];
        kernel_call_free(&dst->kernel); kernel_call_copy(&dst->kernel, &src->kernel);
        dst->memset = src->memset; dst->memcpy = src->memcpy;
    }
    info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS; return OK;
}
/* rawgraphs calls this one through ctypes (executable.py), so it is exported under its ABI name too. */
CUresult cuGraphExecUpdate_v2(CUgraphExec he, CUgraph hg, CUgraphExecUpdateResultInfo *info) {
    return f_cuGraphExecUpdate(he, hg, info);
}
/* A launch runs the executable's nodes in the order they were added (every dependency precedes its node).
 * Conditional bodies run as their handle says; a WHILE body that never clears its handle is stopped. */
static void run_nodes(Node **nodes, size_t n);
static void run_node(Node *node) {
    if (node->disabled) return;
    switch (node->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: kernel_call_run(&node->kernel); break;
    case CU_GRAPH_NODE_TYPE_MEMSET: run_memset(&node->memset); break;
    case CU_GRAPH_NODE_TYPE_MEMCPY: run_memcpy(&node->memcpy); break;
    case CU_GRAPH_NODE_TYPE_GRAPH: run_nodes(node->child->nodes, node->child->n); break;
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: {
        unsigned v = conditional_value(node->handle);
        if (node->cond == CU_GRAPH_COND_TYPE_IF) {
            if (v) run_nodes(node->bodies[0]->nodes, node->bodies[0]->n);
            else if (node->nbodies == 2) run_nodes(node->bodies[1]->nodes, node->bodies[1]->n);
        } else if (node->cond == CU_GRAPH_COND_TYPE_SWITCH) {
            if (v < node->nbodies) run_nodes(node->bodies[v]->nodes, node->bodies[v]->n);
        } else {
            long guard = 0;
            for (; conditional_value(node->handle) && guard < 100000; guard++)
                run_nodes(node->bodies[0]->nodes, node->bodies[0]->n);
            if (guard == 100000) fprintf(stderr, "fakecuda: a WHILE body ran 1e5 times; stopped\n");
        }
        break;
    }
    default: break;
    }
}
static void run_nodes(Node **nodes, size_t n) { for (size_t i = 0; i < n; i++) run_node(nodes[i]); }
static CUresult f_cuGraphLaunch(CUgraphExec he, CUstream hs) {
    Exec *e = (Exec *)he; CHECK(e, CUDA_ERROR_INVALID_VALUE);
    Node *n; CUresult r = stream_work(hs, CU_GRAPH_NODE_TYPE_GRAPH, &n); if (r) return r;
    if (n) n->child = clone(e->own, n);  /* launched inside a capture: a child graph node */
    else { handles_start(e->source); run_nodes(e->own->nodes, e->own->n); }
    return OK;
}
static CUresult f_cuGraphUpload(CUgraphExec he, CUstream hs) {
    CHECK(he, CUDA_ERROR_INVALID_VALUE); Stream *s = S(hs);
    CHECK(!(s && s->destroyed), CUDA_ERROR_INVALID_HANDLE); return OK;
}

static CUresult f_cuGetErrorString(CUresult e, const char **s) {
    static char buf[64]; snprintf(buf, sizeof buf, "fakecuda error %d", (int)e); *s = buf; return OK;
}
static CUresult f_cuGetErrorName(CUresult e, const char **s) {
    static char buf[64]; snprintf(buf, sizeof buf, "CUDA_ERROR_%d", (int)e); *s = buf; return OK;
}

/* ---- entry points ---- */
typedef struct { const char *name; int version; void *fn; } Entry;
#define E(name, version) {#name, version, (void *)f_##name}
static const Entry entries[] = {
    E(cuInit, 2000), {"cuDriverGetVersion", 2020, (void *)cuDriverGetVersion}, E(cuDeviceGetCount, 2000), E(cuDeviceGet, 2000), E(cuDeviceGetName, 2000),
    E(cuDeviceTotalMem, 3020), E(cuDeviceGetAttribute, 2000), E(cuDeviceGetUuid, 11040),
    E(cuDevicePrimaryCtxRetain, 7000), E(cuDevicePrimaryCtxRelease, 11000), E(cuCtxSetCurrent, 4000),
    E(cuCtxGetCurrent, 4000), E(cuCtxGetDevice, 2000), E(cuCtxSynchronize, 2000),
    E(cuDeviceGetGraphMemAttribute, 11040), E(cuDeviceGraphMemTrim, 11040), E(cuGetErrorString, 6000), E(cuGetErrorName, 6000),
    {"cuProfilerStart", 4000, (void *)f_cuProfiler}, {"cuProfilerStop", 4000, (void *)f_cuProfiler},
    E(cuMemAlloc, 3020), E(cuMemFree, 3020), E(cuMemGetInfo, 3020), E(cuMemHostAlloc, 2020),
    E(cuMemFreeHost, 2000), E(cuMemHostGetDevicePointer, 3020),
    E(cuMemcpyHtoD, 3020), E(cuMemcpyDtoH, 3020), E(cuMemcpyDtoD, 3020),
    E(cuMemcpyHtoDAsync, 3020), E(cuMemcpyDtoHAsync, 3020), E(cuMemcpyDtoDAsync, 3020),
    E(cuMemsetD8, 3020), E(cuMemsetD32, 3020), E(cuMemsetD8Async, 3020), E(cuMemsetD32Async, 3020),
    E(cuModuleLoadData, 2000), E(cuModuleUnload, 2000), E(cuModuleGetFunction, 2000), E(cuModuleGetGlobal, 3020),
    E(cuFuncGetAttribute, 2020), E(cuFuncSetAttribute, 9000), E(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050),
    E(cuLaunchKernel, 4000), E(cuLaunchKernelEx, 11060),
    E(cuStreamCreate, 2000), E(cuStreamCreateWithPriority, 5050), E(cuStreamDestroy, 4000),
    E(cuStreamSynchronize, 2000), E(cuStreamQuery, 2000), E(cuStreamBeginCapture, 10010),
    E(cuStreamBeginCaptureToGraph, 12030), E(cuStreamEndCapture, 10000), E(cuStreamIsCapturing, 10000),
    E(cuStreamGetCaptureInfo, 12030), E(cuStreamUpdateCaptureDependencies, 12030), E(cuStreamWaitEvent, 3020),
    E(cuEventCreate, 2000), E(cuEventDestroy, 4000), E(cuEventRecord, 2000), E(cuEventRecordWithFlags, 11010),
    E(cuEventSynchronize, 2000), E(cuEventQuery, 2000), E(cuEventElapsedTime, 12080),
    E(cuGraphCreate, 10000), E(cuGraphDestroy, 10000), E(cuGraphAddKernelNode, 12000),
    E(cuGraphKernelNodeGetParams, 12000), E(cuGraphKernelNodeSetParams, 12000),
    E(cuGraphKernelNodeSetAttribute, 11000), E(cuGraphKernelNodeGetAttribute, 11000),
    E(cuGraphAddMemsetNode, 10000), E(cuGraphAddMemcpyNode, 10000), E(cuGraphAddEmptyNode, 10000),
    E(cuGraphAddChildGraphNode, 10000), E(cuGraphAddEventRecordNode, 11010), E(cuGraphAddEventWaitNode, 11010),
    E(cuGraphAddMemAllocNode, 11040), E(cuGraphAddMemFreeNode, 11040), E(cuGraphConditionalHandleCreate, 12030),
    E(cuGraphAddNode, 12030), {"cuGraphAddNode", 13041, (void *)f_cuGraphAddNode},  /* _v3: the same C signature */ E(cuGraphGetNodes, 10000), E(cuGraphNodeGetType, 10000),
    E(cuGraphNodeGetDependencies, 12030), E(cuGraphDestroyNode, 10000), E(cuGraphDebugDotPrint, 11030),
    {"cuGraphInstantiateWithFlags", 11040, (void *)f_cuGraphInstantiate}, E(cuGraphInstantiateWithParams, 12000), E(cuGraphExecDestroy, 10000),
    E(cuGraphExecKernelNodeSetParams, 12000), E(cuGraphExecMemsetNodeSetParams, 10020),
    E(cuGraphNodeSetEnabled, 11060), E(cuGraphExecUpdate, 12000), E(cuGraphLaunch, 10000), E(cuGraphUpload, 11010),
};

/* Entry points not implemented: one trampoline per requested name, so the refusal can say which was called. */
#define MAX_UNIMPLEMENTED 1024
static const char *unimplemented_names[MAX_UNIMPLEMENTED];
static int n_unimplemented;
static CUresult unimplemented(int i) {
    fprintf(stderr, "fakecuda: %s is not implemented; answering CUDA_ERROR_NOT_SUPPORTED\n", unimplemented_names[i]);
    return CUDA_ERROR_NOT_SUPPORTED;
}
#define T1(i) static CUresult t##i(void) { return unimplemented(i); }
#define T4(i) T1(i##0) T1(i##1) T1(i##2) T1(i##3)
#define T16(i) T4(i##0) T4(i##1) T4(i##2) T4(i##3)
#define T64(i) T16(i##0) T16(i##1) T16(i##2) T16(i##3)
#define T256(i) T64(i##0) T64(i##1) T64(i##2) T64(i##3)
T256(10) T256(11) T256(12) T256(13)
#define R1(i) (void *)t##i,
#define R4(i) R1(i##0) R1(i##1) R1(i##2) R1(i##3)
#define R16(i) R4(i##0) R4(i##1) R4(i##2) R4(i##3)
#define R64(i) R16(i##0) R16(i##1) R16(i##2) R16(i##3)
#define R256(i) R64(i##0) R64(i##1) R64(i##2) R64(i##3)
static void *const trampolines[MAX_UNIMPLEMENTED] = {R256(10) R256(11) R256(12) R256(13)};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    (void)flags; CHECK(symbol && pfn, CUDA_ERROR_INVALID_VALUE);
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    /* One version per entry: the same name asked at another version is another ABI (cuCtxCreate_v2/v3/v4). */
    for (size_t i = 0; i < sizeof entries / sizeof *entries; i++)
        if (strcmp(entries[i].name, symbol) == 0 && entries[i].version == version) { *pfn = entries[i].fn; return OK; }
    CHECK(n_unimplemented < MAX_UNIMPLEMENTED, CUDA_ERROR_NOT_FOUND);
    unimplemented_names[n_unimplemented] = strdup(symbol);
    *pfn = trampolines[n_unimplemented++]; return OK;
}
