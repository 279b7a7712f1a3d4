"""Records that match what ran: a run whose monitor died is closed from what its trainers wrote
for themselves, `status` says the monitor is gone, and `down` closes every record it interrupts, a sweep's points
included. Real processes: a detached run whose monitor is killed, a sweep killed or taken down under it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dsctl.orchestrator.store import RunStore
from dsctl.provisioners import load_deployment
from helpers import dsctl, processes_under, stepped_job, wait_for

pytestmark = pytest.mark.slow

STEPS = 400


def job(tmp_path: Path, steps: int = STEPS, step_time_ms: int = 10) -> Path:
    return stepped_job(tmp_path, "recon", steps, step_time_ms)


def metrics(run_dir: Path, event: str) -> list[dict]:
    try:
        lines = (run_dir / "metrics" / "trainer-0.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [r for r in (json.loads(line) for line in lines if line.endswith("}")) if r.get("event") == event]


def test_a_run_whose_monitor_died_is_recorded_as_its_trainers_ended_it(home, tmp_path):
    dsctl("up", job(tmp_path), "--detach", check=True)
    run_dir = next((home / "runs").iterdir())
    monitor = wait_for(lambda: (load_deployment(run_dir).monitor if (run_dir / "state.json").exists() else None),
                       timeout=60, what="the detached monitor's state")
    wait_for(lambda: RunStore().windows(run_dir.name), timeout=180, what="a first stored window")
    os.kill(monitor.pid, signal.SIGKILL)
    [end] = wait_for(lambda: metrics(run_dir, "end"), timeout=180, what="the trainer's own end record")
    assert end["reason"] == "steps" and end["batches"] == STEPS
    stored = sum(w["batches"] for w in RunStore().windows(run_dir.name))
    assert stored < STEPS, "the monitor died before it stored every window (the failure this test reproduces)"

    [row] = json.loads(dsctl("status", "--json", check=True).stdout)
    assert row["monitor"] == f"gone (pid {monitor.pid})" and "every trainer ended (steps)" in row["trainers_say"]
    shown = dsctl("status", check=True)
    assert f"its monitor (the detached `dsctl up`, pid {monitor.pid}) is gone" in " ".join(shown.stderr.split())

    dsctl("down", run_dir.name, check=True)
    assert processes_under(home) == []
    store = RunStore()
    record = store.get(run_dir.name)
    assert (record.status, record.error) == ("succeeded", None)
    assert record.summary["batches"] == STEPS and "summary_source" not in record.summary
    assert sum(w["batches"] for w in store.windows(record.id)) == STEPS, "the windows runs.db never got are added"
    [gone] = [e for e in store.events(record.id) if e["kind"] == "monitor-gone"]
    assert f"pid {monitor.pid}" in gone["message"] and "own metrics files" in gone["message"]
    shown = " ".join(dsctl("runs", "show", record.id, check=True).stdout.split())
    assert "end records are missing" not in shown and "own metrics files" in shown


def start_sweep(spec: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "sweep", str(spec), "--workers", "1..2:1",
                             "--window", "30s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def running_point(store_kinds=("point",)):
    points = [r for r in RunStore().list(kinds=store_kinds) if r.status == "running"]
    return points[0] if points else None


@pytest.mark.parametrize("how", ["kill -9 of the sweep, then down POINT", "down --all under a live sweep"])
def test_down_closes_a_sweeps_points_and_finds_a_point_by_its_id(home, tmp_path, how):
    sweep = start_sweep(job(tmp_path, steps=100000))
    try:
        point = wait_for(running_point, timeout=180, what="a point being measured")
        if how.startswith("kill -9"):
            sweep.kill()
            sweep.communicate(timeout=30)
            proc = dsctl("down", point.id, check=True)
            assert f"which run {point.id} was measured on" in proc.stdout
        else:
            dsctl("down", "--all", check=True)
            sweep.communicate(timeout=120)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.communicate()
    assert processes_under(home) == []
    store = RunStore()
    closed = store.get(point.id)
    assert closed.status == "interrupted" and "removed by dsctl down" in closed.error
    assert [r.id for r in store.list(kinds=("point",)) if r.status == "running"] == []
    assert store.get(point.parent_id).status in ("interrupted", "failed")
    assert dsctl("down", point.id, check=True).stdout.strip().endswith("nothing to take down (its record says "
                                                                       "interrupted)")
