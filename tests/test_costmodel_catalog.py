"""Price catalogs: every shipped one loads and prices what it lists; a user's catalog is
validated like a spec, with one-paragraph errors naming file:line and the field; on-demand
(top level) and Spot (`spot:`) prices are looked up by provisioning model, never one for the other;
every Spot and TPU price carries its own source and date, and a catalog without one is refused."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from dsctl.costmodel import MACHINES, ProvisioningError, RunUsage, load_catalog, price, shipped_catalogs
from dsctl.specs import SpecError

GOOD = """
name: mine
date: 2024-03
source: my cloud bill
currency: USD
rates:
  n2: {vcpu_hour: 0.03, gb_hour: 0.004}
machines:
  tpu-v2-8: {per_hour: 4.5, source: my cloud bill, date: 2024-03}
"""

# GOOD plus Spot prices. Lines: 9 spot, 10 rates, 11 n2, 12 machines, 13 tpu-v2-8.
SPOT = GOOD + """spot:
  rates:
    n2: {vcpu_hour: 0.0075, gb_hour: 0.001, source: my cloud bill, date: 2024-03}
  machines:
    tpu-v2-8: {per_hour: 1.35, source: my cloud bill, date: 2024-03}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "prices.yaml"
    p.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return p


def error_of(path: Path) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_catalog(path)
    message = str(info.value)
    # every problem found, each one paragraph of its own
    assert len(message.splitlines()) == len(getattr(info.value, "problems", [info.value]))
    assert "Traceback" not in message and "Input should be" not in message
    return info.value


def test_shipped_catalogs_load_and_price_every_machine_they_list():
    names = shipped_catalogs()
    assert {"paper-2023-06", "gcp-us-central1-2025"} <= set(names)
    for name in names:
        cat = load_catalog(name)
        assert cat.name == name and cat.currency == "USD" and cat.date and cat.source
        assert cat.provisioning_models == ("standard", "spot"), name
        for model in ("standard", "spot"):
            listed = cat.prices(model).machines
            for machine in listed:
                assert machine in MACHINES, f"{name}: no shape for {machine}"
            priced = cat.priced_machines(model)
            assert set(listed) <= set(priced)
            for machine in priced:
                s = cat.split(machine, provisioning=model)
                assert s.total > 0 and min(s.cpu, s.memory, s.accelerators) >= 0
                assert cat.machine_hour(machine, provisioning=model) == pytest.approx(s.total)
                if machine in listed:
                    assert s.total == pytest.approx(listed[machine])


def test_paper_catalog_n2_is_spot_and_the_tpu_on_demand():
    cat = load_catalog("paper-2023-06")
    assert cat.machine_hour("tpu-v2-8") == 4.50
    assert cat.machine_hour("tpu-v2-8", provisioning="standard") == 4.50
    assert cat.machine_hour("n2-standard-8", provisioning="spot") == pytest.approx(0.08, abs=1e-12)
    r = cat.unit_rates("n2-standard-8", provisioning="spot")
    assert 8 * r.cpu + 32 * r.mem == pytest.approx(0.08, abs=1e-12)
    assert (r.cpu, r.mem) == (0.0065, 0.000875)
    shape = cat.machine("tpu-v2-8")
    assert (shape.vcpus, shape.memory_gb, shape.accelerators) == (96, 335, 8)
    # Only the model each price is for: the $0.08/h is not an on-demand n2, the $4.50/h not a Spot TPU.
    assert cat.priced_machines("standard") == ["tpu-v2-8"]
    assert "tpu-v2-8" not in cat.priced_machines("spot") and "n2-standard-8" in cat.priced_machines("spot")
    for call in (cat.split, cat.machine_hour, cat.unit_rates):
        with pytest.raises(ProvisioningError, match=r"only a Spot price for n2-standard-8 \(\$0\.08/h\)"):
            call("n2-standard-8")
        with pytest.raises(ProvisioningError, match=r"only an on-demand price for tpu-v2-8 \(\$4\.50/h\)"):
            call("tpu-v2-8", provisioning="spot")


def test_gcp_catalog_covers_the_families_asked_for():
    cat = load_catalog("gcp-us-central1-2025")
    priced = set(cat.priced_machines())
    for m in ("n2-standard-8", "n2-highcpu-16", "e2-standard-4", "tpu-v2-8", "tpu-v3-8", "tpu-v4-8",
              "tpu-v5litepod-1", "tpu-v5litepod-4", "tpu-v5litepod-8", "a2-highgpu-1g", "a2-highgpu-2g",
              "a2-highgpu-4g", "a2-highgpu-8g", "g2-standard-4", "g2-standard-8", "a3-highgpu-8g"):
        assert m in priced
    assert cat.machine_hour("n2-standard-8") == pytest.approx(8 * 0.031611 + 32 * 0.004237)
    assert cat.machine_hour("a2-highgpu-1g") == pytest.approx(3.673385, rel=1e-6)


def test_gcp_catalog_spot_prices_are_plausible_and_cover_what_it_lists():
    cat = load_catalog("gcp-us-central1-2025")
    spot = set(cat.priced_machines("spot"))
    for m in ("n2-standard-8", "n2-highcpu-16", "e2-standard-4", "tpu-v2-8", "tpu-v3-8", "tpu-v4-8",
              "tpu-v5litepod-1", "tpu-v5litepod-4", "tpu-v5litepod-8", "a2-highgpu-1g", "a2-highgpu-8g",
              "g2-standard-4", "g2-standard-8"):
        assert m in spot
        # Spot is typically 60-91% off on-demand.
        ratio = cat.machine_hour(m, provisioning="spot") / cat.machine_hour(m, provisioning="standard")
        assert 0.09 <= ratio <= 0.40, (m, ratio)
    assert "a3-highgpu-8g" not in spot  # no Spot price known: an error, not the on-demand price
    with pytest.raises(ProvisioningError, match="only an on-demand price for a3-highgpu-8g"):
        cat.machine_hour("a3-highgpu-8g", provisioning="spot")
    # n2-standard-8 Spot was about $0.08/h in 2023 (the paper's price) and about $0.12/h in March 2025 data.
    assert cat.machine_hour("n2-standard-8", provisioning="spot") == pytest.approx(0.119904, abs=1e-9)
    assert cat.unit_rates("a2-highgpu-1g", provisioning="spot").acc == cat.data.spot.rates["a2"].accelerator_hour
    assert cat.unit_rates("a2-highgpu-1g").acc == cat.data.rates["a2"].accelerator_hour


def test_split_machine_hour_and_unit_rates_pick_the_asked_model(tmp_path):
    cat = load_catalog(write(tmp_path, SPOT))
    od, sp = cat.data.rates["n2"], cat.data.spot.rates["n2"]
    assert (od.vcpu_hour, sp.vcpu_hour) == (0.03, 0.0075)  # the test catalog, not the same number twice
    for model, r in (("standard", od), ("spot", sp)):
        s = cat.split("n2-standard-8", provisioning=model)
        assert (s.cpu, s.memory, s.accelerators) == pytest.approx((8 * r.vcpu_hour, 32 * r.gb_hour, 0.0))
        assert cat.machine_hour("n2-standard-4", provisioning=model) == pytest.approx(4 * r.vcpu_hour + 16 * r.gb_hour)
        u = cat.unit_rates("n2-highmem-16", provisioning=model)
        assert (u.cpu, u.mem) == pytest.approx((r.vcpu_hour, r.gb_hour))
    assert cat.machine_hour("tpu-v2-8") == cat.data.machines["tpu-v2-8"] == 4.5
    assert cat.machine_hour("tpu-v2-8", provisioning="spot") == cat.data.spot.machines["tpu-v2-8"] == 1.35
    assert cat.split("n2-standard-8") == cat.split("n2-standard-8", provisioning="standard")  # the default
    with pytest.raises(SpecError, match="must be 'standard' .* or 'spot' .*, got 'preemptible'"):
        cat.split("n2-standard-8", provisioning="preemptible")


def test_no_silent_fallback_between_models(tmp_path):
    """A model with no (or an incomplete) price for a machine is an error, never the other model's price."""
    on_demand_only = load_catalog(write(tmp_path, GOOD))
    assert on_demand_only.provisioning_models == ("standard",)
    with pytest.raises(ProvisioningError) as info:
        on_demand_only.machine_hour("n2-standard-8", provisioning="spot")
    msg = str(info.value)
    assert msg.startswith("catalog mine has only an on-demand price for n2-standard-8 ($0.368/h)")
    assert "not the Spot price (provisioning: spot)" in msg and "\n" not in msg
    assert "set service.provisioning: standard (dispatcher and workers) or trainer.provisioning: standard" in msg
    assert "or use pricing: gcp-us-central1-2025 or paper-2023-06 (--prices gcp-us-central1-2025) for Spot prices" in msg
    # Spot n2 rates without a memory rate: Spot n2 machines are not priced, even though on-demand ones are.
    partial = load_catalog(write(tmp_path, SPOT.replace(", gb_hour: 0.001,", ",")))
    assert "n2-standard-8" not in partial.priced_machines("spot")
    for call in (partial.split, partial.machine_hour, partial.unit_rates):
        with pytest.raises(SpecError):
            call("n2-standard-8", provisioning="spot")
    spot_only = load_catalog(write(tmp_path, GOOD.replace("rates:\n  n2", "spot:\n  rates:\n    n2")
                                   .replace("gb_hour: 0.004}", "gb_hour: 0.004, source: bill, date: 2024-03}")
                                   .replace("machines:\n  tpu", "  machines:\n    tpu")))
    assert spot_only.provisioning_models == ("spot",) and spot_only.priced_machines("standard") == []
    with pytest.raises(ProvisioningError, match=r"only a Spot price for tpu-v2-8 \(\$4\.50/h\)"):
        spot_only.split("tpu-v2-8")


def test_asking_for_a_missing_model_names_the_model_and_the_field(tmp_path):
    paper = load_catalog("paper-2023-06")
    service = RunUsage(job_time_s=3600, trainer_machine="tpu-v2-8", n_workers=2, worker_machine="n2-standard-8",
                       dispatcher_machine="n2-standard-8")
    for basis in ("vm-hours", "utilization"):
        with pytest.raises(SpecError) as info:
            price(service, paper, basis)
        msg = str(info.value)
        assert msg.startswith("catalog paper-2023-06 has only a Spot price for n2-standard-8 ($0.08/h)")
        assert "not the on-demand price (provisioning: standard)" in msg and "needed to price the workers" in msg
        assert "set service.provisioning: spot to price the service" in msg
        assert "pricing: gcp-us-central1-2025" in msg and "trainer.provisioning" not in msg and "\n" not in msg
    measured = RunUsage(job_time_s=3600, trainer_machine="tpu-v2-8", n_workers=2, worker_machine="n2-standard-8",
                        worker_avg_cpu_cores=1.0, worker_avg_mem_gb=2.0)
    with pytest.raises(SpecError, match="needed by the utilization basis to charge the workers on measured use: "
                                        "set service.provisioning: spot"):
        price(measured, paper)
    spot_tpu = RunUsage(job_time_s=3600, trainer_machine="tpu-v2-8", trainer_provisioning="spot")
    with pytest.raises(SpecError) as info:
        price(spot_tpu, paper)
    msg = str(info.value)
    assert msg.startswith("catalog paper-2023-06 has only an on-demand price for tpu-v2-8 ($4.50/h)")
    assert "not the Spot price (provisioning: spot)" in msg and "set trainer.provisioning: standard" in msg
    assert "service.provisioning" not in msg and "pricing: gcp-us-central1-2025" in msg
    with pytest.raises(SpecError, match="service_provisioning .* must be 'standard' .* or 'spot'"):
        price(RunUsage(job_time_s=3600, trainer_machine="tpu-v2-8", service_provisioning="on-demand"), paper)
    with pytest.raises(SpecError, match="trainer_provisioning .* got 'Spot'"):
        price(RunUsage(job_time_s=3600, trainer_machine="tpu-v2-8", trainer_provisioning="Spot"), paper)


def test_user_catalog_by_path(tmp_path):
    cat = load_catalog(write(tmp_path, GOOD))
    assert cat.name == "mine" and cat.machine_hour("n2-standard-4") == pytest.approx(4 * 0.03 + 16 * 0.004)


def test_unknown_catalog_name_lists_shipped():
    with pytest.raises(SpecError, match=r"unknown price catalog 'paper-2023'\. Shipped catalogs: paper-2023-06"):
        load_catalog("paper-2023")


def test_unknown_machine_type_lists_closest_first():
    cat = load_catalog("paper-2023-06")
    with pytest.raises(SpecError) as info:
        cat.machine("n2-standrad-8")
    known = str(info.value).split("closest first: ")[1]
    assert known.startswith("n2-standard-8, ")
    with pytest.raises(SpecError, match=r"closest first: tpu-v2-8"):
        price(RunUsage(job_time_s=60, trainer_machine="tpu-v2-9"), cat)


@pytest.mark.parametrize(
    "text, line, field, words",
    [
        (GOOD.replace("vcpu_hour", "vcpu_hours"), 6, "rates.n2.vcpu_hours",
         "unknown key 'vcpu_hours'. Did you mean 'vcpu_hour'?"),
        (GOOD + "currenc: USD\n", 9, "currenc", "unknown key 'currenc'"),
        (GOOD.replace("per_hour: 4.5", "per_hour: -4.5"), 8, "machines.tpu-v2-8.per_hour", "zero or more; got -4.5"),
        (GOOD + "  n2-standard-8: -0.5\n", 9, "machines.n2-standard-8", "zero or more; got -0.5"),
        (GOOD + "  n2-standard-8: lots\n", 9, "machines.n2-standard-8", "must be a number, got 'lots'"),
        (GOOD.replace("gb_hour: 0.004", "gb_hour: -0.004"), 6, "rates.n2.gb_hour", "zero or more"),
        (GOOD.replace("gb_hour: 0.004}", "gb_hour: 0.004"), 7, "rates.n2", "not valid YAML"),  # seen on the next line
        (GOOD.replace("tpu-v2-8: {", "tpu-v2-9: {"), 8, "machines.tpu-v2-9", "closest first: tpu-v2-8"),
        (GOOD.replace("  n2:", "  n3:"), 6, "rates.n3", "unknown machine family"),
        (GOOD.replace("currency: USD", "currency: EUR"), 4, "currency", "only USD"),
        (GOOD.replace("source: my cloud bill\n", ""), 1, "source", "required"),
        (GOOD.replace("date: 2024-03\n", "date: last june\n"), 2, "date", "2023-06"),
        (GOOD + "  n2-standard-8: 0.5\n", 9, "machines.n2-standard-8", "rates add up to $0.3680/h"),
        (GOOD.replace("per_hour: 4.5", "per_hour: 1.0").replace("  n2: {vcpu_hour: 0.03, gb_hour: 0.004}",
                                                                "  tpu-v2: {vcpu_hour: 0.03, gb_hour: 0.004, "
                                                                "source: bill, date: 2024-03}"), 8,
         "machines.tpu-v2-8", "host alone costs"),
        # The spot section: the same checks, pointing into it.
        (SPOT.replace("vcpu_hour: 0.0075", "vcpu_hours: 0.0075"), 11, "spot.rates.n2.vcpu_hours",
         "unknown key 'vcpu_hours'. Did you mean 'vcpu_hour'?"),
        (SPOT.replace("per_hour: 1.35", "per_hour: -1.35"), 13, "spot.machines.tpu-v2-8.per_hour",
         "zero or more; got -1.35"),
        (SPOT.replace("gb_hour: 0.001,", "gb_hour: -0.001,"), 11, "spot.rates.n2.gb_hour", "zero or more"),
        (SPOT.replace("  machines:\n    tpu", "  machine:\n    tpu"), 12, "spot.machine",
         "unknown key 'machine'. Did you mean 'machines'?"),
        (SPOT + "  currency: USD\n", 14, "spot.currency", "unknown key 'currency'"),
        (GOOD + "spot: 0.08\n", 9, "spot", "mapping"),
        (SPOT.replace("    tpu-v2-8: {", "    tpu-v2-9: {"), 13, "spot.machines.tpu-v2-9", "closest first: tpu-v2-8"),
        (SPOT.replace("    n2:", "    n3:"), 11, "spot.rates.n3", "unknown machine family"),
        (SPOT + "    n2-standard-8: 0.05\n", 14, "spot.machines.n2-standard-8", "Spot n2 rates add up to $0.0920/h"),
        (SPOT.replace("per_hour: 1.35", "per_hour: 5.0"), 13, "spot.machines.tpu-v2-8",
         "costs $5.00/h as a Spot VM but $4.50/h on demand"),
        (SPOT.replace("vcpu_hour: 0.0075", "vcpu_hour: 0.3"), 11, "spot.rates.n2", "never cost more than on-demand"),
        # Every Spot and TPU price says where it comes from and when: one without is refused at its line.
        (SPOT.replace("    tpu-v2-8: {per_hour: 1.35, source: my cloud bill, date: 2024-03}", "    tpu-v2-8: 1.35"),
         13, "spot.machines.tpu-v2-8", "the Spot price of tpu-v2-8 has no source and date"),
        (GOOD.replace("  tpu-v2-8: {per_hour: 4.5, source: my cloud bill, date: 2024-03}", "  tpu-v2-8: 4.5"),
         8, "machines.tpu-v2-8", "the TPU price of tpu-v2-8 has no source and date"),
        (SPOT + "    n2-standard-8: 0.092\n", 14, "spot.machines.n2-standard-8",
         "the Spot price of n2-standard-8 has no source and date"),
        (SPOT.replace("gb_hour: 0.001, source: my cloud bill, date: 2024-03}", "gb_hour: 0.001}"), 11, "spot.rates.n2",
         "the Spot rates of n2 have no source and date"),
        (SPOT.replace("gb_hour: 0.001, source: my cloud bill,", "gb_hour: 0.001,"), 11, "spot.rates.n2",
         "have no source: add 'source:"),
        (GOOD.replace("  n2: {vcpu_hour: 0.03, gb_hour: 0.004}", "  tpu-v2: {accelerator_hour: 0.5}")
         .replace("  tpu-v2-8: {per_hour: 4.5, source: my cloud bill, date: 2024-03}", "  tpu-v3-8: {per_hour: 8, "
                  "source: bill, date: 2024-03}"), 6, "rates.tpu-v2", "the TPU rates of tpu-v2 have no source and date"),
        (GOOD.replace(", date: 2024-03}", "}"), 8, "machines.tpu-v2-8.date", "required"),
        (GOOD.replace("date: 2024-03}", "date: March}"), 8, "machines.tpu-v2-8.date", "2023-06 or 2023-06-30"),
        (GOOD.replace("source: my cloud bill,", "sorce: my cloud bill,"), 8, "machines.tpu-v2-8.sorce",
         "unknown key 'sorce'. Did you mean 'source'?"),
        (GOOD.replace("source: my cloud bill,", "source: '',"), 8, "machines.tpu-v2-8.source", "must not be empty"),
        # The additions to Equation 1 carry theirs too.
        (GOOD + "external_ipv4:\n  standard: {per_hour: 0.005}\n", 10, "external_ipv4.standard.source", "required"),
        (GOOD + "external_ipv4:\n  ondemand: {per_hour: 0.005, source: s, date: 2025-03}\n", 10,
         "external_ipv4.ondemand.[key]", "must be 'standard' or 'spot', got 'ondemand'"),
        (GOOD + "boot_disks:\n  pd-ssd: {per_gb_month: -1, source: s, date: 2025-03}\n", 10,
         "boot_disks.pd-ssd.per_gb_month", "zero or more"),
    ],
)
def test_malformed_catalog_names_file_line_and_field(tmp_path, text, line, field, words):
    path = write(tmp_path, text)
    err = error_of(path)
    assert err.where == f"{path}:{line}", str(err)
    assert err.field == field
    assert words in str(err)
    assert str(err).startswith(f"{path}:{line}: ")


def test_empty_or_non_mapping_catalog(tmp_path):
    assert "empty file" in str(error_of(write(tmp_path, "")))
    assert "got a list" in str(error_of(write(tmp_path, "- 1\n- 2\n")))


def test_missing_resource_price_names_the_resource(tmp_path):
    cat = load_catalog(write(tmp_path, GOOD.replace(", gb_hour: 0.004", "")))
    usage = RunUsage(job_time_s=3600, trainer_machine="tpu-v2-8", n_workers=2, worker_machine="n2-standard-8",
                     worker_avg_cpu_cores=2.0, worker_avg_mem_gb=4.0)
    with pytest.raises(SpecError) as info:
        price(usage, cat, "utilization")
    msg = str(info.value)
    assert re.search(r"catalog mine has no on-demand price \(provisioning: standard\) for memory \(GB-hour\) of n2 "
                     r"machines \(n2-standard-8\), needed by the utilization basis to charge the workers", msg)
    assert "gb_hour" in msg and "\n" not in msg
    paper = load_catalog("paper-2023-06")
    for model, label in (("standard", "on-demand"), ("spot", "Spot")):
        with pytest.raises(SpecError, match=rf"no {label} price \(provisioning: {model}\) for vCPU \(vCPU-hour\) of e2 "
                                            r"machines \(e2-standard-8\), needed to price the workers"):
            price(RunUsage(job_time_s=3600, trainer_machine="tpu-v2-8", n_workers=1, worker_machine="e2-standard-8",
                           service_provisioning=model), paper, "vm-hours")
    with pytest.raises(SpecError, match=r"'spot: \{rates: \{e2: \{vcpu_hour: \.\.\.\}\}\}'"):
        paper.split("e2-standard-8", provisioning="spot")
    no_gpu_price = write(tmp_path, GOOD.replace("rates:\n", "rates:\n  a2: {vcpu_hour: 0.03, gb_hour: 0.004}\n"))
    with pytest.raises(SpecError, match=r"no on-demand price \(provisioning: standard\) for accelerators "
                                        r"\(accelerator-hour\) of a2 machines"):
        price(RunUsage(job_time_s=3600, trainer_machine="a2-highgpu-1g"), load_catalog(no_gpu_price))
