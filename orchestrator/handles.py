"""A running deployment as the sweep sees it: one this process owns, or a detached one it borrows.

Both offer the same few verbs, so a sweep measures a deployment it started
itself and one that `dsctl up --detach` left running with the same code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from dsctl.provisioners import Deployment, EventSink, Provider, TrainerLaunch, TrainerState, load_deployment
from dsctl.runtime.sampler import Sample

from .control import ControlClient, ControlServer, DeploymentBusy, SweepLock, process_alive, serving
from .supervision import Supervisor
from .tail import trainer_metrics

STARTS_S = 300.0  # how long the monitor may act on what starts processes (workers, trainers) once it took it
SERVING_GRACE_S = 10.0  # between its job's end and serving requests, a monitor records the run
ABANDONED_CHECK_S = 1.0


class OwnedDeployment:
    """Started by this process; released by taking it down. Its servers are supervised as a job's are."""

    def __init__(self, provider: Provider, dep: Deployment, supervisor: Supervisor):
        self.provider, self.dep, self.supervisor = provider, dep, supervisor

    @property
    def workers(self) -> int:
        return len(self.dep.by_role("worker"))

    def scale(self, workers: int, events: EventSink) -> None:
        self.provider.scale_workers(self.dep, workers, events)

    def start_trainers(self, launch: TrainerLaunch, events: EventSink) -> dict[int, str]:
        self.provider.start_trainers(self.dep, launch, events)
        return trainer_metrics(self.dep)

    def poll(self, events: EventSink) -> TrainerState:
        return self.supervisor.poll()

    def sample(self) -> list[Sample]:
        return self.provider.sample(self.dep)

    def stop_trainers(self) -> None:
        self.provider.stop_trainers(self.dep)
        self.dep.nodes = [n for n in self.dep.nodes if n.role != "trainer"]
        self.dep.save()

    def release(self, events: EventSink) -> None:
        try:
            self.provider.down(self.dep, events)
        except KeyboardInterrupt:  # a second Ctrl-C (or SIGTERM, SIGHUP) while tearing down: finish it, then stop
            self.provider.down(self.dep, events)
            raise


class AttachedDeployment:
    """Left running by `dsctl up --detach`; its monitor process acts for us. Released as found.

    Made by claim(), which refuses at once a deployment that cannot take a sweep now."""

    def __init__(self, dep: Deployment, monitor: dict, lock: SweepLock):
        self.dep, self.lock = dep, lock
        self.client = ControlClient(dep.run_dir, monitor=monitor)
        self.original_workers = len(dep.by_role("worker"))

    @classmethod
    def claim(cls, dep: Deployment, sweep_id: str) -> AttachedDeployment:
        """The deployment, held for this sweep alone until release(). DeploymentBusy (exit 1) if its monitor is
        gone, its own job has not ended, or another sweep holds it; nothing is asked of the monitor before."""
        run, log = dep.run_id, Path(dep.run_dir) / "up.log"
        monitor = {"pid": dep.monitor.pid, "create_time": dep.monitor.create_time} if dep.monitor else None
        if not process_alive(monitor):
            raise DeploymentBusy(f"the monitor of run {run}, which acts on its deployment for sweeps, is no longer "
                                 f"running (see {log}), so nothing can scale it; `dsctl down {run}` removes what is "
                                 "left. Nothing was started.")
        if not _serving(dep):
            raise DeploymentBusy(f"run {run} is still running its own job: `dsctl up --detach` runs the job first "
                                 "and takes sweeps only once it has ended, so a sweep now would measure beside it. Wait "
                                 f"for it to end (`dsctl logs {run} --follow` returns then), then sweep again. Nothing "
                                 "was started.")
        lock = SweepLock(dep.run_dir)
        if not lock.take():
            raise DeploymentBusy(f"{_who(lock.holder)} is using run {run}'s deployment; one sweep at a time, since each "
                                 "scales the workers and measures with them. Wait for it to end (or stop it with "
                                 "Ctrl-C), then sweep again. Nothing was started.")
        left = lock.holder
        if left is not None:  # the lock is free: its holder exited
            lock.release(put_back=False)
            raise DeploymentBusy(f"{_who(left)} exited without putting run {run}'s deployment back; its monitor "
                                 "does that within seconds. Sweep again then. Nothing was started.")
        lock.hold({"sweep": sweep_id, "original_workers": len(dep.by_role("worker"))})
        return cls(dep, monitor, lock)

    @property
    def workers(self) -> int:
        return len(load_deployment(self.dep.run_dir).by_role("worker"))

    def scale(self, workers: int, events: EventSink) -> None:
        self.client.call("scale", answer_s=STARTS_S, workers=workers)
        events("scaled", f"{workers} worker(s) ready")

    def start_trainers(self, launch: TrainerLaunch, events: EventSink) -> dict[int, str]:
        args = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(launch).items()}
        metrics = self.client.call("start_trainers", answer_s=STARTS_S, launch=args)["metrics"]
        events("training", f"{launch.count} trainer(s) started ({launch.mode})")
        return {int(k): v for k, v in metrics.items()}

    def poll(self, events: EventSink) -> TrainerState:
        state = self.client.call("poll")
        return TrainerState(running=state["running"], exit_codes={int(k): v for k, v in state["exit_codes"].items()})

    def sample(self) -> list[Sample]:
        return [Sample(**s) for s in self.client.call("sample")["samples"]]

    def stop_trainers(self) -> None:
        self.client.call("stop_trainers")

    def release(self, events: EventSink) -> None:
        """Back as found (no trainers, the worker count it had), then free for the next sweep. If that fails
        (a second Ctrl-C, the monitor gone), the monitor puts it back once this process has exited."""
        put_back = False
        try:
            self.stop_trainers()
            if self.workers != self.original_workers:
                self.scale(self.original_workers, events)
            put_back = True
        finally:
            self.lock.release(put_back=put_back)


def _serving(dep: Deployment) -> bool:
    """Whether its monitor serves requests. One whose job has just ended (up, no trainers left in its state)
    is given a few seconds to start, so a sweep right after `dsctl logs RUN --follow` is not refused."""
    deadline = time.monotonic() + SERVING_GRACE_S
    while not serving(dep.run_dir):
        state = load_deployment(dep.run_dir)
        if state.status != "up" or state.by_role("trainer") or time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _who(holder: dict | None) -> str:
    holder = holder or {}
    if holder.get("restoring"):
        return f"the deployment's monitor, putting it back after sweep {holder.get('sweep')},"
    return f"sweep {holder['sweep']} (pid {holder.get('pid')})" if holder.get("sweep") else "another sweep"


def serve_control(provider: Provider, supervisor: Supervisor, dep: Deployment, events: EventSink) -> ControlServer:
    """The monitor's side of AttachedDeployment; from now on its sweeps are served (control/serving.json)."""
    handle = OwnedDeployment(provider, dep, supervisor)

    def start_trainers(launch: dict) -> dict:
        paths = {k: Path(launch[k]) for k in ("spec_json", "metrics_dir", "base_dir", "cache_dir")}
        metrics = handle.start_trainers(TrainerLaunch(**{**launch, **paths}), events)
        return {"metrics": metrics}

    def poll() -> dict:
        return asdict(handle.poll(events))

    def scale(workers: int) -> dict:
        handle.scale(workers, events)
        return {"workers": workers}

    def stop_trainers() -> dict:
        handle.stop_trainers()
        return {}

    handlers: dict[str, Callable[..., dict]] = {
        "scale": scale,
        "start_trainers": start_trainers,
        "poll": poll,
        "sample": lambda: {"samples": [asdict(s) for s in handle.sample()]},
        "stop_trainers": stop_trainers,
    }
    return ControlServer(dep.run_dir, handlers, events, housekeeping=_AbandonedSweeps(handle, events).check)


class _AbandonedSweeps:
    """A sweep that exited holding the deployment (SIGKILL, a crash, a second Ctrl-C) did not put it back as
    found: the monitor does, so its trainers do not run on and its workers do not skew the next sweep."""

    def __init__(self, handle: OwnedDeployment, events: EventSink):
        self.handle, self.events = handle, events
        self.lock = SweepLock(handle.dep.run_dir)
        self.last = 0.0

    def check(self) -> None:
        if time.monotonic() - self.last < ABANDONED_CHECK_S:
            return
        self.last = time.monotonic()
        if self.lock.holder is None or not self.lock.take():
            return  # no sweep, or one that is alive
        holder = self.lock.holder  # read again under the lock: a sweep that released it meanwhile left none
        try:
            if holder is None:
                return
            self.lock.hold({**holder, "restoring": True})
            self.handle.stop_trainers()
            workers = holder.get("original_workers")
            if isinstance(workers, int) and workers >= 1 and workers != self.handle.workers:
                self.handle.scale(workers, self.events)
            self.events("sweep-abandoned", f"sweep {holder.get('sweep')} exited without putting the deployment back; "
                                           f"its trainers were stopped and {self.handle.workers} worker(s) remain")
        finally:
            self.lock.release()
