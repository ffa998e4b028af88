# The NCCL profiler probe: build/libnccl-profiler-sattr.so, its GPU-less harness and the
# ThreadSanitizer run. Included by spank/Makefile (which makes all/test/install depend on
# PROBE_ALL/PROBE_TEST/PROBE_INSTALL); also works alone:
#
#   make -C spank -f probe.mk [all|test|install|clean]
#
# Paths are relative to spank/ (make runs with -C spank).

PROBE_BUILD := build
PROBE_LIBDIR ?= /usr/lib/slurm-attr
PROBE_CC ?= $(CC)
PROBE_INSTALL_CMD ?= install

# Warnings and hardening always, after the packager's CFLAGS; C11 plus GCC's __atomic builtins.
PROBE_CFLAGS = $(CFLAGS) -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -fPIC -fvisibility=hidden \
	-fstack-protector-strong -D_FORTIFY_SOURCE=2
PROBE_LDFLAGS = $(LDFLAGS) -shared -Wl,-z,relro,-z,now -Wl,--no-undefined
PROBE_TSAN := -fsanitize=thread -O1 -U_FORTIFY_SOURCE

PROBE_SRC := probe/probe_abi.c probe/probe_events.c probe/probe_file.c probe/probe_lanes.c
PROBE_HDR := probe/sattr_nccl_abi.h probe/sattr_probe_layout.h probe/probe_internal.h
PROBE_HARNESS_SRC := tests/probe_harness.c tests/probe_harness_nccl.c tests/probe_harness_job.c \
	tests/probe_harness_run.c tests/probe_harness_check.c tests/probe_harness_lanes.c
PROBE_HARNESS_HDR := tests/probe_harness.h tests/probe_harness_job.h probe/sattr_nccl_abi.h probe/sattr_probe_layout.h

PROBE_LIB := $(PROBE_BUILD)/libnccl-profiler-sattr.so
PROBE_HARNESS := $(PROBE_BUILD)/tests/probe_harness
PROBE_TSAN_LIB := $(PROBE_BUILD)/tsan/libnccl-profiler-sattr.so
PROBE_TSAN_HARNESS := $(PROBE_BUILD)/tsan/probe_harness

PROBE_ALL := $(PROBE_LIB)
PROBE_TEST := probe-test
PROBE_INSTALL := probe-install

# Keep the including Makefile's default goal: rules defined here must not become it.
_probe_goal := $(.DEFAULT_GOAL)

.PHONY: probe-test probe-install probe-clean probe-harness

$(PROBE_LIB): $(PROBE_SRC) $(PROBE_HDR)
	@mkdir -p $(@D)
	$(PROBE_CC) $(PROBE_CFLAGS) $(PROBE_LDFLAGS) -o $@ $(PROBE_SRC) -lpthread -ldl

$(PROBE_HARNESS): $(PROBE_HARNESS_SRC) $(PROBE_HARNESS_HDR)
	@mkdir -p $(@D)
	$(PROBE_CC) $(PROBE_CFLAGS) -fvisibility=default -o $@ $(PROBE_HARNESS_SRC) -lpthread -ldl

$(PROBE_TSAN_LIB): $(PROBE_SRC) $(PROBE_HDR)
	@mkdir -p $(@D)
	$(PROBE_CC) $(PROBE_CFLAGS) $(PROBE_TSAN) $(PROBE_LDFLAGS) -o $@ $(PROBE_SRC) -lpthread -ldl

$(PROBE_TSAN_HARNESS): $(PROBE_HARNESS_SRC) $(PROBE_HARNESS_HDR)
	@mkdir -p $(@D)
	$(PROBE_CC) $(PROBE_CFLAGS) $(PROBE_TSAN) -fvisibility=default -o $@ $(PROBE_HARNESS_SRC) -lpthread -ldl

probe-harness: $(PROBE_LIB) $(PROBE_HARNESS)

# The exported symbols NCCL looks up, and nothing else of ours.
probe-test: $(PROBE_LIB) $(PROBE_HARNESS) $(PROBE_TSAN_LIB) $(PROBE_TSAN_HARNESS)
	@syms=$$(nm -D --defined-only $(PROBE_LIB) | awk '{print $$3}' | grep -v '^_' | sort | tr '\n' ' '); \
	if [ "$$syms" != "ncclProfiler_v3 ncclProfiler_v4 ncclProfiler_v5 ncclProfiler_v6 " ]; then \
		echo "probe: unexpected exports: $$syms"; exit 1; fi; \
	echo "probe: exports $$syms"
	$(PROBE_HARNESS) selftest --plugin $(abspath $(PROBE_LIB))
	TSAN_OPTIONS="halt_on_error=1 exitcode=66 report_signal_unsafe=0" \
		$(PROBE_TSAN_HARNESS) selftest --quick --plugin $(abspath $(PROBE_TSAN_LIB))

probe-install: $(PROBE_LIB)
	$(PROBE_INSTALL_CMD) -d $(DESTDIR)$(PROBE_LIBDIR)
	$(PROBE_INSTALL_CMD) -m 0755 $(PROBE_LIB) $(DESTDIR)$(PROBE_LIBDIR)/libnccl-profiler-sattr.so

probe-clean:
	rm -f $(PROBE_LIB) $(PROBE_HARNESS) $(PROBE_TSAN_LIB) $(PROBE_TSAN_HARNESS)

# Alone (make -f probe.mk): the usual targets.
ifeq ($(firstword $(MAKEFILE_LIST)),probe.mk)
.PHONY: all test install clean
all: $(PROBE_ALL)
test: $(PROBE_TEST)
install: $(PROBE_INSTALL)
clean: probe-clean
_probe_goal := all
endif

.DEFAULT_GOAL := $(_probe_goal)
