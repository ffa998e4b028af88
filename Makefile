# slurm-attr: the two commands a fresh Debian 12 machine needs, as root:
#   make demo    a local 4-node Slurm, a failing multi-node job, its verdict and Comment
#   make test    native tests + unit tests + the integration suite on that real Slurm (22.05),
#                then the same on Slurm 24.11 and 26.05 in debootstrap roots (test-versions)
# Both install what they need first (cluster/deps.sh: Debian packages, then a venv with the
# project, its test dependencies and torch CPU); a second run only checks.
VENV ?= .venv
PY := $(VENV)/bin/python
PREFIX ?= /usr
LIBEXEC ?= $(PREFIX)/libexec/slurm-attr
PYTEST_ARGS ?= -ra

.PHONY: all deps deps-apt spank install uninstall test test-native test-unit test-integration test-versions check-fresh demo \
	cluster-up cluster-down bench bench-cluster docs screenshots clean

all: spank

# Debian packages first: the native code needs libslurm-dev's headers.
deps-apt:
	bash cluster/deps.sh apt

deps: deps-apt
	VENV=$(VENV) bash cluster/deps.sh venv

spank: deps-apt
	$(MAKE) -C spank all

# Site install: a venv of Debian's python3 (which refuses `pip install` outside one) at
# SITE_VENV, `sattr` on PATH, the native plugin + probe + comment tool, the hook scripts (which
# run SITE_VENV's python). Then add the plugstack and Epilog/EpilogSlurmctld lines (README,
# "Install on a cluster"). Refused when the headers are not the running Slurm's release.
SITE_VENV ?= /opt/slurm-attr
install:
	@[ -f /usr/include/slurm/spank.h ] || { echo 'make install: apt-get install libslurm-dev gcc make python3-venv' >&2; exit 1; }
	$(MAKE) -C spank check-version
	$(MAKE) -C spank all
	[ -x $(DESTDIR)$(SITE_VENV)/bin/python ] || /usr/bin/python3 -m venv $(DESTDIR)$(SITE_VENV)
	$(DESTDIR)$(SITE_VENV)/bin/python -m pip install -q .
	chmod -R a+rX $(DESTDIR)$(SITE_VENV)
	install -d $(DESTDIR)$(PREFIX)/local/bin
	ln -sf $(SITE_VENV)/bin/sattr $(DESTDIR)$(PREFIX)/local/bin/sattr
	$(MAKE) -C spank install
	install -d $(DESTDIR)$(LIBEXEC)
	install -m 0755 epilog/hook.sh epilog/live_watch.sh $(DESTDIR)$(LIBEXEC)/
	for role in prolog epilog epilog_slurmctld; do ln -sf hook.sh $(DESTDIR)$(LIBEXEC)/$$role.sh; done

uninstall:
	rm -rf $(DESTDIR)$(SITE_VENV) $(DESTDIR)$(PREFIX)/local/bin/sattr
	rm -f $(DESTDIR)$(LIBEXEC)/hook.sh $(DESTDIR)$(LIBEXEC)/prolog.sh $(DESTDIR)$(LIBEXEC)/epilog.sh $(DESTDIR)$(LIBEXEC)/epilog_slurmctld.sh $(DESTDIR)$(LIBEXEC)/live_watch.sh $(DESTDIR)$(LIBEXEC)/sattr-comment $(DESTDIR)$(LIBEXEC)/sattr-record
	rm -f $(DESTDIR)/usr/lib/x86_64-linux-gnu/slurm-wlm/slurm_attr.so $(DESTDIR)/usr/lib/slurm-attr/libnccl-profiler-sattr.so

# Each stage runs even when an earlier one failed, so one run reports everything; the
# exit status is the first failure's. pytest's exit 5 (no tests collected) is a failure.
# Three lanes: the versions stage (two clusters in namespaces of their own) from the start; the
# native build and its tests, then the 22.05 integration suite; the unit tests beside that suite
# once the native build is done (some use its outputs). The cluster suites mostly wait on Slurm
# (the machine is ~80 % idle under one of them). The lanes beside the suite write to logs shown
# after it; each stage's wall time is printed at the end (the suite's budget: 25 min warm).
LANE_LOGS ?= /var/cache/sattr-versions/logs
test: deps
	@rc=0; t0=$$(date +%s); times=""; mkdir -p $(LANE_LOGS); \
	lane() { s=$$(date +%s); r=0; $(MAKE) --no-print-directory test-$$1 > $(LANE_LOGS)/make-test-$$1.log 2>&1 || r=$$?; \
	         echo "$$r $$(( $$(date +%s) - s ))" > $(LANE_LOGS)/make-test-$$1.rc; }; \
	joined() { wait $$2; cat $(LANE_LOGS)/make-test-$$1.log; r=1; secs=?; read -r r secs < $(LANE_LOGS)/make-test-$$1.rc || true; \
	           [ $$r = 0 ] || [ $$rc != 0 ] || rc=$$r; times="$$times  test-$$1 (beside): $$secs s (exit $$r)\n"; }; \
	rm -f $(LANE_LOGS)/make-test-*.rc; \
	lane versions & vpid=$$!; \
	echo "make test: test-versions runs beside the 22.05 stages (log: $(LANE_LOGS)/make-test-versions.log)"; \
	for stage in native integration; do \
		s=$$(date +%s); r=0; \
		if [ $$stage = integration ]; then lane unit & upid=$$!; \
			echo "make test: test-unit runs beside the integration suite (log: $(LANE_LOGS)/make-test-unit.log)"; fi; \
		$(MAKE) --no-print-directory test-$$stage || r=$$?; \
		[ $$r = 0 ] || [ $$rc != 0 ] || rc=$$r; \
		times="$$times  test-$$stage: $$(( $$(date +%s) - s )) s (exit $$r)\n"; \
	done; \
	joined unit $$upid; joined versions $$vpid; \
	printf 'make test: stage times\n%b  total: %s s\n' "$$times" "$$(( $$(date +%s) - t0 ))"; \
	exit $$rc

test-native: spank
	$(MAKE) -C spank test

test-unit: deps
	$(PY) -m pytest tests -m "not cluster" $(PYTEST_ARGS)

test-integration: deps spank
	bash cluster/testcluster.sh up
	# The slowest tests named at the end: the suite is make test's longest stage (its budget above).
	$(PY) -m pytest tests/integration -m cluster --durations=15 $(PYTEST_ARGS)

# Slurm 24.11 (trixie) and 26.05 (sid) in debootstrap roots, each in its own namespaces, the
# two in parallel (cluster/versions.sh; roots and apt archives cached in /var/cache/sattr-versions).
# `make test` runs it beside the 22.05 stages (above); alone it is the same command.
test-versions: deps-apt
	bash cluster/versions.sh

# The README's commands on a plain Debian 12 root made by debootstrap (minutes; not in `test`).
check-fresh: deps-apt
	bash cluster/fresh.sh

cluster-up: deps spank
	bash cluster/testcluster.sh up

cluster-down:
	bash cluster/testcluster.sh down

demo: deps spank
	bash cluster/testcluster.sh up
	VENV=$(VENV) bash cluster/demo.sh

# Each prints its figures and the ratio against its named peer, measured in the same run.
bench: deps spank
	$(PY) bench/bench_rules.py          # vs grep -E with the catalog's patterns
	$(PY) bench/bench_probe.py          # ns per callback, bytes per rank, 4096-rank analysis
	$(PY) bench/bench_gate.py           # the Prolog gate per job start, vs python -c pass
	$(PY) bench/bench_fleet.py          # fleet report + HTML, peak RSS, page size, metrics on 100,000 verdicts (store cached in /var/tmp)
	$(PY) bench/bench_prune.py          # [store] keep_days on that store: prune time, longest lock, vs one delete per table
	$(PY) bench/accuracy/run.py         # verdict accuracy: generated incidents (tuning, held-out), fixtures, rule cases
	$(PY) bench/bench_flightrec.py      # vs torchfrtrace (minutes: it is the slow one)
	$(PY) bench/bench_bigjob.py --quick # big jobs; without --quick: 512/4096 nodes, 32,768 ranks (~30 min, ~20 GB in /tmp)

bench-cluster: cluster-up
	$(PY) bench/bench_epilog.py         # node epilog wall time, job end -> Comment
	flock /var/lock/sattr-cluster.lock $(PY) bench/bench_burst.py --tasks 2000  # job-end burst, controller side off vs on
	flock /var/lock/sattr-cluster.lock $(PY) bench/bench_burst.py --tasks 2000 --split-cores  # the same, the controller's daemons on a core of their own

docs: deps
	$(VENV)/bin/sattr rules list --format markdown > docs/rules.md

# The README's pictures of the fleet report and the dashboard, taken by the tests that render
# them (headless Chromium; the dashboard's panels from the test cluster's real Prometheus).
screenshots: deps spank
	bash cluster/testcluster.sh up
	SATTR_SCREENSHOTS=$(CURDIR)/docs/img $(PY) -m pytest tests/unit/test_fleet_html.py -k chromium $(PYTEST_ARGS)
	flock /var/lock/sattr-cluster.lock env SATTR_SCREENSHOTS=$(CURDIR)/docs/img \
		$(PY) -m pytest tests/integration/test_fleet_prometheus.py -m cluster $(PYTEST_ARGS)

# Issue 11's soak: 200 jobs ending while the database is locked 30 s, slurmdbd stopped 60 s and
# the spool full (not in the default run: it takes many minutes). SATTR_SOAK_JOBS=N for fewer.
.PHONY: soak
soak: deps spank
	bash cluster/testcluster.sh up
	flock /var/lock/sattr-cluster.lock env SATTR_SOAK=1 $(PY) -m pytest tests/integration/test_durability.py -m cluster -k soak -s $(PYTEST_ARGS)

clean:
	$(MAKE) -C spank clean
