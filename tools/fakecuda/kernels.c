/* kernels.c: the fake driver's view of a cubin (symbols, parameter layout, registers, static shared memory) and
 * host emulations of the few kernels whose results the graph tests read (kernels/basic.cu and the conditional
 * setters and the device loop's kernels of kernels/conditional.cu, sample.cu's token pickers and the device-side
 * node updates of device_update.cu).  Every other kernel runs nothing: its outputs keep their fill pattern. */
#define _GNU_SOURCE
#include "fakecuda.h"

#include <elf.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the cubin ---- */
static const Elf64_Shdr *sections(const Module *m, int *n) {
    const Elf64_Ehdr *h = (const Elf64_Ehdr *)m->elf;
    *n = h->e_shnum;
    return (const Elf64_Shdr *)(m->elf + h->e_shoff);
}
static const char *section_name(const Module *m, const Elf64_Shdr *s) {
    int n;
    const Elf64_Shdr *sh = sections(m, &n);
    return (const char *)m->elf + sh[((const Elf64_Ehdr *)m->elf)->e_shstrndx].sh_offset + s->sh_name;
}
static const Elf64_Shdr *section(const Module *m, const char *prefix, const char *name) {
    int n;
    const Elf64_Shdr *sh = sections(m, &n);
    size_t k = strlen(prefix);
    for (int i = 0; i < n; i++) {
        const char *s = section_name(m, &sh[i]);
        if (strncmp(s, prefix, k) == 0 && strcmp(s + k, name) == 0) return &sh[i];
    }
    return NULL;
}
const Elf64_Sym *elf_symbol(const Module *m, const char *name, size_t *index) {
    int n;
    const Elf64_Shdr *sh = sections(m, &n);
    for (int i = 0; i < n; i++) {
        if (sh[i].sh_type != SHT_SYMTAB) continue;
        const Elf64_Sym *sym = (const Elf64_Sym *)(m->elf + sh[i].sh_offset);
        const char *str = (const char *)m->elf + sh[sh[i].sh_link].sh_offset;
        for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); k++)
            if (sym[k].st_shndx != SHN_UNDEF && strcmp(str + sym[k].st_name, name) == 0) {
                if (index) *index = k;
                return &sym[k];
            }
    }
    return NULL;
}

void *module_global(Module *m, const char *name, size_t *bytes) {
    size_t index;
    const Elf64_Sym *sym = elf_symbol(m, name, &index);
    if (!sym || ELF64_ST_TYPE(sym->st_info) != STT_OBJECT) return NULL;
    int n;
    const Elf64_Shdr *sh = sections(m, &n);
    if (!m->globals) m->globals = calloc(m->size / sizeof(Elf64_Sym) + 1, sizeof(void *)); /* >= symbols */
    if (!m->globals[index]) {
        size_t size = sym->st_size ? sym->st_size : 1;
        m->globals[index] = calloc(1, (size + 255) & ~(size_t)255);       /* zero, as C's statics */
        if (sym->st_shndx < n && sh[sym->st_shndx].sh_type != SHT_NOBITS) /* an initialiser */
            memcpy(m->globals[index], m->elf + sh[sym->st_shndx].sh_offset + sym->st_value, sym->st_size);
    }
    *bytes = sym->st_size;
    return m->globals[index];
}

/* .nv.info records: {u8 format, u8 attribute, u16 value or payload size}, payload only for format 4. */
enum {
    EIFMT_SVAL = 4,
    EIATTR_MAX_THREADS = 0x05,
    EIATTR_KPARAM_INFO = 0x17,
    EIATTR_CBANK_PARAM_SIZE = 0x19,
    EIATTR_REGCOUNT = 0x2f
};
typedef void (*RecordFn)(Function *f, int attr, const unsigned char *payload, unsigned value, void *ctx);
static void records(Function *f, const Elf64_Shdr *s, RecordFn fn, void *ctx) {
    const unsigned char *d = f->module->elf + s->sh_offset, *end = d + s->sh_size;
    while (d + 4 <= end) {
        int format = d[0], attr = d[1];
        unsigned v = d[2] | d[3] << 8;
        d += 4;
        fn(f, attr, format == EIFMT_SVAL ? d : NULL, v, ctx);
        if (format == EIFMT_SVAL) d += v;
    }
}
static void per_function(Function *f, int attr, const unsigned char *p, unsigned v, void *ctx) {
    (void)ctx;
    if (attr == EIATTR_KPARAM_INFO && p) {
        unsigned ordinal = p[4] | p[5] << 8, offset = p[6] | p[7] << 8;
        uint32_t flags;
        memcpy(&flags, p + 8, 4);
        if (ordinal < MAX_PARAMS) {
            f->offset[ordinal] = offset;
            f->size[ordinal] = (flags >> 18) & 0x3fff;
            if ((int)ordinal + 1 > f->nparams) f->nparams = ordinal + 1;
        }
    } else if (attr == EIATTR_CBANK_PARAM_SIZE && !p)
        f->param_bytes = v;
    else if (attr == EIATTR_MAX_THREADS && p) {
        uint32_t x, y, z;
        memcpy(&x, p, 4);
        memcpy(&y, p + 4, 4);
        memcpy(&z, p + 8, 4);
        f->max_threads = (int)(x * y * z);
    }
}
static void global_info(Function *f, int attr, const unsigned char *p, unsigned v, void *ctx) {
    (void)v;
    uint32_t sym, regs;
    if (attr != EIATTR_REGCOUNT || !p) return;
    memcpy(&sym, p, 4);
    memcpy(&regs, p + 4, 4);
    if (sym == *(size_t *)ctx) f->regs = (int)regs;
}
int function_layout(Function *f) {
    size_t index;
    const Elf64_Sym *sym = elf_symbol(f->module, f->name, &index);
    if (!sym || ELF64_ST_TYPE(sym->st_info) != STT_FUNC) return -1;
    const Elf64_Shdr *info = section(f->module, ".nv.info.", f->name);
    if (info) records(f, info, per_function, NULL);
    int n;
    const Elf64_Shdr *sh = sections(f->module, &n);
    for (int i = 0; i < n; i++)
        if (strcmp(section_name(f->module, &sh[i]), ".nv.info") == 0) records(f, &sh[i], global_info, &index);
    const Elf64_Shdr *shared = section(f->module, ".nv.shared.", f->name);
    /* The section also holds the 1 KiB the system reserves per block when .nv.shared.reserved.0 exists; ptxas's
     * (and the driver's) static size leaves it out. */
    int reserved = shared && section(f->module, ".nv.shared.reserved.", "0") ? 1024 : 0;
    f->static_smem = shared && (int)shared->sh_size > reserved ? (int)shared->sh_size - reserved : 0;
    f->max_dynamic_smem = 49152 - f->static_smem; /* until cuFuncSetAttribute opts in to more */
    if (!f->regs) f->regs = 32;
    int by_regs = 65536 / (((f->regs * 32 + 255) / 256) * 256) * 32; /* 256-register allocation per warp */
    if (by_regs > 1024) by_regs = 1024;
    if (!f->max_threads || f->max_threads > by_regs) f->max_threads = by_regs;
    return 0;
}

/* ---- argument copies ---- */
CUresult kernel_call_make(KernelCall *k, const CUDA_KERNEL_NODE_PARAMS *p) {
    Function *f = (Function *)p->func;
    memset(k, 0, sizeof *k);
    if (p->extra) return CUDA_ERROR_NOT_SUPPORTED; /* rawgraphs passes kernelParams; extra is not emulated */
    if (f->nparams && !p->kernelParams) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < f->nparams; i++)
        if (!p->kernelParams[i]) return CUDA_ERROR_INVALID_VALUE;
    k->func = f;
    k->smem = p->sharedMemBytes;
    k->grid[0] = p->gridDimX;
    k->grid[1] = p->gridDimY;
    k->grid[2] = p->gridDimZ;
    k->block[0] = p->blockDimX;
    k->block[1] = p->blockDimY;
    k->block[2] = p->blockDimZ;
    k->args = calloc(1, f->param_bytes + 8);
    for (int i = 0; i < f->nparams; i++) {
        memcpy(k->args + f->offset[i], p->kernelParams[i], f->size[i]); /* reads what the caller points at */
        k->argv[i] = k->args + f->offset[i];
    }
    return CUDA_SUCCESS;
}
void kernel_call_copy(KernelCall *dst, const KernelCall *src) {
    *dst = *src;
    if (!src->func) return;
    dst->args = calloc(1, src->func->param_bytes + 8);
    memcpy(dst->args, src->args, src->func->param_bytes);
    for (int i = 0; i < src->func->nparams; i++) dst->argv[i] = dst->args + src->func->offset[i];
}
void kernel_call_free(KernelCall *k) {
    free(k->args);
    k->args = NULL;
}
void kernel_call_params(const KernelCall *k, CUDA_KERNEL_NODE_PARAMS *p) {
    memset(p, 0, sizeof *p);
    p->func = (CUfunction)k->func;
    p->sharedMemBytes = k->smem;
    p->kernelParams = (void **)k->argv;
    p->gridDimX = k->grid[0];
    p->gridDimY = k->grid[1];
    p->gridDimZ = k->grid[2];
    p->blockDimX = k->block[0];
    p->blockDimY = k->block[1];
    p->blockDimZ = k->block[2];
}

/* ---- conditional handles ---- */
#define MAX_HANDLES 4096
static unsigned values[MAX_HANDLES];
unsigned conditional_value(unsigned long long h) { return h < MAX_HANDLES ? values[h] : 0; }
void conditional_set(unsigned long long h, unsigned v) {
    if (h < MAX_HANDLES) values[h] = v;
}

/* ---- emulated kernels ---- */
#define ARG(T, i) (*(T *)k->argv[i])
static long threads(const KernelCall *k) { return (long)k->grid[0] * k->block[0]; } /* 1-D kernels */
static void axpb(const KernelCall *k) {
    float *out = ARG(float *, 0);
    const float *x = ARG(const float *, 1);
    float a = ARG(float, 2), b = ARG(float, 3);
    int n = ARG(int, 4);
    for (long i = 0; i < n && i < threads(k); i++) {
        volatile float ax = a * x[i];
        out[i] = ax + b;
    } /* no FMA */
}
static void add(const KernelCall *k) {
    float *out = ARG(float *, 0);
    const float *x = ARG(const float *, 1), *y = ARG(const float *, 2);
    int n = ARG(int, 3);
    for (long i = 0; i < n && i < threads(k); i++) out[i] = x[i] + y[i];
}
static void fill64(const KernelCall *k) {
    long long *out = ARG(long long *, 0), start = ARG(long long, 1), step = ARG(long long, 2);
    int n = ARG(int, 3);
    for (long i = 0; i < n && i < threads(k); i++) out[i] = start + i * step;
}
static void noop(const KernelCall *k) { (void)k; }
static void set_if(const KernelCall *k) { conditional_set(ARG(unsigned long long, 0), *ARG(const int *, 1) != 0); }
static void set_switch(const KernelCall *k) {
    int v = *ARG(const int *, 1), n = ARG(int, 2);
    conditional_set(ARG(unsigned long long, 0), (unsigned)(v < 0 ? n : (v > n ? n : v)));
}
static void count_down(const KernelCall *k) {
    int left = --*ARG(int *, 1);
    conditional_set(ARG(unsigned long long, 0), left > 0);
}
/* sample.cu: argmax, Gumbel-max sampling (the same counter hash) and the step counter. */
static uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static void pick(int *tokens, const float *logits, int V, unsigned rows, const uint64_t *seed, const int *step,
                 float temperature) {
    int greedy = !(temperature > 0.0f);
    for (unsigned b = 0; b < rows; b++) {
        uint64_t key = greedy ? 0 : mix64(*seed ^ mix64(((uint64_t)(uint32_t)*step << 32) | b));
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = 0; i < V; i++) {
            float v = logits[(size_t)b * V + i];
            if (!greedy) {
                float u = ((float)(mix64(key + (uint64_t)i) >> 41) + 0.5f) * 1.1920928955078125e-07f;
                v = v / temperature - logf(-logf(u));
            }
            if (v > bv || (v == bv && i < bi)) {
                bv = v;
                bi = i;
            }
        }
        tokens[b] = bi == 0x7fffffff ? 0 : bi;
    }
}
static void argmax(const KernelCall *k) {
    pick(ARG(int *, 0), ARG(const float *, 1), ARG(int, 2), k->grid[0], NULL, NULL, 0.0f);
}
static void sample(const KernelCall *k) {
    pick(ARG(int *, 0), ARG(const float *, 1), ARG(int, 5), k->grid[0], ARG(const uint64_t *, 2), ARG(const int *, 3),
         ARG(float, 4));
}
static void advance_step(const KernelCall *k) { *ARG(int *, 0) += 1; }
/* conditional.cu: the device loop's first and last kernels. */
static void loop_begin(const KernelCall *k) {
    int *tokens = ARG(int *, 0), *positions = ARG(int *, 1), *tables = ARG(int *, 2), *done = ARG(int *, 3);
    int *out = ARG(int *, 4), *step = ARG(int *, 5);
    const int *h_tokens = ARG(const int *, 6), *h_positions = ARG(const int *, 7), *h_tables = ARG(const int *, 8);
    int B = ARG(int, 9), table_elems = ARG(int, 10), out_elems = ARG(int, 11);
    for (int i = 0; i < B; i++) {
        tokens[i] = h_tokens[i];
        positions[i] = h_positions[i];
        done[i] = 0;
    }
    for (int i = 0; i < table_elems; i++) tables[i] = h_tables[i];
    for (int i = 0; i < out_elems; i++) out[i] = -1;
    *step = 0;
}
static void decode_loop_tail(const KernelCall *k) {
    const int *next = ARG(const int *, 1);
    int *tokens = ARG(int *, 2), *positions = ARG(int *, 3), *done = ARG(int *, 4), *out = ARG(int *, 5);
    int *step = ARG(int *, 6), max_steps = ARG(int, 7), B = ARG(int, 8), eos = ARG(int, 9);
    int s = *step, any_live = 0;
    for (int b = 0; b < B && b < (int)k->block[0]; b++) {
        if (positions[b] < 0 || done[b]) continue;
        int t = next[b];
        out[(size_t)s * B + b] = t;
        tokens[b] = t;
        if (t == eos) {
            done[b] = 1;
            positions[b] = -1;
        } else {
            positions[b] += 1;
            any_live = 1;
        }
    }
    *step = s + 1;
    conditional_set(ARG(unsigned long long, 0), (s + 1 < max_steps) && any_live);
}
static void loop_end(const KernelCall *k) {
    int *h_out = ARG(int *, 0), *h_step = ARG(int *, 1), n = ARG(int, 4);
    const int *out = ARG(const int *, 2), *step = ARG(const int *, 3);
    for (int i = 0; i < n; i++) h_out[i] = out[i];
    if (n > 0) *h_step = *step;
}
/* device_update.cu: the device runtime's node updates, applied to the executable's copy of the node. */
static void set_grid(void *node, unsigned x, unsigned y, unsigned z) {
    int *disabled;
    KernelCall *t = device_node(node, &disabled);
    if (t) {
        t->grid[0] = x;
        t->grid[1] = y;
        t->grid[2] = z;
    }
}
static void set_param(void *node, size_t offset, const void *value, size_t size) {
    int *disabled;
    KernelCall *t = device_node(node, &disabled);
    if (t && offset + size <= t->func->param_bytes) memcpy(t->args + offset, value, size);
}
static void set_grid_from(const KernelCall *k) {
    int per = ARG(int, 2), blocks = (*ARG(const int *, 1) + per - 1) / per;
    set_grid(ARG(void *, 0), blocks > 0 ? (unsigned)blocks : 1, 1, 1);
}
static void set_scalar_from(const KernelCall *k) {
    set_param(ARG(void *, 0), (size_t)ARG(unsigned long long, 2), ARG(const float *, 1), sizeof(float));
}
typedef struct { /* cudaGraphKernelNodeUpdate (driver_types.h), 40 bytes */
    void *node;
    int field;
    int pad;
    union {
        unsigned grid[3];
        struct {
            const void *value;
            size_t offset, size;
        } param;
        unsigned enabled;
    } u;
} NodeUpdate;
_Static_assert(sizeof(NodeUpdate) == 40, "cudaGraphKernelNodeUpdate is 40 bytes");
static void apply_updates(const KernelCall *k) {
    const NodeUpdate *u = ARG(const NodeUpdate *, 0);
    unsigned long long n = ARG(unsigned long long, 1);
    for (unsigned long long i = 0; i < n; i++) {
        if (u[i].field == 1)
            set_grid(u[i].node, u[i].u.grid[0], u[i].u.grid[1], u[i].u.grid[2]);
        else if (u[i].field == 2)
            set_param(u[i].node, u[i].u.param.offset, u[i].u.param.value, u[i].u.param.size);
        else if (u[i].field == 3) {
            int *disabled;
            if (device_node(u[i].node, &disabled)) *disabled = !u[i].u.enabled;
        }
    }
}
static const struct {
    const char *name;
    int nparams;
    void (*run)(const KernelCall *);
} emulated[] = {
    {"set_grid_from", 3, set_grid_from},
    {"set_scalar_from", 3, set_scalar_from},
    {"apply_updates", 2, apply_updates},
    {"argmax", 3, argmax},
    {"sample", 6, sample},
    {"advance_step", 1, advance_step},
    {"loop_begin", 12, loop_begin},
    {"decode_loop_tail", 10, decode_loop_tail},
    {"loop_end", 5, loop_end},
    {"axpb", 5, axpb},
    {"add", 4, add},
    {"fill64", 4, fill64},
    {"noop", 0, noop},
    {"set_if", 2, set_if},
    {"set_switch", 3, set_switch},
    {"count_down", 2, count_down},
};
static long not_emulated;
static void report(void) {
    if (not_emulated)
        fprintf(stderr, "fakecuda: %ld launches of kernels it does not emulate ran nothing\n", not_emulated);
}
void kernel_call_run(const KernelCall *k) {
    for (size_t i = 0; i < sizeof emulated / sizeof *emulated; i++)
        if (strcmp(k->func->name, emulated[i].name) == 0 && k->func->nparams == emulated[i].nparams) {
            emulated[i].run(k);
            return;
        }
    if (not_emulated++ == 0) atexit(report);
    if (getenv("FAKECUDA_VERBOSE")) fprintf(stderr, "fakecuda: %s is not emulated; it ran nothing\n", k->func->name);
}
