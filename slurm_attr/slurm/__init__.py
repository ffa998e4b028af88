"""Slurm access: one interface (base.SlurmAccess), the CLI backend behind it."""
from .base import SlurmAccess, default_backend, from_config

__all__ = ["SlurmAccess", "default_backend", "from_config"]
