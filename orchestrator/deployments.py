"""Find deployments that are still up (from their state files) and take them down.

This works from a fresh process: it needs only the state files that `dsctl up`
writes as it starts each process, so it cleans up after a killed `dsctl up`.
"""

from __future__ import annotations

import time
from pathlib import Path

from dsctl.provisioners import Deployment, get_provisioner
from dsctl.provisioners.contract import STATE_FILE
from dsctl.provisioners.local.processes import is_ours, stop_groups

from .store import RunStore, dsctl_home


def active_deployments() -> list[Deployment]:
    """Deployments whose state is not 'down', newest first."""
    runs = dsctl_home() / "runs"
    out = []
    for state in sorted(runs.glob(f"*/{STATE_FILE}"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            dep = Deployment.load(state.parent)
        except (ValueError, TypeError, KeyError):
            continue
        if dep.status != "down":
            out.append(dep)
    return out


def live_nodes(dep: Deployment) -> int:
    return sum(1 for n in dep.nodes if is_ours(n))


def take_down(dep: Deployment, store: RunStore | None = None) -> None:
    """Stop the deployment's monitor (if detached), then everything it holds; mark the run."""
    monitors = dep.by_role("monitor")
    if monitors:
        stop_groups(monitors, grace_s=20.0)  # a detached monitor tears down its own deployment on SIGTERM
        dep = Deployment.load(dep.run_dir)
    get_provisioner(dep.provider).down(dep, lambda kind, msg: None)
    store = store or RunStore()
    record = store.get(dep.run_id)
    if record and record.status == "running":
        store.update_run(dep.run_id, status="interrupted", ended_at=time.time(),
                         error="dsctl up stopped before the run ended; removed by dsctl down")
    store.add_event(dep.run_id, "down", "deployment removed by dsctl down")


def find(run_id: str) -> Deployment | None:
    run_dir = dsctl_home() / "runs" / run_id
    if (run_dir / STATE_FILE).exists():
        return Deployment.load(run_dir)
    matches = [d for d in active_deployments() if d.run_id.startswith(run_id)]
    return matches[0] if len(matches) == 1 else None


def exists(run_id: str) -> bool:
    return (dsctl_home() / "runs" / run_id).exists() or Path(run_id).exists()
