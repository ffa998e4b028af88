/*
 * Path helpers. Pure: no Slurm, no I/O.
 */
#include <stdio.h>
#include <string.h>

#include "sattr.h"

int sattr_path_is_clean_abs(const char *path)
{
	const char *p = path;
	const char *comp;
	size_t len;

	if (path == NULL || path[0] != '/' || strlen(path) >= SATTR_PATH_MAX)
		return 0;
	for (p = path; *p != '\0'; p++) {
		unsigned char c = (unsigned char)*p;

		/* ':' splits LD_LIBRARY_PATH, '%' is expanded in NCCL_DEBUG_FILE. */
		if (c < 0x20 || c == 0x7f || c == ':' || c == '%')
			return 0;
	}
	if (strcmp(path, "/") == 0)
		return 1;
	/* Every component non-empty and neither "." nor "..": no trailing '/', no "//". */
	for (comp = path + 1;; comp += len + 1) {
		len = strcspn(comp, "/");
		if (len == 0 || (len == 1 && comp[0] == '.') ||
		    (len == 2 && comp[0] == '.' && comp[1] == '.'))
			return 0;
		if (comp[len] == '\0')
			return 1;
	}
}

const char *sattr_path_basename(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash == NULL ? path : slash + 1;
}

int sattr_path_dirname(const char *path, char *out, size_t outlen)
{
	const char *slash = strrchr(path, '/');
	size_t len;

	if (slash == NULL || outlen == 0)
		return -1;
	len = slash == path ? 1 : (size_t)(slash - path);
	if (len >= outlen)
		return -1;
	memcpy(out, path, len);
	out[len] = '\0';
	return 0;
}

int sattr_jobdir_path(const struct sattr_config *cfg, const char *job_id, char *out, size_t outlen)
{
	int n = snprintf(out, outlen, "%s/%s", cfg->evidence_root, job_id);

	if (n < 0 || (size_t)n >= outlen)
		return -1;
	return 0;
}
