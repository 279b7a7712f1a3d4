"""A damaged latest checkpoint does not end a resume when an intact earlier one exists: the trainer restores the
newest intact checkpoint and says which one was damaged and which one it used. Real checkpoints written by a real
keras trainer process, damaged as a disk or a copy damages them, then restored in this process and by a resumed
trainer process (which used to stop with "start the run afresh")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsctl.specs import load_spec_text
from helpers import TINY_KERAS_MODEL

pytestmark = pytest.mark.slow  # keras trainers as processes, keras in this process
SPEC = """
name: t
trainer:
  steps: {steps}
  warmup_batches: 0
  model: {{kind: keras, entrypoint: "tiny:build_model"}}
  checkpoint: {{dir: unused-here, every_steps: 10}}
pipeline: {{builtin: synthetic, params: {{feature_size: 8, label_classes: 4, batch_size: 16, elements: 640, epochs: null}}}}
"""


def trainer(tmp: Path, steps: int, metrics: str, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    spec = tmp / f"{metrics}.spec.json"
    spec.write_text(load_spec_text(SPEC.format(steps=steps)).spec.model_dump_json())
    (tmp / "tiny.py").write_text(TINY_KERAS_MODEL)
    proc = subprocess.run([sys.executable, "-m", "dsctl.runtime.trainer", "--spec", str(spec), "--mode", "colocated",
                           "--metrics", str(tmp / metrics), "--cache-dir", str(tmp / "cache"), "--base-dir", str(tmp),
                           *args], capture_output=True, text=True, timeout=180)
    path = tmp / metrics
    return proc, [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> Path:
    """A trainer's folder with checkpoints at steps 10, 20 and 30 (the 3 kept), the latest one's data file cut in
    half; the folder."""
    tmp = tmp_path_factory.mktemp("ck")
    proc, records = trainer(tmp, 30, "first.jsonl", "--checkpoint-dir", str(tmp / "ck"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in records if r["event"] == "checkpoint"] == [10, 20, 30]
    data = next((tmp / "ck").glob("ckpt-30.data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    return tmp / "ck"


def test_a_resumed_trainer_restores_the_newest_intact_checkpoint_and_says_which(damaged, tmp_path):
    proc, records = trainer(tmp_path, 40, "resumed.jsonl", "--checkpoint-dir", str(tmp_path / "ck2"),
                            "--restore-from", str(damaged))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "start the run afresh" not in proc.stderr
    start = records[0]
    assert start["event"] == "start" and start["restored_step"] == 20
    notice = start["restore_notice"]
    assert f"{damaged}/ckpt-30 (" in notice and f"Restored {damaged}/ckpt-20 instead (step 20)" in notice, notice
    assert notice in proc.stderr  # in the trainer's log: `dsctl logs RUN`
    end = records[-1]
    assert end["event"] == "end" and end["step"] == 40 and end["batches"] == 20  # the 20 steps left from step 20


def test_restore_skips_damaged_checkpoints_and_a_damaged_index_file(damaged, tmp_path):
    import shutil

    import keras

    from dsctl.runtime import checkpoint

    sys.path.insert(0, str(damaged.parent))
    try:
        from tiny import build_model
    finally:
        sys.path.remove(str(damaged.parent))

    def fresh():
        model = build_model()
        model.optimizer.build(model.trainable_variables)
        return model

    assert checkpoint.restore(fresh(), str(damaged)) == 20
    # The index file garbled too: the checkpoints are still found by their own files.
    copy = tmp_path / "ck"
    shutil.copytree(damaged, copy)
    (copy / "checkpoint").write_text("garbage that is no CheckpointState")
    restored = checkpoint.restore_newest(fresh(), str(copy))
    assert (restored.step, restored.path) == (20, f"{copy}/ckpt-20")
    assert [p for p, _ in restored.damaged] == [f"{copy}/ckpt-30"]
    # Nothing intact: one paragraph naming the folder and each checkpoint.
    for name in ("ckpt-10", "ckpt-20"):
        data = next(copy.glob(f"{name}.data-*"))
        data.write_bytes(data.read_bytes()[:10])
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.restore(fresh(), str(copy))
    message = str(info.value)
    assert message.startswith(f"cannot resume from {copy}: each of its 3 checkpoints is damaged") and "\n" not in message
    assert all(f"{copy}/ckpt-{n} (" in message for n in (10, 20, 30))
    keras.backend.clear_session()
