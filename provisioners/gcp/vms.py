"""The run's VMs: recorded, created, reached over SSH, bootstrapped and checked; and deleted, confirmed.

Every VM is a node recorded in the state (its name, kind and machine, status `creating`) before
the API is asked for it, so a kill -9 from then on leaves names `dsctl down` can delete. The
firewall rules go with the first VMs; workers are created in one bulk insert (resources.py).
As each VM runs (a TPU VM: is READY) dsctl reaches it over SSH, waits for its startup script
(gcp.bootstrap installs TensorFlow and dsctl from the staged wheelhouse, stage.py) and asks it
which TensorFlow and dsctl it has: every VM must run the trainers' (versions.py) before any
server starts. A node leaves the state only once the API no longer lists its VM.
"""

from __future__ import annotations

import json
import time

from dsctl.specs.schema import JobSpec

from ..contract import EventSink
from ..state import Deployment, Node, Role
from . import compute, firewall, lifetime, naming, remote, starter, startup, versions, watchdog
from .billing import dispatcher_provisioning
from .context import Context
from .errors import CloudTimeout, RemoteError
from .machinetypes import machine_kind
from .resources import Machine
from .retry import Cancelled
from .state import FirewallRule, GcpNode, Vm, gcp, of
from .storage import Staging
from .threads import parallel, relay


def metadata(ctx: Context, kind: str, role: str = "worker") -> dict:
    """A VM's metadata: OS Login on, its run, and (gcp.bootstrap) the startup script for its kind; the
    dispatcher's also installs what the run's supervisor needs. No SSH key: keys go through OS Login
    (oslogin.py), and turning OS Login off here would override the project's setting (and is refused
    where an organization policy requires it)."""
    s = ctx.settings
    md = {"enable-oslogin": "TRUE", "dsctl-run": ctx.dep.run_id}
    if kind == "gpu":
        md["install-nvidia-driver"] = "True"  # the Deep Learning VM image installs the driver at first boot
    if s.bootstrap:
        staged = ctx.state.software
        assert staged.wheel is not None, "stage.software staged this dsctl's wheel before any VM (gcp.bootstrap)"
        md["startup-script"] = startup.script(
            kind=s.run_software.for_kind(kind), tf_version=s.tensorflow_version, bucket=s.bucket,
            wheelhouse_prefix=staged.wheelhouses[kind], dsctl_prefix=Staging(ctx.clients, ctx.dep.run_id).staging_prefix,
            dsctl_wheel=staged.wheel, storage_host=s.storage_host, supervisor=role == "dispatcher")
    return md


def record(ctx: Context, spec: JobSpec, role: Role, indices: list[int], machine: str,
           supervisor: bool = False) -> list[Machine]:
    """Record nodes for VMs about to be created (the caller saves before any API call) and return what to create.
    Every Compute Engine VM is deleted by Compute Engine after lifetime.max_run_s (TPU VMs have no such limit), and
    every VM but the workers runs the run's watchdog (watchdog.py; a startup script of its own without
    gcp.bootstrap), which ends the run's VMs should its supervisor be lost. Each VM runs as its kind's account
    (accounts.py), Shielded where its image supports it.
    `supervisor`: this dispatcher VM will run the run's supervisor, so it is standard whatever
    service.provisioning says."""
    s, dep = ctx.settings, ctx.dep
    kind = machine_kind(machine).kind
    tag = naming.network_tag(dep.run_id)
    md = metadata(ctx, kind, role)
    md.setdefault("startup-script", watchdog.script() + (starter.start_lines(s.python) if role == "dispatcher" else ""))
    tpus = machine_kind(spec.trainer.machine).kind == "tpu"
    if role != "worker":  # the VMs whose account may end the run's VMs (accounts.py) watch for its supervisor
        md[lifetime.WATCHDOG_KEY] = lifetime.watchdog_config(s, dep.run_id, tpus=tpus).to_json()
    image = s.run_software.for_kind(kind).image  # a boot image, or a TPU VM's runtime version
    provisioning = spec.trainer.provisioning if role == "trainer" else spec.service.provisioning
    if supervisor and role == "dispatcher":
        provisioning = dispatcher_provisioning(spec.service.provisioning, "vm")
    out = []
    for i in indices:
        name = naming.instance_name(dep.run_id, role, i)
        # Workers share one bulk insert, hence one set of labels: their index is in their names only.
        labels = naming.labels(dep.run_id, spec.name, role, s.labels, index=None if role == "worker" else i)
        vm_md = md
        if supervisor and role == "dispatcher":  # it starts the run's supervisor from the hand-over (starter.py)
            vm_md = {**md, starter.STARTER_KEY: starter_config(ctx, name).to_json()}
        if kind == "tpu":  # a TPU VM's metadata server does not name its node: the watchdog is told
            vm_md = {**md, lifetime.WATCHDOG_KEY: lifetime.watchdog_config(s, dep.run_id, tpus=tpus,
                                                                          tpu_node=name).to_json()}
        config = compute.VmConfig(machine=machine, labels=labels, tag=tag, metadata=vm_md, image=image,
                                  provisioning=provisioning,
                                  max_run_s=lifetime.max_run_s(s) if kind != "tpu" else None,
                                  service_account=s.account_for(role),
                                  shielded=s.shielded_vm and kind in s.shielded_kinds)
        vm = Vm(name=name, kind=kind, machine=machine, dir=remote.node_dir(s.remote_dir, dep.run_id, name))
        dep.nodes.append(Node(role=role, index=i, state=GcpNode(vm=vm)))
        if role == "trainer":
            with ctx.lock:
                ctx.state.trainer_vms[i] = vm  # the same record: what the node learns of its VM, the run keeps
        out.append(Machine(role=role, index=i, name=name, vm=config, kind=kind))
    return out


def starter_config(ctx: Context, vm_name: str) -> starter.StarterConfig:
    """What the dispatcher VM named `vm_name` is told to start the run's supervisor with: the hand-over's place,
    the supervisor's folder and Python, the endpoints it calls (gcp's own, or a test's stand-ins)."""
    s = ctx.settings
    return starter.StarterConfig(run_id=ctx.dep.run_id, bucket=s.bucket, storage=s.storage_host or remote.REAL_STORAGE,
                                 dir=starter.supervisor_dir(s.remote_dir, ctx.dep.run_id, vm_name), python=s.python,
                                 env=s.endpoint_environment(), wait_s=s.max_duration_s)


def node_of(dep: Deployment, m: Machine) -> Node:
    return next(n for n in dep.nodes if n.role == m.role and n.index == m.index)


def restore_trainer_nodes(dep: Deployment, count: int) -> None:
    """Nodes again for the run's trainer VMs below `count` that the orchestrator no longer lists (it drops trainer
    nodes after a measurement; their VMs stay for the next)."""
    have = {n.index for n in dep.by_role("trainer")}
    for index, vm in sorted(of(dep).trainer_vms.items()):
        if index not in have and index < count:
            dep.nodes.append(Node(role="trainer", index=index, state=GcpNode(vm=vm)))


def create(ctx: Context, machines: list[Machine], rules: bool, events: EventSink, reach: bool = True) -> dict[str, dict]:
    """Create machines (and the run's firewall rules); as each VM runs, SSH to it, wait for its bootstrap and
    probe its versions. Returns the probe reports by node label. Without `reach` (a run handed over: its
    supervisor reaches the VMs from the dispatcher VM, prepare_all), only until each VM runs: no connection
    to any VM, and no SSH key in OS Login for the caller."""
    s, dep, state = ctx.settings, ctx.dep, ctx.state
    events = relay(events)
    fleet = ctx.fleet(events)
    new_rules = []
    if rules and not state.firewalls and not s.standing_rules:  # standing rules: the network's own (network.py)
        new_rules = firewall.run_rules(dep.run_id, naming.network_tag(dep.run_id), s.dispatcher_port, s.worker_port)
        state.firewalls = [FirewallRule(rule.name) for rule in new_rules]
    ctx.save()  # intent first: a kill -9 from here on leaves names `dsctl down` can delete
    if reach:
        ctx.sign_in(s.max_duration_s)  # the key SSH reaches these VMs with, in OS Login, before any of them boots
    t0 = time.monotonic()
    fleet.create(machines, new_rules)
    for m in machines:
        gcp(node_of(dep, m)).vm.status = "created"
    for rule in state.firewalls:
        rule.status = "created"
    ctx.save()

    def running(m: Machine, internal: str | None, external: str | None) -> None:
        if reach and s.public_ips and not external:
            raise RemoteError(f"{m.name} has no external address although gcp.public_ips is true; dsctl cannot "
                              "reach it over SSH from here.")
        with ctx.lock:
            vm = gcp(node_of(dep, m)).vm
            vm.status, vm.internal_ip, vm.external_ip = "running", internal, external
            vm.host = external if s.public_ips else internal

    def prepare_all(ms: list[Machine]) -> list[dict]:
        if not reach:
            return [{} for _ in ms]
        return parallel(lambda m: prepare(ctx, node_of(dep, m)), ms, cancel=ctx.cancel)

    def vms() -> list[dict]:
        group = [m for m in machines if m.kind != "tpu"]
        if not group:
            return []
        fleet.wait_running(group, s.running_timeout_s, running)
        ctx.save()  # once for the group: 640 saves of a 640-node state would be quadratic
        then = "; connecting over SSH" if reach else ""
        events("cloud", f"{len(group)} VM(s) running after {time.monotonic() - t0:.1f} s{then}")
        return prepare_all(group)

    def one_tpu(m: Machine) -> list[dict]:
        fleet.wait_tpu(m, running)
        ctx.save()
        events("cloud", f"TPU VM {m.name} ready after {time.monotonic() - t0:.1f} s{'; connecting over SSH' if reach else ''}")
        return prepare_all([m])

    jobs = [vms] + [lambda m=m: one_tpu(m) for m in machines if m.kind == "tpu"]
    reports = [r for group in parallel(lambda job: job(), jobs, cancel=ctx.cancel, events=events) for r in group]
    order = [m for m in machines if m.kind != "tpu"] + [m for m in machines if m.kind == "tpu"]
    ctx.save()
    return dict(zip((f"{m.role}-{m.index}" for m in order), reports))


def reach_all(ctx: Context, nodes: list[Node]) -> dict[str, dict]:
    """The VMs of `nodes` created without being reached (create, reach=False), reached now: SSH, bootstrap done,
    versions reported by node label; checked against the trainers' (check_versions)."""
    reports = parallel(lambda n: prepare(ctx, n), nodes, cancel=ctx.cancel)
    return {f"{n.role}-{n.index}": r for n, r in zip(nodes, reports)}


def prepare(ctx: Context, node: Node) -> dict:
    """SSH reachable; startup script done (if any); its versions reported."""
    s = ctx.settings
    vm = gcp(node).vm
    what = f"{node.role} {node.index} ({vm.name})"
    ctx.ssh.wait_reachable(vm.ssh_host, timeout_s=s.ssh_timeout_s, what=what, cancel=ctx.cancel)
    if s.bootstrap:
        deadline = time.monotonic() + s.startup_timeout_s
        while True:  # in short waits, so a teardown does not wait for the whole install
            if ctx.cancel.is_set():
                raise Cancelled()
            chunk = min(20.0, max(deadline - time.monotonic(), 1.0))
            res = ctx.ssh.run(vm.ssh_host, remote.wait_file(startup.MARKER, chunk),
                              doing="waiting for the startup script", timeout=chunk + 30)
            if res.code == 0 or time.monotonic() >= deadline:
                break
        try:
            marker = json.loads(res.stdout.strip().splitlines()[-1]) if res.code == 0 else None
        except (json.JSONDecodeError, IndexError):
            marker = None
        if marker is None:
            raise CloudTimeout(f"the startup script on {what} did not finish within {s.startup_timeout_s:.0f} s "
                               f"(it installs TensorFlow {s.tensorflow_version}); see {startup.LOG} on the VM.")
        if not marker.get("ok"):
            raise RemoteError(f"the startup script on {what} failed: {marker.get('error')}. "
                              f"See {startup.LOG} on the VM.")
    res = ctx.ssh.run(vm.ssh_host, remote.probe(s.python, f"{node.role}-{node.index}"), doing="checking versions")
    report = remote.parse_probe(res.stdout)
    if report is None:
        raise RemoteError(f"could not run {s.python} on {what} (exit {res.code}): {res.stderr.strip()[-300:]}. "
                          "Set gcp.python to the VM's Python that has TensorFlow and dsctl.")
    with ctx.lock:
        vm.tensorflow = report.get("tensorflow")
    return report


def check_versions(ctx: Context, reports: dict[str, dict]) -> None:
    """The new machines' TensorFlow against the trainers' (checked before, if the trainers are not new)."""
    known = [gcp(n).vm for n in ctx.dep.by_role("trainer")] + list(ctx.state.trainer_vms.values())
    recorded = next((vm.tensorflow for vm in known if vm.tensorflow), None)
    tf, who = versions.reference(reports, recorded, ctx.settings.tensorflow_version)
    versions.check(reports, reference_tf=tf, who=who, local_dsctl=versions.local_dsctl(),
                   staged_dsctl=ctx.state.software.wheel_version)


def delete(ctx: Context, nodes: list[Node], events: EventSink, firewalls: bool = False) -> None:
    """Delete the nodes' VMs (and the run's firewall rules) in parallel; each leaves the state only once the API no
    longer lists it."""
    dep, state = ctx.dep, ctx.state
    by_name = {gcp(n).vm.name: n for n in nodes}
    for n in by_name.values():
        gcp(n).vm.deleting = True  # a VM on its way out is not one to start again

    def gone(name: str) -> None:
        with ctx.lock:
            node = by_name.get(name)
            if node is not None and node in dep.nodes:
                dep.nodes.remove(node)
            state.firewalls = [rule for rule in state.firewalls if rule.name != name]
            for index in [i for i, vm in state.trainer_vms.items() if vm.name == name]:
                del state.trainer_vms[index]
            dep.save()

    instances = [name for name, n in by_name.items() if gcp(n).vm.kind != "tpu"]
    tpus = [name for name, n in by_name.items() if gcp(n).vm.kind == "tpu"]
    rules = [rule.name for rule in state.firewalls] if firewalls else []
    events = relay(events)
    try:
        ctx.fleet(events, cancellable=False).delete(instances, tpus, rules, gone)
    finally:
        events.flush()
