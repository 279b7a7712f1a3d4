"""Places to run a deployment, behind one contract (contract.py): local/ processes, gcp/ VMs."""

from __future__ import annotations

from .contract import Deployment, Node, Provisioner, TrainerLaunch, TrainerState


def get_provisioner(name: str) -> Provisioner:
    if name == "local":
        from .local import LocalProvisioner

        return LocalProvisioner()
    if name == "gcp":
        from .gcp import GcpProvisioner

        return GcpProvisioner()
    from dsctl.specs import SpecError

    raise SpecError(f"provider '{name}' is not available in this version of dsctl; use provider: local or gcp.", field="provider")


__all__ = ["Deployment", "Node", "Provisioner", "TrainerLaunch", "TrainerState", "get_provisioner"]
