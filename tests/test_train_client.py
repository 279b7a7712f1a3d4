"""dsctl.train's answers that need no dataset: what a program asks before it builds its input, inside a run and
outside one."""

from __future__ import annotations

import pytest

from dsctl import train
from dsctl.runtime import client
from dsctl.runtime.trainer_args import ENV_VAR, TrainerArgs
from dsctl.specs.schema import JobSpec

SPEC = JobSpec.model_validate({"name": "t", "trainer": {"command": "python train.py", "steps": 300},
                               "pipeline": {"builtin": "synthetic"}})


@pytest.fixture
def inside_a_run(monkeypatch, tmp_path):
    """The environment dsctl's runner gives a program: DSCTL_TRAINER, and no dsctl.train state yet."""
    monkeypatch.setattr(client, "_RUN", None)

    def told(**changes) -> None:
        (tmp_path / "spec.json").write_text(SPEC.model_dump_json())
        args = TrainerArgs(spec=str(tmp_path / "spec.json"), metrics=str(tmp_path / "m.jsonl"), mode="colocated",
                           base_dir=str(tmp_path), **changes)
        monkeypatch.setenv(ENV_VAR, args.to_env())
    return told


def test_a_program_that_restores_before_it_builds_its_input_is_told_the_step_to_resume_from(inside_a_run):
    inside_a_run(resume_step=200)
    assert train.resume_step() == 200  # before dataset(): a program restores its checkpoint first
    assert client._current(needed_by="test").budget() == 100  # and it reads only the steps left


def test_steps_is_the_length_the_launch_gives(inside_a_run):
    inside_a_run()
    assert train.steps() == 300
    client._RUN = None
    inside_a_run(steps=None, duration_s=30.0)  # a sweep's point: bounded by time
    assert train.steps() is None


def test_outside_a_run_without_a_spec_the_program_is_told_what_to_pass(monkeypatch):
    monkeypatch.setattr(client, "_RUN", None)
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert train.resume_step() == 0
    with pytest.raises(train.TrainError, match=r"dataset\(spec='job.yaml'\)"):
        train.checkpoint_dir()
