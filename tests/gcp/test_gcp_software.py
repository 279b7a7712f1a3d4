"""Which TensorFlow each VM gets, and the wheelhouse it installs from: decided and checked before anything exists.

Fast tests: no cloud, no TensorFlow processes. The tables in provisioners/gcp/software.py
are the published ones; these tests pin the decisions made from them (the version chosen
for a TPU run, refusals of pairs that do not exist) and the wheelhouse's content-addressing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsctl.provisioners.gcp import software, wheelhouse
from dsctl.provisioners.gcp.errors import GcpError
from dsctl.specs import SpecError, load_spec_text


def _spec(trainer: str = "n2-standard-8", **gcp):
    extra = "".join(f"\n  {k}: {v!r}" if isinstance(v, str) else f"\n  {k}: {v}" for k, v in gcp.items())
    return load_spec_text(f"""
name: s
provider: gcp
trainer: {{machine: {trainer}, steps: 10}}
pipeline: {{builtin: synthetic}}
gcp:
  project: acme-ml
  zone: us-central1-b{extra}
""").spec


def test_a_cpu_or_gpu_run_keeps_this_machines_tensorflow_when_every_kind_has_it():
    s = software.resolve(_spec(), "2.21.0")
    assert (s.tensorflow_version, s.why) == ("2.21.0", "this machine's")
    assert s.for_kind("cpu").tensorflow == "tensorflow-cpu==2.21.0" and s.for_kind("cpu").python_version == "3.11"
    g = software.resolve(_spec("a2-highgpu-1g"), "2.21.0").for_kind("gpu")
    # The default Deep Learning VM family is a current one; its OS (Ubuntu 22.04) has the Python that makes the venv.
    assert g.image.endswith("/family/common-cu129-ubuntu-2204-nvidia-580")
    assert (g.tensorflow, g.python, g.python_version, g.glibc) == ("tensorflow[and-cuda]==2.21.0", "/usr/bin/python3",
                                                                  "3.10", "2.35")


DLVM = "projects/deeplearning-platform-release/global/images/"


# Names as Google lists them (https://cloud.google.com/deep-learning-vm/docs/images, 2026): families and their images.
@pytest.mark.parametrize("image, python", [
    # Today's: FRAMEWORK-CUDA-OS-nvidia-DRIVER; the OS's own Python.
    (f"{DLVM}family/common-cu129-ubuntu-2204-nvidia-580", ("/usr/bin/python3", "3.10", "2.35")),
    (f"{DLVM}family/common-cu129-ubuntu-2404-nvidia-580", ("/usr/bin/python3", "3.12", "2.39")),
    (f"{DLVM}family/common-cu128-ubuntu-2204-nvidia-570", ("/usr/bin/python3", "3.10", "2.35")),
    (f"{DLVM}family/pytorch-2-9-cu129-ubuntu-2404-nvidia-580", ("/usr/bin/python3", "3.12", "2.39")),
    (f"{DLVM}common-cu129-ubuntu-2204-nvidia-580-v20260818", ("/usr/bin/python3", "3.10", "2.35")),
    (f"https://www.googleapis.com/compute/v1/{DLVM}family/common-cu129-ubuntu-2204-nvidia-580",
     ("/usr/bin/python3", "3.10", "2.35")),
    (f"{DLVM}family/common-cu124-debian-12", ("/usr/bin/python3", "3.11", "2.36")),
    # Before 2025: the conda Python the family names, on Debian 11 (or, not named, glibc 2.28 assumed).
    (f"{DLVM}family/common-cu124-debian-11-py310", ("/opt/conda/bin/python3", "3.10", "2.31")),
    (f"{DLVM}common-cu124-v20250325-debian-11-py310", ("/opt/conda/bin/python3", "3.10", "2.31")),
    (f"{DLVM}family/tf-2-17-cu123-py310", ("/opt/conda/bin/python3", "3.10", "2.28")),
    # Google's OS images.
    ("projects/debian-cloud/global/images/family/debian-12", ("/usr/bin/python3", "3.11", "2.36")),
    ("projects/debian-cloud/global/images/family/debian-11", ("/usr/bin/python3", "3.9", "2.31")),
    ("projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts", ("/usr/bin/python3", "3.10", "2.35")),
    ("projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64", ("/usr/bin/python3", "3.12", "2.39")),
])
def test_the_python_of_an_image_is_read_from_its_name(image, python):
    assert software.known_image_python(image) == python
    k = software.resolve(_spec("a2-highgpu-1g", gpu_image=image), None).for_kind("gpu")
    assert (k.python, k.python_version, k.glibc) == python


@pytest.mark.parametrize("image", [
    f"{DLVM}family/common-cu129-ubuntu-2004-nvidia-580",  # an OS whose Python dsctl does not know
    f"{DLVM}family/common-cu113",  # no OS, no Python
    f"{DLVM}family/common-cu129-ubuntu-22045-nvidia-580",  # not an OS dsctl knows: a longer word
    "projects/acme/global/images/family/common-cu129-ubuntu-2204-nvidia-580",  # someone else's image of that name
    "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts-arm64",
])
def test_an_image_whose_python_cannot_be_told_is_refused_with_the_way_out(image):
    assert software.known_image_python(image) is None
    with pytest.raises(SpecError) as info:
        software.resolve(_spec("a2-highgpu-1g", gpu_image=image), None)
    message = str(info.value)
    assert info.value.field == "gcp.gpu_image" and "\n" not in message
    assert image in message and "gcp.image_python_version" in message and "gcp.image_python" in message
    assert "common-cu129-ubuntu-2204-nvidia-580" in message  # a family that works: the default
    # The way out: the spec says which Python the image has.
    k = software.resolve(_spec("a2-highgpu-1g", gpu_image=image, image_python_version="3.11",
                               image_python="/opt/py/bin/python3"), None).for_kind("gpu")
    assert (k.python, k.python_version, k.glibc) == ("/opt/py/bin/python3", "3.11", software.CUSTOM_IMAGE_GLIBC)


def test_the_default_gpu_image_is_in_the_stand_ins_catalog_and_google_lists_it():
    """The schema's default family exists where preflight looks for it (the stand-in's images, from Google's list)."""
    from fake_gce import IMAGES

    from dsctl.specs.schema import GcpSpec

    default = GcpSpec().gpu_image
    project, family = default.split("/")[1], default.rsplit("/", 1)[-1]
    assert any(p == project and i["family"] == family for (p, _), i in IMAGES.items())
    assert family.startswith("common-cu129-") and "debian" not in family  # Google deprecated every Debian image


def test_a_tpu_run_pins_the_newest_version_with_a_tensorflow_tpu_runtime_for_its_generation():
    s = software.resolve(_spec("tpu-v2-8"), "2.21.0")
    # No TensorFlow TPU runtime exists for 2.21 (this machine's); 2.18.0 is the newest for v2.
    assert s.tensorflow_version == "2.18.0" and "this machine has 2.21.0" in s.why
    t = s.for_kind("tpu")
    assert (t.image, t.tensorflow) == ("tpu-vm-tf-2.18.0-pjrt-v5p-and-below", None)  # TensorFlow comes with the image
    assert s.for_kind("cpu").tensorflow == "tensorflow-cpu==2.18.0"  # the workers run the trainer's version
    assert software.resolve(_spec("tpu-v5litepod-8"), None).for_kind("tpu").image == "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6"
    assert software.resolve(_spec("tpu-v2-8", tensorflow_version="2.16.1"), None).for_kind("tpu").image == \
        "tpu-vm-tf-2.16.1-pjrt"


def test_impossible_pairs_are_refused_naming_the_field_and_what_would_work():
    with pytest.raises(SpecError) as info:
        software.resolve(_spec("tpu-v2-8", tensorflow_version="2.21.0"), None)
    assert info.value.field == "gcp.tensorflow_version"
    assert "no TensorFlow TPU VM runtime for TPU v2" in str(info.value) and "2.18.0, 2.17.0" in str(info.value)
    with pytest.raises(SpecError, match="no tensorflow-cpu wheel for Python 3.12"):  # 2.15 has wheels up to 3.11
        software.resolve(_spec(tensorflow_version="2.15.0", image_python_version="3.12",
                               image="projects/x/global/images/custom"), None)
    with pytest.raises(SpecError) as info:
        software.resolve(_spec("tpu-v2-8", tpu_runtime_version="tpu-ubuntu2204-base"), None)
    assert info.value.field == "gcp.tpu_runtime_version"
    with pytest.raises(SpecError, match="multi-host TPU slice"):
        software.resolve(_spec("tpu-v2-32"), None)
    with pytest.raises(SpecError) as info:
        software.resolve(_spec(image="projects/acme/global/images/my-image"), None)
    assert info.value.field == "gcp.image" and "gcp.image_python_version" in str(info.value)
    custom = software.resolve(_spec(image="projects/acme/global/images/my-image", image_python_version="3.12"), "2.21.0")
    assert custom.for_kind("cpu").python_version == "3.12" and custom.for_kind("cpu").glibc == software.CUSTOM_IMAGE_GLIBC


def test_the_plan_says_which_tensorflow_and_refuses_what_cannot_start(monkeypatch):
    from dsctl.provisioners.gcp import plan

    text = plan(_spec("tpu-v2-8")).render()
    assert "TensorFlow 2.18.0 on every VM" in text and "tpu-vm-tf-2.18.0-pjrt-v5p-and-below" in text
    assert "tensorflow-cpu==2.18.0 for Python 3.11" in text
    with pytest.raises(SpecError):
        plan(_spec("tpu-v2-8", tensorflow_version="2.21.0"))


# -- wheelhouse ---------------------------------------------------------------------------------------------------
def _kind(**overrides):
    base = dict(kind="cpu", image="projects/debian-cloud/global/images/family/debian-12", python="/usr/bin/python3",
                python_version="3.11", glibc="2.36", tensorflow="tensorflow-cpu==2.21.0")
    return software.KindSoftware(**{**base, **overrides})


def test_a_wheelhouse_is_addressed_by_everything_that_decides_its_contents():
    r = wheelhouse.Recipe.for_kind(_kind())
    assert r.requirements[0] == "tensorflow-cpu==2.21.0" and "pip" in r.requirements
    assert set(wheelhouse.RUNTIME_REQUIREMENTS) <= set(r.requirements)
    digests = {r.digest}
    for change in (dict(python_version="3.10"), dict(glibc="2.31"), dict(tensorflow="tensorflow-cpu==2.20.0"),
                   dict(tensorflow=None)):
        digests.add(wheelhouse.Recipe.for_kind(_kind(**change)).digest)
    assert len(digests) == 5
    assert wheelhouse.Recipe.for_kind(_kind()).digest == r.digest
    args = r.pip_download_args(wheelhouse.Path("/d"))
    assert args[:2] == ["download", "--only-binary=:all:"] and "--python-version" in args and "3.11" in args
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    # Every manylinux tag the VM's glibc (2.36) can load, and none newer.
    assert platforms[0] == "manylinux2014_x86_64" and platforms[-1] == "manylinux_2_36_x86_64"
    assert "manylinux_2_17_x86_64" in platforms and "manylinux_2_37_x86_64" not in platforms


def test_the_supervisor_extra_is_what_pyproject_asks_for_the_cli_and_the_gcp_provider():
    """The dispatcher VM runs `dsctl supervise` (cli -> orchestrator -> provisioners.gcp): its extra must hold the
    same requirements as the package itself, and only the dispatcher's kind carries them."""
    import tomllib

    from dsctl.provisioners.gcp import wheel

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    wanted = {r for r in project["dependencies"] + project["optional-dependencies"]["gcp"]
              if not r.startswith(("tensorflow", "matplotlib", "grpcio", "dsctl"))}
    assert set(wheel.RUNTIME_REQUIREMENTS) | set(wheel.SUPERVISOR_REQUIREMENTS) == wanted
    plain, with_supervisor = (wheelhouse.Recipe.for_kind(_kind(), supervisor=s) for s in (False, True))
    assert not set(wheel.SUPERVISOR_REQUIREMENTS) & set(plain.requirements)
    assert set(wheel.SUPERVISOR_REQUIREMENTS) <= set(with_supervisor.requirements) and plain.digest != with_supervisor.digest


def test_the_cli_imports_nothing_the_supervisor_vm_lacks():
    """`dsctl supervise` on the dispatcher VM imports the whole CLI, and the VM has no matplotlib (the supervisor
    extra leaves it out): a plot is imported where it is drawn, never at the top of a module the CLI imports."""
    code = "import sys, dsctl.cli.main; print('matplotlib' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stderr


def test_the_wheel_offers_the_supervisor_extra(tmp_path):
    import zipfile

    from dsctl.provisioners.gcp import wheel

    path = wheel.build_wheel(tmp_path)
    with zipfile.ZipFile(path) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith("/METADATA"))).decode()
    assert "Provides-Extra: supervisor" in meta
    assert 'Requires-Dist: google-cloud-compute>=1.20; extra == "supervisor"' in meta
    assert "Requires-Dist: pydantic>=2.6\n" in meta


def test_a_built_wheelhouse_is_reused_and_a_failed_download_names_the_cause(tmp_path, monkeypatch):
    recipe = wheelhouse.Recipe("3.11", "2.36", ("nonexistent-package-dsctl-test==9.9.9", "pip"))
    # pip with no index and an empty find-links dir: the failure is local, nothing reaches a network.
    (tmp_path / "links").mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "links"))
    with pytest.raises(GcpError) as info:
        wheelhouse.build(recipe, tmp_path / "cache")
    assert "nonexistent-package-dsctl-test==9.9.9" in str(info.value) and "Python 3.11" in str(info.value)
    assert not list((tmp_path / "cache").iterdir()), "a failed build leaves no half-made wheelhouse"

    # A complete wheelhouse in the cache is used as it is: no pip run (pip is made unrunnable here).
    final = tmp_path / "cache" / recipe.digest
    final.mkdir()
    (final / "pip-26.0-py3-none-any.whl").write_bytes(b"x")
    files = [{"name": "pip-26.0-py3-none-any.whl", "sha256": "00", "size": 1}]
    (final / wheelhouse.MANIFEST).write_text(json.dumps({"files": files}))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    house = wheelhouse.build(recipe, tmp_path / "cache")
    assert house.dir == final and house.size == 1 and house.prefix == f"dsctl/wheelhouses/{recipe.digest}/"
