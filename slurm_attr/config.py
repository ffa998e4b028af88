"""Site configuration: one TOML file, defaults in one place, unknown keys are errors.

Default path ``/etc/slurm/slurm_attr.toml``; ``SLURM_ATTR_CONFIG`` overrides it.
A missing file means all defaults. Each section is a dataclass below; its
fields, types and defaults are the configuration reference (README renders it
with ``sattr config --defaults``). What each value may be: configcheck.py.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on older Pythons only
    import tomli as tomllib

from .configcheck import MiB, validate
from .errors import ConfigError

DEFAULT_PATH = "/etc/slurm/slurm_attr.toml"
ENV_VAR = "SLURM_ATTR_CONFIG"


@dataclass
class Paths:
    # Per-job evidence dir on each node: the SPANK plugin creates <evidence_root>/<jobid>.
    # Must match the plugin's evidence_root= argument in plugstack.conf.
    evidence_root: str = "/var/tmp/slurm_attr"
    # Bundles are written under <spool>/bundles/<jobid>; on a real cluster this is a
    # filesystem the nodes and the controller share.
    spool: str = "/var/spool/slurm_attr"
    database: str = "/var/lib/slurm_attr/sattr.db"
    # EpilogSlurmctld gets neither PATH nor SLURM_CONF: the entry scripts use these.
    slurm_conf: str = "/etc/slurm/slurm.conf"
    slurm_bin: str = "/usr/bin"
    # Writes a finished job's comment through the accounting API (`make -C spank install`).
    # Without it sacctmgr is used, which lowercases the whole comment on Slurm 22.05.
    comment_tool: str = "/usr/libexec/slurm-attr/sattr-comment"
    # Root-written copies of verdicts, each readable by its job's user alone (`sattr JOBID`
    # for users). Empty: `verdicts` beside the database (whose directory then gets o+x).
    verdicts: str = ""
    # Node-local, root-only state of the node epilog: the ledger of kernel lines already
    # attributed to a job (collect/ledger.py). Local to each node, never shared.
    node_state: str = "/var/lib/slurm_attr/node"


@dataclass
class Collect:
    # Where the node's kernel messages come from: journalctl | dmesg | file
    kernel_source: str = "journalctl"
    # With kernel_source = "file": the file to read (may contain %n for the node name).
    kernel_file: str = ""
    kernel_cap_bytes: int = 4 * MiB
    # Root system units whose journal records are trusted evidence beside the kernel log
    # (comma-separated, e.g. "nvidia-fabricmanager.service"); checked by journald's own
    # _UID/_SYSTEMD_UNIT/_TRANSPORT fields. Empty: none read (collect/journal.py).
    journal_units: str = ""
    # The NVIDIA kernel module's own version text, compared across a job's nodes (may contain
    # %n for the node name; empty: not read). collect/software.py.
    driver_version_file: str = "/proc/driver/nvidia/version"
    # Seconds of kernel log before the job's start and after its end to include.
    window_slack_s: int = 120
    fr_cap_bytes: int = 256 * MiB  # all FR dumps of one node together
    fr_file_cap_bytes: int = 64 * MiB
    probe_cap_bytes: int = 64 * MiB
    nccl_cap_bytes: int = 8 * MiB
    output_tail_bytes: int = 2 * MiB
    max_files: int = 4096
    # Controller-side: daemon logs to search for lines about the job (comma-separated globs).
    scheduler_logs: str = ""
    # The node epilog's whole budget; keep it well under PrologEpilogTimeout.
    time_budget_s: float = 20.0
    # Remove the job's evidence dir on the node after collecting it.
    remove_job_dir: bool = True
    # Everything one job's node part may put on the spool (FR + probe + NCCL together).
    job_cap_bytes: int = 256 * MiB


@dataclass
class Analysis:
    # The controller side: EpilogSlurmctld records the ended job and a worker analyses it.
    # false turns it off (nothing recorded, nothing analysed; node epilogs still collect and drain).
    enabled: bool = True
    # Analysis workers on the controller at once, at low CPU and I/O priority, started by the
    # hook that finds a free slot (no daemon). 0: a quarter of the controller's cores (at least 1).
    workers: int = 2
    # How long the controller-side analysis waits for node parts of the bundle.
    node_wait_s: float = 30.0
    # Hard limit of one analysis run (the detached analyser is killed after this).
    timeout_s: float = 120.0
    # Workers wait before each job while the controller's CPU pressure (PSI "some avg10", percent)
    # is at least yield_pressure (0: never), but not past yield_max_s after the job's end.
    yield_pressure: float = 30.0
    yield_max_s: float = 60.0
    # Extra rule directory with site rules (added to the built-in catalog).
    extra_rules: str = ""
    # "slurm": a bundle of at least offload_min_nodes nodes or offload_min_bytes bytes is analysed
    # by a Slurm job in offload_partition/_qos/_account (the spool shared with those nodes);
    # "off": every analysis on the controller.
    offload: str = "off"
    offload_min_nodes: int = 256
    offload_min_bytes: int = 4 << 30
    offload_partition: str = ""
    offload_qos: str = ""
    offload_account: str = ""
    offload_time_s: int = 1800
    # The Python with slurm_attr on the analysis nodes ("": the worker's own).
    offload_python: str = ""


@dataclass
class Comment:
    enabled: bool = True
    # Comment or AdminComment. Comment needs AccountingStoreFlags=job_comment.
    field: str = "Comment"
    max_len: int = 400
    # How many times a queued comment write is retried before it is given up.
    max_attempts: int = 50


@dataclass
class Drain:
    enabled: bool = True
    # Record what would be done, do nothing.
    dry_run: bool = False
    # Use `scontrol reboot ASAP nextstate=DOWN` for catalog actions that need a reboot/reset.
    reboot: bool = False
    # Circuit breaker: at most max_drains automatic drains per window_s ...
    max_drains: int = 5
    window_s: int = 3600
    # ... and at most this share (percent) of a partition's nodes drained by us (always at
    # least one node per partition). Tripped, it stays alert-only until `sattr breaker reset`.
    max_partition_percent: float = 10.0
    # The node epilog drains its own node on fatal kernel evidence before the node goes idle.
    fast_path: bool = True


@dataclass
class Spool:
    # Bundles older than this many days are pruned by `sattr gc` (and after analyses); 0 keeps all.
    keep_days: float = 14.0
    # The bundles together stay under this; the oldest are pruned first (never a pending job's). 0: no cap.
    max_bytes: int = 20 * 1024 * MiB


@dataclass
class Retention:
    # Jobs analysed longer ago than this many days leave the verdict store (`sattr prune`, and
    # the analysis workers once a day); 0 keeps all. At least 31: the reasoning reads 30 days back.
    keep_days: float = 400.0


@dataclass
class Intake:
    # Ended jobs waiting for a stored verdict: one small file each, on the controller's local disk.
    queue_dir: str = "/var/lib/slurm_attr/pending"
    # How long one analyser keeps retrying a transient failure (database locked) before it
    # leaves the job to the next hook run or `sattr retry`.
    retry_for_s: float = 300.0
    # Backoff between retries of one job: doubles from 5 s up to this.
    backoff_max_s: float = 600.0
    # After this many failed attempts the job is given up (its partial verdict, if any, stays).
    max_attempts: int = 50
    # fsync the controller hook's record (and the queue dir) before it returns. Off: the job's end
    # is durable in Slurm's accounting, and the catch-up below finds a job a crash left without a
    # record (the two fsyncs were most of the hook's time under load). On for sites without
    # accounting (then also catchup_window_s = 0).
    hook_fsync: bool = False
    # The catch-up (`sattr retry`, and the workers at most once a minute): one sacct for the jobs
    # that ended since its last run (minus a margin; the first run: the last hour), looked back at
    # most this far, that have no verdict, no pending record and no record in flight. 0: off.
    catchup_window_s: float = 21600.0
    # At most this many jobs recorded per catch-up run (the oldest first; the rest next run).
    catchup_max_jobs: int = 5000
    # A job that ended this recently is its hook's own (its record may still be on its way):
    # the catch-up leaves it for the next run. Longer than the hook's worst case
    # (EpilogSlurmctld runs after the job's end, behind slurmctld's other work).
    catchup_min_age_s: float = 60.0


@dataclass
class Access:
    # Members of this Unix group see every job's verdict (root and SlurmUser always do).
    admin_group: str = ""


@dataclass
class Live:
    # Watch running jobs for hangs (slurm_attr/live/; started by the plugin's live_watcher=).
    enabled: bool = True
    # A communicator with a collective under way and no rank progressing this long is a hang;
    # raised to 4x the longest stall this job has recovered from (slow collectives).
    hang_after_s: float = 60.0
    # ... the ceiling of the threshold each communicator learns from its own rhythm (live/
    # hang/threshold.py: 3x the p99 of its gaps), which never goes below this floor.
    hang_floor_s: float = 5.0
    # How often each node's watcher reads its ranks' probe records.
    interval_s: float = 1.0
    # On a detected hang: "record" the finding only; "dump" also pulls every rank's Flight
    # Recorder (debug pipe, worker server) and Python stacks into the live spool while the
    # ranks still run; "cancel" also scancels the job when two sources agree (the probe's
    # detection and the dumped FR/stacks), saving the GPUs' remaining time.
    on_hang: str = "dump"
    # The same dumps this many seconds before the job's end time (a job killed at its time
    # limit leaves no FR dump of its own); 0 = never.
    dump_before_end_s: float = 60.0
    # Slow anomalies (slurm_attr/live/slow/anomalies.py; informational findings, never a drain).
    # S1 straggler: one rank last to enter in >= straggler_share of the last slow_window
    # collectives (at least slow_min_samples), by >= straggler_min_gap_ms (clock resolution and
    # NTP skew sit below it), and the job waited on it >= straggler_min_wait of its run time.
    slow_window: int = 500
    slow_min_samples: int = 30
    straggler_share: float = 0.5
    straggler_min_gap_ms: float = 5.0
    straggler_min_wait: float = 0.02
    # S2 slow link: a rank pair whose every step sits in the network (SendWait) >=
    # link_outlier_ratio x as long as the median pair's and link_outlier_mads robust deviations
    # (MAD) above it, among at least link_min_pairs pairs seen busy link_min_samples cycles each;
    # below link_min_send_wait (mean steps in SendWait per cycle) a pair is never slow.
    link_outlier_ratio: float = 4.0
    link_outlier_mads: float = 5.0
    link_min_send_wait: float = 0.25
    link_min_pairs: int = 4
    link_min_samples: int = 30  # at 10, a healthy 8-rank harness job's busiest pair crossed 7x by chance
    # S3 slow phase: the last phase_window collectives came phase_factor x slower than before
    # for every rank together, with no rank entering late.
    phase_factor: float = 3.0
    phase_window: int = 20
    # NCCL's RAS (NCCL >= 2.24, live/ras/opinion.py) as a second opinion before on_hang = "cancel" acts:
    # "auto" asks the RAS socket on the step leader's node (ras_addr, the jobs' NCCL_RAS_ADDR),
    # within ras_timeout_s; "off" never asks. RAS agreeing counts like the dumps agreeing.
    ras: str = "auto"
    ras_addr: str = "localhost:28028"
    ras_timeout_s: float = 5.0
    # Budgets: a job's ranks answer a root watcher, so everything they can make it write or
    # hold is capped (live/budget.py). Bytes one job may hold in the live spool (<spool>/live/
    # <job>: summaries, snapshots, pre-kill dumps) over all its nodes and steps; each node
    # keeps its share, min(node_cap_bytes, job_cap_bytes / the step's nodes). Over it, the
    # node's oldest and largest dumps go first and the dumps' coverage says what went.
    job_cap_bytes: int = 1024 * MiB
    node_cap_bytes: int = 128 * MiB
    # Worker sockets one node's watcher talks to per collection or FR poll, all of them at
    # once under one deadline of collect_timeout_s (each request also within 3 s).
    max_sockets: int = 64
    collect_timeout_s: float = 10.0
    # Watcher processes per node (over all jobs); a step beyond them is adopted by a running
    # watcher (at most steps_per_watcher steps each, its own job's first) or, with every
    # watcher full, waits unwatched until one has room (its coverage says so).
    max_watchers: int = 4
    steps_per_watcher: int = 16
    # Address space of one watcher process (RLIMIT_AS); a reply that would need more is
    # refused before it is parsed (its rank's coverage says why), never the cycle.
    watcher_mem_bytes: int = 512 * MiB


@dataclass
class Actions:
    """What Slurm does after a verdict beyond the drain (issue: closing the loop). Everything is
    off until the site opts in; the drain breaker ([drain] max_drains ...) covers every action."""
    # Requeue a batch job (one that allows requeue) that ended on one of these verdict causes or
    # domains (e.g. ["hardware", "node_failure"]), after its node was drained: it runs again on
    # healthy nodes. Never for a user or scheduler cause (policy.toml [requeue]). [] = never.
    requeue_on: list[str] = field(default_factory=list)
    # At most this many requeues by slurm-attr per job (Slurm's own Restarts count is separate).
    max_requeues: int = 1
    # Requeue ahead of the queue where the running Slurm can (25.11's expedited requeue).
    requeue_expedite: bool = True
    # Also write the verdict line into the job's AdminComment (admins' field, users cannot change
    # it) beside [comment] field.
    admin_comment: bool = False
    # A symptom whose recovery action is "reboot" (the catalog, or Xid 154's own text):
    # `scontrol reboot ASAP nextstate=RESUME reason="SATTR: ..."` (needs the site's RebootProgram);
    # false: drain only. ([drain] reboot, the older key, reboots into DOWN for reset and reboot.)
    reboot: bool = False
    # A symptom whose recovery action is "reset": the node is drained, then this command runs on
    # the controller with %n the node, %g the GPU's PCI address, %r the reason (e.g.
    # "ssh %n nvidia-smi -r -i %g"); "" = drain only. Exit 0 is recorded as done.
    reset_command: str = ""
    action_timeout_s: float = 300.0
    # `sattr undrain NODE --diag` and auto_undrain run this (%n the node; e.g.
    # "ssh %n dcgmi diag -r 3") and resume only when it exits 0.
    diag_command: str = ""
    diag_timeout_s: float = 3600.0
    # Resume a node we drained once its diagnostic passes, auto_undrain_after_s after the drain,
    # at most once per drain, never for a GPU that recurs (its verdict said so).
    auto_undrain: bool = False
    auto_undrain_after_s: float = 1800.0
    # The node Prolog (epilog/prolog) reads kernel events since the node's last job and drains on
    # a trusted fatal one; false: it returns at once.
    prolog_gate: bool = True


@dataclass
class Slurm:
    # How slurm-attr talks to Slurm: "auto" uses pyslurm when it is installed and its release
    # line matches the running Slurm (slurm/select.py), else the CLI tools; "cli" or "pyslurm"
    # forces one (a forced pyslurm that cannot be used is an error, not a silent CLI).
    backend: str = "auto"


@dataclass
class Metrics:
    """The fleet view's Prometheus metrics (docs/metrics.md)."""
    # node_exporter textfile the controller's analysis worker rewrites (atomically) after the
    # verdicts it stores (at most every 5 s, and once its queue is drained),
    # e.g. /var/lib/prometheus/node-exporter/sattr.prom; "" = not written.
    textfile: str = ""
    # The `cluster` label; "" = slurm.conf's ClusterName.
    cluster: str = ""
    # A node is a lemon (fleet report; the alert rule has its own threshold) at this many
    # hardware verdicts naming it in 7 days.
    lemon_verdicts: int = 3


@dataclass
class Config:
    paths: Paths = field(default_factory=Paths)
    collect: Collect = field(default_factory=Collect)
    analysis: Analysis = field(default_factory=Analysis)
    comment: Comment = field(default_factory=Comment)
    drain: Drain = field(default_factory=Drain)
    access: Access = field(default_factory=Access)
    spool: Spool = field(default_factory=Spool)
    store: Retention = field(default_factory=Retention)
    intake: Intake = field(default_factory=Intake)
    live: Live = field(default_factory=Live)
    slurm: Slurm = field(default_factory=Slurm)
    actions: Actions = field(default_factory=Actions)
    metrics: Metrics = field(default_factory=Metrics)
    source: str = ""  # the file it was read from, "" for defaults

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source", None)
        return d


def _coerce(section: str, key: str, want: type, value: Any) -> Any:
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if want is bool and not isinstance(value, bool):
        raise ConfigError(f"[{section}] {key}: expected true or false, got {value!r}")
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise ConfigError(f"[{section}] {key}: expected {want.__name__}, got {value!r}")
    return value


def from_dict(data: dict[str, Any], source: str = "") -> Config:
    cfg = Config(source=source)
    for section, values in data.items():
        sect_field = next((f for f in dataclasses.fields(Config) if f.name == section and f.name != "source"), None)
        if sect_field is None:
            raise ConfigError(f"{source or 'config'}: unknown section [{section}]")
        if not isinstance(values, dict):
            raise ConfigError(f"{source or 'config'}: [{section}] must be a table")
        obj = getattr(cfg, section)
        types = {f.name: f.type for f in dataclasses.fields(obj)}
        for key, value in values.items():
            if key not in types:
                raise ConfigError(f"{source or 'config'}: unknown key '{key}' in [{section}]")
            if str(types[key]) == "list[str]":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ConfigError(f"[{section}] {key}: expected a list of strings, got {value!r}")
                setattr(obj, key, list(value))
                continue
            want = {"str": str, "int": int, "float": float, "bool": bool}[str(types[key])]
            setattr(obj, key, _coerce(section, key, want, value))
    validate(cfg)
    return cfg


def config_path() -> str:
    return os.environ.get(ENV_VAR) or DEFAULT_PATH


def load(path: str | None = None) -> Config:
    """Load the site config. A missing default file means defaults; a missing named file is an error."""
    explicit = path is not None or ENV_VAR in os.environ
    path = path or config_path()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError as err:
        if explicit:
            raise ConfigError(f"{path}: no such config file") from err
        return Config(source="")
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror}") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from err
    return from_dict(data, source=path)
