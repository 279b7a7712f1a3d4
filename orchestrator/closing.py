"""Closing the records a deployment's removal interrupts: the run's own, from what its trainers wrote for
themselves (reconcile.py), and a sweep's with its points.

`dsctl down` calls it after the teardown (takedown.py): a record still "running" has lost the `dsctl up` or
`dsctl sweep` that would have written how it ended, and is closed here from what is left on disk.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from dsctl.provisioners import Deployment

from . import endings, reconcile
from .home import remedy
from .placements import placement_fields
from .pricing import cost_summary
from .records import RunRecord, SweepPoint
from .store import RunStore, StoreError
from .summary import summarize_run


def close_records(store: RunStore, dep: Deployment, *, monitor_gone: bool = False,
                  attached_sweep: str | None = None, teardown: list[tuple[str, str]] | None = None) -> None:
    """After `dep` was taken down: every record still "running" that it ended is closed, the run's own from what
    its trainers wrote (reconcile.py), a sweep's with the points it had measured, each point still being measured
    as interrupted; what its teardown said (`teardown`: kind, message) among the run's events. StoreError if the
    records could not be written now."""
    record = exact_record(store, dep.run_id)
    if record is not None and record.status == "running":
        if record.kind == "sweep":
            close_sweep(store, record)
        else:
            close_run(store, record, dep, monitor_gone)
    close_points(store, dep.run_id)
    if attached_sweep is not None:
        sweep = exact_record(store, attached_sweep)
        if sweep is not None and sweep.status == "running":
            close_sweep(store, sweep, f"the deployment it was measuring on (run {dep.run_id}) was removed by dsctl down")
        close_points(store, attached_sweep)
    for kind, message in teardown or []:
        store.add_event(dep.run_id, kind, message)
    store.add_event(dep.run_id, "down", "deployment removed by dsctl down")
    keep_record(store, dep.run_dir, dep.run_id)


def keep_record(store: RunStore, run_dir: str, run_id: str) -> None:
    """Make sure what was just written reaches runs.db, or is kept in the run dir for the next command to add
    (store.keep_unwritten); StoreError saying where it went when it could not be written now."""
    try:
        kept = store.keep_unwritten(run_dir, wait_s=10.0)
    except OSError as exc:
        raise StoreError(f"its record could not be written to {store.path} ({store.last_error}) nor kept in "
                         f"{run_dir} ({exc.strerror}): {remedy(exc, run_dir)}, then `dsctl down {run_id}` "
                         "again records how it ended.") from None
    if kept is not None:
        raise StoreError(f"{store.path} would not take its record ({store.last_error}); it is kept in {kept} and the "
                         "next dsctl command adds it.")


def exact_record(store: RunStore, run_id: str) -> RunRecord | None:
    """The record of exactly this run (store.get also takes a prefix)."""
    record = store.get(run_id)
    return record if record is not None and record.id == run_id else None


def close_run(store: RunStore, record: RunRecord, dep: Deployment, monitor_gone: bool, by: str = "dsctl down") -> None:
    """A job whose `dsctl up` is gone, closed from its trainers' own metrics files: its status is what they say,
    its summary made from their end records and every window they wrote (the ones runs.db never got are added).
    `by`: the command closing it (`dsctl down`, or `dsctl runs import` for a record rebuilt from its files)."""
    run_dir = record.run_dir or dep.run_dir
    files = reconcile.read_trainer_files(run_dir)
    left = reconcile.left_outcome(run_dir)  # what dsctl up saw and could not record (a full disk)
    stored = store.windows(record.id)
    seen = {reconcile.window_key(w) for w in stored}
    missed = [w for w in files.windows if reconcile.window_key(w) not in seen]
    for w in missed:
        store.add_window(record.id, w, record.workers)
    for index, end in files.ends.items():
        store.set_trainer_result(record.id, index, end)
    results = {**store.trainer_results(record.id), **files.ends}
    windows = sorted(stored + [{**w, "metrics": w.get("metrics") or None} for w in missed],
                     key=lambda w: (w["trainer"], w.get("t_end") or 0.0))
    utilization = store.utilization(record.id)
    # What was measured ends with the last thing the trainers wrote or the last sample stored, not at `dsctl down`.
    ended = (left or {}).get("ended_at") or max([u["t"] for u in utilization] + [files.last_wall or 0.0]) or time.time()
    summary = summarize_run(results, windows, utilization, record.created_at, ended, files.first_batch_wall,
                            files.measured_from_wall)
    owner = (f"the detached dsctl up that monitored it (pid {dep.monitor.pid}) was gone"
             if monitor_gone and dep.monitor is not None else "dsctl up had not recorded how it ended")
    said = files.describe(record.trainers)
    if left is not None:
        status, error = left["status"], left.get("error")
        kind, message = "unrecorded", (f"dsctl up saw the run end ({status}) but could not record it "
                                       f"({left.get('why', 'its disk was full')}); {by} recorded it from "
                                       f"{Path(run_dir) / reconcile.ENDED}")
    else:
        verdict = endings.judge([endings.Trainer(i, None, files.ends.get(i), files.errors.get(i))
                                 for i in range(record.trainers)], record.trainers, _steps(record),
                                endings.down_requested(run_dir))
        status, error = verdict.status, verdict.message
        if status == "interrupted":
            error = (f"{owner} when dsctl down removed the run, which stopped what was left: {said}" if by == "dsctl down"
                     else f"{owner}; its trainers' own files say: {said}")
            full = reconcile.logs_say_full(run_dir)
            if full is not None:
                error += f"; {full} says its disk was full ({reconcile.FULL_DISK_TEXT})"
    if left is None:
        kind = "monitor-gone" if monitor_gone else "unrecorded"
        message = (f"{owner}; {by} recorded the run {status} from "
                   + (f"its trainers' own metrics files in {Path(run_dir) / 'metrics'}: {said}" if files.trainers
                      else "the windows stored before (its trainers wrote no metrics files)"))
    summary = summary.updated(**placement_fields(files.placements, summary, record.workers, record.trainers))
    summary.recorded_by = message
    summary.cost = cost_summary(replace(record, status=status, error=error, summary=summary))
    store.update_run(record.id, status=status, ended_at=ended, error=error, summary=summary)
    store.add_event(record.id, kind, message)
    reconcile.forget_outcome(run_dir)


def _steps(record: RunRecord) -> int | None:
    """The job's trainer.steps, from the spec it was recorded with."""
    try:
        steps = json.loads(record.spec_json)["trainer"].get("steps")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return steps if isinstance(steps, int) else None


def close_points(store: RunStore, sweep_id: str, why: str | None = None, event: str = "down") -> None:
    """The sweep's points still being measured when it ended (its deployment removed by `dsctl down`, or the sweep
    itself stopped by a signal): interrupted, summarized from their stored windows."""
    why = why or f"the deployment of sweep {sweep_id} was removed by dsctl down"
    for point in store.list(kinds=("point",), parent_id=sweep_id):
        if point.status != "running":
            continue
        utilization, windows = store.utilization(point.id), store.windows(point.id)
        ended = max((u["t"] for u in utilization), default=time.time())
        summary = summarize_run({}, windows, utilization, point.created_at, max(ended, point.created_at))
        error = f"interrupted: {why} before this point's measurement ended"
        summary.cost = cost_summary(replace(point, status="interrupted", error=error, summary=summary))
        store.update_run(point.id, status="interrupted", ended_at=time.time(), error=error, summary=summary)
        store.add_event(point.id, event, error)


def close_sweep(store: RunStore, sweep: RunRecord, why: str = "its deployment was removed by dsctl down") -> None:
    """A sweep whose `dsctl sweep` had not recorded its end: interrupted, with the points it had finished."""
    done = [p for p in store.list(kinds=("point",), parent_id=sweep.id) if p.status == "succeeded"]
    points = [SweepPoint(workers=p.workers, run_id=p.id, mode=p.mode, predicted=False, source="measured here",
                         batches_per_s=p.job.batches_per_s, input_stall_frac=p.job.input_stall_frac)
              for p in sorted(done, key=lambda p: p.created_at) if p.mode == "service"]
    error = f"{why} before dsctl sweep recorded how it ended; {len(points)} point(s) had been measured"
    summary = sweep.sweep.updated(points=points, recorded_by=f"dsctl down: {why}")
    store.update_run(sweep.id, status="interrupted", ended_at=time.time(), error=error, summary=summary)
    store.add_event(sweep.id, "down", error)
