"""The after-job pipeline's shape (issue 23): a stage imports only earlier stages, only the
drivers import stages, and nothing outside the pipeline reaches into its drivers but the hooks
and the `sattr retry` command."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "slurm_attr"
STAGES = ["intake", "ctldrecord", "settle", "catchup", "reconcile", "finish"]  # the record first: every stage reads it
DRIVERS = ["attempt", "batch", "pool"]


def _pipeline_imports(path: Path) -> set[str]:
    """Pipeline modules a file imports (relative or absolute, at any depth in the file)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            names = [a.name for a in node.names]
            if path.parent.name == "pipeline" and node.level == 1:
                out.update([mod.split(".")[0]] if mod else names)
            elif mod.endswith("pipeline") or mod == "slurm_attr.pipeline":
                out.update(names)
            elif ".pipeline." in f".{mod}.":
                out.add(mod.split("pipeline.", 1)[1].split(".")[0])
    return out & set(STAGES + DRIVERS)


def test_stages_import_only_earlier_stages():
    for i, stage in enumerate(STAGES):
        got = _pipeline_imports(PKG / "pipeline" / f"{stage}.py")
        later = got - set(STAGES[:i])
        assert not later, f"pipeline/{stage}.py imports {sorted(later)}: a later stage or a driver"


def test_only_hooks_and_the_retry_command_drive_the_pipeline_from_outside():
    allowed = {PKG / "hooks.py", PKG / "cli" / "pending.py"}
    for path in PKG.rglob("*.py"):
        if path.parent.name == "pipeline" or path in allowed:
            continue
        drives = _pipeline_imports(path) & set(DRIVERS)
        assert not drives, f"{path.relative_to(PKG)} imports the pipeline's drivers {sorted(drives)}"


def test_the_check_sees_an_import_near_miss(tmp_path):
    # The checker itself: a later stage imported inside a function is found.
    d = tmp_path / "pipeline"
    d.mkdir()
    f = d / "settle.py"
    f.write_text("def f():\n    from . import finish\n    from .intake import load\n")
    assert _pipeline_imports(f) == {"finish", "intake"}
