"""Live progress while a run goes: phase, workers ready, batches, batches/s.

On a terminal it redraws one status line; in logs and CI it prints one line
per phase change or event, so output stays readable when captured.
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.live import Live
from rich.text import Text

from dsctl.orchestrator.run import Progress


def _line(p: Progress) -> str:
    rate = f"{p.batches_per_s:.1f} b/s" if p.batches_per_s else "-"
    restarts = f", {p.restarts} worker restart(s)" if p.restarts else ""
    return (f"[{p.phase}] workers {p.workers_ready}/{p.workers_wanted}, batches {p.batches}, {rate}{restarts}"
            + (f"  · {p.last_event}" if p.last_event else ""))


class LiveView:
    def __init__(self, enabled: bool = True):
        self.console = Console(stderr=True, highlight=False)
        self.enabled = enabled
        self.interactive = enabled and self.console.is_terminal
        self._live: Live | None = None
        self._last_phase = ""
        self._last_event = ""
        self._last_print = 0.0

    def __enter__(self) -> LiveView:
        if self.interactive:
            self._live = Live(Text(""), console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live:
            self._live.__exit__(*exc)

    def __call__(self, p: Progress) -> None:
        if not self.enabled:
            return
        if self._live:
            self._live.update(Text(_line(p)))
            return
        now = time.monotonic()
        changed = p.phase != self._last_phase or p.last_event != self._last_event
        if changed or now - self._last_print > 5:
            print(_line(p), file=sys.stderr, flush=True)
            self._last_phase, self._last_event, self._last_print = p.phase, p.last_event, now
