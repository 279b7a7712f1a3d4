"""The plan before `dsctl up` on gcp: a line per addition to the paper's Equation 1 (the VMs' external IPv4
addresses, their boot disks), labelled so, priced from the spec's catalog; and a note for any price of it
the catalog did not re-check. Creates nothing, needs no credentials."""

from __future__ import annotations

import pytest

from dsctl.specs import load_spec, load_spec_text
from helpers import EXAMPLES

HOURS = 730.0
IP = {"standard": 0.005, "spot": 0.0025}


def resnet(**gcp):
    spec = load_spec(EXAMPLES / "gcp-resnet50.yaml").spec
    return spec.model_copy(update={"pricing": "gcp-us-central1-2025",
                                   "gcp": spec.gcp.model_copy(update=gcp)})


def test_plan_has_a_line_per_addition_labelled_not_in_equation_1(no_credentials):
    from dsctl.provisioners.gcp import plan

    p = plan(resnet())
    ipv4, disks = p.additions
    assert (ipv4.name, disks.name) == ("external IPv4", "boot disks")
    assert ipv4.label == disks.label == "not in Equation 1"
    # One address per VM, TPU VM included, at the rate of how each is bought.
    assert ipv4.count == 18 and ipv4.quantity == "18 addresses"
    assert ipv4.per_hour == pytest.approx(sum(line.count * IP[line.provisioning] for line in p.lines), abs=1e-12)
    # A 50 GB pd-balanced boot disk per Compute Engine VM: the TPU VM's comes with it.
    assert disks.count == 17 and disks.quantity == "17 x 50 GB pd-balanced"
    assert disks.per_hour == pytest.approx(17 * 50 * 0.10 / HOURS, abs=1e-12)
    # Over the estimated job, beside the machines' cost, never in it.
    assert ipv4.cost == pytest.approx(ipv4.per_hour * p.job_hours) and disks.cost == pytest.approx(
        disks.per_hour * p.job_hours)
    assert p.per_hour == pytest.approx(sum(line.per_hour for line in p.lines))
    text = p.render()
    assert "external IPv4: 18 addresses (not in Equation 1)" in text
    assert "boot disks: 17 x 50 GB pd-balanced (not in Equation 1)" in text
    assert f"{p.per_hour + ipv4.per_hour + disks.per_hour:.4f}" in text.split("total with additions")[1].splitlines()[0]
    assert "Additions (not in Equation 1): external IPv4 $" in text and "with them, at least $" in text
    assert any("TPU VMs' external addresses are charged as any VM's" in n for n in p.notes)
    assert any("no boot disk added" in n for n in p.notes)
    d = p.as_dict()
    assert d["additions"][0]["label"] == "not in Equation 1"
    assert d["additions_per_hour"] == pytest.approx(ipv4.per_hour + disks.per_hour)
    assert d["additions_cost"] == pytest.approx(ipv4.cost + disks.cost)


def test_plan_additions_follow_the_gcp_settings(no_credentials):
    from dsctl.provisioners.gcp import plan

    internal = plan(resnet(public_ips=False))
    assert internal.additions[0].per_hour == 0.0 and "gcp.public_ips: false" in internal.additions[0].quantity
    ssd = plan(resnet(boot_disk_gb=200, boot_disk_type="pd-ssd"))
    assert ssd.additions[1].per_hour == pytest.approx(17 * 200 * 0.17 / HOURS, abs=1e-12)
    unknown = plan(resnet(boot_disk_type="hyperdisk-balanced"))
    assert unknown.additions[1].per_hour is None
    row = next(line for line in unknown.render().splitlines() if "boot disks:" in line)
    assert row.rstrip().endswith("?")  # not priced: no number
    assert any("boot disks not priced: catalog gcp-us-central1-2025 has no price for hyperdisk-balanced" in n
               for n in unknown.notes)


def test_plan_with_the_papers_catalog_shows_the_additions_unpriced(no_credentials):
    """The paper priced machines only: its catalog has no address or disk prices, and the plan says so."""
    from dsctl.provisioners.gcp import plan

    spec = load_spec(EXAMPLES / "gcp-resnet50.yaml").spec
    p = plan(spec)
    assert [a.per_hour for a in p.additions] == [None, None] and p.additions_cost is None
    assert any("external IPv4 not priced: catalog paper-2023-06 has no price" in n for n in p.notes)


def test_plan_without_a_length_gives_the_additions_per_hour(no_credentials):
    from dsctl.provisioners.gcp import plan

    spec = load_spec_text("name: g\nprovider: gcp\ntrainer: {machine: e2-standard-2, steps: 10, model: {kind: python, "
                          "entrypoint: 'm:step'}}\npipeline: {builtin: synthetic}\npricing: gcp-us-central1-2025\n"
                          "gcp: {project: acme-ml, zone: us-central1-b}\nservice: {workers: 1, worker_machine: "
                          "e2-standard-2, dispatcher_machine: e2-standard-2}\n").spec
    p = plan(spec)
    assert p.job_cost is None and [a.cost for a in p.additions] == [None, None]
    assert p.additions[0].per_hour == pytest.approx(3 * 0.005) and p.additions[1].per_hour == pytest.approx(
        3 * 50 * 0.10 / HOURS)
    assert f"${p.per_hour + p.additions_per_hour:.2f} with the additions (not in Equation 1)" in p.render()


def test_plan_notes_a_price_the_catalog_did_not_re_check(no_credentials):
    from dsctl.provisioners.gcp import plan

    spec = resnet()
    spot_tpu = spec.model_copy(update={"trainer": spec.trainer.model_copy(update={"provisioning": "spot"})})
    p = plan(spot_tpu)
    assert any(n.startswith("the catalog's price of tpu-v2-8 (Spot) is not re-checked:") for n in p.notes)
    assert not any("price of n2" in n for n in p.notes)  # checked prices are not noted
