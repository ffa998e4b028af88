/*
 * The event path: what each NCCL profiler event changes in the record.
 *
 * Budget: about 10-20 ns per callback, on NCCL's proxy thread (the critical path of every
 * network transfer) and on the application thread. Hence: no allocation, no locks, no
 * syscalls; relaxed atomics, most of them plain load+store because each group of fields
 * has one writer thread (probe_internal.h, SA_BUMP): the proxy-side group through the
 * calling thread's lane (probe_lanes.c), so even several threads on one communicator
 * write no common cache line per event; the clock is read only on events
 * that need a stamp (step and kernel completion, collective launch, group API exit).
 * Nothing here may fail NCCL: every decode failure just drops the event.
 */
#include <string.h>
#include <strings.h>

#include "probe_internal.h"

/* ---- string codes --------------------------------------------------------------------
 * NCCL passes pointers to its static strings; a small per-table cache maps a pointer to
 * its code with a few loads. Each entry packs pointer | code << 56 in one word so a reader
 * never sees a pointer without its code. A miss (first use, or a caller passing varying
 * pointers once the cache is full) falls back to string compares. */
#define CODE_CACHE 16

struct code_table {
    const char *const *names;
    unsigned n;
    unsigned unknown;
    uint64_t cache[CODE_CACHE];
};

static const char *const func_names[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                         "AllReduce", "SendRecv", "Send", "Recv", "AlltoAll",
                                         "Gather", "Scatter"};
static const char *const dtype_names[] = {"", "ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32",
                                          "ncclInt64", "ncclUint64", "ncclFloat16", "ncclFloat32",
                                          "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
                                          "ncclFloat8e5m2"};
static const char *const algo_names[] = {"", "TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN",
                                         "NVLS", "NVLS_TREE", "PAT", "CE"};
static const char *const proto_names[] = {"", "LL", "LL128", "SIMPLE"};

static struct code_table func_tab = {func_names, 11, SATTR_F_OTHER, {0}};
static struct code_table dtype_tab = {dtype_names, 13, SATTR_DT_UNKNOWN, {0}};
static struct code_table algo_tab = {algo_names, 9, SATTR_AL_UNKNOWN, {0}};
static struct code_table proto_tab = {proto_names, 4, SATTR_PR_UNKNOWN, {0}};

static unsigned code_slow(const struct code_table *t, const char *s)
{
    /* case-insensitive: older NCCLs spell "Ring"/"Simple" where newer say "RING"/"SIMPLE" */
    for (unsigned i = 0; i < t->n; i++)
        if (t->names[i][0] != '\0' && strcasecmp(t->names[i], s) == 0)
            return i;
    return t->unknown;
}

static unsigned code_of(struct code_table *t, const char *s)
{
    uint64_t key = (uint64_t)(uintptr_t)s;
    unsigned code;
    if (SATTR_UNLIKELY(s == NULL || (key >> 56) != 0))
        return t->unknown;
    for (unsigned i = 0; i < CODE_CACHE; i++) {
        uint64_t e = SA_LD(&t->cache[i]);
        if ((e & ((UINT64_C(1) << 56) - 1)) == key)
            return (unsigned)(e >> 56);
        if (e == 0) {
            code = code_slow(t, s);
            uint64_t want = key | ((uint64_t)code << 56), expect = 0;
            __atomic_compare_exchange_n(&t->cache[i], &expect, want, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED);
            return code;
        }
    }
    return code_slow(t, s);
}

SATTR_HIDDEN unsigned sattr_func_code(const char *s)
{
    return code_of(&func_tab, s);
}

/* ---- helpers ------------------------------------------------------------------------- */
static inline struct sattr_slot *ctx_slot(void *ctx)
{
    uint64_t p;
    return sattr_decode(ctx, SATTR_K_COMM, &p);
}

static inline void heartbeat(uint64_t now)
{
    struct sattr_hdr *h = sattr_proc.hdr;
    if (now - SA_LD(&h->heartbeat_ns) >= 1000000u) /* at most one store per ms */
        SA_ST(&h->heartbeat_ns, now);
}

static inline uint32_t ms_since_start(uint64_t now)
{
    uint64_t d = now > sattr_proc.mono0 ? now - sattr_proc.mono0 : 0;
    return (uint32_t)(d / 1000000u) + 1u; /* 0 means "never" */
}

static inline int rooted(unsigned f)
{
    return f == SATTR_F_BROADCAST || f == SATTR_F_REDUCE || f == SATTR_F_GATHER ||
           f == SATTR_F_SCATTER;
}

/* The peer entry for a comm rank in one lane's table (that lane's thread is its only
 * writer), claimed on first sight; SATTR_NO_PEER when full. */
static unsigned peer_entry(struct sattr_peer *peers, struct sattr_lane_core *c, int peer)
{
    uint32_t key;
    if (peer < 0 || peer >= (1 << 24) - 1)
        return SATTR_NO_PEER;
    key = (uint32_t)peer + 1u;
    for (unsigned i = 0; i < SATTR_PROBE_NPEERS; i++) {
        uint32_t k = SA_LD(&peers[i].key);
        if (k == key)
            return i;
        if (k == 0) {
            uint32_t expect = 0; /* CAS still: a full pool makes threads share the own lane */
            if (__atomic_compare_exchange_n(&peers[i].key, &expect, key, 0, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED) ||
                expect == key)
                return i;
        }
    }
    SA_ADD(&c->peers_dropped, 1);
    if ((SA_LD(&sattr_proc.hdr->flags) & SATTR_HF_PEERS_FULL) == 0)
        __atomic_fetch_or(&sattr_proc.hdr->flags, SATTR_HF_PEERS_FULL, __ATOMIC_RELAXED);
    return SATTR_NO_PEER;
}

static inline void peer_kind(struct sattr_peer *p, uint8_t bit)
{
    if ((SA_LD(&p->kind) & bit) == 0) /* once per peer and kind: the lock is rare */
        __atomic_fetch_or(&p->kind, bit, __ATOMIC_RELAXED);
}

static void hring_push(unsigned slot, uint64_t comm_hash, unsigned kind, unsigned f, unsigned dt,
                       unsigned al, unsigned pr, int root_or_peer, unsigned nch, uint64_t seq,
                       uint64_t count, uint64_t now, uint64_t opi)
{
    struct sattr_hdr *h = sattr_proc.hdr;
    uint32_t pos = SA_ADD(&h->ring_head, 1);
    struct sattr_hring_ent *e = &h->ring[pos % SATTR_PROBE_HRING];
    SA_ST(&e->tag, 0u);
    SA_ST(&e->slot, (uint8_t)slot);
    SA_ST(&e->func, (uint8_t)f);
    SA_ST(&e->dtype, (uint8_t)dt);
    SA_ST(&e->kind, (uint8_t)kind);
    SA_ST(&e->root_or_peer, root_or_peer);
    SA_ST(&e->nch, (uint8_t)nch);
    SA_ST(&e->algo, (uint8_t)al);
    SA_ST(&e->proto, (uint8_t)pr);
    SA_ST(&e->comm_hash, comm_hash);
    SA_ST(&e->seq, seq);
    SA_ST(&e->count, count);
    SA_ST(&e->start_ns, now);
    SA_ST(&e->opi, opi);
    SA_REL(&e->tag, pos + 1u);
}

/* ---- application side ---------------------------------------------------------------- */
SATTR_HIDDEN void *sattr_ev_api_start(void *ctx, unsigned which, const char *func, size_t count,
                                      int graph_captured)
{
    struct sattr_slot *s = ctx_slot(ctx);
    unsigned f;
    if (SATTR_UNLIKELY(s == NULL))
        return NULL;
    if (which == SATTR_API_GROUP) {
        SA_BUMP(&s->group_api_enter, 1);
    } else {
        f = code_of(&func_tab, func);
        SA_BUMP(which == SATTR_API_COLL ? &s->coll_api_enter : &s->p2p_api_enter, 1);
        SA_BUMP(&s->api_func[f], 1);
        SA_ST(&s->api_last_func, f);
        SA_ST(&s->api_last_count, (uint64_t)count);
    }
    if (graph_captured)
        SA_BUMP(&s->graph_captured, 1);
    return sattr_handle(SATTR_K_API, sattr_slot_index(s), which);
}

static void api_stop(struct sattr_slot *s, uint64_t which)
{
    if (which == SATTR_API_GROUP) {
        uint64_t now = sattr_now();
        SA_BUMP(&s->group_api_exit, 1);
        SA_ST(&s->last_api_ns, now);
        heartbeat(now);
    } else {
        SA_BUMP(which == SATTR_API_COLL ? &s->coll_api_exit : &s->p2p_api_exit, 1);
    }
}

SATTR_HIDDEN void *sattr_ev_coll_start(void *ctx, const struct sattr_coll_info *ci)
{
    struct sattr_slot *s = ctx_slot(ctx);
    unsigned f, dt, al, pr, idx;
    uint64_t opi, now, d;
    struct sattr_op_ent *e;
    int root;
    if (SATTR_UNLIKELY(s == NULL))
        return NULL;
    idx = sattr_slot_index(s);
    f = code_of(&func_tab, ci->func);
    dt = code_of(&dtype_tab, ci->datatype);
    al = code_of(&algo_tab, ci->algo);
    pr = code_of(&proto_tab, ci->proto);
    if (SATTR_UNLIKELY(al == SATTR_AL_CE))
        SA_BUMP(&s->ce_tasks, 1);
    root = rooted(f) ? ci->root : -1; /* NCCL leaves root undefined for unrooted ops */
    opi = SA_ADD(&s->op_count, 1);     /* shared: a host callback may launch too */
    if (ci->seq + 1 > SA_LD(&s->func_seq[f]))
        SA_ST(&s->func_seq[f], ci->seq + 1);
    SA_BUMP(&s->coll_tasks, 1);
    now = sattr_now();
    SA_ST(&s->last_seq, ci->seq);
    SA_ST(&s->last_func, (uint8_t)f);
    SA_ST(&s->last_dtype, (uint8_t)dt);
    SA_ST(&s->last_algo, (uint8_t)al);
    SA_ST(&s->last_proto, (uint8_t)pr);
    SA_ST(&s->last_nch, ci->nch);
    SA_ST(&s->last_nwarps, ci->nwarps);
    SA_ST(&s->last_count, (uint64_t)ci->count);
    SA_ST(&s->last_root, root);
    SA_ST(&s->last_start_ns, now);
    SA_ST(&s->last_task_ns, now);
    /* FNV-style running digest: equal op counts with different digests = divergence
     * older than the op ring. */
    d = SA_LD(&s->op_digest);
    d = (d ^ (f | dt << 8 | (uint64_t)(uint32_t)root << 16)) * UINT64_C(0x100000001b3);
    d = (d ^ (uint64_t)ci->count) * UINT64_C(0x100000001b3);
    SA_ST(&s->op_digest, d);
    e = &s->ops[opi & (SATTR_PROBE_OPRING - 1)];
    SA_ST(&e->tag, 0u);
    SA_ST(&e->func, (uint8_t)f);
    SA_ST(&e->dtype, (uint8_t)dt);
    SA_ST(&e->algo, (uint8_t)al);
    SA_ST(&e->proto, (uint8_t)pr);
    SA_ST(&e->root, root);
    SA_ST(&e->nch, ci->nch);
    SA_ST(&e->nwarps, ci->nwarps);
    SA_ST(&e->count, (uint64_t)ci->count);
    SA_ST(&e->seq, ci->seq);
    SA_REL(&e->tag, (uint32_t)(opi + 1));
    hring_push(idx, SA_LD(&s->comm_hash), 1, f, dt, al, pr, root, ci->nch, ci->seq, ci->count,
               now, opi);
    heartbeat(now);
    return sattr_handle(SATTR_K_COLL, idx, (uint64_t)f << 42 | (ci->seq & ((UINT64_C(1) << 42) - 1)));
}

SATTR_HIDDEN void *sattr_ev_p2p_start(void *ctx, const char *func, size_t count,
                                      const char *datatype, int peer)
{
    struct sattr_slot *s = ctx_slot(ctx);
    unsigned f, pi, idx, lane;
    uint64_t n, now;
    struct sattr_peer *peers;
    if (SATTR_UNLIKELY(s == NULL))
        return NULL;
    idx = sattr_slot_index(s);
    f = code_of(&func_tab, func);
    n = SA_LD(&s->p2p_tasks);
    SA_ST(&s->p2p_tasks, n + 1);
    SA_ST(&s->last_peer, peer);
    lane = sattr_my_lane(idx);
    peers = sattr_lane_peers(s, lane);
    pi = peer_entry(peers, sattr_lane_core(s, lane), peer);
    if (pi != SATTR_NO_PEER) {
        SA_BUMP(&peers[pi].p2p_ops, 1);
        peer_kind(&peers[pi], f == SATTR_F_RECV ? 8 : 4);
    }
    now = sattr_now();
    SA_ST(&s->last_task_ns, now);
    hring_push(idx, SA_LD(&s->comm_hash), 2, f, code_of(&dtype_tab, datatype), 0, 0, peer, 0, n,
               count, now, SA_LD(&s->op_count));
    heartbeat(now);
    return sattr_handle(SATTR_K_P2P, idx, (uint64_t)f << 42 | (n & ((UINT64_C(1) << 42) - 1)));
}

/* ---- proxy side ---------------------------------------------------------------------- */
SATTR_HIDDEN void *sattr_ev_proxyop_start(void *ctx, void *parent, int pid, unsigned ch, int peer,
                                          int is_send)
{
    struct sattr_slot *s;
    struct sattr_lane_core *c;
    struct sattr_peer *peers;
    unsigned pi, idx, lane;
    (void)parent;
    /* PXN: another local process's rank, run by our proxy thread. Its context and parent
     * are that process's values: look at nothing else (NCCL #1586). */
    if (SATTR_UNLIKELY(pid != sattr_proc.pid)) {
        if (sattr_proc.hdr)
            SA_ADD(&sattr_proc.hdr->pxn_foreign, 1);
        return NULL;
    }
    s = ctx_slot(ctx);
    if (SATTR_UNLIKELY(s == NULL))
        return NULL;
    ch &= SATTR_PROBE_NCHAN - 1;
    idx = sattr_slot_index(s);
    lane = sattr_my_lane(idx);
    peers = sattr_lane_peers(s, lane);
    c = sattr_lane_core(s, lane);
    pi = peer_entry(peers, c, peer);
    if (pi != SATTR_NO_PEER)
        peer_kind(&peers[pi], is_send ? 1 : 2);
    SA_BUMP(&c->pop_started, 1);
    /* the peer's rank too: a step started by another thread finds it in its own lane */
    return sattr_handle(SATTR_K_PROXYOP, idx,
                        (uint64_t)ch | (uint64_t)(is_send ? 1 : 0) << 6 | (uint64_t)pi << 7 |
                            (uint64_t)lane << 11 |
                            (uint64_t)(pi != SATTR_NO_PEER ? (uint32_t)peer + 1u : 0u) << 16);
}

/* step record word: gen(16) | state(4) | peer(4) | unused(1) | send(1) | ch(6) */
#define REC_STATE(w) (((w) >> 12) & 0xfu)
#define REC_PEER(w) (((w) >> 8) & 0xfu)
#define REC_SEND(w) (((w) >> 6) & 1u)
#define REC_CH(w) ((w) & 0x3fu)
#define REC_GEN(w) ((w) >> 16)

SATTR_HIDDEN void *sattr_ev_step_start(void *parent)
{
    uint64_t p;
    struct sattr_slot *s = sattr_decode(parent, SATTR_K_PROXYOP, &p);
    struct sattr_steps *pool;
    struct sattr_lane_core *c;
    struct sattr_peer *peers;
    unsigned idx, pi, send, ch, lane;
    uint32_t cur;
    if (SATTR_UNLIKELY(s == NULL))
        return NULL; /* NULL parent: a PXN op we ignored, or NCCL's pool ran out */
    idx = sattr_slot_index(s);
    ch = (unsigned)(p & 0x3fu);
    send = (unsigned)(p >> 6) & 1u;
    pi = (unsigned)(p >> 7) & 0xfu;
    lane = sattr_my_lane(idx);
    c = sattr_lane_core(s, lane);
    peers = sattr_lane_peers(s, lane);
    if (SATTR_UNLIKELY(((p >> 11) & 0x1fu) != lane)) {
        /* the op was started by another thread: its peer entry is in that thread's lane */
        uint32_t peer1 = (uint32_t)(p >> 16) & 0xffffffu;
        pi = peer1 ? peer_entry(peers, c, (int)(peer1 - 1)) : SATTR_NO_PEER;
    }
    pool = sattr_lane_pool(idx, lane);
    cur = SA_LD(&pool->cursor);
    for (unsigned k = 0; k < SATTR_STEP_PROBES; k++) {
        uint32_t r = (cur + k) & (SATTR_STEP_POOL - 1);
        uint32_t w = SA_LD(&pool->rec[r]);
        if (REC_STATE(w) != 0)
            continue; /* a step still in flight (a stuck one keeps its record) */
        uint32_t nw = (w & 0xffff0000u) | 1u << 12 | pi << 8 | send << 6 | ch;
        if (!__atomic_compare_exchange_n(&pool->rec[r], &w, nw, 0, __ATOMIC_RELAXED,
                                         __ATOMIC_RELAXED))
            continue;
        SA_ST(&pool->cursor, r + 1);
        if (send) {
            SA_BUMP(&c->send_posted, 1);
            if (pi != SATTR_NO_PEER)
                SA_BUMP(&peers[pi].send_posted, 1);
        } else {
            SA_BUMP(&c->recv_posted, 1);
            if (pi != SATTR_NO_PEER)
                SA_BUMP(&peers[pi].recv_posted, 1);
        }
        return sattr_handle(SATTR_K_STEP, idx, (uint64_t)lane << 26 | (uint64_t)r << 16 | REC_GEN(w));
    }
    SA_ADD(&c->steps_dropped, 1);
    if ((SA_LD(&sattr_proc.hdr->flags) & SATTR_HF_STEPS_FULL) == 0)
        __atomic_fetch_or(&sattr_proc.hdr->flags, SATTR_HF_STEPS_FULL, __ATOMIC_RELAXED);
    sattr_drop();
    return NULL;
}

/* A step's live record and the lane it was started in (whose thread normally also moves
 * and stops it: the gauges and counters of the step go to that lane), or NULL when the
 * handle is stale (stopped, recycled). */
struct step_ref {
    struct sattr_slot *s;
    struct sattr_lane_core *c;
    struct sattr_peer *peers;
    uint32_t *rec;
    uint32_t w;
};

static inline int step_rec(void *h, struct step_ref *sr)
{
    uint64_t p;
    struct sattr_slot *s = sattr_decode(h, SATTR_K_STEP, &p);
    unsigned lane, idx;
    uint32_t *rec, w;
    if (SATTR_UNLIKELY(s == NULL))
        return 0;
    lane = (unsigned)(p >> 26) & 0x1fu;
    if (SATTR_UNLIKELY(lane > SATTR_PROBE_NLANES))
        return 0;
    idx = sattr_slot_index(s);
    rec = &sattr_lane_pool(idx, lane)->rec[(p >> 16) & (SATTR_STEP_POOL - 1)];
    w = SA_LD(rec);
    if (SATTR_UNLIKELY(REC_GEN(w) != (p & 0xffff) || REC_STATE(w) == 0))
        return 0; /* recordEventState after stopEvent (NCCL #1992) */
    sr->s = s;
    sr->c = sattr_lane_core(s, lane);
    sr->peers = sattr_lane_peers(s, lane);
    sr->rec = rec;
    sr->w = w;
    return 1;
}

static inline void gauge_move(const struct step_ref *sr, unsigned to)
{
    struct sattr_lane_core *c = sr->c;
    unsigned from = REC_STATE(sr->w), pi = REC_PEER(sr->w);
    if (from >= 2) {
        uint32_t v = SA_LD(&c->in_state[from - 2]);
        if (v)
            SA_ST(&c->in_state[from - 2], v - 1);
        if (pi != SATTR_NO_PEER) {
            uint16_t pv = SA_LD(&sr->peers[pi].wait[from - 2]);
            if (pv)
                SA_ST(&sr->peers[pi].wait[from - 2], (uint16_t)(pv - 1));
        }
    }
    if (to >= 2) {
        SA_BUMP(&c->in_state[to - 2], 1);
        if (pi != SATTR_NO_PEER) {
            SA_BUMP(&sr->peers[pi].wait[to - 2], 1);
            SA_ST(&sr->peers[pi].last_ch, (uint8_t)REC_CH(sr->w));
        }
    }
}

static void step_state(void *h, int state, uint64_t arg, int has_arg)
{
    struct step_ref sr;
    unsigned g;
    switch (state) {
    case SATTR_ST_SEND_GPU_WAIT: g = SATTR_W_SEND_GPU; break;
    case SATTR_ST_SEND_PEER_WAIT: g = SATTR_W_SEND_PEER; break;
    case SATTR_ST_SEND_WAIT: g = SATTR_W_SEND_NET; break;
    case SATTR_ST_RECV_WAIT: g = SATTR_W_RECV_NET; break;
    case SATTR_ST_RECV_FLUSH_WAIT: g = SATTR_W_RECV_FLUSH; break;
    case SATTR_ST_RECV_GPU_WAIT: g = SATTR_W_RECV_GPU; break;
    default: return;
    }
    if (!step_rec(h, &sr) || REC_STATE(sr.w) == g + 2)
        return; /* stale, or the same state again (SendPeerWait repeats on every poll) */
    gauge_move(&sr, g + 2);
    SA_ST(sr.rec, (sr.w & ~0xf000u) | (g + 2) << 12);
    if (has_arg && g == SATTR_W_SEND_NET)
        SA_BUMP(&sr.c->send_bytes, arg);
    else if (has_arg && g == SATTR_W_RECV_FLUSH)
        SA_BUMP(&sr.c->recv_bytes, arg);
}

/* Each lane rolls its own window over its own totals: the reader adds the lanes' last
 * closed windows. */
static void roll_window(struct sattr_lane_core *c, uint64_t now)
{
    uint64_t sd, rd, sb, rb;
    if (now - SA_LD(&c->win_start_ns) < sattr_proc.win_ns)
        return;
    sd = SA_LD(&c->send_done);
    rd = SA_LD(&c->recv_done);
    sb = SA_LD(&c->send_bytes);
    rb = SA_LD(&c->recv_bytes);
    SA_ST(&c->win_send_steps, sd - SA_LD(&c->base_send_steps));
    SA_ST(&c->win_recv_steps, rd - SA_LD(&c->base_recv_steps));
    SA_ST(&c->win_send_bytes, sb - SA_LD(&c->base_send_bytes));
    SA_ST(&c->win_recv_bytes, rb - SA_LD(&c->base_recv_bytes));
    SA_ST(&c->base_send_steps, sd);
    SA_ST(&c->base_recv_steps, rd);
    SA_ST(&c->base_send_bytes, sb);
    SA_ST(&c->base_recv_bytes, rb);
    SA_ST(&c->win_start_ns, now);
    SA_BUMP(&c->win_closed, 1);
}

static void step_stop(void *h)
{
    struct step_ref sr;
    struct sattr_lane_core *c;
    unsigned pi;
    uint64_t now;
    if (!step_rec(h, &sr))
        return;
    c = sr.c;
    gauge_move(&sr, 0);
    now = sattr_now();
    pi = REC_PEER(sr.w);
    if (REC_SEND(sr.w)) {
        SA_BUMP(&c->send_done, 1);
        SA_ST(&c->last_send_done_ns, now);
        if (pi != SATTR_NO_PEER) {
            SA_BUMP(&sr.peers[pi].send_done, 1);
            SA_ST(&sr.peers[pi].last_send_ms, ms_since_start(now));
        }
    } else {
        SA_BUMP(&c->recv_done, 1);
        SA_ST(&c->last_recv_done_ns, now);
        if (pi != SATTR_NO_PEER) {
            SA_BUMP(&sr.peers[pi].recv_done, 1);
            SA_ST(&sr.peers[pi].last_recv_ms, ms_since_start(now));
        }
    }
    SA_ST(&c->last_progress_ns, now);
    roll_window(c, now);
    SA_ST(sr.rec, (REC_GEN(sr.w) + 1u) << 16); /* free, next generation */
    heartbeat(now);
}

/* ---- kernel channels ----------------------------------------------------------------- */
SATTR_HIDDEN void *sattr_ev_kch_start(void *parent, unsigned ch, uint64_t ptimer)
{
    uint64_t p, seq, f;
    struct sattr_slot *s = sattr_decode(parent, SATTR_K_COLL, &p);
    if (s == NULL)
        s = sattr_decode(parent, SATTR_K_P2P, &p);
    if (SATTR_UNLIKELY(s == NULL))
        return NULL;
    f = p >> 42;
    seq = p & ((UINT64_C(1) << 36) - 1);
    ch &= SATTR_PROBE_NCHAN - 1;
    SA_ST(&s->chan[ch].kstart, (uint32_t)(f << 28 | ((seq + 1) & 0x0fffffffu)));
    SA_BUMP(&s->kch_started, 1);
    SA_ST(&s->kch_inflight, SA_LD(&s->kch_inflight) | UINT64_C(1) << ch);
    SA_ST(&s->kch_cur, f << 56 | (seq + 1));
    if (ptimer)
        SA_ST(&s->kch_start_ptimer, ptimer);
    return sattr_handle(SATTR_K_KCH, sattr_slot_index(s), ch | f << 6 | seq << 10);
}

static void kch_stop(struct sattr_slot *s, uint64_t p)
{
    unsigned ch = (unsigned)(p & 0x3f);
    uint64_t f = (p >> 6) & 0xf, seq = p >> 10, now = sattr_now();
    SA_ST(&s->chan[ch].kstop, (uint32_t)(f << 28 | ((seq + 1) & 0x0fffffffu)));
    SA_BUMP(&s->kch_stopped, 1);
    SA_ST(&s->kch_inflight, SA_LD(&s->kch_inflight) & ~(UINT64_C(1) << ch));
    SA_ST(&s->kch_done, f << 56 | (seq + 1));
    SA_ST(&s->kch_last_ns, now);
    heartbeat(now);
}

/* ---- stop / state dispatch ----------------------------------------------------------- */
SATTR_HIDDEN void sattr_ev_stop(void *h)
{
    uint64_t p;
    struct sattr_slot *s;
    switch (sattr_handle_kind(h)) {
    case SATTR_K_STEP:
        step_stop(h);
        break;
    case SATTR_K_KCH:
        if ((s = sattr_decode(h, SATTR_K_KCH, &p)) != NULL)
            kch_stop(s, p);
        break;
    case SATTR_K_PROXYOP:
        if ((s = sattr_decode(h, SATTR_K_PROXYOP, &p)) != NULL &&
            ((p >> 11) & 0x1fu) <= SATTR_PROBE_NLANES)
            SA_BUMP(&sattr_lane_core(s, (unsigned)(p >> 11) & 0x1fu)->pop_stopped, 1);
        break;
    case SATTR_K_API:
        if ((s = sattr_decode(h, SATTR_K_API, &p)) != NULL)
            api_stop(s, p);
        break;
    default:
        break; /* Coll/P2p stop means "enqueued": nothing to record; NULL or foreign: ignore */
    }
}

SATTR_HIDDEN void sattr_ev_state(void *h, int state, uint64_t arg, int has_arg)
{
    uint64_t p;
    struct sattr_slot *s;
    switch (sattr_handle_kind(h)) {
    case SATTR_K_STEP:
        step_state(h, state, arg, has_arg);
        break;
    case SATTR_K_KCH:
        if (state == SATTR_ST_KERNEL_CH_STOP && has_arg &&
            (s = sattr_decode(h, SATTR_K_KCH, &p)) != NULL)
            SA_ST(&s->kch_stop_ptimer, arg);
        break;
    default:
        break;
    }
}
