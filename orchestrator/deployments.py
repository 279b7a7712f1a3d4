"""The deployments on this machine: the ones that are up (from their state files), one named by a run id, and what a
deployment whose state file cannot be read is rebuilt from.

This works from a fresh process: it needs only the state files that `dsctl up` writes as it starts each process, so
`dsctl down` and `dsctl status` find what a killed `dsctl up` left. A state file that cannot be read (cut short by a
crash, garbled) does not hide a deployment: it is rebuilt from what proves a process is the run's, its cgroup (found
by the run's name) and the processes dsctl started for it (each leads a session of its own and runs one of dsctl's
modules naming the run: the launcher, what it forks, a detached monitor). A process that only names the run's folder
(a script's `tail -f` of its log) is said, and left alone; so is every process group dsctl did not make.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from dsctl.provisioners import (
    STATE_FILE,
    Contains,
    Contents,
    Deployment,
    HandsOff,
    Node,
    containment,
    get_provider,
    load_deployment,
)
from dsctl.provisioners.containment import Containment
from dsctl.provisioners.processes import is_ours, run_processes
from dsctl.provisioners.state import DeploymentState, DeploymentStatus

from . import store as records
from .home import dsctl_home
from .store import RunStore, StoreError

UNREADABLE: DeploymentStatus = "state unreadable"  # the status of a deployment rebuilt from its processes
NAME_MAX = 255  # bytes in one file name on the file systems dsctl runs on: a longer run id names no run dir


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


def named_run_dir(run_id: str) -> Path | None:
    """The folder `run_id` names under DSCTL_HOME/runs, or None when it can name none: too long for a file name,
    a path rather than a name."""
    if not run_id or run_id in (".", "..") or "/" in run_id or "\0" in run_id or len(os.fsencode(run_id)) > NAME_MAX:
        return None
    return dsctl_home() / "runs" / run_id


def find(run_id: str) -> Deployment | None:
    """The deployment of a run: its own (by id or a unique prefix), or for a sweep's point the one of the sweep it
    was measured on."""
    run_dir = named_run_dir(run_id)
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
    if named_run_dir(run_id) is None:
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


def contents(dep: Deployment) -> Contents | None:
    """What the deployment's container holds (its provider's, where it is Contains; an unreadable deployment's
    cgroup found by the run's name), daemons among it named; None where it has no container."""
    if dep.status == UNREADABLE:
        group = containment.container_of(dep.state)
        return containment.contents(group, {n.pgid for n in dep.nodes if n.pgid}) if group is not None else None
    provider = get_provider(dep.provider)
    return provider.contents(dep) if isinstance(provider, Contains) else None
