"""Profiles read back by the rest of dsctl: `sweep --simulate --profile` and `autoscale.start: profile`.

A profile is found by its run id (or a prefix of it) in the store, or as a profile.json file (what
`dsctl profile --json` prints, or the run folder's copy).
"""

from __future__ import annotations

import json
from pathlib import Path

from dsctl.costmodel.hybrid import PipelineRate
from dsctl.specs import LoadedSpec, SpecError, UsageError
from dsctl.specs.calibration import Calibration

from ..store import RunStore
from .record import Profile, is_profile


def load_profile(ref: str, store: RunStore | None = None) -> Profile:
    """A profile by run id (or unique prefix) or by file; a usage error naming what was looked for."""
    path = Path(ref).expanduser()
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"{ref} cannot be read as JSON ({exc}); give a profile's run id or the profile.json that "
                            "`dsctl profile` wrote.", field="--profile") from None
        if not is_profile(data):
            raise UsageError(f"{ref} is not a dsctl profile (`dsctl profile JOB.yaml --json` writes one).",
                             field="--profile")
        return Profile.from_dict(data)
    record = (store or RunStore()).find(ref)
    profile = record.profiled.profile() if record is not None else None
    if profile is None:
        raise UsageError(f"no profile '{ref}' is recorded; `dsctl runs` lists runs (profiles are of mode profile), "
                         "`dsctl profile JOB.yaml` makes one.", field="--profile")
    return profile


def calibration_from(profile: Profile, *, trainers: int, trainer_vcpus: int) -> Calibration:
    """The sweep's throughput model calibrated from a profile instead of a measured sweep point: one worker's
    predicted rate per trainer as the 1-worker point, the job's consumption rate as ideal, and the colocated
    rate the trainer's own cores would give (its cores ÷ CPU per batch, and the pipeline's sequential limits, at
    most ideal)."""
    pred = profile.prediction
    if pred.target_bps is None:
        raise SpecError(f"profile {profile.run_id} has no consumption rate for the trainers (its model takes no time "
                        "per step); profile again with --target-bps.", field="--profile")
    trainers = max(1, trainers)  # a sweep's rates are per trainer; the profile's target is all trainers'
    ideal = pred.target_bps / trainers
    per_worker = pred.per_worker_bps / trainers
    # colocated: the pipeline on the trainer's own cores, with the same sequential limits as a worker
    limits = [b.bps for b in pred.bounds if b.what != "CPU"]
    if profile.rate.cpu_s_per_batch > 0:
        limits.append(trainer_vcpus / profile.rate.cpu_s_per_batch)
    colocated = min([ideal, *limits])
    return Calibration(colocated=colocated, ideal=ideal, points={1: min(per_worker, ideal)},
                       source=(f"profile {profile.run_id}: 1 worker predicted from CPU per batch measured here "
                               f"({profile.rate.cpu_s_per_batch * 1e3:.3g} ms) on {pred.worker_machine}; ideal "
                               f"{pred.target_source}; colocated predicted on the trainer's {trainer_vcpus} cores"))


def latest_for(loaded: LoadedSpec, store: RunStore | None = None) -> Profile | None:
    """The newest successful profile of a job with this name and this pipeline."""
    spec = loaded.spec
    for record in (store or RunStore()).list(kinds=("profile",)):
        profile = record.profiled.profile()
        if record.name != spec.name or record.status != "succeeded" or profile is None:
            continue
        if json.loads(record.spec_json).get("pipeline") != json.loads(spec.model_dump_json()).get("pipeline"):
            continue
        return profile
    return None


def pipeline_rate(loaded: LoadedSpec, store: RunStore | None = None) -> PipelineRate | None:
    """What the newest profile of this job's pipeline says for predicting worker counts (a hybrid placement's plan:
    the remote workers its in-process ones save), or None without one."""
    profile = latest_for(loaded, store)
    if profile is None or profile.rate.cpu_s_per_batch <= 0:
        return None
    pred = profile.prediction
    sequential = [b.bps for b in pred.bounds if b.what != "CPU"]
    return PipelineRate(cpu_s_per_batch=profile.rate.cpu_s_per_batch, sequential_bps=min(sequential, default=None),
                        target_bps=pred.target_bps,
                        source=f"profile {profile.run_id}: {profile.rate.cpu_s_per_batch * 1e3:.3g} ms CPU per batch "
                               f"measured here, target {pred.target_source}")


def start_workers(loaded: LoadedSpec, min_workers: int, max_workers: int,
                  store: RunStore | None = None) -> tuple[int, str]:
    """(the count an autoscaled run starts at, why): the newest profile's prediction within min..max, else min."""
    profile = latest_for(loaded, store)
    if profile is None or profile.prediction.workers is None:
        return min_workers, ("autoscale.start: profile, but no profile of this job's pipeline predicts a count "
                             f"(`dsctl profile {loaded.source.path}` makes one): starting at min_workers")
    n = min(max(profile.prediction.workers, min_workers), max_workers)
    return n, (f"starting at {n} worker(s): profile {profile.run_id} predicted {profile.prediction.workers} for "
               f"{profile.prediction.target_bps:.3g} batches/s")


def profile_calibration(ref: str, loaded: LoadedSpec, store: RunStore | None = None) -> Calibration:
    """`dsctl sweep --simulate --profile REF`: the sweep's calibration from a recorded profile (or its file)."""
    from dsctl.costmodel.machines import shape

    profile = load_profile(ref, store)
    spec = loaded.spec
    try:
        vcpus = shape(spec.trainer.machine).vcpus
    except SpecError:  # a trainer that is this machine (trainer.machine: local)
        vcpus = profile.rate.cores_here
    return calibration_from(profile, trainers=spec.trainer.count, trainer_vcpus=vcpus)
