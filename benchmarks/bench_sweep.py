"""Benchmark: a local sweep's time beyond its measurement windows, scaling in place vs restarting per point.

    python benchmarks/bench_sweep.py [--workers 1..4:1] [--window 3]

Runs the same latency-bound sweep twice in one run, once scaling workers in
place on one deployment (what `dsctl sweep` does) and once starting a fresh
deployment per point, and prints each one's overhead: wall time minus the
measurement windows (one per point and one per baseline). Goal: in-place at
most half the restart's overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """
name: bench-sweep
service: {workers: 1}
trainer: {model: {step_time_ms: 10}, duration_s: 60, warmup_batches: 5}
pipeline: {builtin: synthetic, params: {batch_size: 8, latency_ms: 5, epochs: null}}
"""


def run_sweep(home: Path, spec: Path, workers: str, window: float, strategy: str) -> dict:
    env = {**os.environ, "DSCTL_HOME": str(home)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dsctl.cli.main", "sweep", str(spec), "--workers", workers,
                           "--window", f"{window}s", "--strategy", strategy, "--json"],
                          check=True, capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    summary = json.loads(proc.stdout)["summary"]
    timings = summary["timings"]
    points = len(summary["points"])
    points_overhead = timings["points_s"] - points * window
    measured = (points + len(summary["baselines"])) * window
    return {"wall_s": wall, "points": points, "measured_s": measured, "overhead_s": wall - measured,
            "points_overhead_s": points_overhead, "overhead_per_point_s": points_overhead / points,
            "phases": {k: round(v, 1) for k, v in timings.items()},
            "rates": [round(p["batches_per_s"], 2) for p in summary["points"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1..4:1")
    ap.add_argument("--window", type=float, default=3.0)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="dsctl-bench-sweep-"))
    spec = home / "sweep.yaml"
    spec.write_text(SPEC)
    results = {s: run_sweep(home, spec, args.workers, args.window, s) for s in ("in-place", "restart")}
    for name, r in results.items():
        print(f"{name:>8}: {r['points']} points, wall {r['wall_s']:.1f} s (baselines included), "
              f"measured {r['measured_s']:.1f} s; "
              f"overhead of the points {r['points_overhead_s']:.1f} s ({r['overhead_per_point_s']:.1f} s/point), "
              f"of the whole sweep {r['overhead_s']:.1f} s; phases (s) {r['phases']}; batches/s {r['rates']}")
    ip, rs = results["in-place"], results["restart"]
    print(f"in-place / restart overhead: points {ip['points_overhead_s'] / rs['points_overhead_s']:.2f}, "
          f"whole sweep {ip['overhead_s'] / rs['overhead_s']:.2f} (goal <= 0.5)")


if __name__ == "__main__":
    main()
