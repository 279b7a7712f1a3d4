"""A run's record where the run's supervisor and any dsctl can both reach it: object storage.

A run supervised on the cloud (`dsctl up --detach` on Google Cloud) keeps its record in the
supervisor's own SQLite store, on the dispatcher VM, and publishes it under the run's prefix:

  latest.json          the run's row (status, summary), its progress and the time it was written;
                       rewritten at every publish, so its age is the supervisor's heartbeat
  part-000001.json ... the windows, events and utilization samples written since the last part,
                       and the trainers' results; never rewritten
  stop                 written by `dsctl down`: the supervisor tears the run down and records why
  follower             rewritten by an attached `dsctl up` while it follows the run; a supervisor that
                       sees it unchanged for gcp.outage_limit_s tears the run down (nobody is attached)
  left-behind          written by a supervisor whose teardown left something of the run: what, and that it
                       kept its own VM (`dsctl status` shows it until `dsctl down` deletes the rest)

Any dsctl imports the parts it has not seen into its own store (`import_record`), so `dsctl runs
show`, `dsctl logs` and `dsctl cost report` work from any machine with access to the bucket. The
parts carry each process's utilization once every UTILIZATION_EVERY_S (the supervisor samples every
0.5 s and summarizes from all of it): 640 workers for 7 hours stay tens of megabytes to import.
Following a running job reads only latest.json: the same few kilobytes a poll, whatever the
number of workers (utilization rows are in the parts, read only by an import).
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from .records import CloudLatest
from .store import RunStore

LATEST = "latest.json"
STOP = "stop"
FOLLOWER = "follower"
LEFT_BEHIND = "left-behind"
PART = "part-{:06d}.json"
RECENT_EVENTS = 12  # events carried in latest.json, for `dsctl logs --follow` and `status`
UTILIZATION_EVERY_S = 30.0  # one utilization sample per process this often in the parts


class Objects(Protocol):
    """Named byte strings under one run's prefix (Cloud Storage objects, for the gcp provider)."""

    def put(self, name: str, data: bytes) -> None: ...

    def get(self, name: str) -> bytes | None: ...

    def names(self, prefix: str = "") -> list[str]: ...


class Publisher:
    """The supervisor's side: what its store has that was not published yet."""

    def __init__(self, store: RunStore, objects: Objects, run_id: str):
        self.store, self.objects, self.run_id = store, objects, run_id
        self._after = {table: 0 for table in RunStore.COPIED}
        self._parts = 0
        self._sampled: dict[tuple[str, int], float] = {}  # (role, index) -> time of its last published sample

    def publish(self, progress: dict[str, Any] | None = None) -> None:
        rows = {}
        for table in RunStore.COPIED:
            rows[table], self._after[table] = self.store.rows_after(table, self.run_id, self._after[table])
        rows["utilization"] = [r for r in rows["utilization"] if self._due(r)]
        if any(rows.values()):
            self._parts += 1
            part = {"run_id": self.run_id, **rows, "trainer_results": self.store.trainer_results(self.run_id)}
            self.objects.put(PART.format(self._parts), json.dumps(part).encode())
        events = [e.as_json() for e in self.store.events(self.run_id)[-RECENT_EVENTS:]]
        latest = {"run": self.store.run_row(self.run_id), "progress": progress or {}, "parts": self._parts,
                  "written_at": time.time(), "events": events}
        self.objects.put(LATEST, json.dumps(latest).encode())


    def _due(self, row: dict[str, Any]) -> bool:
        key = (row["role"], row["idx"])
        if row["t"] - self._sampled.get(key, -UTILIZATION_EVERY_S) < UTILIZATION_EVERY_S:
            return False
        self._sampled[key] = row["t"]
        return True


def read_latest(objects: Objects) -> CloudLatest | None:
    data = objects.get(LATEST)
    return CloudLatest.model_validate(json.loads(data)) if data else None


def import_record(store: RunStore, objects: Objects, run_id: str, imported: set[str]) -> CloudLatest | None:
    """Bring `store`'s copy of the run up to date; `imported` holds the parts already taken (and gains the
    new ones). Returns latest.json, or None if the run has published nothing."""
    latest = read_latest(objects)
    if latest is None:
        return None
    for name in sorted(n for n in objects.names("part-") if n not in imported):
        data = objects.get(name)
        if data is None:
            continue
        part = json.loads(data)
        for table in RunStore.COPIED:
            store.add_rows(table, part.get(table, []))
        for trainer, result in part.get("trainer_results", {}).items():
            store.set_trainer_result(run_id, int(trainer), result)
        imported.add(name)
    row = latest.run
    if row:
        local = store.run_row(run_id)
        # Keep where this machine has the run (its own run dir and spec path), take the rest.
        keep = {k: local[k] for k in ("run_dir", "spec_path") if local and local.get(k)}
        store.put_run_row({**row, **keep})
    left = left_behind(objects)  # written after the supervisor's last publish: an event of the record here
    if left and not any(e.kind == LEFT_BEHIND for e in store.events(run_id)):
        store.add_event(run_id, LEFT_BEHIND, f"its supervisor could not delete everything: {left}")
    store.flush()
    return latest


def request_stop(objects: Objects, reason: str) -> None:
    objects.put(STOP, json.dumps({"reason": reason, "at": time.time()}).encode())


def stop_requested(objects: Objects) -> str | None:
    data = objects.get(STOP)
    return json.loads(data).get("reason", "stop requested") if data else None


def still_following(objects: Objects, beat: int) -> None:
    """The attached `dsctl up`'s heartbeat: a new value each time (the supervisor compares values, never clocks)."""
    objects.put(FOLLOWER, json.dumps({"beat": beat, "at": time.time()}).encode())


def follower_beat(objects: Objects) -> int | None:
    data = objects.get(FOLLOWER)
    return json.loads(data).get("beat") if data else None


def record_left_behind(objects: Objects, what: str) -> None:
    objects.put(LEFT_BEHIND, json.dumps({"what": what, "at": time.time()}).encode())


def left_behind(objects: Objects) -> str | None:
    """What the run's supervisor said it could not delete, if anything."""
    data = objects.get(LEFT_BEHIND)
    return json.loads(data).get("what") if data else None
