"""What the gcp provider keeps of a deployment: per node its VM and the process on it; per run its settings,
firewall rules, staged software, trainer VMs and the supervisor it handed the run to.

Saved in the run's state file with the rest of the deployment (provisioners/state.py) after every change, and a
resource BEFORE it is created, so `dsctl down` in a new process (even after kill -9 of `dsctl up`) finds the
project and zone, every VM, every firewall rule and the run's supervisor, and deletes them. A process on a VM is
known by its pid and start time there (GcpNode.remote_pid, start_time), never by Node.pid: that is a pid on this
machine.

State files written before the typed state (every detail in a node's `extra` dict; the settings in a `gcp`
pseudo-node, each rule in a `firewall` one, the hand-over in a `supervisor` one) are converted on load by
GcpCodec.from_legacy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..state import Deployment, DeploymentState, Node, NodeState, from_dict, legacy_monitor
from .machinetypes import VmKind
from .settings import GcpSettings

VmStatus = Literal["creating", "created", "running"]  # asked for; the API made it; running, its addresses known
RuleStatus = Literal["creating", "created"]


@dataclass
class Vm:
    """One VM (or TPU VM) of the run, recorded before it is created."""

    name: str  # the instance's (or TPU node's) name: naming.instance_name(run, role, index)
    kind: VmKind = "cpu"  # how it is created, and the software it gets (machinetypes.py)
    machine: str = ""  # the machine type as the spec names it (n2-standard-8, tpu-v2-8)
    status: VmStatus = "creating"
    dir: str = ""  # the directory of its node's process on it (remote.Layout)
    internal_ip: str | None = None  # where the run's other VMs reach it (the service's addresses)
    external_ip: str | None = None  # its ephemeral external address (gcp.public_ips)
    host: str | None = None  # where dsctl reaches it over SSH: the external address, or the internal one from inside
    tensorflow: str | None = None  # the TensorFlow its Python reported (versions.py)
    deleting: bool = False  # on its way out: never started again (recovery.py)

    @property
    def ssh_host(self) -> str:
        """`host`, for the steps that reach the VM: known once it runs (vms.py), before anything is started there."""
        assert self.host is not None, f"VM {self.name} has no address yet"
        return self.host


@dataclass
class GcpNode(NodeState):
    """A dispatcher, worker or trainer: its VM, and the process dsctl started on it."""

    vm: Vm
    remote_pid: int | None = None  # the process's pid on its VM; None until it is started
    start_time: int | None = None  # its start in clock ticks after the VM's boot (/proc): with the pid, identifies it
    launched_at: float | None = None  # when it was started, on this machine's monotonic clock: older readings are
    #                                   not of this process (a restarted server's predecessor)
    port: int | None = None  # servers: the port it listens on (kept when it is restarted)
    ready: bool = False  # servers: it has written its ready file
    cache_mb: int = 0  # workers: the cross-trainer cache's size
    fault_tolerant: bool = False  # the dispatcher: started with a journal, so restarted from it
    steps: str | None = None  # trainers: where its per-batch records come home (--record-steps)
    ids: str | None = None  # trainers: where the element ids it received come home (--record-ids)


@dataclass
class FirewallRule:
    """One of the run's firewall rules (firewall.run_rules), recorded before it is created."""

    name: str
    status: RuleStatus = "creating"


@dataclass
class Login:
    """The run's SSH key as OS Login registered it (oslogin.py): whose it is, the user it logs in as, and how
    to delete it."""

    account: str  # the identity the key is registered for (a user's or a service account's email)
    username: str  # the POSIX username OS Login gives that identity on this project's VMs
    fingerprint: str  # the key's name under users/<account>/sshPublicKeys/
    expires_at: float  # Unix time after which OS Login no longer accepts it


LEGACY_SSH_USER = "dsctl"  # runs made before OS Login put their key in metadata for this user


@dataclass
class RemoteProcess:
    """A process on a VM that is no node of the run: the run's supervisor (`dsctl supervise`) after a hand-over."""

    instance: str  # the VM it runs on (the dispatcher's)
    host: str  # that VM's address
    dir: str  # its directory there (remote.Layout; made by the VM's starter, starter.py)
    remote_pid: int | None = None  # known to its VM only (the starter started it): states before have it
    start_time: int | None = None


@dataclass
class StagedSoftware:
    """What the VMs install from Cloud Storage at boot (gcp.bootstrap), staged before any VM exists."""

    wheel: str | None = None  # this dsctl's wheel, by file name, in the run's staging prefix
    wheelhouses: dict[str, str] = field(default_factory=dict)  # VM kind -> its wheelhouse's prefix in the bucket

    @property
    def wheel_version(self) -> str | None:
        """The staged dsctl's version: every VM must run exactly it (versions.py)."""
        return self.wheel.split("-")[1] if self.wheel else None


@dataclass
class GcpDeployment(DeploymentState):
    """The run's own facts on Google Cloud, beside its nodes."""

    settings: GcpSettings  # project, zone, endpoints ...: `dsctl down` in a new process talks to the same place
    # Trainer VMs by trainer index. They outlive one measurement: the orchestrator drops trainer nodes after
    # stop_trainers (a sweep measures several times on one deployment); start_trainers brings their nodes back
    # from here, and `down` deletes them from here.
    trainer_vms: dict[int, Vm] = field(default_factory=dict)
    firewalls: list[FirewallRule] = field(default_factory=list)
    software: StagedSoftware = field(default_factory=StagedSoftware)
    bucket_ready: bool = False  # the bucket exists and the VMs' service account may read it
    staged: bool = False  # objects were put in the run's staging prefix: `down` copies results and deletes them
    data_root: str | None = None  # where a builtin's data was staged (gs://...), read by the workers there
    trainer_files: list[str] = field(default_factory=list)  # the spec (and code) staged for the trainers, when a
    #                                                          hand-over staged them from the user's machine
    supervisor: RemoteProcess | None = None  # the run's supervisor on its dispatcher VM, once handed over
    login: Login | None = None  # the run's key in OS Login, for this machine's identity (None: not registered yet)
    granted_at: float | None = None  # when dsctl granted the VMs' accounts roles for this run (they propagate)

    @property
    def ssh_user(self) -> str:
        """Who dsctl connects to the run's VMs as: OS Login's username for the key's identity."""
        return self.login.username if self.login is not None else LEGACY_SSH_USER


def gcp(node: Node) -> GcpNode:
    """The node's Google Cloud state (every node of a gcp deployment has one)."""
    state = node.state
    assert isinstance(state, GcpNode), f"{node.role} {node.index} is not a node on Google Cloud"
    return state


def of(dep: Deployment) -> GcpDeployment:
    """The deployment's Google Cloud state (made when `up` or `start_trainers` first ran)."""
    state = dep.state
    assert isinstance(state, GcpDeployment), f"run {dep.run_id} has no Google Cloud state"
    return state


# -- reading it back -----------------------------------------------------------------------------------------------
def _vm(data: dict[str, Any]) -> Vm:
    return from_dict(Vm, data)


class GcpCodec:
    """How the state above is read back from a state file (provisioners/registry.py load_deployment)."""

    def node_state(self, data: dict[str, Any]) -> GcpNode:
        return from_dict(GcpNode, {**data, "vm": _vm(data["vm"])})

    def deployment_state(self, data: dict[str, Any]) -> GcpDeployment:
        supervisor = data.get("supervisor")
        return GcpDeployment(
            settings=GcpSettings.from_dict(data["settings"]),
            trainer_vms={int(index): _vm(vm) for index, vm in (data.get("trainer_vms") or {}).items()},
            firewalls=[from_dict(FirewallRule, rule) for rule in data.get("firewalls") or []],
            software=from_dict(StagedSoftware, data.get("software")),
            bucket_ready=bool(data.get("bucket_ready")),
            staged=bool(data.get("staged")),
            data_root=data.get("data_root"),
            trainer_files=list(data.get("trainer_files") or []),
            supervisor=from_dict(RemoteProcess, supervisor) if supervisor else None,
            login=from_dict(Login, data["login"]) if data.get("login") else None,
        )

    def from_legacy(self, data: dict[str, Any]) -> dict[str, Any]:
        """Before typed state: each node's details in its `extra` dict; the settings, staged software and trainer VMs
        in a `gcp` pseudo-node; each firewall rule a `firewall` node; a hand-over a `supervisor` node."""
        data = legacy_monitor(data)
        nodes, state = [], None
        rules, supervisor = [], None
        for n in data.get("nodes", []):
            extra = n.get("extra") or {}
            role = n.get("role")
            if role == "gcp":
                state = extra
            elif role == "firewall":
                rules.append({"name": extra["name"], "status": extra.get("state", "creating")})
            elif role == "supervisor":
                supervisor = {k: extra.get(k) for k in ("instance", "host", "dir", "remote_pid", "start_time")}
            else:
                node = {k: v for k, v in n.items() if k != "extra"}
                node["metrics"] = extra.get("metrics")
                node["state"] = _legacy_node_dict(extra)
                nodes.append(node)
        if state is not None:
            staged = state.get("staged_software") or {}
            state = {"settings": state["settings"],
                     "trainer_vms": {k: _legacy_vm_dict(v) for k, v in (state.get("trainer_vms") or {}).items()},
                     "firewalls": rules,
                     "software": {"wheel": staged.get("wheel"), "wheelhouses": staged.get("wheelhouses") or {}},
                     "bucket_ready": state.get("bucket_ready", False), "staged": state.get("staged", False),
                     "data_root": state.get("data_root"), "trainer_files": state.get("trainer_files") or [],
                     "supervisor": supervisor}
        return {**data, "nodes": nodes, "state": state}


def _legacy_vm_dict(extra: dict[str, Any]) -> dict[str, Any]:
    """An old node's (or trainer VM's) VM details: its `state` is the VM's status."""
    vm = {k: extra.get(k) for k in ("dir", "internal_ip", "external_ip", "host", "tensorflow")}
    return {**vm, "name": extra["instance"], "kind": extra.get("kind", "cpu"), "machine": extra.get("machine", ""),
            "status": extra.get("state", "creating"), "deleting": bool(extra.get("deleting"))}


def _legacy_node_dict(extra: dict[str, Any]) -> dict[str, Any]:
    process = ("remote_pid", "start_time", "launched_at", "port", "ready", "cache_mb", "fault_tolerant", "steps", "ids")
    return {"vm": _legacy_vm_dict(extra), **{k: extra[k] for k in process if k in extra}}

