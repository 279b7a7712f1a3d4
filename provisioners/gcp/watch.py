"""Watch the run's remote processes from a background thread: liveness, CPU/RSS, readiness, metrics.

Once a cycle (about a second), one SSH command per VM reports each of its
processes (remote.status); trainers' new metrics lines are then copied into the
local files the orchestrator tails, and when a trainer has exited its last
metrics, ids and log are fetched BEFORE its exit is published, so nothing it
wrote is missed. The provisioner's poll(), sample() and wait_ready() read the
latest snapshot and never block on SSH.

A VM that does not answer is tried again after 1, 2, 4 ... up to 30 s, and a VM whose
reading is still in flight is skipped: one hung connection never holds up the others,
and an outage (a laptop asleep) does not turn into a storm of connection attempts. A
reading in flight for more than STUCK_S counts as a failure from when it started, and
its connection is dropped (which also frees the thread waiting on it).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import remote
from .errors import RemoteError
from .ssh import Ssh

INTERVAL_S = 1.0
THREADS = 32
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
STUCK_S = 15.0


@dataclass
class Watched:
    key: tuple[str, int]  # (role, index)
    host: str
    layout: remote.Layout
    launched_at: float  # local monotonic time of the launch; older readings are ignored
    metrics_local: str | None = None
    on_exit: list[tuple[str, str]] = field(default_factory=list)  # (remote path, local path) to fetch at the end


class Watcher:
    def __init__(self, ssh: Ssh, interval_s: float = INTERVAL_S):
        self.ssh = ssh
        self.interval_s = interval_s
        self._items: dict[tuple[str, int], Watched] = {}
        self._snap: dict[tuple[str, int], remote.ProcStatus] = {}
        self._prev: dict[tuple[str, int], remote.ProcStatus] = {}  # the reading before the latest, for rates
        self._unreachable: dict[str, tuple[float, str]] = {}  # host -> (since, last error)
        self._finished: set[tuple[str, int]] = set()  # trainers whose final files were fetched
        self._retry_at: dict[str, float] = {}  # host -> when to try an unreachable VM again
        self._failures: dict[str, int] = {}  # host -> failed readings in a row
        self._in_flight: dict[str, tuple[float, Future]] = {}  # host -> (when, the future of its reading)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.last_error: str | None = None
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="dsctl-watch")

    # -- what to watch -------------------------------------------------------------------
    def watch(self, item: Watched) -> None:
        with self._lock:
            self._items[item.key] = item
            self._retry_at.pop(item.host, None)  # just reached by whoever launched it: read it next cycle
            self._snap.pop(item.key, None)
            self._prev.pop(item.key, None)
            self._finished.discard(item.key)

    def forget(self, key: tuple[str, int]) -> None:
        with self._lock:
            self._items.pop(key, None)
            self._snap.pop(key, None)
            self._prev.pop(key, None)

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

    def cycle(self, wait: bool = True) -> None:
        """One round over every VM that is due; also callable directly (e.g. for a final reading).
        The background loop does not wait for the readings it starts (a hung one must not stop the loop)."""
        now = time.monotonic()
        futures = []
        with self._lock:
            by_host: dict[str, list[Watched]] = {}
            for item in self._items.values():
                by_host.setdefault(item.host, []).append(item)
            stuck = []
            for host, group in by_host.items():
                since, busy = self._in_flight.get(host, (now, None))
                if busy is not None and not busy.done():
                    if now - since > STUCK_S and host not in self._unreachable:
                        stuck.append((host, since))
                    continue
                if now < self._retry_at.get(host, 0.0):
                    continue
                future = self._pool.submit(self._host_cycle, host, group, now)
                self._in_flight[host] = (now, future)
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
