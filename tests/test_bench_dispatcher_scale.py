"""benchmarks/bench_dispatcher_scale.py runs end to end: every figure is printed, labelled measured, fitted or predicted.

Only that the numbers are there is checked, never their values: what they say lives in the benchmark's own printout,
measured in one run (docs/performance.md), not in timed tests on this shared machine. The `home` fixture's DSCTL_HOME
is inherited by every process the benchmark starts (forked TensorFlow servers and sleeping stand-ins included), so
any left running fails the test."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_dispatcher_scale.py"
NUM = r"-?\d+\.\d+"
ERROR = r"(?:[+-]\d+\.\d%|n/a \(measured 0\))"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_dispatcher_scale", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_quick_run_prints_every_figure(home, tmp_path):
    """N = 2, 4, 8 with 2 s windows: a row of figures per N for the dispatcher and for dsctl's supervision, and for
    every figure its fit (on N=2,4), the held-out N=8 predicted against measured, and the prediction for 640."""
    bench = _bench()
    proc = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert re.search(r"^# tf\.data service control plane at scale: TensorFlow 2\.\d+.*heartbeat_interval_ms unset, "
                     r"TensorFlow's default: \d+ ms", out, re.M), out
    for n in (2, 4, 8):
        assert re.search(rf"^measured N={n} +{NUM} \| +{NUM} +{NUM} +{NUM} \| +{NUM} +{NUM} +{NUM} +{NUM} \| +{NUM} "
                         rf"+{NUM}$", out, re.M), f"N={n}: no row of the dispatcher's figures in\n{out}"
        assert re.search(rf"^measured N={n} +poll {NUM} ms, sample {NUM} ms per round; {NUM} %core at that cadence$",
                         out, re.M), f"N={n}: no row of supervision figures in\n{out}"
    for _, label, unit in bench.SERVICE_METRICS + bench.SUPERVISION_METRICS:
        name, unit = re.escape(label), re.escape(unit)
        assert re.search(rf"^fitted {name}: a = {NUM} {unit}, b = {NUM} {unit} per worker.* \(fitted on N=2,4\)$",
                         out, re.M), f"{label}: no fit in\n{out}"
        assert re.search(rf"^held-out {name} N=8: predicted {NUM} {unit}, measured here {NUM} {unit}, error {ERROR}$",
                         out, re.M), f"{label}: no held-out check in\n{out}"
        assert re.search(rf"^predicted {name} N=640: {NUM} {unit} \(predicted, fitted on N=2,4, validated on held-out "
                         rf"N=8\)$", out, re.M), f"{label}: no prediction for 640 in\n{out}"
    for line in out.splitlines():
        assert line.startswith(("#", "measured ", "fitted ", "held-out ", "predicted ")), f"unlabelled: {line!r}"
    assert not list(tmp_path.glob("dsctl-bench-dscale-*")), "the benchmark's work folder was left behind"


@pytest.mark.slow
def test_ctrl_c_mid_run_stops_every_process(home, tmp_path):
    """SIGINT (Ctrl-C) while the second worker count runs: the benchmark exits 130, and the `home` fixture finds
    none of its processes left."""
    proc = subprocess.Popen([sys.executable, str(BENCH), "--quick"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    seen = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("N=4:"):
                break
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(seen) + err
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err
