"""Who owns a PCIe error: a GPU (nvidia driver) or the host (ports, NICs, NVMe)."""
from __future__ import annotations

from typing import Mapping, Optional

from slurm_attr.model import Symptom
from slurm_attr.rules.extract import normalize_gpu


def pcie_owner(sym: Symptom, groups: Mapping[str, str]) -> Optional[Symptom]:
    """A fatal AER on a device the nvidia driver owns is that GPU's fault, not the host's."""
    if groups.get("driver") == "nvidia" and groups.get("device"):
        sym.cause = "gpu_hardware"
        sym.gpu = normalize_gpu(groups["device"])
        sym.summary = "fatal PCIe error on GPU {gpu}"
    return sym


REFINERS = {"pcie_owner": pcie_owner}
