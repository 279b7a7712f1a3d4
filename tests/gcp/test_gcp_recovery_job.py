"""Long runs on the stand-in cloud that lose what a laptop or a Spot VM loses, and finish anyway.

- A worker VM stopped through the Compute Engine API mid-job (what a Spot preemption does): dsctl sees it
  stopped, starts it again (same internal address), restarts the worker at its port, and the job finishes
  with every element accounted for; the run is priced for the VM-seconds the worker was held.
- Three minutes without SSH to any VM (every sshd process stopped, as a laptop asleep or a dropped VPN looks
  from here): the run goes on, the outage is an event in the record, nothing the trainer measured meanwhile
  is lost, and the job finishes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace

import psutil
import pytest
from conftest import PROJECT, ZONE, gcp_spec

from dsctl.orchestrator.pricing import price_record
from dsctl.orchestrator.run import JobRunner
from dsctl.orchestrator.store import RunStore
from dsctl.provisioners import load_deployment
from dsctl.specs import load_spec
from helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.background]  # they mostly wait: beside the other tests

NOTHING = {"instances": 0, "firewalls": 0, "tpus": 0}
OUTAGE_S = float(os.environ.get("DSCTL_TEST_OUTAGE_S", "180"))  # the three minutes


def run_in_thread(spec, run_id: str) -> tuple[threading.Thread, dict]:
    """The runner lives in its thread: its run store's SQLite connection belongs to the thread that made it."""
    result: dict = {}

    def target():
        try:
            result["summary"] = JobRunner(load_spec(spec), run_id=run_id).run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            result["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def training(run_dir) -> bool:
    metrics = run_dir / "metrics" / "trainer-0.jsonl"
    return metrics.exists() and '"window"' in metrics.read_text()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_worker_vm_stopped_mid_job_is_started_again_and_the_job_finishes(cloud, sshd, home, tmp_path):
    from conftest import credentials_of
    from google.api_core.client_options import ClientOptions
    from google.cloud import compute_v1

    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=2, trainer_machine="n2-standard-8", epochs=1,
                    elements=4096, latency_ms=10)
    run_id = "worker-vm-stopped-0001"
    run_dir = home / "runs" / run_id
    thread, result = run_in_thread(spec, run_id)
    wait_for(lambda: training(run_dir), timeout=120, what="the trainer's first window")
    victim = load_deployment(run_dir).by_role("worker")[1]
    # As a preemption does: through the API, the VM stops; its processes and SSH sessions die with it.
    api = compute_v1.InstancesClient(credentials=credentials_of(cloud),
                                     client_options=ClientOptions(api_endpoint=cloud.endpoint))
    api.stop_unary(project=PROJECT, zone=ZONE, instance=victim.state.vm.name)
    wait_for(lambda: gone(victim.state.remote_pid), timeout=10, what="the stopped VM's worker to die")
    thread.join(timeout=300)
    assert not thread.is_alive(), "the run hangs"
    assert "error" not in result, result.get("error")
    store = RunStore()
    record = store.get(run_id)
    assert record.status == "succeeded", record.error
    kinds = [e["kind"] for e in store.events(run_id)]
    assert "vm-stopped" in kinds and kinds.index("worker-restarted") > kinds.index("vm-stopped")
    back = next(e["message"] for e in store.events(run_id) if e["kind"] == "worker-restarted")
    assert f"worker 1 is back at {victim.address}" in back, back
    s = result["summary"]
    assert s["elements_duplicated"] == 0 and s["elements_received"] + s["elements_lost"] == 4096
    assert 0 < s["worker_stopped_s"] < s["duration_s"]
    _, cost, _ = price_record(record, basis="vm-hours")
    assert any("not charged" in n for n in cost.notes)
    full = price_record(replace(record, summary={**s, "worker_stopped_s": 0}), basis="vm-hours")[1]
    assert cost.workers < full.workers, "the stopped VM-seconds are not charged"
    assert cloud.counts() == NOTHING


def sshd_processes(sshd) -> list[psutil.Process]:
    """Every process of the stand-in's SSH servers: the listeners and the sessions they serve."""
    out = []
    for proc in sshd.procs.values():
        root = psutil.Process(proc.pid)
        out += [root] + [c for c in root.children(recursive=True) if c.name().startswith("sshd")]
    return out


def test_three_minutes_without_ssh_are_an_event_not_a_failure(cloud, sshd, home, tmp_path):
    run_time = OUTAGE_S + 40
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=1, trainer_machine="n2-standard-8", epochs=None,
                    latency_ms=1, model="{step_time_ms: 20}", duration_s=run_time, gcp={"outage_limit_s": OUTAGE_S + 120})
    run_id = "ssh-outage-0001"
    run_dir = home / "runs" / run_id
    thread, result = run_in_thread(spec, run_id)
    wait_for(lambda: training(run_dir), timeout=120, what="the trainer's first window")
    stopped = sshd_processes(sshd)
    for p in stopped:
        p.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < OUTAGE_S:
            assert thread.is_alive(), f"the run ended during the outage: {result}"
            time.sleep(1.0)
    finally:
        for p in stopped:
            try:
                p.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                pass
    thread.join(timeout=run_time + 120)
    assert not thread.is_alive(), "the run hangs"
    assert "error" not in result, result.get("error")
    store = RunStore()
    record = store.get(run_id)
    assert record.status == "succeeded", record.error
    events = {e["kind"]: e["message"] for e in store.events(run_id)}
    assert "ssh-lost" in events and "ssh-back" in events, list(events)
    lasted = float(events["ssh-back"].split("outage of ")[1].split(" s")[0])
    assert OUTAGE_S - 30 <= lasted <= OUTAGE_S + 60, events["ssh-back"]
    # What the trainer measured while nobody could see it came home afterwards: its windows cover the run.
    windows = [w for w in store.windows(run_id) if w["trainer"] == 0]
    assert sum(w["batches"] for w in windows) == result["summary"]["batches"]
    gaps = [b["t_start"] - a["t_end"] for a, b in zip(windows, windows[1:])]
    assert max(gaps) < 5.0, "no window is missing from the outage"
    assert cloud.counts() == NOTHING
