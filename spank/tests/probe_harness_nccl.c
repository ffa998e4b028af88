/*
 * The fake NCCL: loads the plugin as src/plugin/profiler.cc does and hands it descriptors
 * laid out exactly as each ABI version defines them (sattr_nccl_abi.h, pinned there).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "probe_harness.h"

static void logger(int level, unsigned long flags, const char *file, int line, const char *fmt, ...)
{
    (void)level, (void)flags, (void)file, (void)line, (void)fmt; /* NCCL_DEBUG unset */
}

int fake_load(struct fake_nccl *n, const char *path, int api)
{
    memset(n, 0, sizeof(*n));
    n->api = api;
    n->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (n->dl == NULL) {
        fprintf(stderr, "probe_harness: dlopen %s: %s\n", path, dlerror());
        return -1;
    }
    if (api == 6)
        n->v6 = dlsym(n->dl, "ncclProfiler_v6");
    else if (api == 5)
        n->v5 = dlsym(n->dl, "ncclProfiler_v5");
    else if (api == 4)
        n->v4 = dlsym(n->dl, "ncclProfiler_v4");
    else
        n->v3 = dlsym(n->dl, "ncclProfiler_v3");
    if (n->v6 == NULL && n->v5 == NULL && n->v4 == NULL && n->v3 == NULL) {
        fprintf(stderr, "probe_harness: %s has no ncclProfiler_v%d\n", path, api);
        dlclose(n->dl);
        n->dl = NULL;
        return -1;
    }
    return 0;
}

void fake_unload(struct fake_nccl *n)
{
    if (n->dl)
        dlclose(n->dl); /* NCCL does this when the last communicator is finalized */
    n->dl = NULL;
}

void *fake_init(struct fake_nccl *n, uint64_t hash, int nnodes, int nranks, int rank,
                const char *name, int *mask)
{
    void *ctx = NULL;
    int rc;
    if (n->v6)
        rc = n->v6->init(&ctx, hash, mask, name, nnodes, nranks, rank, logger);
    else if (n->v5)
        rc = n->v5->init(&ctx, hash, mask, name, nnodes, nranks, rank, logger);
    else if (n->v4)
        rc = n->v4->init(&ctx, mask, name, hash, nnodes, nranks, rank, logger);
    else
        rc = n->v3->init(&ctx, mask);
    if (rc != SATTR_NCCL_SUCCESS)
        fprintf(stderr, "probe_harness: init returned %d\n", rc);
    return ctx;
}

void fake_finalize(struct fake_nccl *n, void *ctx)
{
    if (n->v6)
        n->v6->finalize(ctx);
    else if (n->v5)
        n->v5->finalize(ctx);
    else if (n->v4)
        n->v4->finalize(ctx);
    else
        n->v3->finalize(ctx);
}

static void fill_v5(sattr_descr_v5 *dp, const struct hev *e)
{
    sattr_descr_v5 d;
    memset(&d, 0, sizeof(d));
    d.type = e->type;
    d.parentObj = e->parent;
    d.rank = e->rank;
    switch (e->type) {
    case SATTR_EV_GROUP_API: d.groupApi.groupDepth = e->depth; d.groupApi.graphCaptured = e->graph; break;
    case SATTR_EV_COLL_API:
        d.collApi.func = e->func; d.collApi.count = e->count; d.collApi.datatype = e->dtype;
        d.collApi.root = e->root; d.collApi.graphCaptured = e->graph; break;
    case SATTR_EV_P2P_API:
        d.p2pApi.func = e->func; d.p2pApi.count = e->count; d.p2pApi.datatype = e->dtype; break;
    case SATTR_EV_COLL:
        d.coll.seqNumber = e->seq; d.coll.func = e->func; d.coll.count = e->count;
        d.coll.root = e->root; d.coll.datatype = e->dtype; d.coll.nChannels = e->nch;
        d.coll.nWarps = 16; d.coll.algo = e->algo; d.coll.proto = e->proto; break;
    case SATTR_EV_P2P:
        d.p2p.func = e->func; d.p2p.datatype = e->dtype; d.p2p.count = e->count; d.p2p.peer = e->peer;
        d.p2p.nChannels = e->nch; break;
    case SATTR_EV_PROXY_OP:
        d.proxyOp.pid = e->pid; d.proxyOp.channelId = (uint8_t)e->ch; d.proxyOp.peer = e->peer;
        d.proxyOp.nSteps = e->nsteps; d.proxyOp.chunkSize = 1 << 19; d.proxyOp.isSend = e->is_send; break;
    case SATTR_EV_PROXY_STEP: d.proxyStep.step = e->step; break;
    case SATTR_EV_KERNEL_CH: d.kernelCh.channelId = (uint8_t)e->ch; d.kernelCh.pTimer = e->ptimer; break;
    default: break;
    }
    *dp = d;
}

static void *start_v5(struct fake_nccl *n, void *ctx, const struct hev *e)
{
    sattr_descr_v5 d;
    void *h = (void *)0x1; /* the plugin must always write the handle */
    fill_v5(&d, e);
    n->v5->startEvent(ctx, &h, &d);
    return h;
}

/* v6: NCCL fills one v6 descriptor; its v5 events are laid out as v5's (copied here the
 * way NCCL's own adapters copy between versions), the copy-engine ones in their members. */
static void *start_v6(struct fake_nccl *n, void *ctx, const struct hev *e)
{
    sattr_descr_v6 d;
    void *h = (void *)0x1;
    memset(&d, 0, sizeof(d));
    if (e->type < SATTR_EV_CE_COLL) {
        sattr_descr_v5 d5;
        fill_v5(&d5, e);
        memcpy(&d, &d5, sizeof(d5));
    } else {
        d.type = e->type;
        d.parentObj = e->parent;
        d.rank = e->rank;
        switch (e->type) {
        case SATTR_EV_CE_COLL:
            d.ceColl.seqNumber = e->seq; d.ceColl.func = e->func; d.ceColl.count = e->count;
            d.ceColl.root = e->root; d.ceColl.datatype = e->dtype; d.ceColl.syncStrategy = e->sync;
            d.ceColl.ceSeqNum = e->ce_seq; break;
        case SATTR_EV_CE_SYNC: d.ceCollSync.nRanks = e->peer; break;
        case SATTR_EV_CE_BATCH: d.ceCollBatch.numOps = 1; d.ceCollBatch.totalBytes = e->count; break;
        default: break;
        }
    }
    n->v6->startEvent(ctx, &h, &d);
    return h;
}

static void *start_v4(struct fake_nccl *n, void *ctx, const struct hev *e)
{
    sattr_descr_v4 d;
    void *h = (void *)0x1;
    if (e->type > 0xff)
        return NULL; /* API events do not exist before v5 */
    memset(&d, 0, sizeof(d));
    d.type = (uint8_t)e->type;
    d.parentObj = e->parent;
    d.rank = e->rank;
    switch (e->type) {
    case SATTR_EV_COLL:
        d.coll.seqNumber = e->seq; d.coll.func = e->func; d.coll.count = e->count;
        d.coll.root = e->root; d.coll.datatype = e->dtype; d.coll.nChannels = e->nch;
        d.coll.algo = e->algo; d.coll.proto = e->proto; break;
    case SATTR_EV_P2P:
        d.p2p.func = e->func; d.p2p.datatype = e->dtype; d.p2p.count = e->count; d.p2p.peer = e->peer; break;
    case SATTR_EV_PROXY_OP:
        d.proxyOp.pid = e->pid; d.proxyOp.channelId = (uint8_t)e->ch; d.proxyOp.peer = e->peer;
        d.proxyOp.nSteps = e->nsteps; d.proxyOp.isSend = e->is_send; break;
    case SATTR_EV_PROXY_STEP: d.proxyStep.step = e->step; break;
    case SATTR_EV_KERNEL_CH: d.kernelCh.channelId = (uint8_t)e->ch; d.kernelCh.pTimer = e->ptimer; break;
    default: break;
    }
    n->v4->startEvent(ctx, &h, &d);
    return h;
}

static void *start_v3(struct fake_nccl *n, void *ctx, const struct hev *e)
{
    sattr_descr_v3 d;
    void *h = (void *)0x1;
    if (e->type > 0xff)
        return NULL;
    memset(&d, 0, sizeof(d));
    d.type = (uint8_t)e->type;
    d.parentObj = e->parent;
    d.rank = e->rank;
    switch (e->type) {
    case SATTR_EV_COLL:
        d.coll.commHash = e->comm_hash; d.coll.seqNumber = e->seq; d.coll.func = e->func;
        d.coll.count = e->count; d.coll.root = e->root; d.coll.datatype = e->dtype;
        d.coll.nMaxChannels = e->nch; d.coll.algo = e->algo; d.coll.proto = e->proto; break;
    case SATTR_EV_P2P:
        d.p2p.commHash = e->comm_hash; d.p2p.func = e->func; d.p2p.datatype = e->dtype;
        d.p2p.count = e->count; d.p2p.peer = e->peer; break;
    case SATTR_EV_PROXY_OP:
        d.proxyOp.pid = e->pid; d.proxyOp.channelId = (uint8_t)e->ch; d.proxyOp.peer = e->peer;
        d.proxyOp.nSteps = e->nsteps; d.proxyOp.isSend = e->is_send; break;
    case SATTR_EV_PROXY_STEP: d.proxyStep.step = e->step; break;
    case SATTR_EV_KERNEL_CH: d.kernelCh.channelId = (uint8_t)e->ch; break;
    default: break;
    }
    n->v3->startEvent(ctx, &h, &d);
    return h;
}

void *fake_start(struct fake_nccl *n, void *ctx, const struct hev *e)
{
    if (n->v6)
        return start_v6(n, ctx, e);
    if (n->v5)
        return start_v5(n, ctx, e);
    if (n->v4)
        return start_v4(n, ctx, e);
    return start_v3(n, ctx, e);
}

void fake_stop(struct fake_nccl *n, void *h)
{
    if (n->v6)
        n->v6->stopEvent(h);
    else if (n->v5)
        n->v5->stopEvent(h);
    else if (n->v4)
        n->v4->stopEvent(h);
    else
        n->v3->stopEvent(h);
}

void fake_state(struct fake_nccl *n, void *h, int state, uint64_t arg, int with_arg)
{
    sattr_state_args_v4 a4;
    sattr_state_args_v3 a3;
    memset(&a4, 0, sizeof(a4));
    memset(&a3, 0, sizeof(a3));
    if (state == SATTR_ST_KERNEL_CH_STOP)
        a4.kernelCh.pTimer = arg;
    else
        a4.proxyStep.transSize = (size_t)arg;
    if (n->v6)
        n->v6->recordEventState(h, state, with_arg ? &a4 : NULL);
    else if (n->v5)
        n->v5->recordEventState(h, state, with_arg ? &a4 : NULL);
    else if (n->v4)
        n->v4->recordEventState(h, state, with_arg ? &a4 : NULL);
    else if (state != SATTR_ST_SEND_PEER_WAIT && state < SATTR_ST_PROXY_OP_IN_PROGRESS)
        n->v3->recordEventState(h, state, with_arg ? &a3 : NULL); /* v3 knows states 0..18 */
}

/* v5+: the application's call, an implicit group around one collective (GroupApi, CollApi);
 * returns the GroupApi handle, the CollApi one in *capi. */
static void *api_call(struct fake_nccl *n, void *ctx, int rank, const char *func, size_t count,
                      const char *dtype, void **capi)
{
    struct hev e;
    void *gapi;
    memset(&e, 0, sizeof(e));
    e.rank = rank;
    e.type = SATTR_EV_GROUP_API;
    e.depth = 1; /* implicit group */
    gapi = fake_start(n, ctx, &e);
    fake_state(n, gapi, SATTR_ST_BEGIN_GROUP_API_END, 0, 0);
    e.type = SATTR_EV_COLL_API;
    e.parent = gapi;
    e.func = func;
    e.count = count;
    e.dtype = dtype;
    *capi = fake_start(n, ctx, &e);
    fake_stop(n, *capi);
    fake_state(n, gapi, SATTR_ST_END_GROUP_API_START, 0, 0);
    return gapi;
}

void *fake_collective(struct fake_nccl *n, void *ctx, int rank, const char *func, uint64_t seq,
                      size_t count, uint8_t nch, uint64_t hash)
{
    struct hev e;
    void *gapi = NULL, *capi, *kl, *grp, *coll;
    memset(&e, 0, sizeof(e));
    e.rank = rank;
    if (n->v5 || n->v6) {
        /* v5 order (research/nccl-probe.md 5): GroupApi, CollApi, KernelLaunch, Group, Coll */
        gapi = api_call(n, ctx, rank, func, count, "ncclFloat32", &capi);
        e.type = SATTR_EV_KERNEL_LAUNCH;
        e.parent = gapi;
        kl = fake_start(n, ctx, &e);
        fake_stop(n, kl);
    }
    memset(&e, 0, sizeof(e));
    e.rank = rank;
    e.type = SATTR_EV_GROUP;
    grp = fake_start(n, ctx, &e);
    e.type = SATTR_EV_COLL;
    e.parent = n->v5 || n->v6 ? NULL : grp;
    e.func = func;
    e.seq = seq;
    e.count = count;
    e.dtype = "ncclFloat32";
    e.algo = "RING";
    e.proto = "SIMPLE";
    e.nch = nch;
    e.comm_hash = hash;
    coll = fake_start(n, ctx, &e);
    fake_stop(n, coll); /* "enqueued", not completed */
    fake_stop(n, grp);
    if (gapi)
        fake_stop(n, gapi);
    return coll;
}

void *fake_ce_collective(struct fake_nccl *n, void *ctx, int rank, const char *func, uint64_t seq,
                         size_t count, uint32_t ce_seq)
{
    struct hev e;
    void *capi, *ce, *sync;
    void *gapi = api_call(n, ctx, rank, func, count, "ncclBfloat16", &capi);
    memset(&e, 0, sizeof(e));
    e.rank = rank;
    e.type = SATTR_EV_CE_COLL;
    e.parent = capi;
    e.func = func;
    e.seq = seq;
    e.count = count;
    e.dtype = "ncclBfloat16";
    e.sync = "UC";
    e.ce_seq = ce_seq;
    ce = fake_start(n, ctx, &e);
    fake_state(n, ce, SATTR_ST_CE_COLL_START, 0, 0);
    /* a CeSync child, sent although the mask does not ask for it (a future NCCL might) */
    e.type = SATTR_EV_CE_SYNC;
    e.parent = ce;
    e.peer = 8;
    sync = fake_start(n, ctx, &e);
    fake_state(n, sync, SATTR_ST_CE_COLL_START + 2, 0, 0);
    fake_stop(n, sync);
    fake_state(n, ce, SATTR_ST_CE_COLL_START + 1, 0, 0);
    fake_stop(n, ce); /* enqueued on the stream; NCCL reports no completion */
    fake_stop(n, gapi);
    return ce;
}
