"""A run supervised on the cloud (orchestrator/supervise.py): handed from the user's machine to its dispatcher VM.

Once its servers serve, the user's machine stages the trainers' files, copies the run's state
and spec to the dispatcher VM and starts `dsctl supervise` there (hand_off), recording that
process in the state so `dsctl down` from here knows the run is supervised there. No key goes
with them: on the VM, the supervisor checks that the VMs' service account may do what it must
(check_supervisor), makes an SSH key of its own and registers it with OS Login for that account,
takes the deployment over (adopt: every VM reached at its internal address), runs the job,
publishes its record to Cloud Storage (run_objects) and deletes its own VM last (delete_self), only
once nothing else of the run is left. Should the supervisor be lost, its heartbeat stops and every
VM of the run deletes itself (lifetime.py, watchdog.py); its dispatcher VM is never Spot.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from dsctl.specs import SpecError
from dsctl.specs.schema import GcpSpec, JobSpec

from ..contract import EventSink, HandOffLimits
from . import access, accounts, compute, operations, preflight, remote, stage, starter, startup
from .context import Context
from .errors import GcpError
from .lifetime import beat_every_s
from .state import RemoteProcess, gcp
from .storage import HeartbeatObject, RunObjects, retry
from .watch import Watched

SILENT_BEATS = 3  # a supervisor whose heartbeat has not changed for this many beats is gone


def _gcp(spec: JobSpec) -> GcpSpec:
    return spec.gcp or GcpSpec()


def hands_off(spec: JobSpec, mode: str) -> bool:
    """A run through the service is supervised on its dispatcher VM unless the spec says gcp.supervisor: here."""
    return mode == "service" and _gcp(spec).supervisor == "vm"


def limits(spec: JobSpec) -> HandOffLimits:
    g = _gcp(spec)
    # The supervisor reaches each VM (SSH up, bootstrap done) before it starts their servers, then the first batch.
    return HandOffLimits(max_duration_s=g.max_duration_s, outage_limit_s=g.outage_limit_s,
                         first_batch_s=g.ssh_timeout_s + g.startup_timeout_s + 300.0,
                         max_duration_field="gcp.max_duration_s", outage_limit_field="gcp.outage_limit_s")


def detaching(spec: JobSpec) -> SpecError | None:
    if _gcp(spec).supervisor != "vm":
        return SpecError("a detached run is supervised by its dispatcher VM; with gcp.supervisor: here, run it "
                         "attached (without --detach).", field="gcp.supervisor")
    return None


def hand_off(ctx: Context, files: dict[str, bytes], base_dir: Path, events: EventSink) -> None:
    """Have the dispatcher VM start the run's supervisor with `files` (name -> contents) in its run dir, and return
    once it has published its record. The spec and the user's code (base_dir), then the hand-over (the files and
    the run's state, its manifest last), go to Cloud Storage; the VM's starter (starter.py) takes them from there.
    Nothing here connects to a VM: the VM's own startup script starts the supervisor."""
    s, dep, state = ctx.settings, ctx.dep, ctx.state
    spec = JobSpec.model_validate_json(files["spec.json"])
    state.trainer_files = stage.trainer_files(ctx, spec, Path(dep.run_dir) / "spec.json", base_dir)
    if ctx.watcher is not None:
        ctx.watcher.stop()
        ctx.watcher = None
    disp = gcp(dep.by_role("dispatcher")[0]).vm
    state.supervisor = RemoteProcess(instance=disp.name, host=disp.internal_ip or disp.host or "",
                                     dir=starter.supervisor_dir(s.remote_dir, dep.run_id, disp.name))
    ctx.save()
    bundle = {**files, "state.json": (Path(dep.run_dir) / "state.json").read_bytes()}
    HandOver(ctx.clients.storage, s.bucket, dep.run_id).put(bundle)
    where = f"gs://{s.bucket}/{starter.handoff_prefix(dep.run_id)}"
    events("cloud", f"the run's hand-over is in {where}; its dispatcher VM {disp.name} starts the run's supervisor "
                    "from there once its software is installed")
    _wait_started(ctx, disp.name, timeout_s=s.startup_timeout_s + s.ssh_timeout_s)
    events("handed-over", f"the run is supervised on its dispatcher VM {disp.name} from now on")


def _wait_started(ctx: Context, vm_name: str, timeout_s: float, poll_s: float = 2.0) -> None:
    """Until the supervisor has published anything of the run's record (it does within seconds of starting)."""
    objects = run_objects(ctx)
    deadline = time.monotonic() + timeout_s
    while not objects.names():
        if ctx.cancel.is_set():
            raise GcpError("the hand-over was interrupted")
        if time.monotonic() > deadline:
            raise GcpError(f"the dispatcher VM {vm_name} did not start the run's supervisor within {timeout_s:.0f} s "
                           f"of the hand-over (gcp.startup_timeout_s + gcp.ssh_timeout_s): its startup script "
                           f"installs the run's software first ({startup.LOG} on the VM), then starts the supervisor "
                           f"({starter.LOG}).")
        time.sleep(poll_s)


class HandOver:
    """The hand-over's objects in the run's bucket (starter.handoff_prefix): each file, then the manifest naming them,
    last, so the starter never reads half of it."""

    def __init__(self, storage_client, bucket: str, run_id: str):
        self.bucket = storage_client.bucket(bucket)
        self.prefix = starter.handoff_prefix(run_id)

    def put(self, files: dict[str, bytes]) -> None:
        for name, data in files.items():
            self.bucket.blob(self.prefix + name).upload_from_string(data, retry=retry())
        manifest = json.dumps({"files": sorted(files)}).encode()
        self.bucket.blob(self.prefix + starter.MANIFEST).upload_from_string(manifest, retry=retry())


class SupervisorWatch:
    """Whether the run's supervisor on its dispatcher VM lives, from here, with no connection to the VM: its VM as
    Compute Engine lists it, and its heartbeat object's generation, which must change every few beats (never a
    comparison of two machines' clocks: a change seen by this one)."""

    def __init__(self) -> None:
        self._generation: int | None = None
        self._changed = time.monotonic()

    def status(self, ctx: Context) -> str:
        """'running', else why not ('gone (...)'), or 'no supervisor'."""
        sup = ctx.state.supervisor
        if sup is None:
            return "no supervisor"
        try:
            # Its one VM, by name (a name dsctl made: naming.instance_name), not the whole run's listing.
            vm = compute.statuses(ctx.clients, f'name = "{sup.instance}"').get(sup.instance)
        except Exception as exc:  # noqa: BLE001 - the API out of reach: nothing is known
            return f"unknown ({type(exc).__name__}: {exc})"
        if vm is None:
            return f"gone (its VM {sup.instance} no longer exists)"
        if vm[0] != "RUNNING":
            return f"gone (its VM {sup.instance} is {vm[0]})"
        generation = HeartbeatObject(ctx.clients.storage, ctx.settings.bucket, ctx.dep.run_id).generation()
        now = time.monotonic()
        if generation != self._generation:
            self._generation, self._changed = generation, now
        silent = now - self._changed
        if silent > SILENT_BEATS * beat_every_s(ctx.settings.heartbeat_limit_s):
            return f"gone (its heartbeat has not changed for {silent:.0f} s)"
        return "running"


def adopt(ctx: Context) -> str:
    """On the dispatcher VM: take over a deployment handed over by `hand_off`. Every VM is reached at its internal
    address from here; the dispatcher and workers are watched from now on. Returns the name of this VM."""
    dep, state = ctx.dep, ctx.state
    inside = gcp(dep.by_role("dispatcher")[0]).vm.name
    state.supervisor = None
    ctx.sign_in(ctx.settings.max_duration_s)  # this VM's own key, for the VMs' service account
    for vm in [gcp(n).vm for n in dep.nodes] + list(state.trainer_vms.values()):
        if vm.internal_ip:
            vm.host = vm.internal_ip
    watcher = ctx.watching()
    now = time.monotonic()
    for node in dep.by_role("dispatcher") + dep.by_role("worker"):
        node_state = gcp(node)
        if node_state.remote_pid:
            node_state.launched_at = now  # a time of this machine's clock: readings from now on count
            watcher.watch(Watched(key=(node.role, node.index), host=node_state.vm.ssh_host,
                                  layout=remote.Layout(node_state.vm.dir), launched_at=now))
    ctx.save()
    return inside


def check_supervisor(ctx: Context, spec: JobSpec, events: EventSink | None = None) -> None:
    """On the dispatcher VM, before touching anything: may this VM's service account do what a supervisor does, each
    permission asked of the resource it is granted on (access.py)? Grants dsctl made for this run take minutes to be
    in effect everywhere, so while they may still be on their way (within access.PROPAGATION_S of when they were
    made) it probes again. Raises GcpError naming what it lacks, on which resource, and the commands that grant it
    (the user's machine then deletes the run)."""
    s = ctx.settings
    needs = preflight.supervisor_needs(spec, s)
    me = s.vm_accounts.get(accounts.SUPERVISOR) or "the dispatcher VM's service account"
    granted_at = ctx.state.granted_at
    deadline = (granted_at + access.PROPAGATION_S) if granted_at else 0.0
    said = False
    while True:
        missing = {where: access.missing(ctx.clients, where, wanted, f"checking the supervisor's permissions on "
                                         f"{where.describe(s.project)}") for where, wanted in needs.items()}
        missing = {w: m for w, m in missing.items() if m}
        if not missing:
            return
        if time.time() >= deadline or ctx.cancel.is_set():
            break
        if not said and events is not None:
            events("cloud", f"waiting for the grants dsctl made to {me} to take effect (Google says about 2 minutes, "
                            "sometimes 7)")
            said = True
        ctx.cancel.wait(5.0)
    supervisor_grants = accounts.grants_for(accounts.SUPERVISOR, spec, s.project, s.bucket,
                                            {accounts.SUPERVISOR: me, **s.vm_accounts}, s.firewall_project)
    fixes = [g for g in supervisor_grants if any(_grant_on(g, w) for w in missing)]
    lacking = "; ".join(f"{', '.join(perms[:6])}{' ...' if len(perms) > 6 else ''} on {w.describe(s.project)}"
                        for w, perms in missing.items())
    raise GcpError(
        f"the run's supervisor on the dispatcher VM runs as {me}, which lacks what a supervisor does: {lacking}. "
        f"Grant it: {accounts.commands(fixes, me) if fixes else 'the roles accounts.py lists'}; or set gcp.supervisor: "
        "here to supervise the run from this machine (dsctl up only, no --detach).")


def _grant_on(grant: accounts.Grant, where: access.Where) -> bool:
    """Whether `grant` is made on the resource `where` names (the run's project is Where('project', ''))."""
    if where.kind == "project":
        return grant.scope == "project"
    return grant.scope == where.kind and grant.target == where.name


def run_objects(ctx: Context) -> RunObjects:
    """Where a supervised run's record is published (orchestrator/cloudrecord.py)."""
    return RunObjects(ctx.clients.storage, ctx.settings.bucket, ctx.dep.run_id)


def left_behind(ctx: Context, inside: str) -> list[str]:
    """What of the run its teardown could not confirm gone, besides the VM `inside` (the state keeps a VM or rule
    until the API no longer lists it)."""
    vms = [gcp(n).vm.name for n in ctx.dep.nodes if gcp(n).vm.name != inside]
    trainers = [vm.name for vm in ctx.state.trainer_vms.values() if vm.name != inside and vm.name not in vms]
    return vms + trainers + [f"firewall rule {rule.name}" for rule in ctx.state.firewalls]


def delete_self(ctx: Context, inside: str) -> None:
    """The supervisor's last act, after the run's record is published: delete the VM it runs on, which ends this
    process. Not while anything else of the run is left: GcpError says what, and the VM stays; this process ends,
    its heartbeat with it, and every VM of the run, this one too, deletes itself (watchdog.py)."""
    left = left_behind(ctx, inside)
    if left:
        raise GcpError(f"the run's teardown could not delete {', '.join(left[:10])}{' ...' if len(left) > 10 else ''}; "
                       f"its supervisor left its own VM {inside} too. Its VMs delete themselves once the supervisor "
                       f"has been gone gcp.heartbeat_limit_s ({ctx.settings.heartbeat_limit_s:.0f} s); "
                       f"`dsctl down {ctx.dep.run_id}` deletes whatever is left.")
    op = compute.delete(ctx.clients, inside)
    if op is not None:
        operations.wait(ctx.clients, op, doing=f"deleting VM {inside}", timeout_s=300)
