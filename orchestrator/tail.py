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
    """New lines of a growing file, a chunk at a time: memory stays within CHUNK + MAX_LINE bytes however large the
    file (a 286 MB log is streamed, never read whole). A half-written last line waits for the next read, unless the
    reader says the file is complete (`final`): then a last line that no newline ends is handed out too. A line longer
    than MAX_LINE is handed out in pieces of that size."""

    CHUNK = 1 << 20
    MAX_LINE = 1 << 20

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    def iter_lines(self, final: bool = False) -> Iterator[bytes]:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return
        with f:
            f.seek(self._offset)
            while chunk := f.read(self.CHUNK):
                self._offset += len(chunk)
                lines = (self._partial + chunk).split(b"\n")
                self._partial = lines.pop()
                yield from lines
                while len(self._partial) > self.MAX_LINE:
                    piece, self._partial = self._partial[:self.MAX_LINE], self._partial[self.MAX_LINE:]
                    yield piece
        if final and self._partial:
            piece, self._partial = self._partial, b""
            yield piece

    def lines(self) -> list[bytes]:
        return list(self.iter_lines())


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

    def read(self, final: bool = False) -> Iterator[str]:
        """The new lines, as they are read; with `final` (the file is complete), a last line with no newline too."""
        for raw in self.iter_lines(final):
            line = raw.decode(errors="replace")
            if not is_noise(line):
                yield line


def trainer_outputs(run_dir: str | Path) -> list[Path]:
    """The files holding what a run's trainers printed (their logs), in trainer order; a sweep's per mode."""
    metrics = Path(run_dir) / "metrics"
    return sorted(metrics.glob("trainer-*.log")) + sorted(metrics.glob("*/trainer-*.log"))
