/*
 * The NCCL profiler plugin ABI, versions 3, 4, 5 and 6, declared here because NCCL ships
 * no plugin headers (neither the PyPI wheel nor Debian carry them).
 *
 * Transcribed from NVIDIA/nccl ext-profiler/example/nccl/profiler_v{3,4,5,6}.h and pinned
 * below by _Static_assert on every size and offset the probe reads: a silent layout
 * drift here would make the probe read garbage out of NCCL's descriptors.
 * Names carry our sattr_ prefix so this header never clashes with NCCL's own.
 * See shared/research/nccl-probe.md section 2 for the version history.
 */
#ifndef SATTR_NCCL_ABI_H
#define SATTR_NCCL_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ncclResult_t is a C enum: int-sized on every ABI NCCL supports. */
typedef int sattr_nccl_result_t;
#define SATTR_NCCL_SUCCESS 0

/* ncclDebugLogger_t; levels NCCL_LOG_WARN=2, NCCL_LOG_INFO=3; subsystem NCCL_INIT=1. */
typedef void (*sattr_nccl_logger_t)(int level, unsigned long flags, const char *file, int line,
                                    const char *fmt, ...);
#define SATTR_NCCL_LOG_WARN 2
#define SATTR_NCCL_LOG_INFO 3
#define SATTR_NCCL_SUBSYS_INIT 1UL

/* Event type bits: the descriptor's type and the activation mask (ncclProfile*). */
enum {
    SATTR_EV_GROUP = 1 << 0,
    SATTR_EV_COLL = 1 << 1,
    SATTR_EV_P2P = 1 << 2,
    SATTR_EV_PROXY_OP = 1 << 3,
    SATTR_EV_PROXY_STEP = 1 << 4,
    SATTR_EV_PROXY_CTRL = 1 << 5,
    SATTR_EV_KERNEL_CH = 1 << 6,   /* v3+ */
    SATTR_EV_NET_PLUGIN = 1 << 7,  /* v3+ */
    SATTR_EV_GROUP_API = 1 << 8,   /* v5+ */
    SATTR_EV_COLL_API = 1 << 9,    /* v5+ */
    SATTR_EV_P2P_API = 1 << 10,    /* v5+ */
    SATTR_EV_KERNEL_LAUNCH = 1 << 11, /* v5+ */
    SATTR_EV_CE_COLL = 1 << 12,    /* v6+: a collective run by the copy engines */
    SATTR_EV_CE_SYNC = 1 << 13,    /* v6+ */
    SATTR_EV_CE_BATCH = 1 << 14,   /* v6+ */
};

/* ncclProfilerEventState_t: one enum for all versions. */
enum {
    SATTR_ST_PROXY_OP_IN_PROGRESS = 19, /* v4+; 0..7 are the deprecated v1-v3 ProxyOp states */
    SATTR_ST_SEND_GPU_WAIT = 8,
    SATTR_ST_SEND_PEER_WAIT = 20, /* v4+ */
    SATTR_ST_SEND_WAIT = 9,
    SATTR_ST_RECV_WAIT = 10,
    SATTR_ST_RECV_FLUSH_WAIT = 11,
    SATTR_ST_RECV_GPU_WAIT = 12,
    SATTR_ST_NET_PLUGIN_UPDATE = 21,
    SATTR_ST_KERNEL_CH_STOP = 22,
    SATTR_ST_END_GROUP_API_START = 23,
    SATTR_ST_BEGIN_GROUP_API_END = 24,
    SATTR_ST_CE_COLL_START = 25, /* v6+: 25..30 are the copy-engine states */
    SATTR_ST_CE_BATCH_COMPLETE = 30,
};

/* ---- v5 (NCCL 2.28+) and v6 (2.29+): v6 is v5's descriptor with three copy-engine members
 * added to the union, within the same 112 bytes ------------------------------------------ */
#define SATTR_DESCR_V5_MEMBERS                                                               \
    struct { bool graphCaptured; int groupDepth; } groupApi;                                 \
    struct {                                                                                 \
        const char *func; size_t count; const char *datatype; int root; void *stream;        \
        bool graphCaptured;                                                                  \
    } collApi;                                                                               \
    struct {                                                                                 \
        const char *func; size_t count; const char *datatype; void *stream; bool graphCaptured; \
    } p2pApi;                                                                                \
    struct { void *stream; } kernelLaunch;                                                   \
    struct {                                                                                 \
        uint64_t seqNumber; const char *func; const void *sendBuff; void *recvBuff;          \
        size_t count; int root; const char *datatype; uint8_t nChannels; uint8_t nWarps;     \
        const char *algo; const char *proto; void *parentGroup;                              \
    } coll;                                                                                  \
    struct {                                                                                 \
        const char *func; void *buff; const char *datatype; size_t count; int peer;          \
        uint8_t nChannels; void *parentGroup;                                                \
    } p2p;                                                                                   \
    struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp; \
    struct { int step; } proxyStep;                                                          \
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;                                 \
    struct { int64_t id; void *data; } netPlugin;

typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        SATTR_DESCR_V5_MEMBERS
    };
} sattr_descr_v5;

typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        SATTR_DESCR_V5_MEMBERS
        /* A copy-engine collective: started and stopped on the launching thread around
         * the copies' enqueue (stop = enqueued, as for Coll); NCCL reports no completion. */
        struct {
            uint64_t seqNumber; const char *func; const void *sendBuff; void *recvBuff;
            size_t count; int root; const char *datatype; const char *syncStrategy;
            bool intraBatchSync; uint32_t batchSize; uint32_t numBatches; uint32_t ceSeqNum;
            void *stream;
        } ceColl;
        struct { bool isComplete; int nRanks; } ceCollSync;
        struct { int numOps; size_t totalBytes; bool useIntraSync; } ceCollBatch;
    };
} sattr_descr_v6;

/* State arguments, v4, v5 and v6 (8 bytes). */
typedef union {
    struct { size_t transSize; } proxyStep;
    struct { int appendedProxyOps; } proxyCtrl;
    struct { void *data; } netPlugin;
    struct { uint64_t pTimer; } kernelCh;
} sattr_state_args_v4;

/* The v5 and v6 function tables: the same members, each with its own descriptor type. */
#define SATTR_PROFILER_V5_TABLE(descr_t)                                                      \
    struct {                                                                                 \
        const char *name;                                                                    \
        sattr_nccl_result_t (*init)(void **context, uint64_t commId, int *eActivationMask,   \
                                    const char *commName, int nNodes, int nranks, int rank,  \
                                    sattr_nccl_logger_t logfn);                              \
        sattr_nccl_result_t (*startEvent)(void *context, void **eHandle, descr_t *eDescr);  \
        sattr_nccl_result_t (*stopEvent)(void *eHandle);                                     \
        sattr_nccl_result_t (*recordEventState)(void *eHandle, int eState,                   \
                                                sattr_state_args_v4 *eStateArgs);            \
        sattr_nccl_result_t (*finalize)(void *context);                                      \
    }

typedef SATTR_PROFILER_V5_TABLE(sattr_descr_v5) sattr_profiler_v5;
typedef SATTR_PROFILER_V5_TABLE(sattr_descr_v6) sattr_profiler_v6;

/* ---- v4 (NCCL 2.27) ----------------------------------------------------------------- */
typedef struct {
    uint8_t type;
    void *parentObj;
    int rank;
    union {
        struct {
            uint64_t seqNumber; const char *func; const void *sendBuff; void *recvBuff;
            size_t count; int root; const char *datatype; uint8_t nChannels; uint8_t nWarps;
            const char *algo; const char *proto;
        } coll;
        struct {
            const char *func; void *buff; const char *datatype; size_t count; int peer;
            uint8_t nChannels;
        } p2p;
        struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
        struct { int step; } proxyStep;
        struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
        struct { int64_t id; void *data; } netPlugin;
    };
} sattr_descr_v4;

typedef struct {
    const char *name;
    sattr_nccl_result_t (*init)(void **context, int *eActivationMask, const char *commName,
                                uint64_t commHash, int nNodes, int nranks, int rank,
                                sattr_nccl_logger_t logfn);
    sattr_nccl_result_t (*startEvent)(void *context, void **eHandle, sattr_descr_v4 *eDescr);
    sattr_nccl_result_t (*stopEvent)(void *eHandle);
    sattr_nccl_result_t (*recordEventState)(void *eHandle, int eState, sattr_state_args_v4 *eStateArgs);
    sattr_nccl_result_t (*finalize)(void *context);
} sattr_profiler_v4;

/* ---- v3 (NCCL 2.26: torch 2.7); comm identity arrives with each Coll/P2p event -------- */
typedef struct {
    uint8_t type;
    void *parentObj;
    int rank;
    union {
        struct {
            const char *name; uint64_t commHash; uint64_t seqNumber; const char *func;
            const void *sendBuff; void *recvBuff; size_t count; int root; const char *datatype;
            uint8_t nMaxChannels; uint8_t nWarps; const char *algo; const char *proto;
        } coll;
        struct {
            const char *name; uint64_t commHash; const char *func; void *buff;
            const char *datatype; size_t count; int peer;
        } p2p;
        struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
        struct { int step; } proxyStep;
        struct { uint8_t channelId; } kernelCh;
        struct { int64_t id; void *data; } netPlugin;
    };
} sattr_descr_v3;

typedef union {
    struct { size_t transSize; int steps; } proxyOp;
    struct { int appendedProxyOps; } proxyCtrl;
} sattr_state_args_v3;

typedef struct {
    const char *name;
    sattr_nccl_result_t (*init)(void **context, int *eActivationMask);
    sattr_nccl_result_t (*startEvent)(void *context, void **eHandle, sattr_descr_v3 *eDescr);
    sattr_nccl_result_t (*stopEvent)(void *eHandle);
    sattr_nccl_result_t (*recordEventState)(void *eHandle, int eState, sattr_state_args_v3 *eStateArgs);
    sattr_nccl_result_t (*finalize)(void *context);
} sattr_profiler_v3;

/* ---- pins (x86-64 / aarch64 LP64; gcc on NCCL's headers and gdb on its DWARF agree) -- */
#define SATTR_PIN(T, m, off) _Static_assert(offsetof(T, m) == (off), #T "." #m " moved")
_Static_assert(sizeof(void *) == 8 && sizeof(size_t) == 8 && sizeof(pid_t) == 4, "LP64 only");
_Static_assert(sizeof(int) == 4, "ncclResult_t and states are passed as int");

_Static_assert(sizeof(sattr_descr_v5) == 112, "v5 descriptor size");
SATTR_PIN(sattr_descr_v5, type, 0);
SATTR_PIN(sattr_descr_v5, parentObj, 8);
SATTR_PIN(sattr_descr_v5, rank, 16);
SATTR_PIN(sattr_descr_v5, groupApi.graphCaptured, 24);
SATTR_PIN(sattr_descr_v5, groupApi.groupDepth, 28);
SATTR_PIN(sattr_descr_v5, collApi.func, 24);
SATTR_PIN(sattr_descr_v5, collApi.count, 32);
SATTR_PIN(sattr_descr_v5, collApi.datatype, 40);
SATTR_PIN(sattr_descr_v5, collApi.root, 48);
SATTR_PIN(sattr_descr_v5, collApi.stream, 56);
SATTR_PIN(sattr_descr_v5, collApi.graphCaptured, 64);
SATTR_PIN(sattr_descr_v5, p2pApi.func, 24);
SATTR_PIN(sattr_descr_v5, p2pApi.count, 32);
SATTR_PIN(sattr_descr_v5, p2pApi.graphCaptured, 56);
SATTR_PIN(sattr_descr_v5, coll.seqNumber, 24);
SATTR_PIN(sattr_descr_v5, coll.func, 32);
SATTR_PIN(sattr_descr_v5, coll.count, 56);
SATTR_PIN(sattr_descr_v5, coll.root, 64);
SATTR_PIN(sattr_descr_v5, coll.datatype, 72);
SATTR_PIN(sattr_descr_v5, coll.nChannels, 80);
SATTR_PIN(sattr_descr_v5, coll.nWarps, 81);
SATTR_PIN(sattr_descr_v5, coll.algo, 88);
SATTR_PIN(sattr_descr_v5, coll.proto, 96);
SATTR_PIN(sattr_descr_v5, coll.parentGroup, 104);
SATTR_PIN(sattr_descr_v5, p2p.func, 24);
SATTR_PIN(sattr_descr_v5, p2p.datatype, 40);
SATTR_PIN(sattr_descr_v5, p2p.count, 48);
SATTR_PIN(sattr_descr_v5, p2p.peer, 56);
SATTR_PIN(sattr_descr_v5, p2p.nChannels, 60);
SATTR_PIN(sattr_descr_v5, p2p.parentGroup, 64);
SATTR_PIN(sattr_descr_v5, proxyOp.pid, 24);
SATTR_PIN(sattr_descr_v5, proxyOp.channelId, 28);
SATTR_PIN(sattr_descr_v5, proxyOp.peer, 32);
SATTR_PIN(sattr_descr_v5, proxyOp.nSteps, 36);
SATTR_PIN(sattr_descr_v5, proxyOp.chunkSize, 40);
SATTR_PIN(sattr_descr_v5, proxyOp.isSend, 44);
SATTR_PIN(sattr_descr_v5, proxyStep.step, 24);
SATTR_PIN(sattr_descr_v5, kernelCh.channelId, 24);
SATTR_PIN(sattr_descr_v5, kernelCh.pTimer, 32);
_Static_assert(sizeof(sattr_state_args_v4) == 8, "v4/v5 state args size");
_Static_assert(sizeof(sattr_profiler_v5) == 48, "v5 function table size");
SATTR_PIN(sattr_profiler_v5, init, 8);
SATTR_PIN(sattr_profiler_v5, startEvent, 16);
SATTR_PIN(sattr_profiler_v5, stopEvent, 24);
SATTR_PIN(sattr_profiler_v5, recordEventState, 32);
SATTR_PIN(sattr_profiler_v5, finalize, 40);

/* v6: the v5 members where v5 has them (the probe reads a v6 descriptor's v5 events through
 * the v5 path), the copy-engine members where NCCL writes them. */
_Static_assert(sizeof(sattr_descr_v6) == 112, "v6 descriptor size");
#define SATTR_PIN56(m) _Static_assert(offsetof(sattr_descr_v6, m) == offsetof(sattr_descr_v5, m), \
                                      "v6." #m " is not where v5 has it")
SATTR_PIN56(type);
SATTR_PIN56(parentObj);
SATTR_PIN56(rank);
SATTR_PIN56(groupApi.graphCaptured);
SATTR_PIN56(collApi.func);
SATTR_PIN56(collApi.count);
SATTR_PIN56(collApi.graphCaptured);
SATTR_PIN56(p2pApi.graphCaptured);
SATTR_PIN56(coll.seqNumber);
SATTR_PIN56(coll.parentGroup);
SATTR_PIN56(p2p.peer);
SATTR_PIN56(proxyOp.pid);
SATTR_PIN56(proxyOp.isSend);
SATTR_PIN56(kernelCh.pTimer);
SATTR_PIN56(netPlugin.data);
SATTR_PIN(sattr_descr_v6, ceColl.seqNumber, 24);
SATTR_PIN(sattr_descr_v6, ceColl.func, 32);
SATTR_PIN(sattr_descr_v6, ceColl.sendBuff, 40);
SATTR_PIN(sattr_descr_v6, ceColl.recvBuff, 48);
SATTR_PIN(sattr_descr_v6, ceColl.count, 56);
SATTR_PIN(sattr_descr_v6, ceColl.root, 64);
SATTR_PIN(sattr_descr_v6, ceColl.datatype, 72);
SATTR_PIN(sattr_descr_v6, ceColl.syncStrategy, 80);
SATTR_PIN(sattr_descr_v6, ceColl.intraBatchSync, 88);
SATTR_PIN(sattr_descr_v6, ceColl.batchSize, 92);
SATTR_PIN(sattr_descr_v6, ceColl.numBatches, 96);
SATTR_PIN(sattr_descr_v6, ceColl.ceSeqNum, 100);
SATTR_PIN(sattr_descr_v6, ceColl.stream, 104);
SATTR_PIN(sattr_descr_v6, ceCollSync.isComplete, 24);
SATTR_PIN(sattr_descr_v6, ceCollSync.nRanks, 28);
SATTR_PIN(sattr_descr_v6, ceCollBatch.numOps, 24);
SATTR_PIN(sattr_descr_v6, ceCollBatch.totalBytes, 32);
SATTR_PIN(sattr_descr_v6, ceCollBatch.useIntraSync, 40);
_Static_assert(sizeof(sattr_profiler_v6) == 48, "v6 function table size");
SATTR_PIN(sattr_profiler_v6, startEvent, 16);
SATTR_PIN(sattr_profiler_v6, recordEventState, 32);

_Static_assert(sizeof(sattr_descr_v4) == 104, "v4 descriptor size");
SATTR_PIN(sattr_descr_v4, type, 0);
SATTR_PIN(sattr_descr_v4, parentObj, 8);
SATTR_PIN(sattr_descr_v4, rank, 16);
SATTR_PIN(sattr_descr_v4, coll.seqNumber, 24);
SATTR_PIN(sattr_descr_v4, coll.func, 32);
SATTR_PIN(sattr_descr_v4, coll.count, 56);
SATTR_PIN(sattr_descr_v4, coll.root, 64);
SATTR_PIN(sattr_descr_v4, coll.datatype, 72);
SATTR_PIN(sattr_descr_v4, coll.nChannels, 80);
SATTR_PIN(sattr_descr_v4, coll.algo, 88);
SATTR_PIN(sattr_descr_v4, coll.proto, 96);
SATTR_PIN(sattr_descr_v4, p2p.func, 24);
SATTR_PIN(sattr_descr_v4, p2p.count, 48);
SATTR_PIN(sattr_descr_v4, p2p.peer, 56);
SATTR_PIN(sattr_descr_v4, proxyOp.pid, 24);
SATTR_PIN(sattr_descr_v4, proxyOp.channelId, 28);
SATTR_PIN(sattr_descr_v4, proxyOp.peer, 32);
SATTR_PIN(sattr_descr_v4, proxyOp.isSend, 44);
SATTR_PIN(sattr_descr_v4, kernelCh.channelId, 24);
SATTR_PIN(sattr_descr_v4, kernelCh.pTimer, 32);
_Static_assert(sizeof(sattr_profiler_v4) == 48, "v4 function table size");

_Static_assert(sizeof(sattr_descr_v3) == 120, "v3 descriptor size");
SATTR_PIN(sattr_descr_v3, coll.name, 24);
SATTR_PIN(sattr_descr_v3, coll.commHash, 32);
SATTR_PIN(sattr_descr_v3, coll.seqNumber, 40);
SATTR_PIN(sattr_descr_v3, coll.func, 48);
SATTR_PIN(sattr_descr_v3, coll.count, 72);
SATTR_PIN(sattr_descr_v3, coll.root, 80);
SATTR_PIN(sattr_descr_v3, coll.datatype, 88);
SATTR_PIN(sattr_descr_v3, coll.nMaxChannels, 96);
SATTR_PIN(sattr_descr_v3, coll.algo, 104);
SATTR_PIN(sattr_descr_v3, coll.proto, 112);
SATTR_PIN(sattr_descr_v3, p2p.commHash, 32);
SATTR_PIN(sattr_descr_v3, p2p.func, 40);
SATTR_PIN(sattr_descr_v3, p2p.count, 64);
SATTR_PIN(sattr_descr_v3, p2p.peer, 72);
SATTR_PIN(sattr_descr_v3, proxyOp.pid, 24);
SATTR_PIN(sattr_descr_v3, proxyOp.isSend, 44);
SATTR_PIN(sattr_descr_v3, kernelCh.channelId, 24);
_Static_assert(sizeof(sattr_state_args_v3) == 16, "v3 state args size");
_Static_assert(sizeof(sattr_profiler_v3) == 48, "v3 function table size");

#endif /* SATTR_NCCL_ABI_H */
