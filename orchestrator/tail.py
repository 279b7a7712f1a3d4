"""Follow files as they grow: the trainers' JSON-lines metrics, and their output (`dsctl logs`)."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from dsctl.provisioners import Deployment
from dsctl.runtime.logtail import is_noise


def trainer_metrics(dep: Deployment) -> dict[int, str]:
    """Where each trainer's metrics reach this machine: start_trainers sets every trainer node's (the contract)."""
    paths = {}
    for n in dep.by_role("trainer"):
        assert n.metrics is not None, f"trainer {n.index} has no metrics path after start_trainers"
        paths[n.index] = n.metrics
    return paths


class LineTail:
    """Returns only complete new lines on each read; a half-written last line waits for the next read."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    def lines(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return lines


class JsonlTail(LineTail):
    """New JSON records, each handed out once. The file is read ahead of the caller, so the records read but not yet
    taken are kept here: a caller stopped mid-loop (Ctrl-C, SIGTERM or SIGHUP while it records a batch of windows)
    gets the rest on its next read, where its teardown drains the tail, instead of losing them with the offset."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        self._unread: deque[dict] = deque()

    def read(self) -> Iterator[dict]:
        for line in self.lines():
            if line.strip():
                try:
                    self._unread.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        while self._unread:
            yield self._unread.popleft()  # taken before it is handed out: one being recorded when stopped is not twice


class OutputTail(LineTail):
    """What a trainer printed, new lines only, without TensorFlow's start-up chatter; `label` names the trainer."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.label = f"{self.path.parent.name}/{self.path.stem}" if self.path.parent.name != "metrics" else self.path.stem

    def read(self) -> list[str]:
        decoded = (raw.decode(errors="replace") for raw in self.lines())
        return [line for line in decoded if not is_noise(line)]


def trainer_outputs(run_dir: str | Path) -> list[Path]:
    """The files holding what a run's trainers printed (their logs), in trainer order; a sweep's per mode."""
    metrics = Path(run_dir) / "metrics"
    return sorted(metrics.glob("trainer-*.log")) + sorted(metrics.glob("*/trainer-*.log"))
