"""Training programs as people write them: an epoch loop over a finite dataset, evaluation between epochs.

What a spec's epochs mean before anything runs (a pipeline that ends may decide the job's length; parallel_epochs
with several workers is refused or warned, pointing at its line), what `dsctl validate` and `up` check of it
(every problem, unknown machine types), how the measured loop counts epochs and the time a program spends
outside its batches, and that a program run without dsctl is bounded by its own loop only. No TensorFlow: the
loop reads any iterable of batches, and specs are checked without their pipelines."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsctl.orchestrator.preflight import load_job
from dsctl.specs import SpecError, load_spec
from dsctl.specs.epochs import epoch_findings, pipeline_ends
from dsctl.specs.errors import SpecErrors
from dsctl.specs.pipelines import batches_per_pass


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    (tmp_path / "train.py").write_text("")
    path = tmp_path / name
    path.write_text(text.strip() + "\n")
    return path


EPOCH_PROGRAM = """
name: epochs
service: {{workers: {workers}{mode}}}
trainer: {{command: python train.py{length}}}
pipeline: {{builtin: synthetic, params: {{elements: 1000, batch_size: 32, epochs: {epochs}}}}}
"""


def spec(tmp_path: Path, workers: int = 2, mode: str = "", length: str = "", epochs: str = "1") -> Path:
    return write(tmp_path, EPOCH_PROGRAM.format(workers=workers, mode=mode, length=length, epochs=epochs))


# -- what ends a job ---------------------------------------------------------------------------------------------

def test_a_finite_pipeline_needs_no_steps_and_an_endless_one_does(tmp_path):
    loaded = load_spec(spec(tmp_path, workers=1))
    assert loaded.spec.trainer.steps is None and pipeline_ends(loaded)
    assert batches_per_pass("synthetic", loaded.spec.pipeline.params) == 32  # ceil(1000 / 32)
    with pytest.raises(SpecError) as info:
        load_spec(spec(tmp_path, workers=1, epochs="null"))
    assert info.value.field == "trainer" and "the pipeline repeats forever" in info.value.message


# -- parallel_epochs and a finite pipeline ----------------------------------------------------------------------

def test_parallel_epochs_with_two_workers_refuses_a_job_its_pipeline_ends(tmp_path):
    path = spec(tmp_path)
    with pytest.raises(SpecError) as info:
        load_job(path)
    err = info.value
    assert err.where == f"{path}:2" and err.field == "service.processing_mode"
    assert "2 copies of every element" in err.message and "processing_mode: distributed_epoch" in err.message
    # the fix it names passes, and so does one worker
    assert load_job(spec(tmp_path, mode=", processing_mode: distributed_epoch")).warnings == []
    assert load_job(spec(tmp_path, workers=1)).warnings == []


def test_parallel_epochs_with_a_cap_is_warned_at_its_line_and_named_by_the_cap(tmp_path):
    """The warning `dsctl validate` and `dsctl up` print (a deliberate removal of it fails here)."""
    loaded = load_job(spec(tmp_path, length=", steps: 300"))
    [warning] = loaded.warnings
    assert warning.where.endswith(":2") and warning.field == "service.processing_mode"
    assert "every worker produces the whole dataset" in warning.message
    assert "trainer.steps (300) cuts the job" in warning.message and "distributed_epoch" in warning.message
    # as many copies as the run has workers: `dsctl up --workers 4`
    assert "4 copies" in epoch_findings(loaded, 4)[1][0].message
    # colocated and ideal runs have no workers, and an endless pipeline has no epochs
    assert epoch_findings(loaded, 2, "colocated") == ([], [])
    assert load_job(spec(tmp_path, length=", steps: 300", epochs="null")).warnings == []


def test_a_sweep_repeats_the_pipeline_and_reads_no_epochs(tmp_path):
    assert load_job(spec(tmp_path), mode=None).warnings == []  # refused for `up`, fine for a sweep


def test_an_entrypoints_length_comes_from_its_check():
    """The entrypoint check reports the dataset's cardinality: -1 endless, -2 unknown (a finite pipeline after a
    filter or flat_map), n batches."""
    from dsctl.specs import LoadedSpec, load_spec_text

    text = "name: e\nservice: {workers: 2}\ntrainer: {steps: 5}\npipeline: {entrypoint: 'data:make'}\n"
    loaded: LoadedSpec = load_spec_text(text)
    assert pipeline_ends(loaded) is None and epoch_findings(loaded, 2) == ([], [])  # not checked: no finding
    for cardinality, ends in ((-1, False), (-2, True), (40, True)):
        loaded.pipeline_cardinality = cardinality
        assert pipeline_ends(loaded) is ends
    assert "after 40 batches" in epoch_findings(loaded, 2)[1][0].message


# -- dsctl validate: every problem, and machine types --------------------------------------------------------

def test_validate_refuses_an_unknown_machine_type_with_the_closest_known_ones(tmp_path):
    path = write(tmp_path, """
name: typo
trainer: {machine: tpu-v9-8, steps: 10}
pipeline: {builtin: synthetic}
""")
    with pytest.raises(SpecError) as info:
        load_job(path)
    assert info.value.where == f"{path}:2" and info.value.field == "trainer.machine"
    assert "unknown machine type 'tpu-v9-8'. Did you mean 'tpu-v2-8'? Known machine types, closest first: tpu-v2-8" \
        in info.value.message


def test_validate_reports_every_problem_it_finds(tmp_path):
    path = write(tmp_path, """
name: many
service: {workers: 2, worker_machine: n2-standrd-8}
trainer: {machine: tpu-v9-8, command: python train.py}
pipeline: {builtin: synthetic}
pricing: no-such-catalog
""")
    with pytest.raises(SpecErrors) as info:
        load_job(path)
    fields = [p.field for p in info.value.problems]
    assert fields == ["service.worker_machine", "trainer.machine", "pricing", "service.processing_mode"], fields
    assert len(info.value.paragraphs()) == 4 and all("\n" not in p for p in info.value.paragraphs())
