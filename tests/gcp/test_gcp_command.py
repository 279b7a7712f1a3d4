"""A user's own program (trainer.command) as the trainer of a job on the stand-in cloud.

The spec's folder, less what its .dsctlignore leaves out, is staged in the Cloud Storage emulator and unpacked
on the TPU trainer "VM" (reached over real SSH), where dsctl's runner starts the program with the VM's Python; the
program reads the run's data through the real dispatcher and worker with dsctl.train. What it measures reaches the
run's record; a program that fails fails the run with the runner's one paragraph.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from conftest import gcp_spec

from dsctl.orchestrator.outcome import RunFailed
from dsctl.orchestrator.run import JobRunner
from dsctl.orchestrator.store import RunStore
from dsctl.provisioners.gcp import GcpProvider, naming
from dsctl.specs import SpecError, load_spec

pytestmark = pytest.mark.slow

TRAIN = """\
import time

from dsctl import train

# CPU the trainer's utilization must count: this program runs below dsctl's runner on the VM.
start = time.process_time()
while time.process_time() - start < 2.0:
    pass
for i, batch in enumerate(train.batches(train.dataset())):
    train.report(loss=1.0 / (i + 1))
print("trained on", train.steps(), "batches")
"""

FAILS = """\
import sys

print("loading the model")
print("ValueError: the learning rate 'fast' is not a number", file=sys.stderr)
sys.exit(3)
"""


def command_spec(folder: Path, program: str, *, sshd, home, framework: str = "tensorflow", steps: int = 12) -> Path:
    """The stand-in job spec (conftest.gcp_spec: one worker, a TPU v2-8 trainer) with trainer.command instead of
    dsctl's model, and the program in the spec's folder beside a large file its .dsctlignore leaves out."""
    spec = gcp_spec(folder, sshd=sshd, home=home, workers=1, trainer_machine="tpu-v2-8", epochs=None, steps=steps,
                    model="MODEL")
    trainer = f"command: python train.py --lr fast, framework: {framework}"
    spec.write_text(spec.read_text().replace("model: MODEL", trainer))
    (folder / "train.py").write_text(program)
    (folder / "checkpoints").mkdir()
    with open(folder / "checkpoints" / "old.ckpt", "wb") as f:
        f.truncate(300 * 2**20)  # over the 100 MB limit, were it staged
    (folder / ".dsctlignore").write_text("checkpoints/\n")
    return spec


def test_a_command_trains_on_the_tpu_vm_and_its_windows_and_cpu_reach_the_record(cloud, sshd, home, tmp_path):
    spec = command_spec(tmp_path / "job", TRAIN, sshd=sshd, home=home)
    run_id = "command-0001"
    result: dict = {}
    # The runner lives in its thread (its run store belongs to it); meanwhile this one looks at the trainer VM.
    thread = threading.Thread(target=lambda: result.update(summary=JobRunner(load_spec(spec), run_id=run_id).run()))
    thread.start()
    vm_dir = home / "vms" / run_id / naming.instance_name(run_id, "trainer", 0)
    deadline = time.monotonic() + 120
    while not (vm_dir / "shpid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    # How it was started: under the runner, marked so the VM's status counts its tree, with TensorFlow's PJRT
    # environment for a VM that has libtpu (this machine has none, so the program does not get it).
    wrapper = Path(f"/proc/{(vm_dir / 'shpid').read_text().strip()}/cmdline").read_bytes().decode()
    assert "dsctl.runtime.command" in wrapper and "--vm-python" in wrapper and (vm_dir / "tree").exists()
    assert ("if [ -e /lib/libtpu.so ]; then export NEXT_PLUGGABLE_DEVICE_USE_C_API=true "
            "TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so; fi;") in wrapper
    thread.join(timeout=240)
    assert not thread.is_alive()

    store = RunStore()
    record = store.get(run_id)
    assert record.status == "succeeded", record.error
    assert result["summary"]["batches"] == 12
    # The code came from the staged folder (unpacked on the VM), without what .dsctlignore left out.
    assert (vm_dir / "code" / "train.py").exists() and not (vm_dir / "code" / "checkpoints").exists()
    windows = store.windows(run_id)
    assert sum(w["batches"] for w in windows) == 12 and any(w["loss"] is not None for w in windows)
    assert "trained on 12 batches" in (home / "runs" / run_id / "metrics" / "trainer-0.log").read_text()
    # Its CPU came from the program below the runner (2 s spun there; the runner alone idles).
    trainer_cpu = max(u["cpu_seconds"] for u in store.utilization(run_id) if u["role"] == "trainer")
    assert trainer_cpu >= 2.0
    assert cloud.counts() == {"instances": 0, "firewalls": 0, "tpus": 0}


def test_a_command_that_fails_fails_the_run_with_its_last_lines(cloud, sshd, home, tmp_path):
    """A JAX program, as it happens: its TPU VM is asked for with JAX's TPU software for TPU v2."""
    spec = command_spec(tmp_path / "job", FAILS, sshd=sshd, home=home, framework="jax")
    runner = JobRunner(load_spec(spec))
    with pytest.raises(RunFailed):
        runner.run()
    record = RunStore().get(runner.run_id)
    assert record.status == "failed"
    paragraph, *lines = record.error.split("\n")  # one paragraph, then the program's last lines as lines
    assert "`python train.py --lr fast` exited with code 3 before reading any batch" in paragraph
    assert "  | loading the model" in lines and "  | ValueError: the learning rate 'fast' is not a number" in lines
    [tpu] = [body["tpu"]["nodeSpec"][0]["node"] for kind, body in cloud.created if kind == "queued_resource"]
    assert tpu["runtimeVersion"] == "tpu-ubuntu2204-base"
    assert cloud.counts() == {"instances": 0, "firewalls": 0, "tpus": 0}


def test_a_spec_folder_over_the_limit_is_refused_by_the_check_before_anything_is_created(cloud, home, tmp_path):
    """The provider's check (before any VM) measures the folder the trainers would get, as staging would."""
    folder = tmp_path / "job"
    folder.mkdir()
    spec = command_spec(folder, TRAIN, sshd=None, home=home)
    (folder / ".dsctlignore").write_text("")  # the 300 MB checkpoint is staged now
    loaded = load_spec(spec, check_entrypoints=False)
    with pytest.raises(SpecError, match=r"holds 300.0 MB .*more than the 100 MB limit.* Largest: checkpoints/ \(300.0 MB\)"):
        GcpProvider().check(loaded.spec, 1, loaded.base_dir)
    assert not list(home.glob("vms/*")), "nothing was created"
