/* graph.c: graphs, their nodes, executables and their launch, conditional handles and device-updatable nodes,
 * for the fakecuda driver stand-in (README.md). */
#define _GNU_SOURCE
#include "fakecuda.h"

#include <stdio.h>
#include <string.h>

size_t graph_bytes_in_use, graph_bytes_high;
static unsigned long long next_cond_handle = 1;
static Exec *live_execs[1024]; /* for device-side updates, which name a node of whichever executable holds it */
static Graph *clone(const Graph *g, Node *parent);
static Node *exec_node(Exec *e, CUgraphNode n);

void node_list_copy(Node ***dst, size_t *n, Node *const *src, size_t k) {
    free(*dst);
    *dst = k ? zalloc(k * sizeof(Node *)) : NULL;
    if (k) memcpy(*dst, src, k * sizeof(Node *));
    *n = k;
}

Node *graph_add(Graph *g, CUgraphNodeType type, const CUgraphNode *deps, size_t ndeps) {
    Node *n = zalloc(sizeof(Node));
    n->type = type;
    n->graph = g;
    node_list_copy(&n->deps, &n->ndeps, (Node *const *)deps, ndeps);
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 16;
        g->nodes = realloc(g->nodes, g->cap * sizeof(Node *));
    }
    g->nodes[g->n++] = n;
    return n;
}

CUresult check_deps(Graph *g, const CUgraphNode *deps, size_t ndeps) {
    CHECK(g, CUDA_ERROR_INVALID_VALUE);
    CHECK(ndeps == 0 || deps, CUDA_ERROR_INVALID_VALUE);
    for (size_t i = 0; i < ndeps; i++) {
        CHECK(deps[i] && ((Node *)deps[i])->graph == g, CUDA_ERROR_INVALID_VALUE);
        for (size_t j = 0; j < i; j++) CHECK(deps[i] != deps[j], CUDA_ERROR_INVALID_VALUE);
    }
    return OK;
}

static void node_free(Node *n) {
    for (unsigned i = 0; i < n->nbodies; i++) graph_free(n->bodies[i]);
    if (n->child) graph_free(n->child);
    kernel_call_free(&n->kernel);
    /* An allocation node's memory is not freed with it: an executable's clone of the graph still points at it. */
    if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) graph_bytes_in_use -= n->bytes;
    free(n->bodies);
    free(n->deps);
    free(n);
}
void graph_free(Graph *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n; i++) node_free(g->nodes[i]);
    free(g->nodes);
    free(g);
}

/* ---- graphs ---- */
static CUresult f_cuGraphCreate(CUgraph *g, unsigned flags) {
    CHECK(flags == 0, CUDA_ERROR_INVALID_VALUE);
    *g = zalloc(sizeof(Graph));
    return OK;
}
static CUresult f_cuGraphDestroy(CUgraph g) {
    CHECK(g, CUDA_ERROR_INVALID_VALUE);
    CHECK(!((Graph *)g)->capturing, CUDA_ERROR_ILLEGAL_STATE); /* cuda.h: not while a capture writes into it */
    CHECK(!((Graph *)g)->parent, CUDA_ERROR_INVALID_VALUE);
    graph_free((Graph *)g);
    return OK;
}
static CUresult add_node(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps, size_t n, CUgraphNodeType type,
                         Node **node) {
    CHECK(out, CUDA_ERROR_INVALID_VALUE);
    CUresult r = check_deps((Graph *)hg, deps, n);
    if (r) return r;
    *node = graph_add((Graph *)hg, type, deps, n);
    *out = (CUgraphNode)*node;
    return OK;
}
static CUresult f_cuGraphAddKernelNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                       const CUDA_KERNEL_NODE_PARAMS *p) {
    KernelCall k;
    CUresult r = make_call(&k, p);
    if (r) return r;
    Node *node;
    r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_KERNEL, &node);
    if (r) {
        kernel_call_free(&k);
        return r;
    }
    node->kernel = k;
    return OK;
}
static CUresult f_cuGraphKernelNodeGetParams(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS *p) {
    Node *node = (Node *)n;
    CHECK(node && node->type == CU_GRAPH_NODE_TYPE_KERNEL, CUDA_ERROR_INVALID_VALUE);
    kernel_call_params(&node->kernel, p);
    return OK;
}
/* New parameters keep the node's attributes valid: a cluster must still divide the grid. */
static CUresult set_kernel(Node *n, const CUDA_KERNEL_NODE_PARAMS *p) {
    const CUlaunchAttributeValue *cluster = &n->attrs[CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION];
    KernelCall k;
    CUresult r = make_call(&k, p);
    if (r) return r;
    if (cluster->clusterDim.x && (r = check_attribute(&k, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, cluster))) {
        kernel_call_free(&k);
        return r;
    }
    kernel_call_free(&n->kernel);
    n->kernel = k;
    return OK;
}
static CUresult f_cuGraphKernelNodeSetParams(CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p) {
    Node *node = (Node *)n;
    CHECK(node && node->type == CU_GRAPH_NODE_TYPE_KERNEL, CUDA_ERROR_INVALID_VALUE);
    return set_kernel(node, p);
}
static CUresult f_cuGraphKernelNodeSetAttribute(CUgraphNode hn, CUkernelNodeAttrID id, const CUkernelNodeAttrValue *v) {
    Node *n = (Node *)hn;
    CHECK(n && n->type == CU_GRAPH_NODE_TYPE_KERNEL && v, CUDA_ERROR_INVALID_VALUE);
    CUresult r = check_attribute(&n->kernel, id, v);
    if (r) return r;
    n->attrs[id] = *v;
    if (id == CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE) /* the handle device-side updates name */
        n->attrs[id].deviceUpdatableKernelNode.devNode =
            v->deviceUpdatableKernelNode.deviceUpdatable ? (CUgraphDeviceNode)n : NULL;
    return OK;
}
static CUresult f_cuGraphKernelNodeGetAttribute(CUgraphNode hn, CUkernelNodeAttrID id, CUkernelNodeAttrValue *v) {
    Node *n = (Node *)hn;
    CHECK(n && n->type == CU_GRAPH_NODE_TYPE_KERNEL && v && id < 32, CUDA_ERROR_INVALID_VALUE);
    *v = n->attrs[id];
    return OK;
}
static CUresult f_cuGraphAddMemsetNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                       const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx) {
    (void)ctx;
    CHECK(p && p->dst && (p->elementSize == 1 || p->elementSize == 2 || p->elementSize == 4), CUDA_ERROR_INVALID_VALUE);
    CHECK(p->height <= 1 || p->pitch >= p->width * p->elementSize, CUDA_ERROR_INVALID_VALUE);
    Node *node;
    CUresult r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEMSET, &node);
    if (r) return r;
    node->memset = *p;
    return OK;
}
static CUresult f_cuGraphAddMemcpyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                       const CUDA_MEMCPY3D *p, CUcontext ctx) {
    (void)ctx;
    CHECK(p && p->WidthInBytes, CUDA_ERROR_INVALID_VALUE);
    Node *node;
    CUresult r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEMCPY, &node);
    if (r) return r;
    node->memcpy = *p;
    return OK;
}
static CUresult f_cuGraphAddEmptyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n) {
    Node *node;
    return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_EMPTY, &node);
}
static CUresult f_cuGraphAddChildGraphNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                           CUgraph child) {
    CHECK(child && child != g, CUDA_ERROR_INVALID_VALUE);
    Node *node;
    CUresult r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_GRAPH, &node);
    if (r) return r;
    node->child = clone((Graph *)child, node);
    return OK;
}
static CUresult f_cuGraphAddEventRecordNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUevent e) {
    CHECK(e, CUDA_ERROR_INVALID_VALUE);
    Node *node;
    return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_EVENT_RECORD, &node);
}
static CUresult f_cuGraphAddEventWaitNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUevent e) {
    CHECK(e, CUDA_ERROR_INVALID_VALUE);
    Node *node;
    return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_WAIT_EVENT, &node);
}
static CUresult f_cuGraphAddMemAllocNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                         CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    CHECK(p && p->bytesize, CUDA_ERROR_INVALID_VALUE);
    Node *node;
    CUresult r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEM_ALLOC, &node);
    if (r) return r;
    node->bytes = p->bytesize;
    node->dptr = (CUdeviceptr)aligned_alloc(256, (p->bytesize + 255) & ~(size_t)255);
    graph_bytes_in_use += p->bytesize;
    if (graph_bytes_in_use > graph_bytes_high) graph_bytes_high = graph_bytes_in_use;
    p->dptr = node->dptr;
    return OK;
}
static CUresult f_cuGraphAddMemFreeNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUdeviceptr d) {
    CHECK(d, CUDA_ERROR_INVALID_VALUE);
    Node *node;
    return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEM_FREE, &node);
}
static struct {
    Graph *graph;
    unsigned value;
    int assign;
} handle_defaults[4096];
static CUresult f_cuGraphConditionalHandleCreate(CUgraphConditionalHandle *h, CUgraph g, CUcontext ctx, unsigned def,
                                                 unsigned flags) {
    (void)ctx;
    CHECK(g && h, CUDA_ERROR_INVALID_VALUE);
    CHECK(next_cond_handle < 4096, CUDA_ERROR_OUT_OF_MEMORY);
    handle_defaults[next_cond_handle].graph = (Graph *)g;
    handle_defaults[next_cond_handle].value = def;
    handle_defaults[next_cond_handle].assign = (flags & CU_GRAPH_COND_ASSIGN_DEFAULT) != 0;
    conditional_set(next_cond_handle, 0);
    *h = next_cond_handle++;
    return OK;
}
/* At the start of each launch a handle made with CU_GRAPH_COND_ASSIGN_DEFAULT takes its default. */
static void handles_start(Graph *g) {
    for (unsigned long long h = 1; h < next_cond_handle; h++)
        if (handle_defaults[h].graph == g && handle_defaults[h].assign) conditional_set(h, handle_defaults[h].value);
}
static CUresult f_cuGraphAddNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges,
                                 size_t n, CUgraphNodeParams *p) {
    (void)edges;
    CHECK(p, CUDA_ERROR_INVALID_VALUE);
    if (p->type == CU_GRAPH_NODE_TYPE_KERNEL) {
        CUDA_KERNEL_NODE_PARAMS k;
        memcpy(&k, &p->kernel, sizeof k);
        return f_cuGraphAddKernelNode(out, g, deps, n, &k);
    }
    if (p->type == CU_GRAPH_NODE_TYPE_EMPTY) return f_cuGraphAddEmptyNode(out, g, deps, n);
    CHECK(p->type == CU_GRAPH_NODE_TYPE_CONDITIONAL, CUDA_ERROR_NOT_SUPPORTED);
    CUDA_CONDITIONAL_NODE_PARAMS *c = &p->conditional;
    CHECK(c->handle, CUDA_ERROR_INVALID_VALUE);
    CHECK(c->type == CU_GRAPH_COND_TYPE_SWITCH ? c->size >= 1
                                               : (c->size == 1 || (c->type == CU_GRAPH_COND_TYPE_IF && c->size == 2)),
          CUDA_ERROR_INVALID_VALUE);
    Node *node;
    CUresult r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_CONDITIONAL, &node);
    if (r) return r;
    node->handle = c->handle;
    node->cond = c->type;
    node->nbodies = c->size;
    node->bodies = zalloc(c->size * sizeof(Graph *));
    for (unsigned i = 0; i < c->size; i++) {
        node->bodies[i] = zalloc(sizeof(Graph));
        node->bodies[i]->parent = node;
    }
    c->phGraph_out = (CUgraph *)node->bodies; /* the driver's own array, as in cuda.h */
    return OK;
}
static CUresult f_cuGraphGetNodes(CUgraph hg, CUgraphNode *nodes, size_t *n) {
    Graph *g = (Graph *)hg;
    CHECK(g && n, CUDA_ERROR_INVALID_VALUE);
    if (nodes) {
        size_t k = *n < g->n ? *n : g->n;
        memcpy(nodes, g->nodes, k * sizeof(Node *));
        *n = k;
    } else
        *n = g->n;
    return OK;
}
static CUresult f_cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType *t) {
    CHECK(n, CUDA_ERROR_INVALID_VALUE);
    *t = ((Node *)n)->type;
    return OK;
}
static CUresult f_cuGraphNodeGetDependencies(CUgraphNode hn, CUgraphNode *deps, CUgraphEdgeData *edges, size_t *n) {
    Node *node = (Node *)hn;
    CHECK(node && n, CUDA_ERROR_INVALID_VALUE);
    if (deps) {
        size_t k = *n < node->ndeps ? *n : node->ndeps;
        memcpy(deps, node->deps, k * sizeof(Node *));
        if (edges) memset(edges, 0, k * sizeof *edges);
        *n = k;
    } else
        *n = node->ndeps;
    return OK;
}
static CUresult f_cuGraphDestroyNode(CUgraphNode hn) {
    Node *node = (Node *)hn;
    CHECK(node, CUDA_ERROR_INVALID_VALUE);
    CHECK(!node->graph->capturing, CUDA_ERROR_ILLEGAL_STATE);
    Graph *g = node->graph;
    size_t j = 0;
    for (size_t i = 0; i < g->n; i++)
        if (g->nodes[i] != node) g->nodes[j++] = g->nodes[i];
    g->n = j;
    for (size_t i = 0; i < g->n; i++) { /* edges into the removed node go with it */
        Node *m = g->nodes[i];
        size_t k = 0;
        for (size_t d = 0; d < m->ndeps; d++)
            if (m->deps[d] != node) m->deps[k++] = m->deps[d];
        m->ndeps = k;
    }
    node_free(node);
    return OK;
}
static CUresult f_cuGraphDebugDotPrint(CUgraph hg, const char *path, unsigned flags) {
    (void)flags;
    Graph *g = (Graph *)hg;
    CHECK(g && path, CUDA_ERROR_INVALID_VALUE);
    FILE *f = fopen(path, "w");
    CHECK(f, CUDA_ERROR_OPERATING_SYSTEM);
    fprintf(f, "digraph fakecuda {\n");
    for (size_t i = 0; i < g->n; i++) {
        Node *n = g->nodes[i];
        fprintf(f, "  n%p [label=\"%s\"];\n", (void *)n,
                n->type == CU_GRAPH_NODE_TYPE_KERNEL ? n->kernel.func->name : "node");
        for (size_t d = 0; d < n->ndeps; d++) fprintf(f, "  n%p -> n%p;\n", (void *)n->deps[d], (void *)n);
    }
    fprintf(f, "}\n");
    fclose(f);
    return OK;
}
static Graph *clone(const Graph *g, Node *parent) {
    Graph *c = zalloc(sizeof(Graph));
    c->parent = parent;
    for (size_t i = 0; i < g->n; i++) {
        Node *src = g->nodes[i], *dst = graph_add(c, src->type, NULL, 0);
        Node **deps = zalloc((src->ndeps + 1) * sizeof(Node *));
        for (size_t d = 0; d < src->ndeps; d++)
            for (size_t k = 0; k < i; k++)
                if (g->nodes[k] == src->deps[d]) deps[d] = c->nodes[k];
        free(dst->deps);
        dst->deps = deps;
        dst->ndeps = src->ndeps;
        kernel_call_copy(&dst->kernel, &src->kernel);
        dst->memset = src->memset;
        dst->memcpy = src->memcpy;
        dst->handle = src->handle;
        dst->cond = src->cond;
        memcpy(dst->attrs, src->attrs, sizeof dst->attrs);
        if (src->child) dst->child = clone(src->child, dst);
        if (src->nbodies) {
            dst->nbodies = src->nbodies;
            dst->bodies = zalloc(src->nbodies * sizeof(Graph *));
            for (unsigned b = 0; b < src->nbodies; b++) dst->bodies[b] = clone(src->bodies[b], dst);
        }
    }
    return c;
}

/* ---- executables ---- */
static int conditional_body_ok(const Graph *g) {
    for (size_t i = 0; i < g->n; i++) {
        CUgraphNodeType t = g->nodes[i]->type;
        if (t != CU_GRAPH_NODE_TYPE_KERNEL && t != CU_GRAPH_NODE_TYPE_EMPTY && t != CU_GRAPH_NODE_TYPE_GRAPH &&
            t != CU_GRAPH_NODE_TYPE_MEMSET && t != CU_GRAPH_NODE_TYPE_MEMCPY && t != CU_GRAPH_NODE_TYPE_CONDITIONAL)
            return 0;
    }
    return 1;
}
static Node *first_bad_body_node(const Graph *g) {
    for (size_t i = 0; i < g->n; i++) {
        Node *n = g->nodes[i];
        for (unsigned b = 0; b < n->nbodies; b++) {
            if (!conditional_body_ok(n->bodies[b])) return n;
            Node *inner = first_bad_body_node(n->bodies[b]);
            if (inner) return inner;
        }
    }
    return NULL;
}
static CUresult instantiate(CUgraphExec *out, CUgraph hg, CUgraphNode *err_node) {
    Graph *g = (Graph *)hg;
    CHECK(g && out, CUDA_ERROR_INVALID_VALUE);
    Node *bad = first_bad_body_node(g);
    if (bad) {
        if (err_node) *err_node = (CUgraphNode)bad;
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    Exec *e = zalloc(sizeof(Exec));
    e->source = g;
    e->own = clone(g, NULL);
    e->n = g->n;
    e->names = zalloc((g->n + 1) * sizeof(Node *));
    memcpy(e->names, g->nodes, g->n * sizeof(Node *));
    for (int i = 0; i < 1024; i++)
        if (!live_execs[i]) {
            live_execs[i] = e;
            break;
        }
    *out = (CUgraphExec)e;
    return OK;
}
/* Device-side updates (kernels/device_update.cu) name a node of whichever live executable holds it. */
KernelCall *device_node(void *dev_node, int **disabled) {
    for (int i = 0; i < 1024; i++) {
        Node *n = live_execs[i] ? exec_node(live_execs[i], (CUgraphNode)dev_node) : NULL;
        if (n && n->type == CU_GRAPH_NODE_TYPE_KERNEL) {
            *disabled = &n->disabled;
            return &n->kernel;
        }
    }
    return NULL;
}
static CUresult f_cuGraphInstantiate(CUgraphExec *out, CUgraph g, unsigned long long flags) {
    (void)flags;
    return instantiate(out, g, NULL);
}
static CUresult f_cuGraphInstantiateWithParams(CUgraphExec *out, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    CHECK(p, CUDA_ERROR_INVALID_VALUE);
    p->hErrNode_out = NULL;
    CUresult r = instantiate(out, g, &p->hErrNode_out);
    p->result_out = r ? CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED : CUDA_GRAPH_INSTANTIATE_SUCCESS;
    return r;
}
static CUresult f_cuGraphExecDestroy(CUgraphExec he) {
    Exec *e = (Exec *)he;
    CHECK(e, CUDA_ERROR_INVALID_VALUE);
    for (int i = 0; i < 1024; i++)
        if (live_execs[i] == e) live_execs[i] = NULL;
    graph_free(e->own);
    free(e->names);
    free(e);
    return OK;
}
static Node *exec_node(Exec *e, CUgraphNode n) {
    for (size_t i = 0; i < e->n; i++)
        if (e->names[i] == (Node *)n) return e->own->nodes[i];
    return NULL;
}
static CUresult f_cuGraphExecKernelNodeSetParams(CUgraphExec he, CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS *p) {
    Exec *e = (Exec *)he;
    CHECK(e, CUDA_ERROR_INVALID_VALUE);
    Node *n = exec_node(e, hn);
    CHECK(n && n->type == CU_GRAPH_NODE_TYPE_KERNEL, CUDA_ERROR_INVALID_VALUE);
    return set_kernel(n, p);
}
static CUresult f_cuGraphExecMemsetNodeSetParams(CUgraphExec he, CUgraphNode hn, const CUDA_MEMSET_NODE_PARAMS *p,
                                                 CUcontext c) {
    (void)c;
    Exec *e = (Exec *)he;
    CHECK(e && p, CUDA_ERROR_INVALID_VALUE);
    Node *n = exec_node(e, hn);
    CHECK(n && n->type == CU_GRAPH_NODE_TYPE_MEMSET, CUDA_ERROR_INVALID_VALUE);
    n->memset = *p;
    return OK;
}
static CUresult f_cuGraphNodeSetEnabled(CUgraphExec he, CUgraphNode hn, unsigned on) {
    (void)on;
    Exec *e = (Exec *)he;
    CHECK(e, CUDA_ERROR_INVALID_VALUE);
    Node *n = exec_node(e, hn);
    CHECK(n, CUDA_ERROR_INVALID_VALUE);
    CHECK(n->type == CU_GRAPH_NODE_TYPE_KERNEL || n->type == CU_GRAPH_NODE_TYPE_MEMSET ||
              n->type == CU_GRAPH_NODE_TYPE_MEMCPY,
          CUDA_ERROR_INVALID_VALUE);
    n->disabled = !on;
    return OK;
}
static long index_in(const Graph *g, const Node *n) {
    for (size_t i = 0; i < g->n; i++)
        if (g->nodes[i] == n) return (long)i;
    return -1;
}
static int has_dep(const Graph *g, const Node *n, long dep) {
    for (size_t d = 0; d < n->ndeps; d++)
        if (index_in(g, n->deps[d]) == dep) return 1;
    return 0;
}
/* Nodes pair up by position. An edge in one graph and not the other is TOPOLOGY_CHANGED, reported at the edge's
 * source node in the new graph (as the driver does). */
static CUresult f_cuGraphExecUpdate(CUgraphExec he, CUgraph hg, CUgraphExecUpdateResultInfo *info) {
    Exec *e = (Exec *)he;
    Graph *g = (Graph *)hg;
    CHECK(e && g && info, CUDA_ERROR_INVALID_VALUE);
    memset(info, 0, sizeof *info);
    info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    if (g->n != e->n) return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    for (size_t i = 0; i < g->n; i++) {
        Node *mine = e->own->nodes[i], *new = g->nodes[i];
        if (new->type != mine->type) {
            info->result = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
            info->errorNode = (CUgraphNode)new;
            return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
        }
        for (size_t d = 0; d < mine->ndeps; d++) {
            long j = index_in(e->own, mine->deps[d]);
            if (j < 0) return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE; /* a clone's edges stay inside it: never skip */
            if (!has_dep(g, new, j)) {
                info->errorNode = (CUgraphNode)g->nodes[j];
                return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
            }
        }
        for (size_t d = 0; d < new->ndeps; d++)
            if (!has_dep(e->own, mine, index_in(g, new->deps[d]))) {
                info->errorNode = (CUgraphNode)new->deps[d];
                return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
            }
    }
    for (size_t i = 0; i < g->n; i++) { /* node handles stay those of the graph it was instantiated from */
        Node *src = g->nodes[i], *dst = e->own->nodes[i];
        kernel_call_free(&dst->kernel);
        kernel_call_copy(&dst->kernel, &src->kernel);
        dst->memset = src->memset;
        dst->memcpy = src->memcpy;
    }
    info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    return OK;
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
        case CU_GRAPH_NODE_TYPE_KERNEL:
            kernel_call_run(&node->kernel);
            break;
        case CU_GRAPH_NODE_TYPE_MEMSET:
            run_memset(&node->memset);
            break;
        case CU_GRAPH_NODE_TYPE_MEMCPY:
            run_memcpy(&node->memcpy);
            break;
        case CU_GRAPH_NODE_TYPE_GRAPH:
            run_nodes(node->child->nodes, node->child->n);
            break;
        case CU_GRAPH_NODE_TYPE_CONDITIONAL: {
            unsigned v = conditional_value(node->handle);
            if (node->cond == CU_GRAPH_COND_TYPE_IF) {
                if (v)
                    run_nodes(node->bodies[0]->nodes, node->bodies[0]->n);
                else if (node->nbodies == 2)
                    run_nodes(node->bodies[1]->nodes, node->bodies[1]->n);
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
        default:
            break;
    }
}
static void run_nodes(Node **nodes, size_t n) {
    for (size_t i = 0; i < n; i++) run_node(nodes[i]);
}
static CUresult f_cuGraphLaunch(CUgraphExec he, CUstream hs) {
    Exec *e = (Exec *)he;
    CHECK(e, CUDA_ERROR_INVALID_VALUE);
    Node *n;
    CUresult r = stream_work(hs, CU_GRAPH_NODE_TYPE_GRAPH, &n);
    if (r) return r;
    if (n)
        n->child = clone(e->own, n); /* launched inside a capture: a child graph node */
    else {
        handles_start(e->source);
        run_nodes(e->own->nodes, e->own->n);
    }
    return OK;
}
static CUresult f_cuGraphUpload(CUgraphExec he, CUstream hs) {
    CHECK(he, CUDA_ERROR_INVALID_VALUE);
    Stream *s = S(hs);
    CHECK(!(s && s->destroyed), CUDA_ERROR_INVALID_HANDLE);
    return OK;
}

// clang-format off
const Entry graph_entries[] = {
    E(cuGraphCreate, 10000), E(cuGraphDestroy, 10000), E(cuGraphAddKernelNode, 12000),
    E(cuGraphKernelNodeGetParams, 12000), E(cuGraphKernelNodeSetParams, 12000),
    E(cuGraphKernelNodeSetAttribute, 11000), E(cuGraphKernelNodeGetAttribute, 11000), E(cuGraphAddMemsetNode, 10000),
    E(cuGraphAddMemcpyNode, 10000), E(cuGraphAddEmptyNode, 10000), E(cuGraphAddChildGraphNode, 10000),
    E(cuGraphAddEventRecordNode, 11010), E(cuGraphAddEventWaitNode, 11010), E(cuGraphAddMemAllocNode, 11040),
    E(cuGraphAddMemFreeNode, 11040), E(cuGraphConditionalHandleCreate, 12030), E(cuGraphAddNode, 12030),
    {"cuGraphAddNode", 13041, (void *)f_cuGraphAddNode} /* _v3: the same C signature */, E(cuGraphGetNodes, 10000),
    E(cuGraphNodeGetType, 10000), E(cuGraphNodeGetDependencies, 12030), E(cuGraphDestroyNode, 10000),
    E(cuGraphDebugDotPrint, 11030), {"cuGraphInstantiateWithFlags", 11040, (void *)f_cuGraphInstantiate},
    E(cuGraphInstantiateWithParams, 12000), E(cuGraphExecDestroy, 10000), E(cuGraphExecKernelNodeSetParams, 12000),
    E(cuGraphExecMemsetNodeSetParams, 10020), E(cuGraphNodeSetEnabled, 11060), E(cuGraphExecUpdate, 12000),
    E(cuGraphLaunch, 10000), E(cuGraphUpload, 11010),
    {NULL, 0, NULL},
};
// clang-format on
