"""A closed loop for policies without a cluster: policy decides → workers change → next window.

The job is latency-bound by construction, so its knee is known: each worker needs
`worker_batch_time_s` to produce a batch whatever its CPU does, the model needs
`step_time_s` per batch, and with n workers

    batch_time(n) = max(step_time_s, worker_batch_time_s / n),   knee = ceil(worker / step)

(the fewest workers that reach the ideal). The trainers wait for input for
batch_time - step_time of each batch; workers are busy a fraction worker/(n·batch_time) of
the time and use `cpu_when_busy` of their CPU while busy; the client's buffer of ready batches
fills like an M/M/1/K queue (tf.data's own model, VLDB'21) with ρ = n·step/worker. Phases
change the job mid-run (a faster model, harder data). Noise is uniform ±`noise` per window
from a seeded generator: the same arguments give the same run. Tests and experiments
(e.g. what the CPU policy would choose beside a measured sweep) both use it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from .base import Decision, Observation, ScalingPolicy


@dataclass(frozen=True)
class SyntheticJob:
    step_time_s: float
    worker_batch_time_s: float
    cpu_when_busy: float = 0.3  # latency-bound workers use little CPU even when busy
    queue_capacity: int = 8  # ready batches the client buffers

    @property
    def knee(self) -> int:
        return max(1, math.ceil(self.worker_batch_time_s / self.step_time_s - 1e-9))

    def batch_time_s(self, workers: int) -> float:
        return max(self.step_time_s, self.worker_batch_time_s / max(workers, 1))

    def input_stall_frac(self, workers: int) -> float:
        return 1 - self.step_time_s / self.batch_time_s(workers)

    def worker_cpu_util(self, workers: int) -> float:
        busy = min(1.0, self.worker_batch_time_s / (max(workers, 1) * self.batch_time_s(workers)))
        return self.cpu_when_busy * busy

    def queue_fill(self, workers: int) -> float:
        """Mean ready batches in an M/M/1/K buffer fed at n/worker and drained at 1/step."""
        rho, k = workers * self.step_time_s / self.worker_batch_time_s, self.queue_capacity
        if abs(rho - 1) < 1e-9:
            return k / 2
        return rho / (1 - rho) - (k + 1) * rho ** (k + 1) / (1 - rho ** (k + 1))


@dataclass(frozen=True)
class SimStep:
    obs: Observation
    decision: Decision
    phase: str | None  # the policy's phase after the decision, where it has one


def simulate(
    policy: ScalingPolicy,
    job: SyntheticJob | Sequence[tuple[int, SyntheticJob]],
    total_batches: int,
    *,
    window_batches: int = 10,
    noise: float = 0.05,
    seed: int = 0,
    with_queue_fill: bool = True,
    startup_batches: int = 0,
) -> list[SimStep]:
    """Run `policy` against `job` (or phases: (first batch, job) pairs, the first at 0).

    Decisions take effect for the next window; an added worker produces nothing for its first
    `startup_batches` batches (what the policies' pauses are for).
    """
    phases = [(0, job)] if isinstance(job, SyntheticJob) else sorted(job, key=lambda p: p[0])
    rng = random.Random(seed)
    workers = policy.initial_workers
    productive, since_add = workers, startup_batches
    done, t, trace = 0, 0.0, []

    def jitter(x: float) -> float:
        return x * (1 + rng.uniform(-noise, noise))

    while done < total_batches:
        current = [j for start, j in phases if start <= done][-1]
        n = workers if since_add >= startup_batches else productive
        b = min(window_batches, total_batches - done)
        batch_time = jitter(current.batch_time_s(n))
        t += b * batch_time
        obs = Observation(
            t=t, workers=workers, batch_time_s=batch_time, batches=b,
            input_stall_frac=min(1.0, max(0.0, current.input_stall_frac(n) + rng.uniform(-noise, noise))),
            queue_fill=jitter(current.queue_fill(n)) if with_queue_fill else None,
            worker_cpu_util=min(1.0, jitter(current.worker_cpu_util(n))),
        )
        decision = policy.observe(obs)
        trace.append(SimStep(obs, decision, getattr(policy, "phase", None)))
        done, since_add = done + b, since_add + b
        if decision.target > workers:
            productive, since_add = workers, 0
        elif decision.target < workers:
            productive = decision.target
        workers = decision.target
    return trace
