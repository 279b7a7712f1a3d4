"""benchmarks/bench_colocated_prefetch.py's counting: what docs/placement.md quotes comes from these two functions, so
they are checked on their own (the benchmark itself runs TensorFlow processes for minutes: run by hand)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_colocated_prefetch.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_colocated_prefetch", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_batches_made_are_counted_by_job_from_the_producing_process_stderr(tmp_path):
    err = tmp_path / "trainer-A.err"
    err.write_text("I0000 00:00:1.0 port.cc:153] oneDNN custom operations are on.\n"
                   "PROD A\nPROD A\nPROD B\n"
                   "PROD AB\n"  # another label, not A's
                   "W0000 PROD A inside a log line\n"  # not a line of the job's map
                   "PROD A\n")
    assert _bench().prod_counts(err) == {"A": 3, "B": 1, "AB": 1}


def test_the_other_trainers_share_counts_only_in_process_workers_and_only_the_other_job():
    result = {"workers": [
        {"worker": "A's in-process", "most_tasks": 2, "produced": {"A": 100, "B": 0}},
        {"worker": "B's in-process", "most_tasks": 3, "produced": {"A": 7, "B": 90}},
        {"worker": "remote", "most_tasks": 2, "produced": {"A": 50, "B": 60}},  # serves both jobs by design
    ]}
    # tasks beyond each one's own job: 1 + 2; batches for the other job: B's 7; made in all by in-process workers: 197
    assert _bench().other_jobs(result) == (3, 7, 197)
