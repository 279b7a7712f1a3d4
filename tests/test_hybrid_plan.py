"""The plan of a hybrid placement (provisioners/plan.py, costmodel/hybrid.py): its in-process workers priced (nothing
more on the vm-hours basis), and the remote workers they save, predicted from a profile's CPU per batch, or said to be
unpredictable without one."""

from __future__ import annotations

import math

import pytest

from dsctl.costmodel.hybrid import PipelineRate, predict_hybrid
from dsctl.provisioners.gcp.planning import plan
from dsctl.specs import load_spec_text

SPEC = """
name: hybrid-plan
provider: gcp
service: {{workers: {workers}, worker_machine: n2-standard-8, placement: hybrid, local_workers: {local}}}
trainer: {{machine: {machine}, count: {count}, steps: 1000, model: {{step_time_ms: 100}}}}
pipeline: {{builtin: synthetic, params: {{epochs: null}}}}
gcp: {{project: my-project-123, zone: us-central1-b}}
"""


def rate(cpu_s: float = 2.0, sequential: float | None = None, target: float | None = None) -> PipelineRate:
    return PipelineRate(cpu_s_per_batch=cpu_s, sequential_bps=sequential, target_bps=target, source="profile p1")


def test_in_process_workers_add_their_rate_on_the_trainer_cores_the_step_leaves():
    """2 CPU s a batch: an n2-standard-8 worker (8 vCPUs) 4 batches/s; two e2-standard-8 trainers (8 vCPUs, 1 for the
    step) with 2 in-process workers each: 3.5 cores, 1.75 batches/s each. 2 remote + 4 local = 8 + 7 = 15 batches/s,
    which remote-only placement needs 4 workers for: 2 saved."""
    s = predict_hybrid(rate(), remote=2, worker_vcpus=8, trainer_vcpus=8, trainers=2, local_per_trainer=2)
    assert (s.remote_bps, s.local_bps) == (4.0, 1.75)
    assert s.throughput_bps == 15.0 and not s.capped
    assert (s.remote_only, s.saved) == (4, 2)


def test_a_sequential_limit_caps_an_in_process_worker_however_many_cores_it_has():
    s = predict_hybrid(rate(sequential=5.0), remote=1, worker_vcpus=8, trainer_vcpus=96, trainers=1,
                       local_per_trainer=1)
    assert (s.remote_bps, s.local_bps) == (4.0, 5.0)
    assert (s.throughput_bps, s.remote_only, s.saved) == (9.0, 3, 2)


def test_the_trainers_consumption_caps_the_throughput_and_says_how_few_remote_workers_would_do():
    """Target 20 batches/s: remote-only needs 5 workers; with one TPU VM's in-process worker (95 cores: 47.5
    batches/s) the spec's 16 remote workers are more than it needs, and none would be needed."""
    s = predict_hybrid(rate(target=20.0), remote=16, worker_vcpus=8, trainer_vcpus=96, trainers=1,
                       local_per_trainer=1)
    assert s.capped and s.throughput_bps == 20.0
    assert (s.remote_only, s.saved, s.remote_needed) == (5, -11, 0)
    s = predict_hybrid(rate(target=20.0), remote=4, worker_vcpus=8, trainer_vcpus=8, trainers=1, local_per_trainer=1)
    assert not s.capped and (s.throughput_bps, s.remote_only, s.saved) == (19.5, 5, 1)


def test_the_plan_shows_the_in_process_workers_at_no_cost_and_the_remote_workers_they_save():
    spec = load_spec_text(SPEC.format(workers=2, local=2, machine="e2-standard-8", count=2)).spec
    shown = plan(spec, pipeline_rate=rate())
    assert shown.hybrid is not None and shown.hybrid.saving is not None and shown.hybrid.saving.saved == 2
    text = shown.render()
    assert ("Hybrid placement: 2 in-process worker(s) in each of 2 trainer(s) (e2-standard-8, 8 vCPUs): $0.0000/h "
            "more on the vm-hours basis") in text and "already billed whole on the trainers' line" in text
    saved = next(line for line in text.splitlines() if line.startswith("Remote workers saved"))
    assert saved.startswith("Remote workers saved (predicted from profile p1): a remote-only placement needs 4 "
                            "n2-standard-8 worker(s) for 15 batches/s; this one has 2 remote and 4 in-process"), saved
    each = next(line.per_hour_each for line in shown.lines if line.role == "workers")
    assert each and shown.hybrid.saving_per_hour == pytest.approx(2 * each)
    assert saved.endswith(f": 2 fewer remote worker(s), ${2 * each:.4f}/h."), saved
    # the machines' own lines and total are the same as without hybrid placement: it creates nothing more
    remote = load_spec_text(SPEC.format(workers=2, local=0, machine="e2-standard-8", count=2)
                            .replace("placement: hybrid, ", "")).spec
    assert plan(remote).per_hour == pytest.approx(shown.per_hour) and math.isfinite(shown.per_hour or math.nan)


def test_without_a_profile_the_plan_says_it_cannot_predict_and_a_remote_plan_says_nothing_of_it():
    spec = load_spec_text(SPEC.format(workers=16, local=1, machine="tpu-v2-8", count=1)).spec
    text = plan(spec).render()
    assert "Hybrid placement: 1 in-process worker(s) in each of 1 trainer(s) (tpu-v2-8, 96 vCPUs)" in text
    assert "Remote workers saved: not predicted: no profile of this job's pipeline" in text
    with_profile = plan(spec, pipeline_rate=rate(target=20.0)).render()
    assert "the remote workers alone reach it, so the in-process ones save none" in with_profile
    assert "no remote worker would be needed" in with_profile and "service.workers: 1." in with_profile
    remote = load_spec_text(SPEC.format(workers=16, local=0, machine="tpu-v2-8", count=1)
                            .replace("placement: hybrid, ", "")).spec
    assert "Hybrid placement" not in plan(remote, pipeline_rate=rate()).render()
