"""How many remote workers hybrid placement saves, predicted before a run from a profile of its pipeline.

A profile (`dsctl profile`) measures the pipeline's CPU time per batch here and the limits no core count lifts (a
sequential stage: `sequential_bps`). One worker with c cores is then predicted to give min(c / cpu_s_per_batch,
sequential_bps) batches/s, the rule `dsctl profile` predicts worker counts with. An in-process worker gets the trainer
host's vCPUs less the training step's (`step_cores`), shared by that host's in-process workers; a remote worker gets
its machine's vCPUs. The placement's throughput is the sum over its workers, at most what the trainers consume (the
profile's target, when it has one); a remote-only placement of the same throughput needs ⌈throughput ÷ one remote
worker's rate⌉ workers. Every figure here is predicted, none measured: the step's own CPU use beyond `step_cores` and
the contention between workers on one host are not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STEP_CORES = 1  # a trainer host's cores left to the training step (its input pipeline runs on the workers)


@dataclass(frozen=True)
class PipelineRate:
    """What a profile says of a job's pipeline, for predicting worker counts."""

    cpu_s_per_batch: float  # CPU seconds per batch, measured here
    sequential_bps: float | None  # the least of the limits more cores do not lift; None: none found
    target_bps: float | None  # batches/s the trainers consume in all; None: not known
    source: str  # which profile, for the label

    def per_worker_bps(self, cores: float) -> float:
        """One worker's batches/s on `cores` cores (predicted)."""
        cpu = cores / self.cpu_s_per_batch if self.cpu_s_per_batch > 0 else math.inf
        return min(cpu, self.sequential_bps if self.sequential_bps is not None else math.inf)


@dataclass(frozen=True)
class HybridSaving:
    """A hybrid placement against remote-only placement of the same throughput (all predicted)."""

    remote: int  # the spec's remote workers
    local_per_trainer: int
    trainers: int
    remote_bps: float  # one remote worker
    local_bps: float  # one in-process worker
    throughput_bps: float  # this placement, at most the target
    remote_only: int  # remote workers a remote-only placement needs for throughput_bps
    capped: bool  # throughput_bps is the trainers' consumption (the target), not the workers' sum

    @property
    def saved(self) -> int:
        """Remote workers this placement does without (negative: it has more than remote-only would need)."""
        return self.remote_only - self.remote

    @property
    def remote_needed(self) -> int:
        """Remote workers this placement needs beside its in-process ones for throughput_bps."""
        rest = self.throughput_bps - self.trainers * self.local_per_trainer * self.local_bps
        return max(math.ceil(rest / self.remote_bps - 1e-9), 0) if math.isfinite(self.remote_bps) else 0


def predict_hybrid(rate: PipelineRate, *, remote: int, worker_vcpus: int, trainer_vcpus: int, trainers: int,
                   local_per_trainer: int, step_cores: int = STEP_CORES) -> HybridSaving:
    """The saving of `local_per_trainer` in-process workers in each of `trainers` trainer hosts of `trainer_vcpus`
    beside `remote` workers of `worker_vcpus` (see the module docstring)."""
    remote_bps = rate.per_worker_bps(worker_vcpus)
    spare = max(trainer_vcpus - step_cores, 0)
    local_bps = rate.per_worker_bps(spare / local_per_trainer) if local_per_trainer else 0.0
    total = remote * remote_bps + trainers * local_per_trainer * local_bps
    capped = rate.target_bps is not None and total > rate.target_bps
    throughput = rate.target_bps if capped and rate.target_bps is not None else total
    remote_only = max(math.ceil(throughput / remote_bps - 1e-9), 0) if remote_bps > 0 else 0
    return HybridSaving(remote=remote, local_per_trainer=local_per_trainer, trainers=trainers, remote_bps=remote_bps,
                        local_bps=local_bps, throughput_bps=throughput, remote_only=remote_only, capped=capped)
