"""Requests to the process that owns a detached deployment.

`dsctl up --detach` leaves a monitor process supervising the service; it is
the only writer of the deployment's state. Other dsctl commands (a sweep on
that deployment) ask it to act through request files in the run dir and wait
for its answer, so two processes never race on the state file.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Callable

from dsctl.runtime.readiness import read_json, write_json_atomic


class ControlError(RuntimeError):
    """The monitor failed the request or did not answer in time."""


def control_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "control"


class ControlClient:
    def __init__(self, run_dir: str | Path):
        self.dir = control_dir(run_dir)

    def call(self, op: str, timeout_s: float = 300.0, **args) -> dict:
        self.dir.mkdir(parents=True, exist_ok=True)
        rid = uuid.uuid4().hex[:12]
        tmp = self.dir / f"{rid}.tmp"
        write_json_atomic(tmp, {"op": op, "args": args})
        tmp.rename(self.dir / f"{rid}.req")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            answer = read_json(self.dir / f"{rid}.resp")
            if answer is not None:
                (self.dir / f"{rid}.resp").unlink(missing_ok=True)
                if "error" in answer:
                    raise ControlError(answer["error"])
                return answer.get("result") or {}
            time.sleep(0.05)
        raise ControlError(f"the deployment's monitor did not answer '{op}' within {timeout_s:.0f} s; "
                           f"see {self.dir.parent / 'up.log'}")


class ControlServer:
    """Serves pending requests with handlers {op: fn(**args) -> dict}; called from the monitor's loop."""

    def __init__(self, run_dir: str | Path, handlers: dict[str, Callable[..., dict]]):
        self.dir = control_dir(run_dir)
        self.handlers = handlers

    def serve_pending(self) -> None:
        if not self.dir.exists():
            return
        for req in sorted(self.dir.glob("*.req")):
            try:
                request = json.loads(req.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            req.unlink(missing_ok=True)
            handler = self.handlers.get(request.get("op"))
            try:
                if handler is None:
                    raise ControlError(f"unknown request '{request.get('op')}'")
                answer = {"result": handler(**request.get("args", {}))}
            except Exception as exc:  # noqa: BLE001 - reported to the caller, the monitor keeps serving
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            write_json_atomic(self.dir / f"{req.stem}.resp", answer)
