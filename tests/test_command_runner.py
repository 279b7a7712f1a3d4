"""The runner of a user's command (runtime/command.py): how a program's end is judged, and, with real processes, that
nothing it starts outlives it (daemons included) whether it exits or the run tears down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from dsctl.runtime.command import _outcome
from dsctl.specs import exits, load_spec_text
from helpers import wait_for

PY_DIR = os.path.dirname(sys.executable)


def metrics(tmp_path: Path, *events: dict) -> str:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(path)


START = {"event": "start"}
FIRST = {"event": "first_batch"}


def window(n: int) -> dict:
    return {"event": "window", "batches": n}


def end(n: int) -> dict:
    return {"event": "end", "batches": n}


# -- judging the program's end (no processes) -----------------------------------------------------------------

def test_a_clean_exit_after_reading_and_measuring_succeeds(tmp_path):
    assert _outcome(0, ["python", "t.py"], metrics(tmp_path, START, FIRST, window(10), end(10)), "", 10, []) is None


def test_a_failing_program_is_one_paragraph_with_its_code_batches_and_last_lines_as_lines(tmp_path):
    tail = "noise\nTraceback (most recent call last):\n  File \"t.py\", line 3\nValueError: bad lr"
    err = _outcome(3, ["python", "t.py", "--lr", "x y"], metrics(tmp_path, START, FIRST, window(12), end(12)), tail, 100, [])
    paragraph, *lines = str(err).split("\n")
    assert not err.user
    assert "`python t.py --lr 'x y'` exited with code 3 after 12 batch(es) of 100" in paragraph
    assert paragraph.endswith("The last lines it printed are below.")
    # the traceback reads as one: line by line, indented as the program printed it, never joined by '|'
    assert lines == ["  | noise", "  | Traceback (most recent call last):", '  |   File "t.py", line 3',
                     "  | ValueError: bad lr"]


def test_a_killed_program_says_the_signal_and_at_least_the_batches_its_windows_hold(tmp_path):
    err = _outcome(-9, ["python", "t.py"], metrics(tmp_path, START, FIRST, window(8), window(7)), "", None, [])
    assert "was killed by signal 9 (SIGKILL) after at least 15 batch(es): " in str(err) and "kill -9" in str(err)
    err = _outcome(-15, ["python", "t.py"], metrics(tmp_path, START), "", None, [])
    assert "killed by signal 15 (SIGTERM) before reading any batch." in str(err)


def test_a_program_killed_for_memory_says_so_with_the_evidence_after_its_batches(tmp_path):
    oom = exits.ending(-9, "memory cgroup /m counted 1 out-of-memory kill(s) while it ran")
    err = _outcome(-9, ["python", "t.py"], metrics(tmp_path, START, FIRST, window(8)), "", 100, [], oom)
    text = str(err)
    assert not err.user and "\n" not in text
    assert text.startswith("the command `python t.py` was killed by the kernel's out-of-memory killer (SIGKILL) after "
                           "at least 8 batch(es) of 100: it ran out of memory. Evidence: memory cgroup /m counted 1 "
                           "out-of-memory kill(s) while it ran. Give it more memory"), text


def test_a_program_that_never_read_the_runs_data_is_the_users_to_fix(tmp_path):
    err = _outcome(0, ["python", "t.py"], metrics(tmp_path), "hello", 10, [])
    assert err.user and str(err).startswith("trainer.command: ") and "never called dsctl.train.dataset()" in str(err)
    err = _outcome(0, ["python", "t.py"], metrics(tmp_path, START), "", 10, [])
    assert err.user and "read no batches through dsctl.train.batches()" in str(err)


def test_what_dsctl_train_refused_is_the_message_and_processes_left_behind_fail_the_run(tmp_path):
    refused = {"event": "error", "source": "dsctl.train", "kind": "user", "message": "dsctl.train.batches() was called again"}
    err = _outcome(1, ["python", "t.py"], metrics(tmp_path, START, end(10), refused), "Traceback", 10, [])
    assert err.user and str(err).startswith("dsctl.train.batches() was called again") and "exited with code 1" in str(err)
    err = _outcome(0, ["python", "t.py"], metrics(tmp_path, START, FIRST, end(10)), "", 10, ["pid 7 (sleep 99)"])
    assert err.user and "left 1 process(es) running: pid 7 (sleep 99)" in str(err)


# -- the runner with real processes (no TensorFlow in the programs) ------------------------------------------------

DAEMON = """
import os, sys, time
from pathlib import Path
if os.fork() == 0:          # a daemon: double fork, a session of its own, its pid in a file
    os.setsid()
    if os.fork() == 0:
        Path("daemon.pid").write_text(str(os.getpid()))
        time.sleep(600)
    os._exit(0)
time.sleep(float(sys.argv[1]))
"""


def run_command(tmp_path: Path, command: list[str], files: dict[str, str], **popen) -> subprocess.Popen:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    spec = load_spec_text(f"name: t\ntrainer: {{steps: 10, command: {json.dumps(command)}}}\n"
                          "pipeline: {builtin: synthetic}\n").spec
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    env = {**os.environ, "PATH": PY_DIR + os.pathsep + os.environ.get("PATH", "")}
    with open(tmp_path / "trainer.log", "w") as log:  # the trainer's log, as the launcher gives it one
        return subprocess.Popen([sys.executable, "-m", "dsctl.runtime.command", "--spec", str(tmp_path / "spec.json"),
                                 "--mode", "colocated", "--metrics", str(tmp_path / "m.jsonl"),
                                 "--base-dir", str(tmp_path)], env=env, stdout=log, stderr=subprocess.STDOUT, **popen)


def errors(tmp_path: Path) -> list[dict]:
    return [e for e in map(json.loads, (tmp_path / "m.jsonl").read_text().splitlines()) if e["event"] == "error"]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.integration  # runs runtime/command.py and its program as child processes
def test_a_program_that_exits_at_once_fails_with_its_output(tmp_path):
    proc = run_command(tmp_path, ["python", "t.py"], {"t.py": "import sys; print('cannot parse --lr'); sys.exit(4)"})
    proc.communicate(timeout=60)
    assert proc.returncode == 1, (tmp_path / "trainer.log").read_text()
    [err] = errors(tmp_path)
    assert err["kind"] == "runtime" and "exited with code 4 before reading any batch" in err["message"]
    assert "cannot parse --lr" in err["message"]


@pytest.mark.integration  # runs runtime/command.py and its program as child processes
def test_a_program_that_is_not_there_is_the_users_to_fix(tmp_path):
    proc = run_command(tmp_path, ["./train.sh"], {})
    proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert errors(tmp_path)[0]["message"].startswith("trainer.command: ./train.sh does not exist")


@pytest.mark.integration  # runs runtime/command.py and its program as child processes
def test_a_daemon_the_program_left_is_stopped_and_fails_the_run(tmp_path):
    proc = run_command(tmp_path, ["python", "d.py", "0"], {"d.py": DAEMON})
    proc.communicate(timeout=60)
    daemon = int((tmp_path / "daemon.pid").read_text())
    assert gone(daemon), "the daemon outlived the runner"
    assert proc.returncode == 2  # it also never read the run's data: that is said first
    assert "never called dsctl.train.dataset()" in errors(tmp_path)[0]["message"]


@pytest.mark.integration  # runs runtime/command.py and its program as child processes
def test_teardown_stops_the_program_and_its_daemon(tmp_path):
    proc = run_command(tmp_path, ["python", "d.py", "600"], {"d.py": DAEMON}, start_new_session=True)
    daemon = int(wait_for(lambda: (tmp_path / "daemon.pid").exists() and (tmp_path / "daemon.pid").read_text(),
                          timeout=30, what="the daemon's pid"))
    program = [p for p in psutil.Process(proc.pid).children() if "d.py" in " ".join(p.cmdline())][0].pid
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)  # what dsctl's teardown sends a trainer's process group
    proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 6.0  # within the 5 s dsctl gives a trainer, plus the poll
    assert gone(program) and gone(daemon)
    assert not errors(tmp_path)  # a run tearing down is not the program's failure


READS_TWICE = """
from dsctl import train
ds = train.dataset()
for epoch in range(3):  # an epoch loop whose epochs outlast trainer.steps
    for batch in train.batches(ds):
        pass
"""


@pytest.mark.slow
def test_a_program_that_reads_past_the_steps_is_stopped_with_what_to_change(tmp_path):
    proc = run_command(tmp_path, ["python", "t.py"], {"t.py": READS_TWICE})
    proc.communicate(timeout=120)
    assert proc.returncode == 2, (tmp_path / "trainer.log").read_text()
    err = errors(tmp_path)[-1]  # the runner's, which the run reports (dsctl.train's own comes first)
    assert err["message"].startswith("trainer.steps: the program asked for more batches once all 10 that "
                                     "trainer.steps allows (the cap on the job's training steps) were read, before "
                                     "its first epoch ended (10 batches). Remove trainer.steps")
    ends = [e for e in map(json.loads, (tmp_path / "m.jsonl").read_text().splitlines()) if e["event"] == "end"]
    assert [e["batches"] for e in ends] == [10]  # what it read is measured once
