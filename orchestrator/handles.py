"""A running deployment as the sweep sees it: one this process owns, or a detached one it borrows.

Both offer the same few verbs, so a sweep measures a deployment it started
itself and one that `dsctl up --detach` left running with the same code.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from dsctl.provisioners import Deployment, Provisioner, TrainerLaunch, TrainerState
from dsctl.provisioners.contract import EventSink
from dsctl.runtime.sampler import Sample

from .control import ControlClient, ControlServer


class OwnedDeployment:
    """Started by this process; released by taking it down."""

    def __init__(self, provisioner: Provisioner, dep: Deployment):
        self.provisioner, self.dep = provisioner, dep

    @property
    def workers(self) -> int:
        return len(self.dep.by_role("worker"))

    def scale(self, workers: int, events: EventSink) -> None:
        self.provisioner.scale_workers(self.dep, workers, events)

    def start_trainers(self, launch: TrainerLaunch, events: EventSink) -> dict[int, str]:
        self.provisioner.start_trainers(self.dep, launch, events)
        return {n.index: n.extra["metrics"] for n in self.dep.by_role("trainer")}

    def poll(self, events: EventSink) -> TrainerState:
        return self.provisioner.poll(self.dep, events)

    def sample(self) -> list[Sample]:
        return self.provisioner.sample(self.dep)

    def stop_trainers(self) -> None:
        self.provisioner.stop_trainers(self.dep)
        self.dep.nodes = [n for n in self.dep.nodes if n.role != "trainer"]
        self.dep.save()

    def release(self, events: EventSink) -> None:
        self.provisioner.down(self.dep, events)


class AttachedDeployment:
    """Left running by `dsctl up --detach`; its monitor process acts for us. Released as found."""

    def __init__(self, dep: Deployment):
        self.dep = dep
        self.client = ControlClient(dep.run_dir)
        self.original_workers = len(dep.by_role("worker"))

    @property
    def workers(self) -> int:
        return len(Deployment.load(self.dep.run_dir).by_role("worker"))

    def scale(self, workers: int, events: EventSink) -> None:
        self.client.call("scale", workers=workers)
        events("scaled", f"{workers} worker(s) ready")

    def start_trainers(self, launch: TrainerLaunch, events: EventSink) -> dict[int, str]:
        args = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(launch).items()}
        metrics = self.client.call("start_trainers", launch=args)["metrics"]
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
        self.stop_trainers()
        self.client.call("scale", workers=self.original_workers)


def serve_control(provisioner: Provisioner, dep: Deployment, events: EventSink) -> ControlServer:
    """The monitor's side of AttachedDeployment."""
    handle = OwnedDeployment(provisioner, dep)

    def start_trainers(launch: dict) -> dict:
        paths = {k: Path(launch[k]) for k in ("spec_json", "metrics_dir", "base_dir", "cache_dir")}
        metrics = handle.start_trainers(TrainerLaunch(**{**launch, **paths}), events)
        return {"metrics": metrics}

    def poll() -> dict:
        return asdict(handle.poll(events))

    handlers = {
        "scale": lambda workers: (handle.scale(workers, events), {"workers": workers})[1],
        "start_trainers": start_trainers,
        "poll": poll,
        "sample": lambda: {"samples": [asdict(s) for s in handle.sample()]},
        "stop_trainers": lambda: (handle.stop_trainers(), {})[1],
    }
    return ControlServer(dep.run_dir, handlers)
