"""Autoscaling a running job: Cachew's policy on a latency-bound job whose knee is known by construction."""

from __future__ import annotations

import json

import pytest

from dsctl.orchestrator.store import RunStore
from helpers import dsctl, processes_under, write_spec

PNG = b"\x89PNG\r\n\x1a\n"

# A worker serves 8 elements x 5 ms = 40 ms per batch (25 batches/s), using no CPU. The model step
# is 12 ms (knee: 3 workers with the harness's own ~1.5 ms a batch), then 1 ms from 40 s on (a knee
# far beyond max_workers: the policy stops at 5, where the trainers still wait, so the client's
# queue is empty), then 20 ms from 60 s on (knee 2): 5 workers now outpace the model, the queue
# fills up, and Cachew's own rule (queue fill 40% above converged) scales the job down. In a CI run
# (2026-11-25) the policy held 3 from 27 s, reached 5 by 49 s, and was back at 2 by 40 s after the
# last change.
PHASED_JOB = """
    name: autoscaled
    service: {workers: 1}
    trainer:
      duration_s: 120
      warmup_batches: 5
      window_s: 0.5
      model:
        step_time_ms: 12
        phases: [{after_s: 40, step_time_ms: 1}, {after_s: 60, step_time_ms: 20}]
    pipeline: {builtin: synthetic, params: {batch_size: 8, latency_ms: 5, epochs: null}}
    autoscale:
      policy: cachew
      max_workers: 5
      settings: {window_batches: 150, pause_batches: 100, recheck_batches: 450}
"""


def workers_at(windows, t):
    before = [w for w in windows if w["t_end"] <= t]
    return before[-1]["workers"]


@pytest.mark.slow
@pytest.mark.timed
def test_cachew_policy_finds_the_knee_then_follows_the_model_up_and_down(home, tmp_path):
    spec = write_spec(tmp_path, PHASED_JOB)
    record = json.loads(dsctl("up", spec, "--json", timeout=400, check=True).stdout)
    store = RunStore()
    windows = [w for w in store.windows(record["id"]) if w["trainer"] == 0]
    converged = workers_at(windows, 39.5)
    assert abs(converged - 3) <= 1, "converges to the knee of the first phase"
    assert len({w["workers"] for w in windows if 33 <= w["t_end"] <= 39.5}) == 1, "and holds there"
    faster = max(w["workers"] for w in windows if 40 <= w["t_end"] <= 59.5)
    assert faster > converged, "a faster model: scales up again"
    final = workers_at(windows, 120)
    assert final < faster and abs(final - 2) <= 1, "a slower model: scales down to its knee"
    decisions = [e for e in store.events(record["id"]) if e["kind"] == "autoscale"]
    assert decisions and all("worker" in e["message"] for e in decisions)
    # The scale-down is Cachew's own rule on the signal the trainer measured: its client's queue filled up.
    shrinks = [e["message"] for e in decisions if e["message"].startswith("remove") and "confirmed at" in e["message"]]
    assert shrinks and all("queue fill" in m and "40% above" in m and "dsctl's rule" not in m for m in shrinks), shrinks
    assert all(w["queue_fill"] is not None for w in windows if not w["warmup"])
    assert record["summary"]["autoscale_policy"] == "cachew"
    assert record["summary"]["batches"] > 0, "no trainer hung while workers were removed"
    assert processes_under(home) == []

    proc = dsctl("runs", "show", record["id"], "--timeline", "--out", tmp_path / "t.png", check=True)
    assert "timeline:" in proc.stdout
    assert (tmp_path / "t.png").read_bytes().startswith(PNG)


def test_timeline_figure_has_labelled_axes_and_marks_changes():
    from dsctl.orchestrator.timeline import build_timeline_figure, scaling_changes

    windows = [{"trainer": 0, "t_start": t, "t_end": t + 1.0, "workers": 1 if t < 3 else 2,
                "mean_batch_time_s": 0.04 if t < 3 else 0.02} for t in range(6)]
    assert scaling_changes(windows) == [(3, 2)]
    fig = build_timeline_figure(windows, "t")
    top, bottom = fig.axes
    assert top.get_ylabel() == "tf.data service workers"
    assert bottom.get_ylabel() == "batch time (ms)" and "time" in bottom.get_xlabel()


@pytest.mark.integration  # dsctl as a subprocess
def test_autoscale_settings_are_checked_before_anything_starts(home, tmp_path):
    spec = write_spec(tmp_path, PHASED_JOB.replace("window_batches: 150", "window_batchs: 150"))
    proc = dsctl("up", spec)
    assert proc.returncode == 2
    flat = " ".join(proc.stderr.split())
    assert "autoscale.settings.window_batchs" in flat and "Did you mean 'window_batches'" in flat
    assert dsctl("up", spec.parent / "missing.yaml", "--autoscale", "hpa").returncode == 2
