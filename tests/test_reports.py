"""What users read after a run, and that it never falls over: money in plain decimals, every run id whole at 80
columns, a cost report that prices what it can and marks the run it cannot, its notes behind --verbose, and
TensorBoard scalars that go on when the run cannot be priced."""

from __future__ import annotations

import json
import re

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from dsctl.cli.cost import cost_app
from dsctl.cli.render import runs_table, status_table
from dsctl.costmodel.money import usd
from dsctl.orchestrator.store import RunStore
from dsctl.orchestrator.tbevents import RunBoard, event_files
from dsctl.specs import load_spec_text, spec_hash

SPEC = """
name: {name}
service: {{workers: 2, worker_machine: n2-standard-8, dispatcher_machine: n2-standard-8}}
trainer: {{machine: {machine}, steps: 100}}
pipeline: {{builtin: synthetic}}
"""
# Run ids as long as dsctl makes them: a 40-character job name, a sweep point's worker count, time and suffix.
LONG_NAME = "resnet50-disaggregated-input-pipeline-xl"


def record(store: RunStore, run_id: str, machine: str = "n2-standard-8", name: str = "rep") -> None:
    spec = load_spec_text(SPEC.format(name=name, machine=machine)).spec
    store.create_run(id=run_id, name=name, provider="local", mode="service", status="running",
                     spec_json=spec.model_dump_json(), spec_hash=spec_hash(spec), workers=2, trainers=1,
                     created_at=1000.0)
    store.update_run(run_id, status="succeeded", ended_at=1009.0,
                     summary={"duration_s": 9.0, "batches": 300, "batches_per_s": 33.3, "input_stall_frac": 0.5})


def rendered(table, width: int) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(table)
    return console.export_text()


def test_money_is_plain_decimals_with_sensible_digits():
    assert usd(5.584e-06) == "$0.00000558"  # a 9-second local run: never $5.584e-06
    assert usd(0.01662) == "$0.0166" and usd(0.1) == "$0.100"
    assert usd(1234.567) == "$1,234.57" and usd(0) == "$0.00" and usd(None) == "-"
    assert usd(2.5, places=4) == "$2.5000"
    assert usd(3e-13) == "<$0.0000000001"
    assert not any("e-" in usd(10.0 ** -k) for k in range(1, 10))


def test_runs_at_80_columns_show_every_run_id_whole_and_drop_other_columns_first(home):
    store = RunStore()
    ids = [f"{LONG_NAME}-w16-1129-034220-5c2d", "quickstart-1129-034301-819d"]
    for i, run_id in enumerate(ids):
        record(store, run_id, name=("rep" if i else LONG_NAME))
    text = rendered(runs_table(store.list(), width=80), 80)  # the CLI's console is as wide as the terminal
    assert all(len(line) <= 80 for line in text.splitlines()), text
    for run_id in ids:
        assert run_id in text, text  # whole: the value every other command takes
    assert "…" not in text
    assert "left out to fit 80 columns:" in text and "--json` has every field" in text
    assert "status" in text.splitlines()[2]  # the next most telling columns stay

    wide = rendered(runs_table(store.list(), width=200), 200)
    assert "left out" not in wide and "trainers" in wide and "started" in wide


def test_status_keeps_run_ids_whole_at_80_columns():
    rows = [{"run": f"{LONG_NAME}-1129-034220-5c2d", "provider": "local", "status": "up",
             "dispatcher": "127.0.0.1:40123", "workers": 2, "log": "/home/someone/.dsctl/runs/" + "x" * 60}]
    text = rendered(status_table("deployments", rows, width=80), 80)
    assert f"{LONG_NAME}-1129-034220-5c2d" in text and all(len(line) <= 80 for line in text.splitlines())


def report(*args: str, width: int = 250) -> tuple[int, str]:
    app = typer.Typer()
    app.add_typer(cost_app, name="cost")
    result = CliRunner().invoke(app, ["cost", "report", *args], env={"COLUMNS": str(width)})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_cost_report_all_prices_what_it_can_and_marks_the_run_it_cannot(home):
    store = RunStore()
    record(store, "good-1")
    record(store, "typo-1", machine="tpu-v9-8")  # recorded by an older dsctl that did not check machine types
    record(store, "good-2")
    code, out = report("--all")
    assert code == 0, out
    assert "typo-1: not priced: unknown machine type 'tpu-v9-8'" in out
    assert re.search(r"total\s.*\$0\.\d+.*not priced \(below\).*\$0\.\d+", out), out
    code, out = report("--all", "--format", "json")
    rows = {r["label"]: r for r in json.loads(out)}
    assert rows["good-1"]["total"] > 0 and rows["good-2"]["total"] > 0
    assert rows["typo-1"]["total"] is None and "tpu-v9-8" in rows["typo-1"]["not_priced"]


def test_cost_report_notes_are_one_line_unless_verbose(home):
    record(RunStore(), "local-1")
    code, out = report("local-1")
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert code == 0 and not notes
    assert re.search(r"^\d+ notes? on how this was priced .*: --verbose shows them\.$", out, re.MULTILINE), out
    code, verbose = report("local-1", "--verbose")
    assert code == 0 and any("priced as the machine type the spec names" in line for line in verbose.splitlines()
                             if line.startswith("note:"))


def test_cost_report_of_many_runs_at_80_columns_keeps_each_id_whole(home):
    store = RunStore()
    ids = [f"{LONG_NAME}-w{n}-1129-0342{n:02d}-5c2d" for n in (1, 2, 4)]
    for run_id in ids:
        record(store, run_id, name=LONG_NAME)
    code, out = report(*ids, width=80)
    assert code == 0
    assert all(len(line) <= 80 for line in out.splitlines()), out
    for run_id in ids:
        assert run_id in out, out
    assert "[1 of 3]" in out


def test_a_run_that_cannot_be_priced_still_gets_its_other_tensorboard_scalars(home, tmp_path):
    store = RunStore()
    record(store, "typo-1", machine="tpu-v9-8")
    board = RunBoard(tmp_path / "run", "typo-1", trainers=1)
    window = {"wall": 1005.0, "t_start": 0.0, "t_end": 1.0, "batches": 10, "batches_per_s": 10.0,
              "input_wait_s": 0.5, "step_s": 0.5, "loss": 2.0}
    warning = board.window(0, window, 2, store.get("typo-1"))
    assert warning.startswith("TensorBoard gets no cost_so_far_usd for this run, which cannot be priced")
    assert "unknown machine type 'tpu-v9-8'" in warning and "its other scalars are written" in warning
    [events] = event_files(tmp_path / "run" / "tensorboard")
    size = events.stat().st_size
    assert board.window(0, {**window, "wall": 1006.0, "loss": 1.0}, 2, store.get("typo-1")) is None  # said once
    assert events.stat().st_size > size  # and the board goes on writing
    assert board.close() is None


@pytest.mark.parametrize("value", [5.584e-06, 0.0123, 3.0])
def test_the_summary_and_the_sweep_table_use_the_same_money(value):
    from dsctl.cli.render import money

    assert money(value) == usd(value)


def test_a_sweep_table_says_what_a_point_measures_and_why_it_recommends_nothing():
    from types import SimpleNamespace

    from dsctl.cli.render import sweep_table
    from dsctl.orchestrator.recommend import recommend

    points = [{"workers": 1, "batches_per_s": 1.5, "cost_per_1000_batches": 0.5, "predicted": False},
              {"workers": 2, "batches_per_s": 1.55, "cost_per_1000_batches": 0.6, "predicted": False}]
    summary = {"points": points, "counts": [1, 2], "window": "5 s", "warmup_s": 2.0,
               "measures": "a steady window of 5 s per trainer at each point, after a 2 s warm-up, not whole epochs",
               "baselines": {"colocated": {"batches_per_s": 0.9}, "ideal": {"batches_per_s": 1.0}},
               "recommendation": recommend(points, ideal_bps=1.0, colocated_bps=0.9).to_dict()}
    text = rendered(sweep_table(SimpleNamespace(id="s-1", status="succeeded", summary=summary)), 250)
    assert "each point measures a steady window of 5 s per trainer at each point" in text
    assert "recommended: none: 2 workers measured 1.55 batches/s, 155% of the ideal baseline's" in text
    assert "cheapest:" not in text
