"""`dsctl down`: take deployments down, teardown before bookkeeping, and close every record a removal interrupts.

A run whose `dsctl up` (or detached monitor) is gone is closed from what its trainers wrote for themselves
(orchestrator/reconcile.py): teardown first, then its record says what the trainers say. Taking a deployment down
closes every record it interrupts: the run's, and a sweep's with its points. A run with no deployment here is
found by its provider by label (FindsByLabel), where the options that locate runs say.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from dsctl.provisioners import Deployment, HandsOff, Where, containment, get_provider, load_deployment
from dsctl.provisioners.processes import is_ours, stop_groups
from dsctl.specs import SpecError, UsageError

from . import boards, closing, cloudruns, endings, home, imports
from .deployments import UNREADABLE, active_deployments, find, named_run_dir, rebuilt_from
from .home import dsctl_home
from .locate import finder, locate_options
from .store import RunStore, StoreError

# What keeps `down` from writing a deployment's state once everything is stopped: said, not raised.
UNWRITABLE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


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
    attached_sweep = sweep_on(dep)  # read before the deployment goes: who was measuring on it
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


def sweep_on(dep: Deployment) -> str | None:
    """The sweep that holds (or held, and died holding) this detached deployment, from its sweep lock's holder."""
    from dsctl.runtime.readiness import read_json

    from .control import HOLDER_FILE, control_dir

    holder = read_json(control_dir(dep.run_dir) / HOLDER_FILE) if dep.monitor is not None else None
    sweep = (holder or {}).get("sweep")
    return sweep if isinstance(sweep, str) else None


def close_unhosted(run_id: str) -> str | None:
    """`dsctl down POINT` for a point whose sweep's deployment is gone, or never had one of its own (a sweep on a
    detached deployment): its record, and its sweep's, closed as interrupted unless a sweep still measures it.
    What was done, or None if `run_id` is no such run."""
    if named_run_dir(run_id) is None:
        return None
    store = RunStore()
    record = store.find(run_id)
    if record is None or record.kind != "point" or not record.parent_id:
        return None
    if record.status != "running":
        return f"{record.id}: nothing to take down (its record says {record.status})"
    holders = [d for d in active_deployments() if sweep_on(d) == record.parent_id and _sweep_alive(d)]
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
            raise UsageError(f"{len(names)} deployments are up ({', '.join(names)}); name one with `dsctl down RUN` or "
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


def down_by_label(run: str, where: Where, say: Callable[[str], None]) -> None:
    """`dsctl down RUN` with no local state for RUN: its resources still carry its name. A run supervised on the
    cloud is asked to stop first, so its record says how it ended (and this machine gets a copy)."""
    found = finder(where)
    if found is None:
        options = " ".join(f"--{o.name} {o.name[0].upper()}" for o in locate_options("down") if o.hint)
        elsewhere = (f" For a run elsewhere whose local state is gone, add {options} to find what it made there by "
                     "label.") if options else ""
        raise UsageError(f"no deployment found for run '{run}' on this machine; `dsctl status` lists the ones that are "
                         f"up.{elsewhere}")
    latest = cloudruns.stop(RunStore(), found.run_objects_by_label(run, where), run, "dsctl down")
    if latest is not None:
        say(f"{run}: its supervisor recorded it {latest.status}")
    say(f"{run}: {found.down_by_label(run, where, log=say)}")
