"""What a step of a run may use of it: the explicit context a JobRunner hands to the parts it calls.

(Autocache profiling, orchestrator/caching.py, runs a trainer on the run's deployment before training:
it needs the run's spec, folder, records and provider, and to tell the user what it does, and nothing
else of the runner.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsctl.provisioners import EventSink, Provider
from dsctl.specs import JobSpec, LoadedSpec
from dsctl.specs.schema import Mode

from .store import RunStore
from .supervision import Supervisor


@dataclass(frozen=True)
class RunContext:
    loaded: LoadedSpec
    spec: JobSpec  # the run's (its autoscale policy may have changed the client's buffer: not always loaded.spec)
    mode: Mode
    run_id: str
    run_dir: Path
    store: RunStore
    provider: Provider
    supervisor: Supervisor
    event: EventSink  # an event in the run's record, shown live
    phase: Callable[[str], None]  # what the run is doing now, shown live
