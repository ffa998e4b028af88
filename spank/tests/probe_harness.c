/*
 * probe_harness: drives the NCCL profiler probe without a GPU.
 *
 *   probe_harness run --plugin LIB --out DIR --scenario S [--ranks 8] [--per-node 2]
 *                     [--ops 12] [--inject 8] [--victim R] [--hang-ms 600] [--step-us 300]
 *                     [--delay-us N] [--api 5]
 *       play one scenario (healthy, nonentry, count, linkstall, killed, straggler, slowlink,
 *       slowphase) as a job whose records land in DIR/nodes/<node>/probe/, as the epilog will
 *       collect them; straggler: the victim (5) enters every collective --delay-us (20000) after
 *       the others; slowlink: each network send of the victim (3) to its world successor takes
 *       --delay-us (2000) longer; slowphase: from iteration --inject on, every rank pauses
 *       --delay-us (30000) before each collective (two per iteration: ~72 ms per iteration against
 *       ~12 ms before, well past the live watch's phase_factor of 3). All three complete.
 *   probe_harness selftest --plugin LIB [--quick] [--keep]
 *       every scenario and the robustness cases, checked; ends with "N passed, M failed"
 *   probe_harness layout
 *       the record layout as JSON, for the Python reader's cross-check
 */
#include <ftw.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
            rc = int_arg(v, 3, 5, &o->api);
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
    return o->plugin && o->out ? 0 : -1;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int selftest(int argc, char **argv)
{
    const char *plugin = NULL;
    int quick = 0, keep = 0;
    char tmp[] = "/tmp/probe_harness.XXXXXX", out[4096];
    struct tally t = {0, 0};
    static const struct {
        enum scenario sc;
        int api;
    } plan[] = {{SC_HEALTHY, 5}, {SC_NONENTRY, 5}, {SC_COUNT, 5}, {SC_LINKSTALL, 5},
                {SC_KILLED, 5}, {SC_HEALTHY, 4}, {SC_LINKSTALL, 4}, {SC_NONENTRY, 3},
                {SC_STRAGGLER, 5}, {SC_SLOWLINK, 5}, {SC_SLOWPHASE, 5}};

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
        job_defaults(&o);
        o.plugin = plugin;
        o.sc = plan[i].sc;
        o.api = plan[i].api;
        o.victim = default_victim(o.sc);
        o.delay_us = default_delay_us(o.sc);
        o.quiet = 1;
        if (quick) { /* ThreadSanitizer runs are ~10x slower */
            o.ops = 6;
            o.inject = 4;
            o.hang_ms = 300;
            if (o.sc == SC_SLOWPHASE)
                o.delay_us *= 10; /* the jump is against a healthy period that is 10x longer too */
        }
        snprintf(out, sizeof(out), "%s/%s-v%d", tmp, scenario_names[o.sc], o.api);
        o.out = out;
        check(&t, run_job(&o) == 0, "%s (v%d): job played out", scenario_names[o.sc], o.api);
        check_scenario(&t, &o);
    }
    check_robustness(&t, plugin, tmp);
    if (!keep && t.failed == 0)
        nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    else
        printf("records kept in %s\n", tmp);
    printf("%d passed, %d failed\n", t.passed, t.failed);
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
        struct tally t = {0, 0};
        if (argc != 6 || strcmp(argv[2], "--plugin") || strcmp(argv[4], "--out"))
            return usage();
        setvbuf(stdout, NULL, _IOLBF, 0);
        check_lanes_record(&t, argv[3], argv[5]);
        printf("%d passed, %d failed\n", t.passed, t.failed);
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
