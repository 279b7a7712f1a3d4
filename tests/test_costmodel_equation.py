"""Equation 1 and the vm-hours basis: the paper's ResNet50 arithmetic to the cent, and the
utilization basis against hand-computed values, including the paper's rule that workers
are charged on what they used and trainer hosts on what they have; each part priced at the
catalog's prices for how it is bought (on-demand or Spot)."""

from __future__ import annotations

import pytest

from dsctl.costmodel import Rates, RunUsage, compare, equation_1, load_catalog, price

STEPS = 112_320  # paper §4.2: ResNet50, batch 1024


@pytest.fixture(scope="module")
def paper():
    return load_catalog("paper-2023-06")


@pytest.fixture(scope="module")
def gcp():
    return load_catalog("gcp-us-central1-2025")


def resnet(bps: float, workers: int) -> RunUsage:
    # The paper's $0.08/h n2-standard-8 is a Spot price; its $4.50/h TPU v2-8 on-demand.
    return RunUsage(
        job_time_s=STEPS / bps, batches=STEPS, trainer_machine="tpu-v2-8",
        n_workers=workers, worker_machine="n2-standard-8" if workers else None,
        dispatcher_machine="n2-standard-8" if workers else None,
        service_provisioning="spot", trainer_provisioning="standard",
    )


def test_paper_resnet50_worked_example_vm_hours(paper):
    colocated = price(resnet(1.75, 0), paper, "vm-hours")
    disagg = price(resnet(4.5, 16), paper, "vm-hours")
    assert round(colocated.total, 2) == 80.23 and round(colocated.total, 1) == 80.2
    assert round(disagg.total, 2) == 40.63 and round(disagg.total, 1) == 40.6
    assert round(disagg.service, 1) == 9.4          # 16 workers + 1 dispatcher
    assert round(disagg.trainers, 1) == 31.2        # the TPU VM
    assert round(disagg.workers, 2) == 8.87 and round(disagg.dispatcher, 2) == 0.55
    c = compare(colocated, disagg)
    assert f"{c.cost_saving:.2f}" == "1.97" and f"{c.speedup:.2f}" == "2.57"
    assert disagg.per_1000_batches == pytest.approx(disagg.total / 112.32)
    assert (disagg.service_provisioning, disagg.trainer_provisioning) == ("spot", "standard")
    assert (colocated.service_provisioning, colocated.trainer_provisioning) == (None, "standard")  # no service
    assert any("Spot prices are used for the workers and dispatcher (on-demand prices for the trainers)" in n
               for n in disagg.notes)
    assert not any("Spot" in n for n in colocated.notes)


def test_single_rates_give_equation_1_literally():
    r = Rates(cpu=0.03, mem=0.004, acc=1.5)
    t_s, n_w, cpu_w, mem_w, n_t, cpu_t, mem_t, n_acc = 5400.0, 7, 2.5, 6.0, 3, 96, 335, 8
    b = equation_1(t_s, n_w=n_w, avg_cpu_w=cpu_w, avg_mem_w=mem_w, n_t=n_t, cpu_a_t=cpu_t,
                   mem_a_t=mem_t, n_acc_t=n_acc, rates=r, dispatcher_cpu=0.4, dispatcher_mem=1.0)
    t = 1.5
    paper_c = t * (r.cpu * (n_w * cpu_w + n_t * cpu_t) + r.mem * (n_w * mem_w + n_t * mem_t) + r.acc * n_t * n_acc)
    dispatcher = t * (r.cpu * 0.4 + r.mem * 1.0)
    assert b.total == pytest.approx(paper_c + dispatcher, rel=1e-12)
    assert b.dispatcher == pytest.approx(dispatcher)
    assert b.accelerators == pytest.approx(t * r.acc * n_t * n_acc)


def measured(**over) -> RunUsage:
    base = dict(job_time_s=7200, batches=10_000, trainer_machine="tpu-v2-8", n_workers=4,
                worker_machine="n2-standard-8", worker_avg_cpu_cores=3.0, worker_avg_mem_gb=10.0,
                dispatcher_machine="n2-standard-8", dispatcher_avg_cpu_cores=0.5, dispatcher_avg_mem_gb=2.0)
    return RunUsage(**{**base, **over})


SPOT_SERVICE = dict(service_provisioning="spot")  # how the paper's catalog prices n2 workers


def test_utilization_basis_paper_catalog_by_hand(paper):
    b = price(measured(**SPOT_SERVICE), paper, "utilization")
    # n2 rates of the paper catalog: $0.0065/vCPU-h, $0.000875/GB-h; 2 hours.
    assert b.workers == pytest.approx(2 * 4 * (3.0 * 0.0065 + 10.0 * 0.000875))  # 0.226
    assert b.dispatcher == pytest.approx(2 * (0.5 * 0.0065 + 2.0 * 0.000875))    # 0.01
    assert b.accelerators == pytest.approx(2 * 4.50)                              # TPU VM, host included
    assert b.trainer_cpu == 0 and b.trainer_memory == 0
    assert b.total == pytest.approx(9.236)


def test_utilization_basis_gcp_catalog_by_hand(gcp):
    u = measured(trainer_machine="a2-highgpu-1g", n_trainers=2, worker_machine="e2-standard-8")
    b = price(u, gcp, "utilization")
    assert b.trainer_cpu == pytest.approx(2 * 2 * 12 * 0.031611)
    assert b.trainer_memory == pytest.approx(2 * 2 * 85 * 0.004237)
    assert b.accelerators == pytest.approx(2 * 2 * 1 * 2.933908)
    assert b.workers == pytest.approx(2 * 4 * (3.0 * 0.021811 + 10.0 * 0.002923))  # e2 rates
    assert b.dispatcher == pytest.approx(2 * (0.5 * 0.031611 + 2.0 * 0.004237))    # n2 rates
    # The trainer part is the A2 VM's list price, whatever the basis.
    vm = price(u, gcp, "vm-hours")
    assert vm.trainers == pytest.approx(b.trainers) == pytest.approx(2 * 2 * 3.673385, rel=1e-6)


def test_workers_charged_on_used_trainers_on_available(paper, gcp):
    for catalog, trainer, how in ((paper, "tpu-v2-8", SPOT_SERVICE), (gcp, "a2-highgpu-1g", {})):
        base = price(measured(trainer_machine=trainer, **how), catalog)
        busier = price(measured(trainer_machine=trainer, worker_avg_cpu_cores=6.0, worker_avg_mem_gb=20.0, **how), catalog)
        assert busier.workers > base.workers and busier.trainers == base.trainers
        idle_trainer = price(measured(trainer_machine=trainer, trainer_avg_cpu_cores=1.0, trainer_avg_mem_gb=5.0, **how),
                             catalog)
        busy_trainer = price(measured(trainer_machine=trainer, trainer_avg_cpu_cores=90.0, trainer_avg_mem_gb=300.0,
                                      **how), catalog)
        assert idle_trainer.total == busy_trainer.total == base.total


def test_unknown_utilization_charges_whole_machines_and_says_so(paper):
    u = measured(worker_avg_cpu_cores=None, dispatcher_avg_mem_gb=None, **SPOT_SERVICE)
    b = price(u, paper, "utilization")
    assert b.workers == pytest.approx(2 * 4 * 0.08) and b.dispatcher == pytest.approx(2 * 0.08)
    assert any("whole machines" in n and "4 x n2-standard-8" in n for n in b.notes)
    # Whole machines are the most the utilization basis can charge: equal to vm-hours.
    assert b.total == pytest.approx(price(u, paper, "vm-hours").total)


def test_bases_differ_only_in_the_service(paper):
    u = measured(**SPOT_SERVICE)
    util, vm = price(u, paper, "utilization"), price(u, paper, "vm-hours")
    assert util.trainers == vm.trainers
    assert util.service < vm.service


def test_fewer_accelerators_than_the_machine(gcp):
    u = measured(trainer_machine="a2-highgpu-4g", accelerators_per_trainer=2)
    util, vm = price(u, gcp, "utilization"), price(u, gcp, "vm-hours")
    assert util.accelerators == pytest.approx(2 * 2 * 2.933908)       # n_ACC/T = 2
    assert vm.accelerators == pytest.approx(2 * 4 * 2.933908)         # the whole VM
    assert any("2 of the 4 accelerators" in n for n in util.notes)


def test_bad_usage_is_a_spec_error(paper):
    from dsctl.specs import SpecError

    with pytest.raises(SpecError, match="accelerators_per_trainer is 16 but a tpu-v2-8 has 8"):
        price(measured(accelerators_per_trainer=16, **SPOT_SERVICE), paper)
    with pytest.raises(SpecError, match="unknown cost basis 'hourly'"):
        price(measured(**SPOT_SERVICE), paper, "hourly")
    with pytest.raises(SpecError, match="job time"):
        price(measured(job_time_s=0, **SPOT_SERVICE), paper)
    with pytest.raises(SpecError, match="worker avg cpu cores"):
        price(measured(worker_avg_cpu_cores=-1.0, **SPOT_SERVICE), paper)


@pytest.mark.parametrize("basis", ["vm-hours", "utilization"])
def test_spot_service_and_on_demand_trainers_each_at_their_own_prices(gcp, basis):
    """service.provisioning spot, trainer.provisioning standard: workers and dispatcher at the catalog's Spot
    prices, the TPU at its on-demand price; and the other way round. Expected values come from the catalog."""
    n2_spot, n2_od = gcp.data.spot.rates["n2"], gcp.data.rates["n2"]
    tpu_od, tpu_spot = gcp.data.machines["tpu-v2-8"], gcp.data.spot.machines["tpu-v2-8"]
    assert n2_spot.vcpu_hour < n2_od.vcpu_hour and n2_spot.gb_hour < n2_od.gb_hour and tpu_spot < tpu_od
    hours = 2.0

    def expected_service(r):
        if basis == "vm-hours":  # 4 workers + 1 dispatcher, whole n2-standard-8 VMs
            return 4 * hours * (8 * r.vcpu_hour + 32 * r.gb_hour), hours * (8 * r.vcpu_hour + 32 * r.gb_hour)
        return (4 * hours * (3.0 * r.vcpu_hour + 10.0 * r.gb_hour), hours * (0.5 * r.vcpu_hour + 2.0 * r.gb_hour))

    b = price(measured(service_provisioning="spot", trainer_provisioning="standard"), gcp, basis)
    workers, dispatcher = expected_service(n2_spot)
    assert b.workers == pytest.approx(workers) and b.dispatcher == pytest.approx(dispatcher)
    assert b.trainers == pytest.approx(hours * tpu_od) and b.accelerators == pytest.approx(hours * tpu_od)
    assert (b.service_provisioning, b.trainer_provisioning) == ("spot", "standard")
    assert any("Spot prices are used for the workers and dispatcher (on-demand prices for the trainers)" in n
               for n in b.notes)
    assert any("only as a whole machine (on-demand price)" in n for n in b.notes)

    r = price(measured(service_provisioning="standard", trainer_provisioning="spot"), gcp, basis)
    workers, dispatcher = expected_service(n2_od)
    assert r.workers == pytest.approx(workers) and r.dispatcher == pytest.approx(dispatcher)
    assert r.trainers == pytest.approx(hours * tpu_spot)
    assert (r.service_provisioning, r.trainer_provisioning) == ("standard", "spot")
    assert any("Spot prices are used for the trainers (on-demand prices for the workers and dispatcher)" in n
               for n in r.notes)

    both = price(measured(service_provisioning="spot", trainer_provisioning="spot"), gcp, basis)
    assert both.service == pytest.approx(b.service) and both.trainers == pytest.approx(r.trainers)
    default = price(measured(), gcp, basis)  # standard unless asked
    assert default.service == pytest.approx(r.service) and default.trainers == pytest.approx(b.trainers)
    assert not any("Spot" in n for n in default.notes)


def test_spot_a2_trainer_splits_host_and_gpus_at_spot_rates(gcp):
    a2 = gcp.data.spot.rates["a2"]
    b = price(measured(trainer_machine="a2-highgpu-1g", trainer_provisioning="spot"), gcp, "utilization")
    assert b.trainer_cpu == pytest.approx(2 * 12 * a2.vcpu_hour)
    assert b.trainer_memory == pytest.approx(2 * 85 * a2.gb_hour)
    assert b.accelerators == pytest.approx(2 * 1 * a2.accelerator_hour)
