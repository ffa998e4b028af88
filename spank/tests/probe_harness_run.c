/*
 * The simulated job's processes (the ranks themselves: probe_harness_job.c): one per rank,
 * forked here and sharing the job's state (struct shm). Once every rank is stuck and
 * nothing has moved for hang_ms, the parent SIGKILLs them all, as the epilog will find them.
 *
 * Node mode (node_index >= 0): a real multi-node Slurm job starts one harness process per
 * node (srun --ntasks-per-node=1), each forking its node's ranks only. The shared memory is
 * then a file all of them map, and they start their ranks together (the join counter). Each
 * process sees every rank's state, so all of them see the job hang; each waits for, kills
 * and reaps its own ranks.
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

static int mkdirs(const char *out, int nodes)
{
    char p[4096];
    snprintf(p, sizeof(p), "%s/nodes", out);
    if (mkdir(out, 0755) != 0 && errno != EEXIST)
        return -1;
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return -1;
    for (int i = 0; i < nodes; i++) {
        snprintf(p, sizeof(p), "%s/nodes/node%d", out, i);
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return -1;
        /* the probe dir itself is left to the plugin (the SPANK plugin creates it) */
    }
    return 0;
}

/* Anonymous memory, or the file path shared with the other node processes. The file is grown,
 * never cleared or shrunk: another node process may have joined and started its ranks by now.
 * Growing it to the size it already has changes nothing, so two first comers that both saw it
 * empty and both grow it are fine, and the bytes it gains read as zero. */
static struct shm *map_shm(const char *path)
{
    struct stat st;
    struct shm *m;
    int fd;

    if (path == NULL) {
        m = mmap(NULL, sizeof(*m), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "probe_harness: mmap: %s\n", strerror(errno));
            return NULL;
        }
        memset(m, 0, sizeof(*m));
        return m;
    }
    fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "probe_harness: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "probe_harness: %s is not a regular file\n", path);
        close(fd);
        return NULL;
    }
    if (st.st_size < (off_t)sizeof(*m) && ftruncate(fd, (off_t)sizeof(*m)) != 0) {
        fprintf(stderr, "probe_harness: cannot grow %s: %s\n", path, strerror(errno));
        close(fd);
        return NULL;
    }
    m = mmap(NULL, sizeof(*m), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd); /* the mapping keeps the file */
    if (m == MAP_FAILED) {
        fprintf(stderr, "probe_harness: cannot map %s: %s\n", path, strerror(errno));
        return NULL;
    }
    return m;
}

/* Start barrier: a rank waiting BLOCKED_MS counts as stuck, so no rank may start before the
 * other nodes' ranks are there to answer it (srun starts the node processes up to seconds
 * apart). Each process counts the nodes it plays: one in node mode, all of them otherwise (it
 * passes at once). 0 once all have come, -1 with a message. */
static int join_start(struct shm *shm, const struct job_opts *o, int nodes)
{
    int share = o->node_index < 0 ? nodes : 1;
    int n = __atomic_add_fetch(&shm->joined, share, __ATOMIC_ACQ_REL);

    if (n > nodes) { /* the barrier of a finished run: its ranks' counters are there too */
        fprintf(stderr, "probe_harness: %s: %d node processes joined, %d expected: left by an "
                        "earlier run? (remove it)\n", o->shm_path, n, nodes);
        return -1;
    }
    for (int ms = 0;; ms++) {
        int c = LD(&shm->joined);
        if (c >= nodes)
            return 0;
        if (ms >= o->join_ms) {
            /* Leave as if we never came, so a late peer waits and fails too instead of running
             * alone; unless it came just now (the exchange fails): then we all go. */
            if (__atomic_compare_exchange_n(&shm->joined, &c, c - share, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                fprintf(stderr, "probe_harness: node %d: %d of %d node processes came in %d ms\n",
                        o->node_index, c, nodes, o->join_ms);
                return -1;
            }
            continue;
        }
        sleep_us(1000);
    }
}

/* Whether rank r is this process's child. */
static int mine(const struct job_opts *o, int r)
{
    return o->node_index < 0 || node_of(o, r) == o->node_index;
}

/* Every counter the ranks advance: a job that moved between two looks is not hung. */
static int64_t progress(const struct shm *shm)
{
    int64_t sum = 0;
    for (int c = 0; c < NCOMM; c++)
        for (int r = 0; r < MAXR; r++)
            sum += LD(&shm->launched[c][r]) + LD(&shm->sent[c][r]) + LD(&shm->recvd[c][r]);
    return sum;
}

static int settled(const struct shm *shm, int ranks, int *any_blocked)
{
    *any_blocked = 0;
    for (int r = 0; r < ranks; r++) {
        int a = LD(&shm->app[r]), p = LD(&shm->proxy[r]);
        if (a == T_RUN || p == T_RUN)
            return 0;
        if (a == T_BLOCKED || p == T_BLOCKED)
            *any_blocked = 1;
    }
    return 1;
}

int run_job(const struct job_opts *o)
{
    struct shm *shm;
    pid_t pids[MAXR] = {0};
    int status, st[MAXR] = {0}, reaped[MAXR] = {0}, bad = 0, any_blocked = 0, killed = 0;
    int ticks = 0, max_ticks, nodes;
    const char *pdir = getenv("SLURM_ATTR_PROBE_DIR");

    if (o->ranks < 4 || o->ranks > MAXR || o->ranks % 2 || o->per_node < 1 ||
        o->ranks % o->per_node || o->inject >= o->ops) {
        fprintf(stderr, "probe_harness: bad job shape\n");
        return 2;
    }
    nodes = o->ranks / o->per_node;
    if (o->node_index >= 0 && o->shm_path == NULL) {
        fprintf(stderr, "probe_harness: --node-index needs --shm: the node processes share the "
                        "job's state through it\n");
        return 2;
    }
    if (o->node_index >= nodes) {
        fprintf(stderr, "probe_harness: --node-index %d: %d ranks, %d per node make nodes 0..%d\n",
                o->node_index, o->ranks, o->per_node, nodes - 1);
        return 2;
    }
    if (o->out == NULL && o->node_index < 0) {
        fprintf(stderr, "probe_harness: --out is needed unless --node-index plays one node of a "
                        "real job\n");
        return 2;
    }
    if (o->out == NULL && (pdir == NULL || *pdir == '\0')) {
        fprintf(stderr, "probe_harness: no --out and no SLURM_ATTR_PROBE_DIR: not in a job with "
                        "the probe on\n");
        return 2;
    }
    if (o->delay_us < 0 && (o->sc == SC_STRAGGLER || o->sc == SC_SLOWLINK || o->sc == SC_SLOWPHASE)) {
        fprintf(stderr, "probe_harness: %s needs a delay\n", scenario_names[o->sc]);
        return 2;
    }
    /* 60 s, and the time the injected delays add (collectives x steps x delay) */
    max_ticks = 6000 + (int)((int64_t)o->ops * 2 * 2 * o->ranks * (o->delay_us > 0 ? o->delay_us : 0) / 10000);
    /* without --out the SPANK plugin made the probe dir, and nothing else is ours to make */
    if (o->out != NULL && mkdirs(o->out, nodes) != 0) {
        fprintf(stderr, "probe_harness: cannot create %s: %s\n", o->out, strerror(errno));
        return 2;
    }
    if ((shm = map_shm(o->shm_path)) == NULL)
        return 2;
    if (join_start(shm, o, nodes) != 0) {
        munmap(shm, sizeof(*shm));
        return 2;
    }
    fflush(NULL);
    for (int r = 0; r < o->ranks; r++) {
        if (!mine(o, r))
            continue;
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(rank_main(o, shm, r));
        if (pids[r] < 0) {
            fprintf(stderr, "probe_harness: fork: %s\n", strerror(errno));
            for (int i = 0; i < r; i++)
                if (mine(o, i))
                    kill(pids[i], SIGKILL);
            return 2;
        }
    }
    /* settled() reads every rank's state, the other node processes' ranks' too: each process
     * sees the job hang; the rest is about its own ranks only */
    for (;;) {
        int alive = 0;
        for (int r = 0; r < o->ranks; r++) {
            if (!mine(o, r))
                continue;
            if (!reaped[r] && waitpid(pids[r], &st[r], WNOHANG) == pids[r])
                reaped[r] = 1;
            alive += !reaped[r];
        }
        if (alive == 0)
            break;
        if (o->sc == SC_KILLED && LD(&shm->launched[0][0]) >= o->inject)
            break; /* a healthy job killed mid-run (time limit, scancel) */
        if (o->sc != SC_KILLED && settled(shm, o->ranks, &any_blocked) && any_blocked) {
            /* One look is not a hang: a parked thread notices its peer's progress up to 10 ms
             * late (poll_once), and on a loaded machine every thread of a slow job can be
             * parked at once. Hung is settled with nothing moved over hang_ms. */
            int64_t before = progress(shm);
            sleep_us((long)o->hang_ms * 1000);
            ticks += o->hang_ms / 10;
            if (progress(shm) != before || !settled(shm, o->ranks, &any_blocked) || !any_blocked)
                continue;
            killed = 1;
            break;
        }
        if (++ticks > max_ticks) { /* the scenario never converged */
            fprintf(stderr, "probe_harness: %s: ranks neither finished nor hung\n",
                    scenario_names[o->sc]);
            bad = 1;
            break;
        }
        sleep_us(10000);
    }
    for (int r = 0; r < o->ranks; r++)
        if (mine(o, r) && !reaped[r]) {
            kill(pids[r], SIGKILL);
            if (waitpid(pids[r], &st[r], 0) == pids[r])
                reaped[r] = 1;
        }
    for (int r = 0; r < o->ranks; r++) {
        status = st[r];
        if (!mine(o, r) || !reaped[r])
            continue;
        if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
            fprintf(stderr, "probe_harness: rank %d exited with %d\n", r, WEXITSTATUS(status));
            bad = 1;
        } else if (WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL) {
            fprintf(stderr, "probe_harness: rank %d died of signal %d\n", r, WTERMSIG(status));
            bad = 1;
        }
    }
    if (SC_COMPLETES(o->sc) && killed) {
        fprintf(stderr, "probe_harness: %s: the job hung\n", scenario_names[o->sc]);
        bad = 1;
    }
    if (!SC_COMPLETES(o->sc) && o->sc != SC_KILLED && !killed && !bad) {
        fprintf(stderr, "probe_harness: %s: the job did not hang\n", scenario_names[o->sc]);
        bad = 1;
    }
    munmap(shm, sizeof(*shm));
    if (!o->quiet && o->node_index >= 0)
        printf("probe_harness: %s: node %d: %d of %d ranks %s\n", scenario_names[o->sc],
               o->node_index, o->per_node, o->ranks,
               bad ? "FAILED" : (killed ? "hung and SIGKILLed" : "done"));
    else if (!o->quiet)
        printf("probe_harness: %s: %d ranks %s\n", scenario_names[o->sc], o->ranks,
               bad ? "FAILED" : (killed ? "hung and SIGKILLed" : "done"));
    return bad;
}
