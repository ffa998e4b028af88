/*
 * Plugstack arguments and value parsing. Pure: no Slurm, no I/O.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "sattr.h"

void sattr_config_init(struct sattr_config *cfg)
{
	/* The one place defaults live. */
	*cfg = (struct sattr_config){
		.enabled = 1,
		.evidence_root = "/var/tmp/slurm_attr",
		.fr_buffer = 2000,
		.probe_lib = "",
		.nccl_debug = "WARN",
	};
}

int sattr_parse_bool(const char *s)
{
	static const char *const yes[] = { "on", "1", "yes", "true" };
	static const char *const no[] = { "off", "0", "no", "false" };
	size_t i;

	if (s == NULL)
		return -1;
	for (i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(s, yes[i]) == 0)
			return 1;
		if (strcasecmp(s, no[i]) == 0)
			return 0;
	}
	return -1;
}

int sattr_parse_u32(const char *s, uint32_t max, uint32_t *out)
{
	uint64_t v = 0;
	const char *p;

	if (s == NULL || *s == '\0' || strlen(s) > 10)
		return -1;
	for (p = s; *p != '\0'; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	if (v > max)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

int sattr_parse_job_id(const char *s, char out[SATTR_ID_MAX])
{
	uint32_t id;
	int n;

	/* 0 is not a job id; UINT32_MAX and neighbours are Slurm's NO_VAL markers. */
	if (sattr_parse_u32(s, UINT32_MAX - 3, &id) != 0 || id == 0)
		return -1;
	n = snprintf(out, SATTR_ID_MAX, "%u", id);
	if (n < 0 || n >= SATTR_ID_MAX)
		return -1;
	return 0;
}

static int sattr_set_path(char *dst, size_t dstlen, const char *key, const char *val,
			  int want_lib, char *err, size_t errlen)
{
	char tmp[SATTR_PATH_MAX];
	size_t len = strlen(val);
	const char *base;

	/* Tolerate a trailing '/' on a directory; never on the root itself. */
	while (!want_lib && len > 1 && val[len - 1] == '/')
		len--;
	if (len >= sizeof(tmp)) {
		snprintf(err, errlen, "%s: path longer than %zu bytes", key, sizeof(tmp) - 1);
		return -1;
	}
	memcpy(tmp, val, len);
	tmp[len] = '\0';
	if (!sattr_path_is_clean_abs(tmp) || strcmp(tmp, "/") == 0) {
		snprintf(err, errlen, "%s=%s: not a clean absolute path", key, val);
		return -1;
	}
	if (want_lib) {
		/* NCCL takes "lib*.so" names as is on every version (2.27.3 included). */
		base = sattr_path_basename(tmp);
		len = strlen(base);
		if (len <= strlen("lib.so") || strncmp(base, "lib", 3) != 0 ||
		    strcmp(base + len - 3, ".so") != 0) {
			snprintf(err, errlen, "%s=%s: must name a lib*.so file", key, val);
			return -1;
		}
	}
	if (strlen(tmp) >= dstlen) {
		snprintf(err, errlen, "%s: path too long", key);
		return -1;
	}
	memcpy(dst, tmp, strlen(tmp) + 1);
	return 0;
}

/* An optional path: an empty value turns the feature off. */
static int sattr_set_opt_path(char *dst, size_t dstlen, const char *key, const char *val,
			      int want_lib, char *err, size_t errlen)
{
	if (*val == '\0') {
		dst[0] = '\0';
		return 0;
	}
	return sattr_set_path(dst, dstlen, key, val, want_lib, err, errlen);
}

/* Slurm partition names as a comma list: letters, digits, '_', '-', '.', no empty item. */
static int sattr_set_partitions(struct sattr_config *cfg, const char *val, char *err, size_t errlen)
{
	size_t i, n = strlen(val), item = 0;

	if (n >= sizeof(cfg->live_partitions)) {
		snprintf(err, errlen, "live_partitions= is longer than %zu characters",
			 sizeof(cfg->live_partitions) - 1);
		return -1;
	}
	for (i = 0; i <= n; i++) {
		char c = val[i];

		if (c == ',' || c == '\0') {
			if (item == 0 && n > 0) {
				snprintf(err, errlen, "live_partitions=%s: an empty partition name", val);
				return -1;
			}
			item = 0;
		} else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			   c == '_' || c == '-' || c == '.') {
			item++;
		} else {
			snprintf(err, errlen, "live_partitions=%s: expected partition names separated by ','",
				 val);
			return -1;
		}
	}
	memcpy(cfg->live_partitions, val, n + 1);
	return 0;
}

int sattr_partition_listed(const char *list, const char *partition)
{
	size_t plen;
	const char *p = list;

	if (list[0] == '\0')
		return 1;
	if (partition == NULL || partition[0] == '\0')
		return 0;
	plen = strlen(partition);
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end != NULL ? (size_t)(end - p) : strlen(p);

		if (len == plen && strncmp(p, partition, len) == 0)
			return 1;
		if (end == NULL)
			return 0;
		p = end + 1;
	}
}

int sattr_config_parse_arg(struct sattr_config *cfg, const char *arg, char *err, size_t errlen)
{
	const char *eq = strchr(arg, '=');
	const char *val;
	size_t klen;
	uint32_t n;
	int b;

	if (eq == NULL || eq == arg) {
		snprintf(err, errlen, "argument '%s' is not key=value", arg);
		return -1;
	}
	klen = (size_t)(eq - arg);
	val = eq + 1;

#define SATTR_KEY(k) (klen == sizeof(k) - 1 && strncmp(arg, k, klen) == 0)
	if (SATTR_KEY("enabled")) {
		b = sattr_parse_bool(val);
		if (b < 0 || (strcasecmp(val, "on") != 0 && strcasecmp(val, "off") != 0)) {
			snprintf(err, errlen, "enabled=%s: expected on or off", val);
			return -1;
		}
		cfg->enabled = b;
		return 0;
	}
	if (SATTR_KEY("evidence_root")) {
		return sattr_set_path(cfg->evidence_root, sizeof(cfg->evidence_root),
				      "evidence_root", val, 0, err, errlen);
	}
	if (SATTR_KEY("fr_buffer")) {
		if (sattr_parse_u32(val, SATTR_FR_BUFFER_MAX, &n) != 0) {
			snprintf(err, errlen, "fr_buffer=%s: expected an integer 0..%u", val,
				 SATTR_FR_BUFFER_MAX);
			return -1;
		}
		cfg->fr_buffer = n;
		return 0;
	}
	if (SATTR_KEY("probe_lib"))
		return sattr_set_opt_path(cfg->probe_lib, sizeof(cfg->probe_lib), "probe_lib", val,
					  1, err, errlen);
	if (SATTR_KEY("live_watcher"))
		return sattr_set_opt_path(cfg->live_watcher, sizeof(cfg->live_watcher), "live_watcher", val,
					  0, err, errlen);
	if (SATTR_KEY("worker_hook"))
		return sattr_set_opt_path(cfg->worker_hook, sizeof(cfg->worker_hook), "worker_hook", val,
					  0, err, errlen);
	if (SATTR_KEY("live_partitions"))
		return sattr_set_partitions(cfg, val, err, errlen);
	if (SATTR_KEY("nccl_debug")) {
		if (strcasecmp(val, "WARN") == 0 || strcasecmp(val, "INFO") == 0) {
			snprintf(cfg->nccl_debug, sizeof(cfg->nccl_debug), "%s",
				 strcasecmp(val, "WARN") == 0 ? "WARN" : "INFO");
			return 0;
		}
		if (strcasecmp(val, "off") == 0) {
			cfg->nccl_debug[0] = '\0';
			return 0;
		}
		snprintf(err, errlen, "nccl_debug=%s: expected WARN, INFO or off", val);
		return -1;
	}
#undef SATTR_KEY
	snprintf(err, errlen, "unknown argument '%.*s'", (int)klen, arg);
	return -1;

}

int sattr_decide_enabled(int opt, const char *env_attr, const char *published, int site_default,
			 char *note, size_t notelen)
{
	int v;

	if (notelen > 0)
		note[0] = '\0';
	if (opt == 0 || opt == 1)
		return opt;
	if (env_attr != NULL) {
		v = sattr_parse_bool(env_attr);
		if (v >= 0)
			return v;
		snprintf(note, notelen, "ignoring SLURM_ATTR=%.64s (expected on or off)", env_attr);
	}
	if (published != NULL) {
		v = sattr_parse_bool(published);
		if (v >= 0)
			return v;
	}
	return site_default ? 1 : 0;
}
