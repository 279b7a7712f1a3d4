"""Equation 1 of the tf.data service paper (§4.1) and the vm-hours basis, as pure functions.

    C = t · ( C_CPU·(n_W·avgCPU_u^W + n_T·CPU_a^T)
            + C_MEM·(n_W·avgMEM_u^W + n_T·MEM_a^T)
            + C_ACC·n_T·n_ACC/T )

Workers are charged on what they used (reserved but unused CPU and memory go back to
the pool); trainer hosts on what they have (their CPU and memory are not fungible).
The paper says the dispatcher is included but not how; here it is charged like a
worker, on its measured use.

Everything is in dollars, hours for prices and seconds for job time (what runs measure).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

BASES = ("utilization", "vm-hours")


@dataclass(frozen=True)
class Rates:
    """C_CPU ($ per vCPU-hour), C_MEM ($ per GB-hour) and C_ACC ($ per accelerator-hour)."""

    cpu: float
    mem: float
    acc: float = 0.0


@dataclass(frozen=True)
class CostBreakdown:
    """What a job cost, part by part, in dollars; `total` is their sum."""

    workers: float
    dispatcher: float
    trainer_cpu: float
    trainer_memory: float
    accelerators: float
    basis: str
    job_time_s: float
    batches: float | None = None
    notes: tuple[str, ...] = field(default=())
    # How each part was bought and so which of the catalog's prices it was charged at:
    # 'standard' (on-demand) or 'spot'; service None when there is no service (colocated).
    service_provisioning: str | None = None
    trainer_provisioning: str | None = None
    # Hybrid placement: what the workers inside the trainer processes cost. They run on the trainer hosts, which
    # are charged on what they have either way, so this is a share of `trainer_cpu`, never added to the total; None
    # without local workers, or when their CPU use is not known. How their CPU use is known: local_cpu_source.
    local_preprocessing: float | None = None
    local_cpu_source: str | None = None

    @property
    def service(self) -> float:
        """Workers plus dispatcher: what disaggregation adds."""
        return self.workers + self.dispatcher

    @property
    def remote_preprocessing(self) -> float:
        """The pipeline run off the trainer hosts: the remote workers and their dispatcher."""
        return self.service

    @property
    def trainers(self) -> float:
        return self.trainer_cpu + self.trainer_memory + self.accelerators

    @property
    def total(self) -> float:
        return self.service + self.trainers

    @property
    def per_1000_batches(self) -> float | None:
        """Cost of 1,000 training batches; None when the batch count is unknown or zero."""
        if not self.batches:
            return None
        return self.total * 1000.0 / self.batches

    def to_dict(self) -> dict:
        """Plain numbers for JSON/CSV, including the derived totals."""
        out = asdict(self)
        out["notes"] = list(self.notes)
        out.update(service=self.service, remote_preprocessing=self.remote_preprocessing, trainers=self.trainers,
                   total=self.total,
                   per_1000_batches=self.per_1000_batches)
        return out


def equation_1(
    t_s: float,
    *,
    n_w: float,  # workers held on average: fewer than the count when some were stopped part of the time
    avg_cpu_w: float,
    avg_mem_w: float,
    n_t: int,
    cpu_a_t: float,
    mem_a_t: float,
    n_acc_t: float,
    rates: Rates,
    dispatcher_cpu: float = 0.0,
    dispatcher_mem: float = 0.0,
    worker_rates: Rates | None = None,
    dispatcher_rates: Rates | None = None,
) -> CostBreakdown:
    """Equation 1, term by term, plus the dispatcher charged like a worker on its use.

    `rates` are the paper's C_CPU, C_MEM, C_ACC. With one set of rates for everything
    (the paper's case) the total is exactly Equation 1 plus t·(C_CPU·dispatcher_cpu +
    C_MEM·dispatcher_mem). Real catalogs price machine families differently (e2 workers,
    a2 trainers), so `worker_rates` and `dispatcher_rates` may give those roles their
    own C_CPU and C_MEM; they default to `rates` (dispatcher: to the workers').
    avg_cpu_w is mean vCPUs busy per worker, avg_mem_w mean GB in use per worker.
    """
    t = t_s / 3600.0
    w = worker_rates or rates
    d = dispatcher_rates or w
    return CostBreakdown(
        workers=t * (w.cpu * n_w * avg_cpu_w + w.mem * n_w * avg_mem_w),
        dispatcher=t * (d.cpu * dispatcher_cpu + d.mem * dispatcher_mem),
        trainer_cpu=t * rates.cpu * n_t * cpu_a_t,
        trainer_memory=t * rates.mem * n_t * mem_a_t,
        accelerators=t * rates.acc * n_t * n_acc_t,
        basis="utilization",
        job_time_s=t_s,
    )


def vm_hours(
    t_s: float,
    *,
    n_w: float,  # workers held on average: fewer than the count when some were stopped part of the time
    worker_vm_hour: float,
    dispatcher_vm_hour: float,
    n_t: int,
    trainer_cpu_hour: float,
    trainer_memory_hour: float,
    trainer_accelerators_hour: float,
) -> CostBreakdown:
    """Whole machines per hour: how the paper prices its open-source ResNet50 example.

    dispatcher_vm_hour is 0 when there is no dispatcher. A trainer VM's hourly price
    is passed split into host CPU, host memory and accelerators so that both bases
    report trainers the same way; the three parts sum to the VM price.
    """
    t = t_s / 3600.0
    return CostBreakdown(
        workers=t * n_w * worker_vm_hour,
        dispatcher=t * dispatcher_vm_hour,
        trainer_cpu=t * n_t * trainer_cpu_hour,
        trainer_memory=t * n_t * trainer_memory_hour,
        accelerators=t * n_t * trainer_accelerators_hour,
        basis="vm-hours",
        job_time_s=t_s,
    )
