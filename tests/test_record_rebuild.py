"""A run's record survives its database (orchestrator/imports.py): runs.db removed or replaced mid-run is noticed and
the record moves to the file now there (or to the run dir, where none can be made), and `dsctl runs import` rebuilds
a record from a run's folder. (Through `dsctl up`, with runs.db removed mid-run: tests/test_run_endings.py.)"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from dsctl.orchestrator import imports, takedown
from dsctl.orchestrator.store import RunStore
from dsctl.provisioners import Deployment
from dsctl.specs import SpecError, load_spec_text

SPEC = "name: job\nservice: {workers: 1}\ntrainer: {steps: 20}\npipeline: {builtin: synthetic}\n"


def new_run(store: RunStore, home: Path, run_id: str = "job-1") -> Path:
    run_dir = home / "runs" / run_id
    run_dir.mkdir(parents=True)
    spec_json = load_spec_text(SPEC).spec.model_dump_json()
    row = dict(id=run_id, name="job", kind="job", parent_id=None, provider="local", mode="service", status="running",
               spec_path=None, spec_yaml=SPEC, spec_json=spec_json, spec_hash="h",
               workers=1, trainers=1, run_dir=str(run_dir), resumed_from=None, checkpoint_dir=None,
               created_at=time.time() - 10)
    store.create_run(**row)
    imports.write_run_file(run_dir, row)
    (run_dir / "spec.json").write_text(row["spec_json"])
    return run_dir


def window(t: float, batches: int = 10) -> dict:
    return {"trainer": 0, "t_start": t - 1, "t_end": t, "batches": batches, "batches_per_s": 10.0, "warmup": False,
            "input_wait_s": 0.1, "step_s": 0.9}


def trainer_files(run_dir: Path, finished: bool) -> None:
    metrics = run_dir / "metrics"
    metrics.mkdir()
    lines = [{"event": "window", "wall": time.time(), **window(1.0)}, {"event": "window", "wall": time.time(), **window(2.0)}]
    if finished:
        lines.append({"event": "end", "reason": "steps", "batches": 20, "step": 20, "wall": time.time(),
                      "batches_per_s": 10.0, "measured_batches": 20, "measured_s": 2.0})
    (metrics / "trainer-0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_removed_or_replaced_runs_db_is_noticed_and_the_record_moves_to_the_file_now_there(home, how):
    store = RunStore()
    run_dir = new_run(store, home)
    store.add_window("job-1", window(1.0), workers=1)
    store.add_event("job-1", "ready", "dispatcher and 1 worker(s) ready")
    assert not store.replaced()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store.path}{suffix}").unlink(missing_ok=True)
    if how == "replaced":
        other = RunStore(home / "other.db")
        other.close()
        os.replace(home / "other.db", store.path)
    assert store.replaced()
    moved, said = imports.rebuild(store, "job-1", run_dir)
    assert moved.path == home / "runs.db" and not moved.replaced() and not imports.kept_elsewhere(moved)
    assert "was removed or replaced while the run ran" in said
    moved.add_window("job-1", window(2.0), workers=1)  # the run goes on recording there
    fresh = RunStore()  # what any other dsctl command reads
    assert fresh.get("job-1").status == "running" and len(fresh.windows("job-1")) == 2
    assert [e["kind"] for e in fresh.events("job-1")] == ["ready"]


def test_where_no_runs_db_can_be_made_the_record_is_kept_in_the_run_dir_and_imported_from_there(home):
    store = RunStore()
    run_dir = new_run(store, home)
    store.add_window("job-1", window(1.0), workers=1)
    store.path.unlink()
    store.path.mkdir()  # a folder where runs.db was: SQLite cannot make a database there
    moved, said = imports.rebuild(store, "job-1", run_dir)
    assert imports.kept_elsewhere(moved) and moved.path == run_dir / imports.KEPT_DB
    assert f"`dsctl runs import {run_dir}`" in said
    moved.update_run("job-1", status="succeeded", ended_at=time.time())
    moved.close()
    store.path.rmdir()
    record, how = imports.import_run(RunStore(), run_dir)
    assert record.status == "succeeded" and "copied whole" in how and len(RunStore().windows("job-1")) == 1
    assert not (run_dir / imports.KEPT_DB).exists(), "imported once: the kept copy is set aside"
    with pytest.raises(SpecError, match="already recorded"):
        imports.import_run(RunStore(), run_dir)


def test_a_record_lost_with_its_database_is_rebuilt_from_the_runs_files(home):
    run_dir = new_run(RunStore(), home)
    trainer_files(run_dir, finished=True)
    Deployment(run_id="job-1", provider="local", run_dir=str(run_dir), status="down").save()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{home / 'runs.db'}{suffix}").unlink(missing_ok=True)
    record, how = imports.import_run(RunStore(), run_dir)
    assert record.status == "succeeded" and record.summary["batches"] == 20 and "rebuilt from its files" in how
    assert "dsctl runs import recorded the run succeeded" in record.summary["recorded_by"]


def test_down_rebuilds_a_record_that_is_gone_before_it_closes_it(home):
    run_dir = new_run(RunStore(), home)
    trainer_files(run_dir, finished=False)
    dep = Deployment(run_id="job-1", provider="local", run_dir=str(run_dir), status="down")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{home / 'runs.db'}{suffix}").unlink(missing_ok=True)
    takedown.take_down(dep)
    store = RunStore()
    record = store.get("job-1")
    assert record.status == "interrupted" and record.summary["batches"] == 20
    assert "records-rebuilt" in [e["kind"] for e in store.events("job-1")]


def test_a_folder_that_is_no_run_is_refused_in_one_paragraph(home, tmp_path):
    with pytest.raises(SpecError, match="has no run.json"):
        imports.import_run(RunStore(), tmp_path)


def test_a_store_that_is_still_its_file_is_not_replaced(home):
    store = RunStore()
    store.add_event("x", "k", "m")
    assert not store.replaced()
    with sqlite3.connect(store.path) as other:  # another connection writing is not a replacement
        other.execute("INSERT INTO events (run_id, t, kind, message) VALUES ('y', 0, 'k', 'm')")
    assert not store.replaced()


def test_a_run_closed_by_down_whose_log_says_its_disk_was_full_says_so(home):
    store = RunStore()
    run_dir = new_run(store, home)
    trainer_files(run_dir, finished=False)
    (run_dir / "metrics" / "trainer-0.log").write_text("OSError: [Errno 28] No space left on device\n")
    takedown.take_down(Deployment(run_id="job-1", provider="local", run_dir=str(run_dir), status="down"))
    record = RunStore().get("job-1")
    assert record.status == "interrupted" and "when dsctl down removed the run" in record.error
    assert "says its disk was full (No space left on device)" in record.error
