/* stream.c: streams, stream capture and events of the fakecuda driver stand-in (README.md). Capture keeps the
 * driver's rules that rawgraphs relies on: fork and join through events, unjoined streams, invalidation by a
 * synchronising call, legacy-stream work or an allocation inside a global-mode capture, and captured events. */
#define _GNU_SOURCE
#include "fakecuda.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static unsigned long long next_capture_id = 1;
static int global_captures; /* captures in CU_STREAM_CAPTURE_MODE_GLOBAL now active */

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Calls that are unsafe during a global-mode capture (an allocation, a context-wide synchronise) are refused and
 * invalidate the global captures. */
static Capture *captures[64];
static int ncaptures;
CUresult refuse_in_global_capture(CUresult err) {
    if (global_captures == 0) return OK;
    for (int i = 0; i < ncaptures; i++)
        if (captures[i]->global) captures[i]->invalid = 1;
    return err;
}

static Stream *members[4096]; /* streams in a capture */
static int nmembers;
static int blocking_capture(int invalidate) {
    int any = 0;
    for (int i = 0; i < nmembers; i++)
        if (members[i] && members[i]->blocking) {
            any = 1;
            if (invalidate) members[i]->cap->invalid = 1;
        }
    return any;
}
CUresult legacy_work(void) { return blocking_capture(1) ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : OK; }

/* Stream-ordered work: on a capturing stream it becomes a node after the stream's current dependencies; on a
 * plain stream it runs now (this machine has no queue).  Returns the node, or NULL when it ran eagerly. */
CUresult stream_work(CUstream hs, CUgraphNodeType type, Node **out) {
    Stream *s = S(hs);
    *out = NULL;
    if (s && s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
    if (!s) return legacy_work();
    if (!s->cap) return OK;
    if (s->cap->invalid) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    Node *n = graph_add(s->cap->graph, type, (const CUgraphNode *)s->deps, s->ndeps);
    node_list_copy(&s->deps, &s->ndeps, &n, 1);
    s->joined = 0;
    *out = n;
    return OK;
}

/* ---- streams and capture ---- */
static CUresult f_cuStreamCreate(CUstream *s, unsigned flags) {
    Stream *st = zalloc(sizeof(Stream));
    st->blocking = !(flags & CU_STREAM_NON_BLOCKING);
    *s = (CUstream)st;
    return OK;
}
static CUresult f_cuStreamCreateWithPriority(CUstream *s, unsigned flags, int prio) {
    (void)prio;
    return f_cuStreamCreate(s, flags);
}
static void leave_capture(Stream *s) {
    s->cap = NULL;
    free(s->deps);
    s->deps = NULL;
    s->ndeps = 0;
}
static void capture_members_leave(Capture *c) {
    for (int i = 0; i < nmembers; i++)
        if (members[i] && members[i]->cap == c) {
            leave_capture(members[i]);
            members[i] = 0;
        }
    for (int i = 0; i < ncaptures; i++)
        if (captures[i] == c) captures[i] = captures[--ncaptures];
    if (c->global) global_captures--;
    c->graph->capturing--;
}
static void join(Stream *s, Capture *c) {
    s->cap = c;
    s->joined = 1;
    for (int i = 0; i < nmembers; i++)
        if (!members[i]) {
            members[i] = s;
            return;
        }
    if (nmembers < 4096) members[nmembers++] = s;
}
static CUresult f_cuStreamDestroy(CUstream hs) {
    Stream *s = S(hs);
    CHECK(s && !s->destroyed, CUDA_ERROR_INVALID_HANDLE);
    Capture *c = s->cap;
    if (c && c->origin == s) { /* the capture ends with its origin: nothing is left to end it */
        capture_members_leave(c);
        if (c->owns_graph) graph_free(c->graph);
        c->ended = 1;
    } else if (c) {
        c->invalid = 1;
        for (int i = 0; i < nmembers; i++)
            if (members[i] == s) members[i] = 0;
        leave_capture(s);
    }
    s->destroyed = 1;
    return OK; /* kept allocated: a later use must answer INVALID_HANDLE, not crash */
}
static CUresult sync_stream(CUstream hs) {
    Stream *s = S(hs);
    if (s && s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
    if (s && s->cap) {
        s->cap->invalid = 1;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (!s) return legacy_work();
    return OK;
}
static CUresult f_cuStreamSynchronize(CUstream s) { return sync_stream(s); }
static CUresult f_cuStreamQuery(CUstream s) { return sync_stream(s); }
static CUresult begin(Stream *s, Graph *g, int owns, const CUgraphNode *deps, size_t ndeps, CUstreamCaptureMode mode) {
    CHECK(!s->cap, CUDA_ERROR_ILLEGAL_STATE);
    CHECK(ncaptures < 64, CUDA_ERROR_NOT_SUPPORTED);
    Capture *c = zalloc(sizeof(Capture));
    c->graph = g;
    c->owns_graph = owns;
    c->id = next_capture_id++;
    c->origin = s;
    c->global = mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    global_captures += c->global;
    captures[ncaptures++] = c;
    g->capturing++;
    join(s, c);
    node_list_copy(&s->deps, &s->ndeps, (Node *const *)deps, ndeps);
    return OK;
}
static CUresult f_cuStreamBeginCapture(CUstream hs, CUstreamCaptureMode mode) {
    Stream *s = S(hs);
    CHECK(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(!s->destroyed, CUDA_ERROR_INVALID_HANDLE);
    return begin(s, zalloc(sizeof(Graph)), 1, NULL, 0, mode);
}
static CUresult f_cuStreamBeginCaptureToGraph(CUstream hs, CUgraph g, const CUgraphNode *deps,
                                              const CUgraphEdgeData *edges, size_t ndeps, CUstreamCaptureMode mode) {
    (void)edges;
    Stream *s = S(hs);
    CHECK(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CUresult r = check_deps((Graph *)g, deps, ndeps);
    if (r) return r;
    return begin(s, (Graph *)g, 0, deps, ndeps, mode);
}
static CUresult f_cuStreamEndCapture(CUstream hs, CUgraph *out) {
    Stream *s = S(hs);
    CHECK(s && s->cap, CUDA_ERROR_ILLEGAL_STATE);
    Capture *c = s->cap;
    CHECK(c->origin == s, CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    CUresult r = OK;
    for (int i = 0; i < nmembers; i++)
        if (members[i] && members[i] != s && members[i]->cap == c && !members[i]->joined)
            r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    if (c->invalid && !r) r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    capture_members_leave(c);
    if (r) {
        if (c->owns_graph) graph_free(c->graph);
        *out = NULL;
    } else
        *out = (CUgraph)c->graph;
    c->ended = 1;
    return r; /* kept: events recorded in it still name it */
}
static CUresult f_cuStreamIsCapturing(CUstream hs, CUstreamCaptureStatus *st) {
    Stream *s = S(hs);
    if (!s) { /* the legacy stream: refused while a blocking stream captures, which stays valid (cuda.h) */
        *st = CU_STREAM_CAPTURE_STATUS_NONE;
        return blocking_capture(0) ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : OK;
    }
    CHECK(!s->destroyed, CUDA_ERROR_INVALID_HANDLE);
    *st = !s->cap           ? CU_STREAM_CAPTURE_STATUS_NONE
          : s->cap->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                            : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return OK;
}
static CUresult f_cuStreamGetCaptureInfo(CUstream hs, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                         const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps) {
    CUresult r = f_cuStreamIsCapturing(hs, st);
    if (r) return r;
    Stream *s = S(hs);
    if (id) *id = s && s->cap ? s->cap->id : 0;
    if (g) *g = s && s->cap ? (CUgraph)s->cap->graph : NULL;
    if (deps) *deps = s && s->cap ? (const CUgraphNode *)s->deps : NULL;
    if (edges) { /* default edges, one per dependency (cuda.bindings reads numDependencies of them) */
        free(s ? s->edges : NULL);
        if (s) s->edges = zalloc((s->ndeps + 1) * sizeof(CUgraphEdgeData));
        *edges = s ? s->edges : NULL;
    }
    if (ndeps) *ndeps = s && s->cap ? s->ndeps : 0;
    return OK;
}
static CUresult f_cuStreamUpdateCaptureDependencies(CUstream hs, CUgraphNode *deps, const CUgraphEdgeData *edges,
                                                    size_t n, unsigned flags) {
    (void)edges;
    Stream *s = S(hs);
    CHECK(s && s->cap, CUDA_ERROR_ILLEGAL_STATE);
    CUresult r = check_deps(s->cap->graph, deps, n);
    if (r) return r;
    if (flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES)
        node_list_copy(&s->deps, &s->ndeps, (Node *const *)deps, n);
    else {
        Node **all = zalloc((s->ndeps + n) * sizeof(Node *));
        memcpy(all, s->deps, s->ndeps * sizeof(Node *));
        memcpy(all + s->ndeps, deps, n * sizeof(Node *));
        free(s->deps);
        s->deps = all;
        s->ndeps += n;
    }
    return OK;
}

/* ---- events ---- */
static CUresult f_cuEventCreate(CUevent *e, unsigned flags) {
    Event *ev = zalloc(sizeof(Event));
    ev->timing = !(flags & CU_EVENT_DISABLE_TIMING);
    *e = (CUevent)ev;
    return OK;
}
static CUresult f_cuEventDestroy(CUevent e) {
    CHECK(e, CUDA_ERROR_INVALID_HANDLE);
    Event *ev = (Event *)e;
    free(ev->deps);
    free(ev);
    return OK;
}
static CUresult f_cuEventRecord(CUevent he, CUstream hs) {
    Event *e = (Event *)he;
    Stream *s = S(hs);
    CHECK(e, CUDA_ERROR_INVALID_HANDLE);
    if (s && s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
    if (s && s->cap) {
        if (s->cap->invalid) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        e->cap = s->cap;
        e->from = s;
        node_list_copy(&e->deps, &e->ndeps, s->deps, s->ndeps);
        return OK;
    }
    if (!s) {
        CUresult r = legacy_work();
        if (r) return r;
    }
    e->cap = NULL;
    e->t = now_ms();
    e->recorded = 1;
    return OK;
}
static CUresult f_cuEventRecordWithFlags(CUevent e, CUstream s, unsigned flags) {
    (void)flags;
    return f_cuEventRecord(e, s);
}
static CUresult f_cuStreamWaitEvent(CUstream hs, CUevent he, unsigned flags) {
    (void)flags;
    Event *e = (Event *)he;
    Stream *s = S(hs);
    CHECK(e, CUDA_ERROR_INVALID_HANDLE);
    if (s && s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
    if (!e->cap || e->cap->ended) {
        if (s && s->cap) return OK; /* an event from outside the capture: no edge */
        return s ? OK : legacy_work();
    }
    if (e->cap->invalid) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    CHECK(s, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    if (!s->cap) {
        join(s, e->cap);
        s->joined = 0;
        node_list_copy(&s->deps, &s->ndeps, e->deps, e->ndeps);
        return OK;
    }
    CHECK(s->cap == e->cap, CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    Node **all = zalloc((s->ndeps + e->ndeps) * sizeof(Node *));
    size_t k = s->ndeps;
    memcpy(all, s->deps, k * sizeof(Node *));
    for (size_t i = 0; i < e->ndeps; i++) {
        int seen = 0;
        for (size_t j = 0; j < k; j++) seen |= all[j] == e->deps[i];
        if (!seen) all[k++] = e->deps[i];
    }
    free(s->deps);
    s->deps = all;
    s->ndeps = k;
    /* the stream the event came from is joined if it did nothing after the record */
    Stream *from = e->from;
    if (from && from != s && from->cap == s->cap && from->ndeps == e->ndeps &&
        (from->ndeps == 0 || memcmp(from->deps, e->deps, from->ndeps * sizeof(Node *)) == 0))
        from->joined = 1;
    return OK;
}
static CUresult wait_host(CUevent he) {
    Event *e = (Event *)he;
    CHECK(e, CUDA_ERROR_INVALID_HANDLE);
    if (e->cap) {
        e->cap->invalid |= !e->cap->ended;
        return CUDA_ERROR_CAPTURED_EVENT;
    } /* last recorded in a capture */
    return OK;
}
static CUresult f_cuEventSynchronize(CUevent e) {
    CUresult r = wait_host(e);
    return r ? r : legacy_work();
}
static CUresult f_cuEventQuery(CUevent e) { return wait_host(e); }
static CUresult f_cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    Event *x = (Event *)a, *y = (Event *)b;
    CHECK(x && y, CUDA_ERROR_INVALID_HANDLE);
    CHECK(x->recorded && y->recorded && x->timing && y->timing, CUDA_ERROR_INVALID_HANDLE);
    *ms = (float)(y->t - x->t);
    return OK;
}

// clang-format off
const Entry stream_entries[] = {
    E(cuStreamCreate, 2000), E(cuStreamCreateWithPriority, 5050), E(cuStreamDestroy, 4000),
    E(cuStreamSynchronize, 2000), E(cuStreamQuery, 2000), E(cuStreamBeginCapture, 10010),
    E(cuStreamBeginCaptureToGraph, 12030), E(cuStreamEndCapture, 10000), E(cuStreamIsCapturing, 10000),
    E(cuStreamGetCaptureInfo, 12030), E(cuStreamUpdateCaptureDependencies, 12030), E(cuStreamWaitEvent, 3020),
    E(cuEventCreate, 2000), E(cuEventDestroy, 4000), E(cuEventRecord, 2000), E(cuEventRecordWithFlags, 11010),
    E(cuEventSynchronize, 2000), E(cuEventQuery, 2000), E(cuEventElapsedTime, 12080),
    {NULL, 0, NULL},
};
// clang-format on
