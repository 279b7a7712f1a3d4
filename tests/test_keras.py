"""Keras models trained by dsctl with model.fit, as real processes: the compact ResNet example through a real
dispatcher and worker, the trainer's checkpoints and restores, and its one-paragraph errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsctl.specs import load_spec_text
from helpers import EXAMPLES, TINY_KERAS_MODEL, dsctl, write_spec

pytestmark = pytest.mark.slow


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_compact_resnet_trains_through_the_service_and_its_loss_falls(home, tmp_path):
    """The example model, a real dispatcher and worker: windows carry the loss, warm-up stays out of throughput."""
    (tmp_path / "models").symlink_to(EXAMPLES / "models")
    spec = write_spec(tmp_path, """
        name: keras-e2e
        service: {workers: 1}
        trainer:
          steps: 100
          warmup_batches: 5
          model:
            kind: keras
            entrypoint: "models.compact_resnet:build_model"
            params: {crop_size: 32, num_classes: 10, width: 8, stages: 2, learning_rate: 0.02}
        pipeline:
          builtin: images
          params: {num_files: 2, images_per_file: 64, image_size: 40, crop_size: 32, batch_size: 16, epochs: null}
    """)
    record = json.loads(dsctl("up", spec, "--json", check=True).stdout)
    assert record["status"] == "succeeded" and record["mode"] == "service"
    evs = events(home / "runs" / record["id"] / "metrics" / "trainer-0.jsonl")
    windows = [e for e in evs if e["event"] == "window"]
    start, end = evs[0], evs[-1]
    assert start["event"] == "start" and start["restored_step"] == 0
    assert end["event"] == "end" and end["reason"] == "steps" and end["step"] == 100 and end["batches"] == 100
    assert end["checkpoint_step"] is None
    assert windows[0]["warmup"] and windows[0]["batches"] == 5 and not any(w["warmup"] for w in windows[1:])
    assert sum(w["batches"] for w in windows) == 100 and end["measured_batches"] == 95
    assert all(w["examples"] == 16 * w["batches"] for w in windows)
    assert all(w["input_wait_s"] >= 0 and w["step_s"] > 0 for w in windows)
    assert all(set(w["metrics"]) == {"accuracy"} for w in windows)
    assert windows[-1]["loss"] < 0.7 * windows[0]["loss"], [w["loss"] for w in windows]
    assert record["summary"]["batches"] == 100


def trainer(tmp_path: Path, spec_text: str, metrics: str, *args: str) -> subprocess.CompletedProcess:
    spec = tmp_path / "spec.json"
    spec.write_text(load_spec_text(spec_text).spec.model_dump_json())
    (tmp_path / "tiny.py").write_text(TINY_KERAS_MODEL)
    return subprocess.run([sys.executable, "-m", "dsctl.runtime.trainer", "--spec", str(spec), "--mode", "colocated",
                           "--metrics", str(tmp_path / metrics), "--cache-dir", str(tmp_path / "cache"),
                           "--base-dir", str(tmp_path), *args], capture_output=True, text=True, timeout=180)


def tiny_spec(steps: int, latency_ms: float = 0, epochs: int | None = None) -> str:
    return f"""
name: t
trainer:
  steps: {steps}
  warmup_batches: 3
  window_s: 0.2
  model: {{kind: keras, entrypoint: "tiny:build_model"}}
  checkpoint: {{dir: unused-here, every_steps: 15}}
pipeline: {{builtin: synthetic, params: {{feature_size: 8, label_classes: 4, batch_size: 16, elements: 640,
            epochs: {"null" if epochs is None else epochs}, latency_ms: {latency_ms}}}}}
"""


def test_a_restored_trainer_starts_at_the_saved_step_and_trains_only_the_rest(tmp_path):
    # The first run's data ends after 40 batches (640 elements, one epoch), before its 100 steps.
    first = trainer(tmp_path, tiny_spec(100, latency_ms=4, epochs=1), "a.jsonl", "--checkpoint-dir", str(tmp_path / "ck1"))
    assert first.returncode == 0, first.stderr
    a = events(tmp_path / "a.jsonl")
    assert a[-1]["reason"] == "end_of_data"
    assert a[-1]["step"] == 40 and a[-1]["checkpoint_step"] == 40 and a[-1]["batches"] == 40
    assert [e["step"] for e in a if e["event"] == "checkpoint"] == [15, 30]
    assert {p.name for p in (tmp_path / "ck1").iterdir() if p.suffix == ".index"} == {"ckpt-15.index", "ckpt-30.index",
                                                                                     "ckpt-40.index"}
    windows = [e for e in a if e["event"] == "window"]
    measured = [w for w in windows if not w["warmup"]]
    # Input-bound: 16 elements x 4 ms of latency per batch (64 ms) against a one-layer model. The stall is most of
    # the time on a quiet machine (0.97 measured here) and still 0.46 with 3 jobs per core; a meter that timed
    # anything but the step's wait for its batch reads about 0.
    assert sum(w["input_wait_s"] for w in measured) > 0.25 * sum(w["t_end"] - w["t_start"] for w in measured)

    second = trainer(tmp_path, tiny_spec(100), "b.jsonl", "--checkpoint-dir", str(tmp_path / "ck2"),
                     "--restore-from", str(tmp_path / "ck1"))
    assert second.returncode == 0, second.stderr
    b = events(tmp_path / "b.jsonl")
    assert b[0]["event"] == "start" and b[0]["restored_step"] == 40
    assert b[-1]["batches"] == 60 and b[-1]["step"] == 100 and b[-1]["checkpoint_step"] == 100
    assert [e["step"] for e in b if e["event"] == "checkpoint"] == [45, 60, 75, 90]  # the global step's multiples
    b_windows = [e for e in b if e["event"] == "window"]
    assert sum(w["batches"] for w in b_windows) == 60
    # the weights came back too: the restored model starts near where the first run ended, not at its start
    assert b_windows[0]["loss"] < 0.8 * windows[0]["loss"], (windows[0]["loss"], b_windows[0]["loss"])


def test_a_tpu_trainer_without_a_tpu_stops_with_one_paragraph(tmp_path):
    """The TPU branch up to TPUStrategy's constructor; the same exit-2 path reports a restore dir without a
    checkpoint (its messages: tests/test_checkpoint.py)."""
    proc = trainer(tmp_path, tiny_spec(10), "m.jsonl", "--accelerator", "tpu", "--accelerators", "8")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("dsctl trainer:")]
    assert len(lines) == 1 and "TPUStrategy" in lines[0] and "found no TPU here" in lines[0]
    error = events(tmp_path / "m.jsonl")[-1]
    assert error["event"] == "error" and error["kind"] == "user" and "trainer.machine" in error["message"]
