"""TensorFlow's PJRT TPU runtime environment reaches a TensorFlow trainer on a TPU VM, and no other trainer.

The command dsctl sends to start a trainer (remote.launch with its kind's `trainer_file_env`, as
processes.start_trainer sends it over SSH) runs inside a booted stand-in VM (vmboot.py: Debian's root filesystem
in its own namespaces), whose /lib/libtpu.so is made or removed by the test. Every VM here has the library, so only
the run's software description decides who gets the environment; the trainer's "python" prints its environment.
"""

from __future__ import annotations

import pytest
import vmboot

from dsctl.provisioners.gcp import remote, software
from dsctl.provisioners.gcp.machinetypes import machine_kind
from dsctl.specs import load_spec_text

pytestmark = pytest.mark.slow

PYTHON = "/opt/trainer-python"  # prints its environment, as `python -m MODULE ARGS` would start the trainer
PJRT = {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so"}


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    reason = vmboot.unsupported_reason()
    if reason:
        pytest.skip(reason)
    with vmboot.BootedVm(tmp_path_factory.mktemp("vm")) as booted:
        booted.exec(["sh", "-c", f"printf '#!/bin/sh\\nenv\\n' > {PYTHON} && chmod 755 {PYTHON}"]).check()
        yield booted


def _kind(machine: str, framework: str) -> software.KindSoftware:
    spec = load_spec_text(f"""\
name: s
provider: gcp
trainer: {{machine: {machine}, command: python train.py, framework: {framework}, steps: 10}}
pipeline: {{builtin: synthetic}}
gcp: {{project: acme-ml, zone: us-central1-b}}
""").spec
    return software.resolve(spec, "2.21.0").for_kind(machine_kind(machine).kind)


def _launched_env(vm, label: str, kind: software.KindSoftware) -> dict[str, str]:
    """Start the trainer as dsctl does on the VM; the environment its program saw."""
    layout = remote.Layout(f"/var/dsctl/run/{label}")
    vm.exec(["bash", "-c", remote.launch(layout, PYTHON, "dsctl.runtime.harness", ["--spec", "spec.json"],
                                         file_env=kind.trainer_file_env)]).check()
    done = vm.exec(["sh", "-c", f"for i in $(seq 100); do [ -s {layout.rc} ] && exit 0; sleep 0.1; done; exit 1"])
    assert done.exit_code == 0, "the trainer did not end"
    out = vm.exec(["cat", layout.log]).check().stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.mark.parametrize("machine, framework, pjrt", [
    ("tpu-v5litepod-8", "tensorflow", True),  # TensorFlow's TPU runtime: PJRT
    ("tpu-v2-8", "tensorflow", True),
    ("tpu-v5litepod-8", "jax", False),  # JAX holds the TPU; its tf.data client must leave it alone
    ("n2-standard-8", "tensorflow", False),
    ("a2-highgpu-1g", "tensorflow", False),
])
def test_only_a_tensorflow_trainer_on_a_tpu_vm_runs_with_the_pjrt_environment(vm, machine, framework, pjrt):
    vm.exec(["touch", "/lib/libtpu.so"]).check()
    env = _launched_env(vm, f"{machine}-{framework}", _kind(machine, framework))
    got = {k: env[k] for k in PJRT if k in env}
    assert got == (PJRT if pjrt else {}), env
    assert env["PYTHONUNBUFFERED"] == "1"  # the launch's own environment is there either way


def test_without_libtpu_a_tensorflow_tpu_trainer_gets_none_of_it(vm):
    """TensorFlow refuses to import with TF_PLUGGABLE_DEVICE_LIBRARY_PATH naming a missing file."""
    vm.exec(["rm", "-f", "/lib/libtpu.so"]).check()
    env = _launched_env(vm, "no-libtpu", _kind("tpu-v2-8", "tensorflow"))
    assert not set(PJRT) & set(env)
