"""What a TPU trainer VM gets for its framework: JAX's TPU software and wheels, or TensorFlow's TPU runtime with PJRT.

Fast tests: no cloud, nothing downloaded (the wheelhouse recipe is checked as the pip arguments it makes; the real
downloads and the boot of a TPU VM's script are not run here, see docs/gcp.md).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dsctl.provisioners.gcp import plan, software, startup, wheelhouse
from dsctl.specs import SpecError, load_spec_text
from dsctl.specs.loader import LoadedSpec


def _loaded(machine: str = "tpu-v2-8", framework: str = "jax", **gcp) -> LoadedSpec:
    extra = "".join(f"\n  {k}: {v}" for k, v in gcp.items())
    return load_spec_text(f"""\
name: s
provider: gcp
trainer:
  machine: {machine}
  command: python train.py
  framework: {framework}
  steps: 10
pipeline: {{builtin: synthetic}}
gcp:
  project: acme-ml
  zone: us-central1-b{extra}
""")


def _software(machine: str = "tpu-v2-8", framework: str = "jax", local_tf: str | None = "2.21.0", **gcp):
    return software.resolve(_loaded(machine, framework, **gcp).spec, local_tf)


@pytest.mark.parametrize("machine, image", [
    ("tpu-v2-8", "tpu-ubuntu2204-base"), ("tpu-v3-8", "tpu-ubuntu2204-base"), ("tpu-v4-8", "tpu-ubuntu2204-base"),
    ("tpu-v5litepod-8", "v2-alpha-tpuv5-lite"), ("tpu-v5p-8", "v2-alpha-tpuv5"), ("tpu-v6e-8", "v2-alpha-tpuv6e")])
def test_a_jax_program_gets_jaxs_tpu_software_and_wheels_and_the_runs_own_tensorflow(machine, image):
    s = _software(machine)
    tpu = s.for_kind("tpu")
    assert tpu.image == image
    # Not held to the TensorFlow TPU runtimes (2.18.0 at most): this machine's TensorFlow, as a wheel beside jax.
    assert s.tensorflow_version == "2.21.0" and s.for_kind("cpu").tensorflow == "tensorflow-cpu==2.21.0"
    assert tpu.requirements == ("tensorflow-cpu==2.21.0", f"jax[tpu]=={software.JAX_VERSION}")
    assert (tpu.python, tpu.python_version) == ("/usr/bin/python3", "3.10") and not tpu.uses_image_tensorflow
    # TensorFlow (the tf.data client) must leave the TPU to JAX: no PJRT environment.
    assert tpu.trainer_file_env == {}


def test_a_tensorflow_program_gets_the_tensorflow_tpu_runtime_and_its_pjrt_environment():
    tpu = _software("tpu-v5litepod-8", "tensorflow").for_kind("tpu")
    assert tpu.image == "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6" and tpu.requirements == () and tpu.jax is None
    assert tpu.trainer_file_env == {"/lib/libtpu.so": {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
                                                       "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so"}}
    # dsctl's own trainers on a TPU VM too (no command); CPU and GPU VMs get none.
    own = load_spec_text("name: s\nprovider: gcp\ntrainer: {machine: tpu-v2-8, steps: 1}\npipeline: {builtin: synthetic}\n"
                         "gcp: {project: acme-ml, zone: us-central1-b}\n").spec
    assert software.resolve(own, None).for_kind("tpu").trainer_file_env
    assert _software("n2-standard-8", "tensorflow").for_kind("cpu").trainer_file_env == {}


def test_a_jax_run_keeps_to_the_tensorflow_versions_that_install_beside_jax():
    # This machine's TensorFlow when it installs beside jax, else the newest that does.
    assert _software(local_tf="2.19.0").tensorflow_version == "2.19.0"
    assert _software(local_tf="2.16.1").tensorflow_version == max(software.JAX_TENSORFLOW, key=software._version_key)
    with pytest.raises(SpecError) as info:
        _software(tensorflow_version="2.17.0")
    assert info.value.field == "gcp.tensorflow_version" and "beside jax[tpu]==" in str(info.value)
    assert "2.21.0, 2.20.0, 2.19.1, 2.19.0, 2.18.1" in str(info.value)


def test_what_cannot_work_is_refused_at_plan_time_at_trainer_framework_and_its_line():
    loaded = _loaded(tpu_runtime_version="tpu-vm-tf-2.18.0-pjrt-v5p-and-below")
    with pytest.raises(SpecError) as info:
        software.resolve(loaded.spec, "2.21.0")
    located = loaded.locate(info.value)
    assert located.field == "trainer.framework" and located.where == "<spec>:6"  # the line of `framework: jax`
    assert "tpu-ubuntu2204-base" in str(located) and "\n" not in str(located)
    # A JAX runtime named by hand is taken as it is; a generation dsctl has none for needs one named.
    assert _software(tpu_runtime_version="v2-alpha-tpuv6e").for_kind("tpu").image == "v2-alpha-tpuv6e"
    with pytest.raises(SpecError) as info:
        _software("tpu-v7x-8")
    assert info.value.field == "trainer.machine" and "gcp.tpu_runtime_version" in str(info.value)
    assert _software("tpu-v7x-8", tpu_runtime_version="v2-alpha-tpu7x").for_kind("tpu").image == "v2-alpha-tpu7x"
    # A TensorFlow program on JAX's software has no TensorFlow there.
    with pytest.raises(SpecError) as info:
        _software(framework="tensorflow", tpu_runtime_version="tpu-ubuntu2204-base")
    assert info.value.field == "gcp.tpu_runtime_version" and "trainer.framework: jax" in str(info.value)
    # jax is installed on TPU VMs only; with an image of one's own (no bootstrap), the image is the user's.
    with pytest.raises(SpecError) as info:
        _software("n2-standard-8")
    assert info.value.field == "trainer.framework" and "TPU VM" in str(info.value)
    assert _software("n2-standard-8", bootstrap="false").for_kind("cpu").jax is None


def test_the_plan_says_which_image_jax_and_tensorflow_the_tpu_trainer_gets():
    text = plan(_loaded("tpu-v5litepod-8").spec).render()
    assert "TensorFlow 2.21.0 on every VM" in text
    assert (f"TPU trainers: JAX's TPU software v2-alpha-tpuv5-lite; jax[tpu]=={software.JAX_VERSION} (jax, jaxlib, "
            "libtpu) and tensorflow-cpu==2.21.0 (the tf.data client) for Python 3.10") in text
    tf_text = plan(_loaded("tpu-v2-8", "tensorflow").spec).render()
    assert "tpu-vm-tf-2.18.0-pjrt-v5p-and-below" in tf_text and "TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so" in tf_text
    assert "the spec's folder: your code, less what its .dsctlignore leaves out, at most 100 MB" in tf_text


def test_the_jax_tpu_wheelhouse_recipe_downloads_jaxs_tpu_wheels_and_tensorflow_for_the_images_python():
    tpu = _software("tpu-v5p-8").for_kind("tpu")
    recipe = wheelhouse.Recipe.for_kind(tpu)
    args = recipe.pip_download_args(Path("/wheels"))
    assert args[:2] == ["download", "--only-binary=:all:"]
    assert args[args.index("--python-version") + 1] == "3.10" and ["--abi", "cp310"] == args[args.index("--abi"):][:2]
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    # libtpu's wheel is manylinux_2_31: the images' glibc (2.35) takes it, and nothing newer is asked for.
    assert "manylinux_2_31_x86_64" in platforms and platforms[-1] == "manylinux_2_35_x86_64"
    assert args[-len(recipe.requirements):] == list(recipe.requirements)
    assert recipe.requirements[:2] == ("tensorflow-cpu==2.21.0", f"jax[tpu]=={software.JAX_VERSION}")
    assert set(wheelhouse.RUNTIME_REQUIREMENTS) <= set(recipe.requirements) and "pip" in recipe.requirements
    # Its own wheelhouse: not the TensorFlow TPU runtime's (dsctl only), nor the workers'.
    tf_tpu = wheelhouse.Recipe.for_kind(_software("tpu-v5p-8", "tensorflow").for_kind("tpu"))
    assert len({recipe.digest, tf_tpu.digest, wheelhouse.Recipe.for_kind(_software("tpu-v5p-8").for_kind("cpu")).digest}) == 3


def test_the_jax_tpu_startup_script_installs_both_in_its_own_venv_and_checks_both_versions():
    s = _software("tpu-v6e-8")
    tpu = s.for_kind("tpu")
    text = startup.script(kind=tpu, tf_version=s.tensorflow_version, bucket="b", wheelhouse_prefix="dsctl/wheelhouses/x/",
                          dsctl_prefix="dsctl/runs/r/staging/", dsctl_wheel="dsctl-0.1.0+gabc-py3-none-any.whl")
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    assert f"tensorflow-cpu==2.21.0 'jax[tpu]=={software.JAX_VERSION}' /opt/dsctl/wheelhouse/dsctl-0.1.0" in text
    # JAX's image has no TensorFlow to see: the venv is its own (no --system-site-packages).
    assert "--system-site-packages" not in text
    assert "import tensorflow as tf; print(tf.__version__)" in text
    assert "import jax; print(jax.__version__)" in text and f'[ "$J" = {software.JAX_VERSION} ]' in text
    assert "jax.devices" not in text  # the check does not open the TPU: the program does
    assert startup.script(kind=_software("tpu-v6e-8", "tensorflow").for_kind("tpu"), tf_version="2.18.0", bucket="b",
                          wheelhouse_prefix="w/", dsctl_prefix="d/", dsctl_wheel="w.whl").count("import jax") == 0
