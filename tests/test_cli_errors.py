"""Bad input through the real CLI: one paragraph naming file:line and field, exit code 2, no traceback."""

from __future__ import annotations

import pytest

from helpers import EXAMPLES, dsctl, write_spec

pytestmark = pytest.mark.integration  # every test runs dsctl as a subprocess; entrypoint checks start child processes

GOOD_TRAINER = "trainer: {steps: 10}\n"
GOOD_PIPELINE = "pipeline: {builtin: synthetic}\n"

BAD_SPECS = {
    "broken yaml": ("name: a\ntrainer: {steps: 10\n", "job.yaml:", "YAML"),
    "tab indentation": ("name: a\ntrainer:\n\tsteps: 10\n" + GOOD_PIPELINE, "job.yaml:3", "tab"),
    "unknown key": ("name: a\nservise: {workers: 2}\n" + GOOD_TRAINER + GOOD_PIPELINE, "job.yaml:2", "did you mean 'service'"),
    "unknown nested key": ("name: a\nservice:\n  wrokers: 2\n" + GOOD_TRAINER + GOOD_PIPELINE, "job.yaml:3",
                           "did you mean 'workers'"),
    "wrong type": ("name: a\nservice:\n  workers: many\n" + GOOD_TRAINER + GOOD_PIPELINE, "job.yaml:3", "service.workers"),
    "zero workers": ("name: a\nservice:\n  workers: 0\n" + GOOD_TRAINER + GOOD_PIPELINE, "job.yaml:3", "at least 1"),
    "negative workers": ("name: a\nservice:\n  workers: -4\n" + GOOD_TRAINER + GOOD_PIPELINE, "job.yaml:3", "at least 1"),
    "coordinated reads without job name": (
        "name: a\nservice:\n  coordinated_reads: {num_consumers: 1, bucket_boundaries: [64]}\n" + GOOD_TRAINER
        + "pipeline: {builtin: text, params: {epochs: null}}\n", "job.yaml:3", "job_name"),
    "unknown builtin": ("name: a\n" + GOOD_TRAINER + "pipeline: {builtin: video}\n", "job.yaml:3", "synthetic"),
    "steps and duration": ("name: a\ntrainer: {steps: 10, duration_s: 5}\n" + GOOD_PIPELINE, "job.yaml:2", "at most one"),
    "bad pipeline param": ("name: a\n" + GOOD_TRAINER + "pipeline:\n  builtin: synthetic\n  params: {batch_sise: 4}\n",
                           "job.yaml:5", "did you mean 'batch_size'"),
    "empty file": ("", "job.yaml", "empty"),
    "cache with distributed epoch": (
        "name: a\nservice:\n  job_name: shared\n  cross_trainer_cache: true\n  processing_mode: distributed_epoch\n"
        + GOOD_TRAINER + "pipeline: {builtin: synthetic, params: {epochs: null}}\n", "job.yaml:5", "parallel_epochs"),
    "bad name": ("name: My Job\n" + GOOD_TRAINER + GOOD_PIPELINE, "job.yaml:1", "lower-case"),
    "unknown provider": ("name: a\nprovider: aws\n" + GOOD_TRAINER + GOOD_PIPELINE, "job.yaml:2", "local"),
    "unknown machine type": ("name: a\ntrainer: {steps: 10, machine: tpu-v9-8}\n" + GOOD_PIPELINE, "job.yaml:2",
                             "Did you mean 'tpu-v2-8'? Known machine types, closest first: tpu-v2-8"),
}

ENTRYPOINT_CASES = {
    "entrypoint module missing": ("", "nosuchmodule:make", "nosuchmodule"),
    "entrypoint function missing": ("def make_dataset():\n    pass\n", "userpipe:make_datasett", "make_dataset"),
    "entrypoint returns a list": ("def make():\n    return [1, 2, 3]\n", "userpipe:make", "list"),
    "entrypoint raises": ("def make():\n    raise ValueError('no data here')\n", "userpipe:make", "no data here"),
}


def assert_one_paragraph_error(proc, *needles):
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in err and "pydantic" not in err.lower()
    assert err.startswith("error:")
    flat = " ".join(err.split())
    for needle in needles:
        assert needle.lower() in flat.lower(), f"{needle!r} not in: {flat}"


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
@pytest.mark.parametrize("command", ["validate", "up"])
def test_malformed_spec_is_exit_2_with_location(tmp_path, home, case, command):
    text, where, hint = BAD_SPECS[case]
    spec = write_spec(tmp_path, text)
    proc = dsctl(command, spec, cwd=tmp_path)
    assert_one_paragraph_error(proc, where.replace("job.yaml", str(spec)), hint)
    assert not (home / "runs").exists() or not any((home / "runs").iterdir()), "nothing started for bad input"


@pytest.mark.parametrize("case", sorted(ENTRYPOINT_CASES))
def test_entrypoint_failures_are_exit_2(tmp_path, home, case):
    module, entrypoint, hint = ENTRYPOINT_CASES[case]
    (tmp_path / "userpipe.py").write_text(module)
    spec = write_spec(tmp_path, f"name: a\ntrainer: {{steps: 10}}\npipeline:\n  entrypoint: {entrypoint}\n")
    proc = dsctl("up", spec)
    assert_one_paragraph_error(proc, f"{spec}:4", "pipeline.entrypoint", hint)


def test_model_entrypoint_that_does_not_import_is_exit_2(tmp_path, home):
    spec = write_spec(tmp_path, "name: a\ntrainer:\n  steps: 10\n  model: {kind: python, entrypoint: 'nomodel:step'}\n"
                      + GOOD_PIPELINE)
    assert_one_paragraph_error(dsctl("validate", spec), f"{spec}:4", "trainer.model.entrypoint", "nomodel")


def test_too_many_local_workers_is_refused_before_anything_starts(tmp_path, home):
    # an endless pipeline: a finite one would also be warned of (640 copies of it an epoch under parallel_epochs)
    spec = write_spec(tmp_path, "name: a\nservice: {workers: 640}\n" + GOOD_TRAINER
                      + "pipeline: {builtin: synthetic, params: {epochs: null}}\n")
    proc = dsctl("up", spec)
    assert_one_paragraph_error(proc, "640 workers", "--simulate", "provider: gcp")


def test_usage_errors_and_unknown_runs(home):
    assert dsctl("up", EXAMPLES / "quickstart.yaml", "--mode", "fast").returncode == 2
    assert_one_paragraph_error(dsctl("runs", "show", "no-such-run"), "no-such-run")
    assert_one_paragraph_error(dsctl("down", "no-such-run"), "no-such-run")


def test_validate_accepts_every_example(home):
    for spec in sorted(EXAMPLES.glob("*.yaml")):
        proc = dsctl("validate", spec)
        assert proc.returncode == 0, proc.stderr
        assert "ok" in proc.stdout
