/* fakecuda.h: what the driver stand-in (fakecuda.c) and its kernel emulations (kernels.c) share. */
#ifndef FAKECUDA_H
#define FAKECUDA_H
#include <cuda.h>
#include <stddef.h>

#define MAX_PARAMS 64
typedef struct Module { int loaded; unsigned char *elf; size_t size; } Module;
typedef struct Function {
    Module *module; char name[256]; int max_dynamic_smem, regs, max_threads, static_smem;
    int nparams; unsigned short offset[MAX_PARAMS], size[MAX_PARAMS]; size_t param_bytes;  /* from .nv.info */
} Function;

/* One launch's configuration with its own copy of the argument values, as the driver keeps them: a node's
 * arguments are copied when it is made or updated, so later writes to the caller's buffers change nothing. */
typedef struct KernelCall {
    Function *func; unsigned grid[3], block[3], smem;
    unsigned char *args; void *argv[MAX_PARAMS];
} KernelCall;

CUresult kernel_call_make(KernelCall *k, const CUDA_KERNEL_NODE_PARAMS *p);
void kernel_call_copy(KernelCall *dst, const KernelCall *src);
void kernel_call_free(KernelCall *k);
void kernel_call_params(const KernelCall *k, CUDA_KERNEL_NODE_PARAMS *p);
/* Runs the kernel when kernels.c emulates it (the small kernels of kernels/basic.cu and the conditional
 * setters); any other kernel runs nothing and is counted. */
void kernel_call_run(const KernelCall *k);
int function_layout(Function *f);
#include <elf.h>
const Elf64_Sym *elf_symbol(const Module *m, const char *name, size_t *index);  /* reads the parameter layout from the module's .nv.info; 0 on success */

/* A device-updatable node of a live executable, found by the handle the driver gave out (devNode); NULL when no
 * executable holds it.  `enabled` points at the node's enable flag. */
KernelCall *device_node(void *dev_node, int **disabled);

/* Conditional handles: the value a launch of the graph starts with and the value kernels set. */
unsigned conditional_value(unsigned long long handle);
void conditional_set(unsigned long long handle, unsigned value);
#endif
