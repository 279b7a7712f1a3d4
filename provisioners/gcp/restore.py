"""What recovery.py reports from, and how it carries a restart out: the run's VMs as Compute Engine lists them, and a
stopped server VM brought back (started again, reached again, its server restarted at its old address) when the
supervisor (orchestrator/supervision.py) has its server restarted."""

from __future__ import annotations

import time

from ..state import Node
from . import compute, operations, processes, tpu, vms
from .context import Context
from .errors import CloudTimeout, RemoteError
from .naming import run_filter
from .state import gcp

STOPPED = ("TERMINATED", "STOPPED", "SUSPENDED")  # what Compute Engine can start again


def vm_statuses(ctx: Context) -> dict[str, str]:
    """Every VM of the run by name: Compute Engine instances, and TPU VMs if the run has any."""
    dep = ctx.dep
    out = {name: st for name, (st, _, _) in compute.statuses(ctx.clients, run_filter(dep.run_id)).items()}
    if any(gcp(n).vm.kind == "tpu" for n in dep.nodes):
        out.update({tpu.short_id(n): n.state.name for n in tpu.list_nodes(ctx.clients, dep.run_id)})
    return out


def bring_back(ctx: Context, node: Node) -> float:
    """Start a stopped worker's (or fault-tolerant dispatcher's) VM, reconnect, restart its process at its old
    port; returns when the VM was RUNNING again (monotonic). Runs in a background thread (recovery.py's)."""
    s, state = ctx.settings, gcp(node)
    name = state.vm.name
    if ctx.watcher is not None:
        ctx.watcher.forget((node.role, node.index))  # its process died with the VM
    deadline = time.monotonic() + s.running_timeout_s
    started = False
    while True:
        status, internal, external = compute.statuses(ctx.clients, run_filter(ctx.dep.run_id)).get(name, (None,) * 3)
        if status is None:
            raise RemoteError(f"VM {name} no longer exists")
        if status == "RUNNING" and started:
            break
        if status in STOPPED and not started:
            operations.wait(ctx.clients, compute.start(ctx.clients, name), doing=f"starting VM {name}",
                            timeout_s=s.running_timeout_s)
            started = True
        elif status == "RUNNING":
            started = True  # someone started it already
            continue
        if time.monotonic() > deadline:
            raise CloudTimeout(f"VM {name} did not run again within {s.running_timeout_s:.0f} s (status {status})")
        time.sleep(1.0)
    running_at = time.monotonic()
    if internal != state.vm.internal_ip:
        raise RemoteError(f"VM {name} came back with internal address {internal}, not {state.vm.internal_ip}; "
                          "the trainers' clients wait for the old one")
    old_host = state.vm.host
    with ctx.lock:
        state.vm.external_ip, state.vm.host, state.ready = external, external if s.public_ips else internal, False
    if old_host is not None:
        ctx.ssh.drop(old_host)
    vms.prepare(ctx, node)  # SSH answers; the startup script's marker is still there from its first boot
    if node.role == "dispatcher":
        processes.start_dispatcher(ctx, node)
    else:
        processes.start_worker(ctx, node)
    processes.wait_servers(ctx, [node])
    return running_at
