"""Watch the run's remote processes from a background thread: liveness, CPU/RSS, readiness, metrics.

Once a cycle (about a second), one SSH command per VM reports each of its
processes (remote.status); trainers' new metrics lines are then copied into the
local files the orchestrator tails, and when a trainer has exited its last
metrics, ids and log are fetched BEFORE its exit is published, so nothing it
wrote is missed. The provisioner's poll(), sample() and wait_ready() read the
latest snapshot and never block on SSH.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import remote
from .errors import RemoteError
from .ssh import Ssh

INTERVAL_S = 1.0
THREADS = 32


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
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.last_error: str | None = None
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="dsctl-watch")

    # -- what to watch -------------------------------------------------------------------
    def watch(self, item: Watched) -> None:
        with self._lock:
            self._items[item.key] = item
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
        with self._lock:
            return dict(self._unreachable)

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
                self.cycle()
                self.last_error = None
            except Exception as exc:  # never let the watcher die; the next cycle tries again
                self.last_error = f"{type(exc).__name__}: {exc}"
            self._stop.wait(max(self.interval_s - (time.monotonic() - started), 0.05))

    def cycle(self) -> None:
        """One round over every VM; also callable directly (e.g. for a final reading)."""
        with self._lock:
            items = list(self._items.values())
        by_host: dict[str, list[Watched]] = {}
        for item in items:
            by_host.setdefault(item.host, []).append(item)
        futures = [self._pool.submit(self._host_cycle, host, group) for host, group in by_host.items()]
        for f in futures:
            f.result()

    def _host_cycle(self, host: str, items: list[Watched]) -> None:
        at = time.monotonic()
        try:
            res = self.ssh.run(host, remote.status([i.layout.dir for i in items]), doing="checking processes",
                               timeout=30)
            statuses = remote.parse_status(res.stdout, at)
        except RemoteError as exc:
            with self._lock:
                since = self._unreachable.get(host, (at, ""))[0]
                self._unreachable[host] = (since, str(exc))
            return
        with self._lock:
            self._unreachable.pop(host, None)
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
                with self._lock:
                    self._unreachable.setdefault(host, (at, str(exc)))
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
