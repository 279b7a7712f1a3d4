"""Scaling policies driven by recorded and simulated metric sequences, noise included.

Every sequence comes from a seeded closed loop (orchestrator/policies/simulate.py) over a job
whose knee is known by construction: batch_time(n) = max(step, per_worker / n). Nothing here
reads a clock: time is whatever the observations say.
"""

from __future__ import annotations

import re

import pytest

from dsctl.orchestrator.policies import (
    CachewConfig,
    CachewPolicy,
    CpuConfig,
    CpuUtilizationPolicy,
    Decision,
    Observation,
    ScalingPolicy,
    hpa_desired,
    make_policy,
    summarize,
)
from dsctl.orchestrator.policies.simulate import SimStep, SyntheticJob, simulate

JOB = SyntheticJob(step_time_s=0.040, worker_batch_time_s=0.160)  # knee 4
KNEES = [SyntheticJob(0.050, 0.090), JOB, SyntheticJob(0.030, 0.200)]  # knees 2, 4, 7
SEEDS = range(5)
PHASE_AT = 20_000  # batch at which a phase change happens


def changes(trace: list[SimStep]) -> list[tuple[int, Decision]]:
    return [(i, s.decision) for i, s in enumerate(trace) if s.decision.action != "hold"]


def first_converged(trace: list[SimStep], after: int = 0) -> int:
    return next(i for i, s in enumerate(trace) if i >= after and s.phase == "converged")


def index_at_batch(trace: list[SimStep], batch: int) -> int:
    done = 0
    for i, s in enumerate(trace):
        if done >= batch:
            return i
        done += s.obs.batches
    return len(trace)


def obs(workers: int, t: float = 0.0, batch_time_s: float = 0.04, stall: float = 0.0, batches: int = 10,
        queue_fill: float | None = None, cpu: float | None = None) -> Observation:
    return Observation(t=t, workers=workers, batch_time_s=batch_time_s, input_stall_frac=stall,
                       batches=batches, queue_fill=queue_fill, worker_cpu_util=cpu)


# --- the shared vocabulary ----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [
    dict(workers=-1), dict(batches=-1), dict(batch_time_s=-0.1), dict(batch_time_s=0.0),
    dict(stall=1.5), dict(queue_fill=-1.0), dict(cpu=1.2), dict(batch_time_s=float("nan")),
])
def test_observation_rejects_impossible_values(bad):
    with pytest.raises(ValueError):
        obs(**{"workers": 2, **bad})


def test_summarize_weights_batch_time_by_batches_and_fractions_by_time():
    m = summarize([obs(2, batch_time_s=0.1, stall=0.5, batches=10, queue_fill=2.0, cpu=0.2),
                   obs(2, batch_time_s=0.2, stall=0.0, batches=30, queue_fill=None, cpu=0.6)])
    assert m.batches == 40
    assert m.batch_time_s == pytest.approx((10 * 0.1 + 30 * 0.2) / 40)
    assert m.input_stall_frac == pytest.approx(0.5 * 1.0 / 7.0)  # 1 s of 7 s had stalls of 50%
    assert m.queue_fill == 2.0  # the window without a reading is left out
    assert m.worker_cpu_util == pytest.approx((0.2 * 1 + 0.6 * 6) / 7)
    with pytest.raises(ValueError, match="different worker counts"):
        summarize([obs(2), obs(3)])


def test_make_policy_by_name_with_strict_config():
    p = make_policy("cachew", {"threshold": 0.05, "max_workers": 8})
    assert isinstance(p, ScalingPolicy) and p.name == "cachew" and p.config.threshold == 0.05
    assert isinstance(make_policy("cpu"), ScalingPolicy)
    with pytest.raises(ValueError, match="unknown autoscale policy"):
        make_policy("hpa")
    with pytest.raises(ValueError, match="treshold"):
        make_policy("cachew", {"treshold": 0.05})
    with pytest.raises(ValueError, match="min_workers"):
        CachewConfig(min_workers=5, max_workers=2)


def test_published_constants_are_the_defaults():
    c = CachewConfig()
    assert (c.threshold, c.window_batches, c.pause_batches, c.recheck_batches, c.queue_fill_trigger) == \
        (0.03, 100, 150, 1000, 0.40)
    assert c.min_workers == CachewPolicy().initial_workers == 1
    h = CpuConfig()
    assert (h.target_util, h.tolerance, h.downscale_stabilization_s) == (0.8, 0.1, 300.0)


# --- Cachew -------------------------------------------------------------------------------------


@pytest.mark.parametrize("job", KNEES, ids=lambda j: f"knee{j.knee}")
@pytest.mark.parametrize("seed", SEEDS)
def test_cachew_converges_to_the_knee_and_holds_without_oscillating(job, seed):
    trace = simulate(CachewPolicy(), job, 60_000, noise=0.05, seed=seed)
    settled = first_converged(trace)
    assert abs(trace[settled].obs.workers - job.knee) <= 1
    assert changes(trace[settled:]) == []  # 59 re-checks of noisy metrics, not one change
    assert max(s.obs.workers for s in trace) <= job.knee + 2  # overshoots by the probe only
    adds = [d for _, d in changes(trace) if d.action == "add"]
    assert all(d.target == prev + 1 for prev, d in zip(range(1, 100), adds))  # one at a time from 1


def test_cachew_reasons_carry_the_numbers():
    trace = simulate(CachewPolicy(), JOB, 5_000, noise=0.0)
    reasons = [d.reason for _, d in changes(trace)]
    assert reasons[1].startswith("batch time 160.0 ms → 80.0 ms (-50.0%) after adding worker 2: more than the 3%")
    assert reasons[-1] == ("batch time 40.0 ms → 40.0 ms (+0.0%) after adding worker 5: less than the 3%"
                           " threshold, removing it")
    assert "converged at 4 workers: batch time 40.0 ms" in trace[first_converged(trace)].decision.reason


@pytest.mark.parametrize("startup", [0, 50])
def test_cachew_decides_nothing_within_the_pause(startup):
    cfg = CachewConfig()
    phases = [(0, JOB), (PHASE_AT, SyntheticJob(0.020, 0.160)), (2 * PHASE_AT, SyntheticJob(0.080, 0.160))]
    trace = simulate(CachewPolicy(cfg), phases, 3 * PHASE_AT, startup_batches=startup, seed=3)
    moves = changes(trace)
    assert len(moves) > 10
    for (i, _), (j, _) in zip(moves, moves[1:]):
        between = sum(s.obs.batches for s in trace[i + 1:j + 1])
        assert between >= cfg.pause_batches + cfg.window_batches


def test_cachew_skips_windows_that_start_inside_the_pause():
    p = CachewPolicy()
    first = [p.observe(obs(1, batch_time_s=0.16, batches=100)) for _ in range(3)]
    assert [d.action for d in first] == ["hold", "hold", "add"]  # windows start at 0, 100 | 200
    assert "pausing after starting: 100 of 150" in first[0].reason
    # after the add, wild batch times inside the pause change nothing
    wild = [p.observe(obs(2, batch_time_s=bt, batches=10)) for bt in [0.001, 9.0] * 7]
    assert all(d.action == "hold" and d.target == 2 and "pausing after adding worker 2" in d.reason for d in wild)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("new", [SyntheticJob(0.020, 0.160), SyntheticJob(0.040, 0.320)],
                         ids=["faster-model", "harder-data"])
def test_cachew_scales_up_again_when_the_job_needs_more(new, seed):
    trace = simulate(CachewPolicy(), [(0, JOB), (PHASE_AT, new)], 3 * PHASE_AT, seed=seed)
    at_change = index_at_batch(trace, PHASE_AT)
    assert abs(trace[at_change - 1].obs.workers - JOB.knee) <= 1
    assert new.knee == 8
    settled = first_converged(trace, after=at_change + 1 + [i for i, _ in changes(trace[at_change:])][0])
    assert abs(trace[settled].obs.workers - new.knee) <= 1
    assert changes(trace[settled:]) == []
    first_up = changes(trace[at_change:])[0][1]
    assert first_up.action == "add" and "trainers wait for input" in first_up.reason


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("with_queue_fill", [True, False], ids=["queue-fill", "no-queue-fill"])
def test_cachew_scales_down_when_the_model_gets_slower(with_queue_fill, seed):
    slower = SyntheticJob(0.080, 0.160)  # knee 2
    trace = simulate(CachewPolicy(), [(0, JOB), (PHASE_AT, slower)], 3 * PHASE_AT, seed=seed,
                     with_queue_fill=with_queue_fill)
    at_change = index_at_batch(trace, PHASE_AT)
    before = trace[at_change - 1].obs.workers
    moves = changes(trace[at_change:])
    assert moves[0][1].action == "remove"
    assert ("queue fill" if with_queue_fill else "the model got slower") in moves[0][1].reason
    end = trace[-1].obs.workers
    assert abs(end - slower.knee) <= 1 and end < before and trace[-1].phase == "converged"
    settled = first_converged(trace, after=at_change + moves[-1][0] + 1)
    assert changes(trace[settled:]) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_cachew_scales_down_a_slower_model_when_the_queue_was_already_full(seed):
    """Workers that outpace the model at convergence (5 x 0.036 / 0.160 = 1.125) keep a 32-element buffer
    near full, so the paper's 40% rise cannot happen when the model slows. Told the buffer's size, the
    policy sees that and falls back to batch time (dsctl's rule); not told, it never scales down."""
    full = SyntheticJob(0.036, 0.160, queue_capacity=32)  # knee 5
    slower = SyntheticJob(0.080, 0.160, queue_capacity=32)  # knee 2
    told = CachewPolicy(CachewConfig(queue_capacity=32))
    trace = simulate(told, [(0, full), (PHASE_AT, slower)], 3 * PHASE_AT, seed=seed)
    at_change = index_at_batch(trace, PHASE_AT)
    before = trace[at_change - 1]
    assert before.obs.workers == full.knee and before.obs.queue_fill > 0.7 * 32, "converged with a full queue"
    moves = changes(trace[at_change:])
    assert moves[0][1].action == "remove" and "too full to rise" in moves[0][1].reason
    assert abs(trace[-1].obs.workers - slower.knee) <= 1
    blind = simulate(CachewPolicy(), [(0, full), (PHASE_AT, slower)], 3 * PHASE_AT, seed=seed)
    assert changes(blind[at_change:]) == [], "the paper's rule alone cannot see it"


def test_cachew_respects_max_and_min_workers():
    big = SyntheticJob(0.020, 0.120)  # knee 6
    trace = simulate(CachewPolicy(CachewConfig(max_workers=3)), big, 20_000, seed=1)
    assert max(s.obs.workers for s in trace) == 3 and trace[-1].obs.workers == 3
    assert "max_workers=3" in trace[first_converged(trace)].decision.reason

    small = CachewPolicy(CachewConfig(min_workers=2))
    assert small.initial_workers == 2
    trace = simulate(small, SyntheticJob(0.080, 0.040), 20_000, seed=1)  # knee 1
    assert min(s.obs.workers for s in trace) == 2 and trace[-1].obs.workers == 2

    trace = simulate(CachewPolicy(CachewConfig(min_workers=3)), [(0, JOB), (PHASE_AT, SyntheticJob(0.080, 0.160))],
                     3 * PHASE_AT, seed=1)
    assert min(s.obs.workers for s in trace) == 3 and trace[-1].obs.workers == 3


def test_cachew_brings_an_out_of_bounds_start_into_bounds():
    p = CachewPolicy(CachewConfig(min_workers=2, max_workers=6))
    assert p.observe(obs(9)) == Decision("remove", 6, "9 workers is outside 2..6: going to 6")


def test_cachew_searches_again_after_a_worker_it_did_not_remove_is_gone():
    p = CachewPolicy(CachewConfig(window_batches=10, pause_batches=10))
    trace = simulate(p, JOB, 5_000, noise=0.0)
    assert trace[-1].phase == "converged" and trace[-1].obs.workers == 4
    d = p.observe(obs(3, batch_time_s=JOB.batch_time_s(3), stall=JOB.input_stall_frac(3)))
    assert d.action == "hold" and p.phase == "search" and "changed to 3 outside the policy" in d.reason
    d = p.observe(obs(3, batch_time_s=JOB.batch_time_s(3), stall=JOB.input_stall_frac(3)))
    assert d == Decision("add", 4, d.reason) and "adding worker 4" in d.reason


def test_cachew_stops_waiting_for_a_change_that_never_happens():
    p = CachewPolicy(CachewConfig(window_batches=10, pause_batches=20))
    decisions = [p.observe(obs(1, batch_time_s=0.16)) for _ in range(6)]
    assert [d.action for d in decisions[:4]] == ["hold", "hold", "add", "hold"]
    assert "waiting for the worker count to go from 1 to 2" in decisions[3].reason and decisions[3].target == 2
    assert "worker count still 1 after 30 batches: staying at 1" in decisions[5].reason
    assert decisions[5].target == 1


def test_cachew_replays_a_recording_to_the_same_decisions():
    trace = simulate(CachewPolicy(), [(0, JOB), (PHASE_AT, SyntheticJob(0.020, 0.160))], 40_000, seed=7)
    again = CachewPolicy()
    assert [again.observe(s.obs) for s in trace] == [s.decision for s in trace]


# --- the Kubernetes HPA baseline ----------------------------------------------------------------


@pytest.mark.parametrize("current, util, want", [
    (4, 1.0, 5), (10, 0.4, 5), (1, 0.3, 1), (3, 0.95, 4), (4, 0.85, 4), (4, 0.72, 4), (4, 0.9, 5), (8, 0.6, 6),
])
def test_hpa_formula_with_tolerance(current, util, want):
    assert hpa_desired(current, util, target=0.8, tolerance=0.1) == want


def test_cpu_policy_adds_per_sync_period_after_the_pause():
    p = CpuUtilizationPolicy(CpuConfig(max_workers=10))
    ds = [p.observe(obs(2, t=t, cpu=1.0)) for t in range(1, 46)]  # one window a second
    moves = [(t, d) for t, d in zip(range(1, 46), ds) if d.action != "hold"]
    assert moves[0][0] == 45  # 30 s pause after start, then a 15 s sync period
    assert moves[0][1] == Decision("add", 3, "mean worker CPU 100% vs target 80%: ceil(2 × 1.00 / 0.80) = 3:"
                                   " adding 1 worker(s) to reach 3")
    assert "ignoring worker CPU for 30 s" in ds[10].reason
    later = [p.observe(obs(3, t=t, cpu=1.0)) for t in range(46, 91)]
    assert [t for t, d in zip(range(46, 91), later) if d.action != "hold"] == [90]


def test_cpu_policy_scales_down_only_after_the_stabilization_window():
    p = CpuUtilizationPolicy(CpuConfig(pause_after_change_s=0))
    decisions = {t: p.observe(obs(4, t=t, cpu=0.2)) for t in range(1, 400)}  # wants ceil(4 × 0.25) = 1
    downs = [t for t, d in decisions.items() if d.action != "hold"]
    assert downs[0] >= 300 and decisions[downs[0]].target == 1
    assert "4 was recommended within the last 300 s: holding at 4" in decisions[150].reason

    p = CpuUtilizationPolicy(CpuConfig(pause_after_change_s=0, max_workers=4))
    for t in range(1, 400):
        p.observe(obs(4, t=t, cpu=1.0))  # recommends 5, limited to 4: holds, but 4 stays recent
    ds = [p.observe(obs(4, t=t, cpu=0.2)) for t in range(400, 700)]
    assert all(d.action == "hold" for d in ds)  # the last 300 s still recommended 4


def test_cpu_policy_holds_within_tolerance_and_without_readings():
    p = CpuUtilizationPolicy(CpuConfig(pause_after_change_s=0))
    ds = [p.observe(obs(4, t=t, cpu=0.86)) for t in range(1, 100)]
    evaluated = [d for d in ds if "ceil(" in d.reason]
    assert len(evaluated) >= 5 and all(d.action == "hold" for d in ds)
    assert all("within the 10% tolerance: holding at 4" in d.reason for d in evaluated)
    assert p.observe(obs(4, t=100, cpu=None)).reason == "no worker CPU reading in this window"


def test_cpu_policy_limits_scale_up_rate_and_max():
    p = CpuUtilizationPolicy(CpuConfig(pause_after_change_s=0, target_util=0.1, max_workers=100))
    ds = [p.observe(obs(10, t=t, cpu=1.0)) for t in range(1, 16)]  # wants ceil(10 × 1.0 / 0.1) = 100
    assert ds[-1].action == "add" and ds[-1].target == 20  # at most +100% (or +4) per evaluation
    trace = simulate(CpuUtilizationPolicy(CpuConfig(max_workers=3)), SyntheticJob(0.02, 0.2, cpu_when_busy=1.0),
                     20_000, seed=2)
    assert max(s.obs.workers for s in trace) == 3


@pytest.mark.parametrize("seed", SEEDS)
def test_cpu_policy_under_provisions_a_latency_bound_job(seed):
    """Workers waiting on storage show 30% CPU; each one still adds throughput up to the knee."""
    job = SyntheticJob(0.040, 0.160, cpu_when_busy=0.3)
    hpa = simulate(CpuUtilizationPolicy(), job, 60_000, seed=seed)
    cachew = simulate(CachewPolicy(), job, 60_000, seed=seed)
    assert max(s.obs.workers for s in hpa) == 1 < job.knee - 1
    assert abs(cachew[-1].obs.workers - job.knee) <= 1
    assert hpa[-1].obs.t > 3 * cachew[-1].obs.t  # the same batches take over 3x as long
    said = [s.decision.reason for s in hpa if "ceil(" in s.decision.reason]
    held = r"CPU [23]\d% vs target 80%: ceil\(1 × 0\.\d\d / 0\.80\) = 1: holding at 1$"
    assert len(said) > 100 and all(re.search(held, r) for r in said)


@pytest.mark.parametrize("seed", SEEDS)
def test_cpu_policy_over_provisions_a_cpu_heavy_job(seed):
    """Busy workers at 100% CPU: HPA keeps 20% headroom, so it ends past the knee: ceil(4 / 0.8) = 5."""
    job = SyntheticJob(0.040, 0.160, cpu_when_busy=1.0)
    hpa = simulate(CpuUtilizationPolicy(), job, 60_000, seed=seed)
    assert hpa[-1].obs.workers == 5 > job.knee


@pytest.mark.parametrize("offset", range(0, 1000, 50))
def test_cachew_is_not_misled_by_a_recheck_window_that_straddles_the_change(offset):
    """Wherever the change falls in the re-check cycle, the policy scales down to the new knee:
    a re-check window half old job, half new is confirmed on a fresh window before acting."""
    wide, slower = SyntheticJob(0.030, 0.200), SyntheticJob(0.090, 0.200)  # knees 7 and 3
    at = PHASE_AT + offset
    trace = simulate(CachewPolicy(), [(0, wide), (at, slower)], at + 2 * PHASE_AT, seed=offset)
    at_change = index_at_batch(trace, at)
    assert abs(trace[at_change - 1].obs.workers - wide.knee) <= 1
    assert abs(trace[-1].obs.workers - slower.knee) <= 1 and trace[-1].phase == "converged"
    assert all(d.action == "remove" or "adding it back" in d.reason for _, d in changes(trace[at_change:]))
