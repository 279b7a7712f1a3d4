"""Plan before running: what a spec's deployment costs at a given throughput.

A step trains on one batch, so a job of N steps at R batches/s takes N/R seconds;
a job of H hours trains R·3600·H batches. Nothing is measured yet, so workers and the
dispatcher are charged for their whole machines on the utilization basis (noted).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dsctl.specs import JobSpec
from dsctl.specs.errors import SpecError

from .catalog import Catalog
from .equation import CostBreakdown
from .usage import RunUsage, price


def _require_positive(value, what: str, hint: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        raise SpecError(f"{what} must be a positive number, got {value!r}. {hint}")
    return float(value)


def usage_from_spec(spec: JobSpec, *, job_time_s: float, batches: float | None = None, workers: int | None = None,
                    trainers: int | None = None, measured: Mapping[str, Any] | None = None) -> RunUsage:
    """The one way a job becomes a RunUsage: the machines its spec asks for and how they are bought
    (service.provisioning, trainer.provisioning), `workers` of them (default the spec's; 0: colocated, no
    service), and, where a run measured them, what its processes used: a run summary's worker_cpu_cores,
    worker_mem_gb, dispatcher_*, trainer_* and the seconds its VMs spent stopped (worker_stopped_s, ...)."""
    n_workers = spec.service.workers if workers is None else workers
    if n_workers < 0:
        raise SpecError(f"the number of workers must be 0 (colocated, no tf.data service) or more, got {n_workers}.")
    m = measured or {}
    service = n_workers > 0
    local = _local_workers(spec, m) if service else 0
    return RunUsage(
        job_time_s=job_time_s,
        batches=batches,
        n_trainers=spec.trainer.count if trainers is None else trainers,
        trainer_machine=spec.trainer.machine,
        accelerators_per_trainer=spec.trainer.accelerators_per_trainer,
        n_workers=n_workers,
        worker_machine=spec.service.worker_machine if service else None,
        worker_avg_cpu_cores=m.get("worker_cpu_cores") if service else None,
        worker_avg_mem_gb=m.get("worker_mem_gb") if service else None,
        dispatcher_machine=spec.service.dispatcher_machine if service else None,
        dispatcher_avg_cpu_cores=m.get("dispatcher_cpu_cores") if service else None,
        dispatcher_avg_mem_gb=m.get("dispatcher_mem_gb") if service else None,
        trainer_avg_cpu_cores=m.get("trainer_cpu_cores"),
        trainer_avg_mem_gb=m.get("trainer_mem_gb"),
        service_provisioning=spec.service.provisioning,
        trainer_provisioning=spec.trainer.provisioning,
        worker_stopped_s=min(m.get("worker_stopped_s") or 0.0, n_workers * job_time_s) if service else 0.0,
        dispatcher_stopped_s=min(m.get("dispatcher_stopped_s") or 0.0, job_time_s) if service else 0.0,
        local_workers=local,
        local_cpu_cores=m.get("local_cpu_cores") if local else None,
        local_cpu_source=(m.get("local_cpu_source") or ("not measured" if measured is not None else
                                                         "not known before a run")) if local else None,
    )


def _local_workers(spec: JobSpec, measured: Mapping[str, Any]) -> int:
    """Workers inside each trainer process: the spec's under hybrid placement; under auto, the most the run's policy
    started (its placement record), none before a run."""
    if spec.service.placement == "hybrid":
        return spec.service.local_workers
    if spec.service.placement == "auto":
        said = measured.get("placement")
        most = said.get("local_workers") if isinstance(said, Mapping) else getattr(said, "local_workers", None)
        return int(most or 0)
    return 0


def estimate(spec: JobSpec, catalog: Catalog, *, batches_per_sec: float, steps: float | None = None,
             hours: float | None = None, basis: str | None = None, workers: int | None = None,
             notes: tuple[str, ...] = ()) -> CostBreakdown:
    """Cost of running `spec` at `batches_per_sec` for `steps` or `hours` (default: the spec's own).

    basis defaults to spec.cost_basis; workers overrides spec.service.workers (0 = colocated); `notes` are added to
    the breakdown's (how the caller priced it, e.g. processes standing for the machine types the spec names).
    """
    bps = _require_positive(
        batches_per_sec, "the throughput in batches per second",
        "Give the training throughput you expect (or measured), e.g. 4.5 for the paper's ResNet50 with the service.")
    if steps is not None and hours is not None:
        raise SpecError("give either a number of steps or a number of hours to price, not both.")
    if steps is None and hours is None:
        steps, hours = spec.trainer.steps, (spec.trainer.duration_s / 3600.0 if spec.trainer.duration_s else None)
        if steps is None and hours is None:
            raise SpecError("the spec gives neither trainer.steps nor trainer.duration_s (its pipeline, or its program's "
                            "epochs, decide its length), so give the length to price: --steps N or --hours H.")
    if steps is not None:
        batches = _require_positive(steps, "the number of steps", "A job trains for one or more steps (one batch each).")
        job_time_s = batches / bps
    else:
        h = _require_positive(hours, "the number of hours", "Give how long the job trains, e.g. 2.5.")
        job_time_s = h * 3600.0
        batches = bps * job_time_s
    usage = usage_from_spec(spec, job_time_s=job_time_s, batches=batches, workers=workers)
    result = price(usage, catalog, basis or spec.cost_basis)
    return replace(result, notes=result.notes + notes) if notes else result


@dataclass(frozen=True)
class Comparison:
    """Paper Figure 8: how much faster and how much cheaper `run` is than `baseline`."""

    speedup: float
    cost_saving: float


def compare(baseline: CostBreakdown, run: CostBreakdown) -> Comparison:
    """Speedup and cost saving of `run` over `baseline`, per batch when both batch counts are known.

    Per batch, runs of different lengths compare fairly; for the same work it is the
    paper's plain ratio of job times and of costs.
    """
    if baseline.batches and run.batches:
        speedup = (run.batches / run.job_time_s) / (baseline.batches / baseline.job_time_s)
        saving = (baseline.total / baseline.batches) / (run.total / run.batches) if run.total else math.inf
    else:
        speedup = baseline.job_time_s / run.job_time_s
        saving = baseline.total / run.total if run.total else math.inf
    return Comparison(speedup=speedup, cost_saving=saving)
