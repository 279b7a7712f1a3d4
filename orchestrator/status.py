"""`dsctl status`: the deployments that are up, what each holds, and the TensorBoards serving; from state and metrics
files only, never the records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl.provisioners import Contents, Deployment, HandsOff, get_provider
from dsctl.provisioners.processes import is_ours

from . import boards, cloudrecord, cloudruns, reconcile
from .deployments import UNREADABLE, active_deployments, contents, handed_off, live_nodes
from .records import CloudProgress
from .store import RunStore


@dataclass
class StatusView:
    """What `dsctl status` shows: a row per deployment that is up, the deployments whose state is unreadable, those
    whose detached monitor is gone (with what their trainers' own files say), and the TensorBoards serving."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    unreadable: list[Deployment] = field(default_factory=list)
    unmonitored: list[dict[str, Any]] = field(default_factory=list)  # {"run", "pid", "trainers_say", "log"}
    tensorboards: list[dict[str, Any]] = field(default_factory=list)
    # (run, what its container holds) for each deployment whose container holds processes dsctl did not start
    # itself (daemons its processes started), which `dsctl down` ends with it.
    daemons: list[tuple[str, Contents]] = field(default_factory=list)


def trainers_say(run_dir: str | Path) -> str:
    """How far a run got, by its trainers' own metrics files (read whole, nothing written)."""
    files = reconcile.read_trainer_files(run_dir)
    if not files.trainers:
        return "no trainer has written metrics"
    ended = len(files.ends)
    if files.errors:
        index, err = min(files.errors.items())
        return f"trainer {index} failed ({reconcile.first_line(err.get('message'))})"
    if ended == len(files.trainers):
        reasons = ", ".join(sorted({str(e.get("reason")) for e in files.ends.values()}))
        return f"every trainer ended ({reasons}): {files.batches()} batches"
    return f"{files.batches()} batches so far; {ended} of {len(files.trainers)} trainer(s) ended"


def status_rows() -> StatusView:
    """What `dsctl status` shows: a row per deployment that is up (a run supervised on the cloud as its supervisor
    last published it; one found ended is taken off the list; one whose monitor is gone says so, and how far its
    trainers got by their own files; one on this machine, what its container holds, daemons named), and every
    TensorBoard `dsctl tensorboard` started that still serves. Reads state and metrics files only: never the
    records."""
    view = StatusView()
    for d in active_deployments():
        row = {"run": d.run_id, "provider": d.provider, "status": d.status, "dispatcher": d.dispatcher_address,
               "workers": len(d.by_role("worker")), "trainers": len(d.by_role("trainer")), "live_processes": live_nodes(d)}
        remote = handed_off(d)
        if remote:
            latest = cloudruns.refresh(RunStore(), d)
            left = _left_behind(d) if cloudruns.ended(latest) and d.status != "down" else None
            if cloudruns.ended(latest) and not left:
                continue
            if left:
                row.update(status="ended; its supervisor left resources behind", left_behind=left)
                view.rows.append(row)
                continue
            p = latest.progress if latest is not None else CloudProgress()
            age = time.time() - latest.written_at if latest is not None and latest.written_at else None
            row.update(status=f"supervised on the cloud: {p.phase or 'starting'}", workers=p.workers,
                       batches=p.batches, heard_from=None if age is None else f"{age:.0f} s ago", live_processes="-")
        elif d.monitor is not None and d.status != UNREADABLE:
            if is_ours(d.monitor):
                row["monitor"] = f"pid {d.monitor.pid}"
            else:
                said = trainers_say(d.run_dir)
                row.update(status=f"{d.status}, unsupervised", monitor=f"gone (pid {d.monitor.pid})", trainers_say=said)
                view.unmonitored.append({"run": d.run_id, "pid": d.monitor.pid, "trainers_say": said,
                                         "log": d.monitor.log})
        if not remote:
            _count_contents(view, row, d)
        view.rows.append(row)
        if d.status == UNREADABLE:
            view.unreadable.append(d)
    for board in boards.active_boards():
        view.tensorboards.append({"run": board.id, "kind": "tensorboard", "status": "serving", "url": board.private_url,
                                  "runs": ", ".join(board.runs), "pid": board.pid, "live_processes": 1})
    return view


def _count_contents(view: StatusView, row: dict, dep: Deployment) -> None:
    """The row's `processes` (all its container holds) and `other_processes` (those that are none of its known
    processes: daemons they started), and the deployment among the view's `daemons` when there are any."""
    held = contents(dep)
    if held is None:
        return
    row.update(processes=held.processes, other_processes=held.others)
    if held.others:
        view.daemons.append((dep.run_id, held))


def _left_behind(dep: Deployment) -> str | None:
    """What a supervised run's supervisor said it could not delete (cloudrecord.LEFT_BEHIND), if anything."""
    provider = get_provider(dep.provider)
    assert isinstance(provider, HandsOff)
    return cloudrecord.left_behind(provider.run_objects(dep))
