"""A server that stops answering is a fault, found within a bound: the local provider ends it, and the supervisor
restarts it (or fails the run) as it does a server that died.

A process stopped by SIGSTOP, or one whose server is wedged, is neither dead nor serving: its clients wait on it
(one worker: the job stalls; two: it runs at half speed), and nothing reported it. Each server touches its ready
file every half second once its heartbeat probe (a call that takes the server's own lock) has answered
(runtime/serve.py), so either shows:
- a process the kernel holds stopped (state T) for STOPPED_S: it serves nothing until someone continues it;
- a ready file untouched for SILENT_S: its server has not answered its own probe (a deadlock, a process starved).
The second bound is long enough that a busy two-core machine does not starve a live server that long.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

from ..state import Node
from .state import LocalNode

STOPPED_S = 5.0
SILENT_S = 30.0


def why_hung(stopped_for: float | None, silent_for: float | None) -> str | None:
    """Why a serving process counts as hung (in words, for its event), or None while it answers."""
    if stopped_for is not None and stopped_for >= STOPPED_S:
        return f"its process has been stopped (state T: SIGSTOP, or a debugger) for {stopped_for:.0f} s"
    if silent_for is not None and silent_for >= SILENT_S:
        return f"it has not answered its heartbeat probe for {silent_for:.0f} s"
    return None


class HangWatch:
    """What the provider has seen of its servers' liveness: since when each stopped process has been stopped."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self._clock, self._wall = clock, wall
        self._stopped_since: dict[int, float] = {}

    def check(self, node: Node) -> str | None:
        """Why `node` (a dispatcher or worker that has served and still runs) is hung, or None."""
        state = node.state
        if not isinstance(state, LocalNode) or not state.ready or not state.ready_file or not node.pid:
            return None  # starting, or restarting: wait_ready bounds that
        stopped_for = None
        try:
            if psutil.Process(node.pid).status() == psutil.STATUS_STOPPED:
                stopped_for = self._clock() - self._stopped_since.setdefault(node.pid, self._clock())
            else:
                self._stopped_since.pop(node.pid, None)
        except psutil.Error:
            return None  # ended meanwhile: reported as an exit
        try:
            silent_for: float | None = self._wall() - os.stat(state.ready_file).st_mtime
        except OSError:
            silent_for = None
        why = why_hung(stopped_for, silent_for)
        if why is not None:
            self._stopped_since.pop(node.pid, None)
        return why
