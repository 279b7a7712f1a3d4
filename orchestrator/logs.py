"""`dsctl logs RUN [--follow]`: a run's events and what its trainers printed, until it ends with --follow.

Events are said once each, however often they are read. A run on this machine is looked at every `interval` while
it runs; a run supervised on the cloud is followed through the one follow loop (cloudruns.follow) by its latest.json
alone, the same few kilobytes a look whatever its size, and its whole record is brought home once it has ended.
What the trainers printed is streamed as it is read, in bounded memory (tail.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from dsctl.provisioners import HandsOff, Where, get_provider
from dsctl.specs import JobSpec

from . import cloudruns
from .locate import locate_options, record_objects, sync_record
from .records import CloudLatest, CloudProgress, RunEvent, RunRecord
from .runs import find_run
from .store import RunStore
from .tail import OutputTail, trainer_outputs


class RunLog:
    """What `dsctl logs` shows of one run: new events, new lines of its trainers' output, and, for a run followed on
    the cloud, its progress; each to the callback the command renders it with."""

    def __init__(self, run: str, where: Where, *, output: bool, on_event: Callable[[RunEvent], None],
                 on_line: Callable[[str], None], on_progress: Callable[[CloudProgress], None]):
        self.run, self.where, self.output = run, where, output
        self.on_event, self.on_line, self.on_progress = on_event, on_line, on_progress
        self.store = RunStore()
        self._shown: set[tuple[float, str, str | None]] = set()
        self._outputs: dict[Path, OutputTail] = {}
        self._progress: tuple[int | None, str | None] | None = None

    @staticmethod
    def _elsewhere() -> str:
        """Where else the run may be, as the options that locate a run's record say it."""
        options = " ".join(f"--{o.name} ..." for o in locate_options("record"))
        return f" (a run supervised on the cloud from another machine: say where its record is, {options})" \
            if options else ""

    def _event(self, event: RunEvent) -> None:
        if event.key not in self._shown:
            self._shown.add(event.key)
            self.on_event(event)

    def look(self, following: bool) -> RunRecord:
        """The run's record, up to date, having shown what is new; a last output line that no newline ends waits while
        the run may add to it (`following` and still running)."""
        sync_record(self.store, self.run, self.where)
        record = find_run(self.store, self.run, self._elsewhere())
        for event in self.store.events(record.id):
            self._event(event)
        if self.output and record.run_dir:
            complete = not following or record.status != "running"
            for path in trainer_outputs(record.run_dir):
                tail = self._outputs.setdefault(path, OutputTail(path))
                for line in tail.read(final=complete):
                    self.on_line(f"{tail.label} | {line}")
        return record

    def _cloud(self, latest: CloudLatest) -> None:
        for event in latest.events:
            self._event(event)
        p = latest.progress
        if p.batches and (p.batches, p.phase) != self._progress:
            self._progress = (p.batches, p.phase)
            self.on_progress(p)

    def follow(self, record: RunRecord, interval: float) -> RunRecord:
        """Until the run ends: on the cloud through the one follow loop (its latest.json), here by its record."""
        objects, _ = record_objects(record.id, self.where)
        if objects is not None:
            provider = get_provider(record.provider)
            limits = provider.limits(JobSpec.model_validate_json(record.spec_json)) \
                if isinstance(provider, HandsOff) else None
            # No heartbeat: this only reads the run's record; an attached `dsctl up` elsewhere is its follower.
            cloudruns.follow(objects, self._cloud, outage_limit_s=limits.outage_limit_s if limits else 600.0,
                             limit_field=limits.outage_limit_field if limits else "the outage limit",
                             poll_s=interval, heartbeat_s=None)
            return self.look(following=True)  # the whole record, once it has ended
        while record.status == "running":
            time.sleep(interval)
            record = self.look(following=True)
        return record


def show_logs(run: str, where: Where, *, follow: bool, output: bool, interval: float,
              on_event: Callable[[RunEvent], None], on_line: Callable[[str], None],
              on_progress: Callable[[CloudProgress], None]) -> RunRecord:
    """`dsctl logs`: the run's events and output so far and, with `follow`, as they come until it ends; its record."""
    log = RunLog(run, where, output=output, on_event=on_event, on_line=on_line, on_progress=on_progress)
    record = log.look(following=follow)
    return log.follow(record, interval) if follow else record
