/*
 * The simulated job: one process per rank (each with its own plugin instance and record,
 * as on a real node), an application thread that launches collectives and a proxy thread
 * that plays NCCL's proxy and kernel events for them, the application running ahead.
 *
 * Every iteration runs an AllReduce on the world communicator and an AllGather on the
 * rank's half communicator (even or odd ranks). Each is a ring: the data of step t at
 * rank r comes from its ring predecessor, so a rank that stops stalls the whole ring as
 * on a GPU. Ranks per_node apart sit on different nodes; only edges crossing nodes have
 * network (proxy) events, as in NCCL. Shared memory between the rank processes carries
 * the ring's data dependencies. Faults: a rank that never launches one AllReduce
 * (nonentry), a rank with a different count (count), a send frozen on the network from
 * the victim to its successor (linkstall): every rank ends stuck (probe_harness_run.c then
 * kills them all, as the epilog will find them). Slow but complete: a rank
 * that pauses delay_us before every collective it launches (straggler, a slow host or data
 * loader), a network link whose sends from the victim to its world successor each take
 * delay_us longer in SendWait (slowlink), every rank pausing delay_us before each collective
 * from iteration inject on (slowphase: a slower phase of the whole job, no rank to blame).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "probe_harness.h"
#include "probe_harness_job.h"

#define AHEAD 3          /* collectives the application may run ahead of the proxy */
#define BLOCKED_MS 150   /* a wait this long counts as "stuck" */
#define QCAP 64

const char *const scenario_names[] = {"healthy",   "nonentry", "count",    "linkstall", "killed",
                                      "straggler", "slowlink", "slowphase", NULL};

struct comm {
    int ci;
    uint64_t hash;
    int n, crank, next, prev; /* next/prev are global ranks */
    void *ctx;
    const char *func;
};

struct op {
    struct comm *c;
    void *coll;
    int64_t k;
    int steps;
};

struct rank_ctx {
    const struct job_opts *o;
    struct shm *shm;
    struct fake_nccl nccl;
    struct comm comm[2];
    int r;
    struct op q[QCAP];
    int64_t qhead, qtail; /* written by app / proxy; read across: atomics */
    int app_done;
};

void job_defaults(struct job_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->ranks = 8;
    o->per_node = 2;
    o->ops = 12;
    o->inject = 8;
    o->victim = -1;
    o->hang_ms = 600;
    o->step_us = 300;
    o->delay_us = -1; /* per scenario: run_job picks */
    o->api = 5;
    o->node_index = -1;
    o->join_ms = 60000;
}

int parse_scenario(const char *s, enum scenario *out)
{
    for (int i = 0; scenario_names[i]; i++)
        if (strcmp(s, scenario_names[i]) == 0) {
            *out = (enum scenario)i;
            return 0;
        }
    return -1;
}

int node_of(const struct job_opts *o, int rank)
{
    return rank / o->per_node;
}

void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* One poll of a waiting thread: 200 us, and after BLOCKED_MS the thread is flagged stuck and
 * parked (10 ms polls), as a blocked rank costs no CPU: 200 us polls cost each thread ~3 % of a
 * core, near what the live watcher's busy check reads as a rank still computing
 * (live/hang/busy.py). *waited counts the short polls, up to BLOCKED_MS * 5. */
static void poll_once(int *waited, int *flag)
{
    sleep_us(*waited >= BLOCKED_MS * 5 ? 10000 : 200);
    if (*waited < BLOCKED_MS * 5 && ++*waited == BLOCKED_MS * 5)
        ST(flag, T_BLOCKED);
}

/* Wait for *p >= want (poll_once). */
static void wait_ge(int64_t *p, int64_t want, int *flag)
{
    int waited = 0;
    while (LD(p) < want)
        poll_once(&waited, flag);
    if (waited >= BLOCKED_MS * 5)
        ST(flag, T_RUN);
}

static void hang_forever(int *flag)
{
    ST(flag, T_BLOCKED);
    for (;;)
        sleep_us(10000);
}

static int is_fault(const struct rank_ctx *rc, enum scenario sc, const struct comm *c, int64_t k)
{
    const struct job_opts *o = rc->o;
    return o->sc == sc && rc->r == o->victim && c->ci == 0 && k == o->inject;
}

/* ---- proxy thread: kernel channels, proxy ops and ring steps of one collective -------- */
static void run_op(struct rank_ctx *rc, const struct op *op)
{
    const struct job_opts *o = rc->o;
    struct fake_nccl *n = &rc->nccl;
    struct comm *c = op->c;
    int r = rc->r, *flag = &rc->shm->proxy[r];
    int T = 2 * (c->n - 1), send_net = node_of(o, c->next) != node_of(o, r);
    int recv_net = node_of(o, c->prev) != node_of(o, r);
    int64_t base = op->k * T;
    void *kch[HARNESS_NCH], *pop_s[HARNESS_NCH] = {0}, *pop_r[HARNESS_NCH] = {0}, *rh[2 * MAXR] = {0};
    int posted = 0;
    struct hev e;

    for (int ch = 0; ch < HARNESS_NCH; ch++) {
        memset(&e, 0, sizeof(e));
        e.type = SATTR_EV_KERNEL_CH;
        e.parent = op->coll;
        e.ch = ch;
        e.ptimer = 1000u * (uint64_t)op->k + ch;
        kch[ch] = fake_start(n, c->ctx, &e);
        memset(&e, 0, sizeof(e));
        e.type = SATTR_EV_PROXY_OP;
        e.parent = op->coll;
        e.pid = getpid();
        e.ch = ch;
        e.nsteps = T / HARNESS_NCH;
        e.rank = c->crank;
        if (send_net) {
            e.is_send = 1;
            e.peer = (c->crank + 1) % c->n;
            pop_s[ch] = fake_start(n, c->ctx, &e);
            fake_state(n, pop_s[ch], SATTR_ST_PROXY_OP_IN_PROGRESS, 0, 0);
        }
        if (recv_net) {
            e.is_send = 0;
            e.peer = (c->crank + c->n - 1) % c->n;
            pop_r[ch] = fake_start(n, c->ctx, &e);
            fake_state(n, pop_r[ch], SATTR_ST_PROXY_OP_IN_PROGRESS, 0, 0);
        }
    }
    for (int t = 0; t < op->steps; t++) {
        void *sh = NULL;
        /* receives are posted ahead, at most NCCL_STEPS (8) in flight */
        for (; recv_net && posted < op->steps && posted < t + 8; posted++) {
            memset(&e, 0, sizeof(e));
            e.type = SATTR_EV_PROXY_STEP;
            e.parent = pop_r[posted % HARNESS_NCH];
            e.step = posted / HARNESS_NCH;
            rh[posted] = fake_start(n, c->ctx, &e);
            fake_state(n, rh[posted], SATTR_ST_RECV_WAIT, 0, 0);
        }
        if (send_net) {
            memset(&e, 0, sizeof(e));
            e.type = SATTR_EV_PROXY_STEP;
            e.parent = pop_s[t % HARNESS_NCH];
            e.step = t / HARNESS_NCH;
            sh = fake_start(n, c->ctx, &e);
            fake_state(n, sh, SATTR_ST_SEND_GPU_WAIT, 0, 0);
        }
        wait_ge(&rc->shm->recvd[c->ci][r], base + t, flag); /* the GPU has our data */
        if (send_net)
            fake_state(n, sh, SATTR_ST_SEND_PEER_WAIT, 0, 0);
        wait_ge(&rc->shm->launched[c->ci][c->next], op->k + 1, flag); /* receiver posted */
        if (send_net) {
            fake_state(n, sh, SATTR_ST_SEND_PEER_WAIT, 0, 0); /* NCCL repeats it per poll */
            fake_state(n, sh, SATTR_ST_SEND_WAIT, 1u << 19, 1);
        }
        if (is_fault(rc, SC_LINKSTALL, c, op->k) && t == T / 2)
            hang_forever(flag); /* posted to the network, never completes */
        if (send_net && o->sc == SC_SLOWLINK && r == o->victim && c->ci == 0)
            sleep_us(o->delay_us); /* a slow link: the send sits in SendWait this much longer */
        sleep_us(o->step_us);
        ST(&rc->shm->sent[c->ci][r], base + t + 1);
        if (sh)
            fake_stop(n, sh);
        wait_ge(&rc->shm->sent[c->ci][c->prev], base + t + 1, flag);
        if (recv_net) {
            fake_state(n, rh[t], SATTR_ST_RECV_FLUSH_WAIT, 1u << 19, 1);
            fake_state(n, rh[t], SATTR_ST_RECV_GPU_WAIT, 0, 0);
            fake_stop(n, rh[t]);
        }
        ST(&rc->shm->recvd[c->ci][r], base + t + 1);
    }
    for (int ch = 0; ch < HARNESS_NCH; ch++) {
        if (pop_s[ch])
            fake_stop(n, pop_s[ch]);
        if (pop_r[ch])
            fake_stop(n, pop_r[ch]);
        fake_state(n, kch[ch], SATTR_ST_KERNEL_CH_STOP, 1000u * (uint64_t)op->k + 500, 1);
        fake_stop(n, kch[ch]);
    }
}

static void *proxy_main(void *arg)
{
    struct rank_ctx *rc = arg;
    int *flag = &rc->shm->proxy[rc->r];
    int waited = 0;
    for (;;) {
        int64_t h = LD(&rc->qhead);
        if (LD(&rc->qtail) == h) {
            if (LD(&rc->app_done))
                break;
            /* idle past BLOCKED_MS: parked, as NCCL's proxy thread waits on a condition */
            poll_once(&waited, flag);
            continue;
        }
        if (waited >= BLOCKED_MS * 5)
            ST(flag, T_RUN);
        waited = 0;
        run_op(rc, &rc->q[h % QCAP]);
        ST(&rc->qhead, h + 1);
    }
    ST(flag, T_FINISHED);
    return NULL;
}

/* ---- application thread -------------------------------------------------------------- */
static void app_loop(struct rank_ctx *rc)
{
    const struct job_opts *o = rc->o;
    int *flag = &rc->shm->app[rc->r];
    for (int64_t k = 0; k < o->ops; k++) {
        for (int ci = 0; ci < 2; ci++) {
            struct comm *c = &rc->comm[ci];
            size_t count = HARNESS_COUNT;
            int T = 2 * (c->n - 1);
            if (is_fault(rc, SC_NONENTRY, c, k))
                hang_forever(flag); /* stuck on the CPU: never calls this AllReduce */
            if (is_fault(rc, SC_COUNT, c, k))
                count /= 2;
            if (o->sc == SC_STRAGGLER && rc->r == o->victim) {
                /* Late to every collective, as a slow host is: after every other member has
                 * entered it, then delay_us more. Last by construction: with a bare pause, a
                 * loaded machine that did not schedule another rank for longer than the pause
                 * made that rank last now and then. */
                for (int m = 0; m < o->ranks; m++)
                    if (m != rc->r && (ci == 0 || m % 2 == rc->r % 2))
                        wait_ge(&rc->shm->launched[c->ci][m], k + 1, flag);
                sleep_us(o->delay_us);
            }
            if (o->sc == SC_SLOWPHASE && k >= o->inject) {
                /* A slower phase of every rank (more compute per step, a slower input stage):
                 * each host waits for its previous collectives to complete, as at a loss.item(),
                 * then works delay_us before the launch. The wait keeps the ranks in step as a
                 * GPU job's collectives do: with a bare pause every rank's launches run free of
                 * the others (the proxy is idle, nothing holds them back), and on a loaded machine
                 * could drift apart until one entered last by more than the straggler's minimum
                 * gap: an S1 this scenario does not mean. */
                wait_ge(&rc->qhead, LD(&rc->qtail), flag);
                sleep_us(o->delay_us);
            }
            wait_ge(&rc->qhead, LD(&rc->qtail) - AHEAD, flag); /* CUDA queue depth */
            struct op *op = &rc->q[LD(&rc->qtail) % QCAP];
            op->c = c;
            op->k = k;
            op->steps = count == HARNESS_COUNT ? T : T / 2;
            op->coll = fake_collective(&rc->nccl, c->ctx, c->crank, c->func, (uint64_t)k, count,
                                       HARNESS_NCH, c->hash);
            ST(&rc->shm->launched[c->ci][rc->r], k + 1);
            ST(&rc->qtail, LD(&rc->qtail) + 1);
        }
    }
    ST(&rc->app_done, 1);
    ST(flag, T_FINISHED);
}

static void setenv_int(const char *name, long v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%ld", v);
    setenv(name, buf, 1);
}

int rank_main(const struct job_opts *o, struct shm *shm, int r)
{
    static struct rank_ctx rc; /* one per process */
    char dir[4096], node[32];
    pthread_t proxy;
    int mask = 0, half = r % 2;

    if (o->out != NULL) { /* a bundle of our own: the env a task of job 4242 would have */
        snprintf(node, sizeof(node), "node%d", node_of(o, r));
        snprintf(dir, sizeof(dir), "%s/nodes/%s/probe", o->out, node);
        setenv("SLURM_ATTR_PROBE_DIR", dir, 1);
        setenv("SLURMD_NODENAME", node, 1);
        setenv("SLURM_JOB_ID", "4242", 1);
        setenv("SLURM_STEP_ID", "0", 1);
    } /* else the real job's: the SPANK plugin's probe dir, this node's name, the job and step */
    /* one task per node runs us: the simulated rank is ours to name */
    setenv_int("SLURM_PROCID", r);
    setenv_int("RANK", r);
    setenv_int("LOCAL_RANK", r % o->per_node);
    setenv_int("WORLD_SIZE", o->ranks);
    rc.o = o;
    rc.shm = shm;
    rc.r = r;
    if (fake_load(&rc.nccl, o->plugin, o->api) != 0)
        return 2;
    rc.comm[0] = (struct comm){0, WORLD_HASH, o->ranks, r, (r + 1) % o->ranks,
                               (r + o->ranks - 1) % o->ranks, NULL, "AllReduce"};
    rc.comm[1] = (struct comm){1 + half, half ? ODD_HASH : EVEN_HASH, o->ranks / 2, r / 2,
                               (r + 2) % o->ranks, (r + o->ranks - 2) % o->ranks, NULL, "AllGather"};
    for (int ci = 0; ci < 2; ci++) {
        struct comm *c = &rc.comm[ci];
        c->ctx = fake_init(&rc.nccl, c->hash, o->ranks / o->per_node, c->n, c->crank,
                           ci ? "half" : "world", &mask);
        if (c->ctx == NULL || mask == 0) {
            fprintf(stderr, "probe_harness: rank %d: plugin init gave no context\n", r);
            return 3;
        }
    }
    if (pthread_create(&proxy, NULL, proxy_main, &rc) != 0)
        return 4;
    app_loop(&rc);
    pthread_join(proxy, NULL);
    fake_finalize(&rc.nccl, rc.comm[0].ctx);
    fake_finalize(&rc.nccl, rc.comm[1].ctx);
    fake_unload(&rc.nccl);
    return 0;
}
