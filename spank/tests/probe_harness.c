/*
 * probe_harness: drives the NCCL profiler probe without a GPU.
 *
 *   probe_harness run --plugin LIB --out DIR --scenario S [--ranks 8] [--per-node 2]
 *                     [--ops 12] [--inject 8] [--victim R] [--hang-ms 600] [--step-us 300]
 *                     [--delay-us N] [--api 6]
 *       play one scenario (healthy, nonentry, count, linkstall, killed, straggler, slowlink,
 *       slowphase) as a job whose records land in DIR/nodes/<node>/probe/, as the epilog will
 *       collect them; straggler: the victim (5) enters every collective --delay-us (20000) after
 *       the others; slowlink: each network send of the victim (3) to its world successor takes
 *       --delay-us (2000) longer; slowphase: from iteration --inject on, every rank pauses
 *       --delay-us (30000) before each collective (two per iteration: ~72 ms per iteration against
 *       ~12 ms before, well past the live watch's phase_factor of 3). All three complete.
 *   probe_harness run --plugin LIB [--out DIR] --scenario S --shm PATH --node-index I [options]
 *       node mode, one harness process per node of a real multi-node job, e.g.
 *         srun -N2 --ntasks-per-node=1 probe_harness run ... --ranks 8 --per-node 4 \
 *              --shm /dev/shm/x --node-index $SLURM_NODEID
 *       forks only node I's ranks (I < ranks / per-node). The processes share the job's state
 *       in the file PATH (created by the first, grown, never cleared: the caller removes it
 *       after the job, and gives each job a new one) and start their ranks once all have come
 *       (60 s at most, else exit 2). With --out, records land as above; without it, where the
 *       job's SLURM_ATTR_PROBE_DIR says, under the job's node name, job and step (only the
 *       rank's SLURM_PROCID, RANK, LOCAL_RANK, WORLD_SIZE are the harness's). Exit status and
 *       last line are this process's and its ranks'. --shm alone: one process, state in PATH.
 *   probe_harness selftest --plugin LIB [--quick] [--keep]
 *       every scenario and the robustness cases, checked; ends with "N passed, M failed"
 *   probe_harness layout
 *       the record layout as JSON, for the Python reader's cross-check
 */
#include <errno.h>
#include <ftw.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe_harness.h"

static int default_victim(enum scenario sc)
{
    return sc == SC_COUNT || sc == SC_STRAGGLER                      ? 5
           : sc == SC_HEALTHY || sc == SC_KILLED || sc == SC_SLOWPHASE ? -1 /* nobody to blame */
                                                                        : 3;
}

static int default_delay_us(enum scenario sc)
{
    /* slowphase: 2 x 30 ms per iteration on a ~12 ms healthy one here, so the period stays
     * over 3x (phase_factor) even when a loaded machine doubles the healthy one */
    return sc == SC_STRAGGLER ? 20000 : sc == SC_SLOWLINK ? 2000 : sc == SC_SLOWPHASE ? 30000 : 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: probe_harness run --plugin LIB --out DIR --scenario S [options]\n"
                    "       probe_harness run --plugin LIB [--out DIR] --scenario S --shm PATH\n"
                    "                         --node-index I [options]\n"
                    "       probe_harness selftest --plugin LIB [--quick] [--keep]\n"
                    "       probe_harness lanes --plugin LIB --out DIR\n"
                    "       probe_harness layout\n");
    return 2;
}

static int int_arg(const char *v, int lo, int hi, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x < lo || x > hi)
        return -1;
    *out = (int)x;
    return 0;
}

static int parse_job(int argc, char **argv, struct job_opts *o)
{
    int victim_set = 0, delay_set = 0;
    job_defaults(o);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (v == NULL)
            return -1;
        if (!strcmp(a, "--plugin"))
            o->plugin = v;
        else if (!strcmp(a, "--out"))
            o->out = v;
        else if (!strcmp(a, "--scenario"))
            rc = parse_scenario(v, &o->sc);
        else if (!strcmp(a, "--ranks"))
            rc = int_arg(v, 4, 64, &o->ranks);
        else if (!strcmp(a, "--per-node"))
            rc = int_arg(v, 1, 64, &o->per_node);
        else if (!strcmp(a, "--ops"))
            rc = int_arg(v, 1, 100000, &o->ops);
        else if (!strcmp(a, "--inject"))
            rc = int_arg(v, 0, 100000, &o->inject);
        else if (!strcmp(a, "--victim"))
            rc = int_arg(v, 0, 63, &o->victim), victim_set = 1;
        else if (!strcmp(a, "--hang-ms"))
            rc = int_arg(v, 0, 60000, &o->hang_ms);
        else if (!strcmp(a, "--step-us"))
            rc = int_arg(v, 0, 1000000, &o->step_us);
        else if (!strcmp(a, "--delay-us"))
            rc = int_arg(v, 0, 10000000, &o->delay_us), delay_set = 1;
        else if (!strcmp(a, "--api"))
            rc = int_arg(v, 3, 6, &o->api);
        else if (!strcmp(a, "--shm"))
            o->shm_path = v;
        else if (!strcmp(a, "--node-index"))
            rc = int_arg(v, 0, 63, &o->node_index);
        else
            return -1;
        if (rc != 0)
            return -1;
        i++;
    }
    if (!victim_set)
        o->victim = default_victim(o->sc);
    if (!delay_set)
        o->delay_us = default_delay_us(o->sc);
    /* run_job says why a combination does not hold */
    return o->plugin && (o->out || o->node_index >= 0) ? 0 : -1;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* A scenario as the self-test plays it. */
static void scenario_opts(struct job_opts *o, const char *plugin, enum scenario sc, int api, int quick)
{
    job_defaults(o);
    o->plugin = plugin;
    o->sc = sc;
    o->api = api;
    o->victim = default_victim(sc);
    o->delay_us = default_delay_us(sc);
    o->quiet = 1;
    if (quick) { /* ThreadSanitizer runs are ~10x slower */
        o->ops = 6;
        o->inject = 4;
        o->hang_ms = 300;
        if (sc == SC_SLOWPHASE)
            o->delay_us *= 10; /* the jump is against a healthy period that is 10x longer too */
    }
    if (sc == SC_STRAGGLER || sc == SC_SLOWPHASE) {
        /* The phase checks compare the shortest world periods before and after the inject:
         * 11 intervals each side (the header ring holds the 48 entries of both communicators).
         * With 1 or 3 after it, one load stall of a pause there made a jump. */
        o->ops = 24;
        o->inject = 12;
    }
}

/* The env a task of job `job` has on node `node` with the probe on: the probe dir the SPANK
 * plugin made, under dir as --out would put it (so the same checks read it). */
static int job_env(const char *dir, int node, long job)
{
    char p[4096], name[32], id[32];
    snprintf(name, sizeof(name), "node%d", node);
    snprintf(id, sizeof(id), "%ld", job);
    /* each level down to the probe dir (a format each, `name` unused by the first two) */
    const char *const parts[] = {"%s", "%s/nodes", "%s/nodes/%s", "%s/nodes/%s/probe"};
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        snprintf(p, sizeof(p), parts[i], dir, name);
        if (mkdir(p, i == 3 ? 0700 : 0755) != 0 && errno != EEXIST)
            return -1;
    }
    setenv("SLURM_ATTR_PROBE_DIR", p, 1);
    setenv("SLURMD_NODENAME", name, 1);
    setenv("SLURM_JOB_ID", id, 1);
    setenv("SLURM_STEP_ID", "0", 1);
    return 0;
}

/* Node mode as `srun -N<nodes> --ntasks-per-node=1` starts it: a process per node, each playing
 * its node's ranks through o->shm_path. env_job != 0: without --out, each in the env a task of
 * that job has (job_env). 0 when every node process exited 0. */
static int run_nodes(const struct job_opts *base, const char *dir, long env_job)
{
    int nodes = base->ranks / base->per_node, started, bad = 0;
    pid_t pids[64];

    fflush(NULL);
    for (started = 0; started < nodes; started++) {
        pid_t pid = fork();
        if (pid == 0) {
            struct job_opts o = *base;
            int rc = 2;
            o.node_index = started;
            if (env_job != 0)
                o.out = NULL;
            if (env_job == 0 || job_env(dir, started, env_job) == 0)
                rc = run_job(&o);
            fflush(NULL);
            _exit(rc);
        }
        if (pid < 0) { /* those started give up at the start barrier */
            bad = 1;
            break;
        }
        pids[started] = pid;
    }
    for (int i = 0; i < started; i++) {
        int st;
        if (waitpid(pids[i], &st, 0) != pids[i] || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad = 1;
    }
    return bad;
}

#define NARGS(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int count_records(const char *out)
{
    struct rank_rec recs[64];
    int n = load_records(out, recs, 64);
    free_records(recs, 64);
    return n;
}

/* What node mode refuses before any rank runs, and its start barrier. */
static void check_node_refusals(struct tally *t, const char *plugin, const char *tmp)
{
    char out[4096], shm[4096 + 8], *saved;
    struct job_opts o;

    snprintf(out, sizeof(out), "%s/refused", tmp);
    snprintf(shm, sizeof(shm), "%s.shm", out);
    char *no_shm[] = {"probe_harness", "run", "--plugin", (char *)plugin, "--out", out, "--scenario",
                      "healthy", "--ranks", "8", "--per-node", "4", "--node-index", "0"};
    check(t, parse_job(NARGS(no_shm), no_shm, &o) == 0 && run_job(&o) == 2 && access(out, F_OK) != 0,
          "node mode: --node-index without --shm is refused");
    char *past[] = {"probe_harness", "run", "--plugin", (char *)plugin, "--out", out, "--scenario",
                    "healthy", "--ranks", "8", "--per-node", "4", "--shm", shm, "--node-index", "2"};
    check(t, parse_job(NARGS(past), past, &o) == 0 && run_job(&o) == 2 && access(shm, F_OK) != 0 &&
                 access(out, F_OK) != 0,
          "node mode: --node-index 2 of 8 ranks, 4 per node is refused");
    char *no_out[] = {"probe_harness", "run", "--plugin", (char *)plugin, "--scenario", "healthy"};
    check(t, parse_job(NARGS(no_out), no_out, &o) != 0 && run_job(&o) == 2,
          "no --out without --node-index is refused");
    saved = getenv("SLURM_ATTR_PROBE_DIR") ? strdup(getenv("SLURM_ATTR_PROBE_DIR")) : NULL;
    unsetenv("SLURM_ATTR_PROBE_DIR");
    char *no_dir[] = {"probe_harness", "run", "--plugin", (char *)plugin, "--scenario", "healthy",
                      "--ranks", "8", "--per-node", "4", "--shm", shm, "--node-index", "0"};
    check(t, parse_job(NARGS(no_dir), no_dir, &o) == 0 && run_job(&o) == 2 && access(shm, F_OK) != 0,
          "node mode: without --out, no SLURM_ATTR_PROBE_DIR is refused");
    if (saved != NULL)
        setenv("SLURM_ATTR_PROBE_DIR", saved, 1);
    free(saved);

    /* the barrier: node 0 alone waits, then gives up before any rank ran */
    snprintf(out, sizeof(out), "%s/alone", tmp);
    snprintf(shm, sizeof(shm), "%s.shm", out);
    char *alone[] = {"probe_harness", "run", "--plugin", (char *)plugin, "--out", out, "--scenario",
                     "healthy", "--ranks", "8", "--per-node", "4", "--shm", shm, "--node-index", "0"};
    if (parse_job(NARGS(alone), alone, &o) != 0)
        return;
    o.quiet = 1;
    o.join_ms = 100;
    check(t, run_job(&o) == 2 && count_records(out) == 0,
          "node mode: node 0 alone waits %d ms at the start, then gives up, no rank run", o.join_ms);
    /* ... and left: node 1 coming later waits for node 0 as well, instead of running alone */
    o.node_index = 1;
    check(t, run_job(&o) == 2 && count_records(out) == 0,
          "node mode: node 1 coming after node 0 gave up waits and gives up too");
    unlink(shm);
}

static int selftest(int argc, char **argv)
{
    const char *plugin = NULL;
    int quick = 0, keep = 0;
    char tmp[] = "/tmp/probe_harness.XXXXXX", out[4096];
    struct tally t = {0};
    static const struct {
        enum scenario sc;
        int api;
    } plan[] = {{SC_HEALTHY, 5}, {SC_NONENTRY, 5}, {SC_COUNT, 5}, {SC_LINKSTALL, 5},
                {SC_KILLED, 5}, {SC_HEALTHY, 4}, {SC_LINKSTALL, 4}, {SC_NONENTRY, 3},
                {SC_STRAGGLER, 5}, {SC_SLOWLINK, 5}, {SC_SLOWPHASE, 5},
                {SC_HEALTHY, 6}, {SC_NONENTRY, 6}, {SC_COUNT, 6}, {SC_LINKSTALL, 6}};
    /* node mode: two node processes of 4 ranks (the ring edges 3->4 and 7->0 cross nodes) must
     * leave records the single-process checks cannot tell apart; the last one without --out,
     * in a real job's env (its job id, not the harness's 4242) */
    static const struct {
        enum scenario sc;
        long env_job;
    } nplan[] = {{SC_NONENTRY, 0}, {SC_HEALTHY, 0}, {SC_LINKSTALL, 0}, {SC_HEALTHY, 4343}};

    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--plugin") && i + 1 < argc)
            plugin = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--keep"))
            keep = 1;
        else
            return usage();
    }
    if (plugin == NULL || mkdtemp(tmp) == NULL)
        return usage();
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (size_t i = 0; i < sizeof(plan) / sizeof(plan[0]); i++) {
        struct job_opts o;
        scenario_opts(&o, plugin, plan[i].sc, plan[i].api, quick);
        snprintf(out, sizeof(out), "%s/%s-v%d", tmp, scenario_names[o.sc], o.api);
        o.out = out;
        check(&t, run_job(&o) == 0, "%s (v%d): job played out", scenario_names[o.sc], o.api);
        check_scenario(&t, &o);
        check_identity(&t, &o, 4242);
    }
    for (size_t i = 0; i < sizeof(nplan) / sizeof(nplan[0]); i++) {
        struct job_opts o;
        char shm[4096 + 8];
        const char *sc = scenario_names[nplan[i].sc];
        scenario_opts(&o, plugin, nplan[i].sc, 5, quick);
        o.per_node = 4;
        snprintf(out, sizeof(out), "%s/%s-nodes%s", tmp, sc, nplan[i].env_job ? "-env" : "");
        snprintf(shm, sizeof(shm), "%s.shm", out);
        o.out = out;
        o.shm_path = shm;
        check(&t, run_nodes(&o, out, nplan[i].env_job) == 0, "%s (v5): job played out by 2 node "
              "processes%s", sc, nplan[i].env_job ? ", without --out in the job's env" : "");
        check_scenario(&t, &o);
        check_identity(&t, &o, nplan[i].env_job ? (uint64_t)nplan[i].env_job : 4242);
        if (i == 0) { /* its join count says so: its ranks' counters would mislead ours */
            o.node_index = 0;
            check(&t, run_job(&o) == 2, "node mode: a --shm file a run has used is refused");
        }
        unlink(shm); /* the caller's part */
    }
    check_node_refusals(&t, plugin, tmp);
    check_robustness(&t, plugin, tmp);
    if (!keep && t.failed == 0)
        nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    else
        printf("records kept in %s\n", tmp);
    tally_summary(&t);
    return t.failed != 0;
}

#define F(T, m) printf("%s\"%s\": %zu", first ? "" : ", ", #m, offsetof(T, m)), first = 0
static int layout(void)
{
    int first;
    printf("{\"magic\": \"%s\", \"layout_ver\": %u, \"hdr_size\": %u, \"slot_size\": %u, "
           "\"nslots\": %u, \"file_size\": %u, \"hring\": %u, \"opring\": %u, \"nchan\": %u, "
           "\"npeers\": %u, \"nlanes\": %u, \"lane_size\": %u, \"lanes_off\": %u,\n",
           SATTR_PROBE_MAGIC_STR, SATTR_PROBE_LAYOUT_VER, SATTR_PROBE_HDR_SIZE,
           SATTR_PROBE_SLOT_SIZE, SATTR_PROBE_NSLOTS, SATTR_PROBE_FILE_SIZE, SATTR_PROBE_HRING,
           SATTR_PROBE_OPRING, SATTR_PROBE_NCHAN, SATTR_PROBE_NPEERS, SATTR_PROBE_NLANES,
           SATTR_PROBE_LANE_SIZE, SATTR_PROBE_LANES_OFF);
    printf(" \"hdr\": {"), first = 1;
    F(struct sattr_hdr, magic); F(struct sattr_hdr, layout_ver); F(struct sattr_hdr, hdr_size);
    F(struct sattr_hdr, slot_size); F(struct sattr_hdr, nslots); F(struct sattr_hdr, file_size);
    F(struct sattr_hdr, pid); F(struct sattr_hdr, global_rank); F(struct sattr_hdr, local_rank);
    F(struct sattr_hdr, world_size); F(struct sattr_hdr, job_id); F(struct sattr_hdr, step_id);
    F(struct sattr_hdr, nccl_version); F(struct sattr_hdr, create_rt_ns);
    F(struct sattr_hdr, create_mono_ns); F(struct sattr_hdr, heartbeat_ns);
    F(struct sattr_hdr, event_mask); F(struct sattr_hdr, api_ver); F(struct sattr_hdr, hostname);
    F(struct sattr_hdr, nslots_used); F(struct sattr_hdr, flags); F(struct sattr_hdr, ring_head);
    F(struct sattr_hdr, pxn_foreign); F(struct sattr_hdr, dropped_total);
    F(struct sattr_hdr, node_name); F(struct sattr_hdr, slurm_procid); F(struct sattr_hdr, win_ms);
    F(struct sattr_hdr, clock_id); F(struct sattr_hdr, inits); F(struct sattr_hdr, proc_nonce);
    F(struct sattr_hdr, lanes_used); F(struct sattr_hdr, lanes_full); F(struct sattr_hdr, ring);
    printf("},\n \"hring_ent\": {"), first = 1;
    F(struct sattr_hring_ent, tag); F(struct sattr_hring_ent, slot); F(struct sattr_hring_ent, func);
    F(struct sattr_hring_ent, dtype); F(struct sattr_hring_ent, kind);
    F(struct sattr_hring_ent, root_or_peer); F(struct sattr_hring_ent, nch);
    F(struct sattr_hring_ent, algo); F(struct sattr_hring_ent, proto);
    F(struct sattr_hring_ent, comm_hash); F(struct sattr_hring_ent, seq);
    F(struct sattr_hring_ent, count); F(struct sattr_hring_ent, start_ns); F(struct sattr_hring_ent, opi);
    printf("},\n \"slot\": {"), first = 1;
    F(struct sattr_slot, comm_hash); F(struct sattr_slot, state); F(struct sattr_slot, api_ver);
    F(struct sattr_slot, rank); F(struct sattr_slot, nranks); F(struct sattr_slot, nnodes);
    F(struct sattr_slot, lane_owner);
    F(struct sattr_slot, init_ns); F(struct sattr_slot, fini_ns); F(struct sattr_slot, comm_name);
    F(struct sattr_slot, coll_api_enter); F(struct sattr_slot, coll_api_exit);
    F(struct sattr_slot, p2p_api_enter); F(struct sattr_slot, p2p_api_exit);
    F(struct sattr_slot, group_api_enter); F(struct sattr_slot, group_api_exit);
    F(struct sattr_slot, last_api_ns); F(struct sattr_slot, graph_captured);
    F(struct sattr_slot, api_last_func); F(struct sattr_slot, api_func);
    F(struct sattr_slot, api_last_count); F(struct sattr_slot, func_seq);
    F(struct sattr_slot, coll_tasks); F(struct sattr_slot, p2p_tasks); F(struct sattr_slot, last_task_ns);
    F(struct sattr_slot, op_count); F(struct sattr_slot, last_seq); F(struct sattr_slot, last_func);
    F(struct sattr_slot, last_dtype); F(struct sattr_slot, last_count); F(struct sattr_slot, last_root);
    F(struct sattr_slot, last_peer); F(struct sattr_slot, last_start_ns); F(struct sattr_slot, op_digest);
    F(struct sattr_slot, ce_tasks);
    F(struct sattr_slot, kch_started); F(struct sattr_slot, kch_stopped);
    F(struct sattr_slot, kch_inflight); F(struct sattr_slot, kch_cur); F(struct sattr_slot, kch_done);
    F(struct sattr_slot, kch_start_ptimer); F(struct sattr_slot, kch_stop_ptimer);
    F(struct sattr_slot, kch_last_ns); F(struct sattr_slot, send_posted); F(struct sattr_slot, send_done);
    F(struct sattr_slot, recv_posted); F(struct sattr_slot, recv_done); F(struct sattr_slot, send_bytes);
    F(struct sattr_slot, recv_bytes); F(struct sattr_slot, pop_started); F(struct sattr_slot, pop_stopped);
    F(struct sattr_slot, in_state); F(struct sattr_slot, steps_dropped); F(struct sattr_slot, peers_dropped);
    F(struct sattr_slot, last_progress_ns); F(struct sattr_slot, last_send_done_ns);
    F(struct sattr_slot, last_recv_done_ns); F(struct sattr_slot, win_start_ns);
    F(struct sattr_slot, win_ms); F(struct sattr_slot, win_closed); F(struct sattr_slot, win_send_steps);
    F(struct sattr_slot, win_recv_steps); F(struct sattr_slot, win_send_bytes);
    F(struct sattr_slot, win_recv_bytes); F(struct sattr_slot, base_send_steps);
    F(struct sattr_slot, base_recv_steps); F(struct sattr_slot, ops); F(struct sattr_slot, chan);
    F(struct sattr_slot, peers);
    printf("},\n \"lane\": {"), first = 1;
    F(struct sattr_lane, bind); F(struct sattr_lane, claims); F(struct sattr_lane, net);
    F(struct sattr_lane, net.send_posted); F(struct sattr_lane, net.in_state);
    F(struct sattr_lane, net.last_progress_ns); F(struct sattr_lane, net.win_start_ns);
    F(struct sattr_lane, net.base_recv_bytes); F(struct sattr_lane, peers);
    printf("},\n \"op_ent\": {"), first = 1;
    F(struct sattr_op_ent, tag); F(struct sattr_op_ent, func); F(struct sattr_op_ent, dtype);
    F(struct sattr_op_ent, algo); F(struct sattr_op_ent, proto); F(struct sattr_op_ent, root);
    F(struct sattr_op_ent, nch); F(struct sattr_op_ent, nwarps); F(struct sattr_op_ent, flags);
    F(struct sattr_op_ent, count); F(struct sattr_op_ent, seq);
    printf("},\n \"peer\": {"), first = 1;
    F(struct sattr_peer, key); F(struct sattr_peer, last_ch); F(struct sattr_peer, kind);
    F(struct sattr_peer, send_posted); F(struct sattr_peer, send_done); F(struct sattr_peer, recv_posted);
    F(struct sattr_peer, recv_done); F(struct sattr_peer, wait); F(struct sattr_peer, last_send_ms);
    F(struct sattr_peer, last_recv_ms); F(struct sattr_peer, p2p_ops);
    printf("},\n \"sizes\": {\"hring_ent\": %zu, \"op_ent\": %zu, \"chan\": %zu, \"peer\": %zu}}\n",
           sizeof(struct sattr_hring_ent), sizeof(struct sattr_op_ent), sizeof(struct sattr_chan),
           sizeof(struct sattr_peer));
    return 0;
}

int main(int argc, char **argv)
{
    struct job_opts o;
    if (argc < 2)
        return usage();
    if (!strcmp(argv[1], "layout"))
        return layout();
    if (!strcmp(argv[1], "lanes")) { /* one record written by 8 threads on one communicator */
        struct tally t = {0};
        if (argc != 6 || strcmp(argv[2], "--plugin") || strcmp(argv[4], "--out"))
            return usage();
        setvbuf(stdout, NULL, _IOLBF, 0);
        check_lanes_record(&t, argv[3], argv[5]);
        tally_summary(&t);
        return t.failed != 0;
    }
    if (!strcmp(argv[1], "selftest"))
        return selftest(argc, argv);
    if (!strcmp(argv[1], "run")) {
        if (parse_job(argc, argv, &o) != 0)
            return usage();
        return run_job(&o);
    }
    return usage();
}
