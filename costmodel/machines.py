"""Machine shapes: vCPUs, memory and accelerators of each machine type dsctl can price.

Shapes are facts about machine types, not prices, so they live here once and every
catalog (shipped or the user's) prices machines from this one table. `family` names
the per-resource rates a catalog may give (`rates: {n2: ...}`); `series` is the
narrower group (`n2-highcpu`) a catalog may rate separately.

`accelerators` counts what TensorFlow sees as devices on the machine: TensorCores on
TPU v2/v3 (a v2-8 has 8), chips on TPU v4 (megacore) and v5e, GPUs on GPU VMs. It is
Equation 1's n_ACC/T when a spec leaves `accelerators_per_trainer` out.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from dsctl.specs.errors import SpecError
from dsctl.specs.schema import Accelerator


@dataclass(frozen=True)
class MachineShape:
    name: str
    vcpus: int
    memory_gb: float
    accelerators: int = 0
    accelerator_type: str | None = None
    family: str = ""
    series: str = ""


def _general_purpose() -> list[MachineShape]:
    # (series, family, GB per vCPU, vCPU sizes) as Compute Engine defines them.
    table = [
        ("n2-standard", "n2", 4, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)),
        ("n2-highcpu", "n2", 1, (2, 4, 8, 16, 32, 48, 64, 80, 96)),
        ("n2-highmem", "n2", 8, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)),
        ("e2-standard", "e2", 4, (2, 4, 8, 16, 32)),
        ("e2-highcpu", "e2", 1, (2, 4, 8, 16, 32)),
        ("e2-highmem", "e2", 8, (2, 4, 8, 16)),
    ]
    return [
        MachineShape(f"{series}-{n}", n, float(n * gb), family=family, series=series)
        for series, family, gb, sizes in table
        for n in sizes
    ]


def _accelerator_vms() -> list[MachineShape]:
    # name, vCPUs, GB, accelerators, accelerator type, family, series
    rows = [
        # TPU VMs: host shape of the single-host slice (paper §4.1 gives v2-8: 96 vCPU, 335 GB).
        ("tpu-v2-8", 96, 335, 8, "TPU v2 TensorCore", "tpu-v2", "tpu-v2"),
        ("tpu-v3-8", 96, 340, 8, "TPU v3 TensorCore", "tpu-v3", "tpu-v3"),
        ("tpu-v4-8", 240, 407, 4, "TPU v4 chip", "tpu-v4", "tpu-v4"),
        ("tpu-v5litepod-1", 24, 48, 1, "TPU v5e chip", "tpu-v5e", "tpu-v5e"),
        ("tpu-v5litepod-4", 112, 192, 4, "TPU v5e chip", "tpu-v5e", "tpu-v5e"),
        ("tpu-v5litepod-8", 224, 384, 8, "TPU v5e chip", "tpu-v5e", "tpu-v5e"),
        # GPU VMs (accelerator-optimized Compute Engine machine types).
        ("a2-highgpu-1g", 12, 85, 1, "NVIDIA A100 40GB", "a2", "a2-highgpu"),
        ("a2-highgpu-2g", 24, 170, 2, "NVIDIA A100 40GB", "a2", "a2-highgpu"),
        ("a2-highgpu-4g", 48, 340, 4, "NVIDIA A100 40GB", "a2", "a2-highgpu"),
        ("a2-highgpu-8g", 96, 680, 8, "NVIDIA A100 40GB", "a2", "a2-highgpu"),
        ("g2-standard-4", 4, 16, 1, "NVIDIA L4", "g2", "g2-standard"),
        ("g2-standard-8", 8, 32, 1, "NVIDIA L4", "g2", "g2-standard"),
        ("a3-highgpu-8g", 208, 1872, 8, "NVIDIA H100 80GB", "a3", "a3-highgpu"),
    ]
    return [MachineShape(n, v, float(g), a, t, f, s) for n, v, g, a, t, f, s in rows]


MACHINES: dict[str, MachineShape] = {m.name: m for m in _general_purpose() + _accelerator_vms()}
FAMILIES: frozenset[str] = frozenset(m.family for m in MACHINES.values()) | frozenset(
    m.series for m in MACHINES.values()
)


def closest_first(name: str, known: list[str] | tuple[str, ...] | set[str], limit: int = 8) -> list[str]:
    """Known names ordered by similarity to `name` (difflib), most similar first."""
    ranked = sorted(known, key=lambda k: (-difflib.SequenceMatcher(None, name, k).ratio(), k))
    return ranked[:limit]


def known_list(name: str, known, limit: int = 8) -> str:
    """'a, b, c (and 12 more)' with the closest to `name` first, for one-paragraph errors."""
    known = list(known)
    shown = closest_first(name, known, limit)
    more = f" (and {len(known) - len(shown)} more)" if len(known) > len(shown) else ""
    return ", ".join(shown) + more


def shape(name: str) -> MachineShape:
    """The shape of a machine type; an unknown name lists the known ones, closest first."""
    try:
        return MACHINES[name]
    except KeyError:
        raise SpecError(
            f"unknown machine type '{name}'. Known machine types, closest first: {known_list(name, MACHINES)}."
        ) from None


def accelerator_of(machine: str) -> tuple[Accelerator, int]:
    """("tpu" | "gpu" | "none", count) of a machine type, for the trainer's distribution strategy.

    `local` and machine types dsctl does not know count as no accelerator: the trainer then
    uses TensorFlow's default strategy, which runs on whatever device TensorFlow finds.
    """
    shape = MACHINES.get(machine)
    if shape is None or not shape.accelerator_type or not shape.accelerators:
        return "none", 0
    kind: Accelerator = "tpu" if shape.accelerator_type.startswith("TPU") else "gpu"
    return kind, shape.accelerators
