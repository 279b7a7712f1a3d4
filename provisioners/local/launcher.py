"""Talking to runtime/launcher.py: one TensorFlow import per deployment, a fork per process.

Requests and answers are files in the run dir, so `dsctl down` in a new
process can still find every child the launcher forked (its pid files), and
tell them from unrelated processes: a fork has the launcher's command line,
which names this run's launcher directory, and leads a session of its own.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from dsctl.runtime.readiness import read_json, write_json_atomic

from ..containment import Cgroup
from ..processes import run_processes
from ..state import Node, ProcessRef, from_dict
from .processes import spawn
from .state import Isolation, LocalNode

LAUNCHER_READY_TIMEOUT_S = 120.0


def _state(node: Node) -> LocalNode:
    assert isinstance(node.state, LocalNode)
    return node.state


class Launcher:
    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir) / "launcher"

    def start(self, log: Path, isolate: bool = False, cgroup: Cgroup | None = None) -> ProcessRef:
        """Start the launcher; with `isolate`, in a network namespace of its own (see isolation()); in `cgroup`, so
        that everything it forks, and all they start, is in the run's cgroup."""
        self.dir.mkdir(parents=True, exist_ok=True)
        ref = ProcessRef()
        spawn(ref, ["dsctl.runtime.launcher", "--requests", str(self.dir), *(["--isolate-network"] if isolate else [])],
              log, cgroup=cgroup)
        return ref

    def isolation(self) -> Isolation | None:
        """What the launcher said about its network (runtime/launcher.py: isolation.json); None until it has said."""
        answer = read_json(self.dir / "isolation.json")
        return from_dict(Isolation, answer) if answer else None

    def request(self, node: Node, module: str, argv: list[str], log: Path, cpus: list[int] | None = None) -> None:
        """Ask for a fork; node.pid is filled in later by resolve()."""
        launch_id = f"{node.role}-{node.index}-{time.monotonic_ns()}"
        node.pid = node.pgid = node.create_time = None
        node.log = str(log)
        _state(node).launch_id = launch_id
        log.parent.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{launch_id}.req"
        write_json_atomic(path.with_suffix(".tmpreq"), {"id": launch_id, "module": module, "argv": argv, "log": str(log),
                                                   "cpus": cpus})
        path.with_suffix(".tmpreq").rename(path)

    def resolve(self, node: Node) -> bool:
        """Fill in the pid of a requested process once the launcher has forked it."""
        if node.pid:
            return True
        answer = read_json(self.dir / f"{_state(node).launch_id}.pid")
        if not answer:
            return False
        node.pid = node.pgid = answer["pid"]
        try:
            node.create_time = psutil.Process(node.pid).create_time()
        except psutil.NoSuchProcess:
            node.create_time = None
        return True

    def exit_code(self, node: Node) -> int | None:
        answer = read_json(self.dir / f"exit-{node.pid}.json") if node.pid else None
        return answer["code"] if answer else None

    def ending(self, node: Node) -> str | None:
        """How the node's process ended, in the words of the launcher that reaped it (an out-of-memory kill named
        with its evidence: dsctl.specs.exits); None until it has, or from a launcher that did not say."""
        answer = read_json(self.dir / f"exit-{node.pid}.json") if node.pid else None
        ended = answer.get("ended") if answer else None
        return ended if isinstance(ended, str) else None

    def forked(self) -> list[ProcessRef]:
        """Every process this launcher forked that still runs (and the launcher itself): a fork has the launcher's
        command line (`-m dsctl.runtime.launcher --requests <this folder>`) and leads a session of its own, so one
        forked just before the launcher was stopped, whose pid file was never written, is found too. A process that
        merely names the folder (a `tail -f` of a file in it) is not one of them (processes.started_for_run)."""
        return run_processes({str(self.dir), str(self.dir.resolve())}).proved
