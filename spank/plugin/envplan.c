/*
 * Which task variables to set, given what the user already set. Pure: the
 * caller supplies a lookup function and applies the plan (env.c).
 *
 * A value under evidence_root counts as ours, not the user's: it was left by
 * an enclosing step of this job (batch step -> srun) or inherited from another
 * job's environment (a job that submits a job), and is replaced or removed.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "sattr.h"

#define FR_BUF "TORCH_FR_BUFFER_SIZE"
#define FR_BUF_LEGACY "TORCH_NCCL_TRACE_BUFFER_SIZE"
#define FR_DUMP "TORCH_FR_DUMP_TEMP_FILE"
#define FR_DUMP_LEGACY "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
#define FR_ON_TIMEOUT "TORCH_NCCL_DUMP_ON_TIMEOUT"
#define FR_PIPE "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
#define NCCL_DBG "NCCL_DEBUG"
#define NCCL_DBG_FILE "NCCL_DEBUG_FILE"
#define NCCL_PROFILER "NCCL_PROFILER_PLUGIN"
#define LD_PATH "LD_LIBRARY_PATH"
#define ATTR_DIR "SLURM_ATTR_DIR"
#define ATTR_PROBE_DIR "SLURM_ATTR_PROBE_DIR"
#define WS_SOCKET "TORCH_WORKER_SERVER_SOCKET"
#define PY_PATH "PYTHONPATH"

enum sattr_owner { SATTR_ABSENT, SATTR_OURS, SATTR_USER };

static void sattr_note(struct sattr_env_plan *plan, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void sattr_note(struct sattr_env_plan *plan, const char *fmt, ...)
{
	va_list ap;

	if (plan->n_notes >= SATTR_NOTES_MAX)
		return;
	va_start(ap, fmt);
	/* A truncated note is still a useful note. */
	vsnprintf(plan->notes[plan->n_notes++], SATTR_NOTE_MAX, fmt, ap);
	va_end(ap);
}

static int sattr_addf(struct sattr_env_plan *plan, const char *name, int overwrite,
		      const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int sattr_addf(struct sattr_env_plan *plan, const char *name, int overwrite,
		      const char *fmt, ...)
{
	struct sattr_env_op *op;
	va_list ap;
	int n;

	if (plan->n_ops >= SATTR_ENV_OPS_MAX) {
		sattr_note(plan, "internal: too many variables, %s not set", name);
		return -1;
	}
	op = &plan->ops[plan->n_ops];
	va_start(ap, fmt);
	n = vsnprintf(op->value, sizeof(op->value), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(op->value)) {
		sattr_note(plan, "%s would be longer than %zu bytes; not set", name,
			   sizeof(op->value) - 1);
		return -1;
	}
	op->unset = 0;
	op->overwrite = overwrite;
	op->name = name;
	plan->n_ops++;
	return 0;
}

static int sattr_unset(struct sattr_env_plan *plan, const char *name)
{
	if (plan->n_ops >= SATTR_ENV_OPS_MAX)
		return -1;
	plan->ops[plan->n_ops] = (struct sattr_env_op){ .unset = 1, .name = name };
	plan->n_ops++;
	return 0;
}

/* Read name into plan->scratch: 1 set, 0 unset, -1 unreadable (noted). */
static int sattr_get(const struct sattr_env_request *req, struct sattr_env_plan *plan,
		     const char *name)
{
	int rc = req->lookup(req->ctx, name, plan->scratch, sizeof(plan->scratch));

	if (rc < 0)
		sattr_note(plan, "could not read %s; leaving it alone", name);
	return rc;
}

static enum sattr_owner sattr_classify(const struct sattr_env_request *req,
				       struct sattr_env_plan *plan, const char *name)
{
	const char *root = req->cfg->evidence_root;
	size_t rlen = strlen(root);
	int rc = sattr_get(req, plan, name);

	if (rc == 0)
		return SATTR_ABSENT;
	if (rc < 0)
		return SATTR_USER; /* unreadable: never override it */
	if (strncmp(plan->scratch, root, rlen) == 0 && plan->scratch[rlen] == '/')
		return SATTR_OURS;
	return SATTR_USER;
}

/* Set a variable unless the user set it. */
static void sattr_plan_single(const struct sattr_env_request *req, struct sattr_env_plan *plan,
			      const char *name, const char *value)
{
	enum sattr_owner c = sattr_classify(req, plan, name);

	if (c != SATTR_USER)
		sattr_addf(plan, name, c == SATTR_OURS, "%s", value);
}

/*
 * A new name and its legacy alias: torch reads the new one first, so setting
 * either while the user set the other would override the user's choice.
 */
static void sattr_plan_pair(const struct sattr_env_request *req, struct sattr_env_plan *plan,
			    const char *name, const char *legacy, const char *value)
{
	enum sattr_owner a = sattr_classify(req, plan, name);
	enum sattr_owner b = sattr_classify(req, plan, legacy);

	if (a == SATTR_USER || b == SATTR_USER)
		return;
	if (sattr_addf(plan, name, a == SATTR_OURS, "%s", value) == 0)
		sattr_addf(plan, legacy, b == SATTR_OURS, "%s", value);
}

/* NCCL_DEBUG and NCCL_DEBUG_FILE go together: a user's level must keep going
 * where the user expects it (stdout) and a user's file keeps the user's level. */
static void sattr_plan_nccl(const struct sattr_env_request *req, struct sattr_env_plan *plan,
			    const char *logfile)
{
	const char *level = req->cfg->nccl_debug;
	enum sattr_owner f, d;

	if (level[0] == '\0')
		return;
	f = sattr_classify(req, plan, NCCL_DBG_FILE);
	d = sattr_classify(req, plan, NCCL_DBG);
	if (f == SATTR_USER || (f == SATTR_ABSENT && d == SATTR_USER))
		return;
	if (sattr_addf(plan, NCCL_DBG_FILE, f == SATTR_OURS, "%s", logfile) == 0 &&
	    d != SATTR_USER)
		sattr_addf(plan, NCCL_DBG, d == SATTR_OURS, "%s", level);
}

/* 1 if dir is the first component of the ':'-list in s. */
static int sattr_first_component_is(const char *s, const char *dir)
{
	size_t dlen = strlen(dir);

	return strncmp(s, dir, dlen) == 0 && (s[dlen] == ':' || s[dlen] == '\0');
}

static void sattr_plan_probe(const struct sattr_env_request *req, struct sattr_env_plan *plan)
{
	const char *lib = req->cfg->probe_lib;
	const char *name = sattr_path_basename(lib);
	char dir[SATTR_PATH_MAX];
	int mine, rc;

	if (lib[0] == '\0')
		return;
	if (!req->probe_present) {
		sattr_note(plan, "probe_lib %s is not a readable file; probe off", lib);
		return;
	}
	if (sattr_path_dirname(lib, dir, sizeof(dir)) != 0)
		return;
	rc = sattr_get(req, plan, NCCL_PROFILER);
	if (rc < 0)
		return;
	if (rc == 1 && strcmp(plan->scratch, name) != 0) {
		/* NCCL loads a single profiler plugin: the user's wins. */
		sattr_note(plan, "user set %s=%.100s; probe off", NCCL_PROFILER, plan->scratch);
		return;
	}
	mine = rc == 1;

	/* By name through LD_LIBRARY_PATH, not by absolute path: NCCL 2.27.3 cannot
	 * load an absolute path, and 2.23-2.25 cannot load a short name. */
	rc = sattr_get(req, plan, LD_PATH);
	if (rc < 0)
		return;
	if (rc == 0 || plan->scratch[0] == '\0') {
		if (sattr_addf(plan, LD_PATH, 1, "%s", dir) != 0)
			return;
	} else if (!sattr_first_component_is(plan->scratch, dir)) {
		if (sattr_addf(plan, LD_PATH, 1, "%s:%s", dir, plan->scratch) != 0)
			return;
	}
	if (!mine)
		sattr_addf(plan, NCCL_PROFILER, 0, "%s", name);
	sattr_addf(plan, ATTR_PROBE_DIR, 1, "%s/probe", req->jobdir);
}

int sattr_env_plan_on(const struct sattr_env_request *req, struct sattr_env_plan *plan)
{
	char path[PATH_MAX];
	char num[SATTR_ID_MAX];
	int n;

	plan->n_ops = 0;
	plan->n_notes = 0;
	if (strlen(req->jobdir) >= SATTR_PATH_MAX + SATTR_ID_MAX) {
		sattr_note(plan, "job directory path too long");
		return -1;
	}

	n = snprintf(num, sizeof(num), "%u", req->cfg->fr_buffer);
	if (n < 0 || (size_t)n >= sizeof(num))
		return -1;
	sattr_plan_pair(req, plan, FR_BUF, FR_BUF_LEGACY, num);

	/* jobdir is bounded above, so these cannot truncate; checked anyway. */
	n = snprintf(path, sizeof(path), "%s/fr/nccl_trace_rank_", req->jobdir);
	if (n < 0 || (size_t)n >= sizeof(path))
		return -1;
	sattr_plan_pair(req, plan, FR_DUMP, FR_DUMP_LEGACY, path);

	sattr_plan_single(req, plan, FR_ON_TIMEOUT, "1");

	n = snprintf(path, sizeof(path), "%s/fr/pipe_rank_", req->jobdir);
	if (n < 0 || (size_t)n >= sizeof(path))
		return -1;
	sattr_plan_single(req, plan, FR_PIPE, path);

	n = snprintf(path, sizeof(path), "%s/nccl/nccl.%%h.%%p.log", req->jobdir);
	if (n < 0 || (size_t)n >= sizeof(path))
		return -1;
	sattr_plan_nccl(req, plan, path);

	sattr_addf(plan, ATTR_DIR, 1, "%s", req->jobdir);
	sattr_plan_probe(req, plan);
	return 0;
}

/* dir first on the ':'-list var, unless it is already. */
static int sattr_prepend_dir(const struct sattr_env_request *req, struct sattr_env_plan *plan,
			     const char *var, const char *dir)
{
	int rc = sattr_get(req, plan, var);

	if (rc < 0)
		return -1;
	if (rc == 0 || plan->scratch[0] == '\0')
		return sattr_addf(plan, var, 1, "%s", dir);
	if (sattr_first_component_is(plan->scratch, dir))
		return 0;
	return sattr_addf(plan, var, 1, "%s:%s", dir, plan->scratch);
}

/* Remove dir where it is the first component of var (ours, put there by a plan). */
static void sattr_strip_dir(const struct sattr_env_request *req, struct sattr_env_plan *plan,
			    const char *var, const char *dir)
{
	size_t dlen = strlen(dir);

	if (sattr_get(req, plan, var) != 1 || !sattr_first_component_is(plan->scratch, dir))
		return;
	if (plan->scratch[dlen] == '\0')
		sattr_unset(plan, var);
	else
		sattr_addf(plan, var, 1, "%s", plan->scratch + dlen + 1);
}

/*
 * torch's worker server per rank (issue 14): the live watcher pulls each rank's Flight
 * Recorder and Python stacks from it while a hang lasts. Per task, because the socket is
 * per rank; only where the site opted in (worker_hook=) and user_init exported this job's
 * evidence dir (attribution on, the dir usable). A user's own TORCH_WORKER_SERVER_SOCKET
 * means the user runs the server (torch's worker_main): then the hook is not added either,
 * so two servers never race for one path.
 */
int sattr_env_plan_task(const struct sattr_env_request *req, unsigned int rank,
			struct sattr_env_plan *plan)
{
	const char *hook = req->cfg->worker_hook;
	char path[PATH_MAX];
	enum sattr_owner c;
	int n;

	plan->n_ops = 0;
	plan->n_notes = 0;
	if (hook[0] == '\0')
		return 0;
	if (sattr_get(req, plan, ATTR_DIR) != 1 || strcmp(plan->scratch, req->jobdir) != 0)
		return 0;
	n = snprintf(path, sizeof(path), "%s/ws/rank_%u.sock", req->jobdir, rank);
	if (n < 0 || (size_t)n >= sizeof(path))
		return -1;
	c = sattr_classify(req, plan, WS_SOCKET);
	if (c == SATTR_USER) {
		sattr_note(plan, "user set %s; worker server hook not added", WS_SOCKET);
		return 0;
	}
	if (sattr_addf(plan, WS_SOCKET, c == SATTR_OURS, "%s", path) != 0)
		return 0;
	if (sattr_prepend_dir(req, plan, PY_PATH, hook) != 0)
		plan->n_ops = 0; /* no hook on the path: no socket variable either */
	return 0;
}

int sattr_env_plan_off(const struct sattr_env_request *req, struct sattr_env_plan *plan)
{
	static const char *const paths[] = { FR_DUMP, FR_DUMP_LEGACY, FR_PIPE, ATTR_DIR,
					     ATTR_PROBE_DIR, WS_SOCKET };
	const char *lib = req->cfg->probe_lib;
	char dir[SATTR_PATH_MAX];
	size_t i, dlen;

	plan->n_ops = 0;
	plan->n_notes = 0;
	for (i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
		if (sattr_classify(req, plan, paths[i]) == SATTR_OURS)
			sattr_unset(plan, paths[i]);
	}
	if (sattr_classify(req, plan, NCCL_DBG_FILE) == SATTR_OURS) {
		sattr_unset(plan, NCCL_DBG_FILE);
		if (req->cfg->nccl_debug[0] != '\0' && sattr_get(req, plan, NCCL_DBG) == 1 &&
		    strcmp(plan->scratch, req->cfg->nccl_debug) == 0)
			sattr_unset(plan, NCCL_DBG);
	}
	if (req->cfg->worker_hook[0] != '\0')
		sattr_strip_dir(req, plan, PY_PATH, req->cfg->worker_hook);
	if (lib[0] == '\0' || sattr_get(req, plan, NCCL_PROFILER) != 1 ||
	    strcmp(plan->scratch, sattr_path_basename(lib)) != 0)
		return 0;
	sattr_unset(plan, NCCL_PROFILER);
	if (sattr_path_dirname(lib, dir, sizeof(dir)) != 0 || sattr_get(req, plan, LD_PATH) != 1 ||
	    !sattr_first_component_is(plan->scratch, dir))
		return 0;
	dlen = strlen(dir);
	if (plan->scratch[dlen] == '\0')
		sattr_unset(plan, LD_PATH);
	else
		sattr_addf(plan, LD_PATH, 1, "%s", plan->scratch + dlen + 1);
	return 0;
}
