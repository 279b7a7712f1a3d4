"""benchmarks/bench_vm_overhead.py runs end to end and prints each part's share of a core, for a worker VM and the
dispatcher VM, with the goal line.

Only that the figures are there is checked, never their values: the measurement lives in the benchmark's own
printout, measured in one run (docs/performance.md), not in timed tests on this shared machine. Without an OpenSSH
server the benchmark runs the status command through bash, and says so; either way the lines are the same."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # stand-in VM processes, sshd and the supervisor as child processes

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_vm_overhead.py"
PCT = r"\d+\.\d+% of one core"


def test_quick_run_prints_each_vms_share_of_a_core(home):
    out = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert re.search(rf"^# worker VM, sampler \(.*\), per VM \(measured here\): {PCT} \(goal <= 1%: (met|NOT met)\); "
                     r"\d+\.\d+ ms of CPU per reading \(computed\)$", text, re.MULTILINE), text
    assert re.search(rf"^# dispatcher VM, supervisor for 2 workers \(.*measured here\): {PCT} = \d+\.\d+ readings/s "
                     r"\(measured here\) at \d+\.\d+ ms of CPU each \(computed\) \+ the rest, \d+\.\d+% \(measured here, ",
                     text, re.MULTILINE), text
    assert re.search(rf"^# dispatcher VM, supervisor \+ its own sampler, 2 workers \(computed\): {PCT} "
                     r"\(goal <= 1%: (met|NOT met)\)$", text, re.MULTILINE), text
    for workers in (64, 640):  # carried to scale, labelled as computed
        assert re.search(rf"^# dispatcher VM at {workers} workers \(computed\): {PCT} \(goal <= 1%: (met|NOT met)\) = "
                         r"readings \d+\.\d+/s", text, re.MULTILINE), text
    assert re.search(r"^# supervisor loop \(measured here\): [1-9]\d* polls, [1-9]\d* samples, [1-9]\d* utilization rows",
                     text, re.MULTILINE), text
