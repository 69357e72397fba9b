/* entry.c: cuGetProcAddress, through which cuda.bindings finds every entry point of the driver stand-in. */
#define _GNU_SOURCE
#include "fakecuda.h"

#include <stdio.h>
#include <string.h>

/* Entry points not implemented: one trampoline per requested name, so the refusal can say which was called. */
#define MAX_UNIMPLEMENTED 1024
static const char *unimplemented_names[MAX_UNIMPLEMENTED];
static int n_unimplemented;
/* Trampoline t1abcde passes 1abcde: five base-4 digits (the pasting below) after a leading 1. */
static CUresult unimplemented(long pasted) {
    int i = 0;
    for (int mul = 1, k = 0; k < 5; k++, mul *= 4, pasted /= 10) i += (int)(pasted % 10) * mul;
    fprintf(stderr, "fakecuda: %s is not implemented; answering CUDA_ERROR_NOT_SUPPORTED\n", unimplemented_names[i]);
    return CUDA_ERROR_NOT_SUPPORTED;
}
#define T1(i) \
    static CUresult t##i(void) { return unimplemented(i); }
#define T4(i) T1(i##0) T1(i##1) T1(i##2) T1(i##3)
#define T16(i) T4(i##0) T4(i##1) T4(i##2) T4(i##3)
#define T64(i) T16(i##0) T16(i##1) T16(i##2) T16(i##3)
#define T256(i) T64(i##0) T64(i##1) T64(i##2) T64(i##3)
T256(10)
T256(11)
T256(12)
T256(13)
#define R1(i) (void *)t##i,
#define R4(i) R1(i##0) R1(i##1) R1(i##2) R1(i##3)
#define R16(i) R4(i##0) R4(i##1) R4(i##2) R4(i##3)
#define R64(i) R16(i##0) R16(i##1) R16(i##2) R16(i##3)
#define R256(i) R64(i##0) R64(i##1) R64(i##2) R64(i##3)
static void *const trampolines[MAX_UNIMPLEMENTED] = {R256(10) R256(11) R256(12) R256(13)};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    (void)flags;
    CHECK(symbol && pfn, CUDA_ERROR_INVALID_VALUE);
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    for (const Entry *const *t = (const Entry *const[]){device_entries, stream_entries, graph_entries, NULL}; *t; t++)
        for (const Entry *e = *t; e->name; e++)
            if (strcmp(e->name, symbol) == 0 && e->version == version) {
                *pfn = e->fn;
                return OK;
            }
    CHECK(n_unimplemented < MAX_UNIMPLEMENTED, CUDA_ERROR_NOT_FOUND);
    unimplemented_names[n_unimplemented] = strdup(symbol);
    *pfn = trampolines[n_unimplemented++];
    return OK;
}
