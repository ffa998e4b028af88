"""What a worker's exit code says about why it stopped (torchrun lines)."""
from __future__ import annotations

from typing import Mapping, Optional

from slurm_attr.model import Symptom

# Negative exit codes are signals. Each maps to (cause, role, why).
_SIGNALS = {
    -9: ("unknown", "context", "killed by SIGKILL (OOM killer or Slurm; not an OOM by itself)"),
    -6: ("unknown", "cascade", "aborted (SIGABRT; the NCCL watchdog aborts hung ranks)"),
    -15: ("cancelled", "cascade", "terminated (SIGTERM: teardown)"),
    -11: ("user_error", "root", "segmentation fault"),
    -7: ("user_error", "root", "bus error (often /dev/shm full)"),
    -4: ("user_error", "root", "illegal instruction"),
    -8: ("user_error", "root", "floating point exception"),
}


def exitcode(sym: Symptom, groups: Mapping[str, str]) -> Optional[Symptom]:
    """Set cause and role from a worker's exit code; keep the rule's own role for codes > 0."""
    code = sym.fields.get("exitcode")
    if not isinstance(code, int):
        return sym
    if code in _SIGNALS:
        sym.cause, role, why = _SIGNALS[code]
        # A signal never makes a line more than the rule allows (e.g. the cascade
        # line torchrun prints for every worker stays a cascade).
        if not (role == "root" and sym.role != "root"):
            sym.role = role
        sym.fields["reason"] = why
    elif code < 0:
        sym.cause, sym.role = "unknown", "context"
    return sym


REFINERS = {"exitcode": exitcode}
