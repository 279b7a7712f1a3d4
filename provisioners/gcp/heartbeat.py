"""The supervisor's heartbeat: while a process supervises a run, it rewrites the run's heartbeat object.

Whoever supervises the run beats: `dsctl up` (and sweeps, colocated and ideal baselines) on the
user's machine from before the first VM is created until the run is torn down or handed over, then
`dsctl supervise` on the dispatcher VM from the moment it adopts the run. The VMs' watchdogs
(watchdog.py) delete their machines once it stops changing for gcp.heartbeat_limit_s, so a
supervisor that is killed, or whose machine is deleted, preempted or asleep, leaves nothing billing.
A write that fails is tried again at the next beat; the watchdogs allow for several.
"""

from __future__ import annotations

import threading

from .clients import Clients
from .lifetime import beat_every_s
from .storage import HeartbeatObject


class Heartbeat:
    """A daemon thread rewriting the heartbeat object every beat_every_s(limit) until stop()."""

    def __init__(self, clients: Clients, run_id: str):
        s = clients.settings
        self._object = HeartbeatObject(clients.storage, s.bucket, run_id)
        self._every = beat_every_s(s.heartbeat_limit_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.beats = 0

    def start(self) -> None:
        """Beat once now (so VMs about to be created find it), then in the background; a second start does nothing."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._beat()
        self._thread = threading.Thread(target=self._run, name="dsctl-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._beat()

    def _beat(self) -> None:
        try:
            self._object.beat(self.beats + 1)
            self.beats += 1
        except Exception:  # noqa: BLE001 - one missed beat is within the limit; the next one tries again
            pass
