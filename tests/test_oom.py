"""A process the kernel kills for memory is named as such, with the evidence: real processes pushed past the limit
of a cgroup v1 memory controller made here (below this process's own memory cgroup), and one ended by kill -9 for
contrast. The entrypoint check of `dsctl validate` used to say the module "ended the process (os._exit) or crashed
it"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import dsctl, write_spec

pytestmark = pytest.mark.integration  # processes killed by the kernel; dsctl as a subprocess

HOG = "x = []\nwhile True:\n    x.append(bytearray(16 << 20))\n"


@pytest.fixture
def memory_cgroup():
    """A cgroup v1 memory controller folder of its own, limited to 400 MiB; every process in it killed and the
    folder removed after the test."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    mine = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                 if "memory" in line.split(":", 2)[1].split(",")), None)
    base = Path("/sys/fs/cgroup/memory")
    if mine is None or not (base / mine.lstrip("/")).is_dir():
        pytest.skip("no cgroup v1 memory controller here")
    folder = base / mine.lstrip("/") / f"dsctl-test-oom-{os.getpid()}-{time.monotonic_ns()}"
    try:
        folder.mkdir()
        (folder / "memory.limit_in_bytes").write_text(str(400 << 20))
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    try:
        yield folder
    finally:
        for _ in range(50):
            pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def into(folder: Path):
    """A preexec_fn that moves the child into `folder` before it runs anything."""
    return lambda: (folder / "cgroup.procs").write_text(str(os.getpid()))


def test_a_process_killed_for_memory_is_named_with_its_evidence_and_kill_9_is_not(memory_cgroup):
    from dsctl.specs import exits

    proc = subprocess.Popen([sys.executable, "-c", HOG], preexec_fn=into(memory_cgroup))
    watched = exits.watch(proc.pid)
    assert str(memory_cgroup) in watched.counters  # its own cgroup, read before it was killed
    code = proc.wait(timeout=60)
    assert code == -signal.SIGKILL
    evidence = exits.oom_evidence(proc.pid, watched)
    text = exits.describe_exit(code, evidence)
    assert exits.describe(code, pid=proc.pid, watch=watched) == text  # what the runners call
    assert text.startswith("was killed by the kernel's out-of-memory killer"), text
    assert f"memory cgroup {memory_cgroup} counted 1 out-of-memory kill(s)" in text and "400 MiB" in text, text
    if os.access(exits.KMSG, os.R_OK):
        assert f"Killed process {proc.pid} (" in text, text

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=into(memory_cgroup))
    watched = exits.watch(other.pid)
    other.kill()
    code = other.wait(timeout=60)
    text = exits.describe_exit(code, exits.oom_evidence(other.pid, watched))
    assert text.startswith("was killed by signal 9 (SIGKILL): ") and "out-of-memory killer" not in text.split(":")[0]
    assert "kill -9" in text, text
    assert exits.describe_exit(3) == "exited with code 3"
    assert exits.describe_exit(-15) == "was killed by signal 15 (SIGTERM)"


PIPELINE = "hog = []\nwhile True:\n    hog.append(bytearray(16 << 20))\n\ndef make_dataset(**params):\n    pass\n"
JOB = """
name: hungry
trainer: {steps: 10}
pipeline: {entrypoint: "hungry:make_dataset"}
"""


def test_validate_names_an_entrypoint_killed_for_memory(memory_cgroup, tmp_path, monkeypatch):
    """The module allocates without end when imported: the kernel kills the check's child at the cgroup's limit."""
    monkeypatch.setenv("DSCTL_HOME", str(tmp_path / "home"))
    (tmp_path / "hungry.py").write_text(PIPELINE)
    spec = write_spec(tmp_path, JOB)
    proc = dsctl("validate", spec, timeout=120, preexec_fn=into(memory_cgroup))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert "checking module 'hungry' ended without a result: its process was killed by the kernel's out-of-memory " \
           "killer" in err, err
    assert f"memory cgroup {memory_cgroup}" in err and "os._exit" not in err, err
