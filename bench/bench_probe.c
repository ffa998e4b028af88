/*
 * Cost of the NCCL profiler probe per callback, as NCCL would call it.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Ispank/probe bench/bench_probe.c -o spank/build/bench_probe -ldl -lpthread
 *   spank/build/bench_probe spank/build/libnccl-profiler-sattr.so [iterations]
 *
 * (bench/bench_probe.py builds and runs it.) Calls the newest table the library exports
 * (ncclProfiler_v6, else _v5: NCCL 2.29+ and 2.28 hand both the same layout for these
 * events). Measures the application path (the v5 sequence of one collective: 12 callbacks), the proxy path (a send and a receive step
 * through every wait state: 10 callbacks), the kernel-channel path (3 callbacks), then
 * the proxy path from 8 threads at once, each on its own communicator (several comms'
 * proxy threads in one process) and all on one communicator (worst case: layout version
 * 1 had every counter line bounce between the threads and lost counts; version 2 gives
 * each thread its own lane). Times are CPU time per callback (the contended figures: the
 * slowest thread). Also counts the send steps the record lost in the one-communicator
 * case (read back from the file, lanes merged: 0 unless a line was shared), and the
 * application path from 8 threads on their own communicators. Prints one JSON object.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sattr_nccl_abi.h"
#include "sattr_probe_layout.h"

#define NTHREADS 8
#define REPS 7

/* v6's members take a v6 descriptor; every event here is one of v5's, laid out as v5 lays it
 * out (the same offsets, pinned in sattr_nccl_abi.h), so one pointer type serves both. */
static sattr_profiler_v5 *P;
static long iters = 2000000;

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}


static void logger(int l, unsigned long f, const char *file, int line, const char *fmt, ...)
{
    (void)l, (void)f, (void)file, (void)line, (void)fmt;
}

static void *start(void *ctx, sattr_descr_v5 *d)
{
    void *h = NULL;
    P->startEvent(ctx, &h, d);
    return h;
}

/* One collective's application-side callbacks (v5 order); returns the Coll handle. */
static void *app_collective(void *ctx, uint64_t seq)
{
    /* per thread: the 8-thread case runs this from every thread */
    static _Thread_local sattr_descr_v5 g = {.type = SATTR_EV_GROUP_API, .groupApi = {.groupDepth = 1}};
    static _Thread_local sattr_descr_v5 ca = {
        .type = SATTR_EV_COLL_API, .collApi = {.func = "AllReduce", .count = 1 << 20, .datatype = "ncclFloat32"}};
    static _Thread_local sattr_descr_v5 kl = {.type = SATTR_EV_KERNEL_LAUNCH};
    static _Thread_local sattr_descr_v5 gr = {.type = SATTR_EV_GROUP};
    sattr_descr_v5 c = {.type = SATTR_EV_COLL,
                        .coll = {.seqNumber = seq, .func = "AllReduce", .count = 1 << 20,
                                 .datatype = "ncclFloat32", .nChannels = 16, .nWarps = 16,
                                 .algo = "RING", .proto = "SIMPLE"}};
    void *gh = start(ctx, &g), *h, *coll;
    P->recordEventState(gh, SATTR_ST_BEGIN_GROUP_API_END, NULL);
    ca.parentObj = gh;
    h = start(ctx, &ca);
    P->stopEvent(h);
    P->recordEventState(gh, SATTR_ST_END_GROUP_API_START, NULL);
    h = start(ctx, &kl);
    P->stopEvent(h);
    h = start(ctx, &gr);
    coll = start(ctx, &c);
    P->stopEvent(coll);
    P->stopEvent(h);
    P->stopEvent(gh);
    return coll;
}
#define APP_CALLBACKS 12

/* One send and one receive step through every state; returns nothing. */
static void proxy_steps(void *ctx, void *pop_s, void *pop_r, long i)
{
    sattr_descr_v5 st = {.type = SATTR_EV_PROXY_STEP, .proxyStep = {.step = (int)i}};
    sattr_state_args_v4 a = {.proxyStep = {.transSize = 1 << 19}};
    void *h;
    st.parentObj = pop_s;
    h = start(ctx, &st);
    P->recordEventState(h, SATTR_ST_SEND_GPU_WAIT, NULL);
    P->recordEventState(h, SATTR_ST_SEND_PEER_WAIT, NULL);
    P->recordEventState(h, SATTR_ST_SEND_WAIT, &a);
    P->stopEvent(h);
    st.parentObj = pop_r;
    h = start(ctx, &st);
    P->recordEventState(h, SATTR_ST_RECV_WAIT, NULL);
    P->recordEventState(h, SATTR_ST_RECV_FLUSH_WAIT, &a);
    P->recordEventState(h, SATTR_ST_RECV_GPU_WAIT, NULL);
    P->stopEvent(h);
}
#define PROXY_CALLBACKS 10

struct worker {
    void *ctx;
    long n;
    double secs;
};

static void *proxy_worker(void *arg)
{
    struct worker *w = arg;
    void *coll = app_collective(w->ctx, 0);
    sattr_descr_v5 op = {.type = SATTR_EV_PROXY_OP, .parentObj = coll,
                         .proxyOp = {.pid = getpid(), .channelId = 3, .peer = 1, .nSteps = 8, .isSend = 1}};
    void *pop_s = start(w->ctx, &op), *pop_r;
    op.proxyOp.isSend = 0;
    op.proxyOp.peer = 7;
    pop_r = start(w->ctx, &op);
    /* thread CPU time: with more threads than cores, wall time would measure the
     * scheduler; CPU time still includes every cache-line transfer between cores. */
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < w->n; i++)
        proxy_steps(w->ctx, pop_s, pop_r, i);
    w->secs = clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
    return NULL;
}

static void *app_worker(void *arg)
{
    struct worker *w = arg;
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < w->n; i++)
        app_collective(w->ctx, (uint64_t)i);
    w->secs = clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
    return NULL;
}

/* NTHREADS threads on the given contexts: the slowest thread's CPU ns per callback. */
static double contended_on(void **ctxs, void *(*fn)(void *), int callbacks)
{
    pthread_t th[NTHREADS];
    struct worker w[NTHREADS];
    double worst = 0;
    for (int i = 0; i < NTHREADS; i++) {
        w[i] = (struct worker){ctxs[i], iters / (4 * REPS), 0};
        pthread_create(&th[i], NULL, fn, &w[i]);
    }
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(th[i], NULL);
        double ns = w[i].secs * 1e9 / ((double)w[i].n * callbacks);
        if (ns > worst)
            worst = ns;
    }
    return worst;
}

static double contended(void **ctxs)
{
    return contended_on(ctxs, proxy_worker, PROXY_CALLBACKS);
}

/* Send steps completed in slot 0 of the record, its pool lanes added (layout v2; a
 * version 1 record, of an older plugin run for comparison, has no pool). */
static uint64_t sends_done(const char *path)
{
    struct stat st;
    uint64_t n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size < (off_t)SATTR_PROBE_V1_FILE_SIZE) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    const char *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return 0;
    const struct sattr_slot *s = (const void *)(m + SATTR_PROBE_HDR_SIZE);
    const struct sattr_lane *l = (const void *)(m + SATTR_PROBE_LANES_OFF);
    n = s->send_done;
    for (unsigned k = 0; st.st_size >= (off_t)SATTR_PROBE_FILE_SIZE && k < SATTR_PROBE_NLANES; k++)
        if ((l[k].bind & 0xffffffffu) == 1)
            n += l[k].net.send_done;
    munmap((void *)m, (size_t)st.st_size);
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One repetition of a single-thread path: CPU ns per callback. */
static double once(int which, void *ctx, long n)
{
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    if (which == 0) {
        for (long i = 0; i < n; i++)
            app_collective(ctx, (uint64_t)i);
        return (clock_s(CLOCK_THREAD_CPUTIME_ID) - t0) * 1e9 / ((double)n * APP_CALLBACKS);
    }
    if (which == 1) {
        struct worker w = {ctx, n, 0};
        proxy_worker(&w);
        return w.secs * 1e9 / ((double)n * PROXY_CALLBACKS);
    }
    void *coll = app_collective(ctx, 0);
    sattr_descr_v5 k = {.type = SATTR_EV_KERNEL_CH, .parentObj = coll, .kernelCh = {.channelId = 5, .pTimer = 1}};
    sattr_state_args_v4 ka = {.kernelCh = {.pTimer = 2}};
    t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < n; i++) {
        void *h = start(ctx, &k);
        P->recordEventState(h, SATTR_ST_KERNEL_CH_STOP, &ka);
        P->stopEvent(h);
    }
    return (clock_s(CLOCK_THREAD_CPUTIME_ID) - t0) * 1e9 / ((double)n * 3);
}

/* min and median over REPS repetitions (the machine may be shared: min is the cost). */
static void stats(double *v, double *min, double *med)
{
    qsort(v, REPS, sizeof(double), cmp_double);
    *min = v[0];
    *med = v[REPS / 2];
}

int main(int argc, char **argv)
{
    char dir[] = "/tmp/bench_probe.XXXXXX", path[4096];
    void *dl, *ctx, *ctxs[NTHREADS], *same[NTHREADS];
    int mask = 0;
    double v[4][REPS], r[4][2];
    struct stat st;
    static const char *const names[] = {"app", "proxy", "kernel"};
    const char *table;

    if (argc < 2)
        return fprintf(stderr, "usage: bench_probe LIB [iterations]\n"), 2;
    if (argc > 2)
        iters = atol(argv[2]);
    if (mkdtemp(dir) == NULL)
        return 2;
    setenv("SLURM_ATTR_PROBE_DIR", dir, 1);
    setenv("RANK", "0", 1);
    if ((dl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL)) == NULL)
        return fprintf(stderr, "bench_probe: %s\n", dlerror()), 2;
    if ((P = dlsym(dl, table = "ncclProfiler_v6")) == NULL && (P = dlsym(dl, table = "ncclProfiler_v5")) == NULL)
        return fprintf(stderr, "bench_probe: %s exports neither ncclProfiler_v6 nor _v5\n", argv[1]), 2;
    P->init(&ctx, 0x1234, &mask, "bench", 2, 16, 0, logger);
    for (int i = 0; i < NTHREADS; i++) {
        P->init(&ctxs[i], 0x5000 + (uint64_t)i, &mask, "multi", 2, 16, 0, logger);
        same[i] = ctx;
    }
    if (ctx == NULL || mask == 0)
        return fprintf(stderr, "bench_probe: the probe did not initialise\n"), 2;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < REPS; i++)
            v[k][i] = once(k, ctx, iters / REPS);
        stats(v[k], &r[k][0], &r[k][1]);
    }
    for (int i = 0; i < REPS; i++)
        v[3][i] = contended(ctxs);
    stats(v[3], &r[3][0], &r[3][1]);
    double one_comm[REPS], oc_min, oc_med;
    snprintf(path, sizeof(path), "%s/rank0.pid%d.probe", dir, (int)getpid());
    uint64_t done0 = sends_done(path);
    for (int i = 0; i < REPS; i++)
        one_comm[i] = contended(same);
    stats(one_comm, &oc_min, &oc_med);
    long long lost = (long long)REPS * NTHREADS * (iters / (4 * REPS)) - (long long)(sends_done(path) - done0);
    /* the application side from 8 threads, each on its own communicator (several process
     * groups launching from their own threads) */
    double app8[REPS], a8_min, a8_med;
    for (int i = 0; i < REPS; i++)
        app8[i] = contended_on(ctxs, app_worker, APP_CALLBACKS);
    stats(app8, &a8_min, &a8_med);

    if (stat(path, &st) != 0)
        st.st_size = -1;
    printf("{\"table\": \"%s\", \"iterations\": %ld, \"reps\": %d, \"cpus\": %ld, \"file_bytes\": %lld",
           table, iters, REPS, sysconf(_SC_NPROCESSORS_ONLN), (long long)st.st_size);
    for (int k = 0; k < 3; k++)
        printf(", \"%s_ns\": {\"min\": %.1f, \"median\": %.1f}", names[k], r[k][0], r[k][1]);
    printf(", \"proxy_8_threads_own_comms_ns\": {\"min\": %.1f, \"median\": %.1f}", r[3][0], r[3][1]);
    printf(", \"proxy_8_threads_one_comm_ns\": {\"min\": %.1f, \"median\": %.1f}", oc_min, oc_med);
    printf(", \"proxy_8_threads_one_comm_sends_lost\": %lld", lost);
    printf(", \"app_8_threads_own_comms_ns\": {\"min\": %.1f, \"median\": %.1f}}\n", a8_min, a8_med);
    unlink(path);
    rmdir(dir);
    return 0;
}
