"""Loading and validating the catalog: broken rules name their file and reason."""
from __future__ import annotations

import textwrap
from collections import Counter

import pytest

from slurm_attr.errors import RuleError
from slurm_attr.model import CAUSES
from slurm_attr.rules import build_catalog, extract_lines, load_catalog

GOOD = textwrap.dedent('''\
    id = "site.gpu_burn_failed"
    status = "experimental"
    priority = 50
    role = "root"
    cause = "user_error"
    sources = ["stdout"]
    keywords = ["gpu_burn"]
    regex = 'gpu_burn: (?P<message>FAULTY .*)'

    [[cases]]
    match = "gpu_burn: FAULTY GPU 3"
    expect = { message = "FAULTY GPU 3" }

    [[cases]]
    nomatch = "gpu_burn: OK 100.0%"
    ''')


def _site(tmp_path, text, name="site.gpu_burn_failed.toml"):
    d = tmp_path / "site"
    d.mkdir(exist_ok=True)
    (d / name).write_text(text)
    return str(d)


def test_rules_catalog_loads_and_is_cached():
    a = load_catalog()
    assert a is load_catalog()
    assert len(a.rules) >= 90
    ids = a.ids()
    assert len(ids) == len(set(ids))


def test_rules_catalog_covers_every_signal_family():
    families = Counter(r.family for r in load_catalog().rules)
    for fam in ("gpu", "nvlink", "host", "net", "fs", "nccl", "torch", "cuda", "slurm", "launch", "python"):
        assert families[fam] >= 1, fam
    ids = {r.id for r in load_catalog().rules}
    # a few that the research calls out by name
    for rid in ("gpu.fallen_off_bus", "nvlink.sxid_fatal", "host.pcie_aer_fatal", "host.edac_ue", "host.oom_kill",
                "net.ib_link_down", "fs.nfs_not_responding", "nccl.ib_completion_error", "torch.watchdog_timeout",
                "cuda.oom", "torch.root_cause", "slurm.oom_event", "slurm.cancel_time_limit", "launch.pyxis"):
        assert rid in ids


def test_rules_site_rule_is_loaded_and_used(tmp_path):
    cat = build_catalog(_site(tmp_path, GOOD))
    syms = extract_lines(cat, "stdout", "n1", "out", [(7, "gpu_burn: FAULTY GPU 3")])
    assert [(s.id, s.fields["message"], s.evidence[0].line) for s in syms] == [("site.gpu_burn_failed", "FAULTY GPU 3", 7)]


@pytest.mark.parametrize("mutate,reason", [
    (lambda t: t.replace("(?P<message>FAULTY .*)", "(?P<message>FAULTY"), "regex does not compile"),
    (lambda t: t.replace('"site.gpu_burn_failed"', '"site.other"'), "differs from the file name"),
    (lambda t: t + 'colour = "red"\n', "unknown key(s) colour"),
    (lambda t: t.replace('priority = 50', 'priority = "high"'), "priority must be an integer"),
    (lambda t: t.replace('cause = "user_error"', 'cause = "gremlins"'), "not a cause word"),
    (lambda t: t.replace('sources = ["stdout"]', 'sources = ["dmesg"]'), "unknown source"),
    (lambda t: t.replace("(?P<message>", "(?P<colour>"), "unknown field name"),
    (lambda t: t.replace('role = "root"', 'role = "root"\naction = "drain"'), "needs a hardware cause"),
    (lambda t: t.replace('match = "gpu_burn: FAULTY GPU 3"', 'match = "gpu_burn: OK 99%"'), "no match"),
    (lambda t: t.replace('nomatch = "gpu_burn: OK 100.0%"', 'nomatch = "gpu_burn: FAULTY GPU 1"'), "near-miss"),
    (lambda t: t.replace('expect = { message = "FAULTY GPU 3" }', 'expect = { message = "FAULTY GPU 4" }'), "expected"),
    (lambda t: t.split("[[cases]]\nnomatch")[0], "one nomatch case"),
    (lambda t: t.replace('keywords = ["gpu_burn"]', 'keywords = ["gb"]'), "at least 3 characters"),
])
def test_rules_broken_site_rule_names_file_and_reason(tmp_path, mutate, reason):
    with pytest.raises(RuleError) as err:
        build_catalog(_site(tmp_path, mutate(GOOD)), check=True)
    assert "site.gpu_burn_failed.toml" in str(err.value)
    assert reason in str(err.value)


def test_rules_duplicate_id_is_refused(tmp_path):
    d = _site(tmp_path, GOOD.replace("site.gpu_burn_failed", "cuda.oom"), name="cuda.oom.toml")
    with pytest.raises(RuleError, match="already used"):
        build_catalog(d, check=False)


def test_rules_bad_toml_is_refused(tmp_path):
    with pytest.raises(RuleError, match="not valid TOML"):
        build_catalog(_site(tmp_path, "id = \n"), check=False)


def test_rules_missing_site_dir_is_an_error(tmp_path):
    with pytest.raises(RuleError, match="does not exist"):
        build_catalog(str(tmp_path / "nope"))


def test_rules_actions_only_on_hardware_rules():
    for r in load_catalog().rules:
        if r.action != "none":
            assert CAUSES[r.cause] == "hardware", r.id


def test_rules_xid_table_decisions():
    from slurm_attr.rulebook.gpu_xid import TABLE

    assert TABLE[45].role == "cascade"
    for xid in (43, 63, 92):
        assert TABLE[xid].action == "none"
    for xid in (13, 31, 43):
        assert TABLE[xid].cause == "user_error"
    assert TABLE[79].action == "reboot" and TABLE[79].cause == "gpu_hardware"
    assert all(TABLE[x].cause in ("nvlink", "unknown") for x in range(144, 151))


@pytest.mark.parametrize("source", ["kernel", "stdout", "stderr", "nccl", "scheduler"])
def test_rules_prefilter_knows_every_keyword_of_its_source(source):
    # Every keyword of every rule of the source selects that rule: a keyword the prefilter
    # missed would make its rule silently blind.
    index = load_catalog().index(source)
    by_kw = dict(zip(index.prefilter.keywords, index.prefilter.positions))
    for pos, rule in enumerate(index.rules):
        for kw in rule.keywords:
            assert pos in by_kw.get(kw.lower(), ()), (rule.id, kw)


def test_rules_no_regex_goes_quadratic_on_a_long_hostile_line():
    # Job output is hostile and lines are cut at 16 KB: a pattern that backtracks over the
    # whole line at every start position would take seconds here instead of milliseconds.
    # CPU time of this thread, not wall time: a loaded machine must not fail it.
    import time

    for rule in load_catalog().rules:
        kw = rule.keywords[0]
        for filler in ("-", "a", "(a)", "0:"):
            pad = filler * (16000 // len(filler))
            for line in (kw + pad, pad + kw):
                text = "\n".join([line] * rule.window)
                t0 = time.thread_time()
                rule.regex.search(text)
                assert time.thread_time() - t0 < 0.5, (rule.id, filler)
