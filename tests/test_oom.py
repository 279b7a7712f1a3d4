"""A process the kernel kills for memory is named as such, with the evidence: real processes pushed past the limit
of a cgroup v1 memory controller made here (below this process's own memory cgroup), and one ended by kill -9 for
contrast. The entrypoint check of `dsctl validate` used to say the module "ended the process (os._exit) or crashed
it"; inside a run, a builtin trainer killed for memory (its exit judged by the launcher that reaped it) read "trainer 0
exited with code -9", and a user's command (judged by its runner) "was killed by signal 9 (SIGKILL)"."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_command_runner import errors, run_command

from dsctl.specs import exits
from helpers import dsctl, remove_cgroup, write_spec

pytestmark = pytest.mark.integration  # processes killed by the kernel; dsctl as a subprocess

HOG = "x = []\nwhile True:\n    x.append(bytearray(16 << 20))\n"


@pytest.fixture
def memory_cgroup():
    """A cgroup v1 memory controller folder of its own, limited to 400 MiB; every process in it killed and the
    folder removed after the test."""
    yield from limited_memory(400 << 20)


@pytest.fixture
def run_memory_cgroup():
    """The same, limited to 1 GiB: room for `dsctl up` of a colocated run (about 450 MiB at most: dsctl, the
    launcher with TensorFlow and the trainer it forks) until its trainer's pipeline takes the rest."""
    yield from limited_memory(1 << 30)


def limited_memory(limit: int):
    """A memory cgroup (v1, below this process's own) limited to `limit` bytes, for the test's processes to be
    started in; skipped, saying why, where this machine lets the test make none (this machine: cgroup v1's memory
    controller, while its cgroup v2 hierarchy has no memory controller to limit)."""
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
        (folder / "memory.limit_in_bytes").write_text(str(limit))
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    try:
        yield folder
    finally:
        remove_cgroup(folder)


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
        # Its status read by nobody (its reaper gone): the kernel log naming its pid still says how it ended.
        lost = exits.judge_lost(proc.pid, watched)
        assert lost is not None and lost.oom and str(lost) == text, lost

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=into(memory_cgroup))
    watched = exits.watch(other.pid)
    other.kill()
    code = other.wait(timeout=60)
    text = exits.describe_exit(code, exits.oom_evidence(other.pid, watched))
    assert text.startswith("was killed by signal 9 (SIGKILL): ") and "out-of-memory killer" not in text.split(":")[0]
    assert "kill -9" in text, text
    assert exits.judge_lost(other.pid, watched) is None  # no kernel log line names it: how it ended is not known
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


HUNGRY_DATASET = """
import tensorflow as tf

def make_dataset(**params):
    # Every element kept (an in-memory cache that is never complete) and each 16 MiB: whoever reads it runs out of
    # memory. Only reading it does: the entrypoint check of `dsctl up` builds it and reads nothing.
    big = tf.data.Dataset.range(1 << 30).map(lambda i: tf.fill([16 << 20], tf.cast(i % 200 + 1, tf.uint8)))
    return big.cache()
"""
HUNGRY_JOB = """
name: hungry-trainer
trainer: {steps: 100000, model: {kind: synthetic, step_time_ms: 0}}
pipeline: {entrypoint: "hungrydata:make_dataset"}
"""


@pytest.mark.slow  # dsctl up: the launcher imports TensorFlow, the trainer reads until the kernel kills it
def test_a_builtin_trainer_killed_for_memory_fails_the_run_naming_the_oom_kill(run_memory_cgroup, tmp_path, monkeypatch):
    """`dsctl up` in a memory cgroup its trainer's pipeline outgrows (colocated: the pipeline runs in the trainer):
    the kernel kills the trainer, and the run's error names the out-of-memory killer with the launcher's evidence
    (it used to say "trainer 0 exited with code -9")."""
    monkeypatch.setenv("DSCTL_HOME", str(tmp_path / "home"))
    (tmp_path / "hungrydata.py").write_text(HUNGRY_DATASET)
    spec = write_spec(tmp_path, HUNGRY_JOB)
    proc = dsctl("up", spec, "--mode", "colocated", timeout=300, preexec_fn=into(run_memory_cgroup))
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # On a loaded machine the kernel may kill the launcher too, once the trainer's memory is slow to go (a CI run
    # counted 2 kills): the trainer's exit status is then lost with its reaper, and the kernel log, which names the
    # trainer's pid, is what says how it ended. Without that log only a cgroup's count is left, which could be
    # another process's kill: the error then says the out-of-memory killer may have ended it.
    kills = re.search(rf"memory cgroup {re.escape(str(run_memory_cgroup))} counted (\d+) out-of-memory kill\(s\) while "
                      r"it ran \(its limit: 1024 MiB\)", err)
    assert kills and int(kills[1]) >= 1, err
    assert "exited with code -9" not in err and "code -1" not in err, err
    named = "trainer 0 failed: it was killed by the kernel's out-of-memory killer (SIGKILL): it ran out of " \
            "memory. Evidence: memory cgroup "
    if os.access(exits.KMSG, os.R_OK):
        assert named in err and "the kernel log says: '" in err and "Killed process " in err, err
    else:
        assert named in err or "The kernel's out-of-memory killer may have ended it; evidence: memory cgroup " in err, err


def test_a_users_command_killed_for_memory_is_named_so_by_its_runner(memory_cgroup, tmp_path):
    """The runner of trainer.command (runtime/command.py) in a 400 MiB memory cgroup, its program allocating without
    end: the kernel kills the program, and the trainer's error says it was the out-of-memory killer, with the
    evidence (it used to say "was killed by signal 9 (SIGKILL)" and nothing more)."""
    proc = run_command(tmp_path, ["python", "hog.py"], {"hog.py": HOG}, preexec_fn=into(memory_cgroup))
    proc.communicate(timeout=120)
    assert proc.returncode == 1, (tmp_path / "trainer.log").read_text()
    [err] = errors(tmp_path)
    message = err["message"]
    assert err["kind"] == "runtime", err
    assert message.startswith("the command `python hog.py` was killed by the kernel's out-of-memory killer (SIGKILL) "
                              "before reading any batch: it ran out of memory. Evidence: memory cgroup "), message
    assert f"memory cgroup {memory_cgroup} counted 1 out-of-memory kill(s) while it ran (its limit: 400 MiB)" in message
    if os.access(exits.KMSG, os.R_OK):
        assert "the kernel log says: '" in message and "Killed process " in message, message
