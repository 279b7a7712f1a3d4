"""Pecan's placement policy (orchestrator/policies/pecan.py) in a closed loop against a synthetic hybrid job.

The job: remote workers each make a batch in `remote_s`, local workers in `local_s` (the trainer's own cores); the
model needs `step_s` per batch, slowed by `steal` per local worker (a model that needs the trainer's CPU). A batch
takes max(model step, 1 / (remote / remote_s + local / local_s)). Prices: trainers T $/h, remote workers W $/h.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dsctl.orchestrator.policies import make_policy
from dsctl.orchestrator.policies.base import Observation
from dsctl.orchestrator.policies.pecan import PecanPolicy, remote_worker_pays


@dataclass(frozen=True)
class HybridJob:
    step_s: float
    remote_s: float
    local_s: float
    steal: float = 0.0  # the model's step grows by this fraction per local worker

    def batch_time(self, remote: int, local: int) -> tuple[float, float]:
        step = self.step_s * (1 + self.steal * local)
        rate = remote / self.remote_s + local / self.local_s
        return max(step, 1 / rate), step


def run(policy: PecanPolicy, job: HybridJob, windows: int = 200) -> list[tuple[int, int, str]]:
    """Feed the policy 50-batch windows of the job at the placement it asks for; the decisions that changed it."""
    remote, local, t, changes = policy.initial_workers, 0, 0.0, []
    for _ in range(windows):
        bt, step = job.batch_time(remote, local)
        t += 50 * bt
        d = policy.observe(Observation(t=t, workers=remote, local_workers=local, batch_time_s=bt,
                                       input_stall_frac=1 - step / bt, batches=50, worker_cpu_util=0.5))
        if (d.target, d.local_target) != (remote, local):
            remote, local = d.target, d.local_target if d.local_target is not None else local
            changes.append((remote, local, d.reason))
    return changes


def pecan(**settings) -> PecanPolicy:
    base = dict(min_workers=1, max_workers=8, local_cap=2, trainers_per_hour=4.0, worker_cpu_per_hour=0.3,
                worker_memory_per_hour=0.1, window_batches=100, pause_batches=50)
    policy = make_policy("pecan", {**base, **settings})
    assert isinstance(policy, PecanPolicy)
    return policy


def test_idle_trainer_cpus_replace_remote_workers():
    """A model with idle host CPU: phase 1 finds the remote count that pays, phase 2 adds both local workers, phase 3
    removes the remote workers they replaced, and the end is cheaper per batch at the same batch time."""
    job = HybridJob(step_s=0.05, remote_s=0.2, local_s=0.2)
    policy = pecan()
    changes = run(policy, job)
    remote, local, _ = changes[-1]
    assert policy.phase == "hold"
    assert local == 2
    # Remote only, phase 1 climbs to 4 workers (4 × 1/0.2 = 20 batches/s = 1/step; the 5th is tried and removed);
    # with 2 local workers 2 remote do.
    assert [r for r, lo, _ in changes if lo == 1][0] == 4
    assert remote == 2
    assert job.batch_time(remote, local)[0] == pytest.approx(job.batch_time(4, 0)[0])
    assert any("phase 3" in why for _, _, why in changes)


def test_a_model_that_needs_the_trainer_cpu_gets_no_local_worker_and_is_told_why():
    """Each local worker slows the model's own step by 30%: the one tried is removed, and the reason says so."""
    job = HybridJob(step_s=0.05, remote_s=0.2, local_s=0.2, steal=0.3)
    policy = pecan()
    changes = run(policy, job)
    assert policy.phase == "hold"
    assert changes[-1][1] == 0 or any(lo == 0 and "removing it" in why for _, lo, why in changes)
    final_local = [lo for _, lo, _ in changes][-1]
    assert final_local == 0
    [removal] = [why for _, lo, why in changes if "local worker 1 changed" in why]
    assert "more than the 10% allowed" in removal and "needs the trainer's CPU" in removal


def test_phase_1_adds_a_remote_worker_only_when_a_batch_gets_cheaper():
    """Pecan's inequality, both ways round: with trainers dear and workers cheap a 10% gain pays; with trainers
    cheap and workers dear it does not (a flipped inequality says the opposite)."""
    assert remote_worker_pays(0.10, trainers_per_hour=10.0, remote=2, worker_per_hour=0.5)
    assert not remote_worker_pays(0.10, trainers_per_hour=0.1, remote=2, worker_per_hour=5.0)
    # A batch costs bt·(T + n·W): the rule agrees with that product, including at the margin.
    for gain, t, n, w in [(0.05, 1.0, 3, 0.2), (0.2, 0.5, 1, 1.0), (0.01, 8.0, 10, 0.05), (0.3, 0.0, 1, 1.0)]:
        cheaper = (1 - gain) * (t + (n + 1) * w) < t + n * w
        assert remote_worker_pays(gain, t, n, w) == cheaper


def test_dear_remote_workers_are_not_added():
    """A second remote worker that cuts batch time 17% (60 → 50 ms): worth it beside trainers at $100/h, not beside
    trainers at $1/h with workers at $5/h; there it is removed again, and the job goes local."""
    job = HybridJob(step_s=0.05, remote_s=0.06, local_s=0.06)
    assert run(pecan(trainers_per_hour=100.0, worker_cpu_per_hour=5.0, local_cap=0), job)[0][:2] == (2, 0)
    policy = pecan(trainers_per_hour=1.0, worker_cpu_per_hour=4.9)
    changes = run(policy, job)
    assert changes[0][:2] == (2, 0) and changes[1][:2] == (1, 0)
    assert "does not pay" in changes[1][2]
    assert changes[-1][:2] == (1, 2)


def test_utilization_basis_charges_a_worker_its_measured_cpu():
    policy = pecan(basis="utilization", worker_cpu_per_hour=1.0, worker_memory_per_hour=0.2)
    assert policy.worker_per_hour(0.25) == pytest.approx(0.45)
    assert pecan(worker_cpu_per_hour=1.0, worker_memory_per_hour=0.2).worker_per_hour(0.25) == pytest.approx(1.2)


def test_a_placement_the_policy_did_not_ask_for_restarts_phase_1():
    job = HybridJob(step_s=0.05, remote_s=0.2, local_s=0.2)
    policy = pecan()
    run(policy, job)
    assert policy.phase == "hold"
    for t in range(4):  # a remote worker died: 1 + 2 instead of 2 + 2
        policy.observe(Observation(t=1e4 + t, workers=1, local_workers=2, batch_time_s=0.06, input_stall_frac=0.1,
                                   batches=50))
    assert policy.phase == "remote"


def test_phase_3_removes_a_remote_worker_whose_saving_pays_for_the_longer_run():
    """Trainers at $1/h, remote workers at $4/h: without the last remote worker a batch takes a third longer (50 →
    67 ms) but costs a quarter less ($0.125 → $0.093 per 1,000 batches), so phase 3 removes it; a rule on batch time
    alone would keep it."""
    job = HybridJob(step_s=0.05, remote_s=0.2, local_s=0.2)
    policy = pecan(trainers_per_hour=1.0, worker_cpu_per_hour=4.0, worker_memory_per_hour=0.0)
    changes = run(policy, job)
    assert policy.phase == "hold"
    assert changes[-1][:2] == (1, 2)
    assert "cheaper" in changes[-1][2]


def test_the_policy_gets_the_runs_prices_and_autoscale_flag_and_placement_agree(tmp_path):
    """placement: auto alone gets the pecan policy with the catalog's prices and local_workers as its cap; --autoscale
    naming pecan without placement: auto, or another policy with it, is refused (the trainers could not follow)."""
    from dsctl.orchestrator.preflight import check_autoscale
    from dsctl.specs import load_spec
    from dsctl.specs.errors import UsageError

    auto, remote = tmp_path / "auto.yaml", tmp_path / "remote.yaml"
    job = ("name: j\nservice: {{worker_machine: n2-standard-8{extra}}}\ntrainer: {{machine: tpu-v2-8, count: 2, "
           "steps: 10}}\npipeline: {{builtin: synthetic, params: {{epochs: null}}}}\npricing: gcp-us-central1-2025\n")
    auto.write_text(job.format(extra=", placement: auto, local_workers: 3"))
    remote.write_text(job.format(extra=""))
    policy = check_autoscale(load_spec(auto))
    assert isinstance(policy, PecanPolicy)
    c = policy.config
    assert c.local_cap == 3 and c.basis == "utilization"
    from dsctl.costmodel.catalog import load_catalog

    catalog = load_catalog("gcp-us-central1-2025")
    assert c.trainers_per_hour == pytest.approx(2 * catalog.machine_hour("tpu-v2-8"))
    worker = catalog.split("n2-standard-8")
    assert (c.worker_cpu_per_hour, c.worker_memory_per_hour) == (pytest.approx(worker.cpu), pytest.approx(worker.memory))
    with pytest.raises(UsageError, match="service.placement: auto turns on"):
        check_autoscale(load_spec(remote), "pecan")
    with pytest.raises(UsageError, match="placed by the pecan policy"):
        check_autoscale(load_spec(auto), "cachew")


def test_a_removal_within_the_noise_threshold_counts_as_costing_no_time():
    """Beside trainers at $100/h a remote worker at $0.1/h is 0.1% of the hourly cost: by money alone, a removal that
    reads 2% slower (one window's noise here) would be undone. dsctl's rule takes a rise within `threshold` (3%) as
    none, so the trim goes on; a rise past it (6%) is judged on money and undone."""
    def trimmed(rise: float) -> str:
        policy = pecan(trainers_per_hour=100.0, worker_cpu_per_hour=0.1, worker_memory_per_hour=0.0, local_cap=0,
                       min_workers=1, max_workers=3, start_workers=3)
        policy._phase, policy._remote = "trim", 3  # phase 3 from 3 remote workers, measured at 10 ms
        from dsctl.orchestrator.policies.base import summarize
        from dsctl.orchestrator.policies.pecan import Point

        base = Observation(t=0.0, workers=3, batch_time_s=0.010, input_stall_frac=0.0, batches=100)
        policy._before = Point(3, 0, summarize([base]), 100.3)
        policy._remote, policy._since_change = 2, 10**6  # the removal happened and its pause is over
        d = policy.observe(Observation(t=1.0, workers=2, batch_time_s=0.010 * (1 + rise), input_stall_frac=0.0,
                                       batches=100))
        return f"{d.action} {d.target}: {d.reason}"

    assert trimmed(0.02).startswith("remove 1") and "within the 3% noise threshold" in trimmed(0.02)
    assert trimmed(0.06).startswith("add 3") and "dearer" in trimmed(0.06)


def test_the_trainers_read_only_a_count_from_the_policys_file(tmp_path):
    """What the policy asks (placement.ask) is what a trainer reads; anything else in the file is no request."""
    from dsctl.runtime.placement import CONTROL, _wanted, ask

    ask(tmp_path, 3)
    assert _wanted(tmp_path / CONTROL) == 3
    for text in ('{"local_workers": -1}', '{"local_workers": true}', '{"local_workers": "2"}', "{", "[]", ""):
        (tmp_path / CONTROL).write_text(text)
        assert _wanted(tmp_path / CONTROL) is None, text
    assert _wanted(tmp_path / "missing.json") is None
