/*
 * The exported NCCL profiler tables (ncclProfiler_v6, _v5, _v4, _v3) and their adapters:
 * each reads its version's descriptor and calls the version-independent event path.
 *
 * NCCL dlsym()s the newest symbol it knows and falls back to older ones: NCCL 2.29-2.32
 * load v6, 2.28 v5, 2.27 v4, 2.26 (torch 2.7) v3. v6 is v5 plus collectives the copy
 * engines run (CeColl), which reach no v5 plugin: NCCL's v5 adapter drops them, so under
 * v5 such a collective would leave no trace of its launch. v7 is not exported: forks ship
 * incompatible "v7" layouts and NVIDIA has published no header (research/nccl-probe.md).
 *
 * Every callback returns ncclSuccess whatever happens: a profiler error makes NCCL 2.2x
 * drop the profiler for the whole process, and the probe must never disturb the job.
 */
#include <stddef.h>

#include "probe_internal.h"

#define SATTR_EXPORT __attribute__((visibility("default")))

static sattr_nccl_result_t stop_event(void *eHandle)
{
    sattr_ev_stop(eHandle);
    return SATTR_NCCL_SUCCESS;
}

static sattr_nccl_result_t finalize(void *context)
{
    sattr_comm_finalize(context);
    return SATTR_NCCL_SUCCESS;
}

static sattr_nccl_result_t record_v4(void *eHandle, int eState, sattr_state_args_v4 *a)
{
    uint64_t arg = 0;
    if (a != NULL)
        arg = eState == SATTR_ST_KERNEL_CH_STOP ? a->kernelCh.pTimer : (uint64_t)a->proxyStep.transSize;
    sattr_ev_state(eHandle, eState, arg, a != NULL);
    return SATTR_NCCL_SUCCESS;
}

/* Every version's init: our slot for the communicator, and the mask NCCL reads back. */
static sattr_nccl_result_t init_any(int api, void **context, int *eActivationMask, uint64_t comm_hash,
                                    const char *commName, int nNodes, int nranks, int rank,
                                    sattr_nccl_logger_t logfn)
{
    int mask = 0;
    void *ctx = sattr_comm_init(api, comm_hash, commName, nNodes, nranks, rank, logfn, &mask);
    if (context != NULL)
        *context = ctx;
    if (eActivationMask != NULL)
        *eActivationMask = mask;
    return SATTR_NCCL_SUCCESS;
}

/* ---- v5 ------------------------------------------------------------------------------ */
static sattr_nccl_result_t init_v5(void **context, uint64_t commId, int *eActivationMask,
                                   const char *commName, int nNodes, int nranks, int rank,
                                   sattr_nccl_logger_t logfn)
{
    return init_any(5, context, eActivationMask, commId, commName, nNodes, nranks, rank, logfn);
}

static inline void *start_v5_event(void *ctx, const sattr_descr_v5 *d)
{
    void *h = NULL;
    {
        switch (d->type) {
        case SATTR_EV_GROUP_API:
            h = sattr_ev_api_start(ctx, SATTR_API_GROUP, NULL, 0, d->groupApi.graphCaptured);
            break;
        case SATTR_EV_COLL_API:
            h = sattr_ev_api_start(ctx, SATTR_API_COLL, d->collApi.func, d->collApi.count,
                                   d->collApi.graphCaptured);
            break;
        case SATTR_EV_P2P_API:
            h = sattr_ev_api_start(ctx, SATTR_API_P2P, d->p2pApi.func, d->p2pApi.count,
                                   d->p2pApi.graphCaptured);
            break;
        case SATTR_EV_COLL: {
            struct sattr_coll_info ci = {d->coll.seqNumber, d->coll.count, d->coll.func,
                                         d->coll.datatype, d->coll.algo, d->coll.proto,
                                         d->coll.root, d->coll.nChannels, d->coll.nWarps};
            h = sattr_ev_coll_start(ctx, &ci);
            break;
        }
        case SATTR_EV_P2P:
            h = sattr_ev_p2p_start(ctx, d->p2p.func, d->p2p.count, d->p2p.datatype, d->p2p.peer);
            break;
        case SATTR_EV_PROXY_OP:
            h = sattr_ev_proxyop_start(ctx, d->parentObj, d->proxyOp.pid, d->proxyOp.channelId,
                                       d->proxyOp.peer, d->proxyOp.isSend);
            break;
        case SATTR_EV_PROXY_STEP:
            h = sattr_ev_step_start(d->parentObj);
            break;
        case SATTR_EV_KERNEL_CH:
            h = sattr_ev_kch_start(d->parentObj, d->kernelCh.channelId, d->kernelCh.pTimer);
            break;
        default:
            break; /* Group, KernelLaunch, ProxyCtrl, NetPlugin: not recorded */
        }
    }
    return h;
}

static sattr_nccl_result_t start_v5(void *ctx, void **eHandle, sattr_descr_v5 *d)
{
    if (eHandle != NULL)
        *eHandle = d != NULL ? start_v5_event(ctx, d) : NULL;
    return SATTR_NCCL_SUCCESS;
}

SATTR_EXPORT sattr_profiler_v5 ncclProfiler_v5 = {
    "sattr", init_v5, start_v5, stop_event, record_v4, finalize,
};

/* ---- v6: v5 plus the copy-engine collective --------------------------------------------- */
static sattr_nccl_result_t init_v6(void **context, uint64_t commId, int *eActivationMask,
                                   const char *commName, int nNodes, int nranks, int rank,
                                   sattr_nccl_logger_t logfn)
{
    return init_any(6, context, eActivationMask, commId, commName, nNodes, nranks, rank, logfn);
}

static sattr_nccl_result_t start_v6(void *ctx, void **eHandle, sattr_descr_v6 *d)
{
    void *h = NULL;
    if (eHandle == NULL)
        return SATTR_NCCL_SUCCESS;
    if (d != NULL) {
        if (d->type == SATTR_EV_CE_COLL) {
            /* A launched collective like Coll (same per-function seqNumber, so the ranks'
             * counts stay comparable), marked CE: it has no kernel channels to watch. */
            struct sattr_coll_info ci = {d->ceColl.seqNumber, d->ceColl.count, d->ceColl.func,
                                         d->ceColl.datatype, "CE", NULL, d->ceColl.root, 0, 0};
            h = sattr_ev_coll_start(ctx, &ci);
        } else if (d->type < SATTR_EV_CE_COLL) {
            /* every v5 member sits where v5 has it (pinned in sattr_nccl_abi.h) */
            h = start_v5_event(ctx, (const sattr_descr_v5 *)d);
        } /* CeSync, CeBatch and types we do not know: not recorded */
    }
    *eHandle = h;
    return SATTR_NCCL_SUCCESS;
}

SATTR_EXPORT sattr_profiler_v6 ncclProfiler_v6 = {
    "sattr", init_v6, start_v6, stop_event, record_v4, finalize,
};

/* ---- v4 ------------------------------------------------------------------------------ */
static sattr_nccl_result_t init_v4(void **context, int *eActivationMask, const char *commName,
                                   uint64_t commHash, int nNodes, int nranks, int rank,
                                   sattr_nccl_logger_t logfn)
{
    return init_any(4, context, eActivationMask, commHash, commName, nNodes, nranks, rank, logfn);
}

static sattr_nccl_result_t start_v4(void *ctx, void **eHandle, sattr_descr_v4 *d)
{
    void *h = NULL;
    if (eHandle == NULL)
        return SATTR_NCCL_SUCCESS;
    if (d != NULL) {
        switch (d->type) {
        case SATTR_EV_COLL: {
            struct sattr_coll_info ci = {d->coll.seqNumber, d->coll.count, d->coll.func,
                                         d->coll.datatype, d->coll.algo, d->coll.proto,
                                         d->coll.root, d->coll.nChannels, d->coll.nWarps};
            h = sattr_ev_coll_start(ctx, &ci);
            break;
        }
        case SATTR_EV_P2P:
            h = sattr_ev_p2p_start(ctx, d->p2p.func, d->p2p.count, d->p2p.datatype, d->p2p.peer);
            break;
        case SATTR_EV_PROXY_OP:
            h = sattr_ev_proxyop_start(ctx, d->parentObj, d->proxyOp.pid, d->proxyOp.channelId,
                                       d->proxyOp.peer, d->proxyOp.isSend);
            break;
        case SATTR_EV_PROXY_STEP:
            h = sattr_ev_step_start(d->parentObj);
            break;
        case SATTR_EV_KERNEL_CH:
            h = sattr_ev_kch_start(d->parentObj, d->kernelCh.channelId, d->kernelCh.pTimer);
            break;
        default:
            break;
        }
    }
    *eHandle = h;
    return SATTR_NCCL_SUCCESS;
}

SATTR_EXPORT sattr_profiler_v4 ncclProfiler_v4 = {
    "sattr", init_v4, start_v4, stop_event, record_v4, finalize,
};

/* ---- v3: no communicator identity at init; it comes with each Coll/P2p ---------------- */
static sattr_nccl_result_t init_v3(void **context, int *eActivationMask)
{
    return init_any(3, context, eActivationMask, 0, NULL, 0, 0, -1, NULL);
}

static void learn_v3(void *ctx, uint64_t comm_hash, int rank)
{
    uint64_t p;
    struct sattr_slot *s = sattr_decode(ctx, SATTR_K_COMM, &p);
    if (s != NULL)
        sattr_comm_learn(s, comm_hash, rank);
}

static sattr_nccl_result_t start_v3(void *ctx, void **eHandle, sattr_descr_v3 *d)
{
    void *h = NULL;
    if (eHandle == NULL)
        return SATTR_NCCL_SUCCESS;
    if (d != NULL) {
        switch (d->type) {
        case SATTR_EV_COLL: {
            struct sattr_coll_info ci = {d->coll.seqNumber, d->coll.count, d->coll.func,
                                         d->coll.datatype, d->coll.algo, d->coll.proto,
                                         d->coll.root, d->coll.nMaxChannels, d->coll.nWarps};
            learn_v3(ctx, d->coll.commHash, d->rank);
            h = sattr_ev_coll_start(ctx, &ci);
            break;
        }
        case SATTR_EV_P2P:
            learn_v3(ctx, d->p2p.commHash, d->rank);
            h = sattr_ev_p2p_start(ctx, d->p2p.func, d->p2p.count, d->p2p.datatype, d->p2p.peer);
            break;
        case SATTR_EV_PROXY_OP:
            h = sattr_ev_proxyop_start(ctx, d->parentObj, d->proxyOp.pid, d->proxyOp.channelId,
                                       d->proxyOp.peer, d->proxyOp.isSend);
            break;
        case SATTR_EV_PROXY_STEP:
            h = sattr_ev_step_start(d->parentObj);
            break;
        case SATTR_EV_KERNEL_CH:
            h = sattr_ev_kch_start(d->parentObj, d->kernelCh.channelId, 0);
            break;
        default:
            break;
        }
    }
    *eHandle = h;
    return SATTR_NCCL_SUCCESS;
}

static sattr_nccl_result_t record_v3(void *eHandle, int eState, sattr_state_args_v3 *a)
{
    (void)a; /* v3 carries transfer sizes on ProxyOp states only */
    sattr_ev_state(eHandle, eState, 0, 0);
    return SATTR_NCCL_SUCCESS;
}

SATTR_EXPORT sattr_profiler_v3 ncclProfiler_v3 = {
    "sattr", init_v3, start_v3, stop_event, record_v3, finalize,
};
