"""Provisioning models: how a machine is bought, which decides which of a catalog's prices apply.

`standard` is on-demand (a catalog's top-level prices), `spot` is Spot VMs (its `spot:`
section). Specs choose per part: service.provisioning (dispatcher and workers) and
trainer.provisioning (trainers); both default to standard.
"""

from __future__ import annotations

from dsctl.specs.errors import SpecError

PROVISIONING = ("standard", "spot")
PROVISIONING_LABEL = {"standard": "on-demand", "spot": "Spot"}


def check_provisioning(provisioning: str, what: str = "provisioning") -> str:
    """`provisioning` if it is a known model, else a one-paragraph SpecError listing them."""
    if provisioning not in PROVISIONING:
        raise SpecError(f"{what} must be 'standard' (on-demand VMs) or 'spot' (Spot VMs), got {provisioning!r}.")
    return provisioning


def provisioning_label(provisioning: str | None) -> str:
    """'on-demand' or 'Spot', as output names prices; '-' for a part that was not priced."""
    return PROVISIONING_LABEL.get(provisioning or "", "-")


def describe_provisioning(service: str | None, trainers: str | None) -> str:
    """Which model each part was priced at: 'workers and dispatcher: Spot, trainers: on-demand'."""
    parts = []
    if service:
        parts.append(f"workers and dispatcher: {provisioning_label(service)}")
    if trainers:
        parts.append(f"trainers: {provisioning_label(trainers)}")
    return ", ".join(parts)
