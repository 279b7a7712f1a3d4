"""Stopping a run supervised on the cloud from here (orchestrator/cloudruns.py): ask its supervisor, wait for
its record, but not for one a dead supervisor will never write."""

from __future__ import annotations

import json

from dsctl.orchestrator import cloudrecord, cloudruns
from dsctl.orchestrator.store import RunStore


class MemoryObjects:
    """The run's record objects (cloudrecord.Objects), in memory."""

    def __init__(self, latest: dict):
        self.data = {cloudrecord.LATEST: json.dumps(latest).encode()}

    def put(self, name: str, data: bytes) -> None:
        self.data[name] = data

    def get(self, name: str) -> bytes | None:
        return self.data.get(name)

    def names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self.data if n.startswith(prefix))


def test_stop_asks_the_supervisor_and_stops_waiting_once_it_is_gone(tmp_path, monkeypatch):
    monkeypatch.setenv("DSCTL_HOME", str(tmp_path))
    objects = MemoryObjects({"progress": {"phase": "training"}})  # published, not ended
    looks: list[bool] = []

    def supervising() -> bool:
        looks.append(True)
        return len(looks) < 3  # alive twice, then gone (killed, or its VM deleted)

    cloudruns.stop(RunStore(), objects, "r-1", "dsctl down", wait_s=2, poll_s=0.01, supervising=supervising)
    assert len(looks) == 3  # it returned at the first look that found the supervisor gone, not after wait_s
    assert cloudrecord.stop_requested(objects) == "dsctl down"

    # A supervisor still alive is waited for, up to wait_s, looking again at every poll.
    alive: list[bool] = []
    cloudruns.stop(RunStore(), objects, "r-1", "dsctl down", wait_s=0.3, poll_s=0.01,
                   supervising=lambda: alive.append(True) or True)
    assert len(alive) > 3
