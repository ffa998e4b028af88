/*
 * What the simulated ranks (probe_harness_job.c) and the processes that run them
 * (probe_harness_run.c) share: the job's state in shared memory, one slot per rank.
 */
#ifndef PROBE_HARNESS_JOB_H
#define PROBE_HARNESS_JOB_H

#include <stdint.h>

#include "probe_harness.h"

#define MAXR 64
#define NCOMM 3

enum { T_RUN, T_BLOCKED, T_FINISHED };

struct shm {
    int64_t launched[NCOMM][MAXR]; /* collectives launched per comm and rank */
    int64_t sent[NCOMM][MAXR];     /* ring steps sent, counted across ops */
    int64_t recvd[NCOMM][MAXR];
    int app[MAXR];
    int proxy[MAXR];
    int joined; /* nodes whose harness process has come (run_job's start barrier) */
};

#define LD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define ST(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

void sleep_us(long us);
/* One rank's process: its plugin instance, application and proxy threads; its exit status. */
int rank_main(const struct job_opts *o, struct shm *shm, int r);

#endif
