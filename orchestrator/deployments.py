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
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import cast

from dsctl.provisioners import (
    STATE_FILE,
    Deployment,
    FindsByLabel,
    HandsOff,
    Node,
    RunObjects,
    Where,
    get_provider,
    providers_with,
)
from dsctl.provisioners.processes import is_ours, stop_groups
from dsctl.specs import LoadedSpec, SpecError

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
    nodes: list[Node] = []
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


def handed_off(dep: Deployment) -> bool:
    """Whether the deployment's run is supervised on the cloud (its record then comes from there)."""
    if dep.status == UNREADABLE:
        return False
    provider = get_provider(dep.provider)
    return isinstance(provider, HandsOff) and provider.handed_off(dep)


def take_down(dep: Deployment, store: RunStore | None = None) -> None:
    """Stop the deployment's monitor (if detached), then everything it holds; then close its record.

    Teardown comes first, and what cannot be written after it (its state or record on a full disk, a runs.db
    that is locked or cannot be opened) stops neither it nor the next deployment's: the user is told how to
    finish it (a notice, store.notices)."""
    if dep.monitor is not None:
        stop_groups([dep.monitor], grace_s=20.0)  # a detached monitor tears down its own deployment on SIGTERM
        dep = Deployment.load(dep.run_dir)
    if dep.status == UNREADABLE:
        stop_groups(dep.nodes)
    else:
        provisioner = get_provider(dep.provider)
        if isinstance(provisioner, HandsOff) and provisioner.handed_off(dep):
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
            records.notices.warning(f"run {dep.run_id} is down, but its state in {dep.run_dir} could not be written "
                              f"({exc.strerror}): free some space there, then `dsctl down {dep.run_id}` again "
                              "records how it ended.")
            return
    try:
        _close_record(store or RunStore(), dep)
    except StoreError as exc:
        records.notices.warning(f"run {dep.run_id} is down, but {exc}")


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


# -- runs supervised on the cloud, and runs with no local state ---------------------------------------------------

def status_rows() -> tuple[list[dict], list[Deployment]]:
    """What `dsctl status` shows: a row per deployment that is up (a run supervised on the cloud as its supervisor
    last published it; one found ended is taken off the list), and the deployments whose state is unreadable."""
    rows, unreadable = [], []
    for d in active_deployments():
        row = {"run": d.run_id, "provider": d.provider, "status": d.status, "dispatcher": d.dispatcher_address,
               "workers": len(d.by_role("worker")), "trainers": len(d.by_role("trainer")), "live_processes": live_nodes(d)}
        if handed_off(d):
            latest = cloudruns.refresh(RunStore(), d) or {}
            if cloudruns.ended(latest):
                continue
            p = latest.get("progress") or {}
            age = time.time() - latest["written_at"] if latest.get("written_at") else None
            row.update(status=f"supervised on the cloud: {p.get('phase', 'starting')}", workers=p.get("workers"),
                       batches=p.get("batches"), heard_from=None if age is None else f"{age:.0f} s ago",
                       live_processes="-")
        rows.append(row)
        if d.status == UNREADABLE:
            unreadable.append(d)
    return rows, unreadable


def _finder(where: Where) -> FindsByLabel | None:
    """The provider whose resources `where` (or the environment) names a place to look in, if any."""
    finders = cast("list[FindsByLabel]", providers_with(FindsByLabel))  # the providers that are FindsByLabel
    return next((p for p in finders if p.looks_there(where)), None)


def record_objects(run: str, where: Where) -> tuple[RunObjects | None, Deployment | None]:
    """Where a run supervised on the cloud publishes its record: from its local state (with it), or found by its id
    in `where` when this machine has none; (None, None) for any other run."""
    dep = find(run)
    if dep is not None and handed_off(dep):
        provider = get_provider(dep.provider)
        assert isinstance(provider, HandsOff)
        return provider.run_objects(dep), dep
    finder = _finder(where) if where.project or where.bucket else None
    return (finder.run_objects_by_label(run, where), None) if finder is not None else (None, None)


def sync_record(store: RunStore, run: str, where: Where) -> None:
    """A run supervised on the cloud: its record here brought up to date from what its supervisor published."""
    objects, dep = record_objects(run, where)
    if dep is not None:
        cloudruns.refresh(store, dep)
    elif objects is not None and cloudruns.sync(store, objects, run) is None:
        raise SpecError(f"run '{run}' has published no record in that project's bucket; check --project and --bucket.")


def down_by_label(run: str, where: Where, say: Callable[[str], None]) -> None:
    """`dsctl down RUN` with no local state for RUN: its resources still carry its name. A run supervised on the
    cloud is asked to stop first, so its record says how it ended (and this machine gets a copy)."""
    finder = _finder(where)
    if finder is None:
        raise SpecError(f"no deployment found for run '{run}' on this machine; `dsctl status` lists the ones that are "
                        "up. For a Google Cloud run whose local state is gone, add --project P --zone Z to find it by "
                        "label.")
    latest = cloudruns.stop(RunStore(), finder.run_objects_by_label(run, where), run, "dsctl down")
    if latest is not None:
        say(f"{run}: its supervisor recorded it {latest['run']['status']}")
    say(f"{run}: {finder.down_by_label(run, where, log=say)}")


def detached_target() -> tuple[Deployment, LoadedSpec]:
    """The deployment `dsctl up --detach` left running, and its spec, for `dsctl sweep` without a spec; whether it
    can take a sweep now is for the sweep to say (AttachedDeployment.claim), so one still running its job is named,
    not missed."""
    from .preflight import load_job

    detached = [d for d in active_deployments() if d.monitor is not None]
    if not detached:
        raise SpecError("no deployment is up to sweep. Start one with `dsctl up JOB.yaml --detach`, "
                        "or name a spec: `dsctl sweep JOB.yaml --workers 1..8`.")
    if len(detached) > 1:
        raise SpecError(f"{len(detached)} deployments are up ({', '.join(d.run_id for d in detached)}); "
                        "name the spec to sweep, or take the others down with `dsctl down RUN`.")
    dep = detached[0]
    record = RunStore().get(dep.run_id)
    spec_path = Path(record.spec_path) if record and record.spec_path and Path(record.spec_path).exists() \
        else Path(dep.run_dir) / "spec.yaml"
    return dep, load_job(spec_path)
