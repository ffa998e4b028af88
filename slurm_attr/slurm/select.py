"""Which Slurm backend a process uses: ``[slurm] backend = "auto" | "cli" | "pyslurm"``.

auto: pyslurm when it imports and its release line is the running libslurm's (22.5.x for
22.05, 24.11.x for 24.11, 25.11 from PyPI); the CLI otherwise (Slurm 26.05 has no pyslurm
yet, a site may not install it). pyslurm: the same, but a pyslurm that cannot be used is
an error that says why, not a silent CLI. cli: never pyslurm.
"""
from __future__ import annotations

import logging

from ..errors import SlurmError
from .cli import CliSlurm

log = logging.getLogger("slurm_attr")

BACKENDS = ("auto", "cli", "pyslurm")

_said: set[str] = set()  # each fallback reason logged once per process


def choose(backend: str, slurm_bin: str, slurm_conf: str, timeout: float = 15.0,
           comment_tool: str = "") -> tuple[object, str]:
    """(the backend, why it was chosen)."""
    cli = CliSlurm(slurm_bin=slurm_bin, slurm_conf=slurm_conf, timeout=timeout, comment_tool=comment_tool)
    if backend not in BACKENDS:
        raise SlurmError(f"[slurm] backend: must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "cli":
        return cli, "configured"
    from . import pyslurm_backend

    mod, why = pyslurm_backend.load(slurm_conf, slurm_bin)
    if mod is not None:
        return pyslurm_backend.PyslurmSlurm(mod, cli), "pyslurm matches this Slurm"
    if backend == "pyslurm":
        raise SlurmError(f"[slurm] backend = \"pyslurm\", but {why}")
    if why not in _said:
        _said.add(why)
        log.debug("Slurm CLI backend: %s", why)
    return cli, why
