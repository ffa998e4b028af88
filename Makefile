# slurm-attr: the two commands a fresh Debian 12 machine needs, as root:
#   make demo    a local 4-node Slurm, a failing multi-node job, its verdict and Comment
#   make test    native tests + unit tests + the integration suite on that real Slurm
PYTHON ?= python3
PREFIX ?= /usr
LIBEXEC ?= $(PREFIX)/libexec/slurm-attr
PYTEST_ARGS ?= -ra

.PHONY: all spank install uninstall test test-native test-unit test-integration demo cluster-up cluster-down bench bench-cluster docs clean

all: spank

spank:
	$(MAKE) -C spank all

# Python package, native plugin + probe, hook entry scripts. Then add the plugstack and
# Epilog/EpilogSlurmctld lines (README, "Install on a cluster").
install: spank
	$(PYTHON) -m pip install .
	$(MAKE) -C spank install
	install -d $(DESTDIR)$(LIBEXEC)
	install -m 0755 epilog/epilog.sh epilog/epilog_slurmctld.sh $(DESTDIR)$(LIBEXEC)/

uninstall:
	-$(PYTHON) -m pip uninstall -y slurm-attr
	rm -f $(DESTDIR)$(LIBEXEC)/epilog.sh $(DESTDIR)$(LIBEXEC)/epilog_slurmctld.sh
	rm -f $(DESTDIR)/usr/lib/x86_64-linux-gnu/slurm-wlm/slurm_attr.so $(DESTDIR)/usr/lib/slurm-attr/libnccl-profiler-sattr.so

test: test-native test-unit test-integration

test-native:
	$(MAKE) -C spank test

test-unit:
	$(PYTHON) -m pytest tests -m "not cluster" $(PYTEST_ARGS)

test-integration: spank cluster-up
	$(PYTHON) -m pytest tests/integration -m cluster $(PYTEST_ARGS)

cluster-up: spank
	bash cluster/testcluster.sh up

cluster-down:
	bash cluster/testcluster.sh down

demo: spank
	bash cluster/testcluster.sh up
	bash cluster/demo.sh

# Each prints its figures and the ratio against its named peer, measured in the same run.
bench: spank
	$(PYTHON) bench/bench_rules.py          # vs grep -E with the catalog's patterns
	$(PYTHON) bench/bench_probe.py          # ns per callback, bytes per rank, 4096-rank analysis
	$(PYTHON) bench/bench_flightrec.py      # vs torchfrtrace (minutes: it is the slow one)

bench-cluster: cluster-up
	$(PYTHON) bench/bench_epilog.py         # node epilog wall time, job end -> Comment

docs:
	sattr rules list --format markdown > docs/rules.md

clean:
	$(MAKE) -C spank clean
