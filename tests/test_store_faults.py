"""Records under faults: runs.db locked past its busy timeout, damaged, or on a full disk; runs whose end was not
recorded. Whatever happens: no traceback, nothing left running, and the run's record ends up correct."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from dsctl.orchestrator import store as store_module
from dsctl.orchestrator.store import RunStore, StoreError
from dsctl.orchestrator.summary import complete_results, results_from_windows, summarize, summarize_run
from dsctl.provisioners import Deployment
from dsctl.specs import load_spec_text, spec_hash
from helpers import dsctl, processes_under, stepped_job, tmpfs, wait_for, write_spec

SPEC = load_spec_text("name: rec\ntrainer: {steps: 100}\npipeline: {builtin: synthetic}\n").spec
GARBAGE = b"this is not an SQLite database, whatever its name says\n" * 20


def make_run(store: RunStore, run_id: str = "rec-1", run_dir: Path | None = None) -> None:
    store.create_run(id=run_id, name="rec", provider="local", mode="service", status="running",
                     spec_json=SPEC.model_dump_json(), spec_hash=spec_hash(SPEC), workers=1, trainers=1,
                     run_dir=str(run_dir) if run_dir else None)


def window(trainer: int, t_start: float, t_end: float, batches: int, wait: float, step: float, warmup: bool = False):
    return {"trainer": trainer, "t_start": t_start, "t_end": t_end, "batches": batches, "input_wait_s": wait,
            "step_s": step, "warmup": warmup, "batches_per_s": batches / (t_end - t_start)}


@contextmanager
def exclusive(db: Path):
    """Another program's write lock on runs.db (BEGIN EXCLUSIVE) until the block ends."""
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        other.execute("COMMIT")
        other.close()


def kept_files(home: Path) -> list[Path]:
    return sorted(home.glob("runs/*/unrecorded*.jsonl"))


def keep(run_dir: Path, name: str, entries: list[dict]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / name
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


def one_paragraph(err: str, kind: str = "error:") -> str:
    """stderr holds one paragraph starting with `kind` and no traceback; that paragraph, flattened."""
    assert "Traceback" not in err, err
    assert err.count(kind) == 1 and err.strip().startswith(kind), err
    return " ".join(err.split())


# -- replaying what was kept in a run dir -------------------------------------------------------------------------

def test_replay_runs_only_the_statements_the_store_defers(home):
    store = RunStore()
    make_run(store)
    store.close()
    path = keep(home / "runs" / "rec-1", "unrecorded-1-1.jsonl", [
        {"sql": "UPDATE runs SET status = ?, error = ? WHERE id = ?", "rows": [["failed", "kept", "rec-1"]]},
        {"sql": "INSERT INTO windows (run_id, trainer, t_start, t_end, batches) VALUES (?, ?, ?, ?, ?)",
         "rows": [["rec-1", 0, 0.0, 1.0, 7]]},
        {"sql": "DELETE FROM runs WHERE id = ?", "rows": [["rec-1"]]},
        {"sql": "DROP TABLE windows", "rows": [[]]},
        {"sql": "INSERT INTO runs (id) VALUES (?)", "rows": [["intruder"]]},
    ])
    store = RunStore()
    assert (store.get("rec-1").status, store.get("rec-1").error) == ("failed", "kept")
    assert [w["batches"] for w in store.windows("rec-1")] == [7]
    assert store.ids() == ["rec-1"], "nothing but the deferred statements ran"
    assert not path.exists(), "a file written whole is removed"




def test_a_kept_file_goes_only_when_all_of_it_is_written(home, monkeypatch, notices):
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.2)
    make_run(RunStore())
    good = {"sql": "UPDATE runs SET status = ? WHERE id = ?", "rows": [["succeeded", "rec-1"]]}
    path = keep(home / "runs" / "rec-1", "unrecorded-1-1.jsonl", [good])
    with exclusive(home / "runs.db"):
        RunStore()  # the database is locked: the file waits for the next command, silently
    assert path.exists() and notices == []
    assert status_of("rec-1") == "succeeded" and not path.exists()

    # A statement that fails takes the ones before it back with it: the file stays, and the user is told.
    bad = {"sql": "INSERT INTO windows (run_id, trainer) VALUES (?, ?)", "rows": [["rec-1", 0, "one too many"]]}
    path = keep(home / "runs" / "rec-1", "unrecorded-2-1.jsonl",
                [{"sql": "UPDATE runs SET status = ? WHERE id = ?", "rows": [["failed", "rec-1"]]}, bad])
    assert status_of("rec-1") == "succeeded" and path.exists()
    assert len(notices) == 1 and str(path) in notices[0]


def status_of(run_id: str) -> str:
    return RunStore().get(run_id).status


def test_a_kept_file_is_written_once_though_two_commands_see_it(home):
    make_run(RunStore())
    entry = {"sql": "INSERT INTO windows (run_id, trainer, t_start, t_end, batches) VALUES (?, ?, ?, ?, ?)",
             "rows": [["rec-1", 0, 0.0, 1.0, 7]]}
    path = keep(home / "runs" / "rec-1", "unrecorded-1-1.jsonl", [entry])
    RunStore()
    keep(home / "runs" / "rec-1", path.name, [entry])  # what a second command read before the first removed it
    store = RunStore()
    assert [w["batches"] for w in store.windows("rec-1")] == [7]
    assert not path.exists()


def test_what_a_locked_database_defers_is_read_back_and_kept_whole(home, monkeypatch):
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.2)
    store = RunStore()
    run_dir = home / "runs" / "rec-1"
    run_dir.mkdir(parents=True)
    make_run(store, run_dir=run_dir)
    with exclusive(home / "runs.db"):
        store.add_window("rec-1", window(0, 0.0, 1.0, 10, 0.1, 0.9), workers=1)
        store.update_run("rec-1", status="succeeded")
        assert store.pending == 2
        assert [w["batches"] for w in store.windows("rec-1")] == [10], "the run's own reads count the backlog"
        kept = store.keep_unwritten(run_dir, wait_s=0.5)
    assert kept is not None and kept_files(home) == [kept] and not list(run_dir.glob("*.tmp"))
    fresh = RunStore()
    assert fresh.get("rec-1").status == "succeeded" and len(fresh.windows("rec-1")) == 1
    assert kept_files(home) == []


def test_a_run_that_cannot_be_recorded_does_not_start(home, monkeypatch):
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.2)
    store = RunStore()
    with exclusive(home / "runs.db"), pytest.raises(StoreError) as caught:
        make_run(store)
    assert str(home / "runs.db") in str(caught.value) and "nothing was started" in str(caught.value)
    assert "close that and run the command again" in str(caught.value)


# -- a damaged runs.db ----------------------------------------------------------------------------------------------

def corrupt_files(home: Path) -> list[Path]:
    return sorted(p for p in home.glob("runs.db.corrupt-*") if not p.name.endswith(("-wal", "-shm")))


def test_a_file_that_is_not_a_database_is_moved_aside_and_a_new_one_started(home, notices):
    (home / "runs.db").write_bytes(GARBAGE)
    (home / "runs.db-wal").write_bytes(b"stale")
    store = RunStore()
    make_run(store)
    assert store.ids() == ["rec-1"]
    [aside] = corrupt_files(home)
    assert aside.read_bytes() == GARBAGE and Path(f"{aside}-wal").read_bytes() == b"stale", "kept, never deleted"
    assert len(notices) == 1 and str(aside) in notices[0] and ".dump --data-only" in notices[0]
    store.close()
    (home / "runs.db").write_bytes(GARBAGE)
    RunStore()
    assert len(corrupt_files(home)) == 2, "a second damaged file in the same second does not replace the first"


def test_a_page_found_damaged_in_use_moves_the_file_aside_and_stops(home):
    store = RunStore()
    make_run(store)
    store.add_window("rec-1", window(0, 0.0, 1.0, 10, 0.1, 0.9), workers=1)
    store.close()  # the last connection: everything is in runs.db itself
    with closing(sqlite3.connect(home / "runs.db")) as db:
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'windows'").fetchone()[0]
        size = db.execute("PRAGMA page_size").fetchone()[0]
    with open(home / "runs.db", "r+b") as f:  # the windows table's page, overwritten
        f.seek((root - 1) * size)
        f.write(b"\xff" * size)
    store = RunStore()  # the schema is intact: this opens
    with pytest.raises(StoreError) as caught:
        store.windows("rec-1")
    [aside] = corrupt_files(home)
    assert str(aside) in str(caught.value) and not (home / "runs.db").exists()
    assert RunStore().ids() == [], "the next command starts a new one"


@pytest.mark.skipif(not shutil.which("sqlite3"), reason="the sqlite3 shell is not installed (dsctl does not need it)")
@pytest.mark.integration  # dsctl (or sqlite3) as a subprocess
def test_the_recovery_the_notice_gives_copies_what_sqlite_can_still_read(home, notices):
    store = RunStore()
    make_run(store)
    store.add_event("rec-1", "ready", "dispatcher and 1 worker(s) ready")
    store.close()
    with open(home / "runs.db", "r+b") as f:  # cut short, as by a crash while copying it
        f.truncate(f.seek(0, os.SEEK_END) // 2)
    make_run(RunStore(), "after-1")
    [notice] = notices
    command = notice.split("still read: ", 1)[1]
    subprocess.run(command, shell=True, check=True, capture_output=True)
    assert sorted(RunStore().ids()) == ["after-1", "rec-1"], "the new run kept, the old one copied back"


@pytest.mark.parametrize("command", [["runs"], ["runs", "show", "rec-1"], ["cost", "report", "--all"],
                                     ["logs", "rec-1"], ["down", "gone-1"]])
@pytest.mark.integration  # dsctl (or sqlite3) as a subprocess
def test_every_records_command_on_a_damaged_runs_db_says_so_in_one_paragraph(home, command):
    # A deployment whose processes are gone, for `down` to take down and then record.
    (home / "runs" / "gone-1").mkdir(parents=True)
    Deployment(run_id="gone-1", provider="local", run_dir=str(home / "runs" / "gone-1"), status="up").save()
    (home / "runs.db").write_bytes(GARBAGE)
    proc = dsctl(*command)
    assert proc.returncode in (0, 2), proc.stderr  # 2: the run asked for is not in the new, empty one
    warning = one_paragraph(proc.stderr.split("error:")[0], "warning:")
    [aside] = corrupt_files(home)
    assert aside.read_bytes() == GARBAGE
    assert str(aside) in warning and f"sqlite3 {aside} '.dump --data-only' | sqlite3 {home / 'runs.db'}" in warning


@pytest.mark.integration  # dsctl (or sqlite3) as a subprocess
def test_status_reads_no_records_and_leaves_a_damaged_runs_db_alone(home):
    (home / "runs.db").write_bytes(GARBAGE)
    proc = dsctl("status")
    assert proc.returncode == 0 and proc.stderr == "" and "nothing is up" in proc.stdout
    assert (home / "runs.db").read_bytes() == GARBAGE


@pytest.mark.integration  # dsctl (or sqlite3) as a subprocess
def test_up_with_its_records_locked_says_so_and_starts_nothing(home, tmp_path):
    spec = write_spec(tmp_path, """
        name: locked
        service: {workers: 1}
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
    """)
    RunStore().close()
    with exclusive(home / "runs.db"):
        proc = dsctl("up", spec)
    assert proc.returncode == 1
    message = one_paragraph(proc.stderr)
    assert str(home / "runs.db") in message and "nothing was started" in message and "lock" in message
    assert processes_under(home) == [] and not list(home.glob("runs/*/state.json"))


# -- summaries rebuilt from stored windows ---------------------------------------------------------------------------

WINDOWS = [
    window(0, 0.0, 2.0, 2, 1.5, 0.5, warmup=True),  # slow warm-up: counted as batches, not in the rate or the stall
    window(0, 2.0, 4.0, 40, 0.4, 1.6),
    window(0, 4.0, 5.0, 30, 0.2, 0.8),
    window(1, 0.0, 1.0, 1, 0.9, 0.1, warmup=True),
    window(1, 1.0, 3.0, 20, 1.0, 1.0),
]


def test_results_from_windows_count_every_batch_and_measure_after_warm_up():
    r = results_from_windows(WINDOWS)
    assert (r[0]["batches"], r[0]["measured_batches"], r[0]["measured_s"]) == (72, 70, 3.0)
    assert r[0]["batches_per_s"] == pytest.approx(70 / 3.0)
    assert (r[0]["input_wait_s"], r[0]["step_s"]) == (pytest.approx(0.6), pytest.approx(2.4))
    assert (r[1]["batches"], r[1]["batches_per_s"]) == (21, pytest.approx(10.0))
    assert results_from_windows([window(0, 0.0, 1.0, 3, 0.5, 0.5, warmup=True)])[0]["batches_per_s"] is None


def test_own_end_records_win_and_missing_or_partial_ones_are_rebuilt():
    own = {"batches": 80, "batches_per_s": 25.0, "input_wait_s": 1.0, "step_s": 3.0}
    results, rebuilt = complete_results({0: own, 1: {"batches": 21, "batches_per_s": 5.0, "partial": True}}, WINDOWS)
    assert rebuilt and results[0] is own and results[1]["batches_per_s"] == pytest.approx(10.0)
    assert complete_results({0: own}, []) == ({0: own}, False)
    partial = {"batches": 3, "partial": True}
    assert complete_results({2: partial}, WINDOWS)[0][2] is partial, "kept when it has no windows to rebuild from"


def test_a_rebuilt_summary_says_so_and_a_whole_one_does_not():
    s = summarize_run({}, WINDOWS, [], started_at=100.0, ended_at=110.0)
    assert s["summary_source"] == "windows"
    assert s["batches"] == 93
    assert s["batches_per_s"] == pytest.approx((70 / 3.0 + 10.0) / 2)
    assert s["input_stall_frac"] == pytest.approx((0.6 + 1.0) / (0.6 + 1.0 + 2.4 + 1.0))
    whole = {0: {"batches": 72, "batches_per_s": 20.0, "input_wait_s": 1.0, "step_s": 3.0}}
    assert summarize_run(whole, WINDOWS[:3], [], 100.0, 110.0) == summarize(whole, [], 100.0, 110.0, None)


# -- real runs ---------------------------------------------------------------------------------------------------------

STEPS = 600


def short_job(tmp_path: Path, steps: int = STEPS, step_time_ms: int = 20) -> Path:
    return stepped_job(tmp_path, "faults", steps, step_time_ms)


def start_up(spec: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", str(spec), "--json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def first_window_stored(home: Path, timeout: float = 180) -> Path:
    """The run dir of the run that has stored its first metrics window."""
    def stored():
        try:
            with closing(sqlite3.connect(f"file:{home / 'runs.db'}?mode=ro", uri=True)) as db:
                row = db.execute("SELECT run_id FROM windows LIMIT 1").fetchone()
        except sqlite3.Error:
            return None
        return home / "runs" / row[0] if row else None
    return wait_for(stored, timeout=timeout, what="the run's first window in runs.db")


def metrics(run_dir: Path, event: str) -> list[dict]:
    """The trainer's records of one kind; a last line cut short (a full disk) is not one."""
    lines = (run_dir / "metrics" / "trainer-0.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, (line for line in lines if line.endswith("}"))) if r.get("event") == event]


def state(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "state.json").read_text())["status"]
    except (OSError, ValueError):
        return None


def assert_recorded_whole(run_dir: Path) -> None:
    """Succeeded, with every batch and every window the trainer wrote, its summary made from every sample stored."""
    store = RunStore()
    record, windows = store.get(run_dir.name), store.windows(run_dir.name)
    assert (record.status, record.error) == ("succeeded", None)
    assert record.summary["batches"] == STEPS and sum(w["batches"] for w in windows) == STEPS
    assert len(windows) == len(metrics(run_dir, "window"))
    expected = summarize(store.trainer_results(record.id), store.utilization(record.id), record.created_at,
                         record.ended_at, metrics(run_dir, "first_batch")[0]["wall"],
                         metrics(run_dir, "measure_start")[0]["wall"])
    for key in ("trainer_cpu_seconds", "worker_cpu_seconds", "trainer_cpu_cores"):
        assert record.summary[key] == pytest.approx(expected[key]), key
    assert kept_files(run_dir.parent.parent) == []


@pytest.mark.slow
def test_a_lock_longer_than_the_busy_timeout_over_the_runs_end_delays_its_record_only(home, tmp_path):
    up = start_up(short_job(tmp_path))
    run_dir = first_window_stored(home)
    with exclusive(home / "runs.db"):
        wait_for(lambda: state(run_dir) == "down", timeout=300, what="the teardown")
        # Its end is recorded now: held past two busy timeouts (the teardown's event, then the summary's reads),
        # so the summary is made while the samples of the run's measured part still wait in the backlog.
        time.sleep(3 * store_module.BUSY_TIMEOUT_S)
    out, err = up.communicate(timeout=120)
    assert up.returncode == 0 and "Traceback" not in err, err
    assert json.loads(out)["status"] == "succeeded"
    assert processes_under(home) == []
    assert_recorded_whole(run_dir)


@pytest.mark.slow
def test_a_lock_that_outlasts_the_run_keeps_its_record_for_the_next_command(home, tmp_path):
    up = start_up(short_job(tmp_path))
    run_dir = first_window_stored(home)
    with exclusive(home / "runs.db"):
        out, err = up.communicate(timeout=300)
        assert processes_under(home) == []
    assert up.returncode == 1
    message = one_paragraph(err)
    [kept] = kept_files(home)
    assert "succeeded" in message and str(kept) in message and "the next dsctl command adds it" in message
    listed = json.loads(dsctl("runs", "--json", check=True).stdout)
    assert [(r["id"], r["status"]) for r in listed] == [(run_dir.name, "succeeded")]
    assert_recorded_whole(run_dir)


@pytest.mark.slow
def test_up_on_a_damaged_runs_db_says_so_and_records_the_run_in_a_new_one(home, tmp_path):
    (home / "runs.db").write_bytes(GARBAGE)
    proc = dsctl("up", short_job(tmp_path, steps=100), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["status"] == "succeeded"
    assert str(corrupt_files(home)[0]) in one_paragraph(proc.stderr, "warning:")
    assert [r.id for r in RunStore().list()] == [json.loads(proc.stdout)["id"]]
    assert processes_under(home) == []


def assert_rebuilt_from_windows(run_id: str) -> None:
    """Interrupted, its summary made from its stored windows (warm-up counted in batches only), and shown so."""
    store = RunStore()
    record, windows = store.get(run_id), store.windows(run_id)
    measured = [w for w in windows if not w["warmup"]]
    s = record.summary
    assert record.status == "interrupted" and s["summary_source"] == "windows"
    assert s["batches"] == sum(w["batches"] for w in windows) > 0
    assert s["batches_per_s"] == pytest.approx(sum(w["batches"] for w in measured)
                                               / sum(w["t_end"] - w["t_start"] for w in measured))
    assert 0 < s["input_stall_frac"] < 1 and s["duration_s"] > 0 and "total" in s["cost"]
    shown = " ".join(dsctl("runs", "show", run_id, check=True).stdout.split())
    assert "rebuilt from the run's stored metrics windows" in shown


def long_run(home: Path, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """`dsctl up` of a job that trains until stopped, once a few measured windows are stored."""
    up = start_up(short_job(tmp_path, steps=100000, step_time_ms=5))
    run_dir = first_window_stored(home)
    def windows() -> int:
        with closing(RunStore()) as store:  # closed now: a connection kept open here would change runs.db's files
            return len(store.windows(run_dir.name))
    wait_for(lambda: windows() >= 4, timeout=120, what="a few measured windows")
    return up, run_dir


def assert_closed_from_trainer_files(run_dir: Path) -> None:
    """Closed by `dsctl down` after `dsctl up` was gone: interrupted, summarized from what the trainer wrote itself:
    its own end record when it wrote one (stopped by `down`, it does), else every window in its file."""
    store = RunStore()
    record = store.get(run_dir.name)
    ends, windows = metrics(run_dir, "end"), metrics(run_dir, "window")
    assert record.status == "interrupted" and "dsctl down" in record.error
    assert sum(w["batches"] for w in store.windows(record.id)) == sum(w["batches"] for w in windows) > 0
    shown = " ".join(dsctl("runs", "show", record.id, check=True).stdout.split())
    if ends:
        assert ends[0]["reason"] == "signal" and record.summary["batches"] == ends[0]["batches"]
        assert "summary_source" not in record.summary and "own metrics files" in shown
    else:  # its end record lost (a full disk): its windows, all of them
        assert_rebuilt_from_windows(record.id)


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["ctrl-c", "kill -9, then down"])
def test_a_run_that_ended_before_its_trainers_reported_is_summarized_from_what_they_wrote(home, tmp_path, stop):
    """Ctrl-C: `dsctl up` records the windows it read before its teardown. kill -9: `dsctl down` records what the
    trainer wrote itself, its own end record included (it used to be rebuilt from the
    windows stored before `dsctl up` died)."""
    up, run_dir = long_run(home, tmp_path)
    if stop == "ctrl-c":
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=60)
        assert up.returncode == 130
        assert processes_under(home) == []
        assert_rebuilt_from_windows(run_dir.name)
    else:
        up.kill()
        up.communicate(timeout=30)
        dsctl("down", run_dir.name, check=True)
        assert processes_under(home) == []
        assert_closed_from_trainer_files(run_dir)


@pytest.fixture
def small_disk(home, monkeypatch):
    """DSCTL_HOME on a 2 MB tmpfs of its own, to fill up."""
    with tmpfs(home / "small", "2m") as disk:
        monkeypatch.setenv("DSCTL_HOME", str(disk))
        yield disk


def fill(disk: Path) -> Path:
    """Write a file until the disk has no room left."""
    path = disk / f"filler-{len(list(disk.glob('filler-*')))}"
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return path


def free(disk: Path) -> None:
    for path in disk.glob("filler-*"):
        path.unlink()


@pytest.mark.slow
def test_a_full_disk_stops_nothing_halfway_and_the_run_is_recorded_once_there_is_room(home, small_disk, tmp_path):
    spec = short_job(tmp_path)
    dsctl("runs", check=True)
    fill(small_disk)
    proc = dsctl("up", spec, "--json")  # full before anything starts
    assert proc.returncode == 1 and "free some space" in one_paragraph(proc.stderr)
    assert processes_under(home) == [] and not list(small_disk.glob("runs/*/state.json"))
    free(small_disk)

    up = start_up(spec)
    run_dir = first_window_stored(small_disk)
    fill(small_disk)  # full mid-run
    out, err = up.communicate(timeout=300)
    assert up.returncode == 1
    one_paragraph(err)
    assert processes_under(home) == []

    fill(small_disk)  # whatever the failed run gave back
    proc = dsctl("down", run_dir.name)  # nothing to stop, and no room for its state: said, not failed
    assert proc.returncode == 0 and "free some space" in one_paragraph(proc.stderr, "warning:")
    proc = dsctl("runs")
    assert proc.returncode == 0 or "free some space" in one_paragraph(proc.stderr)

    free(small_disk)
    dsctl("down", run_dir.name, check=True)
    record = RunStore().get(run_dir.name)
    assert record.status == "failed" and "batches" in record.summary
    assert f"the disk holding {small_disk} " in record.error, "a run a full disk ended says so"
    assert kept_files(small_disk) == [] and processes_under(home) == []


@pytest.mark.slow
def test_down_on_a_full_disk_stops_everything_before_it_records(home, small_disk, tmp_path):
    up, run_dir = long_run(small_disk, tmp_path)
    up.kill()
    up.communicate(timeout=30)
    assert processes_under(home), "the deployment outlives a killed dsctl up"
    dsctl("runs", check=True)  # the last connection closes: runs.db alone, which cannot open on a full disk
    fill(small_disk)
    proc = dsctl("down", run_dir.name)
    assert processes_under(home) == []
    assert proc.returncode == 0 and "free some space" in one_paragraph(proc.stderr, "warning:")
    free(small_disk)
    dsctl("down", run_dir.name, check=True)
    assert_closed_from_trainer_files(run_dir)
