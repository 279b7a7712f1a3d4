"""TensorBoard servers started by `dsctl tensorboard`, recorded where `dsctl status` and `dsctl down` find them.

TensorBoard runs in a session of its own and is recorded in DSCTL_HOME/boards/<id>.json (pid, process group,
start time, address, runs, its token) the moment it starts. It serves only requests that carry its token
(orchestrator/boardserver.py): its port is open to every local user, its runs are not. Its output goes to
DSCTL_HOME/boards/<id>.log. `dsctl tensorboard` stops it when it ends, on Ctrl-C, SIGTERM
or SIGHUP; when it cannot (kill -9, the OOM killer), TensorBoard goes on serving, but `dsctl status` lists it
and `dsctl down` (by its id, or --all) stops it, by pid and start time, never by name: a pid reused by another
process is left alone. A record whose TensorBoard has ended is removed when next seen.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dsctl.errors import DsctlError
from dsctl.provisioners import ProcessRef
from dsctl.provisioners.processes import is_ours, reap, stop_groups
from dsctl.runtime.logtail import tail
from dsctl.specs import SpecError, UsageError

from .boardserver import BOARD_ENV
from .home import dsctl_home
from .store import RunStore

BOARDS = "boards"
DEFAULT_PORT = 6006
STOP_GRACE_S = 5.0


@dataclass
class Board:
    """One TensorBoard that `dsctl tensorboard` started."""

    id: str  # tensorboard-<port>: what `dsctl down` takes
    pid: int
    pgid: int
    create_time: float
    host: str
    port: int
    runs: list[str] = field(default_factory=list)
    started_at: float = 0.0
    owner: int | None = None  # the `dsctl tensorboard` that started it
    token: str | None = None  # what a request must carry (boardserver.py); None for a board an older dsctl started

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    @property
    def private_url(self) -> str:
        """The URL that opens it: with its token, for the user who started it alone."""
        return f"{self.url}?token={self.token}" if self.token else self.url

    @property
    def log(self) -> Path:
        return boards_dir() / f"{self.id}.log"

    @property
    def process(self) -> ProcessRef:
        return ProcessRef(pid=self.pid, pgid=self.pgid, create_time=self.create_time)

    @property
    def path(self) -> Path:
        return boards_dir() / f"{self.id}.json"

    def save(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, self.path)

    def forget(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only home: the next look finds its process gone and skips it


def boards_dir() -> Path:
    return dsctl_home() / BOARDS


def active_boards() -> list[Board]:
    """The TensorBoards still serving, oldest first; records of ended ones are removed."""
    out = []
    try:
        paths = sorted(boards_dir().glob("*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            board = Board(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if is_ours(board.process):
            out.append(board)
        else:
            board.forget()
    return sorted(out, key=lambda b: b.started_at)


def find_board(ref: str, boards: list[Board] | None = None) -> Board | None:
    """The serving TensorBoard whose id is `ref` (or starts with it, when only one does)."""
    boards = active_boards() if boards is None else boards
    exact = [b for b in boards if b.id == ref]
    if exact:
        return exact[0]
    matches = [b for b in boards if b.id.startswith(ref)]
    return matches[0] if len(matches) == 1 else None


def stop_board(board: Board) -> None:
    """Stop it (its process group: TensorBoard's own helpers too), then its record."""
    stop_groups([board.process], grace_s=STOP_GRACE_S)
    board.forget()


def logdirs(store: RunStore, refs: list[str]) -> dict[str, str]:
    """Run id -> the folder TensorBoard reads: the event files here, else the copy the spec asked for. SpecError
    for a run with no event files, naming why."""
    from .tbevents import board_dir, event_files

    if not refs:
        latest = store.list(limit=1, kinds=("job",))
        if not latest:
            raise SpecError("no runs are recorded yet, so there are no event files to show; `dsctl up JOB.yaml` "
                            "makes a run (each run writes them).")
        refs = [latest[0].id]
    out: dict[str, str] = {}
    for ref in refs:
        record = store.find(ref)
        if record is None:
            raise UsageError(f"no run '{ref}' is recorded; `dsctl runs` lists them.")
        board = record.summary.get("tensorboard") or {}
        here = board.get("dir") or (str(board_dir(record.run_dir)) if record.run_dir else None)
        copy = board.get("copy")
        if here and event_files(here):
            out[record.id] = here
        elif copy and (copy.startswith("gs://") or event_files(copy)):
            out[record.id] = copy
        else:
            looked = " or ".join(x for x in (here, copy) if x) or "its run directory"
            why = f" ({board['error']})" if board.get("error") else (
                " (it is still running and has not finished a metrics window)" if record.status == "running" else
                " (its trainers reported no metrics window, or it ran on another machine without trainer.tensorboard_dir)")
            raise SpecError(f"run {record.id} has no TensorBoard event files in {looked}{why}; choose another run "
                            "(`dsctl runs` lists them).")
    return out


def free_port(host: str) -> int:
    """DEFAULT_PORT if nothing listens there, else one the system picks."""
    for port in (DEFAULT_PORT, 0):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return s.getsockname()[1]
    return DEFAULT_PORT


def start_board(logdirs: dict[str, str], host: str, port: int) -> Board:
    """TensorBoard on `logdirs`, behind a new token, in a session of its own, recorded before this returns. If it
    cannot be recorded (a full or read-only home), it is stopped again and the OSError raised: nothing serves
    unrecorded. What to serve and the token go in its environment, never on its command line (boardserver.py)."""
    spec = ",".join(f"{rid}:{path}" for rid, path in logdirs.items())
    token = secrets.token_urlsafe(24)
    config = json.dumps({"token": token, "logdir_spec": spec, "host": host, "port": port})
    boards_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    log = boards_dir() / f"tensorboard-{port}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dsctl.orchestrator.boardserver"], start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, BOARD_ENV: config})
    try:
        import psutil

        created = psutil.Process(proc.pid).create_time()
    except Exception:  # noqa: BLE001 - it died at once: recorded with no start time, and found ended
        created = 0.0
    board = Board(id=f"tensorboard-{port}", pid=proc.pid, pgid=proc.pid, create_time=created, host=host, port=port,
                  runs=list(logdirs), started_at=time.time(), owner=os.getpid(), token=token)
    try:
        board.save()
    except BaseException:
        stop_board(board)
        raise
    return board


class BoardFailed(DsctlError):
    """TensorBoard exited by itself with an error; the message has its log's last lines."""


def serve(logdirs: dict[str, str], host: str, port: int | None, on_start: Callable[[Board], None]) -> None:
    """Start TensorBoard, tell `on_start`, and wait until it exits; BoardFailed (with its log's tail) if it failed.
    Ctrl-C (or a signal armed with dsctl.errors.stop_on_signals) stops it, removes its record and is raised again."""
    board = start_board(logdirs, host, port or free_port(host))
    try:
        on_start(board)
        while True:
            code = reap(board.pid)
            if code is not None:
                break
            time.sleep(0.2)
    finally:
        stop_board(board)
    if code:
        raise BoardFailed(f"TensorBoard exited with code {code}; its log ({board.log}) ends with:\n{tail(str(board.log))}")
