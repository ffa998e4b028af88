"""Slurm access: one interface (base.SlurmAccess); the CLI backend, and pyslurm where it matches
(select.py). The backend is chosen when first asked for: importing this package (the hook does,
for base.FINAL_STATES) loads neither backend."""
from __future__ import annotations

from .base import SlurmAccess


def default_backend(slurm_bin: str, slurm_conf: str, timeout: float = 15.0,
                    comment_tool: str = "", backend: str = "auto") -> "SlurmAccess":
    """The backend ``[slurm] backend`` names (select.py): pyslurm where its release line
    matches the running Slurm, else the CLI."""
    from .select import choose  # here, not at import: see the module doc

    return choose(backend, slurm_bin, slurm_conf, timeout=timeout, comment_tool=comment_tool)[0]  # type: ignore[return-value]


def from_config(cfg: "object", timeout: float = 15.0) -> "SlurmAccess":
    """The backend a config describes (paths to the Slurm tools and the comment writer)."""
    paths = cfg.paths  # type: ignore[attr-defined]
    slurm = getattr(cfg, "slurm", None)
    return default_backend(paths.slurm_bin, paths.slurm_conf, timeout=timeout, comment_tool=paths.comment_tool,
                           backend=getattr(slurm, "backend", "auto"))


__all__ = ["SlurmAccess", "default_backend", "from_config"]
