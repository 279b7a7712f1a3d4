"""A job's life: provision → launch → measure → record → tear down.

Whatever happens (success, a failing trainer, Ctrl-C, SIGTERM), the deployment
is torn down and the run is recorded with its outcome; what was measured before
a failure is already in the store.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from dsctl.provisioners import Deployment, ProcessRef, Provider, TrainerLaunch, get_provider
from dsctl.runtime import placement
from dsctl.specs import LoadedSpec, SpecError, spec_hash
from dsctl.specs.epochs import epoch_findings
from dsctl.specs.schema import Mode

from . import caching, endings, imports, reconcile
from .accelerators import trainer_accelerators
from .autoscaling import TrainerWindows, leave_queue_room
from .checkpoints import run_checkpoint_dir, saved_step
from .context import RunContext
from .home import dsctl_home, remedy
from .outcome import Outcome, RunFailed, TakenDown
from .placements import placement_fields
from .policies import Limits, Observation
from .preflight import check_autoscale
from .pricing import cost_summary
from .records import Ending, RunSummary
from .resume import Resume
from .store import FULL_BELOW, RunStore
from .summary import epoch_line, epoch_note, summarize_run
from .supervision import Supervisor
from .tail import JsonlTail, trainer_metrics
from .tbevents import RunBoard

POLL_S = 0.2
SAMPLE_S = 0.5
STALL_TIMEOUT_S = 180.0  # a trainer with no new batch this long is stuck (e.g. a worker lost for good)
# Spec fields the trainers' errors may start with ("trainer.command: ..."): the error then points at its line.
LOCATABLE = ("trainer.command", "trainer.steps", "trainer.duration_s", "trainer.checkpoint", "trainer.model.entrypoint",
             "pipeline.entrypoint", "service.processing_mode")


@dataclass
class Progress:
    """What the live view shows; the orchestrator updates it, the CLI draws it."""

    run_id: str = ""
    phase: str = "starting"
    workers_ready: int = 0
    workers_wanted: int = 0
    batches: int = 0
    batches_per_s: float | None = None
    restarts: int = 0
    last_event: str = ""


Listener = Callable[[Progress], None]


def _copy_to(folder: str | None, base_dir: Path) -> str | None:
    """trainer.tensorboard_dir as the board copies to it: gs:// as is, a relative local folder from the spec's."""
    if not folder or folder.startswith("gs://"):
        return folder
    path = Path(folder).expanduser()
    return str(path if path.is_absolute() else (base_dir / path).resolve())


def new_run_id(name: str) -> str:
    return f"{name}-{time.strftime('%m%d-%H%M%S')}-{secrets.token_hex(2)}"


class JobRunner:
    """Runs one measurement of one spec in one mode and records it."""

    def __init__(self, loaded: LoadedSpec, *, mode: Mode = "service", workers: int | None = None,
                 store: RunStore | None = None, listener: Listener | None = None, kind: str = "job",
                 parent_id: str | None = None, run_id: str | None = None, detached: bool = False,
                 duration_s: float | None = None, repeat: bool = False, record_steps: bool = False,
                 autoscale: str | None = None, resume: Resume | None = None):
        self.loaded = loaded
        self.spec = loaded.spec
        self.mode = mode
        self.workers = (workers if workers is not None else self.spec.service.workers) if mode == "service" else 0
        self.local_workers = 0  # in-process workers per trainer asked for by a placement policy (placement: auto)
        # A scaling policy (spec `autoscale:` or --autoscale) decides the worker count from here on.
        self.policy = check_autoscale(loaded, autoscale) if mode == "service" else None
        if self.policy is not None:
            self.workers = self.policy.initial_workers
            self.spec = leave_queue_room(self.spec, self.policy)
        self._worker_util: float | None = None
        self.store = store or RunStore()
        self._own_store = store is None  # a store lent by a sweep is the sweep's to move (imports.rebuild)
        self.listener = listener or (lambda p: None)
        self.provider: Provider = get_provider(self.spec.provider)
        self.run_id = run_id or new_run_id(self.spec.name)
        self.run_dir = dsctl_home() / "runs" / self.run_id
        # Checkpoints: this run's own folder, and the run it restores from (dsctl up --resume).
        self.resume = resume
        self.checkpoint_dir = run_checkpoint_dir(self.spec, loaded.base_dir, self.run_id)
        self._restored: dict[int, int] = {}  # trainer -> the step it restored
        self._cost_record = None  # the run's record, priced per window for TensorBoard's cost so far
        self.board = RunBoard(self.run_dir, self.run_id, self.spec.trainer.count,
                              _copy_to(self.spec.trainer.tensorboard_dir, loaded.base_dir))
        self.progress = Progress(run_id=self.run_id, workers_wanted=self.workers)
        self.kind, self.parent_id = kind, parent_id
        self.first_batch_wall: float | None = None
        self.measured_from_wall: float | None = None
        self.detached = detached
        self.duration_s, self.repeat = duration_s, repeat  # overrides for measurements (sweep baselines)
        self.record_steps = record_steps  # per-batch records (experiments model synchronous training from them)
        self._results: dict[int, dict] = {}  # each trainer's end record, also kept here in case the store defers it
        self._placements: dict[int, dict] = {}  # each trainer's placement record (hybrid placement)
        self._stopped_s: dict[str, float] = {}  # role -> VM-seconds stopped (preempted VMs are not billed meanwhile)
        self.summary = RunSummary()
        self.trainer_spec_json: Path | None = None  # the spec the trainers get, when autocache decided a mode
        self.autocache_summary: dict | None = None
        self.cache: dict | None = None  # the cache this run wrote or read (caching.cache_used)

    # -- events -----------------------------------------------------------------
    def event(self, kind: str, message: str) -> None:
        self.store.add_event(self.run_id, kind, message)
        if kind in ("worker-restarted", "dispatcher-restarted"):
            self.progress.restarts += 1
        if kind in ("ready", "scaled"):
            self.progress.workers_ready = len(self.deployment.by_role("worker"))
        self.progress.last_event = message
        self.listener(self.progress)

    def phase(self, phase: str) -> None:
        self.progress.phase = phase
        self.listener(self.progress)

    # -- the run ------------------------------------------------------------------
    def prepare(self, reserve: bool = True) -> Deployment:
        """Check, record and save the run before anything is created; `reserve`: keep room in the run dir for its
        outcome, should the disk fill before this process records it (not for a run another machine records)."""
        if self.mode == "service":
            most = max(self.workers, self.spec.autoscale.max_workers if self.policy and self.spec.autoscale else 0)
            try:
                self.provider.check(self.spec, most, self.loaded.base_dir)
            except SpecError as exc:
                raise self.loaded.locate(exc) from None
        # How this run reads its epochs with the workers it has (a repeated pipeline has none): refused, or warned.
        refused, warnings = epoch_findings(self.loaded, self.workers, self.mode) if not self.repeat else ([], [])
        if refused:
            raise refused[0]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if reserve:
            reconcile.reserve(self.run_dir)
        spec_json = self.spec.model_dump_json(indent=1)
        (self.run_dir / "spec.json").write_text(spec_json)
        spec_yaml = None
        src = Path(self.loaded.source.path)
        if src.is_file():
            spec_yaml = src.read_text()
            shutil.copyfile(src, self.run_dir / "spec.yaml")
        row = dict(
            id=self.run_id, name=self.spec.name, kind=self.kind, parent_id=self.parent_id, provider=self.spec.provider,
            mode=self.mode, status="running", spec_path=str(src.resolve()) if src.is_file() else None,
            spec_yaml=spec_yaml, spec_json=spec_json, spec_hash=spec_hash(self.spec), workers=self.workers,
            trainers=self.spec.trainer.count, run_dir=str(self.run_dir),
            resumed_from=self.resume.run_id if self.resume else None, checkpoint_dir=self.checkpoint_dir,
            created_at=time.time(),
        )
        self.store.create_run(**row)
        imports.write_run_file(self.run_dir, row)  # what the record is rebuilt from, should runs.db go
        dep = Deployment(run_id=self.run_id, provider=self.spec.provider, run_dir=str(self.run_dir),
                         labels={"dsctl-run": self.run_id, "dsctl-job": self.spec.name})
        if self.detached:
            # The detached `dsctl up` itself: `dsctl down` stops it first, and it tears down on SIGTERM.
            import os

            import psutil

            dep.monitor = ProcessRef(pid=os.getpid(), pgid=os.getpgid(0), create_time=psutil.Process().create_time(),
                                     log=str(self.run_dir / "up.log"))
        dep.save()
        self.deployment = dep
        self.supervisor = Supervisor(self.provider, dep, self.spec.service.fault_tolerant, self.event)
        for warning in warnings:
            self.event("warning", warning.render())
        settings = getattr(self.policy, "config", None)
        if isinstance(settings, Limits) and settings.start_note:  # autoscale.start: profile, and what it found
            self.event("autoscale", settings.start_note)
        return dep

    def supervise_until_stopped(self) -> None:
        """After a detached job: keep the service up and its workers alive until `dsctl down`,
        and act on requests from other dsctl commands (a sweep scaling this deployment)."""
        from .handles import serve_control

        dep = self.deployment
        control = serve_control(self.provider, self.supervisor, dep, self.event)
        try:
            while True:
                self.supervisor.poll()
                control.serve_pending()
                time.sleep(0.1)
        except KeyboardInterrupt:
            self.provider.down(dep, self.event)

    def run(self, keep_up: bool = False) -> RunSummary:
        """Run to the end; returns the summary. Raises RunFailed, SpecError or KeyboardInterrupt."""
        dep = self.prepare()
        started = self.store.recorded(self.run_id).created_at
        outcome = Outcome()
        try:
            with outcome.classify(self.run_id):
                try:
                    self._provision_and_train(dep)
                except OSError as exc:
                    if not reconcile.is_full_disk(exc):
                        raise
                    # Said as what it is, in the record too: not an errno, nor (later, by `down`) "interrupted".
                    raise RunFailed(reconcile.full_disk_message(exc, self.run_dir.parent.parent), self.run_id) from exc
        except (RunFailed, SpecError) as exc:
            down = endings.down_requested(self.run_dir)  # what failed after `dsctl down` asked is its doing
            if down is None:
                raise
            outcome.status, outcome.error = "interrupted", down.says(self.progress.phase)
            raise TakenDown(outcome.error, self.run_id) from exc
        except KeyboardInterrupt:  # a detached `dsctl up` that `dsctl down` stopped: said so in its record
            if (down := endings.down_requested(self.run_dir)) is not None:
                outcome.error = down.says(self.progress.phase)
            raise
        finally:
            self.finish(dep, outcome.status, outcome.error, started, keep_up)
        return self.summary

    def run_on(self, dep: Deployment, bring_up: Callable[[Deployment], None]) -> RunSummary:
        """The job of a deployment provisioned by another process (a run handed over to its supervisor on the cloud,
        orchestrator/supervise.py), to its end: `bring_up` makes its servers serve, then the trainers run here."""
        self.deployment = dep
        self.supervisor = Supervisor(self.provider, dep, self.spec.service.fault_tolerant, self.event)
        started = self.store.recorded(self.run_id).created_at
        outcome = Outcome()
        try:
            with outcome.classify(self.run_id):
                bring_up(dep)
                self._start_trainers(dep)
                self.phase("training")
                self._train(dep)
        finally:
            self.finish(dep, outcome.status, outcome.error, started, keep_up=False)
        return self.summary

    def _provision_and_train(self, dep: Deployment) -> None:
        if self.mode == "service":
            self.phase("provisioning")
            self.provider.up(self.spec, dep, self.workers, self.event)
        profiling = caching.needs_profile(self.spec, self.mode)  # autocache: profile first, then train
        # Trainers start while the servers import TensorFlow; their clients wait for the dispatcher.
        if not profiling:
            self._start_trainers(dep)
        if self.mode == "service":
            self.provider.wait_ready(dep, self.event)
            dep.status = "up"
            dep.save()
        if profiling:
            context = RunContext(loaded=self.loaded, spec=self.spec, mode=self.mode, run_id=self.run_id,
                                 run_dir=self.run_dir, store=self.store, provider=self.provider,
                                 supervisor=self.supervisor, event=self.event, phase=self.phase)
            self.trainer_spec_json, self.autocache_summary = caching.profile_and_decide(context, dep)
            self._start_trainers(dep)
        self.phase("training")
        self._train(dep)

    def finish(self, dep: Deployment, status: Ending, error: str | None, started: float, keep_up: bool) -> None:
        """Teardown first: nothing that fails while recording, logging or printing may leave a process running."""
        ended = time.time()
        try:
            self._tear_down(dep, status, keep_up)
        finally:
            try:
                self._board_warning(self.board.close())
            finally:
                self._record_end(status, error, started, ended)

    def _tear_down(self, dep: Deployment, status: Ending, keep_up: bool) -> None:
        try:
            self.phase("tearing down" if not keep_up else "left running")
        except Exception:  # noqa: BLE001 - a live view that cannot draw must not stop the teardown
            pass
        if keep_up and status == "succeeded":
            self.provider.stop_trainers(dep)
            dep.nodes = [n for n in dep.nodes if n.role != "trainer"]
            dep.save()
            return
        try:
            self.provider.down(dep, self.event)
        except KeyboardInterrupt:  # a second Ctrl-C: finish the teardown, then stop
            self.provider.down(dep, self.event)
            raise

    def _keep_store(self) -> None:
        """runs.db removed or replaced under the run: its record so far goes to the file now there (imports.py)."""
        if self._own_store and self.store.replaced():
            self.store, said = imports.rebuild(self.store, self.run_id, self.run_dir)
            self._cost_record = None
            self.event("records-rebuilt", said)

    def _record_end(self, status: Ending, error: str | None, started: float, ended: float) -> None:
        """The run's outcome and summary; what the database will not take now is kept in the run dir.
        Trainers that never sent their end record are summarized from their stored windows."""
        self._keep_store()
        store = self.store
        store.flush()
        error = self._full_disk_said(status, error)
        results = {**store.trainer_results(self.run_id), **self._results}
        summary = summarize_run(results, store.windows(self.run_id), store.utilization(self.run_id), started, ended,
                                self.first_batch_wall, self.measured_from_wall)
        summary = summary.updated(**self._element_accounting(results))
        note = epoch_note(summary, self.mode, self.spec.service.processing_mode, self.workers)
        if note:
            summary.epoch_note = note
        summary = summary.updated(**{f"{role}_stopped_s": seconds for role, seconds in self._stopped_s.items()
                                     if seconds})
        if self.policy is not None:
            summary = summary.updated(**self._scaling_summary())
        if self.autocache_summary is not None or self.cache is not None:
            chosen = self.autocache_summary
            if not chosen:
                assert self.spec.autocache is not None, "trainers report a cache only under autocache:"
                chosen = {"choice": self.spec.autocache.mode}
            summary = summary.updated(autocache={**chosen, "cache": self.cache})
        summary = summary.updated(**self._training_summary())
        summary = summary.updated(**placement_fields(self._placements, summary, self.workers, self.spec.trainer.count))
        store.update_run(self.run_id, status=status, ended_at=ended, error=error, summary=summary)
        record = replace(store.recorded(self.run_id), status=status, ended_at=ended, error=error, summary=summary)
        summary.cost = cost_summary(record)
        store.update_run(self.run_id, summary=summary)
        self.summary = summary
        reason = store.last_error
        # The error's first line only: what follows it (a log's tail) would break the one paragraph.
        lines = (error or "").splitlines()
        outcome = f"the run {status}" + (f" ({lines[0]}{' …' if len(lines) > 1 else ''})" if lines else "")
        try:
            kept = store.keep_unwritten(self.run_dir)
        except OSError as exc:
            # Its outcome goes where the reserve was, for `dsctl down` to record: the run says how it ended, full disk
            # and all, not just "interrupted".
            left = reconcile.leave_outcome(self.run_dir, {"status": status, "error": error, "ended_at": ended,
                                                         "why": f"{reason}; {exc.strerror}"})
            where = f"its outcome is kept in {left}" if left else "its outcome could not be kept either"
            raise RunFailed(f"{outcome}, and everything it started is stopped, but its record could not be written to "
                            f"{store.path} ({reason}) nor kept in {self.run_dir} ({exc.strerror}); {where}. "
                            f"To record it: {remedy(exc, store.path.parent)}, then `dsctl down {self.run_id}` records "
                            "it from what was stored.") from None
        reconcile.release_reserve(self.run_dir)
        if imports.kept_elsewhere(store):
            raise RunFailed(f"{outcome}, and everything it started is stopped, but runs.db was removed or replaced "
                            f"during the run and could not be made again, so its record is kept in {store.path}; "
                            f"`dsctl runs import {self.run_dir}` adds it to runs.db.")
        if kept is not None:
            raise RunFailed(f"{outcome}, and everything it started is stopped, but {store.path} would not take its "
                            f"record ({reason}); it is kept in {kept} and the next dsctl command adds it.")

    def _full_disk_said(self, status: Ending, error: str | None) -> str | None:
        """A run that did not succeed while its disk was full: its error says so first. Whatever failed first (a
        server that could not write its journal, a trainer its metrics) seldom names the disk itself."""
        if status == "succeeded" or (error and "filled up" in error):
            return error
        try:
            free: int | None = shutil.disk_usage(self.run_dir).free
        except OSError:
            free = None
        full = free is not None and free < FULL_BELOW
        if not full and "full" not in (self.store.last_error or ""):
            return error
        room = f" ({free} bytes free)" if free is not None else ""
        return (f"the disk holding {self.run_dir.parent.parent} was full when the run ended{room}, the likely cause"
                + (f": {error}" if error else "; free some space there and run it again."))

    def _start_trainers(self, dep: Deployment) -> None:
        launch = TrainerLaunch(
            mode=self.mode, spec_json=self.trainer_spec_json or self.run_dir / "spec.json", metrics_dir=self.run_dir / "metrics",
            base_dir=self.loaded.base_dir, cache_dir=dsctl_home() / "cache", count=self.spec.trainer.count,
            record_ids=self._countable() and not self.repeat, duration_s=self.duration_s, repeat=self.repeat,
            record_steps=self.record_steps, cpus=self.spec.trainer.cpus,
            **trainer_accelerators(self.spec),
            checkpoint_dir=self.checkpoint_dir, restore_from=self.resume.restore_from if self.resume else None,
            command=bool(self.spec.trainer.command),
        )
        self.provider.start_trainers(dep, launch, self.event)

    def _train(self, dep: Deployment) -> None:
        tails = {i: JsonlTail(path) for i, path in trainer_metrics(dep).items()}
        self._windows = TrainerWindows(list(tails))
        batches: dict[int, int] = {i: 0 for i in tails}
        rates: dict[int, float] = {}
        errors: dict[int, dict] = {}
        try:
            state = self._follow(dep, tails, batches, rates, errors)
        finally:
            # Whatever the trainers wrote before an interrupt or failure is kept in the record.
            for index, tail in tails.items():
                for rec in tail.read():
                    self._record(index, rec, batches, rates, errors, scale=False)
            for index in tails:
                if index not in self._results and batches[index]:
                    # Stopped before its final record: keep what its windows measured.
                    self._results[index] = {"batches": batches[index], "batches_per_s": rates.get(index), "partial": True}
                    self.store.set_trainer_result(self.run_id, index, self._results[index])
            self.progress.batches = sum(batches.values())  # the final count, not the last sample's
            try:
                self.listener(self.progress)
            except Exception:  # noqa: BLE001 - a live view that cannot draw must not hide why the run ended
                pass
        self._check_exits(state.exit_codes, errors, state.endings)

    def _follow(self, dep: Deployment, tails: dict, batches: dict, rates: dict, errors: dict):
        """Read metrics, sample utilization and report progress until every trainer has exited, or their time
        limit (trainer.timeout_s) is up."""
        last_sample = 0.0
        last_progress = started = time.monotonic()
        limit = self.spec.trainer.timeout_s
        while True:
            state = self.supervisor.poll()
            self._stopped_s = state.stopped_s
            if state.blind:
                last_progress = time.monotonic()  # the trainers cannot be seen now: no news is not a stall
            for index, tail in tails.items():
                for rec in tail.read():
                    last_progress = time.monotonic()
                    self._record(index, rec, batches, rates, errors)
            now = time.monotonic()
            if now - last_sample >= SAMPLE_S:
                last_sample = now
                self._keep_store()
                samples = self.provider.sample(dep)
                self.store.add_utilization(self.run_id, time.time(), samples)
                self._board_warning(self.board.samples(samples))
                workers = [x.cpu_cores for x in samples if x.role == "worker"]
                # A local worker is granted one core; its utilization is the share of it in use.
                self._worker_util = min(sum(workers) / len(workers), 1.0) if workers else None
                self.progress.batches = sum(batches.values())
                self.progress.batches_per_s = sum(rates.values()) / len(rates) if rates else None
                self.listener(self.progress)
            if not state.running:
                break
            if (down := endings.down_requested(self.run_dir)) is not None:
                raise TakenDown(down.says(self.progress.phase), self.run_id)
            if now - last_progress > STALL_TIMEOUT_S:
                raise RunFailed(f"no trainer made progress for {STALL_TIMEOUT_S:.0f} s; see the logs in {self.run_dir}.")
            if limit is not None and now - started > limit:
                raise RunFailed(f"trainer.timeout_s: {len(state.running)} trainer(s) were still running {limit:g} s after "
                                f"they started, the spec's time limit, so the run was stopped (`dsctl logs "
                                f"{self.run_id}` shows what they printed). Raise trainer.timeout_s if the job needs "
                                "longer.")
            time.sleep(POLL_S)
        return state

    def _record(self, index: int, rec: dict, batches: dict, rates: dict, errors: dict,
                scale: bool = True) -> None:
        event = rec.get("event")
        if event == "window":
            self.store.add_window(self.run_id, rec, self.workers)
            batches[index] += rec.get("batches", 0)
            if scale and self.spec.trainer.nonfinite_loss == "fail" and (why := endings.diverged(index, rec, batches[index])):
                raise RunFailed(why)
            self._board_warning(self.board.window(index, rec, self.workers, self._record_for_cost()))
            if not rec.get("warmup"):
                rates[index] = rec.get("batches_per_s") or 0.0
                if self.policy is not None and scale:
                    obs = self._windows.add(index, rec, workers=self.workers, worker_cpu_util=self._worker_util)
                    if obs is not None:
                        self._autoscale(obs)
        elif event == "start":
            if rec.get("restored_step") is not None:
                self._restored[index] = int(rec["restored_step"])
            self._board_warning(self.board.started(index, rec.get("restored_step")))
        elif event == "first_batch":
            if self.first_batch_wall is None or rec["wall"] < self.first_batch_wall:
                self.first_batch_wall = rec["wall"]
        elif event == "measure_start":
            if self.measured_from_wall is None or rec["wall"] > self.measured_from_wall:
                self.measured_from_wall = rec["wall"]  # the last trainer to finish warming up
        elif event == "end":
            self._results[index] = rec
            self.store.set_trainer_result(self.run_id, index, rec)
            self._windows.trainer_ended(index)
        elif event == "error":
            errors[index] = rec
        elif event == "placement":
            self._placements[index] = rec
        elif event == "epoch":
            self.event("epoch", epoch_line(index, rec))
        elif event == "autocache" and index == 0:  # what the hints did (put, get, fallback), once per job
            self.event(rec.get("kind", "autocache"), rec.get("message", ""))
            self.cache = caching.cache_used(rec, self.cache, self.spec)

    def _autoscale(self, obs: Observation) -> None:
        """Feed the trainers' joined windows to the policy; apply an add or remove (of remote workers, and of the
        trainers' in-process ones under placement: auto), and record why."""
        assert self.policy is not None, "called for autoscaled runs only"
        decision = self.policy.observe(obs)
        local = decision.local_target if decision.local_target is not None else self.local_workers
        if decision.action == "hold" or (decision.target, local) == (self.workers, self.local_workers):
            return
        if decision.local_target is None:
            self.event("autoscale", f"{decision.action} → {decision.target} worker(s): {decision.reason}")
        else:
            self.event("placement", f"{decision.action} → {decision.target} remote + {local} local worker(s) per "
                                    f"trainer: {decision.reason}")
        if decision.target != self.workers:
            self.provider.scale_workers(self.deployment, decision.target, self.event)
            self.workers = decision.target
            self.progress.workers_wanted = self.progress.workers_ready = decision.target
        if local != self.local_workers:
            placement.ask(self.run_dir / "metrics", local)  # the trainers follow at their next window
            self.local_workers = local

    # -- training: checkpoints restored, TensorBoard ----------------------------------------
    def _training_summary(self) -> dict:
        """Where a resumed run started, where its checkpoints and event files are."""
        out: dict = {}
        if self.resume is not None and self._restored:
            out["restored_step"] = min(self._restored.values())
        elif self.resume is not None and self.resume.step is not None:
            out["restored_step"] = self.resume.step  # its trainers never said (they failed before starting)
        saved = [r.get("checkpoint_step") for r in self._results.values()]
        known = [s for s in saved if s is not None]
        if len(saved) == self.spec.trainer.count and len(known) == len(saved):
            out["checkpoint_step"] = min(known)  # every trainer can resume from here
        elif self.checkpoint_dir and (step := saved_step(self.checkpoint_dir, self.spec.trainer.count,
                                                              note_only=bool(self.spec.trainer.command))) is not None:
            out["checkpoint_step"] = step  # a trainer never said (killed): what its folder holds
        if self.checkpoint_dir:
            out["checkpoint_dir"] = self.checkpoint_dir
        out["tensorboard"] = {"dir": str(self.board.dir), "copy": self.board.copy_to, "error": self.board.warning}
        return out

    def _record_for_cost(self):
        """The run's record as created, for the cost-so-far scalar (read once)."""
        if self._cost_record is None:
            self._cost_record = self.store.get(self.run_id)
        return self._cost_record

    def _board_warning(self, warning: str | None) -> None:
        if warning:
            try:
                self.event("warning", warning)
            except Exception:  # noqa: BLE001 - at teardown the live view may be gone
                pass

    def _scaling_summary(self) -> dict:
        """Time-weighted worker count of an autoscaled run; the record's worker count becomes its rounding,
        so pricing charges about the workers the run held on average."""
        windows = [w for w in self.store.windows(self.run_id) if w["trainer"] == 0 and w["t_end"] > w["t_start"]]
        held = sum((w["t_end"] - w["t_start"]) * (w["workers"] or 0) for w in windows)
        total = sum(w["t_end"] - w["t_start"] for w in windows)
        mean_workers = held / total if total else self.workers
        self.store.update_run(self.run_id, workers=max(1, round(mean_workers)))
        assert self.policy is not None, "called for autoscaled runs only"
        return {"autoscale_policy": self.policy.name, "mean_workers": mean_workers, "final_workers": self.workers}

    def _check_exits(self, codes: dict[int, int], errors: dict[int, dict], endings_said: dict[int, str]) -> None:
        """The trainers' ending, judged from their evidence (endings.py): a trainer's end record decides over a lost
        exit status, a signal before its last step never passes. A failure is raised with the trainer's own error
        message, else how its process ended (the provider's words where it could tell: an out-of-memory kill)."""
        trainers = [endings.Trainer(i, code, self._results.get(i) if not self._results.get(i, {}).get("partial")
                                    else None, errors.get(i), endings_said.get(i)) for i, code in sorted(codes.items())]
        verdict = endings.judge(trainers, self.spec.trainer.count, self.spec.trainer.steps if self.duration_s is None
                                else None, logs=self.run_dir / "metrics")
        if verdict.status == "succeeded":
            return
        if verdict.user:
            message = verdict.detail or ""
            field, _, rest = message.partition(": ")
            if field in LOCATABLE:  # the runtime names the spec's field: point at its line
                raise self.loaded.error(tuple(field.split(".")), rest)
            raise SpecError(message, where=self.loaded.source.path)
        raise RunFailed(verdict.message or f"the run {verdict.status}")

    # -- elements lost ----------------------------------------------------------------
    def _countable(self) -> bool:
        """A finite synthetic dataset through the service has a known number of copies of each element (counted by
        the harness's own loop: a keras model's batches go to `fit`, which keeps no ids)."""
        p = self.spec.pipeline
        return (self.mode == "service" and p.builtin == "synthetic" and p.params.get("epochs") is not None
                and self.spec.trainer.model.kind != "keras")

    def _copies_expected(self, passes: int) -> int:
        """How often each id should arrive: every worker makes a whole epoch unless sharding is dynamic;
        trainers without a shared job name each get their own job; a program's epoch loop reads `passes`."""
        svc = self.spec.service
        copies = self.spec.pipeline.params["epochs"] * passes
        if svc.processing_mode in ("parallel_epochs", "off"):
            copies *= self.workers
        if not svc.job_name:
            copies *= self.spec.trainer.count
        return copies

    def _element_accounting(self, results: dict[int, dict]) -> dict:
        if not self._countable() or not results or any(r.get("reason") != "end_of_data" for r in results.values()):
            return {}  # only a dataset read to its end tells what was lost
        passes = {r.get("epochs") or 1 for r in results.values()}  # an epoch program reads the dataset once an epoch
        if len(passes) > 1:
            return {}  # trainers that read different numbers of passes: no count to hold the ids to
        ids: list[int] = []
        for path in (self.run_dir / "metrics").glob("trainer-*.ids.json"):
            ids.extend(json.loads(path.read_text()))
        copies = self._copies_expected(passes.pop())
        elements = self.spec.pipeline.params["elements"]
        counts = Counter(ids)
        lost = sum(max(copies - counts.get(i, 0), 0) for i in range(elements))
        duplicated = sum(max(c - copies, 0) for c in counts.values())
        return {"elements_expected": elements * copies, "elements_received": len(ids),
                "elements_lost": lost, "elements_duplicated": duplicated}
