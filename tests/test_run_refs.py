"""A run named by a prefix of its id (orchestrator/store.py find): one run's prefix names it; a prefix of several is
refused, listing them, by `runs show`, `logs`, `cost report`, `tensorboard`, `up --resume` and `down` (never "no
deployment found")."""

from __future__ import annotations

import pytest

from dsctl.orchestrator import takedown
from dsctl.orchestrator.store import AmbiguousRun, RunStore
from dsctl.provisioners import Deployment, Where
from dsctl.specs import SpecError, load_spec_text

SPEC = load_spec_text("name: job\nservice: {workers: 1}\ntrainer: {steps: 20}\npipeline: {builtin: synthetic}\n").spec


def record(store: RunStore, run_id: str, status: str = "succeeded") -> None:
    store.create_run(id=run_id, name="job", kind="job", parent_id=None, provider="local", mode="service",
                     status=status, spec_path=None, spec_yaml=None, spec_json=SPEC.model_dump_json(), spec_hash="h",
                     workers=1, trainers=1, run_dir=None)


def test_a_prefix_of_one_run_names_it_and_a_prefix_of_several_lists_them(home):
    store = RunStore()
    for run_id in ("job-1129-0401-aaaa", "job-1129-0402-bbbb", "my_job-1", "myxjob-2"):
        record(store, run_id)
    assert store.find("job-1129-0401").id == "job-1129-0401-aaaa"
    assert store.find("job-1129-0402-bbbb").id == "job-1129-0402-bbbb"
    assert store.find("nothing") is None
    with pytest.raises(AmbiguousRun) as refused:
        store.find("job-1129")
    assert isinstance(refused.value, SpecError) and refused.value.exit_code == 2
    assert "'job-1129' is ambiguous: it begins the ids of 2 runs: job-1129-0402-bbbb, job-1129-0401-aaaa" in str(
        refused.value)
    assert store.find("my_").id == "my_job-1", "an underscore in a prefix is itself, not a wildcard"


def test_down_of_a_prefix_of_two_deployments_lists_them_instead_of_finding_none(home):
    for run_id in ("job-1129-0401-aaaa", "job-1129-0402-bbbb"):
        run_dir = home / "runs" / run_id
        run_dir.mkdir(parents=True)
        Deployment(run_id=run_id, provider="local", run_dir=str(run_dir), status="up").save()
    with pytest.raises(AmbiguousRun, match="begins the ids of 2 deployments that are up"):
        takedown.down("job-1129", False, Where(), say=print)


def test_down_of_a_prefix_of_two_recorded_runs_with_no_deployment_lists_them(home):
    store = RunStore()
    for run_id in ("job-1129-0401-aaaa", "job-1129-0402-bbbb"):
        record(store, run_id)
    with pytest.raises(AmbiguousRun, match="begins the ids of 2 runs"):
        takedown.down("job-1129", False, Where(), say=print)


def test_a_run_that_does_not_exist_and_a_bad_flag_are_usage_errors(home):
    """As Click's UsageError: exit 2, one paragraph naming the run or the option and what would be valid."""
    from dsctl.cli.up import choice
    from dsctl.orchestrator.runs import find_run
    from dsctl.specs import UsageError

    record(RunStore(), "job-1129-0401-aaaa")
    with pytest.raises(UsageError) as missing:
        find_run(RunStore(), "nosuch")
    assert missing.value.exit_code == 2 and str(missing.value) == ("no run 'nosuch' is recorded; `dsctl runs` lists "
                                                                   "the recorded ones.")
    with pytest.raises(UsageError, match="--mode must be one of service, colocated, ideal, got 'fast'"):
        choice("fast", ("service", "colocated", "ideal"), "--mode")
    assert issubclass(AmbiguousRun, UsageError)
    for run_id in ("job-1", "job-2"):
        (home / "runs" / run_id).mkdir(parents=True)
        Deployment(run_id=run_id, provider="local", run_dir=str(home / "runs" / run_id), status="up").save()
    with pytest.raises(UsageError, match="2 deployments are up .* name one with `dsctl down RUN` or use --all"):
        takedown.down(None, False, Where(), say=print)
