/*
 * Reading records back and checking them: what each scenario must leave in the files
 * (the Python analysis is tested on the same files by tests/unit/test_probe_harness.py),
 * and the robustness cases NCCL's real behaviour demands (research/nccl-probe.md 5):
 * probe off, NULL and foreign parents, stale handles, PXN, channel ids up to 255, events
 * after finalize, slot and step-pool exhaustion, unload/reload, concurrent inits, v4/v3.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "probe_harness.h"

/* More steps than the plugin's step-record pool (1024) holds. */
#define STEPS_OVER_POOL 1100

void check(struct tally *t, int ok, const char *fmt, ...)
{
    char line[sizeof(t->failures[0])];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    printf("%s %s\n", ok ? "ok  " : "FAIL", line);
    if (ok) {
        t->passed++;
        return;
    }
    if (t->failed < TALLY_KEEP)
        memcpy(t->failures[t->failed], line, sizeof(line));
    t->failed++;
}

void tally_summary(const struct tally *t)
{
    for (int i = 0; i < t->failed && i < TALLY_KEEP; i++)
        printf("failed: %s\n", t->failures[i]);
    printf("%d passed, %d failed\n", t->passed, t->failed);
}

struct sattr_hdr *map_file(const char *path, size_t *size)
{
    struct stat st;
    void *m;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)SATTR_PROBE_HDR_SIZE) {
        close(fd);
        return NULL;
    }
    m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return NULL;
    *size = (size_t)st.st_size;
    return m;
}

int load_records(const char *out, struct rank_rec *recs, int nrecs)
{
    char path[4096];
    DIR *nodes, *probe;
    struct dirent *nd, *fe;
    int found = 0;
    memset(recs, 0, sizeof(*recs) * (size_t)nrecs);
    snprintf(path, sizeof(path), "%s/nodes", out);
    if ((nodes = opendir(path)) == NULL)
        return -1;
    while ((nd = readdir(nodes)) != NULL) {
        if (nd->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/nodes/%s/probe", out, nd->d_name);
        if ((probe = opendir(path)) == NULL)
            continue;
        while ((fe = readdir(probe)) != NULL) {
            size_t size = 0;
            struct sattr_hdr *h;
            if (strstr(fe->d_name, ".probe") == NULL)
                continue;
            snprintf(path, sizeof(path), "%s/nodes/%s/probe/%s", out, nd->d_name, fe->d_name);
            h = map_file(path, &size);
            if (h == NULL || h->global_rank < 0 || h->global_rank >= nrecs || recs[h->global_rank].hdr) {
                fprintf(stderr, "probe_harness: unexpected record %s\n", path);
                if (h)
                    munmap(h, size);
                found = -1000;
                continue;
            }
            recs[h->global_rank].hdr = h;
            recs[h->global_rank].size = size;
            recs[h->global_rank].merged = calloc(SATTR_PROBE_NSLOTS, sizeof(struct sattr_slot));
            snprintf(recs[h->global_rank].node_dir, sizeof(recs[h->global_rank].node_dir), "%.63s",
                     nd->d_name);
            found++;
        }
        closedir(probe);
    }
    closedir(nodes);
    return found;
}

void free_records(struct rank_rec *recs, int nrecs)
{
    for (int i = 0; i < nrecs; i++) {
        if (recs[i].hdr)
            munmap(recs[i].hdr, recs[i].size);
        free(recs[i].merged);
        recs[i].merged = NULL;
    }
}

struct sattr_slot *find_slot(const struct rank_rec *r, uint64_t hash)
{
    struct sattr_slot *slots = (struct sattr_slot *)((char *)r->hdr + SATTR_PROBE_HDR_SIZE);
    for (uint32_t i = 0; i < r->hdr->nslots_used && i < SATTR_PROBE_NSLOTS; i++)
        if (slots[i].comm_hash == hash) {
            if (r->merged == NULL)
                return &slots[i];
            merge_lanes(r->hdr, r->size, i, &r->merged[i]);
            return &r->merged[i];
        }
    return NULL;
}

const struct sattr_peer *find_peer(const struct sattr_slot *s, int peer)
{
    for (unsigned i = 0; i < SATTR_PROBE_NPEERS; i++)
        if (s->peers[i].key == (uint32_t)peer + 1)
            return &s->peers[i];
    return NULL;
}

static int any_wait(const struct sattr_slot *s)
{
    for (unsigned i = 0; i < SATTR_PROBE_NWAIT; i++)
        if (s->in_state[i])
            return 1;
    return 0;
}

/* Entry time (header ring) of world collective opi in a record, 0 when the ring lost it. */
static uint64_t entered(const struct sattr_hdr *h, uint64_t opi)
{
    for (unsigned i = 0; i < SATTR_PROBE_HRING; i++) {
        const struct sattr_hring_ent *e = &h->ring[i];
        if (e->tag != 0 && (e->tag - 1) % SATTR_PROBE_HRING == i && e->kind == 1 &&
            e->comm_hash == WORLD_HASH && e->opi == opi)
            return e->start_ns;
    }
    return 0;
}

/* straggler: in the rings' world collectives the victim entered after every other rank, each time
 * (one clock: the ranks are processes of this machine) */
static void check_straggler(struct tally *t, const struct job_opts *o, struct rank_rec *recs)
{
    int seen = 0, last = 0;
    for (uint64_t opi = 0; opi < (uint64_t)o->ops; opi++) {
        uint64_t tv = entered(recs[o->victim].hdr, opi), latest = 0;
        int all = tv != 0;
        for (int r = 0; r < o->ranks && all; r++) {
            uint64_t tr = r == o->victim ? 0 : entered(recs[r].hdr, opi);
            if (r != o->victim && tr == 0)
                all = 0;
            latest = tr > latest ? tr : latest;
        }
        if (!all)
            continue;
        seen++;
        last += tv > latest;
    }
    check(t, seen >= 5 && last == seen,
          "straggler: rank %d entered last in %d of %d world collectives in the rings", o->victim, last,
          seen);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Median interval (ns) between world collectives opi-1 and opi over [from, to) in a record's ring,
 * its smallest in *min; 0 when the ring holds none. */
static uint64_t world_period(const struct sattr_hdr *h, uint64_t from, uint64_t to, uint64_t *min)
{
    uint64_t d[SATTR_PROBE_HRING];
    size_t n = 0;
    for (uint64_t opi = from < 1 ? 1 : from; opi < to && n < SATTR_PROBE_HRING; opi++) {
        uint64_t a = entered(h, opi - 1), b = entered(h, opi);
        if (a != 0 && b > a)
            d[n++] = b - a;
    }
    if (n == 0)
        return 0;
    qsort(d, n, sizeof(d[0]), cmp_u64);
    *min = d[0];
    return d[n / 2];
}

/* slowphase: every rank's shortest world period from the inject on (both ends of the interval
 * slowed) is longer than its shortest before by at least one pause (the iteration gained two),
 * and no interval is shorter than the two pauses of an iteration. By the pause, not by a ratio:
 * a loaded CPU stretches the healthy period too (beside stress-ng it went from ~12 to ~23 ms
 * and the ratio fell under 3x while every pause was there). By the shortest periods: load only
 * ever lengthens an interval, so the shortest of 11 before is the one it left alone, where
 * the median rises with the load.
 * Near miss, straggler: the victim pauses from the start, so although the job is slow, no rank's
 * median period jumps by a pause at the inject (a slow rank, S1, not a slow phase). By the
 * medians of 11 each side: a jump there needs 6 stalls of a pause after the inject, where the
 * shortest before sits a jitter under the usual period (32 of 40 ms). */
static void check_phase(struct tally *t, const struct job_opts *o, struct rank_rec *recs)
{
    int measured = 0, jumped = 0, paused = 0, slow = o->sc == SC_SLOWPHASE;
    double lo = 1e30, hi = 0;
    for (int r = 0; r < o->ranks; r++) {
        uint64_t bmin = 0, amin = 0;
        uint64_t b = world_period(recs[r].hdr, 1, (uint64_t)o->inject, &bmin);
        uint64_t a = world_period(recs[r].hdr, (uint64_t)o->inject + 1, (uint64_t)o->ops, &amin);
        if (a == 0 || b == 0)
            continue;
        uint64_t before = slow ? bmin : b, after = slow ? amin : a;
        measured++;
        jumped += after >= before + 1000u * (uint64_t)o->delay_us;
        paused += amin >= 2000u * (uint64_t)o->delay_us;
        lo = (double)after / before < lo ? (double)after / before : lo;
        hi = (double)after / before > hi ? (double)after / before : hi;
    }
    if (slow)
        check(t, measured == o->ranks && jumped == o->ranks && paused == o->ranks,
              "slowphase: all %d ranks' shortest world period from collective %d on is one pause "
              "(%d us) or more over the shortest before (x%.1f..x%.1f), each interval >= 2 pauses",
              measured, o->inject, o->delay_us, lo, hi);
    else
        check(t, measured == o->ranks && jumped == 0,
              "straggler: no rank's median world period jumps by a pause (%d us) at collective %d "
              "(x%.1f..x%.1f of %d ranks)", o->delay_us, o->inject, lo, hi, measured);
}

void check_scenario(struct tally *t, const struct job_opts *o)
{
    struct rank_rec recs[64];
    const char *sc = scenario_names[o->sc];
    int n = load_records(o->out, recs, 64), v = o->victim;
    check(t, n == o->ranks, "%s: one record per rank (%d of %d)", sc, n, o->ranks);
    if (n != o->ranks) {
        free_records(recs, 64);
        return;
    }
    for (int r = 0; r < o->ranks; r++) {
        const struct sattr_hdr *h = recs[r].hdr;
        struct sattr_slot *w = find_slot(&recs[r], WORLD_HASH);
        int ok = recs[r].size == SATTR_PROBE_FILE_SIZE && recs[r].size <= 112 * 1024 &&
                 h->magic == SATTR_PROBE_MAGIC && h->nslots_used == 2 && w != NULL &&
                 w->rank == r && (o->api < 4 || w->nranks == o->ranks) && h->dropped_total == 0;
        check(t, ok, "%s: rank %d record valid (%zu bytes, world slot, nothing dropped)", sc, r,
              recs[r].size);
    }
    struct sattr_slot *wv = v >= 0 ? find_slot(&recs[v], WORLD_HASH) : NULL;
    struct sattr_slot *wn = v >= 0 ? find_slot(&recs[(v + 1) % o->ranks], WORLD_HASH) : NULL;
    if (SC_COMPLETES(o->sc)) {
        int ok = 1;
        for (int r = 0; r < o->ranks; r++) {
            struct sattr_slot *w = find_slot(&recs[r], WORLD_HASH);
            ok &= w->func_seq[SATTR_F_ALLREDUCE] == (uint64_t)o->ops && w->kch_inflight == 0 &&
                  !any_wait(w) && w->state == SATTR_SLOT_FINALIZED &&
                  w->send_done == w->send_posted && w->recv_done == w->recv_posted;
        }
        check(t, ok, "%s: every rank completed %d AllReduce, nothing in flight", sc, o->ops);
        if (o->sc == SC_STRAGGLER)
            check_straggler(t, o, recs);
        if (o->sc == SC_STRAGGLER || o->sc == SC_SLOWPHASE)
            check_phase(t, o, recs);
        if (o->sc == SC_SLOWLINK) {
            const struct sattr_peer *ps = find_peer(wv, (v + 1) % o->ranks);
            check(t, ps && ps->send_done > 0 && ps->send_done == ps->send_posted,
                  "slowlink: rank %d's slow sends to %d all completed", v, (v + 1) % o->ranks);
        }
    } else if (o->sc == SC_NONENTRY) {
        int others = 1, inflight = 0;
        for (int r = 0; r < o->ranks; r++) {
            struct sattr_slot *w = find_slot(&recs[r], WORLD_HASH);
            if (r == v)
                continue;
            others &= w->func_seq[SATTR_F_ALLREDUCE] > (uint64_t)o->inject;
            inflight += w->kch_inflight != 0 &&
                        w->kch_cur == ((uint64_t)SATTR_F_ALLREDUCE << 56 | (uint64_t)(o->inject + 1));
        }
        check(t, wv->func_seq[SATTR_F_ALLREDUCE] == (uint64_t)o->inject && others,
              "nonentry: rank %d launched AllReduce up to seq %d only, the others beyond", v,
              o->inject - 1);
        check(t, inflight == o->ranks - 1, "nonentry: the others' kernels hang in seq %d", o->inject);
        check(t, wn->in_state[SATTR_W_RECV_NET] > 0, "nonentry: rank %d waits for data from %d",
              (v + 1) % o->ranks, v);
    } else if (o->sc == SC_COUNT) {
        int ok = 1;
        for (int r = 0; r < o->ranks; r++) {
            struct sattr_slot *w = find_slot(&recs[r], WORLD_HASH);
            const struct sattr_op_ent *e = &w->ops[o->inject % SATTR_PROBE_OPRING];
            uint64_t want = r == v ? HARNESS_COUNT / 2 : HARNESS_COUNT;
            ok &= e->tag == (uint32_t)o->inject + 1 && e->count == want;
        }
        check(t, ok, "count: op %d has count %u on rank %d, %u elsewhere", o->inject,
              HARNESS_COUNT / 2, v, HARNESS_COUNT);
    } else if (o->sc == SC_LINKSTALL) {
        const struct sattr_peer *ps = find_peer(wv, (v + 1) % o->ranks);
        const struct sattr_peer *pr = find_peer(wn, v);
        int others = 0;
        for (int r = 0; r < o->ranks; r++)
            if (r != v)
                others += find_slot(&recs[r], WORLD_HASH)->in_state[SATTR_W_SEND_NET] != 0;
        check(t, ps && ps->wait[SATTR_W_SEND_NET] == 1 && wv->in_state[SATTR_W_SEND_NET] == 1,
              "linkstall: rank %d has one send to %d stuck on the network", v, (v + 1) % o->ranks);
        check(t, pr && pr->wait[SATTR_W_RECV_NET] >= 1, "linkstall: rank %d waits for data from %d",
              (v + 1) % o->ranks, v);
        check(t, others == 0, "linkstall: no other rank has a send stuck on the network");
    }
    free_records(recs, 64);
}

/* Every record in the probe dir of its rank's node, written under that rank's and the job's
 * identity: what a rank's env gives its record, whichever process forked the rank (node mode
 * forks a node's ranks only, and without --out keeps the job's env). */
void check_identity(struct tally *t, const struct job_opts *o, uint64_t job_id)
{
    struct rank_rec recs[64];
    int found = load_records(o->out, recs, 64), ok = 1;
    for (int r = 0; r < o->ranks && found == o->ranks; r++) {
        const struct sattr_hdr *h = recs[r].hdr;
        char want[32];
        snprintf(want, sizeof(want), "node%d", node_of(o, r));
        ok &= h != NULL && strcmp(recs[r].node_dir, want) == 0 && h->slurm_procid == r &&
              h->local_rank == r % o->per_node && h->world_size == o->ranks &&
              h->job_id == job_id && h->step_id == 0 &&
              strncmp(h->node_name, want, sizeof(h->node_name)) == 0;
    }
    free_records(recs, 64);
    check(t, ok && found == o->ranks,
          "%s: each of %d records in its node's dir, with its rank's identity in job %llu",
          scenario_names[o->sc], found, (unsigned long long)job_id);
}

/* ---- robustness ---------------------------------------------------------------------- */

static struct sattr_slot *rb_slot(struct rb *b, unsigned i)
{
    return (struct sattr_slot *)((char *)b->h + SATTR_PROBE_HDR_SIZE) + i;
}

void *step_event(struct rb *b, void *ctx, void *parent, int step)
{
    struct hev e;
    memset(&e, 0, sizeof(e));
    e.type = SATTR_EV_PROXY_STEP;
    e.parent = parent;
    e.step = step;
    return fake_start(&b->n, ctx, &e);
}

void *proxy_op(struct rb *b, void *ctx, void *parent, int pid, int ch, int peer, int send)
{
    struct hev e;
    memset(&e, 0, sizeof(e));
    e.type = SATTR_EV_PROXY_OP;
    e.parent = parent;
    e.pid = pid;
    e.ch = ch;
    e.peer = peer;
    e.is_send = send;
    e.nsteps = 4;
    return fake_start(&b->n, ctx, &e);
}

struct conc {
    struct fake_nccl *n;
    int i;
    void *ctx;
};

static void *conc_init(void *arg)
{
    struct conc *c = arg;
    int mask = 0;
    c->ctx = fake_init(c->n, 0x5000 + (uint64_t)c->i, 1, 8, c->i, "conc", &mask);
    return NULL;
}

static void robust_handles(struct rb *b, void *ctx)
{
    struct tally *t = b->t;
    struct sattr_slot *s = rb_slot(b, 0);
    void *coll = fake_collective(&b->n, ctx, 0, "AllReduce", 0, 1024, 2, 0x77);
    void *pop, *st, *forged, *k;
    int local = 0;
    struct hev e;

    /* NULL parent (NCCL's pool ran out), garbage and pointers into our own stack */
    check(t, step_event(b, ctx, NULL, 0) == NULL, "robust: step with NULL parent is ignored");
    check(t, step_event(b, ctx, &local, 0) == NULL, "robust: step with a foreign pointer parent is ignored");
    fake_stop(&b->n, NULL);
    fake_stop(&b->n, (void *)0xdeadbeef);
    fake_state(&b->n, &local, SATTR_ST_SEND_WAIT, 1, 1);
    check(t, 1, "robust: stop/record on NULL and garbage handles do not crash");
    /* PXN: another process's op, our context value as its context */
    pop = proxy_op(b, ctx, coll, getpid() + 1, 0, 1, 1);
    check(t, pop == NULL && b->h->pxn_foreign == 1, "robust: foreign-pid ProxyOp counted (%u), not followed",
          b->h->pxn_foreign);
    /* stale handles: state after stop, double stop (NCCL #1992) */
    pop = proxy_op(b, ctx, coll, getpid(), 200, 1, 1); /* channel 200 folds into 0..63 */
    st = step_event(b, ctx, pop, 1000);
    fake_state(&b->n, st, SATTR_ST_SEND_WAIT, 4096, 1);
    check(t, s->in_state[SATTR_W_SEND_NET] == 1, "robust: live step counted in SendWait");
    fake_stop(&b->n, st);
    fake_state(&b->n, st, SATTR_ST_SEND_WAIT, 4096, 1);
    fake_stop(&b->n, st);
    check(t, s->in_state[SATTR_W_SEND_NET] == 0 && s->send_done == 1,
          "robust: state/stop after stop are ignored (gauge %u, done %llu)",
          s->in_state[SATTR_W_SEND_NET], (unsigned long long)s->send_done);
    /* a forged handle: valid tag, slot beyond the table */
    forged = (void *)(((uintptr_t)st & ~((uintptr_t)0x3f << 46)) | ((uintptr_t)63 << 46));
    fake_state(&b->n, forged, SATTR_ST_SEND_WAIT, 1, 1);
    fake_stop(&b->n, forged);
    check(t, 1, "robust: forged handle with an out-of-range slot is ignored");
    /* kernel channel 255 folds to 63 */
    memset(&e, 0, sizeof(e));
    e.type = SATTR_EV_KERNEL_CH;
    e.parent = coll;
    e.ch = 255;
    k = fake_start(&b->n, ctx, &e);
    check(t, k != NULL && (s->kch_inflight >> 63) == 1, "robust: channel 255 bounded to 63");
    fake_stop(&b->n, k);
    check(t, s->kch_inflight == 0, "robust: kernel channel stop clears it");
    /* point-to-point: API call, task, a kernel channel under it */
    memset(&e, 0, sizeof(e));
    e.type = SATTR_EV_P2P_API;
    e.func = "Send";
    e.count = 10;
    void *api = fake_start(&b->n, ctx, &e);
    fake_stop(&b->n, api);
    e.type = SATTR_EV_P2P;
    e.peer = 3;
    e.dtype = "ncclFloat32";
    void *p2p = fake_start(&b->n, ctx, &e);
    fake_stop(&b->n, p2p);
    const struct sattr_peer *pp = find_peer(s, 3);
    check(t, s->p2p_tasks == 1 && s->p2p_api_enter == 1 && s->p2p_api_exit == 1 && pp &&
                 pp->p2p_ops == 1 && (pp->kind & 4) && s->last_peer == 3,
          "robust: ncclSend recorded with its peer");
    memset(&e, 0, sizeof(e));
    e.type = SATTR_EV_KERNEL_CH;
    e.parent = p2p;
    e.ch = 2;
    k = fake_start(&b->n, ctx, &e);
    check(t, k != NULL && (s->kch_cur >> 56) == SATTR_F_SEND, "robust: kernel channel under a p2p task");
    fake_stop(&b->n, k);
    /* step pool exhaustion: drop and count, never block */
    void **steps = calloc(STEPS_OVER_POOL, sizeof(void *));
    int got = 0;
    for (int i = 0; steps && i < STEPS_OVER_POOL; i++)
        got += (steps[i] = step_event(b, ctx, pop, i)) != NULL;
    check(t, got < STEPS_OVER_POOL && s->steps_dropped > 0 && (b->h->flags & SATTR_HF_STEPS_FULL),
          "robust: step pool full: %d recorded, %u dropped", got, s->steps_dropped);
    for (int i = 0; steps && i < STEPS_OVER_POOL; i++)
        fake_stop(&b->n, steps[i]);
    free(steps);
    fake_stop(&b->n, pop);
}

void check_robustness(struct tally *t, const char *plugin, const char *tmpdir)
{
    struct rb b;
    int mask = -1;
    void *ctx, *c4, *ctxs[48];
    char path[4096 + 64];
    uint32_t used;

    memset(&b, 0, sizeof(b));
    b.t = t;
    snprintf(b.dir, sizeof(b.dir), "%s/robust", tmpdir);
    setenv("RANK", "0", 1);
    /* probe off: no directory given */
    unsetenv("SLURM_ATTR_PROBE_DIR");
    if (fake_load(&b.n, plugin, 5) != 0) {
        check(t, 0, "robust: load %s", plugin);
        return;
    }
    ctx = fake_init(&b.n, 1, 1, 1, 0, "off", &mask);
    check(t, ctx == NULL && mask == 0, "robust: SLURM_ATTR_PROBE_DIR unset: probe off, mask 0");
    fake_collective(&b.n, ctx, 0, "AllReduce", 0, 1, 1, 1);
    fake_finalize(&b.n, ctx);
    fake_unload(&b.n);
    /* a directory that cannot be created */
    setenv("SLURM_ATTR_PROBE_DIR", "/proc/sattr-no-such/probe", 1);
    fake_load(&b.n, plugin, 5);
    mask = -1;
    ctx = fake_init(&b.n, 1, 1, 1, 0, "bad", &mask);
    check(t, ctx == NULL && mask == 0, "robust: unusable directory: probe off, mask 0");
    fake_unload(&b.n);

    setenv("SLURM_ATTR_PROBE_DIR", b.dir, 1);
    fake_load(&b.n, plugin, 5);
    ctx = fake_init(&b.n, 0x77, 1, 4, 0, "robust", &mask);
    snprintf(path, sizeof(path), "%s/rank0.pid%d.probe", b.dir, (int)getpid());
    b.h = map_file(path, &b.size);
    check(t, ctx != NULL && mask != 0 && b.h != NULL && b.size == SATTR_PROBE_FILE_SIZE,
          "robust: probe on, record %s", path);
    if (b.h == NULL)
        return;
    robust_handles(&b, ctx);
    check_lanes(&b, ctx);
    /* concurrent inits get distinct slots */
    {
        pthread_t th[8];
        struct conc c[8];
        int distinct = 1;
        for (int i = 0; i < 8; i++) {
            c[i] = (struct conc){&b.n, i, NULL};
            pthread_create(&th[i], NULL, conc_init, &c[i]);
        }
        for (int i = 0; i < 8; i++)
            pthread_join(th[i], NULL);
        for (int i = 0; i < 8; i++)
            for (int j = 0; j < i; j++)
                distinct &= c[i].ctx != NULL && c[i].ctx != c[j].ctx;
        check(t, distinct && b.h->nslots_used == 9, "robust: 8 concurrent inits, 8 slots");
    }
    /* events after finalize land harmlessly */
    fake_finalize(&b.n, ctx);
    fake_collective(&b.n, ctx, 0, "AllReduce", 1, 1024, 2, 0x77);
    check(t, rb_slot(&b, 0)->state == SATTR_SLOT_FINALIZED, "robust: events after finalize tolerated");
    /* v4 and v3 tables of the same library */
    {
        struct fake_nccl n4 = b.n, n3 = b.n;
        n4.v5 = NULL;
        n4.v4 = dlsym(b.n.dl, "ncclProfiler_v4");
        n3.v5 = NULL;
        n3.v3 = dlsym(b.n.dl, "ncclProfiler_v3");
        c4 = n4.v4 ? fake_init(&n4, 0x44, 1, 2, 1, "v4", &mask) : NULL;
        if (c4)
            fake_collective(&n4, c4, 1, "AllGather", 6, 10, 1, 0x44);
        void *c3 = n3.v3 ? fake_init(&n3, 0, 0, 0, 0, NULL, &mask) : NULL;
        if (c3)
            fake_collective(&n3, c3, 3, "Broadcast", 2, 10, 1, 0x33);
        struct sattr_slot *s4 = rb_slot(&b, 9), *s3 = rb_slot(&b, 10);
        check(t, c4 && s4->comm_hash == 0x44 && s4->func_seq[SATTR_F_ALLGATHER] == 7,
              "robust: ncclProfiler_v4 records a collective");
        check(t, c3 && s3->comm_hash == 0x33 && s3->rank == 3 && s3->func_seq[SATTR_F_BROADCAST] == 3,
              "robust: ncclProfiler_v3 learns the communicator from its first collective");
    }
    /* v6: copy-engine collectives are launched collectives without kernel channels */
    {
        struct fake_nccl n6 = b.n;
        n6.v5 = NULL;
        n6.v6 = dlsym(b.n.dl, "ncclProfiler_v6");
        int m6 = 0;
        void *c6 = n6.v6 ? fake_init(&n6, 0x66, 1, 8, 2, "v6", &m6) : NULL;
        void *ce = NULL, *cs;
        struct hev e6;
        if (c6) {
            fake_collective(&n6, c6, 2, "AllReduce", 0, 4096, 2, 0x66);
            for (int i = 0; i < 3; i++)
                ce = fake_ce_collective(&n6, c6, 2, "AllGather", (uint64_t)i, 1 << 20, (uint32_t)i);
        }
        struct sattr_slot *s6 = rb_slot(&b, 11);
        const struct sattr_op_ent *last = &s6->ops[(s6->op_count - 1) & (SATTR_PROBE_OPRING - 1)];
        check(t, c6 && s6->api_ver == 6 && (m6 & SATTR_EV_CE_COLL) && !(m6 & SATTR_EV_CE_SYNC) &&
                     (m6 & SATTR_EV_COLL_API),
              "robust: ncclProfiler_v6 asks for copy-engine collectives, not their sync/batch parts "
              "(mask %#x)", m6);
        check(t, c6 && s6->op_count == 4 && s6->coll_tasks == 4 && s6->ce_tasks == 3 &&
                     s6->func_seq[SATTR_F_ALLGATHER] == 3 && s6->func_seq[SATTR_F_ALLREDUCE] == 1 &&
                     s6->coll_api_enter == 4 && s6->coll_api_exit == 4,
              "robust: v6 counts 3 copy-engine AllGathers beside a kernel AllReduce "
              "(ops %llu, ce %llu)", (unsigned long long)s6->op_count,
              (unsigned long long)s6->ce_tasks);
        check(t, c6 && last->algo == SATTR_AL_CE && last->func == SATTR_F_ALLGATHER &&
                     last->seq == 2 && last->dtype == SATTR_DT_BFLOAT16 && s6->kch_started == 0 &&
                     s6->kch_inflight == 0,
              "robust: a copy-engine collective is recorded as CE, with no kernel in flight");
        /* CeSync/CeBatch (not asked for) and types past v6 get no handle */
        memset(&e6, 0, sizeof(e6));
        e6.type = SATTR_EV_CE_BATCH;
        e6.parent = ce;
        cs = c6 ? fake_start(&n6, c6, &e6) : (void *)1;
        e6.type = (uint64_t)1 << 15; /* KernelPhase: v7 */
        void *c7 = c6 ? fake_start(&n6, c6, &e6) : (void *)1;
        check(t, cs == NULL && c7 == NULL, "robust: v6 CeBatch and unknown types get no handle");
    }
    /* slot exhaustion keeps the mask (it is process-wide in NCCL) */
    used = b.h->nslots_used;
    int nul = 0;
    for (int i = 0; i < 48; i++) {
        mask = 0;
        ctxs[i] = fake_init(&b.n, 0x9000 + (uint64_t)i, 1, 2, 0, "many", &mask);
        nul += ctxs[i] == NULL && mask != 0;
    }
    check(t, b.h->nslots_used == SATTR_PROBE_NSLOTS && nul == 48 - (int)(SATTR_PROBE_NSLOTS - used) &&
                 (b.h->flags & SATTR_HF_SLOTS_FULL),
          "robust: slots exhausted: %d communicators without a slot, mask kept", nul);
    fake_collective(&b.n, NULL, 0, "AllReduce", 0, 1, 1, 1);
    /* unload after the last finalize, load again: same file, reopened */
    for (int i = 0; i < 48; i++)
        fake_finalize(&b.n, ctxs[i]);
    fake_unload(&b.n);
    fake_load(&b.n, plugin, 5);
    ctx = fake_init(&b.n, 0x78, 1, 4, 0, "again", &mask);
    check(t, ctx == NULL && (b.h->flags & SATTR_HF_REOPENED) && mask != 0,
          "robust: reloaded plugin reopens the same record (full, so no slot)");
    fake_finalize(&b.n, ctx);
    fake_unload(&b.n);
    munmap(b.h, b.size);
}
