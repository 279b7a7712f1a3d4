"""`dsctl sweep`: one job over several worker counts, to find where more workers stop paying off.

The colocated and ideal baselines run once. Then, on ONE running deployment,
workers are added or removed in place for each count (no restart per point);
after each change a warm-up is discarded and a fixed window is measured. Each
point is recorded as a run (kind "point") under the sweep's own record, so
`dsctl runs` and `dsctl cost report` see them. With --simulate, counts this
machine cannot hold are predicted by the calibrated throughput model
(costmodel/throughput.py) and marked as predicted everywhere.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any, Literal

from dsctl.costmodel import RunUsage, ThroughputModel, load_catalog, price
from dsctl.costmodel.estimate import usage_from_spec
from dsctl.errors import signum_of
from dsctl.provisioners import Capacity, Deployment, Provider, TrainerLaunch, get_provider
from dsctl.specs import LoadedSpec, SpecError, spec_hash
from dsctl.specs.calibration import Calibration
from dsctl.specs.rules import check_rules
from dsctl.specs.schema import JobSpec, Mode

from . import closing
from .accelerators import trainer_accelerators
from .deployments import active_deployments
from .handles import AttachedDeployment, OwnedDeployment
from .home import dsctl_home
from .outcome import Interrupted, Outcome, RunFailed
from .plots import plot_surface, plot_sweep
from .preflight import load_job
from .pricing import price_record
from .profiling.uses import profile_calibration
from .recommend import cheapest_within, recommend
from .records import RunRecord, SweepSummary
from .run import JobRunner, Progress, new_run_id
from .store import RunStore
from .summary import utilization_summary
from .supervision import Supervisor
from .tail import JsonlTail

POLL_S = 0.1
TRAINER_WINDOW_S = 0.25  # short metrics windows: a point's measurement starts soon after its warm-up
FOREVER_S = 10 * 365 * 86400.0  # trainers read until the sweep stops them


@dataclass
class Window:
    """How long each point is measured: seconds, or batches per trainer."""

    seconds: float | None = 5.0
    batches: int | None = None

    @classmethod
    def parse(cls, text: str) -> Window:
        t = text.strip().lower()
        try:
            if t.endswith("s"):
                value = float(t[:-1])
                if value > 0:
                    return cls(seconds=value)
            else:
                value = int(t)
                if value > 0:
                    return cls(seconds=None, batches=value)
        except ValueError:
            pass
        raise SpecError(f"--window must be a number of batches (e.g. 200) or seconds (e.g. 5s), greater than zero; "
                        f"got '{text}'.", field="--window")

    def done(self, seconds: float, batches: int) -> bool:
        if self.seconds is not None:
            return seconds >= self.seconds
        assert self.batches is not None, "a window is seconds or batches"
        return batches >= self.batches

    def describe(self) -> str:
        return f"{self.seconds:g} s" if self.seconds is not None else f"{self.batches} batches"


@dataclass
class SweepOptions:
    counts: list[int]
    window: Window = field(default_factory=Window)
    warmup_s: float = 2.0
    simulate: bool = False
    tolerance: float = 0.03
    out_dir: Path | None = None
    strategy: Literal["in-place", "restart"] = "in-place"  # restart: a fresh deployment per point, for comparison
    calibration: Calibration | None = None  # given: nothing runs, every count is predicted from it
    profile: str | None = None  # a profile's run id or file (sweep --profile): the calibration made from it
    asked: str | None = None  # --workers as typed (e.g. 1..4), for saying which counts it gives
    # --local-workers: in-process workers per trainer (service.placement: hybrid), each count swept with every
    # remote count; None: the spec's own placement, one count
    local_counts: list[int] | None = None
    local_asked: str | None = None


class SweepRunner:
    def __init__(self, loaded: LoadedSpec, options: SweepOptions, *, store: RunStore | None = None,
                 listener: Callable[[Progress], None] | None = None, attach: Deployment | None = None):
        self.loaded, self.spec, self.opt = loaded, loaded.spec, options
        self.store = store or RunStore()
        self.listener = listener or (lambda p: None)
        self.attach = attach
        self._provider: Provider | None = None
        self.sweep_id = new_run_id(self.spec.name + "-sweep")
        self.run_dir = dsctl_home() / "runs" / self.sweep_id
        self.out_dir = options.out_dir or self.run_dir
        self.progress = Progress(run_id=self.sweep_id, phase="planning")
        self.catalog = load_catalog(self.spec.pricing, base_dir=loaded.base_dir)
        self.points: list[dict] = []
        self.baselines: dict[str, dict] = {}
        self.timings: dict[str, float] = {}  # wall seconds of the phases, for benchmarks/bench_sweep.py
        self._plan: tuple[list[int], list[int]] | None = None
        self._attached: AttachedDeployment | None = None

    @property
    def provider(self) -> Provider:
        """Created on first use: a sweep predicted from a calibration file provisions nothing."""
        if self._provider is None:
            self._provider = get_provider(self.spec.provider)
        return self._provider

    # -- planning ---------------------------------------------------------------------
    def plan(self) -> tuple[list[int], list[int]]:
        """(measured, predicted) counts, decided once (the CLI says them before the sweep starts)."""
        if self._plan is None:
            self._plan = self._make_plan()
        return self._plan

    def _make_plan(self) -> tuple[list[int], list[int]]:
        """Refuses what cannot run here before anything starts."""
        self._check_local()
        counts = sorted(self.opt.counts)
        if self.opt.calibration is not None:
            return [], counts
        if not isinstance(self.provider, Capacity) or self.attach is not None:
            return counts, []  # a place without a bound measures every count
        capacity = self.provider.capacity(self.spec.trainer.count)
        fits = [c for c in counts if c <= capacity]
        if not self.opt.simulate:
            try:
                self.provider.check(self.spec, counts[-1], self.loaded.base_dir)
            except SpecError as exc:
                raise self.loaded.locate(exc) from None
            return counts, []
        if not fits:
            raise SpecError(f"none of the worker counts {counts} fits on this machine (at most {capacity} here); "
                            "include smaller counts to calibrate the model, e.g. --workers 1..4,8..640.", field="--workers")
        return fits, [c for c in counts if c > capacity]

    def _check_local(self) -> None:
        """--local-workers: refused, naming the flag, where hybrid placement cannot run (the spec's own rules, on the
        spec as each count would run it: its provider's capability, coordinated reads, ...) or cannot be predicted."""
        local = [k for k in self.opt.local_counts or [] if k]
        if not local:
            return
        asked = f"--local-workers {self.opt.local_asked or ','.join(map(str, self.opt.local_counts or []))}"
        if self.opt.simulate or self.opt.calibration is not None or self.opt.profile is not None:
            raise SpecError(f"{asked} cannot be predicted: --simulate, --calibration and --profile model remote "
                            "worker counts only. Measure it (drop --simulate), or sweep --workers alone.",
                            field="--local-workers")
        if self.opt.strategy != "in-place":
            raise SpecError(f"{asked} measures each local count on the sweep's one deployment; --strategy "
                            f"{self.opt.strategy} is not supported with it.", field="--local-workers")
        try:
            check_rules(placed(self.spec, max(local)), self.loaded.source)
        except SpecError as exc:
            raise SpecError(f"{asked} runs the job with service.placement: hybrid, which this job cannot: "
                            f"{exc.render()} Sweep --workers alone (remote placement).", field="--local-workers") \
                from None

    def _placements(self) -> list[tuple[int | None, Path]]:
        """(local workers per trainer, the spec file the trainers read) for each placement swept; local None: the
        spec's own placement."""
        if self.opt.local_counts is None:
            return [(None, self.run_dir / "spec.json")]
        out: list[tuple[int | None, Path]] = []
        for k in sorted(self.opt.local_counts):
            path = self.run_dir / f"spec-local-{k}.json"
            path.write_text(placed(self.spec, k).model_dump_json(indent=1))
            out.append((k, path))
        return out

    # -- events and progress -------------------------------------------------------------
    def _event(self, kind: str, message: str) -> None:
        self.store.add_event(self.sweep_id, kind, message)
        if kind == "worker-restarted":
            self.progress.restarts += 1
        self.progress.last_event = message
        self.listener(self.progress)

    def _phase(self, phase: str, workers: int | None = None) -> None:
        self.progress.phase = phase
        if workers is not None:
            self.progress.workers_wanted = self.progress.workers_ready = workers
        self.listener(self.progress)

    # -- the sweep -------------------------------------------------------------------------
    def run(self) -> SweepSummary:
        measured, predicted = self.plan()
        self._attached = self._claim(measured)  # a busy deployment is refused at once, before anything is recorded
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "spec.json").write_text(self.spec.model_dump_json(indent=1))
        self.store.create_run(
            id=self.sweep_id, name=self.spec.name, kind="sweep", provider=self.spec.provider, mode="service",
            status="running", spec_path=self.loaded.source.path, spec_json=self.spec.model_dump_json(),
            spec_hash=spec_hash(self.spec), workers=max(self.opt.counts), trainers=self.spec.trainer.count,
            run_dir=str(self.run_dir),
        )
        outcome = Outcome()
        try:
            with outcome.classify(self.sweep_id, "interrupted by the user; the finished points are kept"):
                self._measure(measured)
        finally:
            succeeded = outcome.status == "succeeded"
            if outcome.status == "interrupted":  # the point being measured when Ctrl-C, SIGTERM or SIGHUP came
                # (a sweep that failed leaves it to `dsctl down`, which says why: its deployment was removed)
                closing.close_points(self.store, self.sweep_id, why=f"sweep {self.sweep_id} was stopped",
                                     event="interrupted")
            summary = self._conclude(predicted if succeeded else [])
            self.store.update_run(self.sweep_id, status=outcome.status, ended_at=time.time(), error=outcome.error,
                                  summary=summary)
        return self.store.recorded(self.sweep_id).sweep

    def _measure(self, measured: list[int]) -> None:
        if self.opt.calibration is not None:
            self._calibrated_baselines()
        if self.opt.strategy == "restart":
            self._measure_baselines(lambda mode: self._baseline_from(self._fresh_run(mode=mode)))
            with self._timed("points_s"):
                self._measure_restarting(measured)
        else:
            self._measure_in_place(measured)

    @contextmanager
    def _timed(self, phase: str):
        """Wall seconds of a phase that completed, into self.timings (for benchmarks/bench_sweep.py)."""
        t0 = time.monotonic()
        yield
        self.timings[phase] = time.monotonic() - t0

    def _measure_baselines(self, measure: Callable[[Mode], dict]) -> None:
        """The colocated and ideal baselines not already known (e.g. from a calibration), each measured once."""
        with self._timed("baselines_s"):
            for mode in ("colocated", "ideal"):
                if mode not in self.baselines:
                    self._phase(f"baseline: {mode}")
                    self.baselines[mode] = measure(mode)

    def _fresh_run(self, **how) -> RunRecord:
        """One point on a deployment of its own (the restart strategy): warm-up plus one window."""
        runner = JobRunner(self.loaded, store=self.store, kind="point", parent_id=self.sweep_id,
                           duration_s=self.opt.warmup_s + (self.opt.window.seconds or 5.0), repeat=True, **how)
        runner.run()
        return self.store.recorded(runner.run_id)

    def _calibrated_baselines(self) -> None:
        cal = self.opt.calibration
        assert cal is not None, "called for a sweep predicted from a calibration file"
        for mode, bps in (("colocated", cal.colocated), ("ideal", cal.ideal)):
            cost = price(self._usage(0, bps, None, None), self.catalog, self.spec.cost_basis)
            self.baselines[mode] = {"run_id": None, "batches_per_s": bps, "cost_per_1000_batches": cost.per_1000_batches,
                                    "given": cal.source or "calibration file"}

    def _measure_restarting(self, counts: list[int]) -> None:
        for i, n in enumerate(counts, 1):
            self._phase(f"point {i}/{len(counts)} (restart)", n)
            self._add_point(self._fresh_run(workers=n))

    def _measure_in_place(self, counts: list[int]) -> None:
        """Baselines, then every count, on one deployment."""
        if not counts:
            self.timings["points_s"] = 0.0
            return
        with self._timed("deployment_s"):
            handle = self._deployment(counts[0])
        try:
            def measure_baseline(mode: Mode) -> dict:
                tails = self._start_trainers(handle, mode)
                measured = self._baseline_from(self._measure_point(handle, tails, 0, mode))
                handle.stop_trainers()
                return measured

            self._measure_baselines(measure_baseline)
            with self._timed("points_s"):
                groups = self._placements()
                total, i = len(groups) * len(counts), 0
                for g, (local, spec_json) in enumerate(groups):
                    if g:
                        handle.stop_trainers()  # in-process workers start with their trainers: new ones per count
                    tails = self._start_trainers(handle, "service", spec_json,
                                                 "service" if local is None else f"service-local-{local}")
                    also = "" if not local else f" + {local} local per trainer"
                    for n in counts:
                        i += 1
                        self._phase(f"point {i}/{total}: scaling", n)
                        if handle.workers != n:
                            handle.scale(n, self._event)
                        self._phase(f"point {i}/{total}: measuring {n} worker(s){also}", n)
                        self._add_point(self._measure_point(handle, tails, n, "service", local), local)
        finally:
            self._phase("tearing down")
            handle.release(self._event)

    def _start_trainers(self, handle, mode: Mode, spec_json: Path | None = None,
                        metrics: str | None = None) -> dict[int, JsonlTail]:
        """Trainers that read until stopped, in `mode`, on the sweep's deployment (from `spec_json`: the sweep's
        spec, or the spec as a --local-workers count runs it)."""
        launch = TrainerLaunch(
            mode=mode, spec_json=spec_json or self.run_dir / "spec.json",
            metrics_dir=self.run_dir / "metrics" / (metrics or mode),
            base_dir=self.loaded.base_dir, cache_dir=dsctl_home() / "cache", count=self.spec.trainer.count,
            duration_s=FOREVER_S, repeat=True, window_s=TRAINER_WINDOW_S, cpus=self.spec.trainer.cpus,
            **trainer_accelerators(self.spec), command=bool(self.spec.trainer.command),
        )
        return {i: JsonlTail(path) for i, path in handle.start_trainers(launch, self._event).items()}

    def _baseline_from(self, record) -> dict:
        bps = record.job.batches_per_s
        if not bps:
            raise RunFailed(f"the {record.mode} baseline measured no throughput; see run {record.id}.", record.id)
        # Priced per hour of steady state, like every point.
        cost = price(self._usage(0, bps, None, None), self.catalog, self.spec.cost_basis)
        return {"run_id": record.id, "batches_per_s": bps, "cost_per_1000_batches": cost.per_1000_batches}

    def _claim(self, measured: list[int]) -> AttachedDeployment | None:
        """The detached deployment to measure on, held for this sweep alone; None when it starts its own."""
        if self.attach is None or not measured or self.opt.strategy != "in-place":
            return None
        return AttachedDeployment.claim(self.attach, self.sweep_id)

    def _deployment(self, workers: int):
        if self._attached is not None:
            self._event("attached", f"sweeping deployment {self._attached.dep.run_id} (left running by dsctl up --detach)")
            return self._attached
        dep = Deployment(run_id=self.sweep_id, provider=self.spec.provider, run_dir=str(self.run_dir),
                         labels={"dsctl-run": self.sweep_id, "dsctl-job": self.spec.name})
        dep.save()
        self._phase("provisioning", workers)
        self.provider.up(self.spec, dep, workers, self._event)
        self.provider.wait_ready(dep, self._event)
        dep.status = "up"
        dep.save()
        return OwnedDeployment(self.provider, dep,
                               Supervisor(self.provider, dep, self.spec.service.fault_tolerant, self._event))

    def _measure_point(self, handle, tails: dict[int, JsonlTail], workers: int, mode: Mode, local: int | None = None):
        """Discard the warm-up after a change, then record one window as a point run (its spec: as the trainers ran
        it, with the point's local workers, so it is priced with them)."""
        name = mode if workers == 0 else f"w{workers}" + (f"-l{local}" if local else "")
        point_id = new_run_id(f"{self.spec.name}-{name}")
        start = time.time() + self.opt.warmup_s
        spec = self.spec if local is None else placed(self.spec, local)
        self.store.create_run(
            id=point_id, name=self.spec.name, kind="point", parent_id=self.sweep_id, provider=self.spec.provider,
            mode=mode, status="running", spec_json=spec.model_dump_json(), spec_hash=spec_hash(spec),
            workers=workers, trainers=self.spec.trainer.count, run_dir=str(self.run_dir), created_at=start,
        )
        per_trainer: dict[int, dict[str, Any]] = {i: {"batches": 0, "seconds": 0.0, "wait": 0.0, "step": 0.0} for i in tails}
        last_sample = 0.0
        while True:
            state = handle.poll(self._event)
            if state.exit_codes:
                index, code = next(iter(state.exit_codes.items()))
                raise RunFailed(f"trainer {index} exited (code {code}) during the sweep; "
                                f"see {self.run_dir / 'metrics'} for its log.")
            for i, tail in tails.items():
                for rec in tail.read():
                    if rec.get("event") != "window" or rec.get("warmup"):
                        continue
                    window_start = rec["wall"] - (rec["t_end"] - rec["t_start"])
                    if window_start < start:
                        continue
                    self.store.add_window(point_id, rec, workers)
                    acc = per_trainer[i]
                    acc["batches"] += rec["batches"]
                    acc["seconds"] += rec["t_end"] - rec["t_start"]
                    acc["wait"] += rec["input_wait_s"]
                    acc["step"] += rec["step_s"]
            now = time.monotonic()
            if now - last_sample >= 0.5:
                last_sample = now
                samples = handle.sample()
                if time.time() >= start:
                    self.store.add_utilization(point_id, time.time(), samples)
                self._point_progress(per_trainer)
            if all(self.opt.window.done(a["seconds"], a["batches"]) for a in per_trainer.values()):
                break
            time.sleep(POLL_S)
        self._point_progress(per_trainer)
        rates = [a["batches"] / a["seconds"] for a in per_trainer.values() if a["seconds"] > 0]
        wait = sum(a["wait"] for a in per_trainer.values())
        step = sum(a["step"] for a in per_trainer.values())
        summary = {
            "batches": sum(a["batches"] for a in per_trainer.values()),
            "batches_per_s": mean(rates),
            "total_batches_per_s": sum(rates),
            "input_stall_frac": wait / (wait + step) if wait + step > 0 else None,
            "duration_s": mean(a["seconds"] for a in per_trainer.values()),
            **utilization_summary(self.store.utilization(point_id), sum(a["batches"] for a in per_trainer.values())),
        }
        if local:
            summary["local_cpu_source"] = ("not measured: a sweep's trainers say which workers their batches came "
                                           "from only when they stop, not per point")
        self.store.update_run(point_id, status="succeeded", ended_at=time.time(), summary=summary)
        return self.store.recorded(point_id)

    def _point_progress(self, per_trainer: dict[int, dict[str, Any]]) -> None:
        """The point being measured, live: the batches its window holds so far and their rate per trainer."""
        rates = [a["batches"] / a["seconds"] for a in per_trainer.values() if a["seconds"] > 0]
        self.progress.batches = sum(a["batches"] for a in per_trainer.values())
        self.progress.batches_per_s = mean(rates) if rates else None
        self.listener(self.progress)

    def _measures(self) -> str:
        """What each point's number is a measurement of, said in the sweep's record and table."""
        window = self.opt.window.describe()
        p = self.spec.pipeline
        finite = p.entrypoint is not None or p.params.get("epochs") is not None
        if not finite:
            return f"a steady window of {window} per trainer at each point, after a {self.opt.warmup_s:g} s warm-up"
        return (f"a steady window of {window} per trainer at each point, after a {self.opt.warmup_s:g} s warm-up, "
                "not whole epochs: a sweep repeats the pipeline so that no point runs out of data, so a program's "
                "epoch loop stays in its first epoch and what it does between epochs (evaluation) is not measured")

    # -- results ---------------------------------------------------------------------------
    def _add_point(self, record, local: int | None = None) -> None:
        _, cost, _ = price_record(record, self.catalog)
        s = record.job
        point = {"workers": record.workers, "local_workers": local, "run_id": record.id, "predicted": False,
                 "source": "measured here",
                 "batches_per_s": s.batches_per_s, "cost_per_1000_batches": cost.per_1000_batches,
                 "input_stall_frac": s.input_stall_frac, "worker_cpu_cores": s.worker_cpu_cores,
                 "worker_mem_gb": s.worker_mem_gb}
        self.points.append(self._relative(point))
        also = f" + {local} local per trainer" if local else ""
        self._event("point", f"{record.workers} worker(s){also}: {point['batches_per_s']:.2f} batches/s")

    def _relative(self, point: dict) -> dict:
        colocated = self.baselines.get("colocated", {})
        ideal = self.baselines.get("ideal", {})
        bps = point["batches_per_s"]
        point["speedup"] = bps / colocated["batches_per_s"] if bps and colocated.get("batches_per_s") else None
        point["fraction_of_ideal"] = bps / ideal["batches_per_s"] if bps and ideal.get("batches_per_s") else None
        c0, c = colocated.get("cost_per_1000_batches"), point.get("cost_per_1000_batches")
        point["cost_saving"] = c0 / c if c0 and c else None
        return point

    def _predict(self, counts: list[int]) -> dict | None:
        measured = {p["workers"]: p["batches_per_s"] for p in self.points if p["batches_per_s"]}
        if self.opt.calibration is not None:
            measured = dict(self.opt.calibration.points)
        ideal = self.baselines.get("ideal", {}).get("batches_per_s")
        if not counts or not measured or not ideal:
            return None
        model = ThroughputModel.calibrate(measured, ideal, self.baselines.get("colocated", {}).get("batches_per_s"))
        cpu = mean(p["worker_cpu_cores"] for p in self.points if p.get("worker_cpu_cores") is not None) \
            if any(p.get("worker_cpu_cores") is not None for p in self.points) else None
        mem = mean(p["worker_mem_gb"] for p in self.points if p.get("worker_mem_gb") is not None) \
            if any(p.get("worker_mem_gb") is not None for p in self.points) else None
        for n in counts:
            bps = model.predict(n)
            cost = price(self._usage(n, bps, cpu, mem), self.catalog, self.spec.cost_basis)
            # A count the model was fitted on gives back (about) its input: "fitted", never evidence.
            source = "fitted" if n in measured else "predicted"
            self.points.append(self._relative({"workers": n, "run_id": None, "predicted": True, "source": source,
                                               "batches_per_s": bps, "cost_per_1000_batches": cost.per_1000_batches}))
        return model.to_dict()

    def _usage(self, workers: int, bps: float, cpu: float | None, mem: float | None) -> RunUsage:
        """An hour at `bps` batches/s per trainer; workers used as the measured ones did (0 workers: colocated)."""
        return usage_from_spec(self.spec, job_time_s=3600.0, batches=bps * 3600.0 * self.spec.trainer.count,
                               workers=workers, measured={"worker_cpu_cores": cpu, "worker_mem_gb": mem})

    def _conclude(self, predicted: list[int]) -> dict:
        model = self._predict(predicted) if predicted else None
        self.points.sort(key=lambda p: (p.get("local_workers") or 0, p["workers"]))
        # the remote-only points (all of them without --local-workers) answer as before; the surface answers below
        remote = [p for p in self.points if not p.get("local_workers")]
        summary: dict = {"counts": sorted(self.opt.counts), "workers_asked": self.opt.asked,
                         "local_counts": self.opt.local_counts, "local_asked": self.opt.local_asked,
                         "points": self.points, "baselines": self.baselines, "model": model,
                         "window": self.opt.window.describe(), "warmup_s": self.opt.warmup_s,
                         "measures": self._measures(),
                         "strategy": self.opt.strategy, "tolerance": self.opt.tolerance, "timings": self.timings}
        colocated = self.baselines.get("colocated", {}).get("batches_per_s")
        ideal = self.baselines.get("ideal", {}).get("batches_per_s")
        if remote:
            summary["recommendation"] = recommend(remote, tolerance=self.opt.tolerance, ideal_bps=ideal,
                                                  colocated_bps=colocated).to_dict()
        if self.opt.local_counts is not None and self.points:
            pick, rule = cheapest_within(self.points, tolerance=self.opt.tolerance)
            summary.setdefault("recommendation", {}).update(surface=asdict(pick) if pick else None, rule=rule)
        if remote and colocated and ideal:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            title = f"{self.spec.name} sweep"
            summary["plots"] = [str(p) for p in plot_sweep(remote, colocated_bps=colocated, ideal_bps=ideal,
                                                           out_dir=self.out_dir, title=title)]
        if self.opt.local_counts is not None and any(p.get("batches_per_s") for p in self.points):
            surface = (summary.get("recommendation") or {}).get("surface")
            plot = plot_surface(self.points, out_dir=self.out_dir, title=f"{self.spec.name} sweep", pick=surface)
            summary["plots"] = [*summary.get("plots", []), str(plot)]
        return summary


def placed(spec: JobSpec, local: int) -> JobSpec:
    """`spec` as a --local-workers count runs it: `local` workers inside each trainer process (placement hybrid), or
    remote placement alone for 0."""
    service = spec.service.model_copy(update={"placement": "hybrid" if local else "remote", "local_workers": local})
    return spec.model_copy(update={"service": service})


def detached_target() -> tuple[Deployment, LoadedSpec]:
    """The deployment `dsctl up --detach` left running, and its spec, for `dsctl sweep` without a spec; whether it
    can take a sweep now is for the sweep to say (AttachedDeployment.claim), so one still running its job is named,
    not missed."""
    detached = [d for d in active_deployments() if d.monitor is not None]
    if not detached:
        raise SpecError("no deployment is up to sweep. Start one with `dsctl up JOB.yaml --detach`, "
                        "or name a spec: `dsctl sweep JOB.yaml --workers 1..8`.")
    if len(detached) > 1:
        raise SpecError(f"{len(detached)} deployments are up ({', '.join(d.run_id for d in detached)}); "
                        "name the spec to sweep, or take the others down with `dsctl down RUN`.")
    dep = detached[0]
    record = RunStore().get(dep.run_id)
    spec_path = Path(record.spec_path) if record and record.spec_path and Path(record.spec_path).exists() \
        else Path(dep.run_dir) / "spec.yaml"
    return dep, load_job(spec_path)


def sweep(spec_path: Path | None, options: SweepOptions, listener: Callable[[Progress], None],
          on_plan: Callable[[list[int], list[int]], None]) -> RunRecord:
    """`dsctl sweep`: the job over worker counts, on its own deployment (`spec_path`) or the one `dsctl up --detach`
    left running (None); `on_plan` is told which counts run and which are predicted before anything is measured.
    Returns the sweep's record. Ctrl-C, SIGTERM or SIGHUP end it as Interrupted, keeping the finished points and
    leaving nothing running."""
    runner = None
    try:
        attach = None
        if spec_path is None:
            attach, loaded = detached_target()
        else:
            # entrypoints are imported and checked in a (contained) child process; a sweep repeats the pipeline, so
            # it reads no epochs (mode None)
            loaded = load_job(spec_path, mode=None)
        if options.profile is not None:
            options.calibration = profile_calibration(options.profile, loaded)
        runner = SweepRunner(loaded, options, attach=attach)
        on_plan(*runner.plan())
        runner.listener = listener
        runner.run()
    except KeyboardInterrupt as exc:
        name = signal.Signals(signum_of(exc)).name
        if runner is None:
            raise Interrupted(f"interrupted ({name}) before the sweep started; nothing was started.",
                              signum_of(exc)) from None
        raise Interrupted(f"interrupted ({name}): sweep {runner.sweep_id} keeps the points it finished "
                          f"(`dsctl runs show {runner.sweep_id}`); nothing it started is left running.",
                          signum_of(exc)) from None
    return runner.store.recorded(runner.sweep_id)
