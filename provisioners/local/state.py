"""What the local provider keeps of a deployment: per process its port and ready file, the launcher, and the
cgroup every process of the run is in.

Saved in the run's state file with the rest of the deployment (provisioners/state.py), so `dsctl down`
in a new process finds the launcher, every process it forked, and (in the cgroup) whatever those started.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..containment import Containment
from ..state import DeploymentState, NodeState, ProcessRef, from_dict, legacy_monitor


@dataclass
class LocalNode(NodeState):
    port: int | None = None  # servers: the loopback port it listens on
    ready_file: str | None = None  # servers: written by the server once it serves
    ready: bool = False
    served: bool = False  # a worker that has served: its clients know its address, so a restart keeps it
    port_picks: int = 0  # a worker that never served, moved to another port this often at start (taken ports)
    cache_mb: int = 0  # workers: the cross-trainer cache's size
    cpus: list[int] | None = None  # pinned to these cores
    launch_id: str | None = None  # the launcher's request for it, until its pid is known
    argv: list[str] = field(default_factory=list)  # the dispatcher: how to start it again (from its journal)
    status_file: str | None = None  # the dispatcher: its own account of its jobs (runtime/dispatcher.py)
    steps: str | None = None  # trainers: per-batch records (--record-steps)
    ids: str | None = None  # trainers: received element ids (--record-ids)
    command: bool = False  # trainers running the user's command: measured with what runs below them


@dataclass
class Isolation:
    """Whether the deployment runs in a network of its own (the launcher's answer, runtime/launcher.py)."""

    isolated: bool
    userns: bool | None = None
    netns: str | None = None
    reason: str | None = None


@dataclass
class LocalDeployment(DeploymentState):
    launcher: ProcessRef | None = None  # the pre-loaded process that forks every other (runtime/launcher.py)
    isolation: Isolation | None = None
    # The cgroup the launcher (and so every process of the run) is in, recorded before it is made (containment.py).
    container: Containment | None = None


class LocalCodec:
    def node_state(self, data: dict[str, Any]) -> LocalNode:
        return from_dict(LocalNode, data)

    def deployment_state(self, data: dict[str, Any]) -> LocalDeployment:
        isolation = data.get("isolation")
        launcher = data.get("launcher")
        container = data.get("container")
        return LocalDeployment(launcher=from_dict(ProcessRef, launcher) if launcher else None,
                               isolation=from_dict(Isolation, isolation) if isolation else None,
                               container=from_dict(Containment, container) if container else None)

    def from_legacy(self, data: dict[str, Any]) -> dict[str, Any]:
        """Before typed state: every detail in a node's `extra`, the launcher a `launcher` pseudo-node."""
        data = legacy_monitor(data)
        nodes, state = [], {}
        for n in data.get("nodes", []):
            extra = n.get("extra") or {}
            if n.get("role") == "launcher":
                state = {"launcher": {k: n.get(k) for k in ("pid", "pgid", "create_time", "log")},
                         "isolation": extra.get("isolation")}
                continue
            node = {k: v for k, v in n.items() if k != "extra"}
            node["metrics"] = extra.get("metrics")
            node["state"] = extra
            nodes.append(node)
        return {**data, "nodes": nodes, "state": state or None}
