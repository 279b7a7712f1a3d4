"""How a run ended, classified the same way for jobs and sweeps.

    outcome = Outcome()
    try:
        with outcome.classify(run_id, interrupted="..."):
            ...the run...
    finally:
        record(outcome.status, outcome.error)   # always, even on Ctrl-C

Bad input stays a SpecError (exit 2), Ctrl-C stays KeyboardInterrupt (exit 130), a teardown by
`dsctl down` is TakenDown (exit 130), anything else becomes RunFailed (exit 1) carrying the run id.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from dataclasses import dataclass

from dsctl.errors import DsctlError
from dsctl.specs import SpecError

from .records import Ending


class RunFailed(DsctlError):
    """The run failed at runtime (exit 1); it is recorded, and the deployment is gone."""

    def __init__(self, message: str, run_id: str | None = None):
        super().__init__(message)
        self.run_id = run_id


class Interrupted(DsctlError):
    """Ctrl-C (or SIGTERM, SIGHUP) during a run: everything it started is stopped and what it measured is recorded.
    The command exits 128 + the signal's number."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.exit_code = 128 + signum


class TakenDown(Interrupted):
    """`dsctl down` took the run's deployment down while this `dsctl up` ran it: the run is interrupted, whatever
    phase it met (endings.py), and `dsctl up` exits 130 saying so."""

    def __init__(self, message: str, run_id: str | None = None):
        super().__init__(message)
        self.run_id = run_id

    def for_user(self) -> str:
        return str(self) + (f" (run {self.run_id}; `dsctl runs show {self.run_id}` has it)" if self.run_id else "")


@dataclass
class Outcome:
    status: Ending = "failed"
    error: str | None = None

    @contextmanager
    def classify(self, run_id: str, interrupted: str = "interrupted by the user"):
        try:
            yield self
        except KeyboardInterrupt:
            self.status, self.error = "interrupted", interrupted
            raise
        except TakenDown as exc:
            self.status, self.error = "interrupted", str(exc)
            raise
        except (SpecError, RunFailed) as exc:
            self.error = str(exc)
            raise
        except Exception as exc:
            self.error = str(exc)
            raise RunFailed(self.error, run_id) from exc
        self.status = "succeeded"
