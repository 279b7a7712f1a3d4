"""Which TensorFlow every VM runs, and how each kind of VM gets it: decided at plan time.

tf.data service sends serialized dataset graphs from the trainers to the
dispatcher and workers, so ONE TensorFlow version runs on every VM of a run.
That version must exist for every kind of machine in the run:

  cpu  the dispatcher and workers (and CPU trainers): the `tensorflow-cpu` wheel for the
       image's Python, installed from the run's wheelhouse (wheelhouse.py)
  gpu  GPU trainers: the `tensorflow[and-cuda]` wheel for the Deep Learning VM image's Python,
       installed the same way; the image installs the NVIDIA driver at boot
  tpu  TPU trainers: a TensorFlow TPU VM runtime (`tpu-vm-tf-X.Y.Z...`), which comes with
       TensorFlow installed; only dsctl and its few dependencies are added. A JAX program
       (trainer.framework: jax) gets JAX's TPU runtime image instead, and from the wheelhouse
       jax's TPU wheels (jax, jaxlib, libtpu) beside the `tensorflow-cpu` wheel of the run's
       TensorFlow, for its tf.data client: such a run is not held to the TensorFlow TPU runtimes

The tables below are what Google and PyPI publish, as checked on 2026-11-23 (wheels: `pip
index versions tensorflow-cpu|tensorflow --python-version V --platform manylinux_2_17_x86_64
...`; TPU runtimes: https://cloud.google.com/tpu/docs/runtimes). A version or pair that is
not in them is refused before anything is created, naming the versions that would work.
`tensorflow-tpu` wheels newer than the newest TensorFlow TPU runtime exist on PyPI, but
they depend on `libtpu~=0.0.14`, which does not pin the libtpu build they were made with,
so dsctl does not install them on a bare TPU image.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from dsctl.specs import SpecError
from dsctl.specs.schema import GcpSpec, JobSpec

from .machinetypes import machine_kind

# TensorFlow version -> Python minor versions with a manylinux x86_64 wheel, for
# tensorflow-cpu (cpu VMs) and tensorflow (GPU VMs); the two are published together.
_ALL_312 = ("3.9", "3.10", "3.11", "3.12")
WHEEL_PYTHONS: dict[str, tuple[str, ...]] = {
    "2.21.0": ("3.10", "3.11", "3.12", "3.13"),
    "2.20.0": ("3.9", "3.10", "3.11", "3.12", "3.13"),
    "2.19.1": _ALL_312, "2.19.0": _ALL_312,
    "2.18.1": _ALL_312, "2.18.0": _ALL_312,
    "2.17.1": _ALL_312, "2.17.0": _ALL_312,
    "2.16.2": _ALL_312, "2.16.1": _ALL_312,
    "2.15.1": ("3.9", "3.10", "3.11"), "2.15.0": ("3.9", "3.10", "3.11"),
}

# TensorFlow TPU VM runtimes (single host), by TensorFlow version and TPU generation.
# From TensorFlow 2.18.0 on, Google publishes one runtime for v2-v5p and one for v5e/v6e.
_ALL_GENERATIONS = ("v2", "v3", "v4", "v5p", "v5litepod", "v6e")
TPU_RUNTIMES: dict[str, dict[tuple[str, ...], str]] = {
    "2.18.0": {("v2", "v3", "v4", "v5p"): "tpu-vm-tf-2.18.0-pjrt-v5p-and-below",
               ("v5litepod", "v6e"): "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6"},
    "2.17.0": {_ALL_GENERATIONS: "tpu-vm-tf-2.17.0-pjrt"},
    "2.16.1": {_ALL_GENERATIONS: "tpu-vm-tf-2.16.1-pjrt"},
    "2.15.1": {("v2", "v3", "v4", "v5p", "v5litepod"): "tpu-vm-tf-2.15.1-pjrt"},
    "2.15.0": {("v2", "v3", "v4", "v5p", "v5litepod"): "tpu-vm-tf-2.15.0-pjrt"},
}
TPU_RUNTIME_PYTHON = ("/usr/bin/python3", "3.10", "2.35")  # the TPU runtimes are Ubuntu 22.04 images

# JAX on TPU VMs. Google's TPU software versions for JAX (and PyTorch), by TPU generation, from
# https://cloud.google.com/tpu/docs/runtimes ("PyTorch and JAX", checked 2026-11-26): a base Ubuntu
# 22.04 image on which the framework is installed.
JAX_TPU_RUNTIMES: dict[tuple[str, ...], str] = {
    ("v2", "v3", "v4"): "tpu-ubuntu2204-base",
    ("v5litepod",): "v2-alpha-tpuv5-lite",  # v5e
    ("v5p",): "v2-alpha-tpuv5",
    ("v6e",): "v2-alpha-tpuv6e",
}
# The one jax dsctl installs, with its TPU wheels (`jax[tpu]`: jaxlib and libtpu, all on PyPI). 0.6.2 is
# the newest jax for Python 3.10, the TPU images' Python (jax 0.7.0 needs 3.11); its tpu extra pins
# libtpu 0.0.17, which needs glibc 2.31 (the images have 2.35); and it installs beside recent
# tensorflow-cpu wheels, which a JAX program needs for its tf.data client. Change it here only.
JAX_VERSION = "0.6.2"
# The TensorFlow versions whose tensorflow-cpu wheel for Python 3.10 installs beside jax[tpu]==JAX_VERSION:
# checked with `pip install --dry-run --python-version 3.10 --platform manylinux_2_35_x86_64 ... jax[tpu]==0.6.2
# tensorflow-cpu==V` (2026-11-26). 2.18.0 and older conflict: they need ml-dtypes < 0.5, jax 0.6.2 needs >= 0.5.
JAX_TENSORFLOW = ("2.18.1", "2.19.0", "2.19.1", "2.20.0", "2.21.0")

# TensorFlow's PJRT TPU runtime (the -pjrt TensorFlow TPU VM runtimes) is taken only when the trainer's environment
# says where libtpu is, as in Google's TPU test configurations (GoogleCloudPlatform/ml-auto-solutions,
# dags/solutions_team/configs/tensorflow: `export NEXT_PLUGGABLE_DEVICE_USE_C_API=true && export
# TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so`). TensorFlow refuses to import when that path does not
# exist, so a trainer gets this environment only on a VM where it does (remote.launch's file_env).
LIBTPU = "/lib/libtpu.so"
PJRT_ENV = {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": LIBTPU}

# The Python of the operating systems dsctl boots, as each OS ships it at /usr/bin/python3: (version, glibc). The
# glibc version bounds the manylinux wheels the wheelhouse may hold.
SYSTEM_PYTHON = "/usr/bin/python3"
OS_PYTHONS: dict[str, tuple[str, str]] = {
    "debian-11": ("3.9", "2.31"), "debian-12": ("3.11", "2.36"),
    "ubuntu-2204": ("3.10", "2.35"), "ubuntu-2404": ("3.12", "2.39"),
}
# Google's public OS image families, and the OS each is.
OS_IMAGE_FAMILIES = {
    "debian-cloud/global/images/family/debian-12": "debian-12",
    "debian-cloud/global/images/family/debian-11": "debian-11",
    "ubuntu-os-cloud/global/images/family/ubuntu-2204-lts": "ubuntu-2204",
    "ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64": "ubuntu-2404",
}
# A custom image names its Python with gcp.image_python_version (and gcp.image_python); its glibc is assumed to be
# 2.28 or newer.
CUSTOM_IMAGE_GLIBC = "2.28"
# Deep Learning VM images (https://cloud.google.com/deep-learning-vm/docs/images, checked 2026-11-26) are named
# FRAMEWORK-CUDA-OS: common-cu129-ubuntu-2204-nvidia-580 (images: the family and -vDATE), the OS with its NVIDIA
# driver. Their own ML Python (3.12 in the cu129 families) is not what dsctl uses: it makes its venv from the OS's
# /usr/bin/python3, which every Ubuntu and Debian image has. Families before 2025 ended in their conda Python
# (common-cu124-debian-11-py310, image common-cu124-v20250325-debian-11-py310): /opt/conda/bin/python3 at that version.
_DLVM = re.compile(r"deeplearning-platform-release/global/images/(?:family/)?([a-z0-9-]+)$")
_DLVM_OS = re.compile(r"-(debian-\d+|ubuntu-\d{4})(?=-|$)")
_DLVM_CONDA = re.compile(r"-py3(\d+)(?=-|$)")
DLVM_CONDA_PYTHON = "/opt/conda/bin/python3"


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def tpu_generation(machine: str) -> tuple[str, int]:
    """'tpu-v2-8' -> ('v2', 8); 'tpu-v5litepod-4' -> ('v5litepod', 4)."""
    m = re.fullmatch(r"tpu-(v\d+[a-z]*)-(\d+)", machine)
    if not m:
        raise SpecError(f"'{machine}' is not a TPU VM type (like tpu-v2-8 or tpu-v5litepod-8).", field="trainer.machine")
    return m.group(1), int(m.group(2))


def tpu_runtime(tf_version: str, generation: str) -> str | None:
    for gens, runtime in TPU_RUNTIMES.get(tf_version, {}).items():
        if generation in gens:
            return runtime
    return None


def jax_tpu_runtime(generation: str) -> str | None:
    return next((runtime for gens, runtime in JAX_TPU_RUNTIMES.items() if generation in gens), None)


def tpu_runtime_tf_version(runtime: str) -> str | None:
    """The TensorFlow a TensorFlow TPU runtime carries: 'tpu-vm-tf-2.18.0-pjrt-v5e-and-v6' -> '2.18.0'."""
    m = re.match(r"tpu-vm-tf-(\d+\.\d+\.\d+)(?:-|$)", runtime)
    return m.group(1) if m else None


@dataclass(frozen=True)
class KindSoftware:
    """How one kind of VM (cpu, gpu, tpu) gets the run's TensorFlow."""

    kind: str
    image: str  # boot image (cpu, gpu) or TPU runtime version (tpu)
    python: str  # the image's own interpreter, which makes /opt/dsctl/venv
    python_version: str  # e.g. "3.11": the wheelhouse is built for it
    glibc: str  # e.g. "2.36": the newest manylinux wheels the wheelhouse may hold
    tensorflow: str | None  # pip requirement installed from the wheelhouse; None: the image has TensorFlow
    jax: str | None = None  # the jax version installed with its TPU wheels (jax[tpu]): TPU VMs of framework: jax

    @property
    def uses_image_tensorflow(self) -> bool:
        return self.tensorflow is None

    @property
    def requirements(self) -> tuple[str, ...]:
        """What the wheelhouse and the startup script add for the frameworks (dsctl's own come beside them)."""
        return ((self.tensorflow,) if self.tensorflow else ()) + ((f"jax[tpu]=={self.jax}",) if self.jax else ())

    @property
    def trainer_file_env(self) -> dict[str, dict[str, str]]:
        """Environment the trainers get on this kind of VM where a file exists ({path: env}): TensorFlow's PJRT TPU
        runtime on a TensorFlow TPU runtime image. Not for a JAX program, whose TensorFlow (its tf.data client) must
        leave the TPU to JAX: one process at a time holds it."""
        return {LIBTPU: dict(PJRT_ENV)} if self.kind == "tpu" and self.uses_image_tensorflow else {}


@dataclass(frozen=True)
class Software:
    """The run's TensorFlow version and, per machine kind, how it is installed."""

    tensorflow_version: str
    why: str  # how the version was chosen, for the plan
    kinds: dict[str, KindSoftware]

    def for_kind(self, kind: str) -> KindSoftware:
        return self.kinds[kind]

    def as_dict(self) -> dict:
        return {"tensorflow_version": self.tensorflow_version, "why": self.why,
                "kinds": {k: asdict(v) for k, v in self.kinds.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> Software:
        return cls(data["tensorflow_version"], data["why"], {k: KindSoftware(**v) for k, v in data["kinds"].items()})


def known_image_python(image: str) -> tuple[str, str, str] | None:
    """(interpreter, version, glibc) that dsctl infers from a boot image's name, or None where it cannot."""
    os_name = next((os for suffix, os in OS_IMAGE_FAMILIES.items() if image.endswith(suffix)), None)
    if os_name:
        return (SYSTEM_PYTHON, *OS_PYTHONS[os_name])
    dlvm = _DLVM.search(image)
    if not dlvm:
        return None
    named_os, conda = _DLVM_OS.search(dlvm.group(1)), _DLVM_CONDA.search(dlvm.group(1))
    os_python = OS_PYTHONS.get(named_os.group(1)) if named_os else None
    if conda:
        return DLVM_CONDA_PYTHON, f"3.{conda.group(1)}", os_python[1] if os_python else CUSTOM_IMAGE_GLIBC
    return (SYSTEM_PYTHON, *os_python) if os_python else None


def _default_gpu_family() -> str:
    return str(GcpSpec.model_fields["gpu_image"].default).rsplit("/", 1)[-1]


def _image_python(g: GcpSpec, image: str, field_prefix: str) -> tuple[str, str, str]:
    """(interpreter, version, glibc) of a boot image: the spec's, else what its name tells, else refuse."""
    known = known_image_python(image)
    python = g.image_python or (known[0] if known else SYSTEM_PYTHON)
    version = g.image_python_version or (known[1] if known else None)
    if not version:
        raise SpecError(
            f"dsctl cannot tell which Python the image {image} has, and the wheelhouse of TensorFlow and dsctl "
            "is built for one Python version: set gcp.image_python_version (e.g. '3.11') and, if it is not "
            f"{SYSTEM_PYTHON}, gcp.image_python (its interpreter), or use an image whose name says: Google's "
            f"{', '.join(f.rsplit('/', 1)[-1] for f in OS_IMAGE_FAMILIES)}, or a Deep Learning VM family naming its "
            f"OS ({', '.join(OS_PYTHONS)}) like {_default_gpu_family()}.", field=field_prefix)
    return python, version, known[2] if known else CUSTOM_IMAGE_GLIBC


def _kinds_in_run(spec: JobSpec) -> dict[str, str]:
    """kind -> machine type, for every kind of VM the run creates."""
    kinds = {"cpu": spec.service.worker_machine}
    kinds.setdefault(machine_kind(spec.trainer.machine).kind, spec.trainer.machine)
    return kinds


def _jax_on_tpu(spec: JobSpec) -> bool:
    """A JAX program on TPU VMs: JAX's runtime image and TPU wheels, and TensorFlow as a wheel beside them."""
    return spec.trainer.framework == "jax" and spec.trainer.machine.startswith("tpu-")


def _candidates_for_kind(spec: JobSpec, g: GcpSpec, kind: str) -> set[str]:
    """TensorFlow versions that exist for this kind of VM of the run."""
    if kind == "tpu" and _jax_on_tpu(spec):
        return {v for v in JAX_TENSORFLOW if TPU_RUNTIME_PYTHON[1] in WHEEL_PYTHONS[v]}
    if kind == "tpu":
        if g.tpu_runtime_version:
            carried = tpu_runtime_tf_version(g.tpu_runtime_version)
            assert carried is not None, "_check_tpu_runtime refuses a TPU runtime without TensorFlow"
            return {carried}
        generation, _ = tpu_generation(spec.trainer.machine)
        return {v for v in TPU_RUNTIMES if tpu_runtime(v, generation)}
    image = g.gpu_image if kind == "gpu" else g.image
    py = _image_python(g, image, "gcp.gpu_image" if kind == "gpu" else "gcp.image")[1]
    return {v for v, pys in WHEEL_PYTHONS.items() if py in pys}


def _what_kind_needs(spec: JobSpec, g: GcpSpec, kind: str) -> str:
    if kind == "tpu" and _jax_on_tpu(spec):
        return f"tensorflow-cpu wheel for Python {TPU_RUNTIME_PYTHON[1]} that installs beside jax[tpu]=={JAX_VERSION}"
    if kind == "tpu":
        return f"TensorFlow TPU VM runtime for TPU {tpu_generation(spec.trainer.machine)[0]}"
    image = g.gpu_image if kind == "gpu" else g.image
    py = _image_python(g, image, "")[1]
    wheel = "tensorflow GPU" if kind == "gpu" else "tensorflow-cpu"
    return f"{wheel} wheel for Python {py} (image {image.rsplit('/', 1)[-1]})"


def _check_tpu_runtime(spec: JobSpec, g: GcpSpec) -> None:
    """The TPU software a TPU trainer asks for must carry its framework."""
    runtime = g.tpu_runtime_version
    if _jax_on_tpu(spec):
        generation, _ = tpu_generation(spec.trainer.machine)
        known = jax_tpu_runtime(generation)
        if runtime and tpu_runtime_tf_version(runtime):
            raise SpecError(
                f"jax needs JAX's TPU software, and gcp.tpu_runtime_version {runtime!r} is a TensorFlow TPU runtime, "
                "which holds the TPU for TensorFlow. Remove gcp.tpu_runtime_version"
                + (f" to get {known} (dsctl installs jax[tpu]=={JAX_VERSION})" if known else "")
                + f", name one of JAX's ({', '.join(JAX_TPU_RUNTIMES.values())}), or set trainer.framework: tensorflow.",
                field="trainer.framework")
        if not runtime and not known:
            raise SpecError(
                f"dsctl knows JAX's TPU software for TPU {', '.join(gen for gens in JAX_TPU_RUNTIMES for gen in gens)}, "
                f"not for TPU {generation}: name it in gcp.tpu_runtime_version (`gcloud compute tpus versions list`), "
                "or pick another machine.", field="trainer.machine")
    elif runtime and not tpu_runtime_tf_version(runtime):
        raise SpecError(f"gcp.tpu_runtime_version {runtime!r} is not a TensorFlow TPU runtime "
                        "(tpu-vm-tf-X.Y.Z...): trainers need TensorFlow on the TPU VM. Leave it unset to get the "
                        "runtime that matches the TensorFlow version, or set trainer.framework: jax for a JAX program "
                        "(on JAX's TPU software).", field="gcp.tpu_runtime_version")


def resolve(spec: JobSpec, local_tf: str | None) -> Software:
    """The run's software, or SpecError (exit 2) naming the field to change and what would work."""
    g = spec.gcp or GcpSpec()
    kinds = _kinds_in_run(spec)
    if "tpu" in kinds:
        generation, chips = tpu_generation(kinds["tpu"])
        if generation in ("v2", "v3", "v4", "v5p") and chips > 8 or generation in ("v5litepod", "v6e") and chips > 8:
            raise SpecError(f"{kinds['tpu']} is a multi-host TPU slice; dsctl runs one trainer process per TPU VM and "
                            "supports single-host TPU VMs (up to 8 chips, e.g. tpu-v2-8, tpu-v5litepod-8).",
                            field="trainer.machine")
        _check_tpu_runtime(spec, g)
    elif spec.trainer.framework == "jax" and g.bootstrap:
        raise SpecError(
            f"jax on Google Cloud is installed on TPU VMs (jax[tpu]=={JAX_VERSION} with JAX's TPU software), and "
            f"{spec.trainer.machine} is a {'GPU' if 'gpu' in kinds else 'CPU'} VM, whose wheelhouse holds TensorFlow "
            "and dsctl only. Train on a TPU VM (trainer.machine: tpu-v5litepod-8, ...), or bring an image with jax "
            "(gcp.image or gcp.gpu_image, gcp.bootstrap: false).", field="trainer.framework")
    per_kind = {kind: _candidates_for_kind(spec, g, kind) for kind in kinds}
    candidates = sorted(set.intersection(*per_kind.values()), key=_version_key, reverse=True)
    needs = {kind: _what_kind_needs(spec, g, kind) for kind in kinds}
    if g.tensorflow_version:
        version, why = g.tensorflow_version, "gcp.tensorflow_version"
        if version not in candidates:
            missing = [needs[kind] for kind in kinds if version not in per_kind[kind]]
            raise SpecError(
                f"TensorFlow {version} is not available for every machine of this run: there is no "
                f"{'; no '.join(missing)} at that version. One TensorFlow runs on every VM (tf.data service sends "
                f"dataset graphs between them); versions that work here: {', '.join(candidates[:6]) or 'none'}.",
                field="gcp.tensorflow_version")
    elif not candidates:
        raise SpecError(f"no TensorFlow version exists for every machine of this run (needed: {'; '.join(needs.values())}); "
                        "change the images or the trainer machine.", field="trainer.machine")
    elif local_tf and local_tf.split("+")[0] in candidates:
        version, why = local_tf.split("+")[0], "this machine's"
    else:
        version = candidates[0]
        why = (f"the newest with a {' and a '.join(needs[k].split(' (')[0] for k in kinds)}"
               + (f"; this machine has {local_tf}" if local_tf else ""))
    out = {"cpu": _kind_software(spec, g, "cpu", version)}
    for kind in kinds:
        out[kind] = _kind_software(spec, g, kind, version)
    return Software(version, why, out)


def _kind_software(spec: JobSpec, g: GcpSpec, kind: str, version: str) -> KindSoftware:
    if kind == "tpu" and _jax_on_tpu(spec):
        runtime = g.tpu_runtime_version or jax_tpu_runtime(tpu_generation(spec.trainer.machine)[0])
        assert runtime is not None, "_check_tpu_runtime refuses a TPU without JAX's runtime"
        return KindSoftware("tpu", runtime, *TPU_RUNTIME_PYTHON, tensorflow=f"tensorflow-cpu=={version}", jax=JAX_VERSION)
    if kind == "tpu":
        generation, _ = tpu_generation(spec.trainer.machine)
        runtime = g.tpu_runtime_version or tpu_runtime(version, generation)
        assert runtime is not None, "a TensorFlow version is a candidate for TPUs only with a runtime"
        return KindSoftware("tpu", runtime, *TPU_RUNTIME_PYTHON, tensorflow=None)
    if kind == "gpu":
        return KindSoftware("gpu", g.gpu_image, *_image_python(g, g.gpu_image, "gcp.gpu_image"),
                            tensorflow=f"tensorflow[and-cuda]=={version}")
    return KindSoftware("cpu", g.image, *_image_python(g, g.image, "gcp.image"), tensorflow=f"tensorflow-cpu=={version}")
