"""CPU and resident memory of the service and trainer processes.

tf.data service exports no metrics, so utilization comes from the OS: the cost
model charges workers on what they used (Equation 1), which is measured here
as CPU-seconds per wall second (cores busy) and resident bytes.
"""

from __future__ import annotations

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

    def sample(self, processes: list[tuple[str, int, int]]) -> list[Sample]:
        """processes: (role, index, pid). Dead processes are skipped."""
        now = time.monotonic()
        out = []
        for role, index, pid in processes:
            got = self._cpu_and_rss(pid)
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
