"""`dsctl cost estimate`: the paper's example from the command line, output formats that
round-trip, and bad input as one paragraph with exit code 2."""

from __future__ import annotations

import csv
import io
import json
import textwrap

import pytest
import typer
from typer.testing import CliRunner

from dsctl.cli.cost import cost_app
from dsctl.specs import SpecError

# The paper's n2-standard-8 price ($0.08/h) is a Spot price: the service is priced as Spot VMs.
SPEC = """
name: resnet50-disagg
service: {workers: 16, worker_machine: n2-standard-8, dispatcher_machine: n2-standard-8, provisioning: spot}
trainer: {machine: tpu-v2-8, steps: 112320}
pipeline: {builtin: synthetic}
pricing: paper-2023-06
"""


def _app() -> typer.Typer:
    """Stand-in for the main CLI: SpecError -> one paragraph, exit 2."""
    app = typer.Typer()
    app.add_typer(cost_app, name="cost")
    return app


def run(*args: str):
    result = CliRunner().invoke(_app(), ["cost", *args])
    if isinstance(result.exception, SpecError):
        return 2, str(result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(SPEC).lstrip(), encoding="utf-8")
    return path


def test_paper_example_from_the_cli(job):
    code, out = run("estimate", str(job), "--batches-per-sec", "4.5", "--steps", "112320",
                    "--basis", "vm-hours", "--compare-colocated", "1.75", "--format", "json")
    assert code == 0, out
    colocated, service = json.loads(out)
    assert round(colocated["total"], 2) == 80.23
    assert round(service["total"], 2) == 40.63
    assert round(service["service"], 1) == 9.4 and round(service["trainers"], 1) == 31.2
    assert f"{service['cost_saving']:.2f}" == "1.97" and f"{service['speedup']:.2f}" == "2.57"
    # Which of the catalog's prices each part was charged at.
    assert (service["service_provisioning"], service["trainer_provisioning"]) == ("spot", "standard")
    assert (colocated["service_provisioning"], colocated["trainer_provisioning"]) == (None, "standard")
    assert service["prices"] == colocated["prices"] == "paper-2023-06"


def test_table_and_markdown_show_the_breakdown(job):
    code, out = run("estimate", str(job), "--batches-per-sec", "4.5", "--basis", "vm-hours",
                    "--compare-colocated", "1.75")
    assert code == 0, out
    for words in ("$80.23", "$40.63", "$31.20", "1.97x", "2.57x", "paper-2023-06",
                  "16 x n2-standard-8 (Spot)", "1 x n2-standard-8 (Spot)", "1 x tpu-v2-8 (on-demand)"):
        assert words in out
    code, out = run("estimate", str(job), "--batches-per-sec", "4.5", "--format", "markdown", "--verbose")
    assert code == 0 and "| total | $40.63 |" in out and "whole machines" in out
    assert "| priced as | workers and dispatcher: Spot, trainers: on-demand |" in out
    assert "prices paper-2023-06 of 2023-06, USD; workers and dispatcher: Spot, trainers: on-demand" in out
    assert "catalog paper-2023-06's Spot prices are used for the workers and dispatcher" in out


def test_on_demand_service_with_the_papers_catalog_exits_2_naming_the_field(job):
    job.write_text(job.read_text().replace(", provisioning: spot", ""), encoding="utf-8")
    code, out = run("estimate", str(job), "--batches-per-sec", "4.5")
    assert code == 2 and "\n" not in out.strip()
    assert "only a Spot price for n2-standard-8" in out and "set service.provisioning: spot" in out
    code, out = run("estimate", str(job), "--batches-per-sec", "4.5", "--prices", "gcp-us-central1-2025",
                    "--format", "json")
    assert code == 0, out
    (row,) = json.loads(out)
    assert (row["service_provisioning"], row["trainer_provisioning"]) == ("standard", "standard")
    assert row["total"] > 40.63  # on-demand n2 VMs cost several times the paper's Spot price


def test_json_and_csv_round_trip(job):
    args = ("estimate", str(job), "--batches-per-sec", "3.3", "--hours", "1.7", "--workers", "5",
            "--prices", "gcp-us-central1-2025", "--compare-colocated", "1.1")
    code, out_json = run(*args, "--format", "json")
    assert code == 0, out_json
    code, out_csv = run(*args, "--format", "csv")
    assert code == 0, out_csv
    from_json = json.loads(out_json)
    from_csv = list(csv.DictReader(io.StringIO(out_csv)))
    assert len(from_json) == len(from_csv) == 2
    numeric = ("job_time_s", "batches", "workers", "dispatcher", "trainer_cpu", "trainer_memory",
               "accelerators", "service", "trainers", "total", "per_1000_batches")
    for j, c in zip(from_json, from_csv):
        for key in numeric:
            assert float(c[key]) == j[key], key  # exact: both print full precision
        assert j["total"] == pytest.approx(sum(j[k] for k in ("workers", "dispatcher", "trainer_cpu",
                                                              "trainer_memory", "accelerators")))
    assert from_json[1]["n_workers"] == 5 and from_json[1]["job_time_s"] == pytest.approx(1.7 * 3600)
    assert from_json[0]["batches"] == pytest.approx(from_json[1]["batches"])  # same work, colocated
    assert float(from_csv[1]["cost_saving"]) == from_json[1]["cost_saving"]


@pytest.mark.parametrize(
    "extra, words",
    [
        (("--batches-per-sec", "0"), "must be a positive number, got 0"),
        (("--batches-per-sec", "-2"), "got -2"),
        (("--batches-per-sec", "1", "--steps", "0"), "number of steps must be a positive number"),
        (("--batches-per-sec", "1", "--hours", "-1"), "number of hours must be a positive number"),
        (("--batches-per-sec", "1", "--basis", "hourly"), "--basis must be one of utilization, vm-hours"),
        (("--batches-per-sec", "1", "--format", "xml"), "--format must be one of"),
        (("--batches-per-sec", "1", "--prices", "paper-2024"), "unknown price catalog 'paper-2024'"),
    ],
)
def test_bad_input_exits_2_with_one_paragraph(job, extra, words):
    code, out = run("estimate", str(job), *extra)
    assert code == 2
    assert words in out and "\n" not in out.strip()


def test_malformed_catalog_file_from_the_cli(job, tmp_path):
    bad = tmp_path / "prices.yaml"
    bad.write_text("name: x\ndate: 2024-01\nsource: s\ncurrency: USD\nmachines:\n  tpu-v2-8: -1\n", encoding="utf-8")
    code, out = run("estimate", str(job), "--batches-per-sec", "1", "--prices", str(bad))
    assert code == 2 and out.startswith(f"{bad}:6: machines.tpu-v2-8: ")
