"""gs:// folders a spec names itself, against the Cloud Storage emulator with the real client library: the
TensorBoard copy (trainer.tensorboard_dir) and reading a checkpoint folder's latest step for --resume."""

from __future__ import annotations

from conftest import BUCKET

from dsctl.orchestrator import gcs
from dsctl.orchestrator.checkpoints import latest
from dsctl.orchestrator.tbevents import RunBoard, event_files


def test_event_files_are_copied_to_a_gs_folder_and_checkpoints_read_from_one(gcs_emulator, tmp_path, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    board = RunBoard(tmp_path / "run", "fit-1", trainers=1, copy_to=f"gs://{BUCKET}/boards/")
    assert board.window(0, {"wall": 1.0, "batches": 5, "loss": 2.0, "batches_per_s": 5.0}, 2, None) is None
    assert board.close() is None
    [local] = event_files(tmp_path / "run" / "tensorboard")
    assert gcs.read(f"gs://{BUCKET}/boards/fit-1/{local.name}") == local.read_bytes()

    folder = f"gs://{BUCKET}/ck/fit-1/trainer-0"
    assert latest(folder).found is False
    client_blob = gcs._client().bucket(BUCKET).blob("ck/fit-1/trainer-0/checkpoint")
    client_blob.upload_from_string('model_checkpoint_path: "ckpt-60"\nall_model_checkpoint_paths: "ckpt-60"\n')
    found = latest(folder)
    assert (found.found, found.step) == (True, 60)
