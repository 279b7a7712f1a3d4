"""What accelerators a trainer machine has, as the trainer harness's --accelerator/--accelerators.

The runtime cannot look this up itself (it imports nothing of costmodel/), and a local
trainer standing for a TPU VM must still be told so: the keras runner then asks for the
TPU strategy and says clearly that there is no TPU here.
"""

from __future__ import annotations

from dsctl.costmodel.machines import accelerator_of
from dsctl.specs.schema import JobSpec


def trainer_accelerators(spec: JobSpec) -> dict:
    """{"accelerator": "none" | "gpu" | "tpu", "accelerators": n} for TrainerLaunch; only keras models use them.

    `trainer.accelerators_per_trainer`, when given, overrides the machine type's count (0: none).
    """
    if spec.trainer.model.kind != "keras":
        return {"accelerator": "none", "accelerators": 0}
    kind, count = accelerator_of(spec.trainer.machine)
    if spec.trainer.accelerators_per_trainer is not None and kind != "none":
        count = spec.trainer.accelerators_per_trainer
    return {"accelerator": kind if count else "none", "accelerators": count}
