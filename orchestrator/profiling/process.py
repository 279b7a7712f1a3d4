"""The profiling process (runtime/profiling/child.py), started, asked and ended from here.

It runs the user's pipeline, so it is treated as the entrypoint check's child is: a cgroup of its own
(provisioners/containment.py) from its first instruction, so that whatever the user's code starts ends
with it; its own session; the kernel kills it if dsctl dies (a parent death signal). Requests go to its
stdin; answers come back through a JSON-lines file (the user's code may print to stdout, which is the
process's log). Every request has a time limit: a pipeline that stops producing is not waited for
forever, and the process, with all it started, is ended whatever happens (`close`, also on Ctrl-C).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dsctl.errors import DsctlError
from dsctl.provisioners import containment
from dsctl.specs import SpecError

from ..outcome import RunFailed
from ..store import notices
from ..tail import JsonlTail

STARTUP_S = 120.0  # importing TensorFlow and building the pipeline (a builtin's files made the first time)
POLL_S = 0.05

Listener = Callable[[dict], None]


class ProfilerProcess:
    """One profiling process for one spec; a context manager that always ends it."""

    def __init__(self, spec_json: Path, base_dir: Path, cache_dir: Path, work_dir: Path,
                 listener: Listener = lambda p: None):
        self.work_dir = work_dir
        self.results = work_dir / "profile-results.jsonl"
        self.log = work_dir / "profile.log"
        self.listener = listener
        self._next_id = 0
        self._proc: subprocess.Popen | None = None
        self._group: containment.Cgroup | None = None
        self._tail = JsonlTail(self.results)
        self._argv = [sys.executable, "-m", "dsctl.runtime.profiling.child", "--spec", str(spec_json),
                      "--base-dir", str(base_dir), "--cache-dir", str(cache_dir), "--out", str(self.results)]

    def __enter__(self) -> ProfilerProcess:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self.results.write_text("")

        def uncontained(why: str) -> None:
            notices.warning(f"the profiling process is stopped by process group only (a process the pipeline starts "
                            f"in a session of its own outlives it): {why}.")

        with open(self.log, "ab") as log:
            self._proc, self._group = containment.start_contained(
                self._argv, uncontained, stdin=subprocess.PIPE, stdout=log, stderr=log,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        self._wait_for(lambda r: r.get("event") == "ready", STARTUP_S, "start")

    def ask(self, cmd: str, limit_s: float, **fields) -> dict:
        """Send one request; its result's data, or raise: SpecError (the pipeline's fault, exit 2), RunFailed."""
        self._next_id += 1
        rid = self._next_id
        assert self._proc is not None and self._proc.stdin is not None, "started"
        try:
            self._proc.stdin.write((json.dumps({"id": rid, "cmd": cmd, **fields}) + "\n").encode())
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise RunFailed(self._died(f"{cmd}")) from None
        record = self._wait_for(lambda r: r.get("id") == rid and r.get("event") in ("result", "error"), limit_s, cmd)
        if record["event"] == "error":
            if record.get("kind") == "user":
                raise SpecError(record["message"], field="pipeline")
            raise RunFailed(f"the profiling process failed: {record['message']} (its log: {self.log})")
        return record["data"]

    def _wait_for(self, match: Callable[[dict], bool], limit_s: float, what: str) -> dict:
        deadline = time.monotonic() + limit_s
        while True:
            for record in self._tail.read():
                if record.get("event") == "progress":
                    self.listener(record)
                elif match(record):
                    return record
            assert self._proc is not None, "started"
            if self._proc.poll() is not None:
                raise RunFailed(self._died(what))
            if time.monotonic() > deadline:
                raise SpecError(f"the pipeline gave no answer within {limit_s:.0f} s while dsctl profiled it "
                                f"({what}); it may wait for something that never comes (a file, the network) or loop. "
                                f"The profiling process was stopped; its log: {self.log}", field="pipeline")
            time.sleep(POLL_S)

    def _died(self, what: str) -> str:
        code = self._proc.poll() if self._proc else None
        tail = ""
        try:
            lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
            tail = " Its last lines: " + " | ".join(lines[-3:]) if lines else ""
        except OSError:
            pass
        return f"the profiling process ended (exit status {code}) during {what}; its log: {self.log}.{tail}"

    def close(self) -> None:
        """End the process and everything it started; safe to call twice."""
        proc, self._proc = self._proc, None
        group, self._group = self._group, None
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            containment.end_contained(proc, group)
        except (OSError, TimeoutError) as exc:
            where = group.path if group is not None else "its process group"
            raise DsctlError(f"the profiling process could not be ended ({where}): {exc}") from None
