"""`dsctl runs` and `dsctl runs show`: recorded runs, and one run whole (its record, the runs that resumed it, its
windows and events, how its summary was made), a run supervised on the cloud brought up to date first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl.provisioners import Where
from dsctl.specs import UsageError

from .locate import sync_record
from .records import RunEvent, RunRecord, RunSummary
from .store import RunStore


def list_runs(limit: int | None = 20) -> list[RunRecord]:
    """Recorded jobs, sweeps and profiles, newest first."""
    return RunStore().list(limit=limit, kinds=("job", "sweep", "profile"))


def find_run(store: RunStore, run: str, hint: str = "") -> RunRecord:
    """The run a user named (its id, or a prefix of exactly one run's); a usage error for none, listing the way to the
    recorded ones (`hint` adds where else it may be)."""
    record = store.find(run)
    if record is None:
        raise UsageError(f"no run '{run}' is recorded; `dsctl runs` lists the recorded ones{hint}.")
    return record


@dataclass
class Timeline:
    """A run's timeline plot: where it was written, from how many windows, with how many changes of worker count."""

    path: Path
    windows: int
    changes: int


@dataclass
class RunView:
    """What `dsctl runs show` prints of one run."""

    record: RunRecord
    resumed_by: list[str]
    windows: list[dict[str, Any]]
    events: list[RunEvent]
    notes: list[tuple[str, str]] = field(default_factory=list)  # (label, text): how its summary was made
    timeline: Timeline | None = None

    def as_json(self) -> dict[str, Any]:
        """As `--json` prints it: the record, with the runs that resumed it, its windows and its events."""
        return {**self.record.as_dict(), "resumed_by": self.resumed_by, "windows": self.windows,
                "events": [e.as_json() for e in self.events]}


def summary_notes(record: RunRecord) -> list[tuple[str, str]]:
    """How a run's summary was made, when not from every trainer's own end record, and who recorded its end."""
    if record.kind in ("sweep", "profile"):
        return []
    s: RunSummary = record.job
    notes = []
    if s.summary_source == "windows":
        rebuilt = s.rebuilt_trainers
        if rebuilt and len(rebuilt) < record.trainers:
            names = ", ".join(map(str, rebuilt))
            notes.append(("summary", f"rebuilt from the run's stored metrics windows for trainer(s) {names}: their "
                                     "own end records are missing (the others' are their own)"))
        else:
            notes.append(("summary", "rebuilt from the run's stored metrics windows: its trainers' own end records "
                                     "are missing (the run ended abnormally)"))
    if s.recorded_by:
        notes.append(("recorded", s.recorded_by))
    return notes


def show_run(run: str, where: Where, *, timeline: bool = False, out: Path | None = None) -> RunView:
    """One run whole; a run supervised on the cloud (from its local state, or found where `where` says) brought up
    to date from what its supervisor published. `timeline`: its workers and batch time plotted (PNG, in `out` or
    its run dir)."""
    store = RunStore()
    sync_record(store, run, where)
    record = find_run(store, run)
    view = RunView(record, store.resumed_by(record.id), store.windows(record.id), store.events(record.id),
                   summary_notes(record))
    if timeline:
        from .timeline import placement_changes, plot_timeline  # matplotlib: only for a plot

        if not view.windows:
            raise UsageError(f"run {record.id} has no metrics windows to plot.")
        path = plot_timeline(view.windows, out or Path(record.run_dir or ".") / "timeline.png",
                             f"run {record.id}: workers and batch time")
        view.timeline = Timeline(path, len(view.windows), len(placement_changes(view.windows)))
    return view
