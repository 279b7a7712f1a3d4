"""End to end on this machine: real dispatcher, workers and trainers as processes, driven by the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from dsctl.orchestrator.store import RunStore
from dsctl.provisioners import Deployment, load_deployment
from helpers import EXAMPLES, dsctl, processes_under, wait_for, write_spec

pytestmark = pytest.mark.slow


def synthetic_job(tmp_path, mode: str, workers: int = 2, elements: int = 512, latency_ms: float = 1, steps: int = 100000,
                  step_time_ms: float = 1):
    return write_spec(tmp_path, f"""
        name: e2e
        service: {{workers: {workers}, processing_mode: {mode}}}
        trainer: {{model: {{step_time_ms: {step_time_ms}}}, steps: {steps}, warmup_batches: 2}}
        pipeline: {{builtin: synthetic, params: {{elements: {elements}, shards: 16, batch_size: 16,
                                                latency_ms: {latency_ms}, epochs: 1}}}}
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
    assert load_deployment(home / "runs" / record["id"]).status == "down"


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
    victim = load_deployment(run_dir).by_role("worker")[0]
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
    assert load_deployment(run_dir).by_role("worker")[0].pid != victim.pid


def _kill_dispatcher_mid_run(home, spec):
    up = subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", str(spec), "--json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = _wait_training(home)
    victim = load_deployment(run_dir).by_role("dispatcher")[0]
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
    restarted = load_deployment(run_dir).by_role("dispatcher")[0]
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


# A CI script that follows the run's log in the background and calls `dsctl down`: a non-interactive shell puts the
# script, its `tail -f` and `dsctl down` in one process group, which names the run's folder on its tail's command line.
CALLER = """
tail -f "$RUN_DIR/logs/launcher.log" > /dev/null &
tail_pid=$!
"$PYTHON" -m dsctl.cli.main down "$RUN_ID"
echo "down exited $?"
kill -0 "$tail_pid" && echo "its tail survived"
kill "$tail_pid"
echo "the calling script survived"
"""


def test_down_of_a_killed_run_whose_state_file_is_garbled_stops_the_run_and_never_its_caller(home, tmp_path):
    """Garbled state (how each garbling is read: tests/test_down_safety.py): the deployment is rebuilt from its
    cgroup and the processes dsctl started for it; the calling script, its `tail -f` of the run's log and `dsctl down`
    itself are none of them, and survive; the run's cgroup is gone after."""
    from dsctl.provisioners import containment

    up = _start_long_run(tmp_path)
    run_dir = _wait_training(home)
    up.kill()
    up.communicate(timeout=30)
    state = run_dir / "state.json"
    text = state.read_text()
    state.write_text(text[: len(text) // 2])
    live = processes_under(home)
    assert live, "the deployment outlives a killed dsctl up"
    proc = dsctl("status", check=True)
    assert run_dir.name in proc.stdout and "cannot be read" in proc.stderr and "Traceback" not in proc.stderr
    # Its own session, as a CI job's shell: a stop of its group would not reach this test.
    script = subprocess.run(["sh", "-c", CALLER], capture_output=True, text=True, timeout=300, start_new_session=True,
                            env={**os.environ, "RUN_DIR": str(run_dir), "RUN_ID": run_dir.name,
                                 "PYTHON": sys.executable, "COLUMNS": "400"})
    assert "down exited 0" in script.stdout, script.stdout + script.stderr
    assert "its tail survived" in script.stdout and "the calling script survived" in script.stdout, script.stdout
    assert "rebuilt from its cgroup" in script.stdout and "Traceback" not in script.stderr, script.stdout
    assert "left alone: 1 process(es)" in script.stdout and "tail -f" in script.stdout, script.stdout
    assert processes_under(home) == []
    assert not [g for g in containment.leftover_cgroups() if run_dir.name in g.name], "the run's cgroup is removed"
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


def test_a_worker_whose_port_is_taken_waits_for_it_then_moves_and_the_job_goes_on(home, tmp_path, monkeypatch):
    """Issue 17 item 5. A dead worker's clients read the rest of its share from its address only, so a
    taken port is tried again (with backoff) for a bounded time; a port still taken then moves the
    worker to a new one. Real processes hold the ports, in the run's own network namespace."""
    import threading

    from dsctl.orchestrator.run import JobRunner
    from dsctl.provisioners.local import provider as local
    from dsctl.provisioners.local.processes import enter_namespaces_of
    from dsctl.specs import load_spec
    from helpers import hold_port

    monkeypatch.setattr(local, "WORKER_PORT_WAIT_S", 2.0)
    spec = write_spec(tmp_path, """
        name: taken
        service: {workers: 2}
        trainer: {model: {step_time_ms: 5}, duration_s: 600}
        pipeline: {builtin: synthetic, params: {latency_ms: 2, batch_size: 8, epochs: null}}
    """)
    outcome: dict = {}
    runners = []

    def run():  # in its own thread, with its own store (SQLite connections stay in their thread)
        try:
            runners.append(JobRunner(load_spec(spec)))
            runners[0].run()
            outcome["status"] = "returned"
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            outcome["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    holders = []
    try:
        wait_for(lambda: outcome or list(home.glob("runs/*/metrics/trainer-0.jsonl")), timeout=120, what="a trainer")
        assert not outcome, outcome
        run_dir = _wait_training(home)
        store = RunStore()

        def kinds():
            assert "error" not in outcome, f"the job failed: {outcome['error']}"
            return [e["kind"] for e in store.events(run_dir.name)]

        def kill_holding_its_port(index: int):
            victim = load_deployment(run_dir).by_role("worker")[index]
            holder = hold_port(victim.state.port, enter_namespaces_of(victim.pid))
            holders.append(holder)
            os.kill(victim.pid, signal.SIGKILL)
            return victim, holder

        # Held for a moment: the worker comes back at its own address once the port is free.
        first, holder = kill_holding_its_port(1)
        wait_for(lambda: "worker-port-taken" in kinds(), timeout=60, what="the restart to find the port taken")
        [taken] = [e["message"] for e in store.events(run_dir.name) if e["kind"] == "worker-port-taken"]
        assert f"pid {holder.pid}" in taken, "the event names the process holding the port"
        holder.stdin.close()
        holder.wait(timeout=10)
        wait_for(lambda: "worker-port-free" in kinds(), timeout=60, what="the worker to get its port back")
        back = load_deployment(run_dir).by_role("worker")[1]
        assert back.address == first.address and back.pid != first.pid and back.state.ready

        # Held for good: after the wait, the worker moves to a new port, registers there, and serves.
        second, _ = kill_holding_its_port(0)
        wait_for(lambda: "worker-moved" in kinds(), timeout=60, what="the worker to move")
        moved = load_deployment(run_dir).by_role("worker")[0]
        # Ready means registered: a WorkerServer starts only once the dispatcher has taken it.
        assert moved.address != second.address and moved.state.ready and moved.pid != second.pid
        assert thread.is_alive(), f"the job goes on: {outcome}"

        # A (fault-tolerant) dispatcher cannot move: it waits for its port, then comes back from its journal.
        dispatcher = load_deployment(run_dir).by_role("dispatcher")[0]
        holder = hold_port(dispatcher.state.port, enter_namespaces_of(dispatcher.pid))
        holders.append(holder)
        os.kill(dispatcher.pid, signal.SIGKILL)
        wait_for(lambda: "dispatcher-port-taken" in kinds(), timeout=60, what="the dispatcher to find its port taken")
        holder.stdin.close()
        wait_for(lambda: load_deployment(run_dir).by_role("dispatcher")[0].state.ready, timeout=60,
                 what="the dispatcher to come back")
        restarted = load_deployment(run_dir).by_role("dispatcher")[0]
        assert restarted.pid != dispatcher.pid and restarted.address == dispatcher.address

        metrics = run_dir / "metrics" / "trainer-0.jsonl"
        lines = len(metrics.read_text().splitlines())
        wait_for(lambda: len(metrics.read_text().splitlines()) > lines + 1, timeout=60, what="more windows from the trainer")
        # End the job early: the trainer stops on SIGTERM and reports, and the run does not take that for its end.
        os.kill(load_deployment(run_dir).by_role("trainer")[0].pid, signal.SIGTERM)
        thread.join(timeout=90)
    finally:
        for holder in holders:
            holder.kill()
            holder.wait(timeout=10)
        if thread.is_alive():  # a failed check: end the job, or take its deployment down
            for trainer in runners[0].deployment.by_role("trainer"):
                os.kill(trainer.pid, signal.SIGTERM)
            thread.join(timeout=60)
            if thread.is_alive():
                runners[0].provider.down(runners[0].deployment, lambda kind, message: None)
    assert "stopped by SIGTERM" in str(outcome.get("error")), outcome
    record = RunStore().get(run_dir.name)
    assert record.status == "failed" and "trainer 0 failed: it was stopped by SIGTERM" in record.error, record.error
    assert processes_under(home) == []


def test_a_new_worker_whose_port_is_taken_starts_at_another(home, monkeypatch):
    """No client knows a worker's address before it is first ready, so a port taken meanwhile is simply
    replaced. Outside a private network (DSCTL_LOCAL_ISOLATION=none) any process here can take it."""
    from dsctl.provisioners.local import provider as local
    from dsctl.specs import load_spec_text
    from helpers import hold_port

    monkeypatch.setenv("DSCTL_LOCAL_ISOLATION", "none")
    holder = hold_port(0, [])  # the kernel picks; the holder prints nothing else, so ask psutil which port
    port = next(c.laddr.port for c in psutil.Process(holder.pid).net_connections() if c.status == psutil.CONN_LISTEN)
    picks = iter([None, port])  # the dispatcher's port first, then the worker's: the held one
    real_pick = local.pick_service_port
    monkeypatch.setattr(local, "pick_service_port", lambda exclude=frozenset(): next(picks, None) or real_pick(exclude))
    spec = load_spec_text("name: fresh\nservice: {workers: 1}\ntrainer: {steps: 10}\npipeline: {builtin: synthetic}\n").spec
    run_dir = home / "runs" / "fresh"
    run_dir.mkdir(parents=True)
    dep = Deployment(run_id="fresh", provider="local", run_dir=str(run_dir))
    prov = local.LocalProvider()
    events = []
    try:
        prov.up(spec, dep, 1, lambda kind, message: events.append((kind, message)))
        prov.wait_ready(dep, lambda kind, message: events.append((kind, message)))
        [worker] = dep.by_role("worker")
        assert worker.state.ready and worker.state.port != port and worker.state.port_picks == 1
        assert "already in use" in (run_dir / "logs" / "worker-0.log").read_text()
        [warning] = [m for k, m in events if k == "not-isolated"]
        assert "DSCTL_LOCAL_ISOLATION=none" in warning and "reachable from this machine's network" in warning
    finally:
        prov.down(dep, lambda kind, message: None)
        holder.kill()
        holder.wait(timeout=10)
    assert processes_under(home) == []
