/*
 * Internals shared by the probe's four files:
 *   probe_file.c    environment, the mmap'd record, communicator slots (init/finalize);
 *   probe_lanes.c   which lane of a slot each writer thread uses (first use, thread exit);
 *   probe_events.c  the event path (start/stop/record), version independent;
 *   probe_abi.c     the exported ncclProfiler_v3/v4/v5/v6 tables and descriptor adapters.
 *
 * Handles. Every context and event handle we give NCCL is an encoded integer, never a
 * pointer: tag (8 bits, per process) | kind (4) | slot (6) | payload (46). Decoding checks
 * the tag, the kind and every index, so a stale handle (recordEventState after stopEvent,
 * events after finalize), a NULL parent or a foreign PXN pointer can at worst be ignored;
 * nothing a handle says is ever dereferenced.
 */
#ifndef SATTR_PROBE_INTERNAL_H
#define SATTR_PROBE_INTERNAL_H

#include <stdint.h>
#include <time.h>

#include "sattr_nccl_abi.h"
#include "sattr_probe_layout.h"

#define SATTR_HIDDEN __attribute__((visibility("hidden")))
#define SATTR_LIKELY(x) __builtin_expect(!!(x), 1)
#define SATTR_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Relaxed atomics on the shared mapping. SA_BUMP is the single-writer increment: a plain
 * load and store (no lock prefix) for fields that only one thread class writes; a second
 * writer could lose a count, never corrupt memory. SA_ADD is for fields several threads
 * write (ring heads, drop counters, the op index). */
#define SA_LD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define SA_ST(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define SA_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define SA_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)
#define SA_BUMP(p, v) SA_ST((p), SA_LD(p) + (v))

/* handle kinds */
enum {
    SATTR_K_COMM = 1,  /* init context */
    SATTR_K_API,       /* GroupApi / CollApi / P2pApi: payload = which */
    SATTR_K_COLL,      /* payload: func(4) | seq(42) */
    SATTR_K_P2P,       /* payload: func(4) | p2p index(42) */
    SATTR_K_PROXYOP,   /* payload: peer rank + 1 (24) | lane(5) | peer entry(4) | isSend(1) | channel(6) */
    SATTR_K_STEP,      /* payload: lane(5) | step record(10) | generation(16) */
    SATTR_K_KCH,       /* payload: channel(6) | func(4) | seq(36) */
};
enum { SATTR_API_GROUP = 1, SATTR_API_COLL, SATTR_API_P2P };

#define SATTR_H_PAYLOAD_BITS 46
#define SATTR_H_PAYLOAD_MASK ((UINT64_C(1) << SATTR_H_PAYLOAD_BITS) - 1)
#define SATTR_NO_PEER 15u

/* Step records live in plugin memory (not the file): the previous state of each step is
 * needed to move the wait-state gauges. Word: gen(16) | state(4) | peer(4) | send(1) | ch(6).
 * state 0 = free, 1 = posted, 2 + SATTR_W_* = in that wait state. One pool per lane (the
 * thread that starts a step owns its record), each on its own cache lines. */
#define SATTR_STEP_POOL 1024u
#define SATTR_STEP_PROBES 8u

struct sattr_steps {
    uint32_t cursor;
    uint32_t pad[15];
    uint32_t rec[SATTR_STEP_POOL];
} __attribute__((aligned(64)));

/* Lanes (sattr_probe_layout.h): id 0 = the slot's own copy, 1..NLANES = pool lane id-1.
 * A thread finds its lane for a slot in a thread-local table, valid while `epoch` matches
 * the process's record (a fork or a reload of the plugin opens another one). */
#define SATTR_LANE_OWNED 0x80u
struct sattr_tls {
    uint64_t epoch;
    uint32_t token;        /* this thread's writer token, never 0 */
    uint8_t lane[SATTR_PROBE_NSLOTS]; /* 0 = not looked up; else (lane id + 1) | OWNED */
};

struct sattr_proc {
    struct sattr_hdr *hdr;     /* NULL while the probe is off */
    struct sattr_slot *slots;  /* hdr + SATTR_PROBE_HDR_SIZE */
    uint64_t tag;              /* handle tag, already shifted to bits 56..63 */
    uint64_t mono0;            /* hdr->create_mono_ns, for the ms stamps of peers */
    int pid;
    int mask;                  /* activation mask we ask for */
    uint32_t win_ns;
    uint64_t epoch;            /* which record the threads' lane tables refer to */
    struct sattr_lane *lanes;  /* the pool after the slots */
};

SATTR_HIDDEN extern struct sattr_proc sattr_proc;
SATTR_HIDDEN extern struct sattr_steps sattr_steps[SATTR_PROBE_NSLOTS];
SATTR_HIDDEN extern struct sattr_steps sattr_lane_steps[SATTR_PROBE_NLANES];
SATTR_HIDDEN extern __thread struct sattr_tls sattr_tls;

/* probe_lanes.c: the calling thread's lane in slot `idx` (slow path: first use) */
SATTR_HIDDEN unsigned sattr_lane_claim(unsigned idx);
SATTR_HIDDEN void sattr_lanes_setup(void);       /* under the init lock */
SATTR_HIDDEN void sattr_lanes_reopened(void);    /* a reload: no thread of the old load writes */

static inline unsigned sattr_my_lane(unsigned idx)
{
    struct sattr_tls *t = &sattr_tls;
    if (SATTR_LIKELY(t->epoch == SA_LD(&sattr_proc.epoch))) {
        unsigned v = t->lane[idx];
        if (SATTR_LIKELY(v != 0))
            return (v & 0x1fu) - 1u;
    }
    return sattr_lane_claim(idx);
}

static inline struct sattr_lane_core *sattr_lane_core(struct sattr_slot *s, unsigned lane)
{
    return lane == 0 ? &s->net : &sattr_proc.lanes[lane - 1].net;
}

static inline struct sattr_peer *sattr_lane_peers(struct sattr_slot *s, unsigned lane)
{
    return lane == 0 ? s->peers : sattr_proc.lanes[lane - 1].peers;
}

static inline struct sattr_steps *sattr_lane_pool(unsigned idx, unsigned lane)
{
    return lane == 0 ? &sattr_steps[idx] : &sattr_lane_steps[lane - 1];
}

static inline uint64_t sattr_now(void)
{
    /* COARSE: a vDSO read without the TSC (~10 ns here vs ~35); its 1-4 ms resolution is
     * plenty for hangs that last seconds. Read only on events that need a stamp. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void *sattr_handle(unsigned kind, unsigned slot, uint64_t payload)
{
    return (void *)(uintptr_t)(sattr_proc.tag | ((uint64_t)kind << 52) | ((uint64_t)slot << 46) |
                               (payload & SATTR_H_PAYLOAD_MASK));
}

/* The slot of a handle of the given kind, or NULL when it is not one of ours. */
static inline struct sattr_slot *sattr_decode(const void *h, unsigned kind, uint64_t *payload)
{
    uint64_t v = (uint64_t)(uintptr_t)h;
    if (SATTR_UNLIKELY(v == 0 || (v & (UINT64_C(0xff) << 56)) != sattr_proc.tag))
        return NULL;
    if (SATTR_UNLIKELY(((v >> 52) & 0xf) != kind))
        return NULL;
    unsigned slot = (unsigned)((v >> 46) & 0x3f);
    if (SATTR_UNLIKELY(slot >= SATTR_PROBE_NSLOTS || sattr_proc.slots == NULL))
        return NULL;
    *payload = v & SATTR_H_PAYLOAD_MASK;
    return &sattr_proc.slots[slot];
}

static inline unsigned sattr_slot_index(const struct sattr_slot *s)
{
    return (unsigned)(s - sattr_proc.slots);
}

static inline unsigned sattr_handle_kind(const void *h)
{
    uint64_t v = (uint64_t)(uintptr_t)h;
    if (v == 0 || (v & (UINT64_C(0xff) << 56)) != sattr_proc.tag)
        return 0;
    return (unsigned)((v >> 52) & 0xf);
}

static inline void sattr_drop(void)
{
    if (sattr_proc.hdr)
        SA_ADD(&sattr_proc.hdr->dropped_total, 1);
}

/* probe_file.c: lifecycle (not on the event path; serialised by a mutex) */
SATTR_HIDDEN void *sattr_comm_init(int api_ver, uint64_t comm_hash, const char *comm_name,
                                   int nnodes, int nranks, int rank, sattr_nccl_logger_t logfn,
                                   int *mask_out);
SATTR_HIDDEN void sattr_comm_finalize(void *context);
/* v3 learns the communicator from its first Coll/P2p event */
SATTR_HIDDEN void sattr_comm_learn(struct sattr_slot *s, uint64_t comm_hash, int rank);

/* probe_events.c: the event path, one entry per event kind */
struct sattr_coll_info {
    uint64_t seq;
    size_t count;
    const char *func;
    const char *datatype;
    const char *algo;
    const char *proto;
    int root;
    uint8_t nch;
    uint8_t nwarps;
};
SATTR_HIDDEN void *sattr_ev_api_start(void *ctx, unsigned which, const char *func, size_t count,
                                      int graph_captured);
SATTR_HIDDEN void *sattr_ev_coll_start(void *ctx, const struct sattr_coll_info *ci);
SATTR_HIDDEN void *sattr_ev_p2p_start(void *ctx, const char *func, size_t count,
                                      const char *datatype, int peer);
SATTR_HIDDEN void *sattr_ev_proxyop_start(void *ctx, void *parent, int pid, unsigned ch, int peer,
                                          int is_send);
SATTR_HIDDEN void *sattr_ev_step_start(void *parent);
SATTR_HIDDEN void *sattr_ev_kch_start(void *parent, unsigned ch, uint64_t ptimer);
SATTR_HIDDEN void sattr_ev_stop(void *h);
SATTR_HIDDEN void sattr_ev_state(void *h, int state, uint64_t arg, int has_arg);
SATTR_HIDDEN unsigned sattr_func_code(const char *s);

#endif /* SATTR_PROBE_INTERNAL_H */
