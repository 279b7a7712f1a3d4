"""Run records in one SQLite file under DSCTL_HOME: specs, outcomes, metrics windows, utilization, events.

Rows are written as results arrive (one short transaction each), so a crash or
`kill -9` loses nothing that was already measured.

A database that is locked by another program or on a full disk must not fail a run
or lose what it measured: a write that cannot be made waits in a backlog (in order)
and is retried before the next one (reads of the run count it); what is still unwritten
when the run ends is kept as SQL in a file of the run's directory (`unrecorded-*.jsonl`,
written whole or not at all) and written by the next dsctl command that opens the store,
once.

A file that is not (or no longer) an SQLite database is moved aside, never deleted, and a
new one is started; a notice (`notices`) tells the user where it went and how to recover its rows.
Errors the store cannot absorb (locked at open, a full disk when a run starts) are one
StoreError paragraph naming the file and what to do.
"""

from __future__ import annotations

import builtins
import json
import math
import os
import shlex
import shutil
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsctl.specs import UsageError

from .home import StoreError, dsctl_home, existing, notices, private_home, read_only, tighten
from .records import RunEvent, RunRecord, summary_json

if TYPE_CHECKING:
    from dsctl.runtime.sampler import Sample

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    kind TEXT NOT NULL DEFAULT 'job',          -- job | sweep | point
    parent_id TEXT,                            -- the sweep a point belongs to
    provider TEXT NOT NULL,
    mode TEXT NOT NULL,                        -- service | colocated | ideal
    status TEXT NOT NULL,                      -- running | succeeded | failed | interrupted
    spec_path TEXT,
    spec_yaml TEXT,
    spec_json TEXT NOT NULL,
    spec_hash TEXT NOT NULL,
    workers INTEGER NOT NULL,
    trainers INTEGER NOT NULL,
    created_at REAL NOT NULL,
    ended_at REAL,
    run_dir TEXT,
    error TEXT,
    summary_json TEXT,
    resumed_from TEXT,                         -- the run whose checkpoints this one restored (dsctl up --resume)
    checkpoint_dir TEXT                        -- where this run's trainers write checkpoints (trainer-<i> below it)
);
CREATE TABLE IF NOT EXISTS windows (
    run_id TEXT NOT NULL, trainer INTEGER NOT NULL, t_start REAL, t_end REAL,
    batches INTEGER, examples INTEGER, batches_per_s REAL, mean_batch_time_s REAL,
    input_wait_s REAL, step_s REAL, tokens INTEGER, padded_tokens INTEGER, warmup INTEGER, workers INTEGER,
    queue_fill REAL, loss REAL, metrics TEXT,    -- metrics: the model's own, as JSON {name: value}
    local_workers INTEGER                        -- hybrid placement: workers in the trainer's own process
);
CREATE TABLE IF NOT EXISTS trainer_results (
    run_id TEXT NOT NULL, trainer INTEGER NOT NULL, result_json TEXT NOT NULL,
    PRIMARY KEY (run_id, trainer)
);
CREATE TABLE IF NOT EXISTS utilization (
    run_id TEXT NOT NULL, t REAL NOT NULL, role TEXT NOT NULL, idx INTEGER NOT NULL,
    cpu_cores REAL, rss_bytes INTEGER, cpu_seconds REAL
);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL, t REAL NOT NULL, kind TEXT NOT NULL, message TEXT
);
CREATE TABLE IF NOT EXISTS replayed (
    file TEXT PRIMARY KEY                      -- a kept unrecorded-*.jsonl, written in the same transaction
);
CREATE INDEX IF NOT EXISTS windows_run ON windows(run_id);
CREATE INDEX IF NOT EXISTS utilization_run ON utilization(run_id);
CREATE INDEX IF NOT EXISTS events_run ON events(run_id);
"""

BUSY_TIMEOUT_S = 5.0  # one write waits this long for a lock before it joins the backlog
RETRY_EVERY_S = 2.0  # while writes are failing, try the backlog again at most this often
UNRECORDED = "unrecorded"  # unrecorded-<ns>-<pid>.jsonl in a run dir (unrecorded.jsonl from older versions)
DAMAGED = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB: the file is not (or no longer) a database
AMBIGUOUS_SHOWN = 10  # ids an ambiguous prefix's error lists
FULL_BELOW = 1 << 20  # bytes free under which a failing database is said to be on a full disk
# The statements this module defers; nothing else in a kept file is replayed.
REPLAYABLE = ("UPDATE runs SET ", "INSERT INTO windows ", "INSERT OR REPLACE INTO trainer_results ",
              "INSERT INTO utilization ", "INSERT INTO events ")

NAN_TEXT = "nan"  # a window's loss that was NaN (SQLite stores a NaN REAL as NULL; infinities it keeps)
WINDOW_FIELDS = ("trainer", "t_start", "t_end", "batches", "examples", "batches_per_s", "mean_batch_time_s",
                 "input_wait_s", "step_s", "tokens", "padded_tokens", "warmup", "queue_fill", "loss", "metrics",
                 "local_workers")
# Columns added after a release, with their types: a runs.db written by an older dsctl gains them on open.
ADDED_COLUMNS = {"windows": {"queue_fill": "REAL", "loss": "REAL", "metrics": "TEXT", "local_workers": "INTEGER"},
                 "runs": {"resumed_from": "TEXT", "checkpoint_dir": "TEXT"}}

class AmbiguousRun(UsageError):
    """A run-id prefix that begins several runs' ids (a usage error, exit 2): they are listed, newest first."""

    def __init__(self, ref: str, ids: builtins.list[str], what: str = "runs"):
        shown = ", ".join(ids[:AMBIGUOUS_SHOWN]) + (f" and {len(ids) - AMBIGUOUS_SHOWN} more"
                                                    if len(ids) > AMBIGUOUS_SHOWN else "")
        super().__init__(f"'{ref}' is ambiguous: it begins the ids of {len(ids)} {what}: {shown}. Give more of the id "
                         "(`dsctl runs` lists them).")
        self.ids = ids


def _damaged(exc: sqlite3.Error) -> bool:
    """The file is not (or no longer) an SQLite database: not a lock, a full disk or an I/O error."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return code & 0xFF in DAMAGED
    return type(exc) is sqlite3.DatabaseError  # what older Pythons raise for exactly those two


def _busy(error: str | None) -> bool:
    """A lock held by another connection: waiting helps (a full disk or an I/O error seldom clears by itself)."""
    return error is not None and "locked" in error


class RunStore:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else dsctl_home() / "runs.db"
        private_home(self.path.parent)
        self._backlog: list[tuple[str, list[Any]]] = []  # (sql, rows) not written yet, oldest first
        self._next_retry = 0.0
        self.last_error: str | None = None
        try:
            self._open()
        except sqlite3.DatabaseError as exc:
            if not _damaged(exc):
                raise self._unusable(exc) from None
            notices.warning(self._set_aside(exc))
            try:
                self._open()
            except sqlite3.DatabaseError as again:
                raise self._unusable(again) from None

    def _open(self) -> None:
        """Connect, make the schema, and write what earlier commands kept in run dirs."""
        self._ino = _inode(self.path)
        self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._ino = _inode(self.path)  # the file as it is now made: what `replaced` compares with
        self._add_missing_columns()
        for suffix in ("", "-wal", "-shm"):
            tighten(Path(f"{self.path}{suffix}"), 0o600)
        self._replay_unrecorded()

    def _set_aside(self, exc: sqlite3.Error) -> str:
        """Move the damaged file (with its -wal and -shm) aside, never deleting it; the paragraph that says so.
        Moved before the connection closes: closing deletes a -wal that is still where it was."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside, n = self.path.with_name(f"{self.path.name}.corrupt-{stamp}"), 1
        while any(Path(f"{aside}{s}").exists() for s in ("", "-wal", "-shm")):
            aside, n = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}"), n + 1
        if _inode(self.path) == self._ino:  # not already moved by another dsctl command
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.rename(f"{self.path}{suffix}", f"{aside}{suffix}")
                except FileNotFoundError:
                    pass
        self._db.close()
        old, new = shlex.quote(str(aside)), shlex.quote(str(self.path))
        return (f"{self.path} is not a usable SQLite database ({exc}), so it was moved to {aside} (nothing is "
                "deleted) and dsctl goes on with a new, empty one. To copy into the new one the runs that SQLite can "
                f"still read: sqlite3 {old} '.dump --data-only' | sqlite3 {new}")

    def _unusable(self, exc: sqlite3.Error) -> StoreError:
        return StoreError(f"{self.path} cannot be opened ({exc}): {self._remedy(exc)}")

    def _remedy(self, exc: sqlite3.Error) -> str:
        """What the user can do about an error the store cannot absorb."""
        if _busy(str(exc)):
            return ("another program holds a lock on it (an open sqlite3 shell, a backup?); close that and run the "
                    "command again.")
        if read_only(existing(self.path.parent)):
            return (f"{self.path.parent} is on a read-only file system: remount it read-write (or set DSCTL_HOME to a "
                    "folder that is not), and run the command again.")
        try:
            full = shutil.disk_usage(self.path.parent).free < FULL_BELOW
        except OSError:
            full = False
        if full or "full" in str(exc):
            return f"the disk is full; free some space in {self.path.parent} and run the command again."
        return f"check that {self.path.parent} is yours and writable, and run the command again."

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """A damaged file found in use is moved aside as on open, and the command stops with the paragraph."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if not _damaged(exc):
                raise
            raise StoreError(self._set_aside(exc)) from None

    def _rows(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[sqlite3.Row]:
        with self._guard():
            return self._db.execute(sql, args).fetchall()

    def _add_missing_columns(self) -> None:
        for table, columns in ADDED_COLUMNS.items():
            have = {row["name"] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for name, kind in columns.items():
                if name not in have:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    def close(self) -> None:
        self._db.close()

    def replaced(self) -> bool:
        """Whether the file at this store's path is no longer the one it opened: removed, or another moved there
        (SQLite goes on writing to the one it opened, where no dsctl command will look: orchestrator/imports.py)."""
        try:
            return _inode(self.path) != self._ino
        except OSError:
            return False  # cannot be looked at now (a permission changed): nothing to say it moved

    # -- writing ---------------------------------------------------------------
    def create_run(self, **cols: Any) -> None:
        """The one write that is never deferred: a run that cannot be recorded does not start."""
        cols.setdefault("created_at", time.time())
        names = ", ".join(cols)
        try:
            with self._guard():
                self._db.execute(f"INSERT INTO runs ({names}) VALUES ({', '.join('?' * len(cols))})",
                                 tuple(cols.values()))
        except sqlite3.OperationalError as exc:
            raise StoreError(f"{self.path} would not take the record of a new run ({exc}), so nothing was started: "
                             f"{self._remedy(exc)}") from None

    def update_run(self, run_id: str, **cols: Any) -> None:
        if "summary" in cols:
            cols["summary_json"] = summary_json(cols.pop("summary"))
        sets = ", ".join(f"{k} = ?" for k in cols)
        self._write(f"UPDATE runs SET {sets} WHERE id = ?", [(*cols.values(), run_id)])

    def add_window(self, run_id: str, window: dict[str, Any], workers: int | None) -> None:
        values = [window.get(f) for f in WINDOW_FIELDS]
        loss = values[WINDOW_FIELDS.index("loss")]
        if isinstance(loss, float) and math.isnan(loss):  # SQLite keeps NaN as NULL: as text, it stays NaN
            values[WINDOW_FIELDS.index("loss")] = NAN_TEXT
        metrics = window.get("metrics")
        values[WINDOW_FIELDS.index("metrics")] = json.dumps(metrics) if metrics else None
        self._write(
            f"INSERT INTO windows (run_id, {', '.join(WINDOW_FIELDS)}, workers) "
            f"VALUES ({', '.join('?' * (len(WINDOW_FIELDS) + 2))})",
            [(run_id, *values, workers)],
        )

    def set_trainer_result(self, run_id: str, trainer: int, result: dict[str, Any]) -> None:
        self._write("INSERT OR REPLACE INTO trainer_results (run_id, trainer, result_json) VALUES (?, ?, ?)",
                    [(run_id, trainer, json.dumps(result))])

    def add_utilization(self, run_id: str, t: float, rows: list[Sample]) -> None:
        self._write(
            "INSERT INTO utilization (run_id, t, role, idx, cpu_cores, rss_bytes, cpu_seconds) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(run_id, t, s.role, s.index, s.cpu_cores, s.rss_bytes, s.cpu_seconds) for s in rows],
        )

    def add_event(self, run_id: str, kind: str, message: str, t: float | None = None) -> None:
        self._write("INSERT INTO events (run_id, t, kind, message) VALUES (?, ?, ?, ?)",
                    [(run_id, t or time.time(), kind, message)])

    # -- writes that cannot be made now ---------------------------------------------
    def _write(self, sql: str, rows: list[Any]) -> None:
        self._backlog.append((sql, [list(r) for r in rows]))
        if time.monotonic() >= self._next_retry:
            self.flush()

    def flush(self) -> bool:
        """Write the backlog, oldest first; False (and the error kept) if the database still refuses."""
        while self._backlog:
            sql, rows = self._backlog[0]
            try:
                self._transaction([(sql, rows)])
            except sqlite3.DatabaseError as exc:  # locked, disk full, I/O error, damaged: try again, or keep it
                if not (isinstance(exc, sqlite3.OperationalError) or _damaged(exc)):
                    raise
                self.last_error = str(exc)
                self._next_retry = time.monotonic() + RETRY_EVERY_S
                return False
            self._backlog.pop(0)
        self.last_error = None
        return True

    @property
    def pending(self) -> int:
        return len(self._backlog)

    def keep_unwritten(self, run_dir: str | Path, wait_s: float = 30.0) -> Path | None:
        """At the end of a run: retry the backlog while the database is locked (up to `wait_s`), then keep what is
        left in a new unrecorded-*.jsonl in the run dir, whole or not at all (None when everything was written).
        Raises OSError if it cannot be kept either."""
        deadline = time.monotonic() + wait_s
        while not self.flush() and _busy(self.last_error) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not self._backlog:
            return None
        path = Path(run_dir) / f"{UNRECORDED}-{time.time_ns()}-{os.getpid()}.jsonl"
        tmp = path.with_suffix(".tmp")
        try:
            with open(tmp, "w") as f:
                for sql, rows in self._backlog:
                    f.write(json.dumps({"sql": sql, "rows": rows}) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        self._backlog.clear()
        return path

    def _replay_unrecorded(self) -> None:
        """Write what earlier commands kept in run dirs. A file goes once all of it is written; its name is
        written with it, so two commands opening the store at once do not both write it."""
        for path in sorted(self.path.parent.glob(f"runs/*/{UNRECORDED}*.jsonl")):
            try:
                statements = _replayable(path.read_text())
                self._transaction(statements, once=f"{path.parent.name}/{path.name}")
            except (OSError, ValueError, KeyError, TypeError, AttributeError, sqlite3.Error) as exc:
                if isinstance(exc, sqlite3.Error) and _damaged(exc):
                    raise  # the database itself: moved aside like one found damaged on open
                if not _busy(str(exc)):  # a lock passes by itself; anything else, the user should hear of
                    notices.warning(f"{path} could not be added to {self.path} ({exc}); it is left there for the "
                                    "next command.")
                continue
            path.unlink(missing_ok=True)

    def _transaction(self, statements: list[tuple[str, list[Any]]], once: str | None = None) -> None:
        """All the statements or none (the connection is in autocommit mode otherwise). With `once` (a kept
        file's name): none if that name was written before, and the name with them otherwise."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if once is not None:
                done = self._db.execute("SELECT 1 FROM replayed WHERE file = ?", (once,)).fetchone()
                statements = [] if done else [*statements, ("INSERT INTO replayed (file) VALUES (?)", [(once,)])]
            for sql, rows in statements:
                self._db.executemany(sql, rows)
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _pending(self, table: str, run_id: str) -> list[dict[str, Any]]:
        """The run's rows of `table` still in the backlog: what a run reads back (its summary) counts them too."""
        head = f"INSERT INTO {table} ("
        out = []
        for sql, rows in self._backlog:
            if sql.startswith(head):
                cols = [c.strip() for c in sql[len(head):sql.index(")")].split(",")]
                out += [d for d in (dict(zip(cols, r)) for r in rows) if d.get("run_id") == run_id]
        return out

    # -- reading ---------------------------------------------------------------
    def _record(self, row: sqlite3.Row) -> RunRecord:
        return RunRecord.from_row(dict(row))

    def get(self, run_id: str) -> RunRecord | None:
        """The run of this id, or of the one id this prefix begins; None for none or several (`find` says which)."""
        rows = self._rows("SELECT * FROM runs WHERE id = ?", (run_id,))
        if not rows:
            rows = self._rows("SELECT * FROM runs WHERE substr(id, 1, ?) = ? ORDER BY created_at DESC",
                              (len(run_id), run_id))
        return self._record(rows[0]) if len(rows) == 1 else None

    def find(self, ref: str) -> RunRecord | None:
        """The run a user named: its id, or a prefix of exactly one run's; None for no such run; AmbiguousRun, listing
        them, for a prefix of several."""
        record = self.get(ref)
        if record is not None or not ref:
            return record
        ids = [r[0] for r in self._rows("SELECT id FROM runs WHERE substr(id, 1, ?) = ? ORDER BY created_at DESC",
                                        (len(ref), ref))]
        if len(ids) > 1:
            raise AmbiguousRun(ref, ids)
        return None

    def recorded(self, run_id: str) -> RunRecord:
        """get() for a run this process has recorded; StoreError if its record is not there (deleted meanwhile)."""
        record = self.get(run_id)
        if record is None:
            raise StoreError(f"run {run_id} is not recorded in {self.path} (`dsctl runs` lists the runs there).")
        return record

    def list(self, limit: int | None = None, kinds: tuple[str, ...] = ("job", "sweep"), since: float | None = None,
             parent_id: str | None = None) -> list[RunRecord]:
        sql = f"SELECT * FROM runs WHERE kind IN ({', '.join('?' * len(kinds))})"
        args: list[Any] = list(kinds)
        if since is not None:
            sql += " AND created_at >= ?"
            args.append(since)
        if parent_id is not None:
            sql += " AND parent_id = ?"
            args.append(parent_id)
        sql += " ORDER BY created_at DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [self._record(r) for r in self._rows(sql, args)]

    def ids(self) -> builtins.list[str]:
        return [r[0] for r in self._rows("SELECT id FROM runs ORDER BY created_at DESC")]

    def windows(self, run_id: str) -> builtins.list[dict[str, Any]]:
        """The run's windows by end time; `metrics` decoded (a dict, or None)."""
        stored = [dict(r) for r in self._rows("SELECT * FROM windows WHERE run_id = ? ORDER BY t_end", (run_id,))]
        pending = self._pending("windows", run_id)
        out = sorted(stored + pending, key=lambda w: w["t_end"]) if pending else stored
        for w in out:
            w["metrics"] = json.loads(w["metrics"]) if w.get("metrics") else None
            if w.get("loss") == NAN_TEXT:
                w["loss"] = math.nan
        return out

    def resumed_by(self, run_id: str) -> builtins.list[str]:
        """The runs that restored this run's checkpoints (`dsctl up --resume RUN`), oldest first."""
        return [r[0] for r in self._rows("SELECT id FROM runs WHERE resumed_from = ? ORDER BY created_at", (run_id,))]

    def trainer_results(self, run_id: str) -> dict[int, dict[str, Any]]:
        rows = self._rows("SELECT trainer, result_json FROM trainer_results WHERE run_id = ?", (run_id,))
        return {r[0]: json.loads(r[1]) for r in rows}

    def utilization(self, run_id: str) -> builtins.list[dict[str, Any]]:
        stored = [dict(r) for r in self._rows("SELECT * FROM utilization WHERE run_id = ? ORDER BY t", (run_id,))]
        pending = self._pending("utilization", run_id)
        return sorted(stored + pending, key=lambda u: u["t"]) if pending else stored

    def events(self, run_id: str) -> builtins.list[RunEvent]:
        return [RunEvent.model_validate(dict(r)) for r in self._rows("SELECT * FROM events WHERE run_id = ? ORDER BY t",
                                                                      (run_id,))]

    # -- copying a run's record between stores (orchestrator/cloudrecord.py) -------------------
    COPIED = ("windows", "events", "utilization")  # append-only tables, copied by rowid

    def run_row(self, run_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM runs WHERE id = ?", (run_id,))
        return dict(rows[0]) if rows else None

    def rows_after(self, table: str, run_id: str, rowid: int) -> tuple[builtins.list[dict[str, Any]], int]:
        """A copied table's rows of the run written after `rowid`, and the last rowid seen."""
        if table not in self.COPIED:
            raise ValueError(f"not a copied table: {table}")
        rows = self._rows(f"SELECT rowid AS _rowid, * FROM {table} WHERE run_id = ? AND rowid > ? ORDER BY rowid",
                          (run_id, rowid))
        out = [dict(r) for r in rows]
        last = out[-1].pop("_rowid") if out else rowid
        for r in out:
            r.pop("_rowid", None)
        return out, last

    def put_run_row(self, row: dict[str, Any]) -> None:
        """Insert or replace a run's row as another store had it (its columns; unknown ones are dropped)."""
        known = [c[1] for c in self._rows("PRAGMA table_info(runs)")]
        cols = {k: row[k] for k in known if k in row}
        self._write(f"INSERT OR REPLACE INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [tuple(cols.values())])

    def add_rows(self, table: str, rows: builtins.list[dict[str, Any]]) -> None:
        """Append rows of a copied table as another store had them."""
        if table not in self.COPIED:
            raise ValueError(f"not a copied table: {table}")
        if not rows:
            return
        known = [c[1] for c in self._rows(f"PRAGMA table_info({table})")]
        cols = [c for c in known if c in rows[0]]
        self._write(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [tuple(r.get(c) for c in cols) for r in rows])


def _inode(path: Path) -> int | None:
    """Which file `path` is now: another command may have moved a damaged one aside and started a new one."""
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _replayable(text: str) -> list[tuple[str, list[Any]]]:
    """A kept file's statements: only those this module defers (REPLAYABLE); nothing else in it is run."""
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [(e["sql"], e["rows"]) for e in entries if e["sql"].startswith(REPLAYABLE)]
