"""The provisioner contract: one small interface, one implementation per place to run.

A Deployment is plain data saved to the run's state file after every change,
so `dsctl down` in a new process (even after `kill -9` of `dsctl up`) can find
and remove everything that was started.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from dsctl.runtime.sampler import Sample
from dsctl.specs.schema import JobSpec

STATE_FILE = "state.json"

EventSink = Callable[[str, str], None]  # (kind, message), e.g. ("worker-restarted", "worker 1 ...")


@dataclass
class Node:
    role: str  # "dispatcher" | "worker" | "trainer"
    index: int
    address: str | None = None  # host:port for servers
    pid: int | None = None
    pgid: int | None = None
    create_time: float | None = None  # with pid, identifies the process even if the pid is reused
    log: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class Deployment:
    run_id: str
    provider: str
    run_dir: str
    status: str = "starting"  # starting | up | down
    dispatcher_address: str | None = None
    nodes: list[Node] = field(default_factory=list)
    labels: dict = field(default_factory=dict)

    def by_role(self, role: str) -> list[Node]:
        return sorted((n for n in self.nodes if n.role == role), key=lambda n: n.index)

    def save(self) -> None:
        path = Path(self.run_dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, run_dir: str | Path) -> "Deployment":
        data = json.loads((Path(run_dir) / STATE_FILE).read_text())
        nodes = [Node(**n) for n in data.pop("nodes")]
        return cls(nodes=nodes, **data)


@dataclass
class TrainerLaunch:
    """What to run on the trainer machines for one measurement."""

    mode: str  # service | colocated | ideal
    spec_json: Path
    metrics_dir: Path
    base_dir: Path
    cache_dir: Path
    count: int
    steps: int | None = None
    duration_s: float | None = None
    record_ids: bool = False
    repeat: bool = False  # repeat a finite pipeline: steady-state measurements must not run out of data
    window_s: float | None = None  # metrics window override (sweeps align measurements to short windows)
    record_steps: bool = False  # per-batch timings and token counts, for modelling synchronous training
    cpus: list[int] | None = None  # pin trainer processes to these cores (local provider)
    accelerator: str = "none"  # none | gpu | tpu: what the trainer machine has, for the keras model's strategy
    accelerators: int = 0  # how many (GPUs, TPU devices) per trainer machine
    # keras models: the run's checkpoint folder, and the one of the run it resumes (a local path or gs://);
    # each trainer is given its own folder below them (trainer_checkpoint_dir).
    checkpoint_dir: str | None = None  # save checkpoints below here
    restore_from: str | None = None  # restore each trainer's latest checkpoint from below here first
    command: bool = False  # the trainers run the spec's trainer.command (runtime/command.py), not dsctl's harness

    @property
    def module(self) -> str:
        """What each trainer runs: `python -m <module> <harness_args>`."""
        return "dsctl.runtime.command" if self.command else "dsctl.runtime.trainer"

    @staticmethod
    def trainer_checkpoint_dir(base: str, index: int) -> str:
        """Trainer `index`'s own folder below a run's checkpoint folder: trainers never share checkpoints."""
        return f"{base.rstrip('/')}/trainer-{index}"

    def harness_args(self, index: int, *, spec: str, metrics: str, cache_dir: str, base_dir: str,
                     dispatcher: str | None) -> list[str]:
        """`python -m <module>` arguments (runtime/trainer_args.py), with paths as the trainer's machine sees them."""
        args = ["--spec", spec, "--mode", self.mode, "--index", str(index), "--metrics", metrics,
                "--cache-dir", cache_dir, "--base-dir", base_dir]
        if self.mode == "service":
            args += ["--dispatcher", str(dispatcher)]
        if self.steps is not None:
            args += ["--steps", str(self.steps)]
        if self.duration_s is not None:
            args += ["--duration-s", str(self.duration_s)]
        if self.repeat:
            args.append("--repeat")
        if self.window_s:
            args += ["--window-s", str(self.window_s)]
        if self.accelerator != "none":
            args += ["--accelerator", self.accelerator, "--accelerators", str(self.accelerators)]
        if self.checkpoint_dir:
            args += ["--checkpoint-dir", self.trainer_checkpoint_dir(self.checkpoint_dir, index)]
        if self.restore_from:
            args += ["--restore-from", self.trainer_checkpoint_dir(self.restore_from, index)]
        return args


@dataclass
class TrainerState:
    running: list[int]
    exit_codes: dict[int, int]
    blind: bool = False  # the trainers cannot be seen right now (an SSH outage): no progress is not a stall
    stopped_s: dict[str, float] = field(default_factory=dict)  # role -> VM-seconds its VMs spent stopped so far


class Provisioner(Protocol):
    name: str

    def check(self, spec: JobSpec, workers: int) -> None:
        """Refuse (SpecError) what this place cannot run, before anything starts."""

    def up(self, spec: JobSpec, dep: Deployment, workers: int, events: EventSink) -> None:
        """Create the machines and start the dispatcher and `workers` workers (dispatcher_address is known after)."""

    def wait_ready(self, dep: Deployment, events: EventSink) -> None:
        """Return when the dispatcher and every worker serve."""

    def scale_workers(self, dep: Deployment, workers: int, events: EventSink) -> None: ...

    def start_trainers(self, dep: Deployment, launch: TrainerLaunch, events: EventSink) -> None: ...

    def poll(self, dep: Deployment, events: EventSink) -> TrainerState:
        """Supervise (restart dead workers) and report the trainers' state."""

    def sample(self, dep: Deployment) -> list[Sample]: ...

    def stop_trainers(self, dep: Deployment) -> None: ...

    def down(self, dep: Deployment, events: EventSink) -> None:
        """Remove everything the deployment holds; safe to call twice and from a new process."""
