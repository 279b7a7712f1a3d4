"""`dsctl sweep --local-workers` (unit): the range it takes, the rule its recommendation follows over the cost surface
(remote x local workers), what it refuses before anything starts; and a recorded hybrid run priced by `dsctl cost
report --format json` with its remote and local preprocessing apart."""

from __future__ import annotations

import json

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from dsctl.cli.cost import cost_app
from dsctl.cli.render import sweep_plan_line, sweep_table
from dsctl.orchestrator.recommend import cheapest_within
from dsctl.orchestrator.records import RunRecord
from dsctl.orchestrator.store import RunStore
from dsctl.orchestrator.sweep import SweepOptions, SweepRunner, placed
from dsctl.specs import SpecError, load_spec, load_spec_text, spec_hash
from dsctl.specs.workercounts import parse_worker_counts


def test_local_worker_counts_take_the_workers_forms_and_zero():
    assert parse_worker_counts("0..4", option="--local-workers", zero_ok=True) == [0, 1, 2, 4]
    assert parse_worker_counts("0..3:1", option="--local-workers", zero_ok=True) == [0, 1, 2, 3]
    assert parse_worker_counts("2,0", option="--local-workers", zero_ok=True) == [0, 2]
    with pytest.raises(SpecError) as info:
        parse_worker_counts("3..1", option="--local-workers", zero_ok=True)
    assert str(info.value).startswith("--local-workers: '3..1' is not a worker-count spec for --local-workers")
    assert "at least 0" in str(info.value)
    with pytest.raises(SpecError, match="a worker count of 0 has no workers"):  # --workers still needs a worker
        parse_worker_counts("0..4")


def pt(workers, local, bps, cost, predicted=False):
    return {"workers": workers, "local_workers": local, "batches_per_s": bps, "cost_per_1000_batches": cost,
            "predicted": predicted}


SURFACE = [
    pt(1, 0, 50.0, 1.00), pt(2, 0, 90.0, 0.80), pt(4, 0, 100.0, 0.90),
    pt(1, 2, 97.5, 0.60),   # within 3% of 100, cheapest of those: the pick
    pt(1, 4, 96.0, 0.55),   # cheaper, but 4% below the best: out
    pt(2, 2, 99.0, 0.70),
    pt(1, 8, 120.0, 0.10, predicted=True),  # predicted points neither set the bar nor win
]


def test_the_surface_recommends_the_cheapest_point_within_tolerance_of_the_best_measured_throughput():
    """Picking the cheapest overall would give 1 + 4 local (4% slow); the fastest, 4 remote; letting the predicted
    point set the bar would leave nothing within 3% of 120 but itself."""
    pick, rule = cheapest_within(SURFACE, tolerance=0.03)
    assert (pick.workers, pick.local_workers, pick.cost_per_1000_batches) == (1, 2, 0.60)
    assert rule.startswith("the cheapest measured point (cost per 1,000 batches) whose throughput is within 3% of the "
                           "best measured throughput")
    assert pick.reason == ("1 remote worker + 2 local workers per trainer: $0.600 per 1,000 batches at 97.5 batches/s "
                           "(measured), within 3% of the best measured 100 batches/s; next cheapest within it: 2 remote "
                           "workers + 2 local workers per trainer at $0.700.")
    wider, _ = cheapest_within(SURFACE, tolerance=0.05)
    assert (wider.workers, wider.local_workers) == (1, 4)
    tie, _ = cheapest_within([pt(2, 0, 100.0, 0.5), pt(1, 1, 100.0, 0.5)], tolerance=0.03)
    assert (tie.workers, tie.local_workers) == (1, 1)  # equal cost and speed: fewer remote workers
    assert cheapest_within([pt(1, 1, 10.0, None)], tolerance=0.03)[0] is None


HYBRID_OK = "name: s\nservice: {workers: 1}\ntrainer: {steps: 10}\npipeline: {builtin: synthetic, params: {epochs: null}}\n"


@pytest.mark.parametrize("spec_text, options, needles", [
    ("name: s\nservice:\n  workers: 1\n  job_name: j\n  coordinated_reads: {num_consumers: 1, bucket_boundaries: [8]}\n"
     "trainer: {steps: 10}\npipeline: {builtin: text, params: {epochs: null}}\n", {},
     ["runs the job with service.placement: hybrid, which this job cannot", "coordinated reads cannot be combined",
      ":5: service.coordinated_reads", "Sweep --workers alone"]),
    (HYBRID_OK, {"simulate": True}, ["cannot be predicted", "--simulate"]),
    (HYBRID_OK, {"strategy": "restart"}, ["--strategy restart is not supported"]),
])
def test_what_cannot_sweep_local_workers_is_refused_naming_the_flag_before_anything_starts(home, tmp_path, spec_text,
                                                                                         options, needles):
    path = tmp_path / "job.yaml"
    path.write_text(spec_text)
    runner = SweepRunner(load_spec(path), SweepOptions(counts=[1, 2], local_counts=[0, 2], local_asked="0..2",
                                                       **options))
    with pytest.raises(SpecError) as info:
        runner.plan()
    message = str(info.value)
    assert info.value.field == "--local-workers" and message.startswith("--local-workers: --local-workers 0..2 "), message
    for needle in needles:
        assert needle in message, (needle, message)
    assert not runner.run_dir.exists() and RunStore().list() == []  # nothing recorded, nothing started


def test_a_local_count_runs_the_spec_hybrid_and_zero_runs_it_remote(tmp_path):
    spec = load_spec_text(HYBRID_OK).spec
    assert (placed(spec, 3).service.placement, placed(spec, 3).service.local_workers) == ("hybrid", 3)
    assert (placed(spec, 0).service.placement, placed(spec, 0).service.local_workers) == ("remote", 0)
    assert spec.service.placement == "remote"  # the sweep's own spec is left as it was


def test_the_sweep_table_shows_local_workers_and_says_its_rule():
    pick, rule = cheapest_within(SURFACE[:-1], tolerance=0.03)
    summary = {"counts": [1, 2, 4], "local_counts": [0, 2, 4], "points": SURFACE[:-1],
               "recommendation": {"surface": pick.__dict__, "rule": rule}}
    record = RunRecord(id="sw", name="s", kind="sweep", parent_id=None, provider="local", mode="service",
                       status="succeeded", spec_path=None, spec_yaml=None, spec_json="{}", spec_hash="h", workers=4,
                       trainers=1, created_at=0.0, ended_at=1.0, run_dir=None, error=None, summary=summary)
    console = Console(width=250, record=True)
    console.print(sweep_table(record))
    text = " ".join(console.export_text().split())
    assert "┃ workers ┃ local ┃ batches/s ┃" in text and "│ 1 │ 2 │ 97.50 │" in text
    assert "recommended placement: 1 remote worker + 2 local workers per trainer: $0.600" in text
    assert "rule: the cheapest measured point (cost per 1,000 batches) whose throughput is within 3%" in text
    assert sweep_plan_line([1, 2], [], "1..2", [0, 2], "0,2") == ("sweeping 2 worker counts: 1, 2, each with 0, 2 "
                                                                  "local worker(s) per trainer (4 points)")


HYBRID_GCP = """
name: rep
provider: gcp
service: {workers: 2, worker_machine: n2-standard-8, dispatcher_machine: n2-standard-8, placement: hybrid,
          local_workers: 3}
trainer: {machine: n2-standard-16, steps: 100}
pipeline: {builtin: synthetic}
pricing: gcp-us-central1-2025
"""


def test_cost_report_json_prices_a_recorded_hybrid_run_with_remote_and_local_preprocessing_apart(home):
    """A recorded hybrid run (its spec as a run records it: made without its placement, then given it, as a sweep's
    hybrid point is)."""
    spec = load_spec_text(HYBRID_GCP.replace("placement: hybrid,\n          local_workers: 3", "")).spec
    spec = placed(spec, 3)
    store = RunStore()
    store.create_run(id="hyb", name="rep", provider="local", mode="service", status="running",
                     spec_json=spec.model_dump_json(), spec_hash=spec_hash(spec), workers=2, trainers=1,
                     created_at=1000.0)
    store.update_run("hyb", status="succeeded", ended_at=1000.0 + 3600, summary={
        "duration_s": 3600.0, "batches": 1000, "worker_cpu_cores": 4.0, "worker_mem_gb": 2.0,
        "local_cpu_cores": 1.5, "local_cpu_source": "estimated: from the test"})
    app = typer.Typer()
    app.add_typer(cost_app, name="cost")
    result = CliRunner().invoke(app, ["cost", "report", "hyb", "--format", "json"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)
    assert row["n_workers"] == 2 and row["local_workers"] == 3
    assert row["remote_preprocessing"] == row["workers"] + row["dispatcher"]
    assert row["local_cpu_source"] == "estimated: from the test"
    assert 0 < row["local_preprocessing"] < row["trainer_cpu"]
    assert row["total"] == pytest.approx(row["service"] + row["trainers"])


def test_the_cost_surface_plot_has_a_cell_per_measured_point_and_outlines_the_pick(tmp_path):
    from matplotlib.patches import Rectangle

    from dsctl.orchestrator.plots import build_surface_figure, plot_surface

    pick, _ = cheapest_within(SURFACE, tolerance=0.03)
    fig = build_surface_figure(SURFACE, title="s", pick=pick)
    ax = fig.axes[0]
    texts = sorted(t.get_text() for t in ax.texts)
    assert len(texts) == 6 and "$0.6\n97.5 b/s" in texts  # the predicted point is not drawn
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "2", "4"]
    [box] = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_label() == "recommended"]
    assert box.get_xy() == (-0.5, 0.5)  # remote 1 (column 0), local 2 (row 1)
    path = plot_surface(SURFACE, out_dir=tmp_path, title="s", pick=pick)
    assert path.name == "sweep-surface.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
