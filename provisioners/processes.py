"""Processes on this machine, identified by pid AND start time, stopped a process group at a time.

Used for every process dsctl starts locally: a run's servers and trainers (the local provider), a
detached `dsctl up` that owns a deployment, a caller waiting on a request (orchestrator/control.py).
`dsctl down` in a new process stops them from their recorded pid, process group and start time,
never by name: a pid that now belongs to another process is left alone.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from typing import Protocol

import psutil


class Process(Protocol):
    """What identifies a process (a Node or a ProcessRef of provisioners/state.py)."""

    pid: int | None
    pgid: int | None
    create_time: float | None


# How far a process's start time, read twice, may differ and still name the same process. Linux keeps a process's
# start as clock ticks since boot; psutil adds the boot time, which the kernel recomputes on every read as the wall
# clock minus the uptime, in whole seconds, so an NTP adjustment between two reads (the one recorded, the one
# compared) moves it by a second. A pid reused by another process started within 1.5 s of the recorded one would
# need the whole pid space to wrap in that time.
START_TIME_TOLERANCE_S = 1.5


def is_ours(node: Process) -> bool:
    """True while the process recorded for `node` is still the same process and not a zombie."""
    if not node.pid:
        return False
    try:
        proc = psutil.Process(node.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return node.create_time is None or abs(proc.create_time() - node.create_time) < START_TIME_TOLERANCE_S
    except psutil.NoSuchProcess:
        return False


def reap(pid: int | None) -> int | None:
    """Collect a child's exit status (if it is our child); None while it runs."""
    if not pid:
        return None
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if done == 0:
        return None
    return os.waitstatus_to_exitcode(status)


def _signal(nodes: Sequence[Process], sig: int) -> None:
    for node in nodes:
        if not node.pgid:  # never signal group 0 (our own); stop_groups passes only nodes with a group
            continue
        try:
            os.killpg(node.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_groups(nodes: Sequence[Process], grace_s: float = 8.0) -> None:
    """SIGTERM each node's process group, then SIGKILL those left after `grace_s`.

    A node whose recorded process is gone (or whose pid now belongs to another
    process) is left alone: its pgid may have been reused by someone else.
    """
    live = [n for n in nodes if n.pgid and is_ours(n)]
    for n in nodes:
        reap(n.pid)
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 3.0)):
        if not live:
            return
        _signal(live, sig)
        deadline = time.monotonic() + wait
        while live and time.monotonic() < deadline:
            for n in live:
                reap(n.pid)
            live = [n for n in live if is_ours(n)]
            if live:
                time.sleep(0.05)
