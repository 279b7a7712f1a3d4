"""What a deployment is, as plain typed data saved to the run's state file after every change.

`dsctl down` in a new process (even after `kill -9` of `dsctl up`) reads this file to find and
remove everything a run started, so each fact a provider needs for that is here, typed: the
nodes (the dispatcher, the workers, the trainers: where they serve, the local process if any,
where their log and metrics are) and, beside them, what each provider keeps of its own, as its
own dataclasses (`state`): a local process's port and ready file, a VM's name and address, the
project a run's VMs are in. What is not a machine (the launcher, a detached monitor, a firewall
rule, a run's supervisor on the cloud) is deployment-level state, never a node.

State files written before the typed state existed (every provider detail in a node's `extra`
dict, and pseudo-nodes for the launcher, the monitor, the settings) still load: the provider's
codec converts them (StateCodec.from_legacy), so `dsctl down` finds what they describe.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

STATE_FILE = "state.json"

T = TypeVar("T", bound="DataclassInstance")


def from_dict(cls: type[T], data: dict | None) -> T:
    """A dataclass from its dict, ignoring keys it does not know (a newer dsctl's fields)."""
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in (data or {}).items() if k in known})


@dataclass
class ProcessRef:
    """A process on this machine, identified by pid AND start time (a pid alone may be reused); its group."""

    pid: int | None = None
    pgid: int | None = None
    create_time: float | None = None
    log: str | None = None


class NodeState:
    """Base of a provider's own record of a node (e.g. providers/local/state.py LocalNode)."""


class DeploymentState:
    """Base of a provider's own record of a deployment (e.g. the launcher, a VM project and zone)."""


@dataclass
class Node:
    """One dispatcher, worker or trainer of the run: the process and, for a cloud, the machine it runs on.

    pid/pgid/create_time are a process on THIS machine (None for a process on another one); `state` is the
    provider's own typed record of it."""

    role: str  # "dispatcher" | "worker" | "trainer" ("stray": a process found by its command line, state unreadable)
    index: int
    address: str | None = None  # host:port, for servers
    pid: int | None = None
    pgid: int | None = None
    create_time: float | None = None
    log: str | None = None  # its output, on this machine (a cloud node's once brought home)
    metrics: str | None = None  # trainers: where their JSON-lines metrics reach this machine
    state: Any = None  # the provider's NodeState

    @property
    def process(self) -> ProcessRef:
        return ProcessRef(self.pid, self.pgid, self.create_time, self.log)


@dataclass
class Deployment:
    run_id: str
    provider: str
    run_dir: str
    status: str = "starting"  # starting | up | down
    dispatcher_address: str | None = None
    nodes: list[Node] = field(default_factory=list)
    labels: dict = field(default_factory=dict)
    monitor: ProcessRef | None = None  # a detached `dsctl up` that owns the deployment (`down` stops it first)
    state: Any = None  # the provider's DeploymentState

    def by_role(self, role: str) -> list[Node]:
        return sorted((n for n in self.nodes if n.role == role), key=lambda n: n.index)

    def save(self) -> None:
        path = Path(self.run_dir) / STATE_FILE
        tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")  # its own: `dsctl down` may save beside `dsctl up`
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, run_dir: str | Path) -> Deployment:
        """The deployment in `run_dir`'s state file, its provider state typed by the provider's codec."""
        from .registry import codec_of

        data = json.loads((Path(run_dir) / STATE_FILE).read_text())
        codec = codec_of(data.get("provider", ""))
        if codec is not None and any("extra" in n for n in data.get("nodes", [])):
            data = codec.from_legacy(data)
        nodes = []
        for n in data.pop("nodes"):
            n = {k: v for k, v in n.items() if k != "extra"}
            if codec is not None and n.get("state") is not None:
                n["state"] = codec.node_state(n["state"])
            nodes.append(from_dict(Node, n))
        monitor = data.pop("monitor", None)
        state = data.pop("state", None)
        dep = from_dict(cls, data)
        dep.nodes = nodes
        dep.monitor = from_dict(ProcessRef, monitor) if monitor else None
        dep.state = codec.deployment_state(state) if codec is not None and state is not None else state
        return dep


class StateCodec(Protocol):
    """How a provider's own state is read back from a state file (providers/<provider>/state.py)."""

    def node_state(self, data: dict) -> NodeState: ...

    def deployment_state(self, data: dict) -> DeploymentState: ...

    def from_legacy(self, data: dict) -> dict:
        """An old state file (provider details in each node's `extra`, pseudo-nodes for what is not a machine)
        rewritten in today's form: `state` per node, the deployment's `state` and `monitor`."""
        ...


def legacy_monitor(data: dict) -> dict:
    """An old state file's `monitor` pseudo-node becomes the deployment's monitor (every provider had it)."""
    monitors = [n for n in data.get("nodes", []) if n.get("role") == "monitor"]
    if monitors:
        m = monitors[0]
        data["monitor"] = {k: m.get(k) for k in ("pid", "pgid", "create_time", "log")}
    data["nodes"] = [n for n in data.get("nodes", []) if n.get("role") != "monitor"]
    return data
