"""Runs supervised on the cloud, seen from any machine: their progress, their record, and stopping them.

A run `dsctl up --detach` handed over to its dispatcher VM (orchestrator/supervise.py) is known
here by its state file (its provider says it was handed off) when this machine started it, or only by its id
and project otherwise. Either way its record comes from the objects its supervisor publishes
(cloudrecord.py): `refresh` imports what is new into this machine's store, so `dsctl runs`,
`runs show`, `logs` and `cost report` read it like any other run, and a run found ended
has what is left of it (its supervisor's own VM, being deleted) removed and confirmed gone.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeGuard

from dsctl.provisioners import Deployment, HandsOff, get_provider

from . import cloudrecord
from .home import dsctl_home
from .records import CloudLatest
from .store import RunStore

IMPORTED = "cloud-parts.json"  # in the run dir: the record's parts already imported here
STOP_WAIT_S = 300.0


def _imported(run_dir: Path) -> set[str]:
    try:
        return set(json.loads((run_dir / IMPORTED).read_text()))
    except (OSError, ValueError):
        return set()


def sync(store: RunStore, objects, run_id: str, run_dir: Path | None = None) -> CloudLatest | None:
    """Import what the run's supervisor published since the last sync; its latest state, or None."""
    run_dir = Path(run_dir or dsctl_home() / "runs" / run_id)
    imported = _imported(run_dir)
    latest = cloudrecord.import_record(store, objects, run_id, imported)
    if latest is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / IMPORTED).write_text(json.dumps(sorted(imported)))
    return latest


def ended(latest: CloudLatest | None) -> TypeGuard[CloudLatest]:
    return latest is not None and latest.ended


def refresh(store: RunStore, dep: Deployment, events: Callable[[str, str], None] = lambda k, m: None, *,
            take_down_left: bool = False) -> CloudLatest | None:
    """Bring a supervised run's record up to date here; once it has ended, confirm nothing of it is left. What its
    supervisor could not delete (cloudrecord.LEFT_BEHIND: its own VM stays too) is shown, not deleted, by a look
    (`dsctl status`, `runs show`): `dsctl down RUN` deletes it, as does the attached `dsctl up` (take_down_left)."""
    provider = get_provider(dep.provider)
    assert isinstance(provider, HandsOff), f"provider {dep.provider} supervises no run on the cloud"
    objects = provider.run_objects(dep)
    latest = sync(store, objects, dep.run_id, Path(dep.run_dir))
    if ended(latest) and dep.status != "down" and (take_down_left or cloudrecord.left_behind(objects) is None):
        provider.down(dep, events)  # its supervisor deleted everything but its own VM, which goes now
    return latest


def stop(store: RunStore, objects, run_id: str, reason: str, wait_s: float = STOP_WAIT_S,
         poll_s: float = 2.0, supervising: Callable[[], bool] | None = None) -> CloudLatest | None:
    """Ask the run's supervisor to tear the run down, and wait (up to wait_s) until it has recorded so; no longer
    once `supervising()` says its supervisor is gone (killed, or its VM deleted: nobody will record the end)."""
    latest = sync(store, objects, run_id)
    if latest is None or ended(latest):
        return latest  # nothing published (not supervised, or its supervisor never started), or over already
    cloudrecord.request_stop(objects, reason)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        latest = cloudrecord.read_latest(objects)
        if ended(latest) or (supervising is not None and not supervising()):
            break
    return sync(store, objects, run_id)


HEARTBEAT_S = 30.0


def follow(objects: cloudrecord.Objects, on_latest: Callable[[CloudLatest], None], *, outage_limit_s: float,
           limit_field: str, poll_s: float = 2.0, heartbeat_s: float | None = HEARTBEAT_S) -> CloudLatest:
    """Follow a supervised run by its latest.json alone (the same few kilobytes a look, whatever the number of
    workers), showing each new state until the run ends: the one follow loop, for an attached `dsctl up` and for
    `dsctl logs --follow`. With `heartbeat_s` (an attached `dsctl up`), it tells the run's supervisor all the while
    that someone follows it. Past outage_limit_s (the spec field `limit_field` sets it) without reaching the record,
    raise TimeoutError: an attached run's supervisor, no longer hearing from this machine, tears it down on its side."""
    beat, last_beat, last_ok = 0, -math.inf, time.monotonic()
    while True:
        try:
            if heartbeat_s is not None and time.monotonic() - last_beat >= heartbeat_s:
                beat += 1
                cloudrecord.still_following(objects, beat)
                last_beat = time.monotonic()
            latest = cloudrecord.read_latest(objects)
            last_ok = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - no route to Cloud Storage (a laptop offline): try again
            lost = time.monotonic() - last_ok
            if lost > outage_limit_s:
                raise TimeoutError(f"this machine could not reach the run's published record for {lost:.0f} s "
                                   f"({limit_field}; last: {type(exc).__name__}: {exc}); an attached run's supervisor "
                                   "tears it down when it stops hearing from here") from None
            time.sleep(poll_s)
            continue
        if latest is not None:
            on_latest(latest)
        if ended(latest):
            return latest
        time.sleep(poll_s)
