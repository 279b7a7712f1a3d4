"""Every ending is recorded as what happened, with real processes (the rules themselves: tests/test_endings.py).

- A user's program SIGTERM'd mid-run is not `succeeded`; one that trained all its steps while the launcher that
  forked its trainer was killed (its exit status lost) is, its loss, which diverged, shows as NaN, and its record
  survives runs.db removed under it. (dsctl's own harness SIGTERM'd: tests/test_local_job.py.)
- `dsctl down` racing an attached `dsctl up`, while it provisions and while it trains: `up` exits 130 and the run is
  `interrupted`, never `failed` ("the launcher exited ...") nor `succeeded`; nothing is left running. While it trains,
  its one worker is first stopped (SIGSTOP: hung, not dead): it is named, ended and restarted, and the job goes on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from dsctl.orchestrator.store import RunStore
from dsctl.provisioners import containment, load_deployment
from helpers import dsctl, processes_under, wait_for, write_spec

pytestmark = pytest.mark.slow

PROGRAM = """
import time
from dsctl import train
for n, batch in enumerate(train.batches(train.dataset()), 1):
    time.sleep(0.003)
    train.report(loss=1.0 / n if n < 600 else float("nan"))  # it diverges at step 600
"""

STEPS = 1500


def command_job(tmp_path):
    (tmp_path / "train.py").write_text(PROGRAM)
    return write_spec(tmp_path, f"""
        name: endings
        trainer: {{command: python train.py, steps: {STEPS}, warmup_batches: 2, window_s: 0.5}}
        pipeline: {{builtin: synthetic, params: {{elements: 256, batch_size: 8, epochs: null, latency_ms: 0}}}}
    """)


def up(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def windows(home, at_least: int = 1, besides: str = ""):
    """The run dir of the run (not `besides`) whose trainer 0 has written `at_least` windows."""
    for metrics in (home / "runs").glob("*/metrics/trainer-0.jsonl"):
        if metrics.parents[1].name != besides and metrics.read_text().count('"window"') >= at_least:
            return metrics.parents[1]
    return None


def test_a_sigterm_mid_run_is_never_succeeded_and_a_lost_status_after_the_last_step_is(home, tmp_path):
    spec = command_job(tmp_path)

    # The program itself is sent SIGTERM a few windows in: its loop stops, it exits 0, its end record says why.
    proc = up(spec, "--mode", "colocated")
    run_dir = wait_for(lambda: windows(home, 3), timeout=120, what="the program's third window")
    runner = load_deployment(run_dir).by_role("trainer")[0].pid
    [program] = psutil.Process(runner).children()
    program.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    record = RunStore().get(run_dir.name)
    assert record.status == "failed" and "stopped by SIGTERM after step" in record.error, record.error
    assert f"of {STEPS}" in record.error and "SIGTERM" in err.strip().splitlines()[-1]
    assert 0 < record.summary["batches"] < STEPS

    # The launcher that forked the trainer is killed; the trainer goes on, trains all its steps and ends, and nobody
    # can read its exit status any more: its end record says it finished, and that decides.
    proc = up(spec, "--mode", "colocated", "--json")
    run_dir = wait_for(lambda: windows(home, besides=record.id), timeout=120, what="the second run's first window")
    os.kill(load_deployment(run_dir).state.launcher.pid, signal.SIGKILL)
    (home / "runs.db").unlink()  # and the records go, as `rm ~/.dsctl/runs.db` would take them
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    second = json.loads(out, parse_constant=refuse)  # strict JSON, NaN and all
    assert second["status"] == "succeeded" and second["summary"]["batches"] == STEPS
    # Its loss diverged at step 600: recorded and shown as NaN, never as its last finite value.
    assert second["summary"]["loss_last"] == "NaN" and second["summary"]["loss_nonfinite"]["value"] == "nan"
    shown = " ".join(dsctl("runs", "show", second["id"], check=True).stdout.split())
    assert "nan in the last" in shown and "the model diverged" in shown
    # The record survived its database: rebuilt in a new runs.db, every window there, the removal an event.
    assert "records-rebuilt" in shown and "was removed or replaced while the run ran" in shown
    assert sum(w["batches"] for w in RunStore().windows(second["id"])) == STEPS
    assert processes_under(home) == []


def refuse(token: str):
    raise ValueError(f"not strict JSON: {token}")


JOB = """
    name: race
    service: {workers: 1}
    trainer: {model: {step_time_ms: 10}, duration_s: 120, warmup_batches: 2}
    pipeline: {builtin: synthetic, params: {batch_size: 8, latency_ms: 2, epochs: null}}
"""


@pytest.mark.parametrize("moment", ["provisioning", "training"])
def test_down_racing_an_attached_up_is_interrupted_whatever_phase_it_meets(home, tmp_path, moment):
    proc = up(write_spec(tmp_path, JOB))
    if moment == "provisioning":  # as soon as the run has a deployment: its launcher is starting
        run_dir = wait_for(lambda: next(iter((home / "runs").glob("*/state.json")), None), timeout=60,
                           what="the run's state file").parent
    else:
        run_dir = wait_for(lambda: windows(home), timeout=120, what="the trainer's first window")
        # First its one worker hangs (stopped, not dead): found within the bound, named, ended, restarted.
        worker = load_deployment(run_dir).by_role("worker")[0]
        os.kill(worker.pid, signal.SIGSTOP)
        wait_for(lambda: "worker-restarted" in [e["kind"] for e in RunStore().events(run_dir.name)], timeout=60,
                 what="the hung worker to be restarted")
        [hung] = [e["message"] for e in RunStore().events(run_dir.name) if e["kind"] == "worker-hung"]
        assert f"worker 0 ({worker.address}, pid {worker.pid}) stopped answering" in hung and "(state T" in hung
        assert not psutil.pid_exists(worker.pid) or psutil.Process(worker.pid).status() == psutil.STATUS_ZOMBIE
        done = (run_dir / "metrics" / "trainer-0.jsonl").read_text().count('"window"')
        wait_for(lambda: windows(home, done + 2), timeout=60, what="the trainer to go on with the restarted worker")
    down = dsctl("down", run_dir.name)
    assert down.returncode == 0 and "Traceback" not in down.stderr, down.stderr
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("taken down by `dsctl down`"), err
    record = RunStore().get(run_dir.name)
    assert record.status == "interrupted" and "dsctl down" in record.error, (record.status, record.error)
    assert processes_under(home) == []
    assert not [g for g in containment.leftover_cgroups() if run_dir.name in g.name]
