"""Run records in one SQLite file under DSCTL_HOME: specs, outcomes, metrics windows, utilization, events.

Rows are written as results arrive (one short transaction each), so a crash or
`kill -9` loses nothing that was already measured.

A database that is locked by another program or on a full disk must not fail a run
or lose what it measured: a write that cannot be made waits in a backlog (in order)
and is retried before the next one; what is still unwritten when the run ends is kept
as SQL in the run's directory (`unrecorded.jsonl`) and written by the next dsctl
command that opens the store.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

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
    summary_json TEXT
);
CREATE TABLE IF NOT EXISTS windows (
    run_id TEXT NOT NULL, trainer INTEGER NOT NULL, t_start REAL, t_end REAL,
    batches INTEGER, examples INTEGER, batches_per_s REAL, mean_batch_time_s REAL,
    input_wait_s REAL, step_s REAL, tokens INTEGER, padded_tokens INTEGER, warmup INTEGER, workers INTEGER,
    queue_fill REAL
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
CREATE INDEX IF NOT EXISTS windows_run ON windows(run_id);
CREATE INDEX IF NOT EXISTS utilization_run ON utilization(run_id);
CREATE INDEX IF NOT EXISTS events_run ON events(run_id);
"""

BUSY_TIMEOUT_S = 5.0  # one write waits this long for a lock before it joins the backlog
RETRY_EVERY_S = 2.0  # while writes are failing, try the backlog again at most this often
UNRECORDED = "unrecorded.jsonl"
# The statements this module defers; nothing else in an unrecorded.jsonl is replayed.
REPLAYABLE = ("UPDATE runs SET ", "INSERT INTO windows ", "INSERT OR REPLACE INTO trainer_results ",
              "INSERT INTO utilization ", "INSERT INTO events ")

WINDOW_FIELDS = ("trainer", "t_start", "t_end", "batches", "examples", "batches_per_s", "mean_batch_time_s",
                 "input_wait_s", "step_s", "tokens", "padded_tokens", "warmup", "queue_fill")
# Columns added after a release, with their types: a runs.db written by an older dsctl gains them on open.
ADDED_COLUMNS = {"windows": {"queue_fill": "REAL"}}


PRIVATE_UMASK = 0o077  # records, specs, state, logs and metrics: the user's alone (0600 files, 0700 dirs)


def dsctl_home() -> Path:
    """DSCTL_HOME (default ~/.dsctl). Whatever this process writes from here on is private (umask 0o077):
    every command that touches the home asks for it first, and the processes it starts inherit the umask."""
    os.umask(PRIVATE_UMASK)
    return Path(os.environ.get("DSCTL_HOME") or Path.home() / ".dsctl")


def _tighten(path: Path, mode: int) -> bool:
    """chmod `path` to `mode` if it is ours, not a symlink and looser; True if it was changed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & ~mode == 0:
        return False
    if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
        return False  # a shared directory such as /tmp named as DSCTL_HOME: not ours to close
    os.chmod(path, stat.S_IMODE(st.st_mode) & mode)
    return True


def private_home(home: Path) -> None:
    """Make DSCTL_HOME the user's alone, and keep it so for everything this process writes.

    Sets the process umask to 0o077 (inherited by every process dsctl starts), creates the home
    0700, and tightens one that an older dsctl left open: the home, runs/ and every run under it
    on first sight (0700 dirs, 0600 files), the database files on every open.
    """
    os.umask(PRIVATE_UMASK)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    runs = home / "runs"
    try:
        _tighten(home, 0o700)
        if runs.is_dir() and _tighten(runs, 0o700):
            for root, dirs, files in os.walk(runs):
                for name in dirs:
                    _tighten(Path(root) / name, 0o700)
                for name in files:
                    _tighten(Path(root) / name, 0o600)
        else:
            runs.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        pass  # a full disk or a read-only home: the records matter more; the next open tries again


@dataclass
class RunRecord:
    id: str
    name: str
    kind: str
    parent_id: str | None
    provider: str
    mode: str
    status: str
    spec_path: str | None
    spec_yaml: str | None
    spec_json: str
    spec_hash: str
    workers: int
    trainers: int
    created_at: float
    ended_at: float | None
    run_dir: str | None
    error: str | None
    summary: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("spec_yaml", "spec_json")}
        d["spec"] = json.loads(self.spec_json)
        return d


class RunStore:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else dsctl_home() / "runs.db"
        private_home(self.path.parent)
        self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._add_missing_columns()
        for suffix in ("", "-wal", "-shm"):
            _tighten(Path(f"{self.path}{suffix}"), 0o600)
        self._backlog: list[tuple[str, list]] = []  # (sql, rows) not written yet, oldest first
        self._next_retry = 0.0
        self.last_error: str | None = None
        self._replay_unrecorded()

    def _add_missing_columns(self) -> None:
        for table, columns in ADDED_COLUMNS.items():
            have = {row["name"] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for name, kind in columns.items():
                if name not in have:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    def close(self) -> None:
        self._db.close()

    # -- writing ---------------------------------------------------------------
    def create_run(self, **cols) -> None:
        """The one write that is never deferred: a run that cannot be recorded does not start."""
        cols.setdefault("created_at", time.time())
        names = ", ".join(cols)
        self._db.execute(f"INSERT INTO runs ({names}) VALUES ({', '.join('?' * len(cols))})", tuple(cols.values()))

    def update_run(self, run_id: str, **cols) -> None:
        if "summary" in cols:
            cols["summary_json"] = json.dumps(cols.pop("summary"))
        sets = ", ".join(f"{k} = ?" for k in cols)
        self._write(f"UPDATE runs SET {sets} WHERE id = ?", [(*cols.values(), run_id)])

    def add_window(self, run_id: str, window: dict, workers: int | None) -> None:
        values = [window.get(f) for f in WINDOW_FIELDS]
        self._write(
            f"INSERT INTO windows (run_id, {', '.join(WINDOW_FIELDS)}, workers) VALUES ({', '.join('?' * (len(WINDOW_FIELDS) + 2))})",
            [(run_id, *values, workers)],
        )

    def set_trainer_result(self, run_id: str, trainer: int, result: dict) -> None:
        self._write("INSERT OR REPLACE INTO trainer_results (run_id, trainer, result_json) VALUES (?, ?, ?)",
                    [(run_id, trainer, json.dumps(result))])

    def add_utilization(self, run_id: str, t: float, rows: list) -> None:
        self._write(
            "INSERT INTO utilization (run_id, t, role, idx, cpu_cores, rss_bytes, cpu_seconds) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(run_id, t, s.role, s.index, s.cpu_cores, s.rss_bytes, s.cpu_seconds) for s in rows],
        )

    def add_event(self, run_id: str, kind: str, message: str, t: float | None = None) -> None:
        self._write("INSERT INTO events (run_id, t, kind, message) VALUES (?, ?, ?, ?)",
                    [(run_id, t or time.time(), kind, message)])

    # -- writes that cannot be made now ---------------------------------------------
    def _write(self, sql: str, rows: list) -> None:
        self._backlog.append((sql, [list(r) for r in rows]))
        if time.monotonic() >= self._next_retry:
            self.flush()

    def flush(self) -> bool:
        """Write the backlog, oldest first; False (and the error kept) if the database still refuses."""
        while self._backlog:
            sql, rows = self._backlog[0]
            try:
                self._transaction([(sql, rows)])
            except sqlite3.OperationalError as exc:  # locked, disk full, I/O error: try again later
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
        """At the end of a run: retry the backlog for up to `wait_s`, then append what is left to the
        run dir's unrecorded.jsonl (None when everything was written). Raises OSError if that fails too."""
        deadline = time.monotonic() + wait_s
        while not self.flush() and time.monotonic() < deadline:
            time.sleep(0.5)
        if not self._backlog:
            return None
        path = Path(run_dir) / UNRECORDED
        with open(path, "a") as f:
            for sql, rows in self._backlog:
                f.write(json.dumps({"sql": sql, "rows": rows}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._backlog.clear()
        return path

    def _replay_unrecorded(self) -> None:
        """Write what earlier runs kept in their run dirs; each file goes once it is written whole."""
        for path in sorted((self.path.parent / "runs").glob(f"*/{UNRECORDED}")):
            try:
                entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                statements = [(e["sql"], e["rows"]) for e in entries if e["sql"].startswith(REPLAYABLE)]
                self._transaction(statements)
            except (OSError, ValueError, KeyError, TypeError, AttributeError, sqlite3.Error):
                continue  # still locked or unreadable: kept for the next command
            path.unlink(missing_ok=True)

    def _transaction(self, statements: list[tuple[str, list]]) -> None:
        """All the statements or none (the connection is in autocommit mode otherwise)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for sql, rows in statements:
                self._db.executemany(sql, rows)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- reading ---------------------------------------------------------------
    def _record(self, row: sqlite3.Row) -> RunRecord:
        d = dict(row)
        summary = json.loads(d.pop("summary_json") or "{}")
        return RunRecord(summary=summary, **d)

    def get(self, run_id: str) -> RunRecord | None:
        row = self._db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            rows = self._db.execute("SELECT * FROM runs WHERE id LIKE ? ORDER BY created_at DESC", (run_id + "%",)).fetchall()
            row = rows[0] if len(rows) == 1 else None
        return self._record(row) if row else None

    def list(self, limit: int | None = None, kinds: tuple[str, ...] = ("job", "sweep"), since: float | None = None,
             parent_id: str | None = None) -> list[RunRecord]:
        sql = f"SELECT * FROM runs WHERE kind IN ({', '.join('?' * len(kinds))})"
        args: list = list(kinds)
        if since is not None:
            sql += " AND created_at >= ?"
            args.append(since)
        if parent_id is not None:
            sql += " AND parent_id = ?"
            args.append(parent_id)
        sql += " ORDER BY created_at DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [self._record(r) for r in self._db.execute(sql, args).fetchall()]

    def ids(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT id FROM runs ORDER BY created_at DESC").fetchall()]

    def windows(self, run_id: str) -> list[dict]:
        return [dict(r) for r in self._db.execute("SELECT * FROM windows WHERE run_id = ? ORDER BY t_end", (run_id,))]

    def trainer_results(self, run_id: str) -> dict[int, dict]:
        rows = self._db.execute("SELECT trainer, result_json FROM trainer_results WHERE run_id = ?", (run_id,))
        return {r[0]: json.loads(r[1]) for r in rows}

    def utilization(self, run_id: str) -> list[dict]:
        return [dict(r) for r in self._db.execute("SELECT * FROM utilization WHERE run_id = ? ORDER BY t", (run_id,))]

    def events(self, run_id: str) -> list[dict]:
        return [dict(r) for r in self._db.execute("SELECT * FROM events WHERE run_id = ? ORDER BY t", (run_id,))]

    # -- copying a run's record between stores (orchestrator/cloudrecord.py) -------------------
    COPIED = ("windows", "events", "utilization")  # append-only tables, copied by rowid

    def run_row(self, run_id: str) -> dict | None:
        row = self._db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return dict(row) if row else None

    def rows_after(self, table: str, run_id: str, rowid: int) -> tuple[list[dict], int]:
        """A copied table's rows of the run written after `rowid`, and the last rowid seen."""
        if table not in self.COPIED:
            raise ValueError(f"not a copied table: {table}")
        rows = self._db.execute(f"SELECT rowid AS _rowid, * FROM {table} WHERE run_id = ? AND rowid > ? ORDER BY rowid",
                                (run_id, rowid)).fetchall()
        out = [dict(r) for r in rows]
        last = out[-1].pop("_rowid") if out else rowid
        for r in out:
            r.pop("_rowid", None)
        return out, last

    def put_run_row(self, row: dict) -> None:
        """Insert or replace a run's row as another store had it (its columns; unknown ones are dropped)."""
        known = [c[1] for c in self._db.execute("PRAGMA table_info(runs)")]
        cols = {k: row[k] for k in known if k in row}
        self._write(f"INSERT OR REPLACE INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [tuple(cols.values())])

    def add_rows(self, table: str, rows: list[dict]) -> None:
        """Append rows of a copied table as another store had them."""
        if table not in self.COPIED:
            raise ValueError(f"not a copied table: {table}")
        if not rows:
            return
        known = [c[1] for c in self._db.execute(f"PRAGMA table_info({table})")]
        cols = [c for c in known if c in rows[0]]
        self._write(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [tuple(r.get(c) for c in cols) for r in rows])
