"""The control protocol between a sweep and a detached deployment's monitor, without TensorFlow.

Real files in a run dir and real processes as callers, monitors and sweeps: a request is acted on
only while its caller waits for it, a caller that gives up leaves nothing behind, a monitor that
is gone fails a call at once, and one sweep at a time holds a deployment.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from dsctl.orchestrator.control import ControlClient, ControlError, ControlServer, DeploymentBusy, SweepLock, control_dir
from dsctl.orchestrator.handles import AttachedDeployment, _AbandonedSweeps
from dsctl.orchestrator.outcome import RunFailed
from dsctl.provisioners import Deployment, Node, ProcessRef, load_deployment
from helpers import wait_for

CALLER = """
import sys
from dsctl.orchestrator.control import ControlClient, ControlError
try:
    print(ControlClient(sys.argv[1]).call("act", timeout_s=float(sys.argv[2])))
except ControlError as exc:
    print(exc)
    sys.exit(1)
"""

SWEEP = """
import sys, time
from dsctl.orchestrator.handles import AttachedDeployment
from dsctl.provisioners import load_deployment
AttachedDeployment.claim(load_deployment(sys.argv[1]), "sweep-killed")
print("held", flush=True)
time.sleep(600)
"""


class Monitor:
    """Handlers that record what they were asked, and a ControlServer over them (served by the test)."""

    def __init__(self, run_dir: Path, **handlers):
        self.acted: list[tuple[str, dict]] = []
        self.events: list[tuple[str, str]] = []
        ops = {"act": lambda **args: {"done": True}, **handlers}
        self.server = ControlServer(run_dir, {op: self._recorded(op, fn) for op, fn in ops.items()},
                                    lambda kind, message: self.events.append((kind, message)))

    def _recorded(self, op, fn):
        def handler(**args):
            self.acted.append((op, args))
            return fn(**args)
        return handler

    @contextmanager
    def serving(self):
        """Serve in a thread until the `with` ends."""
        stop = threading.Event()

        def loop():
            while not stop.is_set():
                self.server.serve_pending()
                time.sleep(0.02)
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def files(run_dir: Path) -> set[str]:
    return {p.name for p in control_dir(run_dir).iterdir()} if control_dir(run_dir).exists() else set()


def requests_left(run_dir: Path) -> set[str]:
    return {name for name in files(run_dir) if name.endswith((".req", ".taken", ".resp"))}


def caller(run_dir: Path, timeout_s: float) -> subprocess.Popen:
    """A dsctl process asking the monitor to act; returns once its request is in the control dir."""
    proc = subprocess.Popen([sys.executable, "-c", CALLER, str(run_dir), str(timeout_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any(n.endswith(".req") for n in files(run_dir)), timeout=30, what="the caller's request")
    return proc


@pytest.fixture
def run_dir(tmp_path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    return d


@pytest.fixture
def sleeper():
    """A live process to stand for a monitor; killed at the end."""
    procs = []

    def start() -> subprocess.Popen:
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
        return procs[-1]
    yield start
    for p in procs:
        p.kill()
        p.wait()


def who(proc: subprocess.Popen) -> dict:
    return {"pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time()}


# -- requests ------------------------------------------------------------------------------------------------------

def test_a_request_is_answered_and_leaves_no_file(run_dir):
    monitor = Monitor(run_dir, fail=lambda: 1 / 0)
    with monitor.serving():
        assert ControlClient(run_dir).call("act", x=1) == {"done": True}
        with pytest.raises(ControlError) as exc:
            ControlClient(run_dir).call("fail")
    assert monitor.acted == [("act", {"x": 1}), ("fail", {})]
    assert isinstance(exc.value, RunFailed) and "could not 'fail': ZeroDivisionError" in str(exc.value)
    assert requests_left(run_dir) == set()


def test_a_request_not_taken_in_time_is_withdrawn_and_never_acted_on(run_dir):
    t0 = time.monotonic()
    with pytest.raises(ControlError, match="did not take the request 'act' within 0.5 s, so it is never acted on"):
        ControlClient(run_dir).call("act", timeout_s=0.5)
    assert time.monotonic() - t0 < 5
    assert requests_left(run_dir) == set(), "the caller withdrew its request"
    monitor = Monitor(run_dir)  # the monitor starts serving only now, as one whose job has just ended
    monitor.server.serve_pending()
    assert monitor.acted == []


@pytest.mark.integration  # child processes stand in for the monitor or the caller
def test_the_monitor_drops_a_request_whose_caller_stopped_waiting(run_dir):
    """A caller that cannot withdraw in time (stopped here; a hung or swapped-out process) is not acted on later."""
    proc = caller(run_dir, timeout_s=1.0)
    proc.send_signal(signal.SIGSTOP)
    time.sleep(1.5)
    monitor = Monitor(run_dir)
    monitor.server.serve_pending()
    assert monitor.acted == []
    assert [kind for kind, _ in monitor.events] == ["request-expired"]
    assert "stopped waiting" in monitor.events[0][1]
    assert requests_left(run_dir) == set()
    proc.send_signal(signal.SIGCONT)  # it finds its request claimed and dropped: an error, not a wait
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "did not take the request 'act' within 1 s" in out


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
@pytest.mark.integration  # child processes stand in for the monitor or the caller
def test_a_request_whose_caller_has_exited_is_never_acted_on(run_dir, sig):
    """Ctrl-C withdraws the request on the way out; SIGKILL cannot, and the monitor sees the caller gone."""
    proc = caller(run_dir, timeout_s=60)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    if sig == signal.SIGINT:
        assert requests_left(run_dir) == set()
    monitor = Monitor(run_dir)
    monitor.server.serve_pending()
    assert monitor.acted == []
    if sig == signal.SIGKILL:
        assert [kind for kind, _ in monitor.events] == ["request-expired"]
        assert f"caller (pid {proc.pid}) has exited" in monitor.events[0][1]
    assert requests_left(run_dir) == set()


def test_a_request_taken_in_time_is_answered_after_its_timeout(run_dir):
    """The monitor claimed it before the deadline, so it acts and the caller waits for that answer."""
    monitor = Monitor(run_dir, slow=lambda: time.sleep(1.0) or {"slept": 1})
    with monitor.serving():
        assert ControlClient(run_dir).call("slow", timeout_s=0.3, answer_s=10) == {"slept": 1}
    assert monitor.acted == [("slow", {})]
    assert requests_left(run_dir) == set()


@pytest.mark.integration  # child processes stand in for the monitor or the caller
def test_a_monitor_that_has_exited_fails_the_call_at_once(run_dir, sleeper):
    proc = sleeper()
    gone = who(proc)
    proc.kill()
    proc.wait()
    t0 = time.monotonic()
    with pytest.raises(ControlError, match=rf"monitor \(pid {gone['pid']}\) has exited"):
        ControlClient(run_dir, monitor=gone).call("act", timeout_s=30)
    assert time.monotonic() - t0 < 5
    assert requests_left(run_dir) == set()


@pytest.mark.integration  # child processes stand in for the monitor or the caller
def test_an_answer_nobody_reads_is_discarded_once_its_caller_would_have_stopped_waiting(run_dir):
    monitor = Monitor(run_dir)
    proc = caller(run_dir, timeout_s=1.0)
    proc.send_signal(signal.SIGSTOP)  # claimed in time, answered, never read
    monitor.server.serve_pending()
    assert monitor.acted == [("act", {})] and any(n.endswith(".resp") for n in files(run_dir))
    proc.kill()
    proc.wait()
    time.sleep(2.1)  # its deadline (1 s) and the time it would have waited for the answer (1 s more)
    monitor.server.serve_pending()
    assert requests_left(run_dir) == set()


# -- claiming a deployment for a sweep ------------------------------------------------------------------------------

def deployment(run_dir: Path, monitor: dict, *, trainers: int = 0, workers: int = 1) -> Deployment:
    nodes = [Node(role="worker", index=i) for i in range(workers)]
    nodes += [Node(role="trainer", index=i) for i in range(trainers)]
    dep = Deployment(run_id="job-1", provider="local", run_dir=str(run_dir), status="up", nodes=nodes,
                     monitor=ProcessRef(pid=monitor["pid"], create_time=monitor["create_time"]))
    dep.save()
    return dep


def busy(dep: Deployment) -> str:
    t0 = time.monotonic()
    with pytest.raises(DeploymentBusy) as exc:
        AttachedDeployment.claim(dep, "sweep-2")
    assert time.monotonic() - t0 < 2, "refused at once"
    msg = str(exc.value)
    assert isinstance(exc.value, RunFailed) and "\n" not in msg and msg.endswith("Nothing was started.")
    return msg


@pytest.mark.integration  # child processes stand in for the monitor or the caller
def test_claim_refuses_at_once_while_the_job_trains_and_asks_nothing(run_dir, sleeper):
    dep = deployment(run_dir, who(sleeper()), trainers=1)
    msg = busy(dep)
    assert "run job-1 is still running its own job" in msg and "dsctl logs job-1 --follow" in msg
    assert files(run_dir) == set()


@pytest.mark.integration  # child processes stand in for the monitor or the caller
def test_claim_refuses_a_deployment_whose_monitor_is_gone(run_dir, sleeper):
    proc = sleeper()
    dep = deployment(run_dir, who(proc))
    proc.kill()
    proc.wait()
    assert "the monitor of run job-1" in busy(dep) and "`dsctl down job-1`" in busy(dep)


@pytest.mark.integration  # child processes stand in for the monitor or the caller
def test_claim_gives_a_monitor_whose_job_just_ended_a_moment_to_start_serving(run_dir, sleeper):
    dep = deployment(run_dir, who(sleeper()))  # up, no trainers: the job has ended, serving comes next
    later = threading.Timer(0.5, lambda: Monitor(run_dir))
    later.start()
    held = AttachedDeployment.claim(dep, "sweep-1")
    held.lock.release()
    later.join()


@pytest.mark.integration  # child processes stand in for the monitor or the caller
def test_one_sweep_at_a_time_and_a_release_puts_the_deployment_back(run_dir, sleeper):
    dep = deployment(run_dir, who(sleeper()), workers=1)
    monitor = Monitor(run_dir, stop_trainers=lambda: {}, scale=lambda workers: {"workers": workers})
    first = AttachedDeployment.claim(dep, "sweep-1")
    msg = busy(dep)
    assert f"sweep sweep-1 (pid {os.getpid()}) is using run job-1's deployment" in msg
    dataclasses.replace(dep, nodes=dep.nodes + [Node(role="worker", index=1)]).save()  # the sweep scaled it to 2
    with monitor.serving():
        first.release(lambda kind, message: None)
    assert [op for op, _ in monitor.acted] == ["stop_trainers", "scale"] and monitor.acted[1][1] == {"workers": 1}
    assert "sweep.json" not in files(run_dir)
    AttachedDeployment.claim(dep, "sweep-2").lock.release()


@pytest.mark.integration  # child processes stand in for the monitor or the caller
def test_a_sweep_that_cannot_put_the_deployment_back_leaves_that_to_the_monitor(run_dir, sleeper):
    monitor_proc = sleeper()
    dep = deployment(run_dir, who(monitor_proc))
    Monitor(run_dir)  # serving, then gone (`dsctl down`) before the sweep puts the deployment back
    held = AttachedDeployment.claim(dep, "sweep-1")
    monitor_proc.kill()
    monitor_proc.wait()
    with pytest.raises(ControlError, match="has exited"):
        held.release(lambda kind, message: None)
    assert "sweep.json" in files(run_dir), "left for the monitor to put the deployment back"
    lock = SweepLock(run_dir)
    assert lock.take(), "and the lock is free"
    lock.release(put_back=False)


class FakeHandle:
    """The monitor's own deployment, as _AbandonedSweeps acts on it (the provider is tested elsewhere)."""

    def __init__(self, run_dir: Path, workers: int):
        self.dep, self.workers, self.calls = load_deployment(run_dir), workers, []

    def stop_trainers(self):
        self.calls.append("stop_trainers")

    def scale(self, workers, events):
        self.calls.append(f"scale {workers}")
        self.workers = workers


@pytest.mark.integration  # child processes stand in for the monitor or the caller
def test_the_monitor_puts_back_a_deployment_whose_sweep_died_holding_it(run_dir, sleeper, monkeypatch):
    monkeypatch.setattr("dsctl.orchestrator.handles.ABANDONED_CHECK_S", 0.0)
    dep = deployment(run_dir, who(sleeper()), workers=1)
    Monitor(run_dir)  # serving
    sweep = subprocess.Popen([sys.executable, "-c", SWEEP, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert sweep.stdout.readline().strip() == "held"
    handle, events = FakeHandle(run_dir, workers=3), []  # the sweep had scaled it to 3 when it was killed
    restore = _AbandonedSweeps(handle, lambda kind, message: events.append((kind, message)))
    restore.check()
    assert handle.calls == [] and "sweep sweep-killed" in busy(dep), "a live sweep is left alone"
    sweep.kill()
    sweep.wait()
    msg = busy(dep)
    assert "sweep sweep-killed" in msg and "exited without putting" in msg
    restore.check()
    assert handle.calls == ["stop_trainers", "scale 1"]
    assert [kind for kind, _ in events] == ["sweep-abandoned"]
    assert "sweep.json" not in files(run_dir)
    AttachedDeployment.claim(dep, "sweep-3").lock.release()

