"""Typed errors of the core. Only cli.py turns them into exit codes and messages."""
from __future__ import annotations


class SattrError(Exception):
    """Base of every error slurm-attr raises on purpose."""


class ConfigError(SattrError):
    """The configuration file is unreadable or has a bad key or value."""


class UnsafePath(SattrError):
    """A path in job-written evidence is a symlink, not a regular file, or escapes its root."""


class BundleError(SattrError):
    """An evidence bundle cannot be read at all (not a directory, no access)."""


class SlurmError(SattrError):
    """A Slurm command failed or timed out; ``stderr`` holds what it said."""

    def __init__(self, message: str, stderr: str = "", returncode: int | None = None):
        super().__init__(message)
        self.stderr = stderr
        self.returncode = returncode


class SlurmUnavailable(SlurmError):
    """slurmctld or slurmdbd did not answer: retry later."""


class StoreError(SattrError):
    """The verdict database cannot be opened or migrated."""


class NotFound(SattrError):
    """No verdict for that job."""


class PermissionDenied(SattrError):
    """The caller may not see this job."""


class RuleError(SattrError):
    """A rule file is invalid: names the file and the reason."""
