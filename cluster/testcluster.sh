#!/usr/bin/env bash
# A real Slurm 22.05 cluster on this one machine, for `make demo`, `make test` and CI:
# munge, MariaDB on loopback, slurmdbd, slurmctld and four slurmd (n1..n4) started as
# root without systemd, with the slurm-attr SPANK plugin and epilogs wired in.
#
# Each pretend node runs in its own mount namespace, so it does not share what real nodes do
# not share: its evidence root (where the plugin and the epilog work), its node-local state and its
# kernel-log source are private bind mounts of $BASE/nodes/<node>/ (the kernel source of node N is
# $BASE/kernel/N.log, seen by that node alone as $BASE/node/kernel.log). The spool, the job's
# working dirs and /tmp stay shared: a checkout under /tmp (CI's clone, say) must stay visible
# to the hooks and the jobs, as a shared filesystem is on a real cluster.
#
#   cluster/testcluster.sh up       install what is missing, (re)start, wait until idle
#   cluster/testcluster.sh down     stop only the daemons this script started (by pid)
#   cluster/testcluster.sh status   what runs
#   cluster/testcluster.sh env      print the exports a shell needs (eval "$(... env)")
#   cluster/testcluster.sh venv     only (re)build the hooks' venv (before `up` in a namespace without PyPI)
#
# Idempotent: `up` on a healthy cluster with an unchanged config only checks it.
#
# Beside it, where Debian's prometheus and prometheus-node-exporter are installed (cluster/deps.sh
# apt; not in the versions roots): a node_exporter on 127.0.0.1:19100 serving only the textfile
# slurm-attr writes ($BASE/metrics/sattr.prom, [metrics] textfile), and a Prometheus on
# 127.0.0.1:19090 scraping it every 2 s and evaluating contrib/prometheus/sattr.rules.yml.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BASE=${SATTR_CLUSTER_BASE:-/var/lib/sattr-testcluster}
NODES=(n1 n2 n3 n4)
DBPORT=3307
CONF=$BASE/etc/slurm.conf
PIDS=$BASE/run/started.pids      # "name pid" per line: what we started and may stop
VENV=$BASE/venv
PY=$VENV/bin/python
NODE_LAYOUT="mountns-v3"
# The optional monitoring pair (see the top). Ports apart from a site's own 9090/9100.
PROM_ADDR=127.0.0.1:19090
NODEEXP_ADDR=127.0.0.1:19100
PROM_BIN=$(command -v prometheus || true)
PROMTOOL=$(command -v promtool || true)
NODEEXP_BIN=$(command -v prometheus-node-exporter || command -v node_exporter || true)

log() { printf 'testcluster: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

alive() {  # alive PID COMM: running (not zombie) and still the program we started
    local pid=$1 comm=$2 st
    [ -r "/proc/$pid/stat" ] || return 1
    st=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
    case $st in Z|X) return 1 ;; esac
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ]
}

install_packages() {
    # One list of what the scripts use, shared with `make demo`/`make test` (cluster/deps.sh).
    bash "$REPO/cluster/deps.sh" cluster-apt
}

slurm_version() {  # major.minor of the installed Slurm, e.g. 22.05 (slurmd -V needs no config)
    slurmd -V 2>/dev/null | sed -n 's/^slurm[-a-z]* \([0-9]*\)\.\([0-9]*\).*/\1.\2/p' | head -1
}

version_ge() {  # version_ge 24.05: the installed Slurm is at least this release
    local have; have=$(slurm_version)
    [ "$(printf '%s\n%s\n' "$1" "$have" | sort -V | head -1)" = "$1" ]
}

src_hash() {
    (cd "$REPO" && find slurm_attr rules pyproject.toml -type f \( -name '*.py' -o -name '*.toml' -o -name '*.tsv' \) \
        -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 cat | sha256sum | cut -c1-16)
}

install_venv() {
    # slurm-attr as a site installs it: a venv from Debian's python3, readable by every user
    # (the hooks run it as root; users run its `sattr`). Reinstalled when the source changes.
    [ -x "$PY" ] || /usr/bin/python3 -m venv "$VENV"
    # Checked by import, not by the venv's existence: an interrupted first install leaves a venv.
    if ! "$PY" -c 'import setuptools, wheel' 2>/dev/null; then
        "$PY" -m pip install -q --disable-pip-version-check 'setuptools>=64' wheel >&2
        rm -f "$VENV/.src-hash"
    fi
    local h; h=$(src_hash)
    if [ "$(cat "$VENV/.src-hash" 2>/dev/null)" != "$h" ]; then
        local tmp; tmp=$(mktemp -d)
        # Build from a copy: the checkout may not be writable for build dirs, or may be under /root.
        (cd "$REPO" && tar cf - --exclude=__pycache__ pyproject.toml README.md slurm_attr rules) | (cd "$tmp" && tar xf -)
        touch "$tmp/README.md"
        # With its dependencies (pyproject.toml's list); already satisfied ones need no index.
        "$PY" -m pip install -q --disable-pip-version-check --no-build-isolation "$tmp" >&2
        "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall "$tmp" >&2
        rm -rf "$tmp"
        echo "$h" > "$VENV/.src-hash"
    fi
    chmod -R a+rX "$VENV"
}

install_pyslurm() {
    # The pyslurm wheel matching this Slurm, into the hooks' venv and the checkout's .venv (the
    # contract tests run there): built once per machine and cached (cluster/pyslurm.sh). Never
    # fatal: without it the hooks use the CLI backend, and tests/integration/test_slurm_backends.py
    # fails loudly where a release line exists but the wheel is missing.
    local pys=("$PY") rc=0
    [ -x "$REPO/.venv/bin/python" ] && pys+=("$REPO/.venv/bin/python")
    bash "$REPO/cluster/pyslurm.sh" install "${pys[@]}" 9>&- >&2 || rc=$?
    case $rc in
        0) ;;
        3) log "pyslurm: no release line for this Slurm; the CLI backend is used" ;;
        *) log "pyslurm: build or install failed (exit $rc); the CLI backend is used" ;;
    esac
}

ensure_users() {
    # Two ordinary users: jobs run as them in the tests (privacy, ownership).
    local u
    for u in sattrtest sattrother; do
        id "$u" >/dev/null 2>&1 || useradd -m -s /bin/bash "$u"
    done
}

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
    if [ ! -s /etc/munge/munge.key ]; then
        mungekey --create --keyfile=/etc/munge/munge.key --force 2>/dev/null \
            || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
    chmod 0400 /etc/munge/munge.key; chmod 755 /run/munge
    runuser -u munge -- /usr/sbin/munged 9>&-
    local pid; pid=$(cat /run/munge/munged.pid)
    echo "munged $pid" >> "$PIDS"
    for _ in $(seq 50); do munge -n | unmunge >/dev/null 2>&1 && return 0; sleep 0.1; done
    die "munged did not come up"
}

start_mariadb() {
    local data=$BASE/db/data sock=$BASE/run/mysqld.sock
    if [ ! -d "$data/mysql" ]; then
        mkdir -p "$data"
        mariadb-install-db --no-defaults --user=root --datadir="$data" \
            --auth-root-authentication-method=socket --skip-test-db >"$BASE/log/mariadb-install.log" 2>&1
    fi
    # MariaDB >= 11.6 defaults innodb_snapshot_isolation=ON, under which slurmdbd's concurrent
    # updates of one job row (our Comment write) fail; older releases lack the option.
    local extra=()
    mariadbd --no-defaults --verbose --help 2>/dev/null | grep -q '^innodb-snapshot-isolation' \
        && extra+=(--innodb-snapshot-isolation=OFF)
    setsid mariadbd --no-defaults "${extra[@]}" --user=root --datadir="$data" --socket="$sock" --port=$DBPORT \
        --bind-address=127.0.0.1 --pid-file="$BASE/run/mariadbd.pid" --log-error="$BASE/log/mariadbd.err" \
        --innodb-buffer-pool-size=64M --innodb-log-file-size=16M --skip-name-resolve </dev/null >/dev/null 2>&1 9>&- &
    for _ in $(seq 100); do [ -S "$sock" ] && mariadb --no-defaults -S "$sock" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
    [ -s "$BASE/run/mariadbd.pid" ] || die "mariadbd did not start (see $BASE/log/mariadbd.err)"
    echo "mariadbd $(cat "$BASE/run/mariadbd.pid")" >> "$PIDS"
    # The database exists before slurmdbd's first start: on an empty MariaDB 11.8, slurmdbd
    # creating it itself dies in _check_mysql_concat_is_sane.
    mariadb --no-defaults -S "$sock" <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'sattr-test';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'sattr-test';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL
}

write_config() {
    local host; host=$(hostname -s)
    getent hosts "$host" >/dev/null || echo "127.0.0.1 $host" >> /etc/hosts
    mkdir -p "$BASE"/{etc,run,log,state,spool,hooks,kernel,evidence,attr,node,metrics} "$BASE"/attr/spool
    # metrics: the textfile directory; node_exporter (a site runs it as its own user) only reads it.
    chmod 755 "$BASE" "$BASE/evidence" "$BASE/metrics"
    touch "$BASE/node/kernel.log"   # the mount point of each node's own kernel source
    mkdir -p "$BASE/node/state"     # ... and of its node-local state (the attributed-lines ledger)
    for n in "${NODES[@]}"; do
        mkdir -p "$BASE/spool/slurmd-$n" "$BASE/nodes/$n/evidence" \
            "$BASE/nodes/$n/state"
        chmod 700 "$BASE/nodes/$n/state"
        chmod 755 "$BASE/nodes/$n" "$BASE/nodes/$n/evidence"
        touch "$BASE/kernel/$n.log"
    done

    # Hook wrappers: slurmd/slurmctld run hooks with a bare environment; these say where
    # the config and the interpreter are, then hand over to the real entry scripts.
    for hook in prolog epilog epilog_slurmctld; do
        cat > "$BASE/hooks/$hook.new" <<EOF
#!/bin/sh
export SLURM_ATTR_CONFIG=$BASE/etc/slurm_attr.toml SLURM_ATTR_PYTHON=$PY SLURM_CONF=$CONF
export SLURM_ATTR_RECORD=$BASE/lib/sattr-record
export SLURM_ATTR_LOG_FILE=$BASE/log/sattr-$hook.log
# The test cluster also records each hook's wall time (bench/bench_epilog.py reads it).
t0=\$(date +%s.%N)
$REPO/epilog/$hook.sh "\$@"
rc=\$?
echo "\${SLURM_JOB_ID:-?} \${SLURMD_NODENAME:-ctld} \$t0 \$(date +%s.%N) \$rc" >> $BASE/log/$hook-times.log
exit \$rc
EOF
        chmod 755 "$BASE/hooks/$hook.new"; mv "$BASE/hooks/$hook.new" "$BASE/hooks/$hook"
    done
    # The live watcher the plugin starts (plugstack live_watcher=), for jobs in partition "live"
    # only (live_partitions=): the other tests' jobs run as on a site without live watch.
    cat > "$BASE/hooks/live_watch.new" <<EOF
#!/bin/sh
export SLURM_ATTR_CONFIG=$BASE/etc/slurm_attr.toml SLURM_ATTR_PYTHON=$PY SLURM_CONF=$CONF
# the plugin gives it /dev/null for output; here a traceback lands in the cluster's logs
exec $REPO/epilog/live_watch.sh "\$@" 2>>$BASE/log/live-watch.log
EOF
    chmod 755 "$BASE/hooks/live_watch.new"; mv "$BASE/hooks/live_watch.new" "$BASE/hooks/live_watch"
    # RebootProgram (slurm-attr's reboot recovery, recovery.py): a pretend node "reboots" by
    # restarting its slurmd. slurmctld counts a reboot done only when the node registers with a
    # boot time after the request; every pretend node shares this host's boot time, so the new
    # slurmd runs in a time namespace whose boot clock starts now (uptime under a second at its
    # start: a boot time even 1 s before the request reads as "still waiting for boot"). Logged.
    cat > "$BASE/hooks/reboot.new" <<'EOF'
#!/bin/bash
BASE=@BASE@ CONF=@CONF@
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin  # slurmd >= 24.11 gives none
p=$PPID slurmd_pid="" node=""
while [ "${p:-1}" -gt 1 ]; do   # slurmd runs us through system(): find it and its -N
    if [ "$(cat /proc/$p/comm 2>/dev/null)" = slurmd ]; then
        slurmd_pid=$p
        node=$(tr '\0' '\n' < /proc/$p/cmdline | sed -n '/^-N$/{n;p}')
        break
    fi
    p=$(awk '{print $4}' /proc/$p/stat 2>/dev/null)
done
echo "$(date +%s.%N) node=${node:-?} slurmd=${slurmd_pid:-?} args=$*" >> "$BASE/log/reboots.log"
[ -n "$node" ] && [ -n "$slurmd_pid" ] || exit 1
# Slurm 26.05's slurmd kills the hook's process group as soon as the hook exits: the restart
# runs in a session of its own, and the hook returns only once the restart is in it.
rm -f "$BASE/run/reboot-$node.detached"
setsid bash -c '
    old=$1 node=$2 BASE=$3 CONF=$4
    echo $$ > "$BASE/run/reboot-$node.detached"
    sleep 1
    kill -TERM "$old"
    for _ in $(seq 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$old" 2>/dev/null
    rm -f "$BASE/run/slurmd-$node.pid"
    # Offsets are against the host clock, and this slurmd may already run in such a namespace
    # (an earlier reboot): the host uptime is ours minus our own offset.
    off=$(sed -n "s/^boottime *\(-\{0,1\}[0-9]*\).*/\1/p" /proc/self/timens_offsets 2>/dev/null)
    up=$(( $(cut -d. -f1 /proc/uptime) - ${off:-0} ))
    unshare --fork --time --boottime "-$up" slurmd -f "$CONF" -N "$node"
    for _ in $(seq 100); do [ -s "$BASE/run/slurmd-$node.pid" ] && break; sleep 0.05; done
    new=$(cat "$BASE/run/slurmd-$node.pid" 2>/dev/null)
    [ -n "$new" ] && sed -i "s/^slurmd $old\$/slurmd $new/" "$BASE/run/started.pids"
    echo "$(date +%s.%N) node=$node back: slurmd=$new" >> "$BASE/log/reboots.log"
' reboot "$slurmd_pid" "$node" "$BASE" "$CONF" </dev/null >>"$BASE/log/reboots.err" 2>&1 &
for _ in $(seq 50); do [ -s "$BASE/run/reboot-$node.detached" ] && break; sleep 0.05; done
exit 0
EOF
    sed -i "s|@BASE@|$BASE|; s|@CONF@|$CONF|" "$BASE/hooks/reboot.new"
    chmod 755 "$BASE/hooks/reboot.new"; mv "$BASE/hooks/reboot.new" "$BASE/hooks/reboot"
    # The worker-server start-up hook as the hooks' venv installed it (worker_hook=).
    local pyhook; pyhook=$("$PY" -I -c 'import os, slurm_attr.live as l; print(os.path.dirname(l.__file__) + "/pyhook")')

    cat > "$BASE/etc/slurm_attr.toml.new" <<EOF
[paths]
evidence_root = "$BASE/evidence"
spool = "$BASE/attr/spool"
database = "$BASE/attr/sattr.db"
slurm_conf = "$CONF"
slurm_bin = "/usr/bin"
comment_tool = "$BASE/lib/sattr-comment"
node_state = "$BASE/node/state"

[collect]
kernel_source = "file"
kernel_file = "$BASE/node/kernel.log"
scheduler_logs = "$BASE/log/slurmctld.log,$BASE/log/slurmd-*.log"
# Tests inject kernel lines seconds apart on the same pretend nodes: a small slack keeps
# one test's Xid out of the next job's window (sites keep the 120 s default).
window_slack_s = 2
time_budget_s = 20

[analysis]
node_wait_s = 20
# The functional suite wants a verdict's latency not to depend on the machine's load; the burst
# benchmark (bench/bench_burst.py) runs with the site default.
yield_pressure = 0

[intake]
queue_dir = "$BASE/attr/pending"

# The verdict in AdminComment too (make demo shows it). Requeue, reboot and GPU reset change what
# a failing job leaves behind (a node resumed, the job run again): the tests turn those on per test.
[actions]
admin_comment = true

# The watchers the plugin starts for jobs in partition "live" (tests/integration/test_live_plugin.py,
# which sets on_hang and ras_addr per test); the other live tests run watchers of their own.
[live]
hang_after_s = 5
interval_s = 0.5

# The fleet view's metrics: rewritten by the controller after the verdicts it stores, served by the
# cluster's node_exporter (when installed) from the textfile directory.
[metrics]
textfile = "$BASE/metrics/sattr.prom"
EOF

    cat > "$BASE/etc/plugstack.conf.new" <<EOF
optional $BASE/lib/slurm_attr.so evidence_root=$BASE/evidence probe_lib=$BASE/lib/libnccl-profiler-sattr.so live_watcher=$BASE/hooks/live_watch worker_hook=$pyhook live_partitions=live
EOF

    cat > "$BASE/etc/slurmdbd.conf.new" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
LogFile=$BASE/log/slurmdbd.log
PidFile=$BASE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DBPORT
StorageUser=slurm
StoragePass=sattr-test
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$BASE/etc/slurmdbd.conf.new"

    # switch/none is gone from Slurm 23.11 on (no SwitchType means none).
    local switch="SwitchType=switch/none"
    version_ge 23.11 && switch="# SwitchType: none"
    # 25.11's expedited requeue (sbatch --requeue=expedite) exists only where slurmctld enables it;
    # the requeue tests check that slurm-attr releases such a job from its REQUEUE_HOLD.
    local expedite="# SlurmctldParameters: expedited requeue needs Slurm 25.11"
    version_ge 25.11 && expedite="SlurmctldParameters=enable_expedited_requeue"
    cat > "$CONF.new" <<EOF
ClusterName=sattrtest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job (slurm-attr's requeue, the Prolog gate's) may start again only after the launch
# credential's lifetime (default 120 s + 1): 30 s keeps those tests short.
AuthInfo=cred_expire=30
SlurmctldPort=6817
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/slurmd-%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# A node freed by its epilog does not wake the scheduler; its periodic passes (60 s main, 30 s
# backfill by default) then paced a burst of short jobs at ~12 a minute.
SchedulerParameters=sched_interval=2,bf_interval=2,nohold_on_prolog_fail
MpiDefault=none
$switch
$expedite
ReturnToService=2
MinJobAge=3600
KillWait=5
MailProg=/bin/true
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
AccountingStoreFlags=job_comment
# GPU-hours lost (the fleet view) come from AllocTRES gres/gpu: the pretend nodes have 2 GPUs each
# (gres.conf: stand-in device files, no GPU exists).
GresTypes=gpu
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
PlugStackConfig=$BASE/etc/plugstack.conf
# The Prolog gate (epilog/prolog.sh): a node whose GPU failed while idle is drained before a job
# lands on it, and the job is requeued (nohold_on_prolog_fail above: not held, it runs elsewhere).
Prolog=$BASE/hooks/prolog
Epilog=$BASE/hooks/epilog
EpilogSlurmctld=$BASE/hooks/epilog_slurmctld
PrologEpilogTimeout=60
RebootProgram=$BASE/hooks/reboot
ResumeTimeout=60
NodeName=n[1-4] NodeHostname=$host NodeAddr=127.0.0.1 Port=[17001-17004] CPUs=2 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=live Nodes=ALL Default=NO MaxTime=INFINITE State=UP
EOF
    # slurmd >= 24.05 loads a cgroup plugin unless told not to; this host may have no usable
    # cgroup filesystem, and the cluster's ProctrackType/TaskPlugin need none.
    if version_ge 24.05; then
        printf 'CgroupPlugin=disabled\n' > "$BASE/etc/cgroup.conf.new"
    else
        echo '# slurmd before 24.05 needs no cgroup settings for this cluster' > "$BASE/etc/cgroup.conf.new"
    fi
    # The GPUs of NodeName's Gres=gpu:2. slurmd drops a gres/gpu without File= ("Removing
    # file-less GPU") and wants character devices there: twins of /dev/null, shared by the pretend
    # nodes (TaskPlugin=task/none constrains no device; a job only sees CUDA_VISIBLE_DEVICES).
    mkdir -p "$BASE/gpus"
    for i in 0 1; do [ -c "$BASE/gpus/nvidia$i" ] || mknod -m 666 "$BASE/gpus/nvidia$i" c 1 3; done
    echo "NodeName=n[1-4] Name=gpu File=$BASE/gpus/nvidia[0-1]" > "$BASE/etc/gres.conf.new"
    write_monitoring_config
    # Renamed into place: a concurrent reader (a test, a daemon) never sees a half-written file.
    for f in "$BASE/etc/slurm_attr.toml" "$BASE/etc/plugstack.conf" "$BASE/etc/slurmdbd.conf" "$BASE/etc/cgroup.conf" \
             "$BASE/etc/gres.conf" "$CONF"; do
        if cmp -s "$f.new" "$f"; then rm -f "$f.new"; else mv "$f.new" "$f"; fi
    done
}

write_monitoring_config() {
    # Prometheus' config and the repo's alert rules, copied (the checkout may be unreadable to a
    # daemon, and an edit mid-run must not be half-read). Only where Prometheus is installed.
    [ -n "$PROM_BIN" ] || return 0
    cat > "$BASE/etc/prometheus.yml.new" <<EOF
global:
  scrape_interval: 2s
  evaluation_interval: 2s
rule_files:
  - $BASE/etc/sattr.rules.yml
scrape_configs:
  - job_name: sattr
    static_configs:
      - targets: ['$NODEEXP_ADDR']
EOF
    # Rules promtool refuses would keep Prometheus from starting, and a dead Prometheus would make
    # every `up` restart the whole cluster under the tests: a bad edit is reported and not installed
    # (tests/unit/test_alert_rules.py fails on it).
    local rules=$REPO/contrib/prometheus/sattr.rules.yml f
    if [ -z "$PROMTOOL" ] || "$PROMTOOL" check rules "$rules" > "$BASE/log/promtool.log" 2>&1; then
        cp "$rules" "$BASE/etc/sattr.rules.yml.new"
    else
        log "$rules fails promtool check rules (see $BASE/log/promtool.log): Prometheus keeps the rules it had"
        [ -f "$BASE/etc/sattr.rules.yml" ] || echo 'groups: []' > "$BASE/etc/sattr.rules.yml.new"
    fi
    for f in "$BASE/etc/sattr.rules.yml" "$BASE/etc/prometheus.yml"; do
        [ -e "$f.new" ] || continue   # the rules kept as they were
        if cmp -s "$f.new" "$f"; then rm -f "$f.new"; else mv "$f.new" "$f"; fi
    done
}

config_hash() {
    # NODE_LAYOUT: how the slurmd are started (their namespaces); a change restarts them.
    { echo "$NODE_LAYOUT"; cat "$CONF" "$BASE/etc/plugstack.conf" "$BASE/etc/slurmdbd.conf" "$BASE/etc/cgroup.conf" \
        "$BASE/etc/gres.conf" "$BASE/lib/slurm_attr.so" 2>/dev/null || true; } | sha256sum | cut -c1-16
}

all_alive() {  # all_alive [slurm]: all we started runs (with "slurm": the Slurm side, not the monitoring)
    [ -s "$PIDS" ] || return 1
    local name pid n=0 m
    while read -r name pid; do
        case $name in
            *:node_exporter|*:prometheus) [ "${1:-}" = slurm ] && continue ;;
            *) n=$((n + 1)) ;;
        esac
        alive "$pid" "${name%%:*}" || return 1
    done < "$PIDS"
    [ $n -ge 7 ] || return 1   # mariadbd, slurmdbd, slurmctld, 4 slurmd (+ munged if we started it)
    [ "${1:-}" = slurm ] && return 0
    # ... and each monitoring daemon that is installed is recorded (so runs: checked above).
    for m in $(monitoring_daemons); do grep -q "^$m " "$PIDS" || return 1; done
}

monitoring_daemons() {  # "comm:label" of each installed one, as recorded in $PIDS (comm: 15 chars)
    local b
    [ -z "$NODEEXP_BIN" ] || { b=$(basename "$NODEEXP_BIN"); echo "${b:0:15}:node_exporter"; }
    [ -z "$PROM_BIN" ] || { b=$(basename "$PROM_BIN"); echo "${b:0:15}:prometheus"; }
}

strays() {  # strays PATTERN: pids of our processes (this PID namespace and root) whose command line has it
    local p me_ns me_root
    me_ns=$(readlink /proc/self/ns/pid); me_root=$(readlink /proc/self/root)
    for p in $(pgrep -f -- "$1" 2>/dev/null); do
        [ "$(readlink "/proc/$p/ns/pid" 2>/dev/null)" = "$me_ns" ] || continue
        [ "$(readlink "/proc/$p/root" 2>/dev/null)" = "$me_root" ] || continue
        echo "$p"
    done
}

nodes_idle() {
    local out; out=$(SLURM_CONF=$CONF sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
    [ "$(echo "$out" | awk '$2=="idle"' | sort -u | wc -l)" -eq ${#NODES[@]} ]
}

stop() {
    # Daemons started with our config but not recorded (an interrupted start) are ours too, if
    # they share our PID namespace and root: a test cluster in a debootstrap root (versions.sh)
    # uses the same config path, and the host sees its daemons too.
    # The monitoring pair is ours by its data paths.
    local stray
    for stray in $(strays "-f $CONF") $(strays "--collector.textfile.directory=$BASE/metrics") \
                 $(strays "--storage.tsdb.path=$BASE/prometheus"); do
        grep -q " $stray\$" "$PIDS" 2>/dev/null || echo "$(cat /proc/$stray/comm 2>/dev/null || echo x) $stray" >> "$PIDS"
    done
    [ -s "$PIDS" ] || return 0
    cancel_all
    local name pid comm
    # Reverse start order: prometheus, node_exporter, slurmd, slurmctld, slurmdbd, mariadbd, munged.
    tac "$PIDS" | while read -r name pid; do
        comm=${name%%:*}
        if alive "$pid" "$comm"; then kill -TERM "$pid" 2>/dev/null || true; fi
    done
    for _ in $(seq 150); do
        local left=0
        while read -r name pid; do alive "$pid" "${name%%:*}" && left=1; done < "$PIDS"
        [ $left = 0 ] && break
        sleep 0.1
    done
    while read -r name pid; do if alive "$pid" "${name%%:*}"; then kill -KILL "$pid" 2>/dev/null || true; fi; done < "$PIDS"
    rm -f "$PIDS" "$BASE/run/config.hash" "$BASE/run/prometheus.hash"
}

start() {
    : > "$PIDS"
    start_munge
    start_mariadb
    export SLURM_CONF=$CONF
    slurmdbd 9>&-
    local up=0
    for _ in $(seq 150); do (exec 3<>/dev/tcp/127.0.0.1/6819) 2>/dev/null && { up=1; break; }; sleep 0.1; done
    if [ $up = 0 ]; then
        tail -20 "$BASE/log/slurmdbd.log" >&2 2>/dev/null || true
        die "slurmdbd's port 6819 never opened (see $BASE/log/slurmdbd.log)"
    fi
    echo "slurmdbd $(cat "$BASE/run/slurmdbd.pid")" >> "$PIDS"
    # State (job ids, drain reasons) survives restarts; job ids must keep growing because
    # slurmdbd remembers every earlier job. Leftover drains are resumed below.
    slurmctld -f "$CONF" 9>&-
    for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
    echo "slurmctld $(cat "$BASE/run/slurmctld.pid")" >> "$PIDS"
    for n in "${NODES[@]}"; do
        rm -f "$BASE/run/slurmd-$n.pid"
        start_slurmd "$n"
    done
    for n in "${NODES[@]}"; do
        # slurmd writes its pid file a moment after daemonizing.
        for _ in $(seq 100); do [ -s "$BASE/run/slurmd-$n.pid" ] && break; sleep 0.05; done
        echo "slurmd $(cat "$BASE/run/slurmd-$n.pid")" >> "$PIDS"
    done
    for _ in $(seq 200); do sacctmgr -n -P list cluster 2>/dev/null | grep -q '^sattrtest|' && break; sleep 0.1; done
    config_hash > "$BASE/run/config.hash"
    start_monitoring
}

monitoring_pid() {  # monitoring_pid LABEL: the recorded, running one's pid; a dead one's line is dropped
    local name pid
    while read -r name pid; do
        [ "${name#*:}" = "$1" ] || continue
        alive "$pid" "${name%%:*}" && { echo "$pid"; return 0; }
    done < "$PIDS"
    sed -i "/^[^ ]*:$1 /d" "$PIDS"
    return 1
}

prometheus_hash() {
    cat "$BASE/etc/prometheus.yml" "$BASE/etc/sattr.rules.yml" 2>/dev/null | sha256sum | cut -c1-16
}

start_monitoring() {
    # The installed ones that do not run are started (alone: Slurm and the tests on it go on); a
    # running Prometheus whose config or rules changed reloads them (SIGHUP), keeping its data.
    # Neither daemonizes: each runs in a session of its own, its output in the cluster's logs.
    local pid name
    if [ -n "$NODEEXP_BIN" ] && ! monitoring_pid node_exporter >/dev/null; then
        for pid in $(strays "--collector.textfile.directory=$BASE/metrics"); do kill -KILL "$pid" 2>/dev/null || true; done
        setsid "$NODEEXP_BIN" --web.listen-address="$NODEEXP_ADDR" --collector.disable-defaults --collector.textfile \
            --collector.textfile.directory="$BASE/metrics" </dev/null >>"$BASE/log/node_exporter.log" 2>&1 9>&- &
        pid=$!
        name=$(monitoring_daemons | grep ':node_exporter$')
        wait_port "$NODEEXP_ADDR" "$pid" "${name%%:*}" || die "node_exporter did not start (see $BASE/log/node_exporter.log)"
        echo "$name $pid" >> "$PIDS"
    fi
    [ -n "$PROM_BIN" ] || return 0
    if pid=$(monitoring_pid prometheus); then
        if [ "$(cat "$BASE/run/prometheus.hash" 2>/dev/null)" != "$(prometheus_hash)" ]; then
            kill -HUP "$pid"
            prometheus_hash > "$BASE/run/prometheus.hash"
            log "prometheus: config or rules changed, reloaded"
        fi
        return 0
    fi
    for pid in $(strays "--storage.tsdb.path=$BASE/prometheus"); do kill -KILL "$pid" 2>/dev/null || true; done
    mkdir -p "$BASE/prometheus"
    # A few days of 2 s scrapes of a handful of series: small, and bounded.
    setsid "$PROM_BIN" --config.file="$BASE/etc/prometheus.yml" --storage.tsdb.path="$BASE/prometheus" \
        --storage.tsdb.retention.time=3d --web.listen-address="$PROM_ADDR" \
        </dev/null >>"$BASE/log/prometheus.log" 2>&1 9>&- &
    pid=$!
    name=$(monitoring_daemons | grep ':prometheus$')
    wait_port "$PROM_ADDR" "$pid" "${name%%:*}" || die "prometheus did not start (see $BASE/log/prometheus.log)"
    echo "$name $pid" >> "$PIDS"
    prometheus_hash > "$BASE/run/prometheus.hash"
}

wait_port() {  # wait_port HOST:PORT PID COMM: the port opens while PID still runs COMM (10 s)
    for _ in $(seq 100); do
        alive "$2" "$3" || return 1
        (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

start_slurmd() {  # start_slurmd NODE: slurmd in a mount namespace of its own (see the top)
    local n=$1 d=$BASE/nodes/$1
    # slurmd daemonizes: the daemon, its slurmstepds and its epilogs stay in the namespace.
    unshare -m --propagation private -- sh -c '
        set -e
        mount --bind "$1/evidence" "$2/evidence"
        mount --bind "$2/kernel/$3.log" "$2/node/kernel.log"
        mount --bind "$1/state" "$2/node/state"
        exec slurmd -f "$4" -N "$3"' sh "$d" "$BASE" "$n" "$CONF" 9>&- \
        || die "slurmd $n did not start in its namespace"
}

cancel_all() {  # every user's jobs: a job left running in slurmctld's state keeps its node busy
    local ids
    ids=$(SLURM_CONF=$CONF timeout 10 squeue -h -o %A 2>/dev/null) || return 0
    [ -n "$ids" ] && SLURM_CONF=$CONF timeout 10 scancel --full $ids 2>/dev/null
    return 0
}

resume_leftovers() {
    # Drains left by an earlier run (ours or a test's) would keep nodes from going idle.
    local n st
    for n in "${NODES[@]}"; do
        st=$(SLURM_CONF=$CONF sinfo -h -n "$n" -o '%T' 2>/dev/null | head -1)
        case $st in *drain*|*down*|*fail*) SLURM_CONF=$CONF scontrol update NodeName="$n" State=RESUME 2>/dev/null || true ;; esac
    done
}

wait_idle() {
    for i in $(seq 300); do
        nodes_idle && return 0
        [ $((i % 20)) = 10 ] && resume_leftovers
        # Jobs recovered from the state of a run that was killed (not stopped) hold their nodes.
        [ "$i" = 50 ] && cancel_all
        sleep 0.1
    done
    SLURM_CONF=$CONF sinfo -N -o '%N %T %E' >&2 || true
    die "nodes did not become idle"
}

up() {
    install_packages
    ensure_users
    mkdir -p "$BASE"; chmod 755 "$BASE"
    install_venv
    install_pyslurm
    mkdir -p "$BASE/run" "$BASE/log"
    make -s -C "$REPO/spank" all >&2 || die "building the SPANK plugin failed"
    # Installed like `make install` would: a root-owned, world-readable place (the probe is
    # loaded by the job's own processes, which may not be able to read the checkout).
    mkdir -p "$BASE/lib"
    for so in slurm_attr.so libnccl-profiler-sattr.so sattr-comment sattr-record; do
        if [ -f "$REPO/spank/build/$so" ] && ! cmp -s "$REPO/spank/build/$so" "$BASE/lib/$so"; then
            install -m 0755 "$REPO/spank/build/$so" "$BASE/lib/$so.new" && mv "$BASE/lib/$so.new" "$BASE/lib/$so"
        fi
    done
    write_config
    # A dead node_exporter or Prometheus (or a changed Prometheus config) on a running cluster:
    # those alone, before the check below would restart everything for them.
    if all_alive slurm; then start_monitoring; fi
    if all_alive && [ "$(cat "$BASE/run/config.hash" 2>/dev/null)" = "$(config_hash)" ] && nodes_idle; then
        log "already up"
        return 0
    fi
    stop
    start
    wait_idle
    # A smoke job, so the tests' job ids start after it and the epilogs have run once.
    SLURM_CONF=$CONF timeout 60 srun -N${#NODES[@]} true || die "smoke job failed"
    wait_idle
    log "up: $(SLURM_CONF=$CONF sinfo -h -o '%D nodes %T')"
}

# One `up`/`down` at a time (tests and helpers may call `up` concurrently). The daemons
# are started with fd 9 closed, or they would hold the lock for their whole life.
# Daemons must not inherit descriptors from whoever called us (a caller's `flock LOCK cmd`
# or a test runner's pipes): they would hold that lock or pipe open for their whole life.
for fd in /proc/$$/fd/*; do
    fd=${fd##*/}
    case $fd in 0|1|2|255) ;; *) eval "exec $fd>&-" 2>/dev/null || true ;; esac
done
mkdir -p "$BASE"
exec 9>"$BASE/.lock"
case ${1:-up} in
    up) flock 9; up ;;
    # The hooks' venv alone: for a cluster started inside a network namespace without PyPI.
    venv) flock 9; install_venv ;;
    down) flock 9; stop; log "down" ;;
    status) all_alive && echo "up" || echo "down"; SLURM_CONF=$CONF sinfo -N -o '%N %T %E' 2>/dev/null || true ;;
    env) echo "export SLURM_CONF=$CONF SLURM_ATTR_CONFIG=$BASE/etc/slurm_attr.toml SATTR_CLUSTER_BASE=$BASE SATTR_BIN=$VENV/bin/sattr${PROM_BIN:+ SATTR_PROMETHEUS_URL=http://$PROM_ADDR}" ;;
    *) die "usage: $0 up|down|status|env|venv" ;;
esac
