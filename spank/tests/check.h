/* A few lines of test harness: count checks, report failures where they are. */
#ifndef SATTR_CHECK_H
#define SATTR_CHECK_H

#include <stdio.h>
#include <string.h>

extern int sattr_t_pass, sattr_t_fail;

#define CHECK(cond)                                                                   \
	do {                                                                          \
		if (cond) {                                                           \
			sattr_t_pass++;                                               \
		} else {                                                              \
			sattr_t_fail++;                                               \
			fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
		}                                                                     \
	} while (0)

#define CHECK_STR(got, want)                                                          \
	do {                                                                          \
		const char *g_ = (got), *w_ = (want);                                 \
		if (g_ != NULL && w_ != NULL && strcmp(g_, w_) == 0) {                \
			sattr_t_pass++;                                               \
		} else {                                                              \
			sattr_t_fail++;                                               \
			fprintf(stderr, "FAIL %s:%d: %s is \"%s\", want \"%s\"\n",    \
				__FILE__, __LINE__, #got, g_ ? g_ : "(null)",         \
				w_ ? w_ : "(null)");                                  \
		}                                                                     \
	} while (0)

/* Prints the closing "N passed, M failed" line; returns the exit status. */
static inline int sattr_t_report(void)
{
	printf("%d passed, %d failed\n", sattr_t_pass, sattr_t_fail);
	return sattr_t_fail == 0 && sattr_t_pass > 0 ? 0 : 1;
}

#endif
