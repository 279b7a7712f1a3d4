"""Additions to the paper's Equation 1: what a run's external IPv4 addresses and boot disks cost.

The arithmetic (costmodel/extras.py, of what provisioners/gcp/billing.py declares) to the cent; the shipped catalog's
prices for them, with their sources; and `dsctl cost report`'s columns for them (json, csv, table): from what the run
recorded, from an older record's spec when it names the settings, "not recorded" when it does not, and for a local
run as a gcp run of its spec would have them."""

from __future__ import annotations

import csv
import io
import json

import pytest
import typer
from typer.testing import CliRunner

from dsctl.cli.cost import cost_app
from dsctl.costmodel import load_catalog
from dsctl.costmodel.extras import LABEL
from dsctl.orchestrator.costs import ADDITION_FIELDS, FIELDS
from dsctl.orchestrator.pricing import cost_summary
from dsctl.orchestrator.store import RunStore
from dsctl.provisioners.gcp.billing import Created, VmGroup, price_additions
from dsctl.specs import SpecError, load_spec_text, spec_hash

GCP = load_catalog("gcp-us-central1-2025")
HOURS = 730.0  # Google turns $/GB-month into $/hour at 730 hours a month


def created(*groups: VmGroup, public_ips: bool = True, gb: int = 50, disk: str = "pd-balanced") -> Created:
    return Created(public_ips=public_ips, boot_disk_gb=gb, boot_disk_type=disk, vms=groups)


# -- the arithmetic -------------------------------------------------------------------------------------------
def test_eight_workers_with_public_ips_and_50_gb_balanced_disks_for_two_hours():
    """8 on-demand VMs x $0.005/h x 2 h = $0.08 of addresses; 8 x 50 GB x $0.10/GB-month / 730 h x 2 h = $0.1096
    of disks (80/730 dollars)."""
    a = price_additions(created(VmGroup("workers", "n2-standard-8", 8, "standard")), GCP, job_time_s=2 * 3600)
    assert a.ipv4.count == 8 and a.ipv4.quantity == "8 addresses"
    assert a.ipv4.per_hour == pytest.approx(0.04, abs=1e-12) and a.ipv4.cost == pytest.approx(0.08, abs=1e-12)
    assert a.boot_disks.quantity == "8 x 50 GB pd-balanced"
    assert a.boot_disks.per_hour == pytest.approx(8 * 50 * 0.10 / HOURS, abs=1e-12)
    assert a.boot_disks.cost == pytest.approx(80 / HOURS, abs=1e-12)
    assert round(a.boot_disks.cost, 2) == 0.11
    assert a.cost == pytest.approx(0.08 + 80 / HOURS, abs=1e-12)
    assert [s.what for s in a.sources] == ["external IPv4 (standard VMs)", "pd-balanced boot disk"]
    assert all(s.own and s.date.startswith("2025-03") for s in a.sources)
    assert a.to_dict()["label"] == LABEL == "not in Equation 1"


def test_spot_vms_pay_half_for_their_address_and_disk_types_are_priced_each():
    spot = price_additions(created(VmGroup("workers", "n2-standard-8", 8, "spot"), gb=100, disk="pd-ssd"), GCP,
                           job_time_s=3600)
    assert spot.ipv4.cost == pytest.approx(8 * 0.0025, abs=1e-12)
    assert spot.boot_disks.cost == pytest.approx(8 * 100 * 0.17 / HOURS, abs=1e-12)
    hdd = price_additions(created(VmGroup("workers", "n2-standard-8", 2, "standard"), gb=200, disk="pd-standard"),
                          GCP, job_time_s=3600)
    assert hdd.boot_disks.cost == pytest.approx(2 * 200 * 0.04 / HOURS, abs=1e-12)


def test_no_public_ips_no_address_cost_and_tpu_vms_get_an_address_but_no_boot_disk():
    vms = (VmGroup("dispatcher", "n2-standard-8", 1, "standard"), VmGroup("workers", "n2-standard-8", 4, "spot"),
           VmGroup("trainers", "tpu-v2-8", 1, "standard", tpu=True))
    internal = price_additions(created(*vms, public_ips=False), GCP, job_time_s=3600)
    assert (internal.ipv4.count, internal.ipv4.cost, internal.ipv4.per_hour) == (0, 0.0, 0.0)
    assert "gcp.public_ips: false" in internal.ipv4.quantity
    a = price_additions(created(*vms), GCP, job_time_s=3600)
    assert a.ipv4.count == 6 and a.ipv4.cost == pytest.approx(0.005 + 4 * 0.0025 + 0.005, abs=1e-12)
    assert any("TPU VMs' external addresses are charged as any VM's" in n for n in a.ipv4.notes)
    # 5 Compute Engine VMs have the spec's boot disk; the TPU VM's comes with it.
    assert a.boot_disks.count == 5 and a.boot_disks.cost == pytest.approx(5 * 50 * 0.10 / HOURS, abs=1e-12)
    assert any("no boot disk added" in n for n in a.boot_disks.notes)


def test_stopped_vms_hold_no_address_but_their_disks_bill_on():
    """4 workers for 2 h, 2 of those 8 VM-hours stopped (e.g. preempted Spot VMs): 6 VM-hours of addresses,
    8 of disk."""
    a = price_additions(created(VmGroup("workers", "n2-standard-8", 4, "spot")), GCP, job_time_s=7200,
                        stopped_s={"workers": 2 * 3600.0})
    assert a.ipv4.cost == pytest.approx(6 * 0.0025, abs=1e-12)
    assert a.boot_disks.cost == pytest.approx(4 * 2 * 50 * 0.10 / HOURS, abs=1e-12)


def test_without_a_price_the_addition_is_not_priced_and_says_why():
    paper = load_catalog("paper-2023-06")
    a = price_additions(created(VmGroup("workers", "n2-standard-8", 2, "spot")), paper, job_time_s=3600)
    assert a.ipv4.cost is None and a.ipv4.per_hour is None and a.cost is None
    assert "catalog paper-2023-06 has no price for external IPv4 addresses on Spot VMs" in a.ipv4.unpriced
    assert "has no price for pd-balanced boot disks" in a.boot_disks.unpriced
    odd = price_additions(created(VmGroup("workers", "n2-standard-8", 2, "spot"), disk="hyperdisk-ml"), GCP, 3600)
    assert odd.boot_disks.cost is None and "it prices: pd-balanced, pd-ssd, pd-standard" in odd.boot_disks.unpriced
    assert odd.ipv4.cost == pytest.approx(2 * 0.0025, abs=1e-12)  # the other addition is still priced
    hourly = price_additions(created(VmGroup("workers", "n2-standard-8", 2, "spot")), GCP)  # length not known
    assert hourly.cost is None and hourly.per_hour == pytest.approx(2 * 0.0025 + 2 * 50 * 0.10 / HOURS)


# -- the shipped catalog --------------------------------------------------------------------------------------
def test_the_2025_catalog_prices_the_additions_and_its_spot_figures_from_2025_data():
    assert GCP.extra_rate("external_ipv4", "standard").per_hour == 0.005
    assert GCP.extra_rate("external_ipv4", "spot").per_hour == 0.0025
    assert {k: GCP.extra_rate("boot_disks", k).per_hour * HOURS for k in ("pd-balanced", "pd-standard", "pd-ssd")} \
        == pytest.approx({"pd-balanced": 0.10, "pd-standard": 0.04, "pd-ssd": 0.17})
    # n2-standard-8: $0.388472/h on demand, about $0.12/h Spot in March 2025 data.
    assert GCP.machine_hour("n2-standard-8") == pytest.approx(0.388472, abs=1e-9)
    assert GCP.machine_hour("n2-standard-8", provisioning="spot") == pytest.approx(0.119904, abs=1e-9)
    assert GCP.machine_hour("n2-standard-4", provisioning="spot") == pytest.approx(0.059952, abs=1e-9)
    assert GCP.machine_hour("n2-highcpu-2", provisioning="spot") == pytest.approx(0.022134, abs=1e-9)
    assert GCP.machine_hour("e2-standard-8", provisioning="spot") == pytest.approx(0.107168, abs=1e-9)
    assert GCP.machine_hour("e2-highcpu-2", provisioning="spot") == pytest.approx(0.019778, abs=1e-9)
    assert GCP.machine_hour("a2-highgpu-1g", provisioning="spot") == pytest.approx(1.293355, abs=1e-9)
    assert GCP.machine_hour("tpu-v2-8") == 4.50
    source = GCP.source_of("n2-standard-8", "spot")
    assert source.own and source.date == "2025-03-06" and "0.119904" in source.source
    # What could not be checked says so.
    for machine in ("tpu-v2-8", "tpu-v3-8", "tpu-v4-8", "tpu-v5litepod-1"):
        assert not GCP.source_of(machine, "spot").rechecked
    assert GCP.source_of("tpu-v2-8").rechecked and not GCP.source_of("tpu-v5litepod-8").rechecked
    assert not GCP.source_of("n2-standard-8").own  # on-demand N2: the catalog's own source and date


def test_every_spot_and_tpu_price_in_the_shipped_catalogs_has_its_own_source_and_date():
    from dsctl.costmodel import MACHINES, shipped_catalogs

    for name in shipped_catalogs():
        cat = load_catalog(name)
        for model in ("standard", "spot"):
            for machine in cat.priced_machines(model):
                tpu = (MACHINES[machine].accelerator_type or "").startswith("TPU")
                if model == "spot" or tpu:
                    s = cat.source_of(machine, model)
                    assert s.own and s.source and s.date, (name, machine, model)


# -- dsctl cost report ----------------------------------------------------------------------------------------
SPEC = """
name: rep
provider: gcp
service: {workers: 8, worker_machine: n2-standard-8, dispatcher_machine: n2-standard-8}
trainer: {machine: n2-standard-8, steps: 100}
pipeline: {builtin: synthetic}
pricing: gcp-us-central1-2025
"""
GCP_SECTION = "gcp: {project: acme-ml, zone: us-central1-b, public_ips: true, boot_disk_gb: 50, " \
              "boot_disk_type: pd-balanced}\n"
TEN_VMS = {"public_ips": True, "boot_disk_gb": 50, "boot_disk_type": "pd-balanced", "vms": [
    {"role": "dispatcher", "machine": "n2-standard-8", "count": 1, "provisioning": "standard", "tpu": False},
    {"role": "workers", "machine": "n2-standard-8", "count": 8, "provisioning": "standard", "tpu": False},
    {"role": "trainers", "machine": "n2-standard-8", "count": 1, "provisioning": "standard", "tpu": False}]}


def record(store: RunStore, run_id: str, spec_text: str, provider: str = "gcp", summary: dict | None = None) -> None:
    spec = load_spec_text(spec_text).spec
    store.create_run(id=run_id, name="rep", provider=provider, mode="service", status="running",
                     spec_json=spec.model_dump_json(), spec_hash=spec_hash(spec), workers=8, trainers=1,
                     created_at=1000.0)
    store.update_run(run_id, status="succeeded", ended_at=1000.0 + 7200,
                     summary={"duration_s": 7200.0, "batches": 1000, **(summary or {})})


def report(*args: str) -> str:
    app = typer.Typer()
    app.add_typer(cost_app, name="cost")
    result = CliRunner().invoke(app, ["cost", "report", *args], env={"COLUMNS": "250"})
    if isinstance(result.exception, SpecError):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture
def runs(home):
    store = RunStore()
    # A run that kept what it created (every run does from now on): 10 VMs, 2 h.
    record(store, "kept", SPEC, summary={"cost": {"created": TEN_VMS}})
    # An older record whose spec names the three settings.
    record(store, "named", SPEC + GCP_SECTION.replace("boot_disk_gb: 50", "boot_disk_gb: 100"))
    # An older record whose spec left them to defaults (public_ips was false by default once): not recorded.
    record(store, "older", SPEC)
    # A local run, standing in for the spec's machine types: additions as a gcp run of its spec would have.
    record(store, "local", SPEC.replace("provider: gcp", "provider: local"), provider="local")
    return store


def test_cost_report_json_has_the_additions_beside_equation_1s_total(runs):
    rows = {r["label"]: r for r in json.loads(report("kept", "named", "older", "local", "--format", "json"))}
    kept = rows["kept"]
    assert kept["additions_status"] == "recorded"
    assert kept["ipv4_cost"] == pytest.approx(10 * 0.005 * 2, abs=1e-12)
    assert kept["boot_disk_cost"] == pytest.approx(10 * 50 * 0.10 / HOURS * 2, abs=1e-12)
    assert kept["additions_total"] == pytest.approx(kept["ipv4_cost"] + kept["boot_disk_cost"], abs=1e-12)
    # Equation 1's total is the machines only; the additions are beside it.
    assert kept["total"] == pytest.approx(sum(kept[k] for k in ("workers", "dispatcher", "trainer_cpu",
                                                                  "trainer_memory", "accelerators")))
    assert kept["total_with_additions"] == pytest.approx(kept["total"] + kept["additions_total"], abs=1e-12)
    assert kept["additions"]["label"] == "not in Equation 1"
    assert kept["additions"]["external_ipv4"]["quantity"] == "10 addresses"
    assert any("Equation 1 does not price" in n for n in kept["notes"])
    assert {"price": "external IPv4 (standard VMs)", "source": GCP.extra_rate("external_ipv4", "standard").source,
            "date": "2025-03"} in kept["price_sources"]

    named = rows["named"]  # from its spec: 100 GB disks; the dispatcher VM runs the supervisor, so it is standard
    assert named["additions_status"] == "from the run's spec"
    assert named["boot_disk_cost"] == pytest.approx(10 * 100 * 0.10 / HOURS * 2, abs=1e-12)
    assert named["ipv4_cost"] == pytest.approx(10 * 0.005 * 2, abs=1e-12)

    older = rows["older"]
    assert older["additions_status"].startswith("not recorded")
    assert older["ipv4_cost"] is None and older["boot_disk_cost"] is None and older["total_with_additions"] is None
    assert older["total"] == pytest.approx(kept["total"])  # Equation 1 does not need them

    local = rows["local"]
    assert local["additions_status"] == "as for a gcp run of this spec"
    assert local["ipv4_cost"] == pytest.approx(kept["ipv4_cost"]) and local["boot_disk_cost"] == pytest.approx(
        kept["boot_disk_cost"])


def test_cost_report_csv_and_table_show_the_additions_or_not_recorded(runs):
    assert set(ADDITION_FIELDS) <= set(FIELDS)
    out = report("kept", "older", "--format", "csv")
    rows = {r["label"]: r for r in csv.DictReader(io.StringIO(out))}
    assert float(rows["kept"]["ipv4_cost"]) == pytest.approx(0.1, abs=1e-12)
    assert float(rows["kept"]["total_with_additions"]) > float(rows["kept"]["total"])
    assert rows["older"]["ipv4_cost"] == "" and rows["older"]["additions_status"].startswith("not recorded")
    assert "external IPv4 (standard VMs): Google VPC pricing" in rows["kept"]["price_sources"]
    table = " ".join(report("kept", "older", "--verbose").split())
    assert "+ external IPv4 │ $0.100 (10 addresses) │ not recorded" in table
    assert "+ boot disks │ $0.137 (10 x 50 GB pd-balanced) │ not recorded" in table
    assert "[sku-2025-03-06]" in table  # a source's brackets are text, not markup


def test_a_run_keeps_what_it_created_when_it_ends(runs):
    """cost_summary, written into the record at the end of every run, keeps gcp.public_ips, the boot disks and the
    VMs, read by the dsctl that ran it, and the additions it priced."""
    summary = cost_summary(runs.get("older"))
    assert summary["created"]["public_ips"] is True and summary["created"]["boot_disk_gb"] == 50
    assert [(g["role"], g["count"]) for g in summary["created"]["vms"]] == [
        ("dispatcher", 1), ("workers", 8), ("trainers", 1)]
    assert summary["additions"]["external_ipv4"]["cost"] == pytest.approx(10 * 0.005 * 2, abs=1e-12)
    assert summary["total"] > 0
