import pytest

from slurm_attr import config
from slurm_attr.errors import ConfigError


def test_missing_default_file_means_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("SLURM_ATTR_CONFIG", raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", str(tmp_path / "none.toml"))
    cfg = config.load()
    assert cfg.comment.field == "Comment" and cfg.collect.kernel_source == "journalctl"


def test_missing_named_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        config.load(str(tmp_path / "none.toml"))


def test_env_var_selects_file(monkeypatch, tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[comment]\nfield = "AdminComment"\n[collect]\ntime_budget_s = 5\n')
    monkeypatch.setenv("SLURM_ATTR_CONFIG", str(p))
    cfg = config.load()
    assert cfg.comment.field == "AdminComment"
    assert cfg.collect.time_budget_s == 5.0 and isinstance(cfg.collect.time_budget_s, float)
    assert cfg.source == str(p)


@pytest.mark.parametrize("text, msg", [
    ("[paths]\nspoool = '/x'\n", "unknown key 'spoool' in \\[paths\\]"),
    ("[pathz]\n", "unknown section \\[pathz\\]"),
    ("[drain]\nmax_drains = 'five'\n", "max_drains: expected int"),
    ("[drain]\nenabled = 1\n", "enabled: expected true or false"),
    ("[comment]\nfield = 'Notes'\n", "field: must be Comment or AdminComment"),
    ("[collect]\nkernel_source = 'file'\n", "kernel_file: required"),
    ("[collect\n", "not valid TOML"),
])
def test_bad_config_names_the_problem(tmp_path, text, msg):
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=msg):
        config.load(str(p))
