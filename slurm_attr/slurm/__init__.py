"""Slurm access: one interface (base.SlurmAccess); the CLI backend, and pyslurm where it matches (select.py)."""
from .base import SlurmAccess, default_backend, from_config

__all__ = ["SlurmAccess", "default_backend", "from_config"]
