"""What the spec names, looked up in its zone before anything is created: machine types, GPU types, boot images
(and whether each supports Shielded VM), TPU types and the TPU runtime. A name the zone does not offer is one
paragraph naming the field and the gcloud command that lists what it does offer."""

from __future__ import annotations

from dsctl.specs import SpecError
from dsctl.specs.schema import JobSpec

from .clients import Clients
from .machinetypes import machine_kind
from .retry import call
from .software import Software, tpu_generation


def _exists(fn, doing: str, **kwargs) -> bool:
    from google.api_core import exceptions as gx

    try:
        call(fn, doing=doing, **kwargs)
        return True
    except gx.NotFound:
        return False


def check(clients: Clients, spec: JobSpec, software: Software) -> list[str]:
    """The machine types, GPU types, images and TPU runtime the run names exist in its zone; returns the VM kinds
    whose boot image supports Shielded VM (UEFI_COMPATIBLE among its guestOsFeatures)."""
    s = clients.settings
    machines = {("service", "worker_machine"): spec.service.worker_machine,
                ("service", "dispatcher_machine"): spec.service.dispatcher_machine}
    kind = machine_kind(spec.trainer.machine)
    if kind.kind != "tpu":
        machines[("trainer", "machine")] = spec.trainer.machine
    for loc, machine in machines.items():
        if not _exists(clients.machine_types.get, f"looking up machine type {machine}", project=s.project, zone=s.zone,
                       machine_type=machine):
            raise SpecError(f"machine type {machine} is not offered in zone {s.zone} (`gcloud compute machine-types "
                            f"list --zones {s.zone}`); pick another type or zone (gcp.zone).", field=".".join(loc))
    if kind.kind == "gpu" and not _exists(clients.accelerator_types.get, f"looking up GPU type {kind.accelerator}",
                                          project=s.project, zone=s.zone, accelerator_type=kind.accelerator):
        raise SpecError(f"{spec.trainer.machine}'s GPUs ({kind.accelerator}) are not offered in zone {s.zone} "
                        f"(`gcloud compute accelerator-types list --filter=zone:{s.zone}`); pick another zone.",
                        field="trainer.machine")
    shielded = []
    for k in software.kinds.values():
        if k.kind == "tpu":
            continue
        image = _image(clients, k.image)
        if image is False:
            raise SpecError(f"the boot image {k.image} does not exist or is not readable; check the family "
                            f"(`gcloud compute images describe-from-family ...`).",
                            field="gcp.gpu_image" if k.kind == "gpu" else "gcp.image")
        if image is None or any(f.type_ == "UEFI_COMPATIBLE" for f in image.guest_os_features):
            shielded.append(k.kind)
    if kind.kind == "tpu":
        generation, _ = tpu_generation(spec.trainer.machine)
        accelerator = spec.trainer.machine.removeprefix("tpu-")
        where = f"projects/{s.project}/locations/{s.zone}"
        if not _exists(clients.tpu.get_accelerator_type, f"looking up TPU type {accelerator}",
                       name=f"{where}/acceleratorTypes/{accelerator}"):
            raise SpecError(f"TPU {accelerator} is not offered in zone {s.zone} (`gcloud compute tpus accelerator-types "
                            f"list --zone {s.zone}`); pick another zone (gcp.zone).", field="trainer.machine")
        tpu = software.for_kind("tpu")
        runtime = tpu.image
        if not _exists(clients.tpu.get_runtime_version, f"looking up TPU runtime {runtime}",
                       name=f"{where}/runtimeVersions/{runtime}"):
            listed = f"is not offered in zone {s.zone} (`gcloud compute tpus versions list --zone {s.zone}`)"
            if tpu.jax:  # JAX's TPU software: the image does not depend on the TensorFlow version
                raise SpecError(f"the TPU runtime {runtime} (JAX's TPU software for TPU {generation}) {listed}; name one "
                                "that is in gcp.tpu_runtime_version, or pick another zone.",
                                field="gcp.tpu_runtime_version")
            raise SpecError(f"the TPU runtime {runtime} (TensorFlow {software.tensorflow_version} on TPU {generation}) "
                            f"{listed}; set gcp.tensorflow_version to another version, or another zone.",
                            field="gcp.tensorflow_version")
    return shielded


def _image(clients: Clients, image: str):
    """The image (compute_v1.Image), False if it does not exist, None for a form dsctl does not parse (the insert
    will tell)."""
    from google.api_core import exceptions as gx

    parts = image.split("/")
    if "projects" not in parts or "images" not in parts:
        return None
    project = parts[parts.index("projects") + 1]
    try:
        if parts[-2] == "family":
            return call(clients.images.get_from_family, project=project, family=parts[-1],
                        doing=f"looking up image family {parts[-1]}")
        return call(clients.images.get, project=project, image=parts[-1], doing=f"looking up image {parts[-1]}")
    except gx.NotFound:
        return False
