"""Reproductions of the papers' figures, one module each: its job specs, its run, its comparison with
the paper's numbers (../shared/reference/paper-results.md) and its plots.

    from dsctl.experiments import run_experiment, write_report
    result = run_experiment("fig11", out_dir, quick=True)   # writes fig11.csv/.md/.json and PNGs
    write_report(out_dir)                                    # one markdown page from every section

Every module has NAME, TITLE, SUMMARY and `run(out_dir, quick, log) -> ExperimentResult`.
TensorFlow is never imported here: the runs happen in the processes the local provider starts.
"""

from __future__ import annotations

import time
from pathlib import Path

from .common import ExperimentResult, Log, default_out_dir
from .registry import REGISTRY, get, names

__all__ = ["REGISTRY", "ExperimentResult", "default_out_dir", "get", "names", "run_experiment", "write_report"]


def run_experiment(name: str, out_dir: Path | None = None, *, quick: bool = False, log: Log | None = None) -> ExperimentResult:
    """Run one experiment and write its CSV, PNGs, markdown section and JSON into out_dir."""
    module = get(name)
    out = Path(out_dir) if out_dir else default_out_dir()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    result = module.run(out, quick=quick, log=log)
    result.duration_s = time.monotonic() - t0
    result.write()
    return result


def write_report(out_dir: Path | None = None) -> Path:
    from .report import write_report as write

    return write(Path(out_dir) if out_dir else default_out_dir())
