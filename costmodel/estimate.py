"""Plan before running: what a spec's deployment costs at a given throughput.

A step trains on one batch, so a job of N steps at R batches/s takes N/R seconds;
a job of H hours trains R·3600·H batches. Nothing is measured yet, so workers and the
dispatcher are charged for their whole machines on the utilization basis (noted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

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


def usage_from_spec(spec: JobSpec, *, job_time_s: float, batches: float | None = None,
                    workers: int | None = None) -> RunUsage:
    """The machines a spec asks for, and how they are bought (service.provisioning, trainer.provisioning),
    with no measurements; workers=0 means colocated (no service)."""
    n_workers = spec.service.workers if workers is None else workers
    if n_workers < 0:
        raise SpecError(f"the number of workers must be 0 (colocated, no tf.data service) or more, got {n_workers}.")
    return RunUsage(
        job_time_s=job_time_s,
        batches=batches,
        n_trainers=spec.trainer.count,
        trainer_machine=spec.trainer.machine,
        accelerators_per_trainer=spec.trainer.accelerators_per_trainer,
        n_workers=n_workers,
        worker_machine=spec.service.worker_machine if n_workers else None,
        dispatcher_machine=spec.service.dispatcher_machine if n_workers else None,
        service_provisioning=spec.service.provisioning,
        trainer_provisioning=spec.trainer.provisioning,
    )


def estimate(spec: JobSpec, catalog: Catalog, *, batches_per_sec: float, steps: float | None = None,
             hours: float | None = None, basis: str | None = None, workers: int | None = None) -> CostBreakdown:
    """Cost of running `spec` at `batches_per_sec` for `steps` or `hours` (default: the spec's own).

    basis defaults to spec.cost_basis; workers overrides spec.service.workers (0 = colocated).
    """
    bps = _require_positive(
        batches_per_sec, "the throughput in batches per second",
        "Give the training throughput you expect (or measured), e.g. 4.5 for the paper's ResNet50 with the service.")
    if steps is not None and hours is not None:
        raise SpecError("give either a number of steps or a number of hours to price, not both.")
    if steps is None and hours is None:
        steps, hours = spec.trainer.steps, (spec.trainer.duration_s / 3600.0 if spec.trainer.duration_s else None)
    if steps is not None:
        batches = _require_positive(steps, "the number of steps", "A job trains for one or more steps (one batch each).")
        job_time_s = batches / bps
    else:
        h = _require_positive(hours, "the number of hours", "Give how long the job trains, e.g. 2.5.")
        job_time_s = h * 3600.0
        batches = bps * job_time_s
    usage = usage_from_spec(spec, job_time_s=job_time_s, batches=batches, workers=workers)
    result = price(usage, catalog, basis or spec.cost_basis)
    if spec.provider == "local":
        result = replace(result, notes=result.notes + (
            "this spec runs locally (provider: local); it is priced as the machine types it names.",))
    return result


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
