"""`dsctl profile`: one profile of one spec, from the first measurement to the recorded run.

    profile_job(spec_path, ProfileOptions(...), listener) -> Profile

The order, and why:
1. The trainers' consumption rate, when --target-bps does not give it: a synthetic model's step time is
   in the spec; any other model (keras, python, a program) is measured in dsctl's ideal mode first, as
   sweeps measure their ideal baseline, so that nothing else competes for this machine's cores meanwhile.
2. One profiling process (process.py) runs the pipeline as a worker would: the pipeline as written, then
   every candidate change (advice.py), each for the same window. Effects are before/after pairs from this
   one process on this machine, minutes apart at most.
3. With --service, the same pipeline on one real tf.data service worker of the spec's provider (a short
   run of dsctl's own trainer with no step time): what serving costs on top of the pipeline, measured by
   the OS in the worker's process, beside the trainer's own view (one DataService node).
4. The profile is a run of its own (kind `profile`) in the store: `dsctl runs` lists it, `dsctl runs show`
   prints it, `sweep --profile` and `autoscale.start: profile` read it. Teardown (the profiling process and
   all it started; a --service deployment) happens before anything is recorded.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsctl.costmodel.machines import shape
from dsctl.provisioners.registry import provider_class
from dsctl.runtime.profiling.record import Measurement, Structure, Variant, measurement_from, step_from, structure_from, to_json
from dsctl.specs import LoadedSpec, SpecError, spec_hash
from dsctl.specs.pipelines import examples_per_epoch

from ..outcome import Outcome
from ..records import ProfileSummary
from ..run import JobRunner, new_run_id
from ..store import RunStore, dsctl_home
from . import advice
from .analysis import predict, table
from .process import STARTUP_S, ProfilerProcess
from .record import Effect, Profile, Recommendation, ServiceView

SHARDED = ("distributed_epoch", "dynamic", "file", "data", "file_or_data", "hint")
SLACK_S = 90.0  # on top of a measurement's window: building the variant, a slow first element
IDEAL_S = 6.0  # seconds of ideal mode when a model's step time must be measured


@dataclass(frozen=True)
class ProfileOptions:
    seconds: float = 8.0
    warmup_s: float = 2.0
    target_bps: float | None = None  # the trainers' consumption in all; None: the job's ideal rate
    cache_gb: float | None = None  # storage a cache may take; None: the free disk where autocache keeps caches
    service: bool = False  # also measure one real tf.data service worker
    recommend: bool = True


@dataclass
class ProfileProgress:
    """What the live view shows while a profile runs."""

    run_id: str
    phase: str = "starting"
    done_s: float = 0.0
    total_s: float = 0.0
    batches: int = 0
    batches_per_s: float | None = None


Listener = Callable[[ProfileProgress], None]


class ProfileSession:
    def __init__(self, loaded: LoadedSpec, options: ProfileOptions, *, store: RunStore | None = None,
                 listener: Listener | None = None):
        self.loaded, self.spec, self.opt = loaded, loaded.spec, options
        self.store = store or RunStore()
        self.listener = listener or (lambda p: None)
        self.run_id = new_run_id(f"{self.spec.name}-profile")
        self.run_dir = dsctl_home() / "runs" / self.run_id
        self.progress = ProfileProgress(run_id=self.run_id)
        self.notes: list[str] = []
        self._steps: list = []  # the reorderable sections' steps, measured alone (advice.step_rows)

    # -- progress -------------------------------------------------------------------------------------------------
    def _phase(self, phase: str) -> None:
        self.progress.phase, self.progress.done_s, self.progress.batches = phase, 0.0, 0
        self.progress.batches_per_s = None
        self.listener(self.progress)

    def _child_progress(self, record: dict) -> None:
        p = self.progress
        p.phase = f"{record.get('label')}: {record.get('phase')}"
        p.done_s, p.total_s, p.batches = record.get("done", 0.0), record.get("total", 0.0), record.get("batches", 0)
        p.batches_per_s = p.batches / p.done_s if record.get("phase") == "measuring" and p.done_s > 0 else None
        self.listener(p)

    # -- the profile ----------------------------------------------------------------------------------------------
    def run(self) -> Profile:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        spec_json = self.run_dir / "spec.json"
        spec_json.write_text(self.spec.model_dump_json(indent=1))
        self.store.create_run(
            id=self.run_id, name=self.spec.name, kind="profile", provider=self.spec.provider, mode="profile",
            status="running", spec_path=self.loaded.source.path, spec_json=self.spec.model_dump_json(),
            spec_hash=spec_hash(self.spec), workers=1, trainers=self.spec.trainer.count, run_dir=str(self.run_dir))
        outcome = Outcome()
        profile = None
        try:
            with outcome.classify(self.run_id, "interrupted by the user; nothing it started is left running"):
                profile = self._profile(spec_json)
        finally:
            summary = profile_summary(profile) if profile is not None else ProfileSummary()
            self.store.update_run(self.run_id, status=outcome.status, ended_at=time.time(), error=outcome.error,
                                  summary=summary)
        assert profile is not None, "an outcome that is not succeeded raised"
        return profile

    def _profile(self, spec_json: Path) -> Profile:
        target_bps, target_source, step_s = self._target()
        with ProfilerProcess(spec_json, self.loaded.base_dir, dsctl_home() / "cache", self.run_dir,
                             listener=self._child_progress) as child:
            self._phase("starting the profiling process")
            try:
                structure = structure_from(child.ask("inspect", STARTUP_S))
                baseline = self._measure(child, Variant())
                rows, rate = table(baseline)
                recommendations = self._recommend(child, structure, baseline, rows, rate.scale, step_s) \
                    if self.opt.recommend else []
                steps = self._steps if self.opt.recommend else []
            except SpecError as exc:
                raise self.loaded.locate(exc) from None
        service = self._service(rate.cpu_s_per_batch) if self.opt.service else None
        worker = self.spec.service.worker_machine
        provider = provider_class(self.spec.provider)
        prediction = predict(baseline, target_bps=target_bps, target_source=target_source, worker_machine=worker,
                             cores_per_worker=shape(worker).vcpus,
                             here_cap=bool(provider is not None and provider.runs_here))
        notes = list(self.notes) + list(baseline.notes)
        if structure.finite:
            notes.append("the pipeline ends; it was repeated for the measurement, which is of its steady state")
        if self.spec.autocache is not None and self.spec.autocache.mode not in ("auto", "compute"):
            notes.append(f"autocache.mode is {self.spec.autocache.mode}: profiled computing every element, as a "
                         "job does before its cache is written")
        if not structure.hints:
            notes.append("no autocache hints: mark where caching is acceptable with dsctl.autocache(ds, NAME) (after "
                         "reading, or after deterministic transformations) and dsctl can weigh a cache there")
        profile = Profile(job=self.spec.name, spec_path=self.loaded.source.path, run_id=self.run_id,
                          created_at=time.time(), seconds=self.opt.seconds, element=structure.element,
                          finite=structure.finite, rows=rows, rate=rate, prediction=prediction,
                          recommendations=recommendations, steps=steps, service=service, notes=notes,
                          recommended=self.opt.recommend)
        from .chart import plot_profile  # matplotlib: not on the dispatcher VM, whose `dsctl supervise` imports the CLI

        profile.chart = str(plot_profile(profile, self.run_dir / "profile.png"))
        (self.run_dir / "profile.json").write_text(json.dumps(profile.to_dict(), indent=1))
        return profile

    def _measure(self, child: ProfilerProcess, variant: Variant, warmup_s: float | None = None) -> Measurement:
        warmup = max(self.opt.warmup_s, warmup_s or 0.0)
        limit = warmup + self.opt.seconds + SLACK_S
        return measurement_from(child.ask("measure", limit, variant=to_json(variant), seconds=self.opt.seconds,
                                          warmup_s=warmup))

    # -- what the trainers consume ----------------------------------------------------------------------------------
    def _target(self) -> tuple[float | None, str, float]:
        """(batches/s the trainers consume in all, where that comes from, one trainer's step time in seconds)."""
        trainers = self.spec.trainer.count
        model = self.spec.trainer.model
        if self.spec.trainer.command is None and model.kind == "synthetic" and not model.phases:
            if model.step_time_ms <= 0 and model.padded_token_time_us <= 0:
                step_s = 0.0
                ideal = None
                source = ("none: the model takes no time per step (trainer.model.step_time_ms: 0), so no number of "
                          "workers keeps up; give --target-bps")
            else:
                step_s = model.step_time_ms / 1e3
                ideal = trainers / step_s if step_s > 0 else None
                source = (f"from the spec: {trainers} trainer(s) × 1 ÷ trainer.model.step_time_ms ({model.step_time_ms:g}"
                          " ms)" if ideal else "from the spec: padded-token time only; give --target-bps")
        else:
            ideal_one = self._measure_ideal()
            step_s = 1.0 / ideal_one
            ideal = ideal_one * trainers
            source = f"measured here: {trainers} trainer(s) × {ideal_one:.3g} batches/s in ideal mode"
        if self.opt.target_bps is not None:
            return self.opt.target_bps, "--target-bps", step_s
        return ideal, source, step_s

    def _measure_ideal(self) -> float:
        """One trainer's batches/s when input never stalls (dsctl's ideal mode), measured here."""
        self._phase("measuring the model's step time (ideal mode)")
        runner = JobRunner(self.loaded, mode="ideal", store=self.store, kind="point", parent_id=self.run_id,
                           duration_s=IDEAL_S, repeat=True)
        runner.run()
        bps = self.store.recorded(runner.run_id).job.batches_per_s
        if not bps:
            raise SpecError(f"the ideal mode measured no throughput for this job's model (run {runner.run_id}); "
                            "give the trainers' rate with --target-bps.", field="--target-bps")
        return float(bps)

    # -- recommendations ----------------------------------------------------------------------------------------------
    def _recommend(self, child: ProfilerProcess, structure: Structure, baseline: Measurement, rows, scale: float,
                   step_s: float) -> list[Recommendation]:
        spec = self.spec
        options = spec.pipeline.options
        candidates = [c for c in (advice.parallelize(structure, baseline, rows, scale, options),
                                  advice.prefetch(structure, baseline, rows, step_s, options)) if c is not None]
        budget, budget_source = self._cache_budget()
        epoch = examples_per_epoch(spec.pipeline.builtin, spec.pipeline.params) if spec.pipeline.builtin else None
        found = advice.cache(structure, baseline, rows, elements_per_epoch=epoch, budget_bytes=budget,
                             budget_source=budget_source, sharded=spec.service.processing_mode in SHARDED)
        if found is not None:
            candidates.append(found)
        self._steps = []
        if structure.sections:
            self._phase("measuring each reorderable step alone")
            answer = child.ask("steps", STARTUP_S)
            measured = [step_from(s) for s in answer["steps"]]
            self._steps = advice.step_rows(measured)
            self.notes += [f"reorderable step that cannot run on its section's input alone: {r}" for r in answer["refused"]]
            candidates += advice.reorder(structure, measured)
        out: list[Recommendation] = []
        stepped: Measurement | None = None
        for c in candidates:
            try:
                before = baseline
                if c.baseline_step_s:
                    if stepped is None:
                        stepped = self._measure(child, Variant(label="as written, with the step time",
                                                               consumer_step_s=c.baseline_step_s))
                    before = stepped
                after = self._measure(child, c.variant, c.warmup_s)
            except SpecError as exc:
                out.append(_with(c.recommendation, note=f"not measured: {exc.message}"))
                continue
            effect = Effect(before_bps=before.batches_per_s, after_bps=after.batches_per_s,
                            before_cpu_s_per_batch=before.cpu_s_per_batch or math.inf,
                            after_cpu_s_per_batch=after.cpu_s_per_batch or math.inf,
                            consumer_step_s=c.variant.consumer_step_s)
            out.append(_with(c.recommendation, effect=effect))
        return sorted(out, key=lambda r: -(r.effect.gain if r.effect else 0.0))

    def _cache_budget(self) -> tuple[float, str]:
        if self.opt.cache_gb is not None:
            return self.opt.cache_gb * 1e9, "given (--cache-gb)"
        ac = self.spec.autocache
        where = (ac.cache_dir if ac and ac.cache_dir else str(dsctl_home() / "cache" / "autocache"))
        if where.startswith("gs://"):
            return math.inf, f"of Cloud Storage ({where})"
        path = Path(where).expanduser()
        while not path.exists() and path != path.parent:
            path = path.parent
        return float(shutil.disk_usage(path).free), f"free at {where} (measured here)"

    # -- one real worker ----------------------------------------------------------------------------------------------
    def _service(self, cpu_s_per_batch: float) -> ServiceView:
        """The pipeline through one tf.data service worker of the spec's provider, read as fast as it comes."""
        self._phase("one tf.data service worker")
        spec = self.spec
        trainer = spec.trainer.model_copy(update={
            "command": None, "count": 1, "model": spec.trainer.model.model_copy(update={
                "kind": "synthetic", "step_time_ms": 0.0, "padded_token_time_us": 0.0, "phases": [], "entrypoint": None}),
            "steps": None, "duration_s": None, "checkpoint": None})
        service = spec.service.model_copy(update={"workers": 1, "coordinated_reads": None, "job_name": None,
                                                  "cross_trainer_cache": False})
        copy = spec.model_copy(update={"trainer": trainer, "service": service, "autoscale": None, "autocache": None})
        loaded = LoadedSpec(spec=copy, source=self.loaded.source, pipeline_cardinality=self.loaded.pipeline_cardinality)
        runner = JobRunner(loaded, mode="service", workers=1, store=self.store, kind="point", parent_id=self.run_id,
                           duration_s=self.opt.warmup_s + self.opt.seconds, repeat=True)
        runner.run()
        s = self.store.recorded(runner.run_id).job
        bps = s.batches_per_s or 0.0
        worker = s.worker_cpu_seconds_per_batch
        return ServiceView(run_id=runner.run_id, batches_per_s=bps, worker_cpu_s_per_batch=worker,
                           overhead=worker / cpu_s_per_batch if worker and cpu_s_per_batch else None,
                           trainer_view="a trainer's own autotune model stops at the service (one DataService node "
                                        "for the whole pipeline), so the table above, from the profiling process, "
                                        "is what the worker runs")


def profile_summary(profile: Profile) -> ProfileSummary:
    """A profile as its run's record keeps it: the profile whole, and the rate and window `dsctl runs` lists."""
    return ProfileSummary.model_validate({**profile.to_dict(), "batches_per_s": profile.rate.batches_per_s,
                                          "duration_s": profile.rate.seconds})


def _with(rec: Recommendation, **changes) -> Recommendation:
    from dataclasses import replace

    return replace(rec, **changes)


def profile_job(spec_path: Path, options: ProfileOptions, listener: Listener | None = None,
                store: RunStore | None = None) -> Profile:
    """`dsctl profile`: the spec at `spec_path` loaded (its entrypoints checked in a contained child; a profile
    repeats the pipeline, so it reads no epochs) and its pipeline profiled (module docstring); the profile, also
    recorded as a run."""
    from ..preflight import load_job

    return ProfileSession(load_job(spec_path, mode=None), options, store=store, listener=listener).run()
