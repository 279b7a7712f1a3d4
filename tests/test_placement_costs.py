"""Hybrid placement in the cost model and the run record (unit): local workers run on the trainer hosts Equation 1
already charges, so they add no dollars; the pipeline's cost is shown split into remote and local preprocessing, the
local part as the in-process workers' CPU share of the trainer host, from CPU estimated out of the batches each kind
of worker produced."""

from __future__ import annotations

import math

import pytest

from dsctl.cli.cost import _display
from dsctl.costmodel import RunUsage, load_catalog, price
from dsctl.costmodel.estimate import usage_from_spec
from dsctl.orchestrator.costs import cost_row
from dsctl.orchestrator.placements import ESTIMATED, placement_fields
from dsctl.orchestrator.records import RunSummary
from dsctl.specs import load_spec

HOUR = 3600.0


@pytest.fixture(scope="module")
def gcp():
    return load_catalog("gcp-us-central1-2025")


def usage(local: int = 0, local_cores: float | None = None, **kw) -> RunUsage:
    base = dict(job_time_s=2 * HOUR, batches=72_000, n_trainers=2, trainer_machine="n2-standard-16", n_workers=3,
                worker_machine="n2-standard-8", worker_avg_cpu_cores=5.0, worker_avg_mem_gb=3.0,
                dispatcher_machine="n2-standard-8", dispatcher_avg_cpu_cores=0.2, dispatcher_avg_mem_gb=0.5,
                local_workers=local, local_cpu_cores=local_cores,
                local_cpu_source="estimated: test" if local else None)
    return RunUsage(**{**base, **kw})


@pytest.mark.parametrize("basis", ["utilization", "vm-hours"])
def test_local_workers_add_no_dollars_and_are_never_priced_as_remote_workers(gcp, basis):
    """Counting each trainer's local workers as remote ones (n_workers + local x trainers) would raise the workers'
    cost and the total: both must equal the remote-only run's, with the same remote count and time."""
    remote_only = price(usage(), gcp, basis)
    hybrid = price(usage(local=4, local_cores=2.5), gcp, basis)
    assert hybrid.workers == remote_only.workers and hybrid.dispatcher == remote_only.dispatcher
    assert hybrid.total == remote_only.total and hybrid.trainers == remote_only.trainers
    assert hybrid.remote_preprocessing == remote_only.service == hybrid.workers + hybrid.dispatcher
    assert remote_only.local_preprocessing is None and remote_only.local_cpu_source is None
    assert hybrid.local_cpu_source == "estimated: test"


def test_utilization_basis_charges_local_workers_their_cpu_share_of_the_trainer_host(gcp):
    """The local part is vCPUs busy x hours x trainers x the trainer machine's price per vCPU-hour (the catalog's),
    and lies inside trainer_cpu."""
    b = price(usage(local=4, local_cores=2.5), gcp, "utilization")
    split, shape = gcp.split("n2-standard-16"), gcp.machine("n2-standard-16")
    expected = 2.0 * 2 * 2.5 * split.cpu / shape.vcpus
    assert math.isclose(b.local_preprocessing, expected, rel_tol=1e-12) and 0 < expected < b.trainer_cpu
    assert any("add nothing to the total" in n and "2.5 vCPUs per trainer, is estimated: test" in n for n in b.notes)
    more = price(usage(local=4, local_cores=5.0), gcp, "utilization")
    assert math.isclose(more.local_preprocessing, 2 * expected) and more.total == b.total
    # more than the host has is capped at the host
    capped = price(usage(local=4, local_cores=1000.0), gcp, "utilization")
    assert math.isclose(capped.local_preprocessing, 2.0 * 2 * shape.vcpus * split.cpu / shape.vcpus)


def test_vm_hours_basis_local_preprocessing_is_zero_and_unknown_cpu_is_not_priced(gcp):
    vm = price(usage(local=2, local_cores=1.0), gcp, "vm-hours")
    assert vm.local_preprocessing == 0.0 and any("add no dollars" in n for n in vm.notes)
    unknown = price(usage(local=2, local_cores=None), gcp, "utilization")
    assert unknown.local_preprocessing is None
    said = "local preprocessing not priced: the local workers' CPU use is not known before a run."
    assert said in price(usage(local=2, local_cores=None, local_cpu_source="not known before a run"), gcp).notes


def test_a_hybrid_spec_counts_its_local_workers_apart_from_the_remote_ones(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: h\nservice: {workers: 3, placement: hybrid, local_workers: 2}\ntrainer: {steps: 10, count: 2}\n"
                    "pipeline: {builtin: text, params: {epochs: null}}\n")
    spec = load_spec(path).spec
    u = usage_from_spec(spec, job_time_s=10.0, measured={"local_cpu_cores": 0.7, "local_cpu_source": ESTIMATED})
    assert (u.n_workers, u.local_workers, u.local_cpu_cores, u.local_cpu_source) == (3, 2, 0.7, ESTIMATED)
    assert usage_from_spec(spec, job_time_s=10.0, workers=0).local_workers == 0  # colocated: no service, no workers
    assert usage_from_spec(spec, job_time_s=10.0).local_cpu_source == "not known before a run"  # an estimate
    assert usage_from_spec(spec, job_time_s=10.0, measured={}).local_cpu_source == "not measured"  # a run's record


def test_cost_rows_show_remote_and_local_preprocessing_and_their_labels(gcp):
    u = usage(local=4, local_cores=2.5)
    row = cost_row("r", u, price(u, gcp), gcp)
    data = row.as_json([])
    assert data["local_workers"] == 4 and data["local_cpu_source"] == "estimated: test"
    assert data["remote_preprocessing"] == data["service"] and data["local_preprocessing"] > 0
    shown = dict(_display(row, []))
    assert shown["local workers"] == "4 per trainer, on the trainer hosts"
    assert shown["local preprocessing"].endswith("(in trainer CPU, not added); CPU estimated")
    plain = cost_row("p", usage(), price(usage(), gcp), gcp)
    assert "local preprocessing" not in dict(_display(plain, [])) and plain.as_json([])["local_workers"] == 0


def _records(local: int, remote: int) -> dict[int, dict]:
    return {0: {"placement": "hybrid", "local_workers": 2, "process": "h:10", "local_batches": local,
                "remote_batches": remote, "by_producer": {"h:10": local, "h:20": remote}},
            1: {"placement": "hybrid", "local_workers": 2, "process": "h:11", "local_batches": local,
                "remote_batches": remote, "by_producer": {"h:11": local, "h:20": remote}}}


def test_placement_record_sums_the_trainers_and_estimates_local_cpu_from_remote_cpu_per_batch():
    """Remote workers used 60 CPU-seconds (3 workers x 0.5 cores mean) for 300 remote batches: 0.2 s a batch; 200
    local batches are then 40 CPU-seconds, and 3 x 0.5 x 200/300 = 1.0 core over 2 trainers = 0.5 per trainer."""
    summary = RunSummary(worker_cpu_seconds=60.0, worker_cpu_cores=0.5)
    out = placement_fields(_records(100, 150), summary, workers=3, trainers=2)
    p = out["placement"]
    assert (p.placement, p.local_workers, p.local_batches, p.remote_batches) == ("hybrid", 2, 200, 300)
    assert [t.process for t in p.trainers] == ["h:10", "h:11"] and p.trainers[1].by_producer == {"h:11": 100, "h:20": 150}
    assert math.isclose(out["local_cpu_seconds"], 40.0) and math.isclose(out["local_cpu_cores"], 0.5)
    assert out["local_cpu_source"] == ESTIMATED and ESTIMATED.startswith("estimated: ")
    kept = summary.updated(**out).as_json()
    assert kept["placement"]["trainers"][0]["by_producer"] == {"h:10": 100, "h:20": 150}


def test_local_cpu_is_not_made_up_when_there_is_nothing_to_estimate_from():
    assert placement_fields({}, RunSummary(worker_cpu_seconds=1.0, worker_cpu_cores=1.0), 1, 1) == {}
    no_remote = placement_fields(_records(10, 0), RunSummary(worker_cpu_seconds=1.0, worker_cpu_cores=1.0), 1, 2)
    assert "local_cpu_cores" not in no_remote and no_remote["local_cpu_source"].startswith("not known: no batch came")
    unsampled = placement_fields(_records(10, 5), RunSummary(), 1, 2)
    assert "local_cpu_cores" not in unsampled and "not sampled" in unsampled["local_cpu_source"]
    idle = placement_fields(_records(0, 5), RunSummary(worker_cpu_seconds=1.0, worker_cpu_cores=1.0), 1, 2)
    assert idle["local_cpu_cores"] == 0.0 and idle["local_cpu_source"].startswith("measured here")


def test_runs_show_says_where_the_batches_came_from_and_how_the_local_cpu_is_known():
    from dsctl.cli.render import placement_rows

    summary = RunSummary(worker_cpu_seconds=60.0, worker_cpu_cores=0.5)
    summary = summary.updated(**placement_fields(_records(100, 150), summary, workers=3, trainers=2))
    rows = dict(placement_rows(summary))
    assert rows["placement"] == ("hybrid: 2 in-process worker(s) per trainer; batches received from local workers 200, "
                                 "from remote workers 300 (40% local) (measured here)")
    assert rows["  trainer 1"] == "h:11: local 100, remote 150; by producer: h:11 100, h:20 150"
    assert rows["local worker CPU"] == f"0.50 cores per trainer ({ESTIMATED})"
    assert placement_rows(RunSummary()) == []


def test_a_run_closed_from_its_trainers_files_keeps_their_placement_records(tmp_path):
    """`dsctl down` or `runs import` close a run from its trainers' metrics files: the placement records are read
    there too (the rest of closing is tests/test_records_reconcile.py's)."""
    import json as _json

    from dsctl.orchestrator.reconcile import read_trainer_files

    (tmp_path / "metrics").mkdir()
    for i, rec in _records(7, 3).items():
        lines = [{"event": "window", "trainer": i, "wall": 1.0, "batches": 10, "t_start": 0.0, "t_end": 1.0},
                 {"event": "placement", "trainer": i, "wall": 2.0, **rec}]
        (tmp_path / "metrics" / f"trainer-{i}.jsonl").write_text("".join(_json.dumps(x) + "\n" for x in lines))
    files = read_trainer_files(tmp_path)
    assert sorted(files.placements) == [0, 1] and files.placements[1]["by_producer"] == {"h:11": 7, "h:20": 3}
    out = placement_fields(files.placements, RunSummary(), workers=1, trainers=2)
    assert (out["placement"].local_batches, out["placement"].remote_batches) == (14, 6)


def test_an_auto_run_counts_the_local_workers_its_policy_started(tmp_path):
    """placement: auto: service.local_workers is only the policy's cap, so a run is priced with the most in-process
    workers its trainers reported (their placement record), and a plan before any run with none."""
    path = tmp_path / "auto.yaml"
    path.write_text("name: a\nservice: {placement: auto, local_workers: 4}\ntrainer: {steps: 10}\n"
                    "pipeline: {builtin: synthetic, params: {epochs: null}}\n")
    spec = load_spec(path).spec
    assert usage_from_spec(spec, job_time_s=HOUR, workers=2).local_workers == 0
    ran = RunSummary.model_validate({"placement": {"placement": "auto", "local_workers": 2}})
    assert usage_from_spec(spec, job_time_s=HOUR, workers=2, measured=ran).local_workers == 2
    assert usage_from_spec(spec, job_time_s=HOUR, workers=2, measured=ran.model_dump()).local_workers == 2
