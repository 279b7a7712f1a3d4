"""Requests to the process that owns a detached deployment.

`dsctl up --detach` leaves a monitor process supervising the service; it is
the only writer of the deployment's state. Other dsctl commands (a sweep on
that deployment) ask it to act through request files in the run dir and wait
for its answer, so two processes never race on the state file.

The files, in `<run dir>/control/`:

    serving.json     written when the monitor starts serving requests (once its own job has ended)
    <id>.req         a request: op, args, its deadline (wall clock) and its caller (pid, start time)
    <id>.taken       a request the monitor has claimed (renamed from .req) and is acting on
    <id>.resp        the answer, removed by the caller when read
    sweep.lock       flock'ed by the sweep that holds the deployment; sweep.json says who that is

No request outlives its timeout. The monitor claims a request by renaming it and acts only on one
whose deadline has not passed and whose caller still runs; anything else it removes unread (event
`request-expired`). A caller that gives up (timeout, Ctrl-C, a dead monitor) withdraws its request
by removing it: whichever of the rename and the removal comes first wins, so a withdrawn request is
never acted on, and one the monitor claimed in time is answered (the caller waits for that answer
as long as the request allows for acting on it). Request ids start with the time they were made,
so the monitor serves them in that order.
"""

from __future__ import annotations

import fcntl
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard

import psutil

from dsctl.provisioners import ProcessRef
from dsctl.provisioners.processes import is_ours
from dsctl.runtime.readiness import read_json, write_json_atomic

from .outcome import RunFailed

DEFAULT_TIMEOUT_S = 30.0  # to be taken: the monitor takes a request within a fraction of a second
SERVING_FILE, LOCK_FILE, HOLDER_FILE = "serving.json", "sweep.lock", "sweep.json"
LIVENESS_CHECK_S = 0.5


class ControlError(RunFailed):
    """The monitor failed the request or did not answer in time (exit 1)."""


class DeploymentBusy(RunFailed):
    """The deployment cannot take a sweep now; nothing was asked of it (exit 1)."""


def control_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "control"


def _me() -> dict:
    return {"pid": os.getpid(), "create_time": psutil.Process().create_time()}


def process_alive(who: dict | None) -> TypeGuard[dict]:
    """True while the process {pid, create_time} named in a control file still runs (the same one, not a reused pid)."""
    if not who or not who.get("pid"):
        return False
    try:
        created = who.get("create_time")
        created = None if created is None else float(created)
        return is_ours(ProcessRef(pid=int(who["pid"]), create_time=created))
    except (psutil.Error, ValueError, TypeError):
        return False


def serving(run_dir: str | Path) -> bool:
    """Whether the monitor has started serving requests (it has written serving.json: pid, start time, since)."""
    return (control_dir(run_dir) / SERVING_FILE).exists()


class ControlClient:
    def __init__(self, run_dir: str | Path, monitor: dict | None = None):
        self.dir = control_dir(run_dir)
        self.monitor = monitor  # {pid, create_time}: a monitor that exits fails the call at once

    def call(self, op: str, timeout_s: float = DEFAULT_TIMEOUT_S, answer_s: float | None = None, **args) -> dict:
        """The handler's result. ControlError if it failed, if the monitor did not take the request within
        timeout_s (it is then never acted on), or did not answer within answer_s (default timeout_s) after."""
        self.dir.mkdir(parents=True, exist_ok=True)
        req = self.dir / f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.req"
        deadline = time.time() + timeout_s
        answer_s = timeout_s if answer_s is None else answer_s
        write_json_atomic(req, {"op": op, "args": args, "deadline": deadline, "answer_s": answer_s, "caller": _me()})
        try:
            answer = self._wait(op, req, deadline, timeout_s, answer_s)
        finally:
            _withdraw(req)  # given up (timeout, Ctrl-C, a dead monitor): never acted on if not claimed yet
        req.with_suffix(".resp").unlink(missing_ok=True)
        if "error" in answer:
            raise ControlError(f"the deployment's monitor could not '{op}': {answer['error']}")
        return answer.get("result") or {}

    def _wait(self, op: str, req: Path, deadline: float, timeout_s: float, answer_s: float) -> dict:
        taken, resp = req.with_suffix(".taken"), req.with_suffix(".resp")
        log = self.dir.parent / "up.log"
        last_check = 0.0
        while True:
            answer = read_json(resp)
            if answer is not None:
                return answer
            now = time.time()
            # The monitor writes the answer before it removes .taken: with neither, it dropped the request.
            if now >= deadline and (_withdraw(req) or not taken.exists()):
                answer = read_json(resp)
                if answer is not None:
                    return answer
                raise ControlError(f"the deployment's monitor did not take the request '{op}' within {timeout_s:g} s, "
                                   f"so it is never acted on; see {log}")
            if now >= deadline + answer_s:
                raise ControlError(f"the deployment's monitor took the request '{op}' but has not answered within "
                                   f"{answer_s:g} s more; see {log}")
            if self.monitor is not None and time.monotonic() - last_check >= LIVENESS_CHECK_S:
                last_check = time.monotonic()
                if not process_alive(self.monitor) and read_json(resp) is None:
                    raise ControlError(f"the deployment's monitor (pid {self.monitor['pid']}) has exited (taken down "
                                       f"by `dsctl down`?), so nothing can act on '{op}'; see {log}")
            time.sleep(0.05)


def _withdraw(req: Path) -> bool:
    """Remove a request not claimed yet; False if the monitor has claimed it (or it is gone)."""
    try:
        req.unlink()
        return True
    except FileNotFoundError:
        return False


class ControlServer:
    """Serves pending requests with handlers {op: fn(**args) -> dict}; called from the monitor's loop.

    Made once the monitor's own job has ended: from then on `serving.json` says requests are served."""

    def __init__(self, run_dir: str | Path, handlers: dict[str, Callable[..., dict]],
                 events: Callable[[str, str], None], housekeeping: Callable[[], None] = lambda: None):
        self.dir = control_dir(run_dir)
        self.handlers, self.events, self.housekeeping = handlers, events, housekeeping
        write_json_atomic(self.dir / SERVING_FILE, {**_me(), "since": time.time()})

    def serve_pending(self) -> None:
        for req in sorted(self.dir.glob("*.req")):
            self._serve(req)
        self._discard_unread()
        try:
            self.housekeeping()
        except Exception as exc:  # noqa: BLE001 - the monitor keeps serving and supervising; the record says why
            self.events("control-error", f"{type(exc).__name__}: {exc}")

    def _serve(self, req: Path) -> None:
        taken = req.with_suffix(".taken")
        try:
            os.rename(req, taken)  # the claim: if the caller withdrew first, there is nothing to rename
        except FileNotFoundError:
            return
        request = read_json(taken)
        if not isinstance(request, dict):
            request = {}
        stale = _stale(request)
        if stale:
            taken.unlink(missing_ok=True)
            self.events("request-expired", f"ignored the request '{request.get('op')}': {stale}")
            return
        op = request.get("op")
        handler = self.handlers.get(op) if isinstance(op, str) else None  # JSON: an op may be a list (unhashable)
        answer: dict[str, Any]
        try:
            if handler is None:
                raise ControlError(f"unknown request '{request.get('op')}'")
            answer = {"result": handler(**request.get("args", {}))}
        except Exception as exc:  # noqa: BLE001 - reported to the caller, the monitor keeps serving
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        # Kept until the caller stops waiting at the latest; removed unread after that (_discard_unread).
        answer["discard_after"] = request["deadline"] + float(request.get("answer_s") or DEFAULT_TIMEOUT_S)
        write_json_atomic(req.with_suffix(".resp"), answer)
        taken.unlink(missing_ok=True)

    def _discard_unread(self) -> None:
        for resp in self.dir.glob("*.resp"):
            answer = read_json(resp)
            if answer is not None and time.time() > float(answer.get("discard_after") or 0):
                resp.unlink(missing_ok=True)


def _stale(request: dict) -> str | None:
    """Why a request must not be acted on (its caller has given up), or None."""
    deadline = request.get("deadline")
    if not isinstance(deadline, (int, float)):
        return "it has no deadline"
    if time.time() > deadline:
        return f"its caller stopped waiting at {time.strftime('%H:%M:%S', time.localtime(deadline))}"
    caller = request.get("caller")
    if not process_alive(caller):
        return f"its caller (pid {(caller or {}).get('pid')}) has exited"
    return None


class SweepLock:
    """Held by the one sweep that uses a detached deployment, while it does.

    An flock, which the kernel releases when its holder exits, even by SIGKILL; the holder file beside it
    (sweep.json) says who holds it. A holder file found while the lock is free was left by a sweep that
    exited before putting the deployment back as it found it: the monitor does that (handles.py)."""

    def __init__(self, run_dir: str | Path):
        self.dir = control_dir(run_dir)
        self._fd: int | None = None

    @property
    def holder(self) -> dict | None:
        return read_json(self.dir / HOLDER_FILE)

    def take(self) -> bool:
        """The lock, if no one holds it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def hold(self, who: dict) -> None:
        """Say who holds the lock (with this process's pid), for a sweep that is refused and for the monitor."""
        write_json_atomic(self.dir / HOLDER_FILE, {**who, **_me(), "since": time.time()})

    def release(self, put_back: bool = True) -> None:
        """Let go. The holder file goes only once the deployment is as it was found: otherwise the monitor
        finds it with the lock free and puts the deployment back itself."""
        if self._fd is None:
            return
        if put_back:
            (self.dir / HOLDER_FILE).unlink(missing_ok=True)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
