"""Run records: the SQLite store, following metrics files, summaries and pricing a recorded run."""

from __future__ import annotations

import json
import sqlite3

import pytest

from dsctl.orchestrator.pricing import price_record, usage_from_record
from dsctl.orchestrator.store import RunStore
from dsctl.orchestrator.summary import results_from_windows, summarize
from dsctl.orchestrator.tail import JsonlTail
from dsctl.specs import load_spec_text, spec_hash
from helpers import dsctl

SPEC = load_spec_text("""
name: rec
service: {workers: 4, worker_machine: n2-standard-8, dispatcher_machine: n2-standard-8, provisioning: spot}
trainer: {machine: tpu-v2-8, steps: 100}
pipeline: {builtin: synthetic}
pricing: paper-2023-06   # the paper's prices: n2 VMs at its $0.08/h Spot price
""").spec


def make_run(store: RunStore, run_id: str = "rec-1", summary: dict | None = None, mode: str = "service") -> None:
    store.create_run(id=run_id, name="rec", provider="local", mode=mode, status="running", spec_json=SPEC.model_dump_json(),
                     spec_hash=spec_hash(SPEC), workers=4 if mode == "service" else 0, trainers=1, created_at=1000.0)
    if summary is not None:
        store.update_run(run_id, status="succeeded", ended_at=1000.0 + summary["duration_s"], summary=summary)


def test_tail_returns_only_complete_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    assert list(tail.read()) == []
    with open(path, "w") as f:
        f.write('{"a": 1}\n{"b":')
        f.flush()
        assert list(tail.read()) == [{"a": 1}]
        f.write(' 2}\n')
        f.flush()
        assert list(tail.read()) == [{"b": 2}]
    assert list(tail.read()) == []


def test_tail_keeps_the_records_a_stopped_reader_had_not_taken(tmp_path):
    """A signal while the run records one window of a read (its handler raises in the loop): the windows after it,
    already read from the file, come with the next read, the one teardown makes, instead of being lost."""
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"window": i}) + "\n" for i in range(4)))
    tail, taken = JsonlTail(path), []
    with pytest.raises(KeyboardInterrupt):
        for rec in tail.read():
            taken.append(rec["window"])
            if rec["window"] == 1:
                raise KeyboardInterrupt
    assert taken == [0, 1]
    assert [rec["window"] for rec in tail.read()] == [2, 3]  # the one being recorded when stopped is not given twice
    assert list(tail.read()) == []


def test_store_keeps_what_was_written_before_a_crash(tmp_path):
    db = tmp_path / "runs.db"
    store = RunStore(db)
    make_run(store)
    store.add_window("rec-1", {"trainer": 0, "t_start": 0, "t_end": 1, "batches": 10, "batches_per_s": 10.0,
                               "input_wait_s": 0.5, "step_s": 0.5, "warmup": False}, workers=4)
    store.add_event("rec-1", "worker-restarted", "worker 1 exited")
    # No close(): another connection (a new process after kill -9) sees every row.
    other = sqlite3.connect(db)
    assert other.execute("SELECT batches FROM windows").fetchall() == [(10,)]
    assert other.execute("SELECT status FROM runs").fetchall() == [("running",)]
    assert RunStore(db).events("rec-1")[0]["kind"] == "worker-restarted"


def test_prefix_lookup_is_unique_or_nothing(tmp_path):
    store = RunStore(tmp_path / "r.db")
    make_run(store, "job-a1")
    make_run(store, "job-a2")
    assert store.get("job-a1").id == "job-a1"
    assert store.get("job-a") is None
    assert store.get("job-a2").id == "job-a2"


def test_summary_combines_trainers_and_processes():
    results = {
        0: {"batches": 100, "batches_per_s": 10.0, "input_wait_s": 3.0, "step_s": 7.0, "tokens": 0, "padded_tokens": 0},
        1: {"batches": 50, "batches_per_s": 6.0, "input_wait_s": 1.0, "step_s": 9.0, "tokens": 0, "padded_tokens": 0},
    }
    util = [
        {"role": "worker", "idx": 0, "cpu_cores": 1.0, "rss_bytes": 2**30, "cpu_seconds": 10.0},
        {"role": "worker", "idx": 0, "cpu_cores": 0.5, "rss_bytes": 2**30, "cpu_seconds": 16.0},
        {"role": "worker", "idx": 1, "cpu_cores": 0.25, "rss_bytes": 3 * 2**30, "cpu_seconds": 1.0},
        {"role": "worker", "idx": 1, "cpu_cores": 0.25, "rss_bytes": 3 * 2**30, "cpu_seconds": 4.0},
    ]
    s = summarize(results, util, started_at=100.0, ended_at=130.0, first_batch_wall=109.0)
    assert s["batches"] == 150
    assert s["batches_per_s"] == pytest.approx(8.0)
    assert s["total_batches_per_s"] == pytest.approx(16.0)
    assert s["input_stall_frac"] == pytest.approx(4 / 20)
    assert s["duration_s"] == 30 and s["time_to_first_batch_s"] == 9
    assert s["worker_cpu_cores"] == pytest.approx((0.75 + 0.25) / 2)
    assert s["worker_mem_gb"] == pytest.approx(2.0)
    assert s["worker_cpu_seconds"] == pytest.approx(6 + 3)
    assert s["worker_cpu_seconds_per_batch"] == pytest.approx(9 / 150)


def test_the_models_step_per_batch_is_the_batch_time_less_the_input_wait_over_measured_batches():
    """A local worker that takes the model's CPU lengthens this, where the batch time alone could be the input's.
    Trainer 0: 100 measured batches (of 120) in 1 s waiting and 2 s stepping; trainer 1: 50 in 0.5 s and 1.5 s."""
    results = {
        0: {"batches": 120, "measured_batches": 100, "batches_per_s": 30.0, "input_wait_s": 1.0, "step_s": 2.0},
        1: {"batches": 60, "measured_batches": 50, "batches_per_s": 20.0, "input_wait_s": 0.5, "step_s": 1.5},
    }
    s = summarize(results, [], started_at=0.0, ended_at=10.0, first_batch_wall=None)
    assert s.model_step_s == pytest.approx(3.5 / 150)  # not per batch read (180), not with the wait (5.0 / 150)
    rebuilt = results_from_windows([
        {"trainer": 0, "t_start": 0.0, "t_end": 1.0, "batches": 5, "warmup": True, "input_wait_s": 0.9, "step_s": 0.1},
        {"trainer": 0, "t_start": 1.0, "t_end": 3.0, "batches": 40, "input_wait_s": 0.4, "step_s": 1.6},
    ])
    s = summarize(rebuilt, [], started_at=0.0, ended_at=3.0, first_batch_wall=None)
    assert s.model_step_s == pytest.approx(1.6 / 40)  # the warm-up window left out, as from an end record
    assert summarize({0: {"batches": 0}}, [], 0.0, 1.0, None).model_step_s is None


def test_a_recorded_run_is_priced_as_its_spec_machines_on_measured_use(tmp_path):
    store = RunStore(tmp_path / "r.db")
    make_run(store, summary={"duration_s": 3600.0, "batches": 1000, "worker_cpu_cores": 2.0, "worker_mem_gb": 4.0,
                             "dispatcher_cpu_cores": 0.5, "dispatcher_mem_gb": 1.0})
    record = store.get("rec-1")
    usage = usage_from_record(record)
    assert (usage.n_workers, usage.worker_machine, usage.trainer_machine) == (4, "n2-standard-8", "tpu-v2-8")
    _, cost, catalog = price_record(record)
    rates = catalog.unit_rates("n2-standard-8", provisioning="spot")
    # One hour: workers on what they used (4 x (2 cores, 4 GB)), the TPU VM whole ($4.50/h in the paper's catalog).
    assert cost.workers == pytest.approx(4 * (2.0 * rates.cpu + 4.0 * rates.mem))
    assert cost.dispatcher == pytest.approx(0.5 * rates.cpu + 1.0 * rates.mem)
    assert cost.trainers == pytest.approx(4.50)
    assert any("local run" in n for n in cost.notes)
    vm = price_record(record, basis="vm-hours")[1]
    assert vm.service == pytest.approx(5 * 0.08)


@pytest.mark.integration  # dsctl as a subprocess
def test_cost_report_json_and_csv_agree_and_baseline_gives_speedup(home):
    store = RunStore()
    make_run(store, "svc", summary={"duration_s": 1800.0, "batches": 1000, "worker_cpu_cores": 1.0, "worker_mem_gb": 1.0,
                                    "dispatcher_cpu_cores": 0.1, "dispatcher_mem_gb": 0.5})
    make_run(store, "colo", summary={"duration_s": 3600.0, "batches": 1000}, mode="colocated")
    as_json = json.loads(dsctl("cost", "report", "svc", "--baseline", "colo", "--format", "json", check=True).stdout)
    assert as_json[0]["speedup"] == pytest.approx(2.0)
    assert as_json[0]["cost_saving"] > 1.0
    lines = dsctl("cost", "report", "svc", "--baseline", "colo", "--format", "csv", check=True).stdout.splitlines()
    import csv

    row = next(csv.DictReader(lines))
    for key in ("total", "workers", "dispatcher", "accelerators", "per_1000_batches", "speedup", "cost_saving"):
        assert float(row[key]) == as_json[0][key]
    assert dsctl("cost", "report", "--since", "yesterday").returncode == 2


CACHED = load_spec_text("""
name: rec
service: {workers: 1, processing_mode: parallel_epochs}
trainer: {steps: 100}
pipeline: {builtin: synthetic, params: {epochs: null}}
autocache: {mode: full, cache_dir: "gs://bkt/ac"}
pricing: gcp-us-central1-2025
""").spec


@pytest.mark.integration  # dsctl as a subprocess
def test_cost_report_prices_a_runs_cache_by_the_month_apart_from_the_total(home):
    """50 GB sealed on Cloud Storage at the catalog's $0.020/GB-month: $1.00 a month, $0.01 over the job's
    7.3 h (a month is 730 h); the total is the same as the same run's without a cache."""
    store = RunStore()
    base = {"duration_s": 7.3 * 3600, "batches": 1000, "worker_cpu_cores": 1.0, "worker_mem_gb": 1.0}
    cache = {"hint": "full", "path": "gs://bkt/ac/full-0123", "state": "put", "bytes": 50e9, "storage_kind": "gcs"}
    runs = {"cached": {**base, "autocache": {"choice": "full", "cache": {**cache, "sealed": True}}},
            "unsealed": {**base, "autocache": {"choice": "full", "cache": {**cache, "sealed": False, "bytes": None}}},
            "plain": base}
    for run_id, summary in runs.items():
        store.create_run(id=run_id, name="rec", provider="local", mode="service", status="running",
                         spec_json=CACHED.model_dump_json(), spec_hash=spec_hash(CACHED), workers=1, trainers=1,
                         created_at=1000.0)
        store.update_run(run_id, status="succeeded", ended_at=1000.0 + base["duration_s"], summary=summary)

    rows = {r["label"]: r for r in json.loads(dsctl("cost", "report", *runs, "--format", "json", check=True).stdout)}
    assert rows["cached"]["cache_storage_kind"] == "gcs" and rows["cached"]["cache_gb"] == pytest.approx(50.0)
    assert rows["cached"]["cache_per_month"] == pytest.approx(1.00)
    assert rows["cached"]["cache_during_job"] == pytest.approx(0.01)
    assert rows["cached"]["total"] == pytest.approx(rows["plain"]["total"])  # Equation 1's total is the machines
    assert any("billed by the month" in n for n in rows["cached"]["notes"])
    for other in ("unsealed", "plain"):  # an unsealed put is nothing to keep; no cache, no cache columns
        assert rows[other]["cache_gb"] is None and rows[other]["cache_per_month"] is None

    import csv

    by_label = {r["label"]: r for r in csv.DictReader(dsctl("cost", "report", *runs, "--format", "csv",
                                                            check=True).stdout.splitlines())}
    assert float(by_label["cached"]["cache_per_month"]) == pytest.approx(1.00) and by_label["plain"]["cache_gb"] == ""
    table = " ".join(dsctl("cost", "report", "cached", check=True).stdout.split())
    assert "50 GB on gcs (written by this run, gs://bkt/ac/full-0123); $1.00 per month while kept" in table
    # A catalog without storage prices says so instead of guessing.
    import yaml

    from dsctl.costmodel import load_catalog

    data = yaml.safe_load(open(load_catalog("gcp-us-central1-2025").path).read())
    del data["storage"]
    no_storage = home.parent / "no-storage.yaml"
    no_storage.write_text(yaml.safe_dump({**data, "name": "no-storage"}))
    table = " ".join(dsctl("cost", "report", "cached", "--prices", no_storage, check=True).stdout.split())
    assert "not priced: no-storage has no gcs storage price" in table


# -- typed records: one definition for the store, the CLI and --json; old records load as they were written ----------

def test_a_summary_written_by_an_older_dsctl_loads_typed_and_is_written_back_as_it_was(home):
    """A record of before the typed summary (some fields, a cost whose additions were not kept yet, a key this dsctl
    no longer writes) loads with its fields typed; what it does not hold stays unset, and its JSON is the JSON it had,
    the unknown key included."""
    from dsctl.orchestrator.records import CostSummary, RunSummary

    old = {"batches": 300, "batches_per_s": 12.5, "duration_s": 30.0, "input_stall_frac": 0.25,
           "worker_cpu_cores": 0.5, "worker_mem_gb": 0.3, "loss_first": 2.0, "loss_last": 0.5,
           "loss_nonfinite": {"trainer": 1, "value": "inf", "batches": 40},
           "cost": {"total": 0.01, "basis": "utilization", "catalog": "paper-2023-06", "note": "list prices"},
           "autocache": {"choice": "full", "reason": "cache hit", "hits": ["full"]},  # as caching.py records a hit
           "queue_fill_mean": 3.5}  # a key of another version
    store = RunStore()
    make_run(store, summary=old)
    record = store.get("rec-1")
    s = record.summary
    assert isinstance(s, RunSummary) and isinstance(s.cost, CostSummary)
    assert (s.batches, s.batches_per_s, s.cost.total, s.loss_nonfinite.batches) == (300, 12.5, 0.01, 40)
    assert s.autocache.hits == ["full"]
    assert s.epochs is None and "epochs" not in s and s.cost.created is None
    assert s.as_json() == old  # unset fields stay out, the unknown key stays in
    assert record.as_dict()["summary"] == old
    assert s["queue_fill_mean"] == 3.5 and s.get("epochs") is None  # read as its JSON, for scripts
    with pytest.raises(KeyError):
        s["epochs"]
    # Written back, nothing is lost or added.
    store.update_run("rec-1", summary=s.updated(recorded_by="dsctl down"))
    assert json.loads(sqlite3.connect(home / "runs.db").execute("SELECT summary_json FROM runs").fetchone()[0]) == {
        **old, "recorded_by": "dsctl down"}


def test_a_sweep_record_and_a_cloud_record_load_typed():
    """A sweep's summary (points, baselines, its recommendation) and a supervisor's latest.json, as they were
    written, read as the typed records the CLI renders."""
    from dsctl.orchestrator.records import CloudLatest, RunRecord, SweepSummary

    row = {"id": "s-1", "name": "s", "kind": "sweep", "parent_id": None, "provider": "local", "mode": "service",
           "status": "succeeded", "spec_path": None, "spec_yaml": None, "spec_json": SPEC.model_dump_json(),
           "spec_hash": "h", "workers": 4, "trainers": 1, "created_at": 1.0, "ended_at": 2.0, "run_dir": None,
           "error": None, "resumed_from": None, "checkpoint_dir": None, "a_column_of_later": 1,
           "summary_json": json.dumps({"counts": [1, 2], "points": [{"workers": 1, "batches_per_s": 1.5,
                                                                     "predicted": False, "source": "measured here"}],
                                       "baselines": {"ideal": {"batches_per_s": 2.0}},
                                       "recommendation": {"smallest": {"workers": 1, "batches_per_s": 1.5,
                                                                       "cost_per_1000_batches": None,
                                                                       "predicted": False, "reason": "the best"},
                                                          "cheapest": None, "best_bps": 1.5, "best_workers": 1,
                                                          "best_predicted": False, "tolerance": 0.03}})}
    record = RunRecord.from_row(row)
    assert isinstance(record.summary, SweepSummary) and record.sweep.points[0].batches_per_s == 1.5
    assert record.sweep.baselines["ideal"].batches_per_s == 2.0 and record.sweep.recommendation.smallest.workers == 1
    assert record.job.batches is None  # a sweep has no job summary of its own
    latest = CloudLatest.model_validate({"run": {**row, "status": "running"}, "progress": {"phase": "training",
                                                                                         "batches": 40},
                                         "parts": 2, "written_at": 5.0,
                                         "events": [{"run_id": "s-1", "t": 3.0, "kind": "ready", "message": "up"}]})
    assert not latest.ended and latest.progress.batches == 40 and latest.events[0].key == (3.0, "ready", "up")
    assert latest.record.id == "s-1" and CloudLatest.model_validate({}).status is None
