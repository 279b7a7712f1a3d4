"""Price catalogs: every shipped one loads and prices what it lists; a user's catalog is
validated like a spec, with one-paragraph errors naming file:line and the field."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from dsctl.costmodel import MACHINES, RunUsage, load_catalog, price, shipped_catalogs
from dsctl.specs import SpecError

GOOD = """
name: mine
date: 2024-03
source: my cloud bill
currency: USD
rates:
  n2: {vcpu_hour: 0.03, gb_hour: 0.004}
machines:
  tpu-v2-8: 4.5
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "prices.yaml"
    p.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return p


def error_of(path: Path) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_catalog(path)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message and "Input should be" not in message
    return info.value


def test_shipped_catalogs_load_and_price_every_machine_they_list():
    names = shipped_catalogs()
    assert {"paper-2023-06", "gcp-us-central1-2025"} <= set(names)
    for name in names:
        cat = load_catalog(name)
        assert cat.name == name and cat.currency == "USD" and cat.date and cat.source
        for machine in cat.data.machines:
            assert machine in MACHINES, f"{name}: no shape for {machine}"
        priced = cat.priced_machines()
        assert set(cat.data.machines) <= set(priced)
        for machine in priced:
            s = cat.split(machine)
            assert s.total > 0 and min(s.cpu, s.memory, s.accelerators) >= 0
            assert cat.machine_hour(machine) == pytest.approx(s.total)


def test_paper_catalog_prices_and_split():
    cat = load_catalog("paper-2023-06")
    assert cat.machine_hour("tpu-v2-8") == 4.50
    assert cat.machine_hour("n2-standard-8") == pytest.approx(0.08, abs=1e-12)
    r = cat.unit_rates("n2-standard-8")
    assert 8 * r.cpu + 32 * r.mem == pytest.approx(0.08, abs=1e-12)
    shape = cat.machine("tpu-v2-8")
    assert (shape.vcpus, shape.memory_gb, shape.accelerators) == (96, 335, 8)


def test_gcp_catalog_covers_the_families_asked_for():
    cat = load_catalog("gcp-us-central1-2025")
    priced = set(cat.priced_machines())
    for m in ("n2-standard-8", "n2-highcpu-16", "e2-standard-4", "tpu-v2-8", "tpu-v3-8", "tpu-v4-8",
              "tpu-v5litepod-1", "tpu-v5litepod-4", "tpu-v5litepod-8", "a2-highgpu-1g", "a2-highgpu-2g",
              "a2-highgpu-4g", "a2-highgpu-8g", "g2-standard-4", "g2-standard-8", "a3-highgpu-8g"):
        assert m in priced
    assert cat.machine_hour("n2-standard-8") == pytest.approx(8 * 0.031611 + 32 * 0.004237)
    assert cat.machine_hour("a2-highgpu-1g") == pytest.approx(3.673385, rel=1e-6)


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
        (GOOD.replace("vcpu_hour", "vcpu_hours"), 6, "rates.n2.vcpu_hours", "unknown key 'vcpu_hours'. Did you mean 'vcpu_hour'?"),
        (GOOD + "currenc: USD\n", 9, "currenc", "unknown key 'currenc'"),
        (GOOD.replace("tpu-v2-8: 4.5", "tpu-v2-8: -4.5"), 8, "machines.tpu-v2-8", "zero or more; got -4.5"),
        (GOOD.replace("gb_hour: 0.004", "gb_hour: -0.004"), 6, "rates.n2.gb_hour", "zero or more"),
        (GOOD.replace("gb_hour: 0.004}", "gb_hour: 0.004"), 7, None, "not valid YAML"),  # seen on the next line
        (GOOD.replace("tpu-v2-8: 4.5", "tpu-v2-9: 4.5"), 8, "machines.tpu-v2-9", "closest first: tpu-v2-8"),
        (GOOD.replace("  n2:", "  n3:"), 6, "rates.n3", "unknown machine family"),
        (GOOD.replace("currency: USD", "currency: EUR"), 4, "currency", "only USD"),
        (GOOD.replace("source: my cloud bill\n", ""), 1, "source", "required"),
        (GOOD.replace("date: 2024-03", "date: last june"), 2, "date", "2023-06"),
        (GOOD + "  n2-standard-8: 0.5\n", 9, "machines.n2-standard-8", "rates add up to $0.3680/h"),
        (GOOD.replace("tpu-v2-8: 4.5", "tpu-v2-8: 1.0").replace("  n2:", "  tpu-v2:"), 8,
         "machines.tpu-v2-8", "host alone costs"),
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
    assert re.search(r"catalog mine has no price for memory \(GB-hour\) of n2 machines \(n2-standard-8\), "
                     r"needed by the utilization basis to charge the workers", msg)
    assert "gb_hour" in msg and "\n" not in msg
    paper = load_catalog("paper-2023-06")
    with pytest.raises(SpecError, match=r"no price for vCPU \(vCPU-hour\) of e2 machines \(e2-standard-8\), needed to price the workers"):
        price(RunUsage(job_time_s=3600, trainer_machine="tpu-v2-8", n_workers=1, worker_machine="e2-standard-8"),
              paper, "vm-hours")
    no_gpu_price = write(tmp_path, GOOD.replace("rates:\n", "rates:\n  a2: {vcpu_hour: 0.03, gb_hour: 0.004}\n"))
    with pytest.raises(SpecError, match=r"no price for accelerators \(accelerator-hour\) of a2 machines"):
        price(RunUsage(job_time_s=3600, trainer_machine="a2-highgpu-1g"), load_catalog(no_gpu_price))
