/* Fake SPANK host: the job environment, job-control variables and log lines in memory. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_spank.h"

struct fake_spank fake;

static void fake_free(char *kv[][2], int n)
{
	int i;

	for (i = 0; i < n; i++) {
		free(kv[i][0]);
		free(kv[i][1]);
	}
}

void fake_reset(spank_context_t ctx)
{
	fake_free(fake.env, fake.n_env);
	fake_free(fake.ctl, fake.n_ctl);
	memset(&fake, 0, sizeof(fake));
	fake.ctx = ctx;
	fake.job_id = 1234;
	fake.uid = 4242;
	fake.gid = 4343;
	fake.nnodes = 1;
}

static int kv_find(char *kv[][2], int n, const char *name)
{
	int i;

	for (i = 0; i < n; i++) {
		if (strcmp(kv[i][0], name) == 0)
			return i;
	}
	return -1;
}

static void kv_put(char *kv[][2], int *n, const char *name, const char *value)
{
	int i = kv_find(kv, *n, name);

	if (i < 0) {
		if (*n >= FAKE_MAX)
			abort();
		i = (*n)++;
		kv[i][0] = strdup(name);
	} else {
		free(kv[i][1]);
	}
	kv[i][1] = strdup(value);
}

const char *fake_env_get(const char *name)
{
	int i = kv_find(fake.env, fake.n_env, name);

	return i < 0 ? NULL : fake.env[i][1];
}

void fake_env_put(const char *name, const char *value)
{
	kv_put(fake.env, &fake.n_env, name, value);
}

const char *fake_ctl_get(const char *name)
{
	int i = kv_find(fake.ctl, fake.n_ctl, name);

	return i < 0 ? NULL : fake.ctl[i][1];
}

int fake_logged(const char *fragment)
{
	int i;

	for (i = 0; i < fake.n_log; i++) {
		if (strstr(fake.log[i], fragment) != NULL)
			return 1;
	}
	return 0;
}

static void fake_vlog(const char *level, const char *fmt, va_list ap)
{
	char line[512];

	vsnprintf(line, sizeof(line), fmt, ap);
	if (getenv("SATTR_TEST_VERBOSE") != NULL)
		fprintf(stderr, "[%s] %s\n", level, line);
	if (fake.n_log < FAKE_MAX)
		snprintf(fake.log[fake.n_log++], sizeof(fake.log[0]), "%s", line);
}

#define FAKE_LOGGER(fn)                          \
	void fn(const char *fmt, ...)            \
	{                                        \
		va_list ap;                      \
		va_start(ap, fmt);               \
		fake_vlog(#fn, fmt, ap);         \
		va_end(ap);                      \
	}
FAKE_LOGGER(slurm_error)
FAKE_LOGGER(slurm_info)
FAKE_LOGGER(slurm_verbose)
FAKE_LOGGER(slurm_debug)
FAKE_LOGGER(slurm_debug2)
FAKE_LOGGER(slurm_debug3)
FAKE_LOGGER(slurm_spank_log)

spank_context_t spank_context(void)
{
	return fake.ctx;
}

int spank_remote(spank_t sp)
{
	(void)sp;
	return fake.ctx == S_CTX_REMOTE;
}

const char *spank_strerror(spank_err_t err)
{
	static char buf[32];

	snprintf(buf, sizeof(buf), "fake spank error %d", (int)err);
	return buf;
}

spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{
	(void)sp;
	if (fake.n_opts >= FAKE_MAX)
		return ESPANK_ERROR;
	fake.opts[fake.n_opts++] = opt;
	return ESPANK_SUCCESS;
}

spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
	va_list ap;
	spank_err_t rc = ESPANK_SUCCESS;

	(void)sp;
	va_start(ap, item);
	switch (item) {
	case S_JOB_ID:
		*va_arg(ap, uint32_t *) = fake.job_id;
		break;
	case S_JOB_UID:
		*va_arg(ap, uid_t *) = fake.uid;
		break;
	case S_JOB_GID:
		*va_arg(ap, gid_t *) = fake.gid;
		break;
	case S_TASK_ID: /* spank.h: int * */
		*va_arg(ap, int *) = (int)fake.task_id;
		break;
	case S_TASK_GLOBAL_ID:
		*va_arg(ap, uint32_t *) = fake.global_task_id;
		break;
	case S_JOB_STEPID:
		*va_arg(ap, uint32_t *) = fake.step_id;
		break;
	case S_JOB_NODEID:
		*va_arg(ap, uint32_t *) = fake.node_id;
		break;
	case S_JOB_NNODES:
		*va_arg(ap, uint32_t *) = fake.nnodes;
		break;
	default:
		rc = ESPANK_BAD_ARG;
	}
	va_end(ap);
	return rc;
}

spank_err_t spank_getenv(spank_t sp, const char *var, char *buf, int len)
{
	const char *v;

	(void)sp;
	if (fake.ctx != S_CTX_REMOTE)
		return ESPANK_NOT_REMOTE;
	if (len <= 0)
		return ESPANK_BAD_ARG;
	v = fake_env_get(var);
	if (v == NULL)
		return ESPANK_ENV_NOEXIST;
	if ((int)strlen(v) >= len)
		return ESPANK_NOSPACE;
	memcpy(buf, v, strlen(v) + 1);
	return ESPANK_SUCCESS;
}

spank_err_t spank_setenv(spank_t sp, const char *var, const char *val, int overwrite)
{
	(void)sp;
	if (fake.ctx != S_CTX_REMOTE)
		return ESPANK_NOT_REMOTE;
	if (!overwrite && fake_env_get(var) != NULL)
		return ESPANK_ENV_EXISTS;
	fake_env_put(var, val);
	return ESPANK_SUCCESS;
}

spank_err_t spank_unsetenv(spank_t sp, const char *var)
{
	int i = kv_find(fake.env, fake.n_env, var);

	(void)sp;
	if (fake.ctx != S_CTX_REMOTE)
		return ESPANK_NOT_REMOTE;
	if (i >= 0) {
		free(fake.env[i][0]);
		free(fake.env[i][1]);
		fake.env[i][0] = fake.env[fake.n_env - 1][0];
		fake.env[i][1] = fake.env[fake.n_env - 1][1];
		fake.n_env--;
	}
	return ESPANK_SUCCESS;
}

spank_err_t spank_job_control_setenv(spank_t sp, const char *name, const char *value,
				     int overwrite)
{
	(void)sp;
	if (fake.ctx != S_CTX_LOCAL && fake.ctx != S_CTX_ALLOCATOR)
		return ESPANK_NOT_LOCAL;
	if (!overwrite && fake_ctl_get(name) != NULL)
		return ESPANK_ENV_EXISTS;
	kv_put(fake.ctl, &fake.n_ctl, name, value);
	return ESPANK_SUCCESS;
}
