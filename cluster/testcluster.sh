#!/usr/bin/env bash
# A real Slurm 22.05 cluster on this one machine, for `make demo`, `make test` and CI:
# munge, MariaDB on loopback, slurmdbd, slurmctld and four slurmd (n1..n4) started as
# root without systemd, with the slurm-attr SPANK plugin and epilogs wired in.
#
#   cluster/testcluster.sh up       install what is missing, (re)start, wait until idle
#   cluster/testcluster.sh down     stop only the daemons this script started (by pid)
#   cluster/testcluster.sh status   what runs
#   cluster/testcluster.sh env      print the exports a shell needs (eval "$(... env)")
#
# Idempotent: `up` on a healthy cluster with an unchanged config only checks it.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BASE=${SATTR_CLUSTER_BASE:-/var/lib/sattr-testcluster}
NODES=(n1 n2 n3 n4)
DBPORT=3307
CONF=$BASE/etc/slurm.conf
PIDS=$BASE/run/started.pids      # "name pid" per line: what we started and may stop
VENV=$BASE/venv
PY=$VENV/bin/python

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
    local need=() p
    for p in slurmctld slurmd slurm-client slurmdbd mariadb-server munge libslurm-dev gcc make libc6-dev \
             python3 python3-venv; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
    done
    [ ${#need[@]} -eq 0 ] && return 0
    log "installing ${need[*]}"
    local made_policy=0
    # Keep postinst scripts from starting daemons; only remove a policy file we created.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; made_policy=1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    [ $made_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
    return 0
}

src_hash() {
    (cd "$REPO" && find slurm_attr rules pyproject.toml -type f \( -name '*.py' -o -name '*.toml' -o -name '*.tsv' \) \
        -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 cat | sha256sum | cut -c1-16)
}

install_venv() {
    # slurm-attr as a site installs it: a venv from Debian's python3, readable by every user
    # (the hooks run it as root; users run its `sattr`). Reinstalled when the source changes.
    if [ ! -x "$PY" ]; then
        /usr/bin/python3 -m venv "$VENV"
        "$PY" -m pip install -q --disable-pip-version-check 'click>=8' 'sqlite-utils>=3.30' 'setuptools>=64' wheel >&2
    fi
    local h; h=$(src_hash)
    if [ "$(cat "$VENV/.src-hash" 2>/dev/null)" != "$h" ]; then
        local tmp; tmp=$(mktemp -d)
        # Build from a copy: the checkout may not be writable for build dirs, or may be under /root.
        (cd "$REPO" && tar cf - --exclude=__pycache__ pyproject.toml README.md slurm_attr rules) | (cd "$tmp" && tar xf -)
        touch "$tmp/README.md"
        "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall "$tmp" >&2
        rm -rf "$tmp"
        echo "$h" > "$VENV/.src-hash"
    fi
    chmod -R a+rX "$VENV"
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
    setsid mariadbd --no-defaults --user=root --datadir="$data" --socket="$sock" --port=$DBPORT \
        --bind-address=127.0.0.1 --pid-file="$BASE/run/mariadbd.pid" --log-error="$BASE/log/mariadbd.err" \
        --innodb-buffer-pool-size=64M --innodb-log-file-size=16M --skip-name-resolve </dev/null >/dev/null 2>&1 9>&- &
    for _ in $(seq 100); do [ -S "$sock" ] && mariadb --no-defaults -S "$sock" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
    [ -s "$BASE/run/mariadbd.pid" ] || die "mariadbd did not start (see $BASE/log/mariadbd.err)"
    echo "mariadbd $(cat "$BASE/run/mariadbd.pid")" >> "$PIDS"
    mariadb --no-defaults -S "$sock" <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'sattr-test';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'sattr-test';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL
}

write_config() {
    local host; host=$(hostname -s)
    getent hosts "$host" >/dev/null || echo "127.0.0.1 $host" >> /etc/hosts
    mkdir -p "$BASE"/{etc,run,log,state,spool,hooks,kernel,evidence,attr} "$BASE"/attr/spool
    chmod 755 "$BASE" "$BASE/evidence"
    for n in "${NODES[@]}"; do mkdir -p "$BASE/spool/slurmd-$n"; touch "$BASE/kernel/$n.log"; done

    # Hook wrappers: slurmd/slurmctld run hooks with a bare environment; these say where
    # the config and the interpreter are, then hand over to the real entry scripts.
    for hook in epilog epilog_slurmctld; do
        cat > "$BASE/hooks/$hook.new" <<EOF
#!/bin/sh
export SLURM_ATTR_CONFIG=$BASE/etc/slurm_attr.toml SLURM_ATTR_PYTHON=$PY SLURM_CONF=$CONF
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

    cat > "$BASE/etc/slurm_attr.toml.new" <<EOF
[paths]
evidence_root = "$BASE/evidence"
spool = "$BASE/attr/spool"
database = "$BASE/attr/sattr.db"
slurm_conf = "$CONF"
slurm_bin = "/usr/bin"
comment_tool = "$BASE/lib/sattr-comment"

[collect]
kernel_source = "file"
kernel_file = "$BASE/kernel/%n.log"
scheduler_logs = "$BASE/log/slurmctld.log,$BASE/log/slurmd-*.log"
# Tests inject kernel lines seconds apart on the same pretend nodes: a small slack keeps
# one test's Xid out of the next job's window (sites keep the 120 s default).
window_slack_s = 2
time_budget_s = 20

[analysis]
node_wait_s = 20
EOF

    cat > "$BASE/etc/plugstack.conf.new" <<EOF
optional $BASE/lib/slurm_attr.so evidence_root=$BASE/evidence probe_lib=$BASE/lib/libnccl-profiler-sattr.so
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

    cat > "$CONF.new" <<EOF
ClusterName=sattrtest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
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
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
MinJobAge=3600
KillWait=5
MailProg=/bin/true
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
PlugStackConfig=$BASE/etc/plugstack.conf
Epilog=$BASE/hooks/epilog
EpilogSlurmctld=$BASE/hooks/epilog_slurmctld
PrologEpilogTimeout=60
NodeName=n[1-4] NodeHostname=$host NodeAddr=127.0.0.1 Port=[17001-17004] CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    # Renamed into place: a concurrent reader (a test, a daemon) never sees a half-written file.
    for f in "$BASE/etc/slurm_attr.toml" "$BASE/etc/plugstack.conf" "$BASE/etc/slurmdbd.conf" "$CONF"; do
        if cmp -s "$f.new" "$f"; then rm -f "$f.new"; else mv "$f.new" "$f"; fi
    done
}

config_hash() {
    { cat "$CONF" "$BASE/etc/plugstack.conf" "$BASE/etc/slurmdbd.conf" "$BASE/lib/slurm_attr.so" 2>/dev/null || true; } | sha256sum | cut -c1-16
}

all_alive() {
    [ -s "$PIDS" ] || return 1
    local name pid n=0
    while read -r name pid; do
        alive "$pid" "${name%%:*}" || return 1
        n=$((n + 1))
    done < "$PIDS"
    [ $n -ge 7 ]   # mariadbd, slurmdbd, slurmctld, 4 slurmd (+ munged if we started it)
}

nodes_idle() {
    local out; out=$(SLURM_CONF=$CONF sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
    [ "$(echo "$out" | awk '$2=="idle"' | sort -u | wc -l)" -eq ${#NODES[@]} ]
}

stop() {
    # Daemons started with our config but not recorded (an interrupted start) are ours too.
    local stray
    for stray in $(pgrep -f -- "-f $CONF" 2>/dev/null); do
        grep -q " $stray\$" "$PIDS" 2>/dev/null || echo "$(cat /proc/$stray/comm 2>/dev/null || echo x) $stray" >> "$PIDS"
    done
    [ -s "$PIDS" ] || return 0
    SLURM_CONF=$CONF timeout 10 scancel --full --user=root 2>/dev/null || true
    local name pid comm
    # Reverse start order: slurmd, slurmctld, slurmdbd, mariadbd, munged.
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
    rm -f "$PIDS" "$BASE/run/config.hash"
}

start() {
    : > "$PIDS"
    start_munge
    start_mariadb
    export SLURM_CONF=$CONF
    slurmdbd 9>&-
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/6819) 2>/dev/null && break; sleep 0.1; done
    echo "slurmdbd $(cat "$BASE/run/slurmdbd.pid")" >> "$PIDS"
    # State (job ids, drain reasons) survives restarts; job ids must keep growing because
    # slurmdbd remembers every earlier job. Leftover drains are resumed below.
    slurmctld -f "$CONF" 9>&-
    for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
    echo "slurmctld $(cat "$BASE/run/slurmctld.pid")" >> "$PIDS"
    for n in "${NODES[@]}"; do
        rm -f "$BASE/run/slurmd-$n.pid"
        slurmd -f "$CONF" -N "$n" 9>&-
    done
    for n in "${NODES[@]}"; do
        # slurmd writes its pid file a moment after daemonizing.
        for _ in $(seq 100); do [ -s "$BASE/run/slurmd-$n.pid" ] && break; sleep 0.05; done
        echo "slurmd $(cat "$BASE/run/slurmd-$n.pid")" >> "$PIDS"
    done
    for _ in $(seq 200); do sacctmgr -n -P list cluster 2>/dev/null | grep -q '^sattrtest|' && break; sleep 0.1; done
    config_hash > "$BASE/run/config.hash"
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
    mkdir -p "$BASE/run" "$BASE/log"
    make -s -C "$REPO/spank" all >&2 || die "building the SPANK plugin failed"
    # Installed like `make install` would: a root-owned, world-readable place (the probe is
    # loaded by the job's own processes, which may not be able to read the checkout).
    mkdir -p "$BASE/lib"
    for so in slurm_attr.so libnccl-profiler-sattr.so sattr-comment; do
        if [ -f "$REPO/spank/build/$so" ] && ! cmp -s "$REPO/spank/build/$so" "$BASE/lib/$so"; then
            install -m 0755 "$REPO/spank/build/$so" "$BASE/lib/$so.new" && mv "$BASE/lib/$so.new" "$BASE/lib/$so"
        fi
    done
    write_config
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
mkdir -p "$BASE"
exec 9>"$BASE/.lock"
case ${1:-up} in
    up) flock 9; up ;;
    down) flock 9; stop; log "down" ;;
    status) all_alive && echo "up" || echo "down"; SLURM_CONF=$CONF sinfo -N -o '%N %T %E' 2>/dev/null || true ;;
    env) echo "export SLURM_CONF=$CONF SLURM_ATTR_CONFIG=$BASE/etc/slurm_attr.toml SATTR_CLUSTER_BASE=$BASE SATTR_BIN=$VENV/bin/sattr" ;;
    *) die "usage: $0 up|down|status|env" ;;
esac
