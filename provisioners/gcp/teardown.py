"""`down`: everything of the run stopped, brought home and deleted, and confirmed gone.

Trainers are stopped first (they hang if their workers vanish), then the servers; their logs
come home over SSH. Then every VM and firewall rule in the state is deleted in parallel, each
forgotten only once the API no longer lists it, and whatever else carries the run's label is
swept up. Billing resources gone, the bookkeeping follows: a copy of the results in Cloud
Storage, the run's staging objects deleted, the run's SSH key deleted from OS Login. A run's
supervisor on the cloud runs this too, but keeps its own VM for last (handoff.delete_self).
"""

from __future__ import annotations

import time
from pathlib import Path

from ..contract import EventSink
from . import processes, vms
from .context import Context
from .state import gcp
from .storage import Staging
from .threads import relay


def down(ctx: Context, events: EventSink, keep: str | None = None) -> None:
    """Remove everything the deployment holds but the VM named `keep` (the one this process runs on, if any)."""
    dep = ctx.dep
    events = relay(events)
    ctx.cancel.set()  # anything still waiting on the way up stops
    if ctx.watcher is not None:
        ctx.watcher.stop()
    vms.restore_trainer_nodes(dep, 10**6)  # trainer VMs the orchestrator no longer lists are still ours
    machines = [n for n in dep.nodes if n.role in ("trainer", "worker", "dispatcher")]
    t0 = time.monotonic()
    if ctx.has_ssh:
        try:
            processes.stop(ctx, [n for n in machines if n.role == "trainer"], grace_s=5.0)
            processes.stop(ctx, [n for n in machines if n.role != "trainer"], grace_s=8.0)
            processes.collect_logs(ctx, machines)
        except Exception as exc:  # best effort: the VMs are deleted below either way
            events("cloud", f"stopping processes: {exc}")
        ctx.ssh.close()
    vms.delete(ctx, [n for n in machines if gcp(n).vm.name != keep], events, firewalls=True)
    found = ctx.fleet(events, cancellable=False).sweep(keep={keep} if keep else set())
    events.flush()
    try:
        staging = Staging(ctx.clients, dep.run_id)
        if ctx.state.staged or any(gcp(n).remote_pid for n in machines):
            staging.collect(Path(dep.run_dir))
            left = staging.delete_staging()
            if left:
                events("cloud", f"{len(left)} staging object(s) could not be deleted: {', '.join(left[:3])}")
    except Exception as exc:  # keeping a copy in GCS is a convenience; deleting VMs was not
        events("cloud", f"copying metrics and logs to Cloud Storage, or deleting the staging objects, failed: {exc}")
    try:
        ctx.sign_out()
    except Exception as exc:  # the key expires on its own (oslogin.KEY_MARGIN_S after the run's limit)
        events("cloud", f"deleting the run's SSH key from OS Login failed (it expires on its own): {exc}")
    dep.status = "down"
    ctx.save()
    also = f"; also removed {found.summary()} found by label" if not found.empty else ""
    events("down", f"all Google Cloud resources of the run deleted in {time.monotonic() - t0:.1f} s{also}")
