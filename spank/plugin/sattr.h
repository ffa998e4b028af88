/*
 * slurm_attr SPANK plugin: shared types and the pure (Slurm-free) core.
 *
 * Everything declared here links without Slurm, so tests/ can exercise it
 * directly. The spank_* side lives in dispatch.c, optout.c and env.c.
 */
#ifndef SATTR_H
#define SATTR_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Internal symbols stay out of the plugin's dynamic symbol table. */
#define SATTR_HIDDEN __attribute__((visibility("hidden")))

/* Longest evidence_root / probe_lib we accept: leaves room under PATH_MAX for
 * "/<jobid>/<subdir>/<file name NCCL or torch appends>". */
#define SATTR_PATH_MAX 1024
/* Longest environment value we read or write (LD_LIBRARY_PATH can be long). */
#define SATTR_ENV_VALUE_MAX 16384
#define SATTR_ENV_OPS_MAX 16
#define SATTR_NOTES_MAX 8
#define SATTR_NOTE_MAX 256
/* Decimal uint32_t plus NUL. */
#define SATTR_ID_MAX 11
#define SATTR_FR_BUFFER_MAX 1000000u
/* live_partitions=: a comma list of partition names (Slurm's names are short). */
#define SATTR_PARTS_MAX 256

_Static_assert(SATTR_PATH_MAX + 128 <= PATH_MAX, "job paths must fit PATH_MAX");
_Static_assert(SATTR_ENV_VALUE_MAX <= INT_MAX, "spank_getenv takes an int length");
_Static_assert(SATTR_ENV_VALUE_MAX > 2 * SATTR_PATH_MAX, "env values hold paths");
_Static_assert(sizeof(uint32_t) == 4 && SATTR_ID_MAX >= sizeof("4294967295"),
	       "a job id prints in SATTR_ID_MAX bytes");

/* Site configuration (plugstack.conf arguments). Defaults: sattr_config_init. */
struct sattr_config {
	int enabled;                        /* enabled=on|off: site default */
	char evidence_root[SATTR_PATH_MAX]; /* evidence_root=/abs/path, no trailing '/' */
	unsigned int fr_buffer;             /* fr_buffer=N, 0..SATTR_FR_BUFFER_MAX */
	char probe_lib[SATTR_PATH_MAX];     /* probe_lib=/abs/lib*.so; "" = probe off */
	char nccl_debug[8];                 /* nccl_debug=WARN|INFO|off; "" = off */
	char live_watcher[SATTR_PATH_MAX];  /* live_watcher=/abs/exe; "" = no live watch */
	char worker_hook[SATTR_PATH_MAX];   /* worker_hook=/abs/dir (sitecustomize.py); "" = off */
	char live_partitions[SATTR_PARTS_MAX]; /* live_partitions=a,b: live features only there; "" = all */
};

/* ---- args.c: plugstack arguments and value parsing ---- */
SATTR_HIDDEN void sattr_config_init(struct sattr_config *cfg);
/* Apply one "key=value"; on error cfg is unchanged and err says why. */
SATTR_HIDDEN int sattr_config_parse_arg(struct sattr_config *cfg, const char *arg,
					char *err, size_t errlen);
/* on/off, 1/0, yes/no, true/false (any case) -> 1/0; anything else -> -1. */
SATTR_HIDDEN int sattr_parse_bool(const char *s);
/* Strict decimal, no sign or blanks, <= max. 0 on success. */
SATTR_HIDDEN int sattr_parse_u32(const char *s, uint32_t max, uint32_t *out);
/* A job id: decimal, 1..UINT32_MAX-1, copied canonical into out. 0 on success. */
SATTR_HIDDEN int sattr_parse_job_id(const char *s, char out[SATTR_ID_MAX]);

/* 1 if partition is one of list's comma-separated names, or list is empty (every partition);
 * 0 otherwise, and for a NULL partition (unknown) with a non-empty list. */
SATTR_HIDDEN int sattr_partition_listed(const char *list, const char *partition);

/* ---- optout decision (args.c) ---- */
/*
 * Whether attribution is on for this job or step. Precedence: the --attr
 * option (opt: -1 unset, 0, 1), then the user's SLURM_ATTR, then the value the
 * submitting command published (SATTR_ENABLED job-control variable), then the
 * site default. NULL means unset; an unparsable value is skipped with a note.
 */
SATTR_HIDDEN int sattr_decide_enabled(int opt, const char *env_attr, const char *published,
				      int site_default, char *note, size_t notelen);

/* ---- paths.c ---- */
/* "<evidence_root>/<job_id>"; 0 on success, -1 if it does not fit. */
SATTR_HIDDEN int sattr_jobdir_path(const struct sattr_config *cfg, const char *job_id,
				   char *out, size_t outlen);
/* Directory part of an absolute path ("/a/b" -> "/a", "/b" -> "/"). */
SATTR_HIDDEN int sattr_path_dirname(const char *path, char *out, size_t outlen);
/* Pointer to the last component of path. */
SATTR_HIDDEN const char *sattr_path_basename(const char *path);
/* 1 if path is absolute, has no "." / ".." / empty components, no ':' and fits. */
SATTR_HIDDEN int sattr_path_is_clean_abs(const char *path);

/* ---- envplan.c: which task variables to set, given what the user set ---- */
/* Returns 1 if set (value in buf), 0 if unset, -1 if it could not be read. */
typedef int (*sattr_env_lookup_f)(void *ctx, const char *name, char *buf, size_t len);

struct sattr_env_op {
	int unset;        /* 1: unset name; 0: set name=value */
	int overwrite;    /* for set */
	const char *name; /* static string */
	char value[SATTR_ENV_VALUE_MAX];
};

struct sattr_env_plan {
	size_t n_ops;
	struct sattr_env_op ops[SATTR_ENV_OPS_MAX];
	size_t n_notes;
	char notes[SATTR_NOTES_MAX][SATTR_NOTE_MAX];
	char scratch[SATTR_ENV_VALUE_MAX]; /* lookup buffer */
};

struct sattr_env_request {
	const struct sattr_config *cfg;
	const char *jobdir;  /* "<evidence_root>/<job id>" */
	int probe_present;   /* cfg->probe_lib exists as a regular file */
	sattr_env_lookup_f lookup;
	void *ctx;
};

/* Variables for an enabled step. 0 on success, -1 if nothing can be planned. */
SATTR_HIDDEN int sattr_env_plan_on(const struct sattr_env_request *req,
				   struct sattr_env_plan *plan);
/* For a disabled step: unset what an enclosing enabled step left behind. */
SATTR_HIDDEN int sattr_env_plan_off(const struct sattr_env_request *req,
				    struct sattr_env_plan *plan);
/* Per task (task_init), only with worker_hook= set and attribution on for this job:
 * TORCH_WORKER_SERVER_SOCKET=<jobdir>/ws/rank_<rank>.sock and the hook first on
 * PYTHONPATH, unless the user set the socket variable (then neither). */
SATTR_HIDDEN int sattr_env_plan_task(const struct sattr_env_request *req, unsigned int rank,
				     struct sattr_env_plan *plan);

/* ---- jobdir.c: the per-job evidence directory (root only, no spank) ---- */
/*
 * Create or fix "<evidence_root>/<job_id>" and its fr/ probe/ nccl/ subdirs,
 * owned by uid:gid, mode 0700, never following symlinks. Idempotent. The
 * evidence root is created root-owned 0755 if missing and refused when not
 * owned by root or writable by group/others without the sticky bit.
 * 0 on success, -1 with err set.
 */
SATTR_HIDDEN int sattr_jobdir_create(const char *evidence_root, const char *job_id,
				     uid_t uid, gid_t gid, char *err, size_t errlen);
/* 1 if the task environment may point into "<evidence_root>/<job_id>" (absent, or a real
 * directory owned by uid or root); 0 with err set if the plugin refused it. */
SATTR_HIDDEN int sattr_jobdir_usable(const char *evidence_root, const char *job_id, uid_t uid,
				     char *err, size_t errlen);

/* "<evidence_root>/<job_id>.start", created exclusively by root at the job's first step on
 * this node (its ctime is the node epilog's trusted window start on Slurm without
 * SLURM_JOB_START_TIME). 1 created, 0 already there, -1 with err set. */
SATTR_HIDDEN int sattr_jobstart_write(const char *evidence_root, const char *job_id, char *err,
				      size_t errlen);

/* ---- watchspawn.c: the live watcher's command line and its detached start ---- */
#define SATTR_WATCH_ARGS 32
struct sattr_watch_req {
	const char *exe;      /* cfg->live_watcher */
	const char *job_id, *step, *jobdir, *config;
	unsigned int nodeid, nnodes, gid;
	/* the step's slurmstepd: the watcher learns its node from it and ends with it */
	pid_t stepd_pid;
};
struct sattr_watch_cmd {
	char *argv[SATTR_WATCH_ARGS];
	int argc;
	char buf[4096];
	size_t used;
};
/* 0 and c filled, or -1 when a value is unsafe as an argument or does not fit. */
SATTR_HIDDEN int sattr_watch_cmd_build(const struct sattr_watch_req *r, struct sattr_watch_cmd *c);
/* Double-fork, setsid, fds to /dev/null, clean env, exec. 0 when the exec succeeded. */
SATTR_HIDDEN int sattr_watch_spawn(const struct sattr_watch_cmd *c, char *err, size_t errlen);

#endif /* SATTR_H */
