"""The toy provider is a place of its own, added as a plugin is: its folder and the entry point in it, nothing of
dsctl changed. A spec names it once its folder is on the Python path (installed), its machine types are its own, and
its runs, its estimates and its plan are priced from its own catalog with its own extras, never Google Cloud's."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsctl.costmodel import load_catalog
from dsctl.orchestrator.costs import estimate_costs
from dsctl.provisioners.registry import provider_class
from dsctl.specs import SpecError, load_spec, load_spec_text
from dsctl.specs.places import places
from helpers import REPO, write_spec

TOY = Path(__file__).parent
SPEC = """
name: toyrun
provider: toy
service: {workers: 2, worker_machine: toy-small, dispatcher_machine: toy-small}
trainer: {machine: toy-large, steps: 3600}
pipeline: {builtin: synthetic, params: {epochs: null}}
"""
SMALL, LARGE = 2 * 0.01 + 4 * 0.002, 8 * 0.01 + 32 * 0.002  # $/h of toy-small and toy-large at the toy's rates
VOLUME_GB_HOUR = 0.073 / 730  # the toy's scratch volumes, $ per GB-hour
LEASE_HOUR = 0.5


@pytest.fixture
def installed(monkeypatch):
    """The toy's folder on the Python path: its dist-info's entry point registers it, as `pip install` would."""
    monkeypatch.syspath_prepend(str(TOY))


def test_a_spec_names_the_toy_only_once_it_is_installed_and_is_priced_from_its_catalog(installed):
    spec = load_spec_text(SPEC).spec
    assert spec.pricing == str(TOY / "toy-prices.yaml")  # its own catalog, by default
    assert load_catalog(spec.pricing).name == "toy-2026"
    cls = provider_class("toy")
    assert cls is not None and cls.runs_here and cls.stands_in_for is None


def test_without_its_entry_point_the_toy_is_no_place():
    assert "toy" not in places()
    with pytest.raises(SpecError, match="must be 'local' or 'gcp', got 'toy'"):
        load_spec_text(SPEC)


def test_the_toy_plan_prices_its_machines_and_extras_from_its_own_catalog(installed):
    spec = load_spec_text(SPEC).spec
    text = provider_class("toy")().plan_text(spec, None)
    assert "Plan for job 'toyrun' on the toy provider (processes on this machine); prices: toy-2026 (2026-01)" in text
    lines = {line.split()[0]: line.split() for line in text.splitlines()[1:5]}
    assert lines["dispatcher"][1:3] == ["toy-small", "(process)"] and float(lines["dispatcher"][-1]) == pytest.approx(SMALL)
    assert float(lines["workers"][-1]) == pytest.approx(2 * SMALL) and float(lines["trainers"][-1]) == pytest.approx(LARGE)
    assert "scratch volumes: 3 x 10 GB (not in Equation 1)" in text and "lease: 1 lease (not in Equation 1)" in text
    per_hour = 3 * SMALL + LARGE + 3 * 10 * VOLUME_GB_HOUR + LEASE_HOUR
    assert f"{per_hour:.4f}" in text.split("total with additions")[1].splitlines()[0]
    assert "Google" not in text and "IPv4" not in text


def test_a_toy_estimate_has_the_toys_extras_in_columns_of_their_own(installed, tmp_path):
    table = estimate_costs(write_spec(tmp_path, SPEC), batches_per_sec=1.0, steps=3600, basis="vm-hours")
    [row] = table.as_json()
    assert row["prices"] == "toy-2026" and row["total"] == pytest.approx(3 * SMALL + LARGE)  # one hour, whole machines
    assert row["scratch_volume_cost"] == pytest.approx(3 * 10 * VOLUME_GB_HOUR)
    assert row["lease_cost"] == pytest.approx(LEASE_HOUR)
    assert row["additions_status"] == "from the spec" and "ipv4_cost" not in row and "boot_disk_cost" not in row
    assert {s["price"] for s in row["price_sources"]} >= {"toy scratch volume", "toy lease"}


def test_nothing_outside_its_folder_names_the_toy():
    """Adding the toy touched its folder only: no module of dsctl, no doc, no configuration names it."""
    named = [p.relative_to(REPO).as_posix() for folder in ("cli", "costmodel", "dsctl_pkg", "experiments", "orchestrator",
                                                           "provisioners", "runtime", "specs")
             for p in (REPO / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".toml")
             and "contract.toy" in p.read_text(errors="replace")]
    assert named == [] and "contract.toy" not in (REPO / "pyproject.toml").read_text()


def test_hybrid_placement_is_refused_on_a_place_whose_trainers_start_no_in_process_workers(installed, tmp_path):
    """The toy's Place does not say in_process_workers: validate refuses hybrid placement there, at the line, naming
    the places that have it (asked of the Place, never by provider name)."""
    path = tmp_path / "job.yaml"
    path.write_text(SPEC.replace("service: {workers: 2,", "service: {placement: hybrid, local_workers: 1, workers: 2,"))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(f"{path}:4: service.placement: "), message
    assert "not yet available with provider: toy" in message and "provider: 'local' or 'gcp'" in message, message
