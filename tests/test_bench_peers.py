"""benchmarks/bench_peers.py runs end to end: dsctl, colocated tf.data and Ray Data (defaults, best) each print figures.

Only that the numbers are there is checked, never their values: the comparison lives in the benchmark's own printout,
measured in one run (docs/performance.md), not in timed tests on this shared machine. Needs Ray Data (the `bench`
extra); without it the test is skipped, saying so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_peers.py"
CONFIGS = ("dsctl service 2w", "tf.data colocated", "Ray Data defaults", "Ray Data best")
NUM = r"-?\d+\.\d+"
ROW = (rf"^{{name}} +(?P<bps>{NUM}) +(?P<cpu>(?:{NUM} +){{{{4}}}})(?P<total>{NUM}) +(?P<to>{NUM}) +(?P<moved>{NUM}|-) +"
       rf"(?P<first>{NUM}) +(?P<mem>(?:\d+ +){{{{4}}}})(?P<memtotal>\d+)$")


def _ray_daemons_since(t0: float) -> list[str]:
    """raylet or gcs_server processes started since t0 (by this test: no other test starts Ray)."""
    found = []
    for p in psutil.process_iter(["name", "create_time", "cmdline"]):
        name = p.info["name"] or ""
        if (name in ("raylet", "gcs_server") or name.startswith("gcs_server")) and (p.info["create_time"] or 0) >= t0 - 1:
            if p.status() != psutil.STATUS_ZOMBIE:
                found.append(" ".join(p.info["cmdline"] or [name])[:200])
    return found


@pytest.mark.slow
def test_quick_run_prints_every_configurations_figures(home, tmp_path):
    """One round of 5 s windows of each configuration; the `home` fixture's DSCTL_HOME is inherited by every
    process the benchmark starts (Ray's included), so any left running fails the test, and so does a raylet or
    gcs_server that outlives the run."""
    pytest.importorskip("ray.data", reason="the peer benchmark needs Ray Data: pip install -e '.[bench]'")
    t0 = time.time()
    proc = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=480,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    elapsed = time.time() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    for name in CONFIGS:
        assert re.search(ROW.format(name=re.escape(name)), out, re.M), f"{name}: no row of figures in\n{out}"
    for name in CONFIGS[1:]:
        assert re.search(rf"^{re.escape(name)} / dsctl service 2w \(measured here\): batches/s {NUM}x, CPU-s per batch "
                         rf"{NUM}x, bytes moved per batch ({NUM}x|-), time to first batch {NUM}x, peak memory {NUM}x$",
                         out, re.M), f"{name}: no ratios in\n{out}"
    assert re.search(r"Ray \d+\.\d+", out), out
    assert not _ray_daemons_since(t0), f"Ray left running: {_ray_daemons_since(t0)}"
    assert not list(tmp_path.glob("dsctl-bench-peers-*")), "the benchmark's work folder was left behind"
    assert not [p for p in Path("/tmp").glob("rp-*") if p.stat().st_mtime >= t0], "Ray's temp folder was left behind"
    print(f"bench_peers.py --quick took {elapsed:.0f} s")
