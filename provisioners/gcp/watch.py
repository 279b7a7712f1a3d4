"""Watch the run's remote processes from a background thread: liveness, CPU/RSS, readiness, metrics.

One SSH command per VM reports each of its processes (remote.status); trainers' new metrics lines
are then copied into the local files the orchestrator tails, and when a trainer has exited its
last metrics, ids and log are fetched BEFORE its exit is published, so nothing it wrote is missed.
The provider's poll(), sample() and wait_ready() read the latest snapshot and never block on SSH.

How often each VM is read (the loop runs every INTERVAL_S; each reading costs the supervisor and the
VM a command over SSH, so the servers' readings are held to a budget that does not grow with the run):
  - a trainer's VM, and any process not yet settled (no reading since it was started, a server that
    runs but has not written its ready file, or one read only once, with no CPU rate yet): every
    INTERVAL_S. Trainers' metrics drive the progress, the autoscaling windows and the stall clock; a
    starting server is waited on.
  - a running, ready dispatcher or worker: every server_every_s(N) = max(SERVER_EVERY_MIN_S,
    N / SERVER_READS_PER_S) for N such VMs, each at its own offset in that period (VM r of N at
    r/N of it), so the readings are spread evenly: 1 reading a second at 4 workers, 2 at 64 or 640.
  - while the trainers wait: when a running trainer's metrics have not grown for QUIET_S (or for
    QUIET_GAPS times its last gap between growths, for trainers with long windows), the servers are
    read every max(INTERVAL_S, N / WAITING_READS_PER_S): a dead worker hangs the trainers, and this
    is how it is found soon. A trainer not yet seen growing twice (starting, compiling) is not judged.
A server that died is therefore seen within server_every_s(N) + INTERVAL_S while the trainers still
make progress (6 s at 4 workers, 33.5 s at 64, 321.5 s at 640; N counts the dispatcher), and, once
it holds them up, within QUIET_S + 3 × INTERVAL_S + server_every_s(N, waiting=True) (10 s at 64
workers, 28 s at 640; at 4 workers the 6 s above come first), plus the reading's own round trip.
A VM stopped or preempted is found by Compute Engine's listing (recovery.py, every 15 s) whatever
the cadence. CPU rates (readings()) are over a process's two latest readings, however far apart:
right as averages, and as old as the period (at 640 workers the cpu policy sees each worker's CPU
over its last 320 s).

A VM that does not answer is tried again after 1, 2, 4 ... up to 30 s (its cadence aside), and a VM
whose reading is still in flight is skipped: one hung connection never holds up the others, and an
outage (a laptop asleep) does not turn into a storm of connection attempts. A reading in flight for
more than STUCK_S counts as a failure from when it started, and its connection is dropped (which
also frees the thread waiting on it).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import remote
from .errors import RemoteError
from .ssh import Ssh

INTERVAL_S = 1.0  # the loop's period: trainers and starting processes are read this often
SERVER_EVERY_MIN_S = 5.0  # a running, ready server is read at most this often ...
SERVER_READS_PER_S = 2.0  # ... and the servers together this many times a second at most (more servers: each less often)
WAITING_READS_PER_S = 32.0  # the servers' budget while the trainers wait (THREADS readings at once)
QUIET_S = 5.0  # a running trainer whose metrics have not grown this long waits (a worker may be gone) ...
QUIET_GAPS = 3.0  # ... or this many of its last gaps between growths, if that is longer
THREADS = 32
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
STUCK_S = 15.0


def server_every_s(servers: int, waiting: bool = False, interval_s: float = INTERVAL_S) -> float:
    """How often each of `servers` running, ready dispatchers and workers is read; `waiting`: while trainers wait."""
    if waiting:
        return max(interval_s, servers / WAITING_READS_PER_S)
    return max(SERVER_EVERY_MIN_S, servers / SERVER_READS_PER_S)


def due(last: float | None, now: float, every_s: float, phase: float) -> bool:
    """Whether one of a VM's ticks (at phase × every_s, then every every_s) has come since its last reading."""
    if last is None:
        return True
    offset = phase * every_s
    return math.floor((now - offset) / every_s) > math.floor((last - offset) / every_s)


@dataclass
class Watched:
    key: tuple[str, int]  # (role, index)
    host: str
    layout: remote.Layout
    launched_at: float  # local monotonic time of the launch; older readings are ignored
    metrics_local: str | None = None
    on_exit: list[tuple[str, str]] = field(default_factory=list)  # (remote path, local path) to fetch at the end

    @property
    def is_trainer(self) -> bool:
        return self.key[0] == "trainer" or self.metrics_local is not None or bool(self.on_exit)


class Watcher:
    def __init__(self, ssh: Ssh, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self.ssh = ssh
        self.interval_s = interval_s
        self._clock = clock
        self._items: dict[tuple[str, int], Watched] = {}
        self._snap: dict[tuple[str, int], remote.ProcStatus] = {}
        self._prev: dict[tuple[str, int], remote.ProcStatus] = {}  # the reading before the latest, for rates
        self._unreachable: dict[str, tuple[float, str]] = {}  # host -> (since, last error)
        self._finished: set[tuple[str, int]] = set()  # trainers whose final files were fetched
        self._retry_at: dict[str, float] = {}  # host -> when to try an unreachable VM again
        self._failures: dict[str, int] = {}  # host -> failed readings in a row
        self._in_flight: dict[str, tuple[float, Future]] = {}  # host -> (when, the future of its reading)
        self._read_at: dict[str, float] = {}  # host -> when its latest reading was started
        # trainer -> (metrics size, when it was seen to grow, the gap between its last two growths)
        self._grown: dict[tuple[str, int], tuple[int, float | None, float | None]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.last_error: str | None = None
        self.reads = 0  # readings started (SSH status commands), for the benchmark
        self.waiting = False  # whether the latest cycle found the trainers waiting
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="dsctl-watch")

    # -- what to watch -------------------------------------------------------------------
    def watch(self, item: Watched) -> None:
        with self._lock:
            self._items[item.key] = item
            self._retry_at.pop(item.host, None)  # just reached by whoever launched it: read it next cycle
            self._snap.pop(item.key, None)
            self._prev.pop(item.key, None)
            self._grown.pop(item.key, None)
            self._finished.discard(item.key)

    def forget(self, key: tuple[str, int]) -> None:
        with self._lock:
            self._items.pop(key, None)
            self._snap.pop(key, None)
            self._prev.pop(key, None)
            self._grown.pop(key, None)

    def snapshot(self) -> dict[tuple[str, int], remote.ProcStatus]:
        with self._lock:
            return dict(self._snap)

    def readings(self) -> dict[tuple[str, int], tuple[remote.ProcStatus, remote.ProcStatus]]:
        """(previous, latest) reading of each process, where there are two of the same process."""
        with self._lock:
            return {k: (self._prev[k], v) for k, v in self._snap.items()
                    if k in self._prev and self._prev[k].pid == v.pid and v.at > self._prev[k].at}

    def unreachable(self) -> dict[str, tuple[float, str]]:
        """host -> (since, last error) of watched VMs whose last reading failed."""
        with self._lock:
            hosts = {i.host for i in self._items.values()}
            return {h: v for h, v in self._unreachable.items() if h in hosts}

    # -- the loop --------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="dsctl-watcher", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.cycle(wait=False)
                self.last_error = None
            except Exception as exc:  # never let the watcher die; the next cycle tries again
                self.last_error = f"{type(exc).__name__}: {exc}"
            self._stop.wait(max(self.interval_s - (time.monotonic() - started), 0.05))

    def _every_cycle(self, item: Watched) -> bool:
        """Read each cycle: a trainer; a process with no reading yet, or running but not yet ready, or with no
        earlier reading to give its CPU rate (readings()) from."""
        if item.is_trainer:
            return True
        st, prev = self._snap.get(item.key), self._prev.get(item.key)
        return st is None or (st.ready is None and st.running(None)) or prev is None or prev.pid != st.pid

    def _trainers_waiting(self, now: float) -> bool:
        """A running trainer, seen writing metrics before, whose metrics have been quiet for long (see the top)."""
        for key, (_, grew_at, gap) in self._grown.items():
            item, st = self._items.get(key), self._snap.get(key)
            if item is None or st is None or grew_at is None or gap is None or item.host in self._unreachable \
                    or not st.running(None):
                continue
            if now - grew_at > max(QUIET_S, QUIET_GAPS * gap):
                return True
        return False

    def cycle(self, wait: bool = True) -> None:
        """One round over every VM that is due (see the top); also callable directly (e.g. for a final reading of
        the trainers). The background loop does not wait for the readings it starts (a hung one must not stop it)."""
        now = self._clock()
        futures = []
        with self._lock:
            by_host: dict[str, list[Watched]] = {}
            for item in self._items.values():
                by_host.setdefault(item.host, []).append(item)
            servers = sorted(h for h, group in by_host.items() if not any(self._every_cycle(i) for i in group))
            rank = {h: r for r, h in enumerate(servers)}
            self.waiting = self._trainers_waiting(now)
            every = server_every_s(len(servers), self.waiting, self.interval_s)
            stuck = []
            for host, group in by_host.items():
                since, busy = self._in_flight.get(host, (now, None))
                if busy is not None and not busy.done():
                    if now - since > STUCK_S and host not in self._unreachable:
                        stuck.append((host, since))
                    continue
                if host in self._retry_at:  # failing: tried again on its own schedule
                    if now < self._retry_at[host]:
                        continue
                elif host in rank and not due(self._read_at.get(host), now, every, rank[host] / len(servers)):
                    continue
                future = self._pool.submit(self._host_cycle, host, group, now)
                self._in_flight[host] = (now, future)
                self._read_at[host] = now
                self.reads += 1
                futures.append(future)
        for host, since in stuck:
            self._failed(host, since, f"no answer over SSH for {now - since:.0f} s")
            self.ssh.drop(host)
        for f in futures if wait else ():
            f.result()

    def _failed(self, host: str, at: float, error: str) -> None:
        with self._lock:
            since = self._unreachable.get(host, (at, ""))[0]
            self._unreachable[host] = (since, error)
            failures = self._failures.get(host, 0) + 1
            self._failures[host] = failures
            self._retry_at[host] = at + min(RETRY_FIRST_S * 2 ** (failures - 1), RETRY_MAX_S)

    def _host_cycle(self, host: str, items: list[Watched], at: float) -> None:
        try:
            res = self.ssh.run(host, remote.status([i.layout.dir for i in items]), doing="checking processes",
                               timeout=30)
            statuses = remote.parse_status(res.stdout, at)
        except RemoteError as exc:
            self._failed(host, at, str(exc))
            return
        with self._lock:
            self._unreachable.pop(host, None)
            self._failures.pop(host, None)
            self._retry_at.pop(host, None)
        for item in items:
            st = statuses.get(item.layout.dir)
            if st is None or at < item.launched_at:
                continue
            try:
                if item.metrics_local and st.metrics_size:
                    self._copy_new(host, item.layout.metrics, Path(item.metrics_local))
                exited = not st.running(None)
                if exited and item.key not in self._finished and (item.metrics_local or item.on_exit):
                    if item.metrics_local:
                        self._copy_new(host, item.layout.metrics, Path(item.metrics_local))
                    for remote_path, local_path in item.on_exit:
                        self.ssh.get(host, remote_path, Path(local_path))
                    self._finished.add(item.key)
            except RemoteError as exc:
                self._failed(host, at, str(exc))
                continue
            with self._lock:
                if item.key in self._items and self._items[item.key] is item:
                    if item.key in self._snap:
                        self._prev[item.key] = self._snap[item.key]
                    self._snap[item.key] = st
                    if item.metrics_local and st.metrics_size is not None:
                        self._seen_metrics(item.key, st.metrics_size, at)

    def _seen_metrics(self, key: tuple[str, int], size: int, at: float) -> None:
        """Note when a trainer's metrics file grew, and the gap since it grew before (under the lock): a trainer is
        judged from its second growth seen on (from when it was first seen, the gap is not known)."""
        seen = self._grown.get(key)
        if seen is None:
            self._grown[key] = (size, None, None)
        elif size != seen[0]:
            self._grown[key] = (size, at, None if seen[1] is None else at - seen[1])

    def _copy_new(self, host: str, remote_path: str, local: Path) -> None:
        """Append what the remote file has beyond the local copy's length."""
        local.parent.mkdir(parents=True, exist_ok=True)
        offset = local.stat().st_size if local.exists() else 0
        while True:
            data = self.ssh.read_from(host, remote_path, offset)
            if not data:
                return
            with open(local, "ab") as f:
                f.write(data)
            offset += len(data)
