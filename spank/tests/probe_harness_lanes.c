/*
 * Lanes (layout version 2): several threads writing one communicator's proxy-side
 * counters each through their own copy, merged as the reader merges them. Checked in the
 * selftest (plain and under ThreadSanitizer) and, with the record left on disk, by
 * tests/unit/test_probe_lanes.py (`probe_harness lanes`).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "probe_harness.h"

static void add_peer(struct sattr_slot *out, const struct sattr_peer *p)
{
    for (unsigned i = 0; i < SATTR_PROBE_NPEERS; i++) {
        struct sattr_peer *q = &out->peers[i];
        if (q->key != 0 && q->key != p->key)
            continue;
        if (q->key == 0) {
            *q = *p;
            return;
        }
        q->kind |= p->kind;
        q->send_posted += p->send_posted;
        q->send_done += p->send_done;
        q->recv_posted += p->recv_posted;
        q->recv_done += p->recv_done;
        for (unsigned w = 0; w < SATTR_PROBE_NWAIT; w++)
            q->wait[w] += p->wait[w];
        if (p->last_send_ms > q->last_send_ms)
            q->last_send_ms = p->last_send_ms;
        if (p->last_recv_ms > q->last_recv_ms)
            q->last_recv_ms = p->last_recv_ms;
        q->p2p_ops += p->p2p_ops;
        return;
    }
}

#define MAX_OF(a, b) ((a) > (b) ? (a) : (b))

/* What the reader does (slurm_attr/probe/record.py): a slot plus its pool lanes. */
void merge_lanes(const struct sattr_hdr *h, size_t size, unsigned idx, struct sattr_slot *out)
{
    const struct sattr_slot *slots = (const void *)((const char *)h + SATTR_PROBE_HDR_SIZE);
    const struct sattr_lane *lanes = (const void *)((const char *)h + SATTR_PROBE_LANES_OFF);
    *out = slots[idx];
    if (size < SATTR_PROBE_FILE_SIZE)
        return;
    for (unsigned k = 0; k < SATTR_PROBE_NLANES; k++) {
        const struct sattr_lane *l = &lanes[k];
        struct sattr_lane_core *c = &out->net;
        const struct sattr_lane_core *a = &l->net;
        if ((l->bind & 0xffffffffu) != idx + 1u)
            continue;
        c->send_posted += a->send_posted;
        c->send_done += a->send_done;
        c->recv_posted += a->recv_posted;
        c->recv_done += a->recv_done;
        c->send_bytes += a->send_bytes;
        c->recv_bytes += a->recv_bytes;
        c->pop_started += a->pop_started;
        c->pop_stopped += a->pop_stopped;
        for (unsigned w = 0; w < SATTR_PROBE_NWAIT; w++)
            c->in_state[w] += a->in_state[w];
        c->steps_dropped += a->steps_dropped;
        c->peers_dropped += a->peers_dropped;
        c->last_progress_ns = MAX_OF(c->last_progress_ns, a->last_progress_ns);
        c->last_send_done_ns = MAX_OF(c->last_send_done_ns, a->last_send_done_ns);
        c->last_recv_done_ns = MAX_OF(c->last_recv_done_ns, a->last_recv_done_ns);
        for (unsigned i = 0; i < SATTR_PROBE_NPEERS; i++)
            if (l->peers[i].key != 0)
                add_peer(out, &l->peers[i]);
    }
}

/* ---- lanes: several threads on one communicator -------------------------------------- */
#define LANE_THREADS 8
#define LANE_STEPS 1500

struct lane_worker {
    struct rb *b;
    void *ctx, *coll, *shared_pop;
    int i;
};

static void lane_step(struct rb *b, void *ctx, void *pop, int i, int send)
{
    void *st = step_event(b, ctx, pop, i);
    if (send) {
        fake_state(&b->n, st, SATTR_ST_SEND_GPU_WAIT, 0, 0);
        fake_state(&b->n, st, SATTR_ST_SEND_WAIT, 100, 1);
    } else {
        fake_state(&b->n, st, SATTR_ST_RECV_WAIT, 0, 0);
        fake_state(&b->n, st, SATTR_ST_RECV_FLUSH_WAIT, 100, 1);
    }
    fake_stop(&b->n, st);
}

static void *lane_thread(void *arg)
{
    struct lane_worker *w = arg;
    /* its own ProxyOps (peers 1 and 2 shared by all threads: merged by rank) ... */
    void *ps = proxy_op(w->b, w->ctx, w->coll, getpid(), w->i, 1, 1);
    void *pr = proxy_op(w->b, w->ctx, w->coll, getpid(), w->i, 2, 0);
    for (int i = 0; i < LANE_STEPS; i++) {
        lane_step(w->b, w->ctx, ps, i, 1);
        lane_step(w->b, w->ctx, pr, i, 0);
        /* ... and steps of an op another thread started (peer 3) */
        lane_step(w->b, w->ctx, w->shared_pop, i, 1);
    }
    fake_stop(&w->b->n, ps);
    fake_stop(&w->b->n, pr);
    return NULL;
}

/* No count lost with 8 writer threads on one communicator (version 1 lost counts there:
 * the threads shared the slot's counters), and lanes are reused after thread exit. */
void check_lanes(struct rb *b, void *ctx)
{
    struct tally *t = b->t;
    struct sattr_slot before, after;
    void *coll = fake_collective(&b->n, ctx, 0, "AllReduce", 7, 1024, 2, 0x77);
    void *shared_pop = proxy_op(b, ctx, coll, getpid(), 9, 3, 1);
    uint32_t used_first = 0;
    merge_lanes(b->h, b->size, 0, &before);
    for (int round = 0; round < 2; round++) {
        pthread_t th[LANE_THREADS];
        struct lane_worker w[LANE_THREADS];
        for (int i = 0; i < LANE_THREADS; i++) {
            w[i] = (struct lane_worker){b, ctx, coll, shared_pop, i};
            pthread_create(&th[i], NULL, lane_thread, &w[i]);
        }
        for (int i = 0; i < LANE_THREADS; i++)
            pthread_join(th[i], NULL);
        if (round == 0)
            used_first = b->h->lanes_used;
    }
    fake_stop(&b->n, shared_pop);
    merge_lanes(b->h, b->size, 0, &after);
    uint64_t want = 2ull * LANE_THREADS * LANE_STEPS;
    const struct sattr_peer *p1 = find_peer(&after, 1), *p2 = find_peer(&after, 2), *p3 = find_peer(&after, 3);
    const struct sattr_peer *b1 = find_peer(&before, 1), *b2 = find_peer(&before, 2), *b3 = find_peer(&before, 3);
    int idle = 1;
    for (unsigned i = 0; i < SATTR_PROBE_NWAIT; i++)
        idle &= after.in_state[i] == before.in_state[i];
    check(t, after.send_done - before.send_done == 2 * want && after.recv_done - before.recv_done == want &&
                 after.send_posted - before.send_posted == 2 * want && idle,
          "lanes: %d threads on one communicator: no count lost (%llu of %llu sends done)", LANE_THREADS,
          (unsigned long long)(after.send_done - before.send_done), (unsigned long long)(2 * want));
    check(t, p1 && p2 && p3 && p1->send_done - (b1 ? b1->send_done : 0) == want &&
                 p2->recv_done - (b2 ? b2->recv_done : 0) == want &&
                 p3->send_done - (b3 ? b3->send_done : 0) == want && (p1->kind & 1) && (p2->kind & 2),
          "lanes: per-peer counts merge by rank across lanes (peer 3: steps of another thread's op)");
    /* 16 thread lifetimes, at most 8 alive at once: at most 8 lanes, each exited thread's
     * lane taken again by a later one */
    const struct sattr_lane *lanes = (const void *)((const char *)b->h + SATTR_PROBE_LANES_OFF);
    uint32_t claims = 0;
    for (unsigned k = 0; k < SATTR_PROBE_NLANES; k++)
        if ((lanes[k].bind & 0xffffffffu) == 1)
            claims += lanes[k].claims;
    check(t, used_first >= 1 && b->h->lanes_used <= LANE_THREADS && b->h->lanes_full == 0 &&
                 claims == 2 * LANE_THREADS,
          "lanes: %d threads in two rounds took %u lanes (%u after the first), %u claims",
          2 * LANE_THREADS, b->h->lanes_used, used_first, claims);
    check(t, after.pop_started - before.pop_started == 4 * LANE_THREADS &&
                 after.pop_stopped - before.pop_stopped == 4 * LANE_THREADS + 1,
          "lanes: ProxyOp start/stop counted in the lanes that saw them (%llu, %llu)",
          (unsigned long long)(after.pop_started - before.pop_started),
          (unsigned long long)(after.pop_stopped - before.pop_stopped));
}

/* check_lanes alone, its record left in `dir` for the Python reader's test. */
void check_lanes_record(struct tally *t, const char *plugin, const char *dir)
{
    struct rb b;
    int mask = 0;
    char path[4096 + 64];
    void *ctx;
    memset(&b, 0, sizeof(b));
    b.t = t;
    snprintf(b.dir, sizeof(b.dir), "%s", dir);
    setenv("RANK", "0", 1);
    setenv("SLURM_ATTR_PROBE_DIR", b.dir, 1);
    if (fake_load(&b.n, plugin, 5) != 0) {
        check(t, 0, "lanes: load %s", plugin);
        return;
    }
    ctx = fake_init(&b.n, 0x77, 1, 4, 0, "lanes", &mask);
    snprintf(path, sizeof(path), "%s/rank0.pid%d.probe", b.dir, (int)getpid());
    b.h = map_file(path, &b.size);
    check(t, ctx != NULL && b.h != NULL && b.size == SATTR_PROBE_FILE_SIZE, "lanes: record %s", path);
    if (b.h == NULL)
        return;
    check_lanes(&b, ctx);
    fake_finalize(&b.n, ctx);
    fake_unload(&b.n);
    munmap(b.h, b.size);
}

