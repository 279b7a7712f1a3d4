"""Kill a training run's trainer after a checkpoint, then `dsctl up --resume`: the new run continues from the
checkpoint's step, trains only the rest, and both records say so. The compact ResNet example, real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dsctl.orchestrator.checkpoints import latest
from dsctl.provisioners import load_deployment
from helpers import EXAMPLES, dsctl, processes_under, wait_for, write_spec

STEPS, EVERY = 120, 20
JOB = f"""
name: resume-e2e
service: {{workers: 1}}
trainer:
  machine: n2-standard-8
  accelerators_per_trainer: 0
  model: {{kind: keras, entrypoint: "resnet_here:build_model", params: {{crop_size: 24, num_classes: 4, width: 8}}}}
  steps: {STEPS}
  warmup_batches: 2
  checkpoint: {{dir: ck, every_steps: {EVERY}}}
pipeline:
  builtin: images
  params: {{num_files: 2, images_per_file: 32, image_size: 28, crop_size: 24, num_classes: 4, batch_size: 16, epochs: null}}
"""
# The example's compact ResNet, imported when the trainer builds it: `dsctl up` checks that the entrypoint imports
# (in a child process), and importing keras there would add about 8 s to each of the two runs.
RESNET_HERE = """
def build_model(**params):
    from models.compact_resnet import build_model

    return build_model(**params)
"""


def events(home: Path, run_id: str) -> list[dict]:
    path = home / "runs" / run_id / "metrics" / "trainer-0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_checkpoint_and_trains_only_the_rest(home, tmp_path):
    shutil.copytree(EXAMPLES / "models", tmp_path / "models")
    (tmp_path / "resnet_here.py").write_text(RESNET_HERE)
    spec = write_spec(tmp_path, JOB)
    first = subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", str(spec), "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # A checkpoint exists (its folder is the run's own, relative to the spec's folder): kill the trainer.
        index = wait_for(lambda: next(iter((tmp_path / "ck").glob("*/trainer-0/checkpoint")), None), timeout=120,
                         interval=0.05, what="the first checkpoint")
        run_id = index.parent.parent.name
        trainer = load_deployment(home / "runs" / run_id).by_role("trainer")[0]
        os.kill(trainer.pid, signal.SIGKILL)
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 1, out + err
    assert "trainer 0 failed" in err and run_id in err
    assert processes_under(home) == [], "the failed run left processes running"
    assert load_deployment(home / "runs" / run_id).status == "down"
    saved = latest(str(index.parent))
    assert saved.found and 0 < saved.step < STEPS and saved.step % EVERY == 0
    assert not [e for e in events(home, run_id) if e["event"] == "end"]  # it was killed before its end

    second = dsctl("up", spec, "--resume", run_id, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resuming run {run_id} from step {saved.step} " in second.stdout
    assert f"trains the remaining {STEPS - saved.step} of {STEPS} steps" in second.stdout
    runs = json.loads(dsctl("runs", "--json", check=True).stdout)
    resumed = next(r for r in runs if r["id"] != run_id)
    assert (resumed["status"], resumed["resumed_from"]) == ("succeeded", run_id)
    mine = events(home, resumed["id"])
    start = next(e for e in mine if e["event"] == "start")
    end = next(e for e in mine if e["event"] == "end")
    assert start["restored_step"] == saved.step > 0  # from the checkpoint, not from 0
    assert start["restored_step"] + end["batches"] == STEPS == end["step"]  # only the rest was trained
    assert resumed["summary"]["batches"] == STEPS - saved.step and resumed["summary"]["restored_step"] == saved.step
    # Its own checkpoints, in its own folder; the first run's are untouched.
    assert latest(f"{resumed['checkpoint_dir']}/trainer-0").step == STEPS
    assert latest(str(index.parent)).step == saved.step

    shown = dsctl("runs", "show", resumed["id"], check=True).stdout
    assert f"{run_id} at step {saved.step}" in shown and "resumed from" in shown
    shown = dsctl("runs", "show", run_id, check=True).stdout
    assert "resumed by" in shown and resumed["id"] in shown
    # The killed run's trainer never said which step it saved: the record read its checkpoint folder.
    assert f"last saved at step {saved.step}" in " ".join(shown.split())
