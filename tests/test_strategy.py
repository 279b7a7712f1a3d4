"""The keras trainer's distribution strategy, chosen from its machine type: pure choice per machine kind, and
on this machine (no TPU, no GPU) the accelerator branches end in one paragraph, not a stack trace."""

from __future__ import annotations

import pytest

from dsctl.costmodel.machines import accelerator_of
from dsctl.orchestrator.accelerators import trainer_accelerators
from dsctl.runtime import strategy
from dsctl.runtime.models import ModelError
from dsctl.specs import load_spec_text


@pytest.mark.parametrize("machine, kind, devices", [
    ("tpu-v2-8", "tpu", 8),
    ("tpu-v3-8", "tpu", 8),
    ("tpu-v4-8", "tpu", 4),
    ("tpu-v5litepod-1", "tpu", 1),
    ("a2-highgpu-8g", "mirrored", 8),
    ("a2-highgpu-2g", "mirrored", 2),
    ("a2-highgpu-1g", "default", 1),
    ("g2-standard-4", "default", 1),
    ("n2-standard-8", "default", 0),
    ("e2-highcpu-2", "default", 0),
    ("local", "default", 0),
    ("no-such-machine", "default", 0),
])
def test_strategy_follows_the_machine_kind(machine, kind, devices):
    choice = strategy.choose(*accelerator_of(machine))
    assert (choice.kind, choice.devices) == (kind, devices)


def test_choice_rejects_what_no_machine_has():
    with pytest.raises(ValueError, match="accelerator must be one of"):
        strategy.choose("fpga", 1)
    with pytest.raises(ValueError, match="at least 0"):
        strategy.choose("gpu", -1)


def keras_spec(machine: str, extra: str = "") -> str:
    return (f"name: a\ntrainer:\n  machine: {machine}\n  steps: 10\n{extra}"
            "  model: {kind: keras, entrypoint: 'm:build'}\npipeline: {builtin: images}\n")


def test_the_orchestrator_passes_the_machines_accelerators_to_keras_trainers_only():
    assert trainer_accelerators(load_spec_text(keras_spec("tpu-v2-8")).spec) == {"accelerator": "tpu", "accelerators": 8}
    assert trainer_accelerators(load_spec_text(keras_spec("a2-highgpu-4g")).spec) == {"accelerator": "gpu", "accelerators": 4}
    assert trainer_accelerators(load_spec_text(keras_spec("n2-standard-8")).spec) == {"accelerator": "none", "accelerators": 0}
    # accelerators_per_trainer says how many the trainer uses; 0 means none
    two = load_spec_text(keras_spec("a2-highgpu-4g", "  accelerators_per_trainer: 2\n")).spec
    assert trainer_accelerators(two) == {"accelerator": "gpu", "accelerators": 2}
    none = load_spec_text(keras_spec("a2-highgpu-4g", "  accelerators_per_trainer: 0\n")).spec
    assert trainer_accelerators(none) == {"accelerator": "none", "accelerators": 0}
    synthetic = load_spec_text("name: a\ntrainer: {machine: tpu-v2-8, steps: 10}\npipeline: {builtin: synthetic}\n").spec
    assert trainer_accelerators(synthetic) == {"accelerator": "none", "accelerators": 0}


def test_the_launch_passes_accelerators_and_checkpoints_as_trainer_arguments(tmp_path):
    from dsctl.provisioners import TrainerLaunch

    launch = TrainerLaunch(mode="colocated", spec_json=tmp_path / "s.json", metrics_dir=tmp_path, base_dir=tmp_path,
                           cache_dir=tmp_path, count=1, accelerator="tpu", accelerators=8,
                           checkpoint_dir="gs://b/ck/run", restore_from="gs://b/ck/old")
    args = launch.harness_args(0, spec="s.json", metrics="m.jsonl", cache_dir="c", base_dir="b", dispatcher=None)
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs["--accelerator"] == "tpu" and pairs["--accelerators"] == "8"
    # gs:// paths pass through (one folder per trainer inside the run's)
    assert pairs["--checkpoint-dir"].startswith("gs://b/ck/run") and pairs["--restore-from"].startswith("gs://b/ck/old")
    plain = TrainerLaunch(mode="colocated", spec_json=tmp_path / "s.json", metrics_dir=tmp_path, base_dir=tmp_path,
                          cache_dir=tmp_path, count=1)
    args = plain.harness_args(0, spec="s.json", metrics="m.jsonl", cache_dir="c", base_dir="b", dispatcher=None)
    assert not {"--accelerator", "--checkpoint-dir", "--restore-from"} & set(args)


@pytest.mark.parametrize("machine", ["a2-highgpu-2g", "a2-highgpu-1g"])
@pytest.mark.integration  # imports TensorFlow in this process
def test_gpu_machines_without_gpus_here_are_one_paragraph(machine):
    tf = pytest.importorskip("tensorflow")
    assert not tf.config.list_physical_devices("GPU"), "this test describes a machine without GPUs"
    with pytest.raises(ModelError) as info:
        strategy.make(strategy.choose(*accelerator_of(machine)))
    message = str(info.value)
    assert "TensorFlow sees 0 GPU(s) here" in message and "trainer.machine" in message
    assert "\n" not in message and "Traceback" not in message


@pytest.mark.integration  # imports TensorFlow in this process
def test_cpu_machines_get_the_default_strategy():
    tf = pytest.importorskip("tensorflow")
    made = strategy.make(strategy.choose(*accelerator_of("n2-standard-8")))
    assert made is tf.distribute.get_strategy() and made.num_replicas_in_sync == 1


@pytest.mark.integration  # imports TensorFlow in this process
def test_on_a_tpu_batches_are_cut_to_one_static_size():
    """XLA compiles one shape: a finite pipeline's partial batches (one per worker's epoch under the service)
    are merged and cut to the batch size, the remainder dropped; other strategies get the dataset as it is."""
    tf = pytest.importorskip("tensorflow")
    from dsctl.runtime.keras_input import static_batches

    ds = tf.data.Dataset.range(100).map(lambda i: {"x": i, "label": i % 2}).batch(32)  # 32, 32, 32, 4
    assert ds.element_spec["x"].shape[0] is None
    assert static_batches(ds, "default", 32) is ds and static_batches(ds, "mirrored", 32) is ds
    cut = static_batches(ds, "tpu", 32)
    assert cut.element_spec["x"].shape[0] == 32
    assert [len(b["x"]) for b in cut] == [32, 32, 32]
    two_workers = ds.concatenate(ds)  # each with its partial last batch: 200 elements make 6 full batches
    got = [b["x"].numpy().tolist() for b in static_batches(two_workers, "tpu", 32)]
    assert [len(b) for b in got] == [32] * 6 and sum(got, [])[96:104] == [96, 97, 98, 99, 0, 1, 2, 3]
    static = tf.data.Dataset.range(100).batch(32, drop_remainder=True)
    assert static_batches(static, "tpu", None) is static  # already one static size
    with pytest.raises(ModelError, match=r"drop_remainder=True"):
        static_batches(ds, "tpu", None)
