"""CPU and resident memory of the service and trainer processes.

tf.data service exports no metrics, so utilization comes from the OS: the cost
model charges workers on what they used (Equation 1), which is measured here
as CPU-seconds per wall second (cores busy) and resident bytes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil


@dataclass
class Sample:
    role: str
    index: int
    pid: int
    cpu_cores: float  # CPU-seconds used per wall second since the previous sample
    rss_bytes: int
    cpu_seconds: float  # cumulative, for totals like CPU-seconds per batch


class ProcessSampler:
    """Remembers each process's CPU time so successive samples give rates."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, float]] = {}
        self._procs: dict[int, psutil.Process] = {}

    def _cpu_and_rss(self, pid: int) -> tuple[float, int] | None:
        proc = self._procs.get(pid)
        try:
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
            with proc.oneshot():
                t = proc.cpu_times()
                cpu = t.user + t.system + t.children_user + t.children_system
                return cpu, proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            self._procs.pop(pid, None)
            return None

    def _tree_cpu_and_rss(self, pid: int) -> tuple[float, int] | None:
        """The process and all its descendants: a user's command runs below dsctl's runner (runtime/command.py).
        Each process's CPU includes that of the children it has reaped, so nothing is counted twice."""
        root = self._cpu_and_rss(pid)
        if root is None:
            return None
        cpu, rss = root
        for child in descendants(pid):
            try:
                proc = psutil.Process(child)
                with proc.oneshot():
                    t = proc.cpu_times()
                    cpu += t.user + t.system + t.children_user + t.children_system
                    rss += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return cpu, rss

    def sample(self, processes: list[tuple[str, int, int]], trees: frozenset[int] = frozenset()) -> list[Sample]:
        """processes: (role, index, pid); the pids in `trees` are measured with their descendants. Dead processes
        are skipped."""
        now = time.monotonic()
        out = []
        for role, index, pid in processes:
            got = self._tree_cpu_and_rss(pid) if pid in trees else self._cpu_and_rss(pid)
            if got is None:
                continue
            cpu, rss = got
            prev = self._last.get(pid)
            self._last[pid] = (now, cpu)
            cores = (cpu - prev[1]) / (now - prev[0]) if prev and now > prev[0] else 0.0
            if prev is None:
                continue  # the first sample only sets the baseline
            out.append(Sample(role, index, pid, max(cores, 0.0), rss, cpu))
        return out


def descendants(pid: int) -> list[int]:
    """The pids below `pid`, from /proc/PID/task/TID/children (the kernel's own list: no scan of every process);
    psutil's scan where the kernel does not keep that list."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        kids: list[int] = []
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids += [int(k) for k in f.read().split()]
            except FileNotFoundError:
                if not os.path.exists(f"/proc/{parent}/task/{tid}"):
                    continue  # the thread ended meanwhile
                try:
                    return [p.pid for p in psutil.Process(pid).children(recursive=True)]
                except psutil.Error:
                    return found
            except OSError:
                continue
        found += kids
        todo += kids
    return found
