"""The distribution strategy a keras trainer trains under, from its machine's accelerators.

    choose(accelerator, count) -> Choice          pure: no TensorFlow, unit-tested per machine kind
    make(choice) -> tf.distribute.Strategy        builds it; ModelError (exit 2) if the hardware is not there

TPU VM: TPUStrategy on the local TPU (TPUClusterResolver(tpu="local"), connect, initialize).
More than one GPU: MirroredStrategy over them. CPU or one GPU: TensorFlow's default strategy,
which places the model on the one device there is. The accelerator kind and count come from
the orchestrator (--accelerator/--accelerators), which knows the machine type; the runtime
does not look machine types up itself.

A machine that should have accelerators but shows TensorFlow none (no TPU runtime, a GPU
driver that failed) is an error, not a silent fall-back to the CPU: a run priced as a TPU
job must not train on the host's CPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dsctl.specs.schema import ACCELERATORS

from .models import ModelError


@dataclass(frozen=True)
class Choice:
    kind: Literal["tpu", "mirrored", "default"]
    devices: int  # accelerators the strategy expects (0: none)
    why: str  # one phrase, for messages


def choose(accelerator: str, count: int) -> Choice:
    """The strategy for a trainer machine with `count` accelerators of `accelerator` ("none" | "gpu" | "tpu")."""
    if accelerator not in ACCELERATORS:
        raise ValueError(f"accelerator must be one of {ACCELERATORS}, got {accelerator!r}")
    if count < 0:
        raise ValueError(f"accelerator count must be at least 0, got {count}")
    if accelerator == "tpu":
        return Choice("tpu", count, f"a TPU VM ({count} TPU devices)")
    if accelerator == "gpu" and count > 1:
        return Choice("mirrored", count, f"a machine with {count} GPUs")
    if accelerator == "gpu" and count == 1:
        return Choice("default", 1, "a machine with one GPU")
    return Choice("default", 0, "a machine without accelerators")


def make(choice: Choice):
    """Build the strategy; ModelError with one paragraph when the machine lacks what the choice needs."""
    import tensorflow as tf

    if choice.kind == "tpu":
        return _tpu(tf, choice)
    if choice.devices:
        gpus = tf.config.list_physical_devices("GPU")
        if len(gpus) < choice.devices:
            raise ModelError(
                f"trainer.machine is {choice.why}, so the keras model trains on its GPUs "
                f"({'MirroredStrategy' if choice.kind == 'mirrored' else 'the default strategy'}), but TensorFlow "
                f"sees {len(gpus)} GPU(s) here. Run on that machine type (provider: gcp installs the GPU driver), "
                "check the driver with nvidia-smi and that the installed TensorFlow is a CUDA build, or set "
                "trainer.machine to a CPU machine type (or trainer.accelerators_per_trainer to what the machine has)."
            )
    if choice.kind == "mirrored":
        return tf.distribute.MirroredStrategy(devices=[f"/gpu:{i}" for i in range(choice.devices)])
    return tf.distribute.get_strategy()


def _tpu(tf, choice: Choice):
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    except Exception as exc:  # noqa: BLE001 - whatever TensorFlow raises, the cause is the same: no usable TPU
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        first = first.split(". ")[0].rstrip(".")[:200]  # TensorFlow goes on to list op attributes
        raise ModelError(
            f"trainer.machine is {choice.why}, so the keras model trains under TPUStrategy on the local TPU, but "
            f"TensorFlow found no TPU here ({type(exc).__name__}: {first}). A TPU trainer must run on a TPU VM with "
            "the TPU build of TensorFlow (provider: gcp creates one); to train on this machine, set trainer.machine "
            "to a CPU machine type such as n2-standard-8, or to local."
        ) from None
