"""From the trainers' metrics windows to one policy observation per decision.

Every trainer writes its own windows. A policy must decide on the job as a whole, so the
windows are joined: an observation is made once every trainer still running has reported at
least one window since the last one, from all of them together (Cachew's dispatcher does the
same with its clients' metrics). One slow or stalled trainer thus holds the decision back
rather than being outvoted by the others, which is what a synchronous job feels too.
"""

from __future__ import annotations

from dsctl.specs.schema import JobSpec

from .policies import Observation, ReadsQueue, ScalingPolicy
from .policies.cachew import QUEUE_ROOM  # noqa: F401 - the buffer leave_queue_room gives under Cachew's policy


class TrainerWindows:
    """Collects windows per trainer and hands back one aggregated `Observation` when all have reported.

    The aggregate is per trainer, as one trainer would have seen it: `batches` is the mean
    number of batches a trainer completed (policies count their window in a trainer's
    batches), batch time is the batch-weighted mean, input stall is total wait over total
    time, and queue fill the batch-weighted mean of the trainers that measured it.
    """

    def __init__(self, trainers: list[int]):
        self._pending: dict[int, list[dict]] = {i: [] for i in trainers}

    def trainer_ended(self, index: int) -> None:
        """Stop waiting for a trainer that exited."""
        self._pending.pop(index, None)

    def add(self, index: int, window: dict, *, workers: int, worker_cpu_util: float | None) -> Observation | None:
        elapsed = window["t_end"] - window["t_start"]
        if index not in self._pending or not window.get("batches") or elapsed <= 0:
            return None
        self._pending[index].append(window)
        if any(not windows for windows in self._pending.values()):
            return None
        joined = [w for windows in self._pending.values() for w in windows]
        for windows in self._pending.values():
            windows.clear()
        return observe(joined, len(self._pending), workers=workers, worker_cpu_util=worker_cpu_util)


def observe(windows: list[dict], trainers: int, *, workers: int, worker_cpu_util: float | None) -> Observation:
    """One observation from several trainers' windows (see TrainerWindows)."""
    batches = sum(w["batches"] for w in windows)
    elapsed = sum(w["t_end"] - w["t_start"] for w in windows)
    wait = sum(w["input_wait_s"] for w in windows)
    filled = [(w["queue_fill"], w["batches"]) for w in windows if w.get("queue_fill") is not None]
    queue_fill = sum(q * b for q, b in filled) / sum(b for _, b in filled) if filled else None
    return Observation(
        t=max(w["t_end"] for w in windows), workers=workers, batch_time_s=elapsed / batches,
        input_stall_frac=min(wait / elapsed, 1.0), batches=max(1, round(batches / trainers)),
        queue_fill=queue_fill, worker_cpu_util=worker_cpu_util,
        # in-process workers as the trainers said: the fewest any had (a change not yet made everywhere is not made)
        local_workers=min(int(w.get("local_workers") or 0) for w in windows),
    )


def leave_queue_room(spec: JobSpec, policy: ScalingPolicy) -> JobSpec:
    """dsctl's own rule, so Cachew's queue-fill signal can work: a client buffer with room to fill.

    The tf.data service client buffers at most `max_outstanding_requests` elements. Left to
    autotuning, that cap follows the worker count, so at a converged count the queue is already
    full and cannot rise 40% as Cachew's scale-down rule asks (benchmarks/bench_queue_fill.py:
    4 workers, 4.0 buffered at the knee and 4.0 with a model twice as slow). Under the cachew
    policy, a spec without `service.max_outstanding_requests` gets max(32, max_workers): with
    32 the same benchmark read 14.8, then 31.5. The cost is client memory: up to that
    many elements (batches) buffered; set the field lower for very large batches. The policy is
    told the buffer's size (`queue_capacity`).
    """
    if not isinstance(policy, ReadsQueue):
        return spec
    room = policy.queue_room(spec.service.max_outstanding_requests)
    service = spec.service.model_copy(update={"max_outstanding_requests": room})
    return spec.model_copy(update={"service": service})
