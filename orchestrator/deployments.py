"""Find deployments that are still up (from their state files) and take them down.

This works from a fresh process: it needs only the state files that `dsctl up`
writes as it starts each process, so it cleans up after a killed `dsctl up`.
A state file that cannot be read (cut short by a crash, garbled) does not hide a
deployment: its processes are found by their command line, which names the run
dir for every process dsctl starts (the launcher, what it forks, a detached monitor).
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import replace
from pathlib import Path

from dsctl.provisioners import Deployment, Node, get_provisioner
from dsctl.provisioners.contract import STATE_FILE
from dsctl.provisioners.local.processes import is_ours, stop_groups

from . import cloudruns
from . import store as records
from .pricing import cost_summary
from .store import RunStore, StoreError, dsctl_home
from .summary import summarize_run


UNREADABLE = "state unreadable"  # the status of a deployment rebuilt from its processes


def active_deployments() -> list[Deployment]:
    """Deployments whose state is not 'down', newest first; unreadable ones with live processes too."""
    runs = dsctl_home() / "runs"
    out = []
    for state in sorted(runs.glob(f"*/{STATE_FILE}"), key=lambda p: p.stat().st_mtime, reverse=True):
        dep = load_or_recover(state.parent)
        if dep.status == UNREADABLE and not dep.nodes:
            continue  # nothing of it runs: nothing to take down
        if dep.status != "down":
            out.append(dep)
    return out


def load_or_recover(run_dir: Path) -> Deployment:
    """The deployment in `run_dir`'s state file or, if that cannot be read, one rebuilt from its processes."""
    try:
        return Deployment.load(run_dir)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return recovered(run_dir)


def recovered(run_dir: Path) -> Deployment:
    """Every live process whose command line names `run_dir`, as nodes `down` can stop (pid and start time)."""
    import psutil

    run_dir = Path(run_dir)
    needles = {str(run_dir), str(run_dir.resolve())}
    nodes = []
    for proc in psutil.process_iter(["pid", "cmdline", "create_time", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if not any(n in cmd for n in needles) or proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            nodes.append(Node(role="stray", index=len(nodes), pid=proc.pid, pgid=os.getpgid(proc.pid),
                              create_time=proc.info["create_time"]))
        except (psutil.Error, OSError):
            continue
    return Deployment(run_id=run_dir.name, provider="unknown", run_dir=str(run_dir), status=UNREADABLE, nodes=nodes)


def live_nodes(dep: Deployment) -> int:
    return sum(1 for n in dep.nodes if is_ours(n))


def take_down(dep: Deployment, store: RunStore | None = None) -> None:
    """Stop the deployment's monitor (if detached), then everything it holds; then close its record.

    Teardown comes first, and what cannot be written after it (its state or record on a full disk, a runs.db
    that is locked or cannot be opened) stops neither it nor the next deployment's: the user is told how to
    finish it (records.on_notice)."""
    monitors = dep.by_role("monitor")
    if monitors:
        stop_groups(monitors, grace_s=20.0)  # a detached monitor tears down its own deployment on SIGTERM
        dep = Deployment.load(dep.run_dir)
    if dep.status == UNREADABLE:
        stop_groups(dep.nodes)
    else:
        provisioner = get_provisioner(dep.provider)
        if cloudruns.supervised(dep):
            # Its supervisor tears it down and records why; whatever it leaves is deleted below either way.
            try:
                store = store or RunStore()
                cloudruns.stop(store, provisioner.run_objects(dep), dep.run_id, "dsctl down")
            except Exception:  # noqa: BLE001 - the record is a convenience; deleting the VMs is not
                pass
        try:
            provisioner.down(dep, lambda kind, msg: None)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            records.on_notice(f"run {dep.run_id} is down, but its state in {dep.run_dir} could not be written "
                              f"({exc.strerror}): free some space there, then `dsctl down {dep.run_id}` again "
                              "records how it ended.")
            return
    try:
        _close_record(store or RunStore(), dep)
    except StoreError as exc:
        records.on_notice(f"run {dep.run_id} is down, but {exc}")


def _close_record(store: RunStore, dep: Deployment) -> None:
    """A run still recorded as running has lost its `dsctl up`: mark it, with a summary rebuilt from what was
    stored. StoreError if the record could not be written now."""
    record = store.get(dep.run_id)
    if record and record.status == "running":
        utilization = store.utilization(record.id)
        # What was measured ends with the last sample stored, not when `dsctl down` came.
        ended = max((u["t"] for u in utilization), default=time.time())
        summary = summarize_run(store.trainer_results(record.id), store.windows(record.id), utilization,
                                record.created_at, ended)
        error = ("dsctl up did not record how the run ended (it was killed, or the records could not be written); "
                 "removed by dsctl down")
        summary["cost"] = cost_summary(replace(record, status="interrupted", error=error, summary=summary))
        store.update_run(record.id, status="interrupted", ended_at=time.time(), error=error, summary=summary)
    store.add_event(dep.run_id, "down", "deployment removed by dsctl down")
    try:
        kept = store.keep_unwritten(dep.run_dir, wait_s=10.0)
    except OSError as exc:
        raise StoreError(f"its record could not be written to {store.path} ({store.last_error}) nor kept in "
                         f"{dep.run_dir} ({exc.strerror}): free some space there, then `dsctl down {dep.run_id}` "
                         "again records how it ended.") from None
    if kept is not None:
        raise StoreError(f"{store.path} would not take its record ({store.last_error}); it is kept in {kept} and the "
                         "next dsctl command adds it.")


def find(run_id: str) -> Deployment | None:
    run_dir = dsctl_home() / "runs" / run_id
    if (run_dir / STATE_FILE).exists():
        return load_or_recover(run_dir)
    matches = [d for d in active_deployments() if d.run_id.startswith(run_id)]
    return matches[0] if len(matches) == 1 else None


def exists(run_id: str) -> bool:
    return (dsctl_home() / "runs" / run_id).exists() or Path(run_id).exists()
