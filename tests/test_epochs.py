"""Training programs as people write them: an epoch loop over a finite dataset, evaluation between epochs.

What a spec's epochs mean before anything runs (a pipeline that ends may decide the job's length; parallel_epochs
with several workers is refused or warned, pointing at its line), what `dsctl validate` and `up` check of it
(every problem, unknown machine types), how the measured loop counts epochs and the time a program spends
outside its batches, and that a program run without dsctl is bounded by its own loop only. No TensorFlow: the
loop reads any iterable of batches, and specs are checked without their pipelines."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from dsctl.orchestrator.preflight import load_job
from dsctl.runtime.loop import MeasuredLoop
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
    endless = load_spec_text(text.replace("{steps: 5}", "{command: python train.py}"))
    endless.pipeline_cardinality = -1  # nothing would end this job
    [problem], _ = epoch_findings(endless, 1, "colocated")
    assert problem.field == "trainer" and "the dataset data:make returns never ends" in problem.message


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


# -- the measured loop: epochs, and the time a program spends between them ------------------------------------

class Recorder:
    trainer = 0

    def __init__(self):
        self.events: list[tuple[str, dict]] = []

    def emit(self, event: str, **fields) -> None:
        self.events.append((event, fields))

    def of(self, kind: str) -> list[dict]:
        return [f for e, f in self.events if e == kind]


def epoch(n: int, size: int = 4) -> list[dict]:
    return [{"x": np.zeros((size, 2)), "label": np.zeros(size)} for _ in range(n)]


def test_each_pass_read_to_its_end_is_an_epoch_and_the_time_between_them_is_the_programs():
    rec = Recorder()
    loop = MeasuredLoop(rec, steps=None, duration_s=None, window_s=1000.0, warmup_batches=0, pass_length=(6, 24))
    for _ in range(3):
        for _ in loop.run(epoch(6)):
            time.sleep(0.002)  # the step
        time.sleep(0.1)  # evaluation, between epochs: outside the loop
    loop.finish()
    assert [e["batches"] for e in rec.of("epoch")] == [6, 6, 6] and [e["examples"] for e in rec.of("epoch")] == [24] * 3
    [end] = rec.of("end")
    assert end["reason"] == "end_of_data" and end["epochs"] == 3 and end["epoch_batches"] == [6, 6, 6]
    assert (end["pass_batches"], end["pass_examples"]) == (6, 24)
    # two evaluations fall between the passes; the one after the last pass is after the measurement's end
    assert 0.19 <= end["outside_s"] < 0.35, end
    assert end["measured_s"] >= end["outside_s"] + end["input_wait_s"] + end["step_s"] - 1e-6
    # per wall clock the evaluations count; per training step time they do not
    assert end["step_batches_per_s"] > 3 * end["batches_per_s"]


# -- dsctl.train without dsctl: the program's own loop rules -------------------------------------------------

@pytest.fixture
def standalone(monkeypatch, tmp_path):
    """A program run with plain `python train.py`: no DSCTL_TRAINER, the spec read by dataset(spec=...)."""
    from dsctl.runtime import client
    from dsctl.runtime.trainer_args import ENV_VAR

    monkeypatch.delenv(ENV_VAR, raising=False)
    loaded = load_spec(spec(tmp_path, workers=1, length=", steps: 10"))
    run = client._Run(spec=loaded.spec, args=None, base_dir=loaded.base_dir, spec_path=loaded.source.path)
    monkeypatch.setattr(client, "_RUN", run)
    return run


def test_outside_a_run_the_specs_steps_do_not_end_the_program(standalone):
    """The program's own --num_epochs decides: 3 epochs of 6 batches is 18, past the spec's trainer.steps (10).
    (Steps bounding a standalone program again fails here.)"""
    from dsctl import train

    read = [sum(1 for _ in train.batches(epoch(6))) for _ in range(3)]
    assert read == [6, 6, 6]
    assert train.steps() is None  # nothing bounds it but the program


@pytest.fixture
def inside(monkeypatch, tmp_path):
    """A program under `dsctl up` (DSCTL_TRAINER set), its metrics in m.jsonl."""
    from dsctl.runtime import client
    from dsctl.runtime.trainer_args import ENV_VAR, TrainerArgs

    def told(mode: str = "service", **spec_args) -> None:
        loaded = load_spec(spec(tmp_path, **spec_args))
        (tmp_path / "spec.json").write_text(loaded.spec.model_dump_json())
        args = TrainerArgs(spec=str(tmp_path / "spec.json"), metrics=str(tmp_path / "m.jsonl"), mode=mode,
                           base_dir=str(tmp_path))
        monkeypatch.setenv(ENV_VAR, args.to_env())
        monkeypatch.setattr(client, "_RUN", None)
        run = client._current(needed_by="test")
        run.started, run.pass_length = True, (6, 24)
    return told


def test_a_program_reading_past_the_cap_is_told_the_field_and_its_epochs(inside):
    from dsctl import train

    inside(workers=1, length=", steps: 15")
    assert [sum(1 for _ in train.batches(epoch(6))) for _ in range(3)] == [6, 6, 3]  # the cap, in the 3rd epoch
    with pytest.raises(train.TrainError) as info:
        list(train.batches(epoch(6)))
    message = str(info.value)
    assert message.startswith("trainer.steps: the program asked for more batches once all 15 that trainer.steps "
                              "allows (the cap on the job's training steps) were read")
    assert "in 2 full epoch(s) of 6 batches and 3 of the next" in message and "Remove trainer.steps" in message
    assert "copy per worker" not in message  # its epochs have the batches of a pass read alone


def test_epochs_that_hold_a_copy_per_worker_name_the_processing_mode(inside):
    """parallel_epochs, 2 workers: each pass through the service holds 12 batches where the pipeline has 6."""
    from dsctl import train

    inside(workers=2, length=", steps: 30")
    assert [sum(1 for _ in train.batches(epoch(12))) for _ in range(3)] == [12, 12, 6]
    with pytest.raises(train.TrainError) as info:
        list(train.batches(epoch(12)))
    message = str(info.value)
    assert message.startswith("service.processing_mode: the program asked for more batches once all 30 that "
                              "trainer.steps allows were read")
    assert "where its pipeline read alone has 6 a pass" in message and "distributed_epoch" in message


# -- what a run's summary says of its epochs ----------------------------------------------------------------

def test_the_summary_says_the_epochs_and_why_they_differ_from_a_pass_read_alone():
    from dsctl.orchestrator.summary import epoch_note, epoch_summary

    end = {"epochs": 3, "reason": "end_of_data", "epoch_batches": [31, 30, 30], "epoch_examples": [992, 960, 960],
           "pass_batches": 32, "pass_examples": 1000}
    s = epoch_summary({0: end})
    assert s == {"epochs": 3, "ended_by": "end_of_data", "epoch_batches": [31, 30, 30],
                 "epoch_examples": [992, 960, 960], "pass_batches": 32, "pass_examples": 1000}
    note = epoch_note(s, "service", "distributed_epoch", 2)
    assert note.startswith("epochs of 31, 30, 30 batches (992, 960, 960 elements) against 32 batches a pass read "
                           "alone (1000 elements)")
    assert "each of the 2 workers batches the shards" in note and "drop_remainder" in note
    assert "each of the 2 workers produced the whole dataset" in epoch_note(
        {**s, "epoch_batches": [64, 64, 64]}, "service", "parallel_epochs", 2)
    assert epoch_note({**s, "epoch_batches": [32, 32, 32]}, "service", "distributed_epoch", 2) is None


def test_the_summary_table_labels_time_and_epochs():
    from types import SimpleNamespace

    from rich.console import Console

    from dsctl.cli.render import summary_table

    summary = {"batches_per_s": 40.5, "step_batches_per_s": 55.7, "outside_s": 2.4, "outside_frac": 0.25,
               "batches": 192, "epochs": 3, "ended_by": "end_of_data", "epoch_batches": [64, 64, 64],
               "pass_batches": 64, "epoch_note": None}
    record = SimpleNamespace(id="r-1", mode="service", status="succeeded", trainers=1, workers=2, summary=summary,
                             error=None, resumed_from=None, checkpoint_dir=None)
    console = Console(width=250, record=True, file=open("/dev/null", "w"))
    console.print(summary_table(record))
    text = console.export_text()
    assert "40.50 batches/s per trainer over the wall clock" in text
    assert "55.70 batches/s per trainer over its training step time" in text
    assert "2.4 s per trainer (25.0% of the measured time) outside its loop over the batches" in text
    assert "3: 64 batches each; a pass read alone: 64 batches; ended by the end of its data" in text
