"""Who owns a PCIe error: a GPU (nvidia driver) or the host (ports, NICs, NVMe)."""
from __future__ import annotations

from typing import Mapping, Optional

from slurm_attr.model import Symptom
from slurm_attr.rules.extract import normalize_gpu


def pcie_owner(sym: Symptom, groups: Mapping[str, str]) -> Optional[Symptom]:
    """A fatal AER on a device the nvidia driver owns is that GPU's fault, not the host's."""
    if groups.get("driver") == "pcieport" and groups.get("device"):
        # A port reports for what sits below it: keep the port and the source device apart so the
        # verdict can join them with the GPUs whose bus is under that port.
        sym.fields["port_pci"] = groups["device"].lower()
        if groups.get("src_pci"):
            sym.summary = "fatal PCIe error on port {port_pci} (from {src_pci})"
    if groups.get("driver") == "nvidia" and groups.get("device"):
        sym.cause = "gpu_hardware"
        sym.gpu = normalize_gpu(groups["device"])
        sym.summary = "fatal PCIe error on GPU {gpu}"
    return sym


REFINERS = {"pcie_owner": pcie_owner}
