/*
 * GPU-less harness for the NCCL profiler probe: loads the plugin the way NCCL does
 * (dlopen RTLD_NOW|RTLD_LOCAL, dlsym ncclProfiler_v6/v5/v4/v3) and drives it with NCCL's
 * event order for ring collectives, one process per simulated rank, an application
 * thread and a proxy thread per process; in node mode one harness process per node of a
 * real Slurm job forks that node's ranks.
 *
 *   probe_harness_nccl.c   the fake NCCL: loading, descriptors per ABI version
 *   probe_harness_job.c    the simulated job: ranks, threads, ring steps, injected faults
 *   probe_harness_check.c  reading the records back, scenario checks, robustness cases
 *   probe_harness.c        command line and self-test
 */
#ifndef PROBE_HARNESS_H
#define PROBE_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "../probe/sattr_nccl_abi.h"
#include "../probe/sattr_probe_layout.h"

/* ---- fake NCCL ----------------------------------------------------------------------- */
struct fake_nccl {
    void *dl;
    int api; /* 3, 4, 5 or 6 */
    sattr_profiler_v6 *v6;
    sattr_profiler_v5 *v5;
    sattr_profiler_v4 *v4;
    sattr_profiler_v3 *v3;
};

/* One event description, whatever the ABI version; fake_start lays it out per version. */
struct hev {
    uint64_t type;
    void *parent;
    int rank;
    const char *func;
    const char *dtype;
    const char *algo;
    const char *proto;
    size_t count;
    uint64_t seq;
    uint64_t comm_hash; /* v3 carries it in Coll/P2p */
    int root;
    int peer;
    int pid;
    int ch;
    int is_send;
    int nsteps;
    int step;
    int depth;
    int graph;
    uint8_t nch;
    uint64_t ptimer;
    const char *sync;   /* v6 CeColl: "MC" or "UC" */
    uint32_t ce_seq;    /* v6 CeColl: the copy-engine sequence */
};

int fake_load(struct fake_nccl *n, const char *path, int api);
void fake_unload(struct fake_nccl *n);
void *fake_init(struct fake_nccl *n, uint64_t hash, int nnodes, int nranks, int rank,
                const char *name, int *mask);
void fake_finalize(struct fake_nccl *n, void *ctx);
void *fake_start(struct fake_nccl *n, void *ctx, const struct hev *e);
void fake_stop(struct fake_nccl *n, void *h);
void fake_state(struct fake_nccl *n, void *h, int state, uint64_t arg, int with_arg);

/* NCCL's application-side sequence for one collective; returns the Coll handle. */
void *fake_collective(struct fake_nccl *n, void *ctx, int rank, const char *func, uint64_t seq,
                      size_t count, uint8_t nch, uint64_t hash);
/* v6: the same collective run by the copy engines (CollApi, then CeColl with its CeSync
 * child; no Group, Coll or kernel channels); returns the CeColl handle. */
void *fake_ce_collective(struct fake_nccl *n, void *ctx, int rank, const char *func, uint64_t seq,
                         size_t count, uint32_t ce_seq);

/* ---- simulated job ------------------------------------------------------------------- */
enum scenario {
    SC_HEALTHY, SC_NONENTRY, SC_COUNT, SC_LINKSTALL, SC_KILLED, SC_STRAGGLER, SC_SLOWLINK, SC_SLOWPHASE
};
/* straggler, slowlink and slowphase jobs complete, only slower (the live watch's S1, S2, S3) */
#define SC_COMPLETES(sc) \
    ((sc) == SC_HEALTHY || (sc) == SC_STRAGGLER || (sc) == SC_SLOWLINK || (sc) == SC_SLOWPHASE)

struct job_opts {
    const char *plugin;
    const char *out;   /* bundle dir: files go to <out>/nodes/<node>/probe/; NULL (node mode
                          only): the real job's SLURM_ATTR_PROBE_DIR, node name, job and step */
    enum scenario sc;
    int ranks;         /* 8 */
    int per_node;      /* 2 */
    int ops;           /* iterations: one world AllReduce + one half-comm AllGather each */
    int inject;        /* iteration of the fault */
    int victim;        /* rank of the fault (non-entry, count); link source for linkstall */
    int hang_ms;       /* how long everything stays hung before the SIGKILL */
    int step_us;       /* pacing of ring steps */
    int delay_us;      /* straggler: the victim's pause before each collective; slowlink: the
                          extra time each of the victim's network sends to its successor takes;
                          slowphase: every rank's pause before each collective from inject on */
    int api;
    int quiet;
    /* Node mode: one harness process per (pretend) node of a real multi-node job, each
     * forking only its node's ranks; the processes share the job's state through a file. */
    const char *shm_path; /* NULL: anonymous shared memory (every rank is this process's child) */
    int node_index;       /* -1: this process plays every node; else only this node (shm_path) */
    int join_ms;          /* how long a node process waits for the others before any rank starts */
};

extern const char *const scenario_names[];
int parse_scenario(const char *s, enum scenario *out);
void job_defaults(struct job_opts *o);
int run_job(const struct job_opts *o); /* 0 when the scenario played out as planned */

#define HARNESS_NCH 2
#define HARNESS_COUNT (1u << 20)
#define WORLD_HASH UINT64_C(0x9e3779b97f4a7c15)
#define EVEN_HASH UINT64_C(0x243f6a8885a308d3)
#define ODD_HASH UINT64_C(0x13198a2e03707344)
int node_of(const struct job_opts *o, int rank);

/* ---- checks -------------------------------------------------------------------------- */
/* The failures are named again under the summary: a CI log keeps only its tail. */
#define TALLY_KEEP 8
struct tally {
    int passed;
    int failed;
    char failures[TALLY_KEEP][200];
};
void tally_summary(const struct tally *t);
void check(struct tally *t, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A rank's record read back from <out>/nodes/ * /probe. */
struct rank_rec {
    struct sattr_hdr *hdr;
    size_t size;
    struct sattr_slot *merged; /* each used slot with its pool lanes added (find_slot) */
    char node_dir[64];         /* the nodes/<dir> it was found in */
};
void merge_lanes(const struct sattr_hdr *h, size_t size, unsigned idx, struct sattr_slot *out);
int load_records(const char *out, struct rank_rec *recs, int nrecs);
void free_records(struct rank_rec *recs, int nrecs);
struct sattr_slot *find_slot(const struct rank_rec *r, uint64_t hash);
const struct sattr_peer *find_peer(const struct sattr_slot *s, int peer);

void check_scenario(struct tally *t, const struct job_opts *o);
void check_identity(struct tally *t, const struct job_opts *o, uint64_t job_id);
void check_robustness(struct tally *t, const char *plugin, const char *tmpdir);
/* robustness and lanes checks (probe_harness_check.c, probe_harness_lanes.c) */
struct rb {
    struct tally *t;
    struct fake_nccl n;
    char dir[4096];
    struct sattr_hdr *h;
    size_t size;
};
struct sattr_hdr *map_file(const char *path, size_t *size);
void *step_event(struct rb *b, void *ctx, void *parent, int step);
void *proxy_op(struct rb *b, void *ctx, void *parent, int pid, int ch, int peer, int send);
void check_lanes(struct rb *b, void *ctx);
void check_lanes_record(struct tally *t, const char *plugin, const char *dir);

#endif
