/*
 * sattr-record: slurm-attr's EpilogSlurmctld front.
 *
 * slurmctld runs EpilogSlurmctld once per ended job; at a burst (an array cancelled, a
 * reservation ending) thousands run within a minute beside slurmctld. This program only
 * records: it writes the hook's own environment (the SLURM_* and SPANK_SATTR_* variables,
 * bounded) to <[intake] queue_dir>/<key>.env, renamed into place, then starts an analysis
 * worker (python -m slurm_attr.hooks work) holding a free slot lock, if there is one, and exits
 * 0. It asks Slurm nothing and reads no user file. The worker turns each .env file into the
 * intake's pending record (pipeline/ctldrecord.py).
 *
 * Not fsynced unless [intake] hook_fsync = true: the two fsyncs were most of this hook's time
 * under load, and the job's end is durable in Slurm's accounting already, which the catch-up
 * (pipeline/catchup.py, run by `sattr retry` and the workers) reads back for any job a crash
 * left without a record. A crash can leave an empty or torn record instead: the record ends in
 * a trailer (SATTR_RECORD_END=<bytes before it>,<their CRC-32>) and the worker takes a
 * record whose trailer does not check as "ask accounting" (pipeline/ctldrecord.py).
 *
 * Whatever it cannot handle itself (a config it cannot read, an odd job id, an unwritable
 * queue) it hands to the Python hook, which handles everything: exec python -m
 * slurm_attr.hooks controller. It never fails the job: every path ends in exit 0 or that exec.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

#define MAX_VAR (64 * 1024)       /* one variable; a job's name or paths could be long */
#define MAX_RECORD (1024 * 1024)  /* the whole record, as the intake's MAX_ENTRY_BYTES */
#define MAX_CONFIG (1024 * 1024)

struct cfg {
    int enabled;
    int workers;
    int hook_fsync;
    char queue_dir[4096];
};

static const char *python(void)
{
    const char *py = getenv("SLURM_ATTR_PYTHON");
    return (py && *py) ? py : "/opt/slurm-attr/bin/python";
}

/* The Python hook does everything this front does not: the one fallback. */
static int fallback(const char *why)
{
    const char *py = python();
    fprintf(stderr, "sattr-record: %s: handing over to the Python hook\n", why);
    execl(py, py, "-m", "slurm_attr.hooks", "controller", (char *)NULL);
    fprintf(stderr, "sattr-record: cannot run %s: %s\n", py, strerror(errno));
    return 0;
}

static int valid_job_id(const char *s)
{
    /* ^\d{1,12}(_\d{1,9})?$, as spool.valid_job_id */
    size_t n = 0;
    while (isdigit((unsigned char)s[n])) n++;
    if (n < 1 || n > 12) return 0;
    if (s[n] == '\0') return 1;
    if (s[n] != '_') return 0;
    size_t m = 0;
    while (isdigit((unsigned char)s[n + 1 + m])) m++;
    return m >= 1 && m <= 9 && s[n + 1 + m] == '\0';
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = '\0';
    return s;
}

/* A TOML string value: "..." without escapes or '...'; 0 when it is anything else. */
static int toml_string(char *v, char *out, size_t cap)
{
    char q = v[0];
    if (q != '"' && q != '\'') return 0;
    char *end = strchr(v + 1, q);
    if (!end || (q == '"' && memchr(v + 1, '\\', (size_t)(end - v - 1)))) return 0;
    size_t n = (size_t)(end - v - 1);
    if (n == 0 || n >= cap) return 0;
    memcpy(out, v + 1, n);
    out[n] = '\0';
    char *rest = trim(end + 1);
    return *rest == '\0' || *rest == '#';
}

/* The four settings this front needs; -1 when the file holds them in a form it does not read. */
static int read_config(struct cfg *c)
{
    const char *path = getenv("SLURM_ATTR_CONFIG");
    if (!path || !*path) path = "/etc/slurm/slurm_attr.toml";
    c->enabled = 1;
    c->workers = 2;
    c->hook_fsync = 0;
    snprintf(c->queue_dir, sizeof c->queue_dir, "/var/lib/slurm_attr/pending");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : -1; /* no file: all defaults, as config.load */
    char *buf = malloc(MAX_CONFIG + 1);
    if (!buf) { close(fd); return -1; }
    size_t len = 0;
    ssize_t r;
    while (len < MAX_CONFIG && (r = read(fd, buf + len, MAX_CONFIG - len)) > 0) len += (size_t)r;
    close(fd);
    if (len >= MAX_CONFIG) { free(buf); return -1; }
    buf[len] = '\0';
    char section[64] = "";
    int rc = 0;
    for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *s = trim(line);
        if (*s == '#' || *s == '\0') continue;
        if (*s == '[') {
            char *e = strchr(s, ']');
            if (!e || (size_t)(e - s - 1) >= sizeof section) { rc = -1; break; }
            *e = '\0';
            snprintf(section, sizeof section, "%s", trim(s + 1));
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) continue;
        *eq = '\0';
        char *key = trim(s), *val = trim(eq + 1);
        if (!strcmp(section, "analysis") && !strcmp(key, "enabled")) {
            if (!strncmp(val, "true", 4)) c->enabled = 1;
            else if (!strncmp(val, "false", 5)) c->enabled = 0;
            else { rc = -1; break; }
        } else if (!strcmp(section, "analysis") && !strcmp(key, "workers")) {
            char *end;
            long n = strtol(val, &end, 10);
            if (end == val || n < 0 || n > 64) { rc = -1; break; }
            c->workers = (int)n;
        } else if (!strcmp(section, "intake") && !strcmp(key, "hook_fsync")) {
            if (!strncmp(val, "true", 4)) c->hook_fsync = 1;
            else if (!strncmp(val, "false", 5)) c->hook_fsync = 0;
            else { rc = -1; break; }
        } else if (!strcmp(section, "intake") && !strcmp(key, "queue_dir")) {
            if (!toml_string(val, c->queue_dir, sizeof c->queue_dir)) { rc = -1; break; }
        }
    }
    free(buf);
    return rc;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) { if (errno == EINTR) continue; return -1; }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* CRC-32 (zlib's: reflected 0xEDB88320), chainable as zlib.crc32(data, crc): the trailer's check
 * that every byte before it reached the disk. Bitwise: a record is a few KiB. */
static uint32_t crc32_update(uint32_t crc, const char *p, size_t n)
{
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= (unsigned char)p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

/* <queue>/<key>.env: the hook's SLURM_* and SPANK_SATTR_* variables, NUL-separated, then the
 * trailer; durable only with hook_fsync (see the top). */
static int write_record(const struct cfg *c, const char *key)
{
    char tmp[4300], path[4300];
    if (snprintf(path, sizeof path, "%s/%s.env", c->queue_dir, key) >= (int)sizeof path) return -1;
    if (snprintf(tmp, sizeof tmp, "%s/.%s.env.%d.tmp", c->queue_dir, key, (int)getpid()) >= (int)sizeof tmp)
        return -1;
    if (mkdir(c->queue_dir, 0700) < 0 && errno != EEXIST) return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    size_t total = 0;
    uint32_t sum = 0;
    int rc = 0;
    for (char **e = environ; *e && rc == 0; e++) {
        if (strncmp(*e, "SLURM_", 6) && strncmp(*e, "SPANK_SATTR_", 12)) continue;
        if (!strncmp(*e, "SLURM_ATTR_", 11)) continue; /* our own settings, not the job's facts */
        size_t n = strlen(*e) + 1;
        if (n > MAX_VAR || total + n > MAX_RECORD - 64) continue; /* bounded: a long variable is left out */
        rc = write_all(fd, *e, n);
        sum = crc32_update(sum, *e, n);
        total += n;
    }
    if (rc == 0) {
        char end[64];
        int n = snprintf(end, sizeof end, "SATTR_RECORD_END=%zu,%08x", total, (unsigned)sum);
        rc = write_all(fd, end, (size_t)n + 1); /* with its NUL, as every variable */
    }
    if (rc == 0 && c->hook_fsync) rc = fsync(fd);
    if (close(fd) < 0) rc = -1;
    if (rc == 0) rc = rename(tmp, path);
    if (rc != 0) { unlink(tmp); return -1; }
    if (c->hook_fsync) {
        int dfd = open(c->queue_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) { fsync(dfd); close(dfd); } /* the rename survives a crash once the dir is synced */
    }
    return 0;
}

/*
 * The worker's place on a busy controller, taken before exec: the batch scheduling class at
 * nice 19 and best-effort I/O level 7, as pipeline/pool.py sets once Python runs. Set here
 * too because the interpreter's start and imports (~0.1-0.2 s of CPU) would otherwise run at
 * the hooks' own priority, beside slurmctld and the rest of a burst's hooks. Best effort.
 */
static void lower_priority(void)
{
    struct sched_param none = { 0 };
    sched_setscheduler(0, SCHED_BATCH, &none);
    setpriority(PRIO_PROCESS, 0, 19);
#ifdef SYS_ioprio_set
    syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, 0, (2 << 13) | 7 /* best-effort, level 7 */);
#endif
}

/* A worker holding the first free slot; none free: a running worker will see the record. */
static void start_worker(const struct cfg *c)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int slots = c->workers > 0 ? c->workers : (cores >= 8 ? (int)(cores / 4) : 1);
    for (int i = 0; i < slots; i++) {
        char lock[4300];
        if (snprintf(lock, sizeof lock, "%s/.worker-%d.lock", c->queue_dir, i) >= (int)sizeof lock) return;
        int fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) return;
        if (flock(fd, LOCK_EX | LOCK_NB) < 0) { close(fd); continue; }
        pid_t pid = fork();
        if (pid == 0) {
            setsid();
            int keep = dup(fd); /* without O_CLOEXEC: the worker inherits the locked slot */
            char num[16];
            snprintf(num, sizeof num, "%d", keep);
            setenv("SLURM_ATTR_WORKER_FD", num, 1);
            int dn = open("/dev/null", O_RDWR);
            if (dn >= 0) { dup2(dn, 0); dup2(dn, 1); dup2(dn, 2); } /* slurmscriptd waits on our pipes */
            lower_priority();
            const char *py = python();
            execl(py, py, "-m", "slurm_attr.hooks", "work", (char *)NULL);
            _exit(127);
        }
        close(fd); /* the worker's copy keeps the lock (a failed fork: the next hook tries) */
        return;
    }
}

/*
 * The controller side is off ([analysis] enabled = false): <queue>/.off's time says until when, so
 * that the catch-up from accounting (pipeline/catchup.py) leaves the jobs that ended meanwhile
 * alone once it is on again. One open and a time stamp, no fsync, and only where the catch-up
 * made the file (without a catch-up it means nothing). Best effort.
 */
static void stamp_off(const struct cfg *c)
{
    char path[4300];
    if (snprintf(path, sizeof path, "%s/.off", c->queue_dir) >= (int)sizeof path) return;
    int fd = open(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    futimens(fd, NULL);
    close(fd);
}

int main(void)
{
    const char *job = getenv("SLURM_JOB_ID");
    if (!job || !valid_job_id(job)) return fallback("odd SLURM_JOB_ID");
    struct cfg c;
    if (read_config(&c) < 0) return fallback("config not read here");
    if (!c.enabled) {
        stamp_off(&c);
        return 0;
    }
    const char *restart = getenv("SLURM_JOB_RESTART_COUNT");
    long n = restart ? strtol(restart, NULL, 10) : 0;
    char key[64];
    if (n > 0) snprintf(key, sizeof key, "%s.r%ld", job, n);
    else snprintf(key, sizeof key, "%s", job);
    if (write_record(&c, key) < 0) return fallback(strerror(errno));
    start_worker(&c);
    return 0;
}
