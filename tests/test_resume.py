"""`dsctl up JOB.yaml --resume RUN`: each refusal (exit 2, one paragraph), the plan it prints, chains of resumes,
damaged checkpoints skipped for the newest intact ones (and the plan saying so), TensorFlow's state file read without
TensorFlow, where each trainer's checkpoints are, and the Google Cloud rule for checkpoint folders. Records are real SQLite,
checkpoint folders real files in TensorFlow's CheckpointManager layout; nothing here starts a job."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dsctl.orchestrator.checkpoints import _parse, latest, run_checkpoint_dir, trainer_dirs
from dsctl.orchestrator.resume import plan_resume
from dsctl.orchestrator.store import RunStore
from dsctl.provisioners import TrainerLaunch
from dsctl.specs import SpecError, load_spec, load_spec_text, spec_hash
from helpers import dsctl, write_spec

# A keras job whose model module imports nothing heavy: `dsctl up` checks the entrypoint imports in a child
# process, and these tests are refused (or stop at --dry-run) before any model is built.
MODEL = "def build_model(**params):\n    raise RuntimeError('these tests never build the model')\n"
JOB = """
name: fit
trainer:
  machine: n2-standard-8
  count: {count}
  model: {{kind: keras, entrypoint: "tinymodel:build_model", params: {{width: 16}}}}
  steps: {steps}
  {checkpoint}
pipeline:
  builtin: synthetic
  params: {{epochs: null, label_classes: {classes}}}
"""
CHECKPOINT = "checkpoint: {dir: ck, every_steps: 100}"


def job(dir: Path, *, count: int = 1, steps: int = 300, classes: int = 4, checkpoint: str = CHECKPOINT,
        name: str = "job.yaml") -> Path:
    (dir / "tinymodel.py").write_text(MODEL)
    return write_spec(dir, JOB.format(count=count, steps=steps, classes=classes, checkpoint=checkpoint), name)


def record(store: RunStore, run_id: str, spec_path: Path, *, status: str = "interrupted", created_at: float = 1.0,
           resumed_from: str | None = None) -> str:
    """A run of `spec_path` as `dsctl up` records it; returns its checkpoint folder."""
    loaded = load_spec(spec_path, check_entrypoints=False)
    ck = run_checkpoint_dir(loaded.spec, loaded.base_dir, run_id)
    store.create_run(id=run_id, name="fit", provider="local", mode="service", status=status,
                     spec_path=str(spec_path), spec_json=loaded.spec.model_dump_json(), spec_hash=spec_hash(loaded.spec),
                     workers=1, trainers=loaded.spec.trainer.count, created_at=created_at, resumed_from=resumed_from,
                     checkpoint_dir=ck)
    return ck


def save(ck: str, trainer: int, step: int) -> None:
    """The `checkpoint` index file CheckpointManager(...).save(checkpoint_number=step) leaves, and the files it names."""
    d = Path(TrainerLaunch.trainer_checkpoint_dir(ck, trainer))
    d.mkdir(parents=True, exist_ok=True)
    for suffix in (".index", ".data-00000-of-00001"):
        (d / f"ckpt-{step}{suffix}").write_bytes(b"\0")
    (d / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{step}"\nall_model_checkpoint_paths: "ckpt-{step}"\n'
                                  "all_model_checkpoint_timestamps: 1795597061.5\n"
                                  "last_preserved_timestamp: 1795597000.25\n")


def refused(spec: Path, run: str) -> str:
    """`dsctl up --resume`: exit 2 and one paragraph on stderr, no traceback; returns it."""
    proc = dsctl("up", spec, "--resume", run, "--dry-run", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err, err
    assert "resuming run" not in proc.stdout
    return err


# -- refusals ----------------------------------------------------------------------------------------------------

@pytest.mark.integration  # dsctl as a subprocess
def test_refuses_a_run_that_does_not_exist(home, tmp_path):
    err = refused(job(tmp_path), "no-such-run")
    assert "no run 'no-such-run' is recorded" in err and "dsctl runs" in err


@pytest.mark.integration  # dsctl as a subprocess
def test_refuses_a_run_that_is_still_running(home, tmp_path):
    spec = job(tmp_path)
    ck = record(RunStore(), "fit-live", spec, status="running")
    save(ck, 0, 100)
    err = refused(spec, "fit-live")
    assert "run fit-live is still running" in err and "dsctl down fit-live" in err


@pytest.mark.integration  # dsctl as a subprocess
def test_refuses_a_run_whose_spec_had_no_checkpoints(home, tmp_path):
    old = job(tmp_path, checkpoint="", name="old.yaml")
    record(RunStore(), "fit-nock", old)
    err = refused(job(tmp_path), "fit-nock")
    assert "run fit-nock wrote no checkpoints: its spec has no trainer.checkpoint section" in err


@pytest.mark.integration  # dsctl as a subprocess
def test_refuses_a_run_that_wrote_no_checkpoint(home, tmp_path):
    spec = job(tmp_path)
    ck = record(RunStore(), "fit-early", spec)
    err = refused(spec, "fit-early")
    assert f"run fit-early wrote no checkpoint for every trainer in {ck}/trainer-<i>" in err
    assert "every 100 steps" in err


@pytest.mark.integration  # dsctl as a subprocess
def test_refuses_another_pipeline_naming_the_field_and_its_line(home, tmp_path):
    record(RunStore(), "fit-a", job(tmp_path, name="old.yaml"))
    spec = job(tmp_path, classes=5)
    err = refused(spec, "fit-a")
    line = next(i for i, text in enumerate(spec.read_text().splitlines(), 1) if "label_classes" in text)
    assert f"{spec}:{line}: pipeline.params.label_classes:" in err
    assert "label_classes is 5 here but was 4 there" in err


@pytest.mark.integration  # dsctl as a subprocess
def test_refuses_another_trainer_count(home, tmp_path):
    record(RunStore(), "fit-b", job(tmp_path, name="old.yaml"))
    err = refused(job(tmp_path, count=2), "fit-b")
    assert "trainer.count is 2 here but was 1 there" in err


@pytest.mark.integration  # dsctl as a subprocess
def test_refuses_when_the_checkpoint_already_reached_the_steps(home, tmp_path):
    spec = job(tmp_path)
    save(record(RunStore(), "fit-done", spec, status="succeeded"), 0, 300)
    err = refused(spec, "fit-done")
    assert "its checkpoints are at step 300, and this spec trains 300 steps" in err and "trainer.steps" in err


# -- what it restores --------------------------------------------------------------------------------------------

@pytest.mark.integration  # dsctl as a subprocess
def test_the_plan_says_it_resumes_and_from_which_step(home, tmp_path):
    spec = job(tmp_path)
    ck = record(RunStore(), "fit-cut", spec)
    save(ck, 0, 200)
    proc = dsctl("up", spec, "--resume", "fit-cut", "--dry-run", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (f"resuming run fit-cut from step 200 (checkpoints in {ck}/trainer-<i>): trains the remaining 100 of 300 "
            "steps.") in proc.stdout
    assert "Nothing was started" in proc.stdout
    assert RunStore().ids() == ["fit-cut"]  # a dry run records nothing


def test_each_trainer_restores_its_own_folder(home, tmp_path):
    """Trainer i is told to restore from and save to trainer-i folders, the ones a resume looks in."""
    launch = TrainerLaunch(mode="service", spec_json=tmp_path / "s.json", metrics_dir=tmp_path, base_dir=tmp_path,
                           cache_dir=tmp_path, count=3, checkpoint_dir="/ck/new", restore_from="/ck/old")
    for i in range(3):
        args = launch.harness_args(i, spec="s", metrics="m", cache_dir="c", base_dir="b", dispatcher="d:1")
        assert args[args.index("--restore-from") + 1] == trainer_dirs("/ck/old", 3)[i] == f"/ck/old/trainer-{i}"
        assert args[args.index("--checkpoint-dir") + 1] == f"/ck/new/trainer-{i}"


def test_a_run_needs_a_checkpoint_for_every_trainer_and_uses_the_lowest_step(home, tmp_path):
    spec = job(tmp_path, count=2)
    loaded = load_spec(spec, check_entrypoints=False)
    store = RunStore()
    ck = record(store, "fit-two", spec)
    save(ck, 1, 200)
    with pytest.raises(SpecError, match="wrote no checkpoint for every trainer"):
        plan_resume(store, "fit-two", loaded)
    save(ck, 0, 100)
    resume = plan_resume(store, "fit-two", loaded)
    assert (resume.restore_from, resume.steps, resume.step) == (ck, (100, 200), 100)


def test_a_resumed_run_without_checkpoints_of_its_own_resumes_from_its_chain(home, tmp_path):
    spec = job(tmp_path)
    loaded = load_spec(spec, check_entrypoints=False)
    store = RunStore()
    first = record(store, "fit-1", spec, created_at=1.0)
    second = record(store, "fit-2", spec, created_at=2.0, resumed_from="fit-1")
    third = record(store, "fit-3", spec, created_at=3.0, resumed_from="fit-2")
    save(first, 0, 100)
    resume = plan_resume(store, "fit-3", loaded)  # fit-3 and fit-2 stopped before saving: fit-1's checkpoint
    assert (resume.run_id, resume.holder, resume.restore_from, resume.step) == ("fit-3", "fit-1", first, 100)
    save(second, 0, 200)
    resume = plan_resume(store, "fit-3", loaded)
    assert (resume.holder, resume.restore_from, resume.step) == ("fit-2", second, 200)
    save(third, 0, 250)
    assert plan_resume(store, "fit-3", loaded).restore_from == third


def test_the_latest_checkpoint_is_read_from_the_index_file(tmp_path):
    assert latest(str(tmp_path / "missing")).found is False
    save(str(tmp_path), 0, 1200)
    found = latest(str(tmp_path / "trainer-0"))
    assert (found.found, found.step) == (True, 1200)


# -- damaged checkpoints --------------------------------------------------------------------------------------------

def keep(ck: str, trainer: int, steps: list[int], *, damage: dict[int, str] | None = None) -> Path:
    """A trainer's folder as CheckpointManager(max_to_keep=len(steps)) leaves it after saving at `steps` (the last is
    the latest), with the files of the steps in `damage` damaged as a disk or a copy damages them: "no-index",
    "empty-index", "no-data", "empty-data" or "lost-shard" (one of two .data shards gone). The folder."""
    d = Path(TrainerLaunch.trainer_checkpoint_dir(ck, trainer))
    d.mkdir(parents=True, exist_ok=True)
    for step in steps:
        how = (damage or {}).get(step)
        shards = 2 if how == "lost-shard" else 1
        if how != "no-index":
            (d / f"ckpt-{step}.index").write_bytes(b"" if how == "empty-index" else b"\0")
        for shard in range(shards if how != "no-data" else 0):
            if how == "lost-shard" and shard == 1:
                continue
            (d / f"ckpt-{step}.data-{shard:05d}-of-{shards:05d}").write_bytes(b"" if how == "empty-data" else b"\0")
    (d / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{steps[-1]}"\n'
                                  + "".join(f'all_model_checkpoint_paths: "ckpt-{s}"\n' for s in steps)
                                  + "".join("all_model_checkpoint_timestamps: 1795597061.5\n" for _ in steps)
                                  + "last_preserved_timestamp: 1795597000.25\n")
    return d


@pytest.mark.parametrize(("damage", "why"), [
    ("no-index", "its .index file is missing"),
    ("empty-index", "its .index file is empty"),
    ("no-data", "its .data file is missing"),
    ("empty-data", "ckpt-300.data-00000-of-00001 is empty"),
    ("lost-shard", "1 of its 2 .data files are missing"),
])
def test_a_damaged_latest_checkpoint_is_skipped_for_the_newest_intact_one_and_the_plan_says_so(home, tmp_path,
                                                                                              damage, why):
    spec = job(tmp_path, steps=500)
    loaded = load_spec(spec, check_entrypoints=False)
    store = RunStore()
    ck = record(store, "fit-hurt", spec)
    folder = keep(ck, 0, [100, 200, 300], damage={300: damage})
    resume = plan_resume(store, "fit-hurt", loaded)
    assert (resume.holder, resume.restore_from, resume.steps, resume.step) == ("fit-hurt", ck, (200,), 200)
    assert resume.notes == (f"trainer 0's latest checkpoint is damaged ({folder}/ckpt-300: {why}): it resumes from "
                            "step 200, the newest intact one",)


def test_every_damaged_checkpoint_newer_than_the_intact_one_is_named_and_only_the_damaged_trainer_noted(home, tmp_path):
    spec = job(tmp_path, count=2, steps=500)
    loaded = load_spec(spec, check_entrypoints=False)
    store = RunStore()
    ck = record(store, "fit-pair", spec)
    keep(ck, 0, [100, 200, 300])
    hurt = keep(ck, 1, [100, 200, 300], damage={300: "no-index", 200: "empty-data"})
    resume = plan_resume(store, "fit-pair", loaded)
    assert (resume.steps, resume.step) == ((300, 100), 100)
    assert resume.notes == (f"trainer 1's latest checkpoint is damaged ({hurt}/ckpt-300: its .index file is missing; "
                            f"{hurt}/ckpt-200: ckpt-200.data-00000-of-00001 is empty): it resumes from step 100, the "
                            "newest intact one",)


def test_a_resumed_run_whose_checkpoints_are_all_damaged_resumes_from_its_chain_and_says_which_it_skipped(home,
                                                                                                        tmp_path):
    spec = job(tmp_path, steps=500)
    loaded = load_spec(spec, check_entrypoints=False)
    store = RunStore()
    first = record(store, "fit-a1", spec, created_at=1.0)
    second = record(store, "fit-a2", spec, created_at=2.0, resumed_from="fit-a1")
    keep(first, 0, [100])
    hurt = keep(second, 0, [200, 300], damage={200: "no-data", 300: "empty-index"})
    resume = plan_resume(store, "fit-a2", loaded)
    assert (resume.run_id, resume.holder, resume.restore_from, resume.step) == ("fit-a2", "fit-a1", first, 100)
    assert resume.notes == (f"skipped as damaged, run fit-a2's checkpoints: {hurt}/ckpt-300: its .index file is "
                            f"empty; {hurt}/ckpt-200: its .data file is missing",)


def test_with_no_intact_checkpoint_left_the_refusal_names_each_damaged_one(home, tmp_path):
    spec = job(tmp_path)
    loaded = load_spec(spec, check_entrypoints=False)
    store = RunStore()
    hurt = keep(record(store, "fit-gone", spec), 0, [100, 200], damage={100: "no-index", 200: "lost-shard"})
    with pytest.raises(SpecError) as exc:
        plan_resume(store, "fit-gone", loaded)
    assert str(exc.value) == (f"--resume fit-gone: no intact checkpoint is left for every trainer (their files are "
                              f"missing or empty: {hurt}/ckpt-200: 1 of its 2 .data files are missing; {hurt}/ckpt-100: "
                              "its .index file is missing). Restore those files from a copy, or start the job afresh "
                              "without --resume.")


@pytest.mark.parametrize(("text", "found", "step"), [
    ("", False, None),  # an empty state file: TensorFlow wrote nothing yet
    ('all_model_checkpoint_paths: "ckpt-100"\n', False, None),  # no latest named
    ('model_checkpoint_path: "/elsewhere/model.ckpt"\n', True, None),  # a latest with no step in its name
    ('model_checkpoint_path: "/abs/path/ckpt-700"\nall_model_checkpoint_paths: "/abs/path/ckpt-700"\n', True, 700),
])
def test_the_state_file_is_read_as_tensorflow_writes_it(tmp_path, text, found, step):
    """What TensorFlow's `checkpoint` file can say, read without TensorFlow: an absolute prefix is looked up in the
    trainer's own folder (a copied folder keeps its old paths)."""
    (tmp_path / "ckpt-700.index").write_bytes(b"\0")
    (tmp_path / "ckpt-700.data-00000-of-00001").write_bytes(b"\0")
    (tmp_path / "checkpoint").write_text(text)
    got = latest(str(tmp_path))
    assert (got.found, got.step, got.damaged) == (found, step, ())


def test_a_checkpoint_in_cloud_storage_is_taken_as_its_state_file_names_it():
    """gs:// folders are not listed here (a request per file): the latest the state file names is the one."""
    text = 'model_checkpoint_path: "ckpt-300"\nall_model_checkpoint_paths: "ckpt-200"\nall_model_checkpoint_paths: "ckpt-300"\n'
    got = _parse(text, "gs://b/ck/trainer-0")
    assert (got.found, got.step, got.damaged) == (True, 300, ())


@pytest.mark.integration  # dsctl as a subprocess
def test_up_resume_says_which_checkpoint_was_damaged_and_which_it_resumes_from(home, tmp_path):
    spec = job(tmp_path)
    ck = record(RunStore(), "fit-torn", spec)
    folder = keep(ck, 0, [100, 200], damage={200: "no-index"})
    proc = dsctl("up", spec, "--resume", "fit-torn", "--dry-run", timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert (f"resuming run fit-torn from step 100 (checkpoints in {ck}/trainer-<i>): trains the remaining 200 of 300 "
            f"steps. trainer 0's latest checkpoint is damaged ({folder}/ckpt-200: its .index file is missing): it "
            "resumes from step 100, the newest intact one.") in out, proc.stdout


# -- where checkpoints go ----------------------------------------------------------------------------------------

def spec_with(dir_line: str, provider: str = "local", extra: str = "") -> str:
    gcp = "gcp: {project: my-project, zone: us-central1-b}\n" if provider == "gcp" else ""
    return textwrap.dedent(f"""\
        name: fit
        provider: {provider}
        trainer:
          machine: n2-standard-8
          model: {{kind: keras, entrypoint: "tinymodel:build_model"}}
          steps: 300
          checkpoint: {{dir: {dir_line}, every_steps: 100}}
          {extra}
        pipeline:
          builtin: synthetic
          params: {{label_classes: 4}}
        """) + gcp


def test_a_relative_checkpoint_folder_is_relative_to_the_spec_file(tmp_path):
    spec = load_spec_text(spec_with("ck/here")).spec
    assert run_checkpoint_dir(spec, tmp_path, "r-1") == str(tmp_path / "ck" / "here" / "r-1")
    spec = load_spec_text(spec_with("/abs/ck")).spec
    assert run_checkpoint_dir(spec, tmp_path, "r-1") == "/abs/ck/r-1"
    spec = load_spec_text(spec_with("gs://bkt/ck/")).spec
    assert run_checkpoint_dir(spec, tmp_path, "r-1") == "gs://bkt/ck/r-1"


def line_of(text: str, key: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.strip().startswith(key))


def test_on_google_cloud_checkpoints_must_go_to_cloud_storage():
    text = spec_with("ck", provider="gcp")
    with pytest.raises(SpecError) as exc:
        load_spec_text(text, "job.yaml")
    line = line_of(text, "checkpoint:")
    assert str(exc.value).startswith(f"job.yaml:{line}: trainer.checkpoint.dir: with provider: gcp checkpoints")
    assert "gs://my-bucket/checkpoints" in str(exc.value)
    text = spec_with("gs://bkt/ck", provider="gcp", extra="tensorboard_dir: tb")
    with pytest.raises(SpecError, match=rf"job.yaml:{line_of(text, 'tensorboard_dir')}: trainer.tensorboard_dir: "
                                        "with provider: gcp"):
        load_spec_text(text, "job.yaml")
    loaded = load_spec_text(spec_with("gs://bkt/ck", provider="gcp", extra="tensorboard_dir: gs://bkt/tb"))
    assert loaded.spec.trainer.checkpoint.dir == "gs://bkt/ck"


@pytest.mark.integration  # dsctl as a subprocess
def test_validate_reports_the_gcp_rule_as_one_paragraph(home, tmp_path):
    (tmp_path / "tinymodel.py").write_text(MODEL)
    spec = write_spec(tmp_path, spec_with("ck", provider="gcp"))
    proc = dsctl("validate", spec)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    line = line_of(spec.read_text(), "checkpoint:")
    assert err.startswith(f"error: {spec}:{line}: trainer.checkpoint.dir:") and "\n" not in err
