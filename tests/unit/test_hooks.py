"""The hook entry points never fail: a bad config or bad environment is logged, exit 0."""
import logging
import time

from slurm_attr import hooks


def test_bad_config_is_logged_and_exit_zero(tmp_path, monkeypatch, caplog):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[collect]\nkernel_sauce = 'file'\n")
    monkeypatch.setenv("SLURM_ATTR_CONFIG", str(cfg))
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    with caplog.at_level(logging.ERROR, logger="slurm_attr"):
        assert hooks.main(["node"]) == 0
        assert hooks.main(["controller"]) == 0
    assert "kernel_sauce" in caplog.text


def test_bad_environment_is_refused_without_touching_anything(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SLURM_JOB_ID", "../../etc")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    with caplog.at_level(logging.ERROR, logger="slurm_attr"):
        assert hooks.main(["node"]) == 0
    assert "bad SLURM_JOB_ID" in caplog.text
    assert hooks.main(["analyze", "../x"]) == 0
    assert hooks.main([]) == 0


def test_node_hook_collects_with_a_good_config(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"""[paths]
evidence_root = "{tmp_path}/ev"
spool = "{tmp_path}/spool"
database = "{tmp_path}/db/s.db"
node_state = "{tmp_path}/state"
[collect]
kernel_source = "file"
kernel_file = "{tmp_path}/k-%n.log"
""")
    (tmp_path / "ev").mkdir()
    (tmp_path / "k-n3.log").write_text("")  # read (empty): the mark moves; a missing log would not move it
    monkeypatch.setenv("SLURM_ATTR_CONFIG", str(cfg))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURMD_NODENAME", "n3")
    monkeypatch.setenv("SPANK_SATTR_ENABLED", "0")
    assert hooks.main(["node"]) == 0
    assert (tmp_path / "spool" / "bundles" / "77" / "nodes" / "n3" / "collect.json").is_file()
    # The node's last read, for the next job's Prolog gate (gate.py): this job's window end.
    from slurm_attr.collect import ledger

    end, job = ledger.read_mark(str(tmp_path / "state"), "n3")
    assert job == "77" and abs(end - time.time()) < 60
