"""End to end on this machine: real dispatcher, workers and trainers as processes, driven by the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dsctl.orchestrator.store import RunStore
from dsctl.provisioners import Deployment

from helpers import EXAMPLES, dsctl, processes_under, wait_for, write_spec

pytestmark = pytest.mark.slow


def synthetic_job(tmp_path, mode: str, workers: int = 2, elements: int = 512, latency_ms: float = 1, steps: int = 100000,
                  step_time_ms: float = 1):
    return write_spec(tmp_path, f"""
        name: e2e
        service: {{workers: {workers}, processing_mode: {mode}}}
        trainer: {{model: {{step_time_ms: {step_time_ms}}}, steps: {steps}, warmup_batches: 2}}
        pipeline: {{builtin: synthetic, params: {{elements: {elements}, shards: 16, batch_size: 16, latency_ms: {latency_ms}, epochs: 1}}}}
    """)


def received_ids(home, run_id) -> list[int]:
    ids = []
    for path in (home / "runs" / run_id / "metrics").glob("trainer-*.ids.json"):
        ids += json.loads(path.read_text())
    return ids


def test_quickstart_runs_records_and_leaves_nothing(home):
    proc = dsctl("up", EXAMPLES / "quickstart.yaml", "--json", check=True)
    record = json.loads(proc.stdout)
    assert record["status"] == "succeeded"
    assert record["summary"]["batches"] == 300
    assert record["summary"]["batches_per_s"] > 0
    assert record["summary"]["worker_cpu_cores"] >= 0
    listed = dsctl("runs", "--json", check=True)
    assert [r["id"] for r in json.loads(listed.stdout)] == [record["id"]]
    store = RunStore()
    assert store.windows(record["id"]), "per-window metrics are recorded"
    assert store.utilization(record["id"]), "utilization samples are recorded"
    assert Deployment.load(home / "runs" / record["id"]).status == "down"


@pytest.mark.parametrize("mode,copies", [("distributed_epoch", 1), ("parallel_epochs", 2)])
def test_trainer_receives_what_the_processing_mode_promises(home, tmp_path, mode, copies):
    """distributed_epoch: each element exactly once; parallel_epochs: each worker produces the whole dataset."""
    spec = synthetic_job(tmp_path, mode, workers=2, elements=512)
    record = json.loads(dsctl("up", spec, "--json", check=True).stdout)
    ids = received_ids(home, record["id"])
    assert sorted(ids) == sorted(list(range(512)) * copies)
    s = record["summary"]
    assert (s["elements_expected"], s["elements_lost"], s["elements_duplicated"]) == (512 * copies, 0, 0)


@pytest.mark.parametrize("mode", ["colocated", "ideal"])
def test_baselines_run_without_a_service(home, tmp_path, mode):
    spec = synthetic_job(tmp_path, "parallel_epochs", elements=2048, steps=100, step_time_ms=20)
    record = json.loads(dsctl("up", spec, "--mode", mode, "--json", check=True).stdout)
    assert record["mode"] == mode and record["workers"] == 0
    assert record["summary"]["batches"] == 100
    roles = {r["role"] for r in RunStore().utilization(record["id"])}
    assert roles == {"trainer"}


def test_killed_worker_is_restarted_and_losses_are_counted(home, tmp_path):
    spec = synthetic_job(tmp_path, "distributed_epoch", workers=2, elements=2048, latency_ms=4)
    up = subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", str(spec), "--json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = wait_for(lambda: next((home / "runs").glob("*"), None), what="run dir")

    def first_batches_seen():
        metrics = run_dir / "metrics" / "trainer-0.jsonl"
        return metrics.exists() and '"window"' in metrics.read_text()

    wait_for(first_batches_seen, timeout=120, what="training to start")
    victim = Deployment.load(run_dir).by_role("worker")[0]
    os.kill(victim.pid, signal.SIGKILL)
    out, err = up.communicate(timeout=240)
    assert up.returncode == 0, err
    record = json.loads(out)
    s = record["summary"]
    events = RunStore().events(record["id"])
    assert any(e["kind"] == "worker-restarted" for e in events)
    # At-most-once: what the dead worker had in flight (its current shards and buffers) may be lost,
    # nothing else; nothing arrives twice.
    assert s["elements_duplicated"] == 0
    assert 0 <= s["elements_lost"] <= 2048 // 16 * 2
    assert s["elements_received"] + s["elements_lost"] == 2048
    assert Deployment.load(run_dir).by_role("worker")[0].pid != victim.pid


def _kill_dispatcher_mid_run(home, spec):
    up = subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", str(spec), "--json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = _wait_training(home)
    victim = Deployment.load(run_dir).by_role("dispatcher")[0]
    os.kill(victim.pid, signal.SIGKILL)
    killed = time.monotonic()
    out, err = up.communicate(timeout=240)
    return up, out, err, run_dir, victim, time.monotonic() - killed


def test_killed_fault_tolerant_dispatcher_is_restarted_from_its_journal(home, tmp_path):
    spec = synthetic_job(tmp_path, "distributed_epoch", workers=2, elements=2048, latency_ms=4)
    up, out, err, run_dir, victim, _ = _kill_dispatcher_mid_run(home, spec)
    assert up.returncode == 0, err
    record = json.loads(out)
    s = record["summary"]
    events = [e for e in RunStore().events(record["id"]) if e["kind"] == "dispatcher-restarted"]
    assert len(events) == 1 and "journal" in events[0]["message"]
    assert s["elements_duplicated"] == 0
    assert 0 <= s["elements_lost"] <= 2048 // 16 * 2, "no more lost than was in flight"
    assert s["elements_received"] + s["elements_lost"] == 2048
    restarted = Deployment.load(run_dir).by_role("dispatcher")[0]
    assert restarted.pid != victim.pid and restarted.address == victim.address
    assert processes_under(home) == []


def test_killed_dispatcher_without_fault_tolerance_fails_the_job_at_once(home, tmp_path):
    spec = synthetic_job(tmp_path, "distributed_epoch", workers=2, elements=100000, latency_ms=4)
    spec.write_text(spec.read_text().replace("processing_mode: distributed_epoch", "processing_mode: distributed_epoch,"
                                             " fault_tolerant: false"))
    up, out, err, run_dir, _, exited_after_s = _kill_dispatcher_mid_run(home, spec)
    assert up.returncode == 1
    assert exited_after_s < 60, "fails promptly instead of waiting out the clients' 300 s timeout"
    flat = " ".join(err.split())
    assert "the dispatcher exited" in flat and "service.fault_tolerant: true" in flat
    assert "Traceback" not in err
    [record] = json.loads(dsctl("runs", "--json", check=True).stdout)
    assert record["status"] == "failed"
    assert processes_under(home) == []


def _start_long_run(tmp_path):
    spec = write_spec(tmp_path, """
        name: long
        service: {workers: 2}
        trainer: {model: {step_time_ms: 5}, duration_s: 600}
        pipeline: {builtin: synthetic, params: {latency_ms: 2, batch_size: 8, epochs: null}}
    """)
    return subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", str(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_training(home):
    def training():
        for m in (home / "runs").glob("*/metrics/trainer-0.jsonl"):
            if '"window"' in m.read_text():
                return m.parents[1]
        return None
    return wait_for(training, timeout=120, what="training to start")


def test_ctrl_c_stops_everything_and_records_the_run_as_interrupted(home, tmp_path):
    up = _start_long_run(tmp_path)
    run_dir = _wait_training(home)
    up.send_signal(signal.SIGINT)
    out, err = up.communicate(timeout=60)
    assert up.returncode == 130
    assert "Traceback" not in err
    assert processes_under(home) == []
    record = RunStore().get(run_dir.name)
    assert record.status == "interrupted"
    assert record.summary["batches"] > 0 and RunStore().windows(run_dir.name), "what was measured is kept"


def test_sigterm_tears_down_like_ctrl_c(home, tmp_path):
    up = _start_long_run(tmp_path)
    run_dir = _wait_training(home)
    up.terminate()
    up.communicate(timeout=60)
    assert processes_under(home) == []
    assert RunStore().get(run_dir.name).status == "interrupted"


def test_down_after_kill_9_of_up_removes_everything(home, tmp_path):
    up = _start_long_run(tmp_path)
    run_dir = _wait_training(home)
    up.kill()
    up.communicate(timeout=30)
    assert processes_under(home), "the deployment outlives a killed dsctl up"
    status = json.loads(dsctl("status", "--json", check=True).stdout)
    assert [s["run"] for s in status] == [run_dir.name]
    dsctl("down", run_dir.name, check=True)
    assert processes_under(home) == []
    assert RunStore().get(run_dir.name).status == "interrupted"
    assert json.loads(dsctl("status", "--json", check=True).stdout) == []


@pytest.mark.parametrize("garble", ["cut short", "not json", "empty"])
def test_down_finds_a_killed_run_whose_state_file_is_garbled(home, tmp_path, garble):
    up = _start_long_run(tmp_path)
    run_dir = _wait_training(home)
    up.kill()
    up.communicate(timeout=30)
    state = run_dir / "state.json"
    text = state.read_text()
    state.write_text({"cut short": text[: len(text) // 2], "not json": "\x00garbage{", "empty": ""}[garble])
    live = processes_under(home)
    assert live, "the deployment outlives a killed dsctl up"
    proc = dsctl("status", check=True)
    assert run_dir.name in proc.stdout and "cannot be read" in proc.stderr and "Traceback" not in proc.stderr
    proc = dsctl("down", "--all", check=True) if garble == "empty" else dsctl("down", run_dir.name, check=True)
    assert "found by command line" in proc.stdout and "Traceback" not in proc.stderr
    assert processes_under(home) == []
    assert RunStore().get(run_dir.name).status == "interrupted"
    assert dsctl("status", check=True).stdout.strip() == "nothing is up."


def test_detached_deployment_stays_up_until_down(home):
    proc = dsctl("up", EXAMPLES / "quickstart.yaml", "--detach", check=True)
    assert "started run" in proc.stdout

    def job_done():
        runs = RunStore().list()
        return runs and runs[0].status == "succeeded" and runs[0]
    record = wait_for(job_done, timeout=180, what="the detached job to finish")
    status = json.loads(dsctl("status", "--json", check=True).stdout)
    assert status and status[0]["run"] == record.id and status[0]["workers"] == 2
    assert status[0]["live_processes"] >= 3  # monitor, dispatcher, workers
    dsctl("down", check=True)
    assert processes_under(home) == []
