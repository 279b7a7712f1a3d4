"""What kind of VM a machine type is: a TPU VM, a GPU VM with its guest accelerators, or a CPU VM.

Everything that decides by the kind of a machine (the request body, the software a VM gets, the
permissions a run needs, the plan) asks here. The machine shapes (which GPUs a machine type
carries, and how many) are the cost model's (costmodel/machines.py); this module only names them
the way Compute Engine does. It imports nothing of this provider, so every module may use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

VmKind = Literal["cpu", "gpu", "tpu"]  # how a VM is created, and the software it gets

# What the cost model's machine shapes call a GPU -> Compute Engine's accelerator type.
GPU_TYPES = {
    "NVIDIA A100 40GB": "nvidia-tesla-a100",
    "NVIDIA A100 80GB": "nvidia-a100-80gb",
    "NVIDIA L4": "nvidia-l4",
    "NVIDIA H100 80GB": "nvidia-h100-80gb",
    "NVIDIA T4": "nvidia-tesla-t4",
    "NVIDIA V100": "nvidia-tesla-v100",
}


@dataclass(frozen=True)
class MachineKind:
    kind: VmKind
    accelerator: str | None = None  # GCE accelerator type (gpu) or TPU accelerator type (tpu)
    count: int = 0


def machine_kind(machine: str) -> MachineKind:
    """What kind of VM a machine type is: a TPU VM, a GPU VM (with its guest accelerators) or a CPU VM."""
    if machine.startswith("tpu-"):
        return MachineKind("tpu", machine.removeprefix("tpu-"))
    from dsctl.costmodel import MACHINES

    shape = MACHINES.get(machine)
    if shape and shape.accelerator_type and shape.accelerator_type in GPU_TYPES:
        return MachineKind("gpu", GPU_TYPES[shape.accelerator_type], shape.accelerators)
    return MachineKind("cpu")
