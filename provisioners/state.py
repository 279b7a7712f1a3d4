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
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

STATE_FILE = "state.json"

T = TypeVar("T", bound="DataclassInstance")


Role = Literal["dispatcher", "worker", "trainer"]  # what a node of a deployment is
NodeRole = Literal[Role, "stray"]  # stray: a process of a run found by its command line alone (its state unreadable)
# A deployment's life; "state unreadable": rebuilt from its processes and cgroup (orchestrator/deployments.py).
DeploymentStatus = Literal["starting", "up", "down", "state unreadable"]


def from_dict(cls: type[T], data: dict[str, Any] | None) -> T:
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
    """Base of a provider's own record of a node (e.g. provisioners/local/state.py LocalNode)."""


class DeploymentState:
    """Base of a provider's own record of a deployment (e.g. the launcher, a VM project and zone)."""


@dataclass
class Unread(NodeState, DeploymentState):
    """A provider's own state that this dsctl cannot type (its provider is not installed here): kept as the state
    file has it, and written back so."""

    data: dict[str, Any]


@dataclass
class Node:
    """One dispatcher, worker or trainer of the run: the process and, for a cloud, the machine it runs on.

    pid/pgid/create_time are a process on THIS machine (None for a process on another one); `state` is the
    provider's own typed record of it."""

    role: NodeRole
    index: int
    address: str | None = None  # host:port, for servers
    pid: int | None = None
    pgid: int | None = None
    create_time: float | None = None
    log: str | None = None  # its output, on this machine (a cloud node's once brought home)
    metrics: str | None = None  # trainers: where their JSON-lines metrics reach this machine
    state: NodeState | None = None  # the provider's own record of it

    @property
    def process(self) -> ProcessRef:
        return ProcessRef(self.pid, self.pgid, self.create_time, self.log)


@dataclass
class Deployment:
    run_id: str
    provider: str
    run_dir: str
    status: DeploymentStatus = "starting"
    dispatcher_address: str | None = None
    nodes: list[Node] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    monitor: ProcessRef | None = None  # a detached `dsctl up` that owns the deployment (`down` stops it first)
    state: DeploymentState | None = None  # the provider's own record of it

    def by_role(self, role: NodeRole) -> list[Node]:
        return sorted((n for n in self.nodes if n.role == role), key=lambda n: n.index)

    def save(self) -> None:
        path = Path(self.run_dir) / STATE_FILE
        tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")  # its own: `dsctl down` may save beside `dsctl up`
        tmp.write_text(json.dumps(plain(self), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, run_dir: str | Path, codec_of: Callable[[str], StateCodec | None]) -> Deployment:
        """The deployment in `run_dir`'s state file, its provider's own state typed by the codec `codec_of` gives for
        the provider it names (provisioners/registry.py load_deployment passes the registry's; None: a provider this
        dsctl does not have, whose state stays as the file has it)."""
        data = json.loads((Path(run_dir) / STATE_FILE).read_text())
        codec = codec_of(data.get("provider", ""))
        if codec is not None and any("extra" in n for n in data.get("nodes", [])):
            data = codec.from_legacy(data)
        nodes = []
        for n in data.pop("nodes"):
            n = {k: v for k, v in n.items() if k != "extra"}
            if n.get("state") is not None:
                n["state"] = codec.node_state(n["state"]) if codec is not None else Unread(n["state"])
            nodes.append(from_dict(Node, n))
        monitor = data.pop("monitor", None)
        state = data.pop("state", None)
        dep = from_dict(cls, data)
        dep.nodes = nodes
        dep.monitor = from_dict(ProcessRef, monitor) if monitor else None
        if state is not None:
            dep.state = codec.deployment_state(state) if codec is not None else Unread(state)
        return dep


def plain(value: Any) -> Any:
    """A deployment (or any part of it) as the JSON of its state file: dataclasses as dicts of their fields, an
    Unread state as the file had it."""
    if isinstance(value, Unread):
        return value.data
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


class StateCodec(Protocol):
    """How a provider's own state is read back from a state file (provisioners/<provider>/state.py)."""

    def node_state(self, data: dict[str, Any]) -> NodeState: ...

    def deployment_state(self, data: dict[str, Any]) -> DeploymentState: ...

    def from_legacy(self, data: dict[str, Any]) -> dict[str, Any]:
        """An old state file (provider details in each node's `extra`, pseudo-nodes for what is not a machine)
        rewritten in today's form: `state` per node, the deployment's `state` and `monitor`."""
        ...


def legacy_monitor(data: dict[str, Any]) -> dict[str, Any]:
    """An old state file's `monitor` pseudo-node becomes the deployment's monitor (every provider had it)."""
    monitors = [n for n in data.get("nodes", []) if n.get("role") == "monitor"]
    if monitors:
        m = monitors[0]
        data["monitor"] = {k: m.get(k) for k in ("pid", "pgid", "create_time", "log")}
    data["nodes"] = [n for n in data.get("nodes", []) if n.get("role") != "monitor"]
    return data
