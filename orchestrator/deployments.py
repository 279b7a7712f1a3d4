"""Find deployments that are still up (from their state files) and take them down.

This works from a fresh process: it needs only the state files that `dsctl up`
writes as it starts each process, so it cleans up after a killed `dsctl up`.
A state file that cannot be read (cut short by a crash, garbled) does not hide a
deployment: it is rebuilt from what proves a process is the run's, its cgroup (found
by the run's name) and the processes dsctl started for it (each leads a session of
its own and runs one of dsctl's modules naming the run: the launcher, what it forks, a
detached monitor). A process that only names the run's folder (a script's `tail -f` of
its log) is said, and left alone; so is every process group dsctl did not make.

A run whose `dsctl up` (or detached monitor) is gone is closed from what its trainers wrote for themselves
(orchestrator/reconcile.py): teardown first, then its record says what the trainers say. Taking a deployment
down closes every record it interrupts: the run's, and a sweep's with its points.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from dsctl.providers import (
    STATE_FILE,
    Contains,
    Contents,
    Deployment,
    FindsByLabel,
    HandsOff,
    Node,
    RunObjects,
    Where,
    containment,
    get_provider,
    load_deployment,
    providers_with,
)
from dsctl.providers.containment import Containment
from dsctl.providers.processes import is_ours, run_processes, stop_groups
from dsctl.providers.state import DeploymentState, DeploymentStatus
from dsctl.specs import LoadedSpec, SpecError

from . import boards, closing, cloudrecord, cloudruns, endings, home, imports, reconcile
from . import store as records
from .home import dsctl_home
from .store import RunStore, StoreError

UNREADABLE: DeploymentStatus = "state unreadable"  # the status of a deployment rebuilt from its processes
NAME_MAX = 255  # bytes in one file name on the file systems dsctl runs on: a longer run id names no run dir
# What keeps `down` from writing a deployment's state once everything is stopped: said, not raised.
UNWRITABLE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


@dataclass
class Recovered(DeploymentState):
    """What a deployment whose state file cannot be read was rebuilt from: its cgroup, found by the run's name (the
    kernel's list of everything it started), and the processes that name its folder which dsctl cannot prove it
    started (said by `dsctl down` and `dsctl status`, never touched)."""

    container: Containment | None = None
    unidentified: list[str] = field(default_factory=list)


def active_deployments() -> list[Deployment]:
    """Deployments whose state is not 'down', newest first; unreadable ones of which something is left (a process
    dsctl started for it, its cgroup, even empty) too."""
    runs = dsctl_home() / "runs"
    out = []
    for state in sorted(runs.glob(f"*/{STATE_FILE}"), key=lambda p: p.stat().st_mtime, reverse=True):
        dep = load_or_recover(state.parent)
        if dep.status == UNREADABLE and not dep.nodes and containment.container_of(dep.state) is None:
            continue  # nothing of it is left: nothing to take down
        if dep.status != "down":
            out.append(dep)
    return out


def load_or_recover(run_dir: Path) -> Deployment:
    """The deployment in `run_dir`'s state file or, if that cannot be read, one rebuilt from its cgroup and processes."""
    try:
        return load_deployment(run_dir)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return recovered(run_dir)


def recovered(run_dir: Path) -> Deployment:
    """A deployment rebuilt without its state file: as nodes `down` can stop (pid and start time), the processes
    dsctl provably started for the run (processes.started_for_run); its cgroup, found by the run's name; and, said
    but never touched, the processes that only name its folder."""
    run_dir = Path(run_dir)
    found = run_processes({str(run_dir), str(run_dir.resolve())}, run_dir.name)
    nodes = [Node(role="stray", index=i, pid=p.pid, pgid=p.pgid, create_time=p.create_time)
             for i, p in enumerate(found.proved)]
    group = containment.find_run_cgroup(run_dir.name)
    state = Recovered(container=Containment(contained=True, cgroup=str(group.path)) if group is not None else None,
                      unidentified=found.unidentified)
    return Deployment(run_id=run_dir.name, provider="unknown", run_dir=str(run_dir), status=UNREADABLE, nodes=nodes,
                      state=state)


def rebuilt_from(dep: Deployment) -> str:
    """How an unreadable deployment was found, and what of it `down` leaves alone, as a clause for `down`/`status`."""
    assert isinstance(dep.state, Recovered), "for deployments rebuilt by recovered()"
    group = containment.container_of(dep.state)
    held = f"its cgroup {group.path} ({len(group.pids())} process(es) in it)" if group is not None else "no cgroup"
    said = f"rebuilt from {held} and {len(dep.nodes)} process(es) dsctl started for it (each leads a session of its " \
           "own and runs dsctl naming the run)"
    if dep.state.unidentified:
        said += (f"; left alone: {len(dep.state.unidentified)} process(es) that name its folder but that dsctl cannot "
                 f"prove it started: {'; '.join(dep.state.unidentified[:5])}")
    return said


def live_nodes(dep: Deployment) -> int:
    return sum(1 for n in dep.nodes if is_ours(n))


def handed_off(dep: Deployment) -> bool:
    """Whether the deployment's run is supervised on the cloud (its record then comes from there)."""
    if dep.status == UNREADABLE:
        return False
    provider = get_provider(dep.provider)
    return isinstance(provider, HandsOff) and provider.handed_off(dep)


def take_down(dep: Deployment, store: RunStore | None = None) -> list[tuple[str, str]]:
    """Stop the deployment's monitor (if detached), then everything it holds; then close every record it
    interrupts (its run's, a sweep's and its points', a sweep's that was measuring on it).

    Teardown comes first, and what cannot be written after it (its state or record on a full or read-only disk, a
    runs.db that is locked or cannot be opened) stops neither it nor the next deployment's: the user is told how
    to finish it (a notice, store.notices). Returns what the provider's teardown said (kind, message): they are the
    run's events too (a `strays-stopped`: daemons its cgroup still held, ended with it)."""
    said: list[tuple[str, str]] = []
    endings.request_down(dep.run_dir)  # first: whatever fails from here on in a `dsctl up` still running is ours
    monitor_gone = dep.monitor is not None and not is_ours(dep.monitor)
    attached_sweep = _sweep_on(dep)  # read before the deployment goes: who was measuring on it
    if dep.monitor is not None:
        stop_groups([dep.monitor], grace_s=20.0)  # a detached monitor tears down its own deployment on SIGTERM
        dep = load_deployment(dep.run_dir)
    if dep.status == UNREADABLE:
        stop_groups(dep.nodes)
        # Its cgroup's path was in the state file: found by the run's name, and ended with what is left in it
        # (daemons whose command line names no run dir), then removed, empty or not. A process stuck in the kernel:
        # the next `down` tries again.
        group = containment.container_of(dep.state)
        if group is not None:
            try:
                group.end(grace_s=containment.STRAY_GRACE_S)
            except (OSError, TimeoutError) as exc:
                home.notices.warning(f"run {dep.run_id}: its cgroup {group.path} could not be ended ({exc}); "
                                        f"`dsctl down {dep.run_id}` tries again")
    else:
        provider = get_provider(dep.provider)
        if isinstance(provider, HandsOff) and provider.handed_off(dep):
            # Its supervisor tears it down and records why; whatever it leaves is deleted below either way.
            try:
                store = store or RunStore()
                cloudruns.stop(store, provider.run_objects(dep), dep.run_id, "dsctl down",
                               supervising=lambda: provider.supervisor_status(dep) == "running")
            except Exception:  # noqa: BLE001 - the record is a convenience; deleting the VMs is not
                pass
        try:
            provider.down(dep, lambda kind, msg: said.append((kind, msg)))
        except OSError as exc:
            if exc.errno not in UNWRITABLE:
                raise
            home.notices.warning(f"run {dep.run_id} is down, but its state in {dep.run_dir} could not be written "
                                    f"({exc.strerror}): {home.remedy(exc, dep.run_dir)}, then `dsctl down {dep.run_id}` "
                                    "again records how it ended.")
            return said
    try:
        store = store or RunStore()
        imports.rebuild_missing(store, dep)  # a record gone with a removed runs.db: rebuilt from the run's files first
        closing.close_records(store, dep, monitor_gone=monitor_gone, attached_sweep=attached_sweep,
                              teardown=[(k, m) for k, m in said if k != "down"])
    except StoreError as exc:
        home.notices.warning(f"run {dep.run_id} is down, but {exc}")
    return said


def _sweep_on(dep: Deployment) -> str | None:
    """The sweep that holds (or held, and died holding) this detached deployment, from its sweep lock's holder."""
    from dsctl.runtime.readiness import read_json

    from .control import HOLDER_FILE, control_dir

    holder = read_json(control_dir(dep.run_dir) / HOLDER_FILE) if dep.monitor is not None else None
    sweep = (holder or {}).get("sweep")
    return sweep if isinstance(sweep, str) else None


def _named_run_dir(run_id: str) -> Path | None:
    """The folder `run_id` names under DSCTL_HOME/runs, or None when it can name none: too long for a file name,
    a path rather than a name."""
    if not run_id or run_id in (".", "..") or "/" in run_id or "\0" in run_id or len(os.fsencode(run_id)) > NAME_MAX:
        return None
    return dsctl_home() / "runs" / run_id


def find(run_id: str) -> Deployment | None:
    """The deployment of a run: its own (by id or a unique prefix), or for a sweep's point the one of the sweep it
    was measured on."""
    run_dir = _named_run_dir(run_id)
    try:
        if run_dir is not None and (run_dir / STATE_FILE).exists():
            return load_or_recover(run_dir)
    except OSError:
        pass  # a name this file system cannot hold: no state of its own
    matches = [d for d in active_deployments() if d.run_id.startswith(run_id)]
    if len(matches) > 1:
        raise records.AmbiguousRun(run_id, [d.run_id for d in matches], "deployments that are up")
    return matches[0] if matches else _host_of(run_id)


def _host_of(run_id: str) -> Deployment | None:
    """A recorded run with no deployment of its own (a sweep's point) that was measured on another's: that one."""
    if _named_run_dir(run_id) is None:
        return None
    try:
        store = RunStore()
        record = store.find(run_id)
        store.close()
    except StoreError:
        return None
    if record is None or not record.run_dir or Path(record.run_dir).name == record.id:
        return None
    try:
        if not (Path(record.run_dir) / STATE_FILE).exists():
            return None
    except OSError:
        return None
    host = load_or_recover(Path(record.run_dir))
    return host if host.status != "down" else None  # already down: the point's record alone (close_unhosted)


def close_unhosted(run_id: str) -> str | None:
    """`dsctl down POINT` for a point whose sweep's deployment is gone, or never had one of its own (a sweep on a
    detached deployment): its record, and its sweep's, closed as interrupted unless a sweep still measures it.
    What was done, or None if `run_id` is no such run."""
    if _named_run_dir(run_id) is None:
        return None
    store = RunStore()
    record = store.find(run_id)
    if record is None or record.kind != "point" or not record.parent_id:
        return None
    if record.status != "running":
        return f"{record.id}: nothing to take down (its record says {record.status})"
    holders = [d for d in active_deployments() if _sweep_on(d) == record.parent_id and _sweep_alive(d)]
    if holders:
        raise SpecError(f"point {record.id} is being measured right now by sweep {record.parent_id} on run "
                        f"{holders[0].run_id}'s deployment; stop that sweep (Ctrl-C where it runs) to end it, or "
                        f"`dsctl down {holders[0].run_id}` to remove the deployment too.")
    sweep = closing.exact_record(store, record.parent_id)
    if sweep is not None and sweep.status == "running":
        closing.close_sweep(store, sweep, "dsctl down closed it: its sweep's deployment was no longer up")
    closing.close_points(store, record.parent_id)
    closing.keep_record(store, record.run_dir or str(dsctl_home()), record.id)
    return f"{record.id}: its sweep's deployment was no longer up; its record is closed (interrupted)"


def _sweep_alive(dep: Deployment) -> bool:
    from dsctl.runtime.readiness import read_json

    from .control import HOLDER_FILE, control_dir, process_alive

    return process_alive(read_json(control_dir(dep.run_dir) / HOLDER_FILE))


def down(run: str | None, all_: bool, where: Where, say: Callable[[str], None]) -> None:
    """`dsctl down [RUN] [--all]`: RUN (a run, a sweep's point, a TensorBoard), or the only thing up, or all of it.
    Deployments are taken down one at a time, each torn down before it is recorded."""
    tensorboards = boards.active_boards()
    if run:
        board = boards.find_board(run, tensorboards)
        if board is not None:
            boards.stop_board(board)
            say(f"{board.id}: stopped (TensorBoard at {board.url}, pid {board.pid})")
            return
        dep = find(run)
        if dep is None:
            closed = close_unhosted(run)
            if closed is not None:
                say(closed)
                return
            down_by_label(run, where, say)
            return
        targets, tensorboards = [dep], []
    else:
        targets = active_deployments()
        names = [d.run_id for d in targets] + [b.id for b in tensorboards]
        if len(names) > 1 and not all_:
            raise SpecError(f"{len(names)} deployments are up ({', '.join(names)}); name one with `dsctl down RUN` or "
                            "use --all.")
    if not targets and not tensorboards:
        say("nothing is up.")
        return
    for dep in targets:
        found = f" (its state file could not be read: {rebuilt_from(dep)})" if dep.status == UNREADABLE else ""
        strays = [m for k, m in take_down(dep) if k == "strays-stopped"]
        host = f" (the deployment of {dep.run_id}, which run {run} was measured on)" \
            if run and not dep.run_id.startswith(run) else ""
        say(f"{dep.run_id}: down{found}{host}" + "".join(f"; {m}" for m in strays))
    for board in tensorboards:
        boards.stop_board(board)
        say(f"{board.id}: stopped (TensorBoard at {board.url}, pid {board.pid})")


def exists(run_id: str) -> bool:
    run_dir = _named_run_dir(run_id)
    try:
        return (run_dir is not None and run_dir.exists()) or Path(run_id).exists()
    except OSError:
        return False


# -- runs supervised on the cloud, and runs with no local state ---------------------------------------------------

@dataclass
class StatusView:
    """What `dsctl status` shows: a row per deployment that is up, the deployments whose state is unreadable, those
    whose detached monitor is gone (with what their trainers' own files say), and the TensorBoards serving."""

    rows: list[dict] = field(default_factory=list)
    unreadable: list[Deployment] = field(default_factory=list)
    unmonitored: list[dict] = field(default_factory=list)  # {"run", "pid", "trainers_say", "log"}
    tensorboards: list[dict] = field(default_factory=list)
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
            latest = cloudruns.refresh(RunStore(), d) or {}
            left = _left_behind(d) if cloudruns.ended(latest) and d.status != "down" else None
            if cloudruns.ended(latest) and not left:
                continue
            if left:
                row.update(status="ended; its supervisor left resources behind", left_behind=left)
                view.rows.append(row)
                continue
            p = latest.get("progress") or {}
            age = time.time() - latest["written_at"] if latest.get("written_at") else None
            row.update(status=f"supervised on the cloud: {p.get('phase', 'starting')}", workers=p.get("workers"),
                       batches=p.get("batches"), heard_from=None if age is None else f"{age:.0f} s ago",
                       live_processes="-")
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


def contents(dep: Deployment) -> Contents | None:
    """What the deployment's container holds (its provider's, where it is Contains; an unreadable deployment's
    cgroup found by the run's name), daemons among it named; None where it has no container."""
    if dep.status == UNREADABLE:
        group = containment.container_of(dep.state)
        return containment.contents(group, {n.pgid for n in dep.nodes if n.pgid}) if group is not None else None
    provider = get_provider(dep.provider)
    return provider.contents(dep) if isinstance(provider, Contains) else None


def _left_behind(dep: Deployment) -> str | None:
    """What a supervised run's supervisor said it could not delete (cloudrecord.LEFT_BEHIND), if anything."""
    provider = get_provider(dep.provider)
    assert isinstance(provider, HandsOff)
    return cloudrecord.left_behind(provider.run_objects(dep))


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
