"""Joining the trainers' windows into one observation per decision, and the client-buffer rule for Cachew."""

from __future__ import annotations

import pytest

from dsctl.orchestrator.autoscaling import QUEUE_ROOM, TrainerWindows, leave_queue_room, observe
from dsctl.orchestrator.policies import make_policy
from dsctl.runtime.queuefill import QueueFillSampler
from dsctl.specs.schema import JobSpec


def window(t0, t1, batches, wait, queue_fill=None):
    return {"t_start": t0, "t_end": t1, "batches": batches, "input_wait_s": wait, "queue_fill": queue_fill}


def test_an_observation_waits_for_every_running_trainer():
    joined = TrainerWindows([0, 1])
    assert joined.add(0, window(0, 1, 10, 0.1), workers=2, worker_cpu_util=None) is None
    assert joined.add(0, window(1, 2, 10, 0.1), workers=2, worker_cpu_util=None) is None, "trainer 1 not heard yet"
    obs = joined.add(1, window(0, 2, 40, 1.0), workers=2, worker_cpu_util=0.5)
    assert obs is not None
    # Trainer 0: 20 batches in 2 s, 0.2 s waiting; trainer 1: 40 batches in 2 s, 1.0 s waiting.
    assert obs.batches == 30, "batches per trainer, as one trainer's window would count them"
    assert obs.batch_time_s == pytest.approx(4 / 60), "batch-weighted mean batch time"
    assert obs.input_stall_frac == pytest.approx(1.2 / 4), "total wait over total time"
    assert obs.t == 2 and obs.workers == 2 and obs.worker_cpu_util == 0.5
    # Everything pending went into that observation: the next one starts afresh.
    assert joined.add(0, window(2, 3, 10, 0.0), workers=2, worker_cpu_util=None) is None


def test_the_in_process_workers_observed_are_the_fewest_any_trainer_had():
    """placement: auto: a count one trainer has not reached yet is not in place (the policy waits for it)."""
    ahead, behind = window(0, 1, 10, 0.1), window(0, 1, 10, 0.1)
    ahead["local_workers"], behind["local_workers"] = 2, 1
    assert observe([ahead, behind], 2, workers=1, worker_cpu_util=None).local_workers == 1
    assert observe([window(0, 1, 10, 0.1)], 1, workers=1, worker_cpu_util=None).local_workers == 0  # remote only


def test_a_trainer_that_ended_is_no_longer_waited_for():
    joined = TrainerWindows([0, 1])
    joined.trainer_ended(1)
    obs = joined.add(0, window(0, 1, 10, 0.5), workers=1, worker_cpu_util=None)
    assert obs is not None and obs.batches == 10 and obs.input_stall_frac == pytest.approx(0.5)


def test_empty_or_unknown_windows_are_ignored():
    joined = TrainerWindows([0])
    assert joined.add(0, window(0, 1, 0, 0.0), workers=1, worker_cpu_util=None) is None
    assert joined.add(0, window(1, 1, 5, 0.0), workers=1, worker_cpu_util=None) is None
    assert joined.add(7, window(0, 1, 5, 0.0), workers=1, worker_cpu_util=None) is None


def test_queue_fill_is_the_batch_weighted_mean_of_the_trainers_that_measured_it():
    obs = observe([window(0, 1, 10, 0.0, queue_fill=2.0), window(0, 1, 30, 0.0, queue_fill=6.0),
                   window(0, 1, 20, 0.0)], 3, workers=1, worker_cpu_util=None)
    assert obs.queue_fill == pytest.approx((20 + 180) / 40)
    assert observe([window(0, 1, 10, 0.0)], 1, workers=1, worker_cpu_util=None).queue_fill is None


def spec(**service) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "service": {"workers": 1, **service}, "trainer": {"steps": 10},
                                   "pipeline": {"builtin": "synthetic"}})


def test_cachew_gets_a_client_buffer_with_room_to_fill_unless_the_spec_sets_one():
    cachew = make_policy("cachew", {"max_workers": 8})
    assert leave_queue_room(spec(), cachew).service.max_outstanding_requests == QUEUE_ROOM
    big = make_policy("cachew", {"max_workers": 100})
    assert leave_queue_room(spec(), big).service.max_outstanding_requests == 100, "never fewer than the workers"
    assert leave_queue_room(spec(max_outstanding_requests=4), cachew).service.max_outstanding_requests == 4
    assert cachew.config.queue_capacity == 4, "the policy is told the buffer it reads the fill of"
    cpu = make_policy("cpu", {"max_workers": 8})
    assert leave_queue_room(spec(), cpu).service.max_outstanding_requests is None, "the CPU policy reads no queue"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_queue_fill_sampler_reads_at_most_once_per_interval_and_averages_per_take():
    clock, reads = Clock(), []
    values = iter([4.0, 8.0, 6.0, 3.0])

    def reader():
        reads.append(clock.now)
        return next(values)

    sampler = QueueFillSampler(reader, interval_s=0.1, clock=clock)
    for t in (0.0, 0.05, 0.1, 0.15):
        clock.now = t
        sampler.maybe_sample()
    assert reads == [0.0, 0.1]
    assert sampler.take() == 6.0
    clock.now = 0.3
    sampler.maybe_sample()
    assert sampler.take() == 6.0, "a take empties the window"
    clock.now = 0.35
    assert sampler.take() == 3.0 and reads[-1] == 0.35, "a window with no sample reads at its end"


def test_a_model_without_the_service_node_turns_sampling_off_for_good():
    calls = []

    def reader():
        calls.append(1)
        return None

    clock = Clock()
    sampler = QueueFillSampler(reader, interval_s=0.1, clock=clock)
    sampler.maybe_sample()
    clock.now = 1.0
    sampler.maybe_sample()
    assert len(calls) == 1 and not sampler.active and sampler.take() is None
    assert not QueueFillSampler(None).active


def converged_at_two(queue_fill, capacity=None):
    """A Cachew policy walked to convergence at 2 workers (batch time 0.1 s, no stall)."""
    from dsctl.orchestrator.policies import Observation

    policy = make_policy("cachew", {"window_batches": 10, "pause_batches": 0, "recheck_batches": 10,
                                    "queue_capacity": capacity})
    t = iter(range(1, 100))

    def see(workers, bt, stall=0.0, qf=queue_fill):
        return policy.observe(Observation(t=next(t), workers=workers, batch_time_s=bt, input_stall_frac=stall,
                                          batches=10, queue_fill=qf))

    assert see(1, 0.2, stall=0.5).target == 2
    assert see(2, 0.1).target == 3
    assert see(3, 0.1).target == 2, "the third worker bought nothing"
    assert see(2, 0.1).action == "hold" and policy.phase == "converged"
    return see


def test_with_queue_fill_measured_a_slower_model_alone_does_not_remove_a_worker():
    see = converged_at_two(queue_fill=2.0)
    decision = see(2, 0.15)
    assert decision.action == "hold" and "holding" in decision.reason
    see(2, 0.15, qf=3.5)  # 75% above converged and 1.5 batches more: Cachew's rule fires
    decision = see(2, 0.15, qf=3.5)
    assert decision.action == "remove" and "queue fill" in decision.reason and "dsctl's rule" not in decision.reason


def test_without_queue_fill_dsctls_own_rule_removes_a_worker_and_says_so():
    see = converged_at_two(queue_fill=None)
    assert see(2, 0.15).action == "hold"  # found: confirmed on a fresh window before acting
    decision = see(2, 0.15)
    assert decision.action == "remove" and "dsctl's rule" in decision.reason


@pytest.mark.parametrize("capacity", [None, 32])
def test_a_queue_with_room_leaves_the_decision_to_the_papers_rule(capacity):
    """Converged at 2.0 of 32 (or of an unknown buffer): a 40% rise fits, so batch time alone removes nothing."""
    see = converged_at_two(queue_fill=2.0, capacity=capacity)
    see(2, 0.1)  # the first re-check reads the converged fill
    assert see(2, 0.15).action == "hold" and see(2, 0.15).action == "hold"


@pytest.mark.parametrize("converged, removes", [(27.0, True), (21.0, True), (20.0, False), (2.0, False)])
def test_a_queue_too_full_to_rise_hands_the_decision_to_dsctls_rule(converged, removes):
    """A 32-element buffer reads full at 90% (28.8). From 21.0 a 40% rise (29.4) cannot be seen, so a slower model
    is found by batch time (dsctl's rule); from 20.0 (28.0 fits) the paper's rule is left to decide."""
    see = converged_at_two(queue_fill=converged, capacity=32)
    see(2, 0.1)  # the first re-check reads the converged fill
    now = min(converged * 1.1, 31.0)  # the queue stays about as full: the paper's rule does not fire
    decisions = [see(2, 0.15, qf=now) for _ in range(2)]  # found, then confirmed on a fresh window
    if removes:
        assert decisions[-1].action == "remove", decisions
        assert "too full to rise 40%" in decisions[-1].reason and "dsctl's rule" in decisions[-1].reason
    else:
        assert [d.action for d in decisions] == ["hold", "hold"]


def shrunk_to_one(batch_time_s=0.1):
    """Converged at 2 workers, then Cachew's queue-fill rule removes the second one."""
    see = converged_at_two(queue_fill=2.0)
    see(2, batch_time_s)  # the first re-check reads the converged fill
    assert see(2, batch_time_s, qf=3.5).action == "hold"  # found; confirmed on a fresh window
    assert see(2, batch_time_s, qf=3.5).target == 1
    return see


@pytest.mark.parametrize("rise, measured_twice, added_back", [
    (0.02, False, False),   # within the 3% threshold: the removal held
    (0.05, True, True),     # above it, within twice it: measured once more, then added back
    (0.08, False, True),    # above twice the threshold: added back at once
])
def test_a_removal_that_costs_more_than_the_threshold_is_undone(rise, measured_twice, added_back):
    see = shrunk_to_one()
    first = see(1, 0.1 * (1 + rise))
    if measured_twice:
        assert first.action == "hold" and "measuring again" in first.reason
        first = see(1, 0.1 * (1 + rise))
    if added_back:
        assert first.action == "add" and first.target == 2 and "adding it back" in first.reason
    else:
        assert first.action == "hold" and "held, and at min_workers=1" in first.reason
