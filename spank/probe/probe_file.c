/*
 * The probe's record file and communicator slots: everything that happens at init and
 * finalize, never on the event path.
 *
 * One file per process: $SLURM_ATTR_PROBE_DIR/rank<R>.pid<P>.probe, created with its full
 * size reserved (posix_fallocate: a full tmpfs must disable the probe at init, not raise
 * SIGBUS in NCCL's proxy thread later), mapped MAP_SHARED and never unmapped: NCCL may
 * deliver events after finalize (NCCL issue #2000), and a process exit while a proxy
 * thread is still in a callback must not find the mapping gone. The epilog copies the
 * file after the job; the plugin never deletes it.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "probe_internal.h"

SATTR_HIDDEN struct sattr_proc sattr_proc;
SATTR_HIDDEN struct sattr_steps sattr_steps[SATTR_PROBE_NSLOTS];

enum { PROBE_UNKNOWN, PROBE_ON, PROBE_OFF };
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static int probe_state = PROBE_UNKNOWN;
static int probe_pid;
static sattr_nccl_logger_t logger;

#define DEFAULT_WIN_MS 1000u

__attribute__((format(printf, 2, 3))) static void plog(int level, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    if (logger == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    logger(level, SATTR_NCCL_SUBSYS_INIT, __FILE__, __LINE__, "slurm_attr: %s", buf);
}

/* A whole-string decimal (or 0x hex) integer in [lo, hi]; anything else is "unset". */
static int env_long(const char *name, long lo, long hi, long *out)
{
    const char *v = getenv(name);
    char *end;
    long x;
    if (v == NULL || *v == '\0')
        return 0;
    errno = 0;
    x = strtol(v, &end, 0);
    if (errno != 0 || *end != '\0' || x < lo || x > hi)
        return 0;
    *out = x;
    return 1;
}

/* RANK first: under torchrun SLURM_PROCID numbers nodes, not ranks. */
static const char *const grank_env[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                                        "PMIX_RANK", "PMI_RANK", NULL};

static int env_first_int(const char *const *names, int dflt)
{
    long v;
    for (; *names; names++)
        if (env_long(*names, 0, INT_MAX, &v))
            return (int)v;
    return dflt;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n;
    memset(dst, 0, cap);
    if (src == NULL)
        return;
    n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
}

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t process_nonce(void)
{
    /* AT_RANDOM: 16 bytes the kernel gives each exec'd process; stable across dlopens. */
    const unsigned char *r = (const unsigned char *)getauxval(AT_RANDOM);
    uint64_t n = 0;
    if (r != NULL)
        memcpy(&n, r, sizeof(n));
    return n ^ ((uint64_t)getpid() << 32);
}

static int activation_mask(int api_ver)
{
    long v;
    int mask = SATTR_EV_COLL | SATTR_EV_P2P | SATTR_EV_KERNEL_CH | SATTR_EV_PROXY_OP |
               SATTR_EV_PROXY_STEP;
    if (api_ver >= 5)
        mask |= SATTR_EV_GROUP_API | SATTR_EV_COLL_API | SATTR_EV_P2P_API;
    if (api_ver >= 6)
        mask |= SATTR_EV_CE_COLL; /* its CeSync/CeBatch children stay off: no progress in them we can read */
    if (env_long("SLURM_ATTR_PROBE_MASK", 0, INT_MAX, &v))
        mask = (int)v;
    if (env_long("SLURM_ATTR_PROBE_STEPS", 0, 1, &v) && v == 0)
        mask &= ~SATTR_EV_PROXY_STEP; /* escape hatch should a workload show overhead */
    return mask;
}

static void fill_identity(struct sattr_hdr *h, int pid, uint64_t nonce)
{
    static const char *const lrank[] = {"LOCAL_RANK", "SLURM_LOCALID",
                                        "OMPI_COMM_WORLD_LOCAL_RANK", NULL};
    static const char *const wsize[] = {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", NULL};
    static const char *const procid[] = {"SLURM_PROCID", NULL};
    char host[256];
    long v;
    int (*get_version)(int *) = (int (*)(int *))dlsym(RTLD_DEFAULT, "ncclGetVersion");
    int ver = 0;

    h->layout_ver = SATTR_PROBE_LAYOUT_VER;
    h->hdr_size = SATTR_PROBE_HDR_SIZE;
    h->slot_size = SATTR_PROBE_SLOT_SIZE;
    h->nslots = SATTR_PROBE_NSLOTS;
    h->file_size = SATTR_PROBE_FILE_SIZE;
    h->pid = (uint32_t)pid;
    h->proc_nonce = nonce;
    h->global_rank = env_first_int(grank_env, -1);
    h->local_rank = env_first_int(lrank, -1);
    h->world_size = env_first_int(wsize, 0);
    h->slurm_procid = env_first_int(procid, -1);
    h->job_id = env_long("SLURM_JOB_ID", 0, LONG_MAX, &v) ? (uint64_t)v : 0;
    h->step_id = env_long("SLURM_STEP_ID", 0, UINT32_MAX, &v) ? (uint32_t)v : UINT32_MAX;
    if (get_version != NULL && get_version(&ver) == SATTR_NCCL_SUCCESS && ver > 0)
        h->nccl_version = (uint32_t)ver;
    h->create_rt_ns = clock_ns(CLOCK_REALTIME);
    h->create_mono_ns = clock_ns(CLOCK_MONOTONIC);
    h->heartbeat_ns = sattr_now();
    h->clock_id = CLOCK_MONOTONIC_COARSE;
    h->win_ms = sattr_proc.win_ns / 1000000u;
    if (gethostname(host, sizeof(host)) != 0)
        host[0] = '\0';
    host[sizeof(host) - 1] = '\0';
    copy_str(h->hostname, sizeof(h->hostname), host);
    copy_str(h->node_name, sizeof(h->node_name), getenv("SLURMD_NODENAME"));
}

/* Create or reopen this process's record. Returns 0, or -1 with the probe off. */
static int open_record(void)
{
    const char *dir = getenv("SLURM_ATTR_PROBE_DIR");
    char path[PATH_MAX];
    struct stat st;
    struct sattr_hdr *h;
    void *map;
    int fd, n, err, pid = getpid(), reopened = 0;
    long win;
    uint64_t nonce = process_nonce();
    int rank = env_first_int(grank_env, -1);

    if (dir == NULL || *dir == '\0') {
        plog(SATTR_NCCL_LOG_INFO, "probe off: SLURM_ATTR_PROBE_DIR is not set");
        return -1;
    }
    if (rank >= 0)
        n = snprintf(path, sizeof(path), "%s/rank%d.pid%d.probe", dir, rank, pid);
    else
        n = snprintf(path, sizeof(path), "%s/rankX.pid%d.probe", dir, pid);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        plog(SATTR_NCCL_LOG_WARN, "probe off: SLURM_ATTR_PROBE_DIR is too long");
        return -1;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        plog(SATTR_NCCL_LOG_WARN, "probe off: cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0640);
    if (fd < 0) {
        plog(SATTR_NCCL_LOG_WARN, "probe off: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        plog(SATTR_NCCL_LOG_WARN, "probe off: %s is not a regular file", path);
        close(fd);
        return -1;
    }
    if (st.st_size != (off_t)SATTR_PROBE_FILE_SIZE && ftruncate(fd, 0) != 0) {
        plog(SATTR_NCCL_LOG_WARN, "probe off: cannot truncate %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    err = posix_fallocate(fd, 0, SATTR_PROBE_FILE_SIZE);
    if (err != 0) {
        plog(SATTR_NCCL_LOG_WARN, "probe off: cannot reserve %u bytes for %s: %s",
             SATTR_PROBE_FILE_SIZE, path, strerror(err));
        close(fd);
        return -1;
    }
    map = mmap(NULL, SATTR_PROBE_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd); /* the mapping keeps the file */
    if (map == MAP_FAILED) {
        plog(SATTR_NCCL_LOG_WARN, "probe off: cannot map %s: %s", path, strerror(errno));
        return -1;
    }
    h = map;
    sattr_proc.win_ns = (env_long("SLURM_ATTR_PROBE_WIN_MS", 10, 600000, &win) ? (uint32_t)win
                                                                                : DEFAULT_WIN_MS) *
                        1000000u;
    if (SA_LD(&h->magic) == SATTR_PROBE_MAGIC && h->pid == (uint32_t)pid &&
        h->proc_nonce == nonce && h->layout_ver == SATTR_PROBE_LAYOUT_VER &&
        SA_LD(&h->nslots_used) <= SATTR_PROBE_NSLOTS) {
        /* NCCL dlclose'd us after the last communicator and loaded us again: keep going
         * in the same file, after the slots already used. */
        __atomic_fetch_or(&h->flags, SATTR_HF_REOPENED, __ATOMIC_RELAXED);
        reopened = 1;
    } else {
        memset(map, 0, SATTR_PROBE_FILE_SIZE); /* a stale file of a reused pid */
        fill_identity(h, pid, nonce);
        SA_REL(&h->magic, SATTR_PROBE_MAGIC);
    }
    sattr_proc.hdr = h;
    sattr_proc.slots = (struct sattr_slot *)((char *)map + SATTR_PROBE_HDR_SIZE);
    sattr_proc.lanes = (struct sattr_lane *)((char *)map + SATTR_PROBE_LANES_OFF);
    memset(sattr_lane_steps, 0, sizeof(sattr_lane_steps));
    /* Threads' lane tables of another record (the parent's, before a fork) or of an
     * earlier load of the plugin become stale: the epoch differs in the pid, or in the
     * inits the record counted before this load (at least one per earlier load). */
    SA_ST(&sattr_proc.epoch, (uint64_t)(uint32_t)pid << 32 | (uint32_t)(SA_LD(&h->inits) + 1u));
    if (reopened)
        sattr_lanes_reopened();
    sattr_proc.mono0 = h->create_mono_ns;
    sattr_proc.pid = pid;
    sattr_proc.tag = (uint64_t)((nonce & 0xff) ? (nonce & 0xff) : 0xa5) << 56;
    plog(SATTR_NCCL_LOG_INFO, "probe on: %s", path);
    return 0;
}

SATTR_HIDDEN void *sattr_comm_init(int api_ver, uint64_t comm_hash, const char *comm_name,
                                   int nnodes, int nranks, int rank, sattr_nccl_logger_t logfn,
                                   int *mask_out)
{
    struct sattr_hdr *h;
    struct sattr_slot *s;
    uint32_t idx;
    void *ctx = NULL;

    pthread_mutex_lock(&init_lock);
    if (logfn != NULL)
        logger = logfn;
    if (probe_state == PROBE_UNKNOWN || probe_pid != getpid()) {
        /* first init of this load, or of a forked child: its own file */
        probe_pid = getpid();
        sattr_proc.hdr = NULL;
        sattr_proc.slots = NULL;
        probe_state = open_record() == 0 ? PROBE_ON : PROBE_OFF;
    }
    if (probe_state != PROBE_ON) {
        *mask_out = 0; /* off for the whole process: no events at all */
        goto out;
    }
    h = sattr_proc.hdr;
    sattr_lanes_setup();
    /* The mask is one process-wide variable in NCCL (last init wins): always write the
     * same value, even when this communicator gets no slot, or the others go blind. */
    sattr_proc.mask = activation_mask(api_ver);
    *mask_out = sattr_proc.mask;
    SA_ST(&h->event_mask, (uint32_t)sattr_proc.mask);
    SA_BUMP(&h->inits, 1);
    if ((uint32_t)api_ver > SA_LD(&h->api_ver))
        SA_ST(&h->api_ver, (uint32_t)api_ver);
    idx = SA_LD(&h->nslots_used);
    if (idx >= SATTR_PROBE_NSLOTS) {
        __atomic_fetch_or(&h->flags, SATTR_HF_SLOTS_FULL, __ATOMIC_RELAXED);
        sattr_drop();
        plog(SATTR_NCCL_LOG_INFO, "probe: no slot left for communicator %016llx",
             (unsigned long long)comm_hash);
        goto out;
    }
    s = &sattr_proc.slots[idx];
    memset(s, 0, sizeof(*s));
    memset(&sattr_steps[idx], 0, sizeof(sattr_steps[idx]));
    s->comm_hash = comm_hash;
    s->api_ver = (uint32_t)api_ver;
    s->rank = rank;
    s->nranks = nranks;
    s->nnodes = nnodes;
    s->init_ns = sattr_now();
    s->win_start_ns = s->init_ns;
    s->win_ms = sattr_proc.win_ns / 1000000u;
    copy_str(s->comm_name, sizeof(s->comm_name), comm_name);
    SA_REL(&s->state, SATTR_SLOT_ACTIVE);
    SA_REL(&h->nslots_used, idx + 1);
    ctx = sattr_handle(SATTR_K_COMM, idx, 0);
out:
    pthread_mutex_unlock(&init_lock);
    return ctx;
}

SATTR_HIDDEN void sattr_comm_finalize(void *context)
{
    uint64_t payload;
    struct sattr_slot *s;
    pthread_mutex_lock(&init_lock);
    s = sattr_decode(context, SATTR_K_COMM, &payload);
    if (s != NULL) {
        /* The slot stays: the record of a finished communicator is still evidence, and
         * late events for it (NCCL #2000) land harmlessly in it. */
        SA_ST(&s->fini_ns, sattr_now());
        SA_REL(&s->state, SATTR_SLOT_FINALIZED);
    }
    pthread_mutex_unlock(&init_lock);
}

SATTR_HIDDEN void sattr_comm_learn(struct sattr_slot *s, uint64_t comm_hash, int rank)
{
    uint64_t zero = 0;
    int unknown = -1;
    if (comm_hash != 0 && SA_LD(&s->comm_hash) == 0)
        __atomic_compare_exchange_n(&s->comm_hash, &zero, comm_hash, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
    if (rank >= 0 && SA_LD(&s->rank) == -1)
        __atomic_compare_exchange_n(&s->rank, &unknown, rank, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
}
