"""DEVELOPERS.md's package map lists exactly the modules of slurm_attr/ (issue 27: the map of the
package matches the tree). Run as a script, it prints the table's rows from the tree."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `(slurm_attr/[^`]+\.py)` \|", re.M)


def tree_modules() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "slurm_attr").rglob("*.py") if "__pycache__" not in p.parts)


def first_sentence(path: Path, limit: int = 150) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return (first[:limit].rsplit(" ", 1)[0] + " …") if len(first) > limit else (first or "-")


def test_the_map_lists_every_module_and_no_other():
    listed = ROW.findall((REPO / "DEVELOPERS.md").read_text())
    tree = tree_modules()
    assert sorted(set(tree) - set(listed)) == [], "modules missing from DEVELOPERS.md's package map"
    assert sorted(set(listed) - set(tree)) == [], "DEVELOPERS.md's package map lists modules that are gone"
    assert len(listed) == len(set(listed)), "a module listed twice"


def test_the_check_sees_a_near_miss(tmp_path):
    # the row pattern itself: a module named in prose is not a row
    text = "see `slurm_attr/store.py` for more\n| `slurm_attr/x.py` | y |\n"
    assert ROW.findall(text) == ["slurm_attr/x.py"]


if __name__ == "__main__":
    print("| module | what it owns |\n|---|---|")
    for m in tree_modules():
        print(f"| `{m}` | {first_sentence(REPO / m).replace('|', '/')} |")
