import pytest

from slurm_attr.slurm.hostlist import expand


@pytest.mark.parametrize("expr, want", [
    ("n1", ["n1"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("gpu[01-02,7],cpu5", ["gpu01", "gpu02", "gpu7", "cpu5"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("", []),
    ("(null)", []),
])
def test_expand(expr, want):
    assert expand(expr) == want


def test_huge_range_is_refused():
    with pytest.raises(ValueError):
        expand("n[1-99999999]")
