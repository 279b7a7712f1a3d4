"""benchmarks/bench_command.py runs end to end: every configuration gets its figures printed.

Only that the numbers are there is checked, never their values: timing goals live in the benchmark's
own printout, measured in one run, not in timed tests on this shared machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_command.py"
CONFIGS = ("images", "synthetic")
NUMBER = r"-?\d+\.\d+"


@pytest.mark.slow
def test_quick_run_prints_every_configurations_figures(home, tmp_path):
    """One round (dsctl and bare, both pipelines) of a handful of batches; the `home` fixture's DSCTL_HOME is
    inherited by every process the benchmark starts, so any left running fails the test."""
    argv = [str(BENCH), "--quick", "--rounds", "1", "--batches", "20", "--warmup", "3"]
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for name in CONFIGS:
        assert re.search(rf"^# round 1, {name} \(dsctl first\), measured here: dsctl {NUMBER} b/s .* / bare "
                         rf"{NUMBER} b/s = {NUMBER};", out, re.M), out
        assert re.search(rf"^{name} \(.*\), medians \(measured here\): dsctl.train.batches {NUMBER} b/s, CPU per batch "
                         rf"{NUMBER} us .*; bare loop {NUMBER} b/s, CPU per batch {NUMBER} us", out, re.M), out
        assert re.search(rf"^{name}: dsctl / bare batches/s, median of per-round ratios \(measured here\) {NUMBER} "
                         rf"\(.*goal >= 0.97: (met|NOT met)\)$", out, re.M), out
        for what in ("the process's", "the loop's thread's"):
            assert re.search(rf"^{name}: the measurement's CPU per batch, dsctl - bare in {what} CPU time, .*"
                             rf"\(measured here\) {NUMBER} us .*, {NUMBER}% of a core", out, re.M), out
    assert re.search(rf"^the measured loop alone .*\(measured here\): {NUMBER} us", out, re.M), out
    assert not list(tmp_path.glob("dsctl-bench-command-*")), "the benchmark's work folder was left behind"
