"""Records of training runs: loss and model metrics per window, runs linked by --resume, and old runs.db files
gaining the columns that hold them (real SQLite throughout)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from dsctl.orchestrator.store import RunStore
from dsctl.orchestrator.summary import summarize_run
from dsctl.specs import load_spec_text, spec_hash
from helpers import dsctl

SPEC = load_spec_text("""
name: fit
trainer: {machine: n2-standard-8, steps: 300}
pipeline: {builtin: synthetic}
""").spec

# runs.db as dsctl wrote it before loss, metrics, resumed_from and checkpoint_dir existed.
OLD_SCHEMA = """
CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT NOT NULL, kind TEXT NOT NULL DEFAULT 'job', parent_id TEXT,
    provider TEXT NOT NULL, mode TEXT NOT NULL, status TEXT NOT NULL, spec_path TEXT, spec_yaml TEXT,
    spec_json TEXT NOT NULL, spec_hash TEXT NOT NULL, workers INTEGER NOT NULL, trainers INTEGER NOT NULL,
    created_at REAL NOT NULL, ended_at REAL, run_dir TEXT, error TEXT, summary_json TEXT);
CREATE TABLE windows (run_id TEXT NOT NULL, trainer INTEGER NOT NULL, t_start REAL, t_end REAL,
    batches INTEGER, examples INTEGER, batches_per_s REAL, mean_batch_time_s REAL,
    input_wait_s REAL, step_s REAL, tokens INTEGER, padded_tokens INTEGER, warmup INTEGER, workers INTEGER,
    queue_fill REAL);
"""


def new_run(store: RunStore, run_id: str, created_at: float, status: str = "failed", **cols) -> None:
    store.create_run(id=run_id, name="fit", provider="local", mode="service", status=status,
                     spec_json=SPEC.model_dump_json(), spec_hash=spec_hash(SPEC), workers=2, trainers=1,
                     created_at=created_at, **cols)


def window(trainer: int, t: float, loss: float | None, **extra) -> dict:
    return {"trainer": trainer, "t_start": t - 1, "t_end": t, "batches": 10, "batches_per_s": 10.0,
            "input_wait_s": 0.2, "step_s": 0.8, "warmup": False, "loss": loss, **extra}


def test_an_old_runs_db_gains_the_columns_and_keeps_its_runs(tmp_path):
    db = tmp_path / "runs.db"
    old = sqlite3.connect(db)
    old.executescript(OLD_SCHEMA)
    old.execute("INSERT INTO runs (id, name, provider, mode, status, spec_json, spec_hash, workers, trainers, "
                "created_at) VALUES ('old-1', 'fit', 'local', 'service', 'interrupted', ?, 'h', 2, 1, 1.0)",
                (SPEC.model_dump_json(),))
    old.execute("INSERT INTO windows (run_id, trainer, t_start, t_end, batches) VALUES ('old-1', 0, 0, 1, 5)")
    old.commit()
    old.close()

    store = RunStore(db)
    assert store.get("old-1").resumed_from is None and store.get("old-1").status == "interrupted"
    assert store.windows("old-1")[0]["loss"] is None and store.windows("old-1")[0]["metrics"] is None
    # The link and the loss are written into the migrated file, and read back by a new connection.
    new_run(store, "new-1", 2.0, resumed_from="old-1", checkpoint_dir="/ck/new-1")
    store.add_window("new-1", window(0, 3.0, 2.5, metrics={"accuracy": 0.25}), workers=2)
    store.close()
    again = RunStore(db)
    assert again.get("new-1").resumed_from == "old-1"
    assert again.get("new-1").checkpoint_dir == "/ck/new-1"
    assert again.resumed_by("old-1") == ["new-1"]
    w = again.windows("new-1")[0]
    assert (w["loss"], w["metrics"]) == (2.5, {"accuracy": 0.25})
    columns = {r[1] for r in sqlite3.connect(db).execute("PRAGMA table_info(runs)")}
    assert {"resumed_from", "checkpoint_dir"} <= columns


def test_a_chain_of_resumes_is_linked_both_ways(tmp_path):
    store = RunStore(tmp_path / "runs.db")
    new_run(store, "a", 1.0)
    new_run(store, "b", 2.0, resumed_from="a")
    new_run(store, "c", 3.0, resumed_from="b")
    new_run(store, "d", 4.0, resumed_from="a")
    assert store.resumed_by("a") == ["b", "d"]
    assert store.resumed_by("b") == ["c"]
    assert store.resumed_by("c") == []
    assert store.get("c").as_dict()["resumed_from"] == "b"


def test_the_link_survives_copying_a_run_between_stores(tmp_path):
    """A run supervised on the cloud reaches the user's store as a copied row (cloudrecord.py)."""
    vm = RunStore(tmp_path / "vm.db")
    new_run(vm, "b", 2.0, resumed_from="a", checkpoint_dir="gs://bkt/ck/b")
    here = RunStore(tmp_path / "here.db")
    here.put_run_row(vm.run_row("b"))
    here.flush()
    assert (here.get("b").resumed_from, here.get("b").checkpoint_dir) == ("a", "gs://bkt/ck/b")


def test_loss_first_and_last_are_the_first_and_last_windows_with_a_loss(tmp_path):
    windows = [window(0, 1.0, None), window(0, 2.0, 2.0), window(1, 2.5, 3.0), window(0, 3.0, 1.5),
               window(1, 3.5, 1.0), window(0, 4.0, 0.5)]
    s = summarize_run({}, windows, [], 0.0, 5.0)
    assert s["loss_first"] == (2.0 + 3.0) / 2  # mean over trainers of each one's first
    assert s["loss_last"] == (0.5 + 1.0) / 2
    assert "loss_first" not in summarize_run({}, [window(0, 1.0, None)], [], 0.0, 5.0)


@pytest.mark.integration  # dsctl as a subprocess
def test_runs_show_links_the_runs_and_shows_the_loss(home):
    store = RunStore()
    new_run(store, "first-run", 1.0, checkpoint_dir="/ck/first-run")
    store.update_run("first-run", summary={"batches": 100, "checkpoint_step": 100, "loss_first": 2.31,
                                           "loss_last": 1.2})
    new_run(store, "second-run", 2.0, status="succeeded", resumed_from="first-run", checkpoint_dir="/ck/second-run")
    store.update_run("second-run", summary={"batches": 200, "restored_step": 100, "loss_first": 1.19,
                                            "loss_last": 0.5})
    store.close()

    out = dsctl("runs", "show", "second-run", check=True).stdout
    assert "resumed from" in out and "first-run at step 100" in out
    assert "1.19 in the first window, 0.5 in the last" in out
    out = dsctl("runs", "show", "first-run", check=True).stdout
    assert "resumed by" in out and "second-run" in out
    assert "/ck/first-run/trainer-<i>; last saved at step 100" in out
    data = json.loads(dsctl("runs", "show", "first-run", "--json", check=True).stdout)
    assert data["resumed_by"] == ["second-run"] and data["resumed_from"] is None
    data = json.loads(dsctl("runs", "show", "second-run", "--json", check=True).stdout)
    assert data["resumed_from"] == "first-run" and data["summary"]["restored_step"] == 100
    assert data["summary"]["loss_last"] == 0.5
