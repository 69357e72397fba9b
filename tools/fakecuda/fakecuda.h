/* fakecuda.h: what the driver stand-in's files share: device.c (device, memory, modules, launches), stream.c
 * (streams, capture, events), graph.c (graphs, executables, conditionals), kernels.c (the cubin's layout, the
 * emulated kernels) and entry.c (cuGetProcAddress). */
#ifndef FAKECUDA_H
#define FAKECUDA_H
#include <cuda.h>
#include <elf.h>
#include <stddef.h>
#include <stdlib.h>

#define OK CUDA_SUCCESS
#define CHECK(cond, err)           \
    do {                           \
        if (!(cond)) return (err); \
    } while (0)
static inline void *zalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) abort();
    return p;
}

/* ---- modules and kernel calls (kernels.c) ---- */
#define MAX_PARAMS 64
typedef struct Module {
    int loaded;
    unsigned char *elf;
    size_t size;
    void **globals; /* by symbol index: each __device__ variable's memory, made on first use */
    size_t nglobals;
} Module;
typedef struct Function {
    Module *module;
    char name[256];
    int max_dynamic_smem, regs, max_threads, static_smem;
    int nonportable; /* cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED): clusters up to 16 blocks */
    int nparams;
    unsigned short offset[MAX_PARAMS], size[MAX_PARAMS];
    size_t param_bytes; /* from .nv.info */
} Function;

/* One launch's configuration with its own copy of the argument values, as the driver keeps them: a node's
 * arguments are copied when it is made or updated, so later writes to the caller's buffers change nothing. */
typedef struct KernelCall {
    Function *func;
    unsigned grid[3], block[3], smem;
    unsigned char *args;
    void *argv[MAX_PARAMS];
} KernelCall;

const Elf64_Sym *elf_symbol(const Module *m, const char *name, size_t *index);
int function_layout(Function *f); /* parameters, registers, shared memory from the cubin; 0 on success */
/* The __device__ variable `name`: the same memory at every call, holding its initial value; NULL if none. */
void *module_global(Module *m, const char *name, size_t *bytes);
CUresult kernel_call_make(KernelCall *k, const CUDA_KERNEL_NODE_PARAMS *p);
void kernel_call_copy(KernelCall *dst, const KernelCall *src);
void kernel_call_free(KernelCall *k);
void kernel_call_params(const KernelCall *k, CUDA_KERNEL_NODE_PARAMS *p);
void kernel_call_run(const KernelCall *k); /* an emulated kernel runs; any other runs nothing and is counted */
/* Conditional handles: the value kernels set and conditional nodes read. */
unsigned conditional_value(unsigned long long handle);
void conditional_set(unsigned long long handle, unsigned value);

/* ---- handles ---- */
typedef struct Graph Graph;
typedef struct Capture Capture;
typedef struct Exec Exec;
typedef struct Node {
    CUgraphNodeType type;
    Graph *graph;
    struct Node **deps;
    size_t ndeps;
    int disabled;
    KernelCall kernel;
    CUkernelNodeAttrValue attrs[32];
    CUDA_MEMSET_NODE_PARAMS memset;
    CUDA_MEMCPY3D memcpy;
    Graph *child;
    Graph **bodies;
    unsigned nbodies; /* child graph; conditional bodies */
    CUgraphConditionalHandle handle;
    CUgraphConditionalNodeType cond; /* conditional */
    CUdeviceptr dptr;
    size_t bytes; /* memory allocation */
} Node;
struct Graph {
    Node **nodes;
    size_t n, cap;
    Node *parent;
    int capturing; /* captures writing into it: it may not be destroyed, nor its nodes removed */
};
/* An executable owns a clone of its graph (the driver's copy): the source graph may be changed or destroyed.
 * `names` are the source's node handles, which per-node updates name; they are compared, never followed. */
struct Exec {
    Graph *source, *own;
    Node **names;
    size_t n;
};
typedef struct Stream {
    Capture *cap;
    Node **deps;
    size_t ndeps;
    int joined, destroyed, blocking;
    CUgraphEdgeData *edges;
} Stream;
struct Capture {
    Graph *graph;
    int invalid, ended, global, owns_graph;
    unsigned long long id;
    Stream *origin;
};
typedef struct Event {
    double t;
    int recorded, timing;
    Capture *cap;
    Stream *from;
    Node **deps;
    size_t ndeps;
} Event;
static inline int is_legacy(CUstream s) { return !s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD; }
static inline Stream *S(CUstream s) { return is_legacy(s) ? NULL : (Stream *)s; }

/* ---- graph.c ---- */
extern size_t graph_bytes_in_use, graph_bytes_high;
void node_list_copy(Node ***dst, size_t *n, Node *const *src, size_t k);
Node *graph_add(Graph *g, CUgraphNodeType type, const CUgraphNode *deps, size_t ndeps);
CUresult check_deps(Graph *g, const CUgraphNode *deps, size_t ndeps);
void graph_free(Graph *g);
/* A device-updatable node of a live executable, found by the handle the driver gave out (devNode); NULL when no
 * executable holds it.  `disabled` points at the node's flag. */
KernelCall *device_node(void *dev_node, int **disabled);

/* ---- stream.c ---- */
CUresult stream_work(CUstream hs, CUgraphNodeType type, Node **out); /* node when capturing, else NULL */
/* In a global-mode capture a synchronous or legacy-stream call answers `err` and invalidates the captures. */
CUresult refuse_in_global_capture(CUresult err);
/* Work on the legacy stream waits for every blocking stream: refused (IMPLICIT) while one is capturing, and the
 * captures it would join are invalidated. */
CUresult legacy_work(void);
/* ---- device.c ---- */
CUresult make_call(KernelCall *k, const CUDA_KERNEL_NODE_PARAMS *p); /* the driver's launch checks */
CUresult check_attribute(const KernelCall *k, CUlaunchAttributeID id, const CUlaunchAttributeValue *v);
void run_memset(const CUDA_MEMSET_NODE_PARAMS *p);
void run_memcpy(const CUDA_MEMCPY3D *p);

/* ---- entry.c ----
 * Entry points by the name and version cuda.bindings asks cuGetProcAddress for; one version per entry: the same
 * name at another version is another ABI (cuCtxCreate_v2/v3/v4). Each table ends with a NULL name. */
typedef struct {
    const char *name;
    int version;
    void *fn;
} Entry;
#define E(name, version) {#name, version, (void *)f_##name}
extern const Entry device_entries[], stream_entries[], graph_entries[];
#endif
