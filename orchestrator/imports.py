"""A run's record survives its database: runs.db removed or replaced while a run runs, and `dsctl runs import`.

SQLite keeps writing to the file it opened, so a runs.db removed (or replaced by another file) mid-run would take
the run's record with it while `dsctl up` went on and said nothing. `dsctl up` looks at the path every half second
(RunStore.replaced); when the file there is no longer the one it opened, the run's record so far is read from the
connection it still has, that connection is closed (SQLite folds its journal into the old file and removes the
journal files, so the new database never meets them), and the record is written to the runs.db now at the path,
made anew where none is; the run goes on recording there (event `records-rebuilt`). Where no runs.db can be made
there (a read-only or unwritable home), the record goes on in `<run dir>/records.db`, and `dsctl up` ends non-zero
saying so and how to add it: `dsctl runs import RUN_DIR`.

Every run also keeps what it was created with in `<run dir>/run.json` (its row as first recorded), so a run whose
record is gone and that left no records.db (its `dsctl up` killed too) is rebuilt from its files by `dsctl runs
import RUN_DIR` (and by `dsctl down`): that row, its trainers' own metrics files (closing.py, reconcile.py), and
the outcome `dsctl up` left in the run dir if it could not record it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from dsctl.provisioners import Deployment, load_deployment
from dsctl.provisioners.processes import is_ours
from dsctl.runtime.readiness import write_json_atomic
from dsctl.specs import SpecError

from . import closing
from .home import dsctl_home
from .records import RunRecord
from .store import RunStore, StoreError

RUN_FILE = "run.json"  # the run's row as first recorded
KEPT_DB = "records.db"  # the run's record, kept in its run dir when runs.db could not be made again
TABLES = ("windows", "events", "utilization")


def write_run_file(run_dir: Path, row: dict) -> None:
    """Keep the run's row as first recorded (its spec is spec.json and spec.yaml beside it) for a rebuild."""
    write_json_atomic(Path(run_dir) / RUN_FILE, {k: v for k, v in row.items() if k not in ("spec_yaml", "spec_json")})


def copy_run(source: RunStore, target: RunStore, run_id: str) -> int:
    """Everything `source` holds of the run (its row, windows, events, utilization, trainer results) written to
    `target` (deferred there as any write is: store.keep_unwritten keeps what cannot be written now); the rows
    copied."""
    row = source.run_row(run_id)
    if row is None:
        return 0
    tables = {table: source.rows_after(table, run_id, 0)[0] for table in TABLES}
    results = source.trainer_results(run_id)
    target.put_run_row(row)
    for table, rows in tables.items():
        target.add_rows(table, rows)
    for index, result in results.items():
        target.set_trainer_result(run_id, index, result)
    return 1 + sum(len(rows) for rows in tables.values()) + len(results)


def rebuild(store: RunStore, run_id: str, run_dir: Path) -> tuple[RunStore, str]:
    """The store to go on recording the run in, now that `store`'s file is no longer at its path: the runs.db there
    (made anew if there is none), or `<run dir>/records.db` where none can be; and what was done, for the run's
    events. Never raises: the run goes on either way."""
    old = store.path
    try:  # read before the old file is closed, which folds its journal into it and removes the journal files
        rows = _read(store, run_id)
    except sqlite3.Error as exc:  # the old file itself was damaged: what the run writes from now on is kept
        rows, lost = _nothing(), f" (what it held could not be read: {exc})"
    else:
        lost = ""
    store.close()
    try:
        target = RunStore(old)
        where = f"the new {old}"
    except (StoreError, OSError) as exc:
        target = RunStore(Path(run_dir) / KEPT_DB)
        where = (f"{Path(run_dir) / KEPT_DB}, because no runs.db could be made at {old} ({exc}); `dsctl runs import "
                 f"{run_dir}` adds it there")
    _write(target, rows)
    return target, (f"{old} was removed or replaced while the run ran (SQLite would have gone on writing to the old "
                    f"file, out of reach); the run's record so far was read from it{lost} and written to {where}, and "
                    "the run records there from now on")


def _read(store: RunStore, run_id: str) -> dict:
    return {"row": store.run_row(run_id), "results": store.trainer_results(run_id),
            **{table: store.rows_after(table, run_id, 0)[0] for table in TABLES}}


def _nothing() -> dict:
    return {"row": None, "results": {}, **{table: [] for table in TABLES}}


def _write(target: RunStore, rows: dict) -> None:
    if rows["row"] is not None:
        target.put_run_row(rows["row"])
    for table in TABLES:
        target.add_rows(table, rows[table])
    for index, result in rows["results"].items():
        target.set_trainer_result(rows["row"]["id"], index, result)


def kept_elsewhere(store: RunStore) -> bool:
    """Whether `store` is a run's own records.db (runs.db could not be made again), not DSCTL_HOME's runs.db."""
    return store.path.name == KEPT_DB


def import_run(store: RunStore, run_dir: Path) -> tuple[RunRecord, str]:
    """`dsctl runs import RUN_DIR`: the run's record added to `store`, from the records.db its `dsctl up` kept there,
    else rebuilt from its files (run.json, its trainers' metrics files, the outcome `dsctl up` left); (the record,
    how). SpecError for a folder that is no run's, a run still up, or one already recorded."""
    run_dir = Path(run_dir).expanduser().resolve()
    kept = run_dir / KEPT_DB
    row = _run_file(run_dir)
    run_id = row["id"]
    _not_up(run_dir, run_id)
    existing = closing.exact_record(store, run_id)
    if existing is not None and existing.status != "running":
        raise SpecError(f"run {run_id} is already recorded in {store.path} ({existing.status}); nothing to import. "
                        f"`dsctl runs show {run_id}` shows it.")
    if kept.exists():
        source = RunStore(kept)
        copied = copy_run(source, store, run_id)
        source.close()
        closing.keep_record(store, str(run_dir), run_id)
        kept.rename(kept.with_name(f"{KEPT_DB}.imported-{time.strftime('%Y%m%dT%H%M%S')}"))
        return store.recorded(run_id), f"copied whole from {kept} ({copied} rows)"
    if existing is None:
        spec_json = _read_text(run_dir / "spec.json")
        if spec_json is None:
            raise SpecError(f"{run_dir} has no spec.json, so its run cannot be recorded again.")
        store.create_run(**{**row, "status": "running", "spec_json": spec_json,
                            "spec_yaml": _read_text(run_dir / "spec.yaml"), "run_dir": str(run_dir)})
    record = store.recorded(run_id)
    closing.close_run(store, record, _deployment(run_dir, row), monitor_gone=False, by="dsctl runs import")
    closing.keep_record(store, str(run_dir), run_id)
    return store.recorded(run_id), f"rebuilt from its files in {run_dir} (its utilization samples and events are lost)"


def rebuild_missing(store: RunStore, dep: Deployment) -> RunRecord | None:
    """`dsctl down` of a run whose record is gone from runs.db: its row made again from its files, for closing.py
    to close; None where it is recorded, or kept no files to rebuild it from (or a whole copy: `dsctl runs import`)."""
    run_dir = Path(dep.run_dir)
    if closing.exact_record(store, dep.run_id) is not None or not (run_dir / RUN_FILE).exists() \
            or (run_dir / KEPT_DB).exists():
        return None
    row = _run_file(run_dir)
    spec_json = _read_text(run_dir / "spec.json")
    if spec_json is None:
        return None
    store.create_run(**{**row, "status": "running", "spec_json": spec_json,
                        "spec_yaml": _read_text(run_dir / "spec.yaml"), "run_dir": str(run_dir)})
    store.add_event(row["id"], "records-rebuilt", f"its record was not in {store.path}; dsctl down rebuilt it from "
                                                  f"its files in {run_dir} (its utilization samples and events are lost)")
    return closing.exact_record(store, row["id"])


def _run_file(run_dir: Path) -> dict:
    try:
        row = json.loads((run_dir / RUN_FILE).read_text())
    except FileNotFoundError:
        raise SpecError(f"{run_dir} is not a run's folder that dsctl can import: it has no {RUN_FILE} (every run dsctl "
                        f"makes keeps one; runs are in {dsctl_home() / 'runs'}).") from None
    except (OSError, ValueError) as exc:
        raise SpecError(f"{run_dir / RUN_FILE} cannot be read ({exc}), so its run cannot be imported.") from None
    if not isinstance(row, dict) or not isinstance(row.get("id"), str):
        raise SpecError(f"{run_dir / RUN_FILE} does not describe a run (no id), so it cannot be imported.")
    return row


def _not_up(run_dir: Path, run_id: str) -> None:
    try:
        dep = load_deployment(run_dir)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return  # no state, or an unreadable one: nothing says it is up
    if dep.status != "down" and any(is_ours(n) for n in dep.nodes):
        raise SpecError(f"run {run_id} is still up; its `dsctl up` records it when it ends (`dsctl down {run_id}` "
                        "ends it now). Import it once it is down.")


def _deployment(run_dir: Path, row: dict) -> Deployment:
    try:
        return load_deployment(run_dir)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return Deployment(run_id=row["id"], provider=row.get("provider") or "local", run_dir=str(run_dir))


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
