"""Hybrid placement's in-process workers (service.local_workers) against the trainer host's CPUs.

Each in-process worker runs the pipeline on the trainer host's own cores, beside the training step. Where the
trainers are machines of `trainer.machine` (a provider whose processes do not run here: Google Cloud's VMs, TPU
VMs included), a spec that asks for more in-process workers than that machine has vCPUs, less one for the step, is
refused at validate: the VM cannot give each worker a core. Where the trainers are processes on this machine (the
local provider), they share its cores with each other, and the demand beyond them is a warning, not an error: a
run on a shared development machine still works, only slower than its placement promises.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dsctl.costmodel.catalog import load_catalog
from dsctl.costmodel.hybrid import STEP_CORES
from dsctl.costmodel.machines import MACHINES
from dsctl.provisioners.registry import provider_class
from dsctl.specs import LoadedSpec, SpecError


@dataclass(frozen=True)
class HostCores:
    """The cores one trainer host has for `trainers` trainer processes, and where that figure comes from."""

    cores: int
    trainers: int  # trainer processes sharing them
    source: str  # "trainer.machine e2-standard-2 (2 vCPUs)", "this machine's 2 cores"

    def fits(self) -> int:
        """In-process workers per trainer that leave each trainer's step its core(s)."""
        return max((self.cores - STEP_CORES * self.trainers) // self.trainers, 0)


def trainer_host(loaded: LoadedSpec) -> HostCores | None:
    """The cores the spec's trainers run on: this machine's (shared by all trainers) where the provider's processes
    run here, else one `trainer.machine` per trainer; None where the machine's shape is unknown (check_machines says
    so)."""
    spec = loaded.spec
    provider = provider_class(spec.provider)
    if provider is not None and provider.runs_here:
        if spec.trainer.cpus:
            return HostCores(len(spec.trainer.cpus), spec.trainer.count, f"the {len(spec.trainer.cpus)} core(s) of "
                                                                          "trainer.cpus")
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return HostCores(cores, spec.trainer.count, f"this machine's {cores} core(s)")
    try:
        shapes = load_catalog(spec.pricing, base_dir=loaded.base_dir).shapes
    except SpecError:
        shapes = MACHINES
    machine = shapes.get(spec.trainer.machine)
    if machine is None:
        return None
    return HostCores(machine.vcpus, 1, f"trainer.machine {spec.trainer.machine} ({machine.vcpus} vCPUs)")


def check_local_workers(loaded: LoadedSpec) -> list[SpecError]:
    """Refuse (SpecError at service.local_workers) in-process workers a trainer VM has no vCPUs for; return the
    warning for those this machine's cores cannot give a core each (under placement: auto, the most the policy may
    start). Nothing with placement: remote."""
    svc = loaded.spec.service
    if svc.placement == "remote":
        return []
    host = trainer_host(loaded)
    if host is None:
        return []
    fits = host.fits()
    if svc.local_workers <= fits:
        return []
    advice = (f"Use service.local_workers: {fits} or fewer" if fits else "Use placement: remote") + \
             " and more remote workers (service.workers)"
    if host.trainers == 1 and host.source.startswith("trainer.machine"):
        message = (f"{svc.local_workers} in-process workers per trainer do not fit on {host.source}: each in-process "
                   f"worker runs the pipeline on a vCPU of the trainer's VM, and the training step needs "
                   f"{STEP_CORES}, so at most {fits} fit. {advice}, or a trainer.machine with more vCPUs.")
        raise loaded.error(("service", "local_workers"), message)
    demand = svc.local_workers * host.trainers
    message = (f"{demand} in-process worker(s) ({svc.local_workers} in each of {host.trainers} trainer process(es)) ask "
               f"for more cores than {host.source}, which the trainers share, leaving {STEP_CORES} per trainer for its "
               f"step: at most {fits} per trainer get a core each; the rest share cores with the steps and one "
               f"another, and the run is slower than its placement promises. {advice}.")
    return [loaded.error(("service", "local_workers"), message)]
