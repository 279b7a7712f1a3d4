"""What `dsctl logs RUN` costs on a run whose program printed a lot: its peak memory and wall time.

    .venv/bin/python benchmarks/bench_logs.py [--mb 286]

Makes a DSCTL_HOME of its own (a temp folder) holding one recorded run whose trainer log is --mb megabytes of
~100-byte lines, the last without a newline (as a program killed mid-line leaves it), then runs the real CLI,
`python -m dsctl.cli.main logs RUN`, with its output to /dev/null, and reads the child's peak resident memory from
the kernel (getrusage RUSAGE_CHILDREN: ru_maxrss) and its wall time. It checks the last line was printed. Printed:
the log's size, dsctl's peak resident memory (measured here, this machine, one run), the ratio of the two, the wall
time and the rate in MB/s.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LINE = b"step %08d loss 0.123456 accuracy 0.987654 some more of what a training program prints per step ......\n"
LAST = b"the last line, with no newline"


def make_run(home: Path, size: int) -> str:
    from dsctl.orchestrator.store import RunStore
    from dsctl.specs import load_spec_text

    run_dir = home / "runs" / "logs-bench"
    (run_dir / "metrics").mkdir(parents=True)
    spec = load_spec_text("name: logs\nservice: {workers: 1}\ntrainer: {steps: 1}\npipeline: {builtin: synthetic}\n")
    RunStore().create_run(id="logs-bench", name="logs", kind="job", parent_id=None, provider="local", mode="service",
                          status="succeeded", spec_path=None, spec_yaml=None, spec_json=spec.spec.model_dump_json(),
                          spec_hash="-", workers=1, trainers=1, run_dir=str(run_dir))
    with open(run_dir / "metrics" / "trainer-0.log", "wb") as f:
        n = 0
        while f.tell() < size:
            f.write(LINE % n)
            n += 1
        f.write(LAST)
    return "logs-bench"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=286.0, help="the log's size, MB (10^6 bytes)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dsctl-bench-logs-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        os.environ["DSCTL_HOME"] = str(home)
        run = make_run(home, int(args.mb * 10**6))
        size = (home / "runs" / run / "metrics" / "trainer-0.log").stat().st_size
        out = Path(tmp) / "out.txt"
        started = time.perf_counter()
        with open(out, "wb") as sink:
            proc = subprocess.run([sys.executable, "-m", "dsctl.cli.main", "logs", run], stdout=sink,
                                  stderr=subprocess.PIPE, env={**os.environ, "DSCTL_HOME": str(home)})
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"dsctl logs exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # kilobytes on Linux
        with open(out, "rb") as f:
            f.seek(-len(LAST) - 64, os.SEEK_END)
            shown_last = LAST in f.read()
    print(f"log: {size / 1e6:.0f} MB ({size} bytes), last line without a newline")
    print(f"dsctl logs: peak resident memory {peak / 1e6:.0f} MB (measured here; {peak / size:.2f}x the log's size), "
          f"{wall:.1f} s wall, {size / 1e6 / wall:.0f} MB/s; last line shown: {'yes' if shown_last else 'NO'}")
    if not shown_last:
        raise SystemExit("the log's last line (no newline) was not shown")


if __name__ == "__main__":
    main()
