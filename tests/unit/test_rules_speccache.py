"""The on-disk catalog cache: used only when safe and current; inline cases never run in an analysis."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from slurm_attr.errors import RuleError
from slurm_attr.rules import build_catalog, catalog, extract_lines, load_catalog, speccache

XID79 = "[Thu May  2 10:00:03 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, name=python, GPU has fallen off the bus."


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("SLURM_ATTR_CACHE_DIR", str(d))
    catalog._cached.cache_clear()
    yield d
    catalog._cached.cache_clear()


def _entries(d):
    return sorted(p.name for p in d.iterdir() if p.name.startswith("catalog-"))


def _parses(monkeypatch):
    calls = []
    real = catalog._parse_toml_rules

    def counting(files):
        calls.append(len(files))
        return real(files)

    monkeypatch.setattr(catalog, "_parse_toml_rules", counting)
    return calls


def test_rules_cache_is_written_then_read_instead_of_parsing(cache_dir, monkeypatch):
    calls = _parses(monkeypatch)
    first = load_catalog()
    assert calls and len(_entries(cache_dir)) == 1
    catalog._cached.cache_clear()
    second = load_catalog()
    assert len(calls) == 1  # the second load parsed no TOML
    assert [catalog.rule_spec(r) for r in second.rules] == [catalog.rule_spec(r) for r in first.rules]
    [s] = extract_lines(second, "kernel", "n3", "k", [(1, XID79)])
    assert (s.id, s.action, s.gpu) == ("gpu.xid_79", "reboot", "0000:3b:00")


def test_rules_cache_writable_by_others_is_ignored(cache_dir, monkeypatch):
    calls = _parses(monkeypatch)
    load_catalog()
    os.chmod(cache_dir, 0o777)  # anyone could have put rules (and drain actions) there
    catalog._cached.cache_clear()
    load_catalog()
    assert len(calls) == 2


def test_rules_cache_entry_for_another_key_is_ignored(cache_dir, monkeypatch):
    calls = _parses(monkeypatch)
    load_catalog()
    [name] = _entries(cache_dir)
    path = cache_dir / name
    path.write_text(path.read_text().replace('"key":"', '"key":"0', 1))
    catalog._cached.cache_clear()
    load_catalog()
    assert len(calls) == 2


def test_rules_cache_file_behind_a_symlink_is_ignored(cache_dir, monkeypatch, tmp_path):
    calls = _parses(monkeypatch)
    load_catalog()
    [name] = _entries(cache_dir)
    real = tmp_path / "elsewhere.json"
    (cache_dir / name).rename(real)
    (cache_dir / name).symlink_to(real)
    catalog._cached.cache_clear()
    load_catalog()
    assert len(calls) == 2


def test_rules_cache_key_follows_the_rule_bytes():
    files = [("rules/a.toml", b'id = "a.b"\n')]
    assert speccache.key_for(files, [catalog.__file__]) == speccache.key_for(list(files), [catalog.__file__])
    assert speccache.key_for(files, [catalog.__file__]) != speccache.key_for([("rules/a.toml", b'id = "a.c"\n')], [catalog.__file__])
    assert speccache.key_for(files, [catalog.__file__]) != speccache.key_for(files, [speccache.__file__])


def test_rules_unwritable_cache_is_silent(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_ATTR_CACHE_DIR", str(tmp_path / "file-not-dir" / "x"))
    (tmp_path / "file-not-dir").write_text("")
    catalog._cached.cache_clear()
    try:
        assert len(load_catalog().rules) > 50
    finally:
        catalog._cached.cache_clear()


BROKEN_CASE = textwrap.dedent('''\
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
    expect = { message = "FAULTY GPU 4" }

    [[cases]]
    nomatch = "gpu_burn: OK 100.0%"
    ''')


def test_rules_analysis_load_does_not_run_inline_cases(tmp_path, cache_dir):
    site = tmp_path / "site"
    site.mkdir()
    (site / "site.gpu_burn_failed.toml").write_text(BROKEN_CASE)
    cat = load_catalog(str(site))  # an analysis: the wrong example does not stop it
    assert "site.gpu_burn_failed" in cat.ids()
    with pytest.raises(RuleError, match="site.gpu_burn_failed case 1"):
        build_catalog(str(site), check=True)  # `sattr rules test` and CI still catch it


def test_rules_catalog_load_imports_no_selftest():
    code = ("import sys; from slurm_attr.rules import load_catalog; load_catalog(); "
            "print('slurm_attr.rules.selftest' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
