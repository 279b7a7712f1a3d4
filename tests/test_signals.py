"""Every long command ends on SIGINT, SIGTERM and SIGHUP as `dsctl up` does on Ctrl-C.

A closed terminal or a dropped SSH session sends SIGHUP; a scheduler, `kill` or `timeout` sends SIGTERM.
Either used to end `dsctl up`, `dsctl sweep` or `dsctl experiments run` at once, leaving the launcher,
dispatcher, workers and trainers running and the record "running". Now each tears down, records the run
as interrupted, and exits 128 + the signal's number with one line. Real processes and real signals; each
signal is sent once the command has something running to stop.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from dsctl.orchestrator.store import RunStore
from helpers import processes_under, wait_for, write_spec

pytestmark = pytest.mark.slow

JOB = """
    name: sig
    service: {workers: 1}
    trainer: {model: {step_time_ms: 10}, duration_s: 120, warmup_batches: 2}
    pipeline: {builtin: synthetic, params: {batch_size: 8, latency_ms: 2, epochs: null}}
"""


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def training(home) -> bool:
    """A run of this home has a trainer that has measured a window."""
    for metrics in (home / "runs").glob("*/metrics/**/trainer-*.jsonl"):
        if '"window"' in metrics.read_text():
            return True
    return False


def assert_ended_by(proc: subprocess.Popen, signum: int, home) -> str:
    """The command ended by `signum` as by Ctrl-C: exit 128 + n, one line, no traceback, nothing left running."""
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, f"exit {proc.returncode}: {err}"
    assert "Traceback" not in err, err
    # What it printed while it ran (progress, an experiment's log) comes first; the interruption is one line.
    lines = [line for line in err.strip().splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1 and lines[0].startswith(f"interrupted ({signal.Signals(signum).name})"), err
    assert err.strip().splitlines()[-1] == lines[0], err
    assert processes_under(home) == []
    from dsctl.provisioners.containment import leftover_cgroups

    runs = {p.name for p in (home / "runs").iterdir()}
    assert not [c for c in leftover_cgroups() if any(c.name.endswith(r) for r in runs)]
    return lines[0]


def test_sighup_to_up_tears_down_records_and_exits_129(home, tmp_path):
    """A closed terminal: `dsctl up` tears the run down and records it interrupted."""
    up = start("up", str(write_spec(tmp_path, JOB)))
    wait_for(lambda: training(home), timeout=120, what="the trainer's first window")
    # and dsctl up has stored it (it reads the trainer's metrics file every few tenths of a second)
    wait_for(lambda: [r for r in RunStore().list() if RunStore().windows(r.id)], timeout=60, what="a stored window")
    up.send_signal(signal.SIGHUP)
    assert_ended_by(up, signal.SIGHUP, home)
    [record] = RunStore().list()
    assert record.status == "interrupted" and record.summary.get("batches")
    states = [json.loads(p.read_text())["status"] for p in (home / "runs").glob("*/state.json")]
    assert states == ["down"]


def test_sigterm_to_sweep_keeps_finished_points_and_leaves_nothing_running(home, tmp_path):
    """The signal comes while a point is being measured, after one has finished: that one is kept, the one being
    measured is recorded interrupted (it stayed "running" when the signal came inside its window)."""
    spec = write_spec(tmp_path, JOB)
    sweep = start("sweep", str(spec), "--workers", "1..2", "--window", "4s", "--warmup", "0.5")

    def measuring_after_a_finished_point():
        points = RunStore().list(kinds=("point",))
        finished = [p for p in points if p.mode == "service" and p.status == "succeeded"]
        return finished and [p for p in points if p.status == "running" and p.created_at > finished[0].created_at]

    [measuring] = wait_for(measuring_after_a_finished_point, timeout=180, what="a point measured after the first")
    sweep.send_signal(signal.SIGTERM)
    line = assert_ended_by(sweep, signal.SIGTERM, home)
    [record] = RunStore().list(kinds=("sweep",))
    assert record.status == "interrupted" and record.id in line
    assert [p["workers"] for p in record.summary["points"]][:1] == [1]
    assert not [r for r in RunStore().list(kinds=("job", "sweep", "point")) if r.status == "running"]
    point = RunStore().recorded(measuring.id)
    assert point.status == "interrupted" and f"sweep {record.id} was stopped" in (point.error or "")


def test_sigterm_to_experiments_run_stops_its_deployment_and_records_its_run(home, tmp_path):
    experiment = start("experiments", "run", "fig10", "--quick", "--out", str(tmp_path / "out"))
    wait_for(lambda: training(home), timeout=180, what="the experiment's first run to train")
    experiment.send_signal(signal.SIGTERM)
    assert_ended_by(experiment, signal.SIGTERM, home)
    runs = RunStore().list(kinds=("job", "sweep", "point"))
    assert runs and all(r.status != "running" for r in runs), [(r.id, r.status) for r in runs]
    assert any(r.status == "interrupted" for r in runs)
