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

import time
from pathlib import Path

from dsctl.specs import SpecError
from dsctl.specs.schema import GcpSpec, JobSpec

from ..contract import EventSink, HandOffLimits
from . import compute, operations, preflight, remote, serviceaccount, stage
from .context import Context
from .errors import GcpError, RemoteError
from .state import RemoteProcess, gcp
from .storage import RunObjects
from .watch import Watched


def _gcp(spec: JobSpec) -> GcpSpec:
    return spec.gcp or GcpSpec()


def hands_off(spec: JobSpec, mode: str) -> bool:
    """A run through the service is supervised on its dispatcher VM unless the spec says gcp.supervisor: here."""
    return mode == "service" and _gcp(spec).supervisor == "vm"


def limits(spec: JobSpec) -> HandOffLimits:
    g = _gcp(spec)
    return HandOffLimits(max_duration_s=g.max_duration_s, outage_limit_s=g.outage_limit_s)


def detaching(spec: JobSpec) -> SpecError | None:
    if _gcp(spec).supervisor != "vm":
        return SpecError("a detached run is supervised by its dispatcher VM; with gcp.supervisor: here, run it "
                         "attached (without --detach).", field="gcp.supervisor")
    return None


def hand_off(ctx: Context, files: dict[str, bytes], base_dir: Path, events: EventSink) -> None:
    """Start the run's supervisor on the dispatcher VM with `files` (name -> contents) in its run dir, and stop
    watching the VMs from here. The spec and the user's code (base_dir) go to Cloud Storage first, from here."""
    s, dep, state = ctx.settings, ctx.dep, ctx.state
    spec = JobSpec.model_validate_json(files["spec.json"])
    state.trainer_files = stage.trainer_files(ctx, spec, Path(dep.run_dir) / "spec.json", base_dir)
    if ctx.watcher is not None:
        ctx.watcher.stop()
        ctx.watcher = None
    disp = gcp(dep.by_role("dispatcher")[0]).vm
    base = f"{disp.dir}/supervisor"
    run_dir = f"{base}/home/runs/{dep.run_id}"
    dep.save()
    bundle = {f"{run_dir}/{name}": (data, 0o600) for name, data in files.items()}
    bundle[f"{run_dir}/state.json"] = ((Path(dep.run_dir) / "state.json").read_bytes(), 0o600)
    ctx.ssh.put(disp.ssh_host, bundle)
    env = {"DSCTL_HOME": f"{base}/home", **s.endpoint_environment()}
    res = ctx.ssh.run(disp.ssh_host, remote.launch(remote.Layout(base), s.python, "dsctl.cli.main", ["supervise", run_dir],
                                               env), doing="starting the run's supervisor")
    if res.code != 0:
        raise RemoteError(f"could not start the run's supervisor on {disp.name}: "
                          f"{(res.stderr or res.stdout).strip()[-300:]}")
    pid, start = remote.parse_launch(res.stdout)
    state.supervisor = RemoteProcess(instance=disp.name, host=disp.ssh_host, dir=base, remote_pid=pid, start_time=start)
    ctx.save()
    events("handed-over", f"the run is supervised on its dispatcher VM {disp.name} from now on")


def supervisor_status(ctx: Context) -> str:
    """'running', 'exited (code N)', or why it is not known; one SSH command to the dispatcher VM."""
    sup = ctx.state.supervisor
    if sup is None:
        return "no supervisor"
    if not ctx.has_ssh:
        return "unknown (the run has no SSH key here)"
    try:
        res = ctx.ssh.run(sup.host, remote.status([sup.dir]), doing="checking the supervisor", timeout=30)
    except RemoteError as exc:
        return f"unknown ({exc})"
    st = remote.parse_status(res.stdout, time.monotonic()).get(sup.dir)
    if st is None:
        return "unknown"
    return "running" if st.running(sup.start_time) else f"exited (code {st.exit_code})"


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


def check_supervisor(ctx: Context, spec: JobSpec) -> None:
    """On the dispatcher VM, before touching anything: may this VM's service account do what a supervisor does?
    Raises GcpError naming what it lacks and how to grant it (the user's machine then deletes the run)."""
    s = ctx.settings
    missing = preflight.missing_permissions(ctx.clients, preflight.supervisor_permissions(spec, s.public_ips),
                                            "checking the dispatcher VM's permissions")
    if missing:
        sa = s.service_account or "the project's default compute service account"
        roles = serviceaccount.roles_for(spec)
        grant = (f" ({serviceaccount.grant_commands(s.project, s.service_account, roles)})"
                 if s.service_account and s.service_account != "none" else "")
        raise GcpError(
            f"the run's supervisor on the dispatcher VM runs as the VMs' service account ({sa}), which lacks "
            f"{len(missing)} permission(s) it needs on project {s.project}: {', '.join(missing[:8])}"
            f"{' ...' if len(missing) > 8 else ''}. Grant that account {', '.join(r.name for r in roles)}{grant}, "
            "or set gcp.supervisor: here to supervise the run from this machine (dsctl up only, no --detach).")


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
