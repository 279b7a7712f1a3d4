"""`dsctl profile` as users run it: the profiling process end to end, what it records and what reads it back, and
pipelines it cannot profile (one paragraph, exit 2, nothing left running: the `home` fixture fails a test that
leaves a process behind)."""

from __future__ import annotations

import json

import pytest

from helpers import dsctl, write_spec

pytestmark = pytest.mark.integration  # the CLI as a subprocess, the profiling process

BAD = """
import tensorflow as tf

def calls_python():
    return tf.data.Dataset.range(100).map(lambda x: tf.py_function(lambda v: v * 2, [x], tf.int64)).batch(4)
"""


def test_a_profile_measures_recommends_is_recorded_and_calibrates_a_sweep(home, tmp_path):
    """A latency-bound builtin, briefly: the sleep's thread named as what bounds throughput, the workers predicted
    with the formula shown, a cache at its deepest hint measured; then `runs show` and `sweep --profile` read it."""
    spec = write_spec(tmp_path, """
        name: lat
        trainer: {model: {step_time_ms: 4}, steps: 1000}
        pipeline: {builtin: synthetic, params: {latency_ms: 1, batch_size: 8, elements: 64, shards: 4, epochs: null}}
    """)
    proc = dsctl("profile", spec, "--seconds", "1.5", "--json", check=True)
    p = json.loads(proc.stdout)
    bounding = next(r for r in p["rows"] if r["bounds"])
    assert bounding["label"] == "sleep(1 ms)" and bounding["wait_s_per_batch"] == pytest.approx(0.008, rel=0.1)
    pred = p["prediction"]  # 250 batches/s for one trainer; one worker's thread makes at most 125
    assert pred["target_bps"] == 250 and pred["workers"] >= 2 and "one thread" in pred["formula"]
    first = p["recommendations"][0]
    assert first["kind"] == "cache" and first["spec_patch"] == {"autocache": {"mode": "full"}}
    assert first["effect"]["after_bps"] > first["effect"]["before_bps"]  # measured, not asserted to be fast
    assert (home / "runs" / p["run_id"] / "profile.png").stat().st_size > 0
    shown = dsctl("runs", "show", p["run_id"], check=True).stdout
    assert "sleep(1 ms)" in shown and "workers =" in shown and "◀ bounds" in shown
    sweep = dsctl("sweep", spec, "--workers", "1..4:1", "--simulate", "--profile", p["run_id"], "--json", check=True)
    points = json.loads(sweep.stdout)["summary"]["points"]
    assert [pt["workers"] for pt in points] == [1, 2, 3, 4] and all(pt["predicted"] for pt in points)
    refused = dsctl("sweep", spec, "--workers", "1..4", "--profile", p["run_id"])
    assert refused.returncode == 2 and "--simulate" in refused.stderr


def test_a_pipeline_dsctl_cannot_profile_is_one_paragraph_and_exit_2(home, tmp_path):
    (tmp_path / "bad.py").write_text(BAD)
    spec = write_spec(tmp_path, """
        name: bad
        trainer: {model: {step_time_ms: 1}, steps: 10}
        pipeline: {entrypoint: "bad:calls_python"}
    """)
    proc = dsctl("profile", spec, "--seconds", "1")
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"{spec}:4: pipeline: the pipeline calls Python (EagerPyFunc in map(" in errors[0]
    assert "Traceback" not in proc.stderr
    runs = json.loads(dsctl("runs", "--json", check=True).stdout)
    assert runs[0]["kind"] == "profile" and runs[0]["status"] == "failed"
