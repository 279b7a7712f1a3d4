"""The gcp provider: the provider contract (provisioners/contract.py) on Compute Engine VMs, TPU VMs, Cloud Storage
and SSH, with three capabilities: HandsOff (a run supervised on its dispatcher VM), Plans (the machines priced, and
a question, before anything bills) and FindsByLabel (a run's resources found and deleted with no local state).

A job's life, as the orchestrator drives it, and where each step is done:
  check           settings, credentials and the run's software resolved (settings.py, software.py); the live
                  project checked (preflight.py): SpecError, exit 2, before anything is made
  up              stage.py: the wheel, the wheelhouses and a builtin's data in Cloud Storage; vms.py: every VM
                  recorded in the state BEFORE it is created, then the firewall rules, dispatcher, workers (one
                  bulk insert) and trainer VMs in parallel, each reached over SSH, bootstrapped and its versions
                  checked; processes.py: the dispatcher and workers started
  start_trainers  stage.py: the spec (+ code) in Cloud Storage; processes.py: fetched onto the trainer VMs, started
  wait_ready      until the dispatcher and every worker have written their ready file
  poll/sample     from the watcher's latest readings (watch.py): servers that ended are reported (the orchestrator
                  restarts them: restart), VMs stopped, deleted or out of reach are reported (recovery.py) and a
                  stopped one is started again when the orchestrator restarts its server (restore.py)
  down            teardown.py: processes stopped, logs home, everything deleted and confirmed gone
A failure or Ctrl-C inside `up` deletes everything created so far before the error propagates.

This class holds what one process knows of one deployment beyond its state file: the context (context.py: settings,
clients, SSH; built once per deployment), the spec it was started with, what the checks found, whether the run is
to be handed over, the heartbeat it writes while it supervises the run, and, on the supervising VM, that VM's name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from dsctl.costmodel.hybrid import PipelineRate
from dsctl.runtime.sampler import Sample
from dsctl.specs import SpecError
from dsctl.specs.schema import JobSpec

from ..contract import (
    Bill,
    Billed,
    CheckResult,
    EventSink,
    HandOffLimits,
    Poll,
    TrainerLaunch,
    TrainerState,
    Where,
)
from ..registry import register
from ..state import Deployment, Node, StateCodec
from . import accounts, billing, bylabel, context, handoff, preflight, processes, restore, stage, teardown, vms
from .clients import Clients
from .context import Context
from .data import root as data_root
from .errors import GcpError, SshUnreachable, explained
from .heartbeat import Heartbeat
from .machinetypes import machine_kind
from .planning import confirm as ask_first
from .planning import plan as priced_plan
from .recovery import Recovery
from .settings import resolve
from .state import GcpCodec, GcpDeployment, gcp
from .storage import RunObjects, check_code_size
from .threads import parallel


@register
class GcpProvider:
    name: ClassVar[str] = "gcp"
    codec: ClassVar[StateCodec] = GcpCodec()
    runs_here: ClassVar[bool] = False  # the run's processes are on its VMs
    stands_in_for: ClassVar[str | None] = None  # its VMs are the machine types the spec names, billed as they are

    def __init__(self) -> None:
        self._clients: Clients | None = None  # check(): the spec's settings resolved, credentials checked
        self._findings: preflight.Findings | None = None  # check(): what the live project said, for the run
        self._ctx: Context | None = None  # the deployment worked on (context.py)
        self._spec: JobSpec | None = None  # to scale workers, and to build trainers' VMs in a baseline
        self._recovery: Recovery | None = None  # stopped VMs and SSH outages reported (poll), VMs brought back
        self._hands_off = False  # prepare_hand_off: the dispatcher VM will run the run's supervisor
        self._heartbeat: Heartbeat | None = None  # while this process supervises the run (heartbeat.py)
        self._inside: str | None = None  # adopt: the VM this process runs on (deleted last, by delete_self)
        self._supervisor_watch: handoff.SupervisorWatch | None = None  # a handed-over run's supervisor, seen from here

    # -- context ------------------------------------------------------------------------------------------------
    def _context(self, dep: Deployment, spec: JobSpec | None = None) -> Context:
        """The deployment's context: from the spec on the way up (its state recorded first), from its state on the
        way down or in another process."""
        if self._ctx is None or self._ctx.dep is not dep:
            if dep.state is None and spec is not None:
                self._ctx = context.for_run(dep, self._clients or Clients(resolve(spec)))
            else:
                self._ctx = context.from_state(dep)
        return self._ctx

    def _preflight(self, spec: JobSpec, clients: Clients, workers: int | None = None) -> preflight.Findings:
        """The live project's checks, once; `workers`: the most workers the run will have (0: trainers only)."""
        if self._findings is None:
            self._findings = preflight.run(clients, spec, clients.settings.run_software, reaches_vms=not self._hands_off,
                                           workers=workers)
        return self._findings

    # -- the contract -------------------------------------------------------------------------------------------
    def check(self, spec: JobSpec, workers: int, base_dir: Path) -> None:
        """Everything that can refuse the run before anything is created: settings, the size of the code the
        trainers get, software, the live project."""
        settings = resolve(spec)
        data_root(spec, settings.bucket)  # a builtin's cache_dir must be in Cloud Storage
        if stage.uses_code(spec):
            check_code_size(base_dir)  # a spec's folder too large to stage, refused before any VM bills
        self._clients = Clients(settings)
        self._preflight(spec, self._clients, workers)

    def up(self, spec: JobSpec, dep: Deployment, workers: int, events: EventSink) -> None:
        self._spec = spec
        try:
            ctx = self._context(dep, spec)
            ctx.cancel.clear()
            findings = self._preflight(spec, ctx.clients, workers)
            stage.bucket(ctx)
            self._accounts(ctx, findings, events)  # confirmed: the VMs' accounts before any VM
            stage.software(ctx, spec, {"cpu", machine_kind(spec.trainer.machine).kind}, events)
            self._beat(ctx)
            machines = vms.record(ctx, spec, "dispatcher", [0], spec.service.dispatcher_machine,
                                  supervisor=self._hands_off)
            machines += vms.record(ctx, spec, "worker", list(range(workers)), spec.service.worker_machine)
            machines += vms.record(ctx, spec, "trainer", list(range(spec.trainer.count)), spec.trainer.machine)
            dispatcher = dep.by_role("dispatcher")[0]
            gcp(dispatcher).fault_tolerant = spec.service.fault_tolerant
            for node in dep.by_role("worker"):
                gcp(node).cache_mb = _cache_mb(spec)
            # A run to be handed over is only created from here: its supervisor reaches the VMs and starts the
            # servers from the dispatcher VM (launch_servers), so this machine opens no connection to any VM.
            reach = not self._hands_off
            reports = vms.create(ctx, machines, rules=True, events=events, reach=reach)
            if reach:
                vms.check_versions(ctx, reports)
                self._start_servers(ctx, dep, events)
        except BaseException as exc:
            self._cleanup_failed_up(dep, events, exc)
            raise

    def _accounts(self, ctx: Context, findings: preflight.Findings, events: EventSink) -> None:
        """The VMs' accounts made and granted (accounts.ensure), and when, for the supervisor to wait on."""
        if accounts.ensure(ctx.clients, findings.accounts, events, ctx.cancel):
            ctx.state.granted_at = time.time()
        ctx.save()

    def _start_servers(self, ctx: Context, dep: Deployment, events: EventSink) -> None:
        processes.start_dispatcher(ctx, dep.by_role("dispatcher")[0])
        parallel(lambda n: processes.start_worker(ctx, n), dep.by_role("worker"), cancel=ctx.cancel)
        events("starting", f"dispatcher and {len(dep.by_role('worker'))} worker(s) starting on Google Cloud "
                           f"({ctx.settings.zone})")

    def launch_servers(self, dep: Deployment, events: EventSink) -> None:
        """On the supervising VM, after adopt: the run's VMs (created by `dsctl up` without being reached) reached
        over SSH at their internal addresses, their versions checked, the dispatcher and workers started."""
        ctx = self._context(dep)
        events("cloud", "reaching the run's VMs from the dispatcher VM, at their internal addresses")
        nodes = [n for n in dep.nodes if n.role in ("dispatcher", "worker", "trainer")]
        vms.check_versions(ctx, vms.reach_all(ctx, nodes))
        self._start_servers(ctx, dep, events)

    def _cleanup_failed_up(self, dep: Deployment, events: EventSink, exc: BaseException) -> None:
        """Delete whatever the failed step had created; the error says whether that worked."""
        if self._ctx is None or self._ctx.dep is not dep:
            return  # nothing was created
        self._ctx.cancel.set()
        try:
            self.down(dep, events)
            note = "Everything the run had created was deleted."
        except KeyboardInterrupt:
            raise
        except Exception as cleanup_exc:
            note = (f"Deleting what the run had created failed too ({cleanup_exc}); run `dsctl down {dep.run_id}` "
                    "to try again.")
        if isinstance(exc, GcpError):
            exc.add_sentence(note)

    def wait_ready(self, dep: Deployment, events: EventSink) -> None:
        ctx = self._context(dep)
        processes.wait_servers(ctx, [n for n in dep.by_role("dispatcher") + dep.by_role("worker")
                                     if not gcp(n).ready])
        events("ready", f"dispatcher and {len(dep.by_role('worker'))} worker(s) ready")

    def scale_workers(self, dep: Deployment, workers: int, events: EventSink) -> None:
        current = dep.by_role("worker")
        spec = self._spec
        if spec is None:
            raise GcpError("scaling needs the run's spec; scale from the process that started the run.")
        ctx = self._context(dep, spec)
        if workers > len(current):
            machines = vms.record(ctx, spec, "worker", list(range(len(current), workers)), spec.service.worker_machine)
            new = [vms.node_of(dep, m) for m in machines]
            try:
                reports = vms.create(ctx, machines, rules=False, events=events)
                vms.check_versions(ctx, reports)
            except BaseException:
                vms.delete(ctx, new, events)
                raise
            for node in new:
                gcp(node).cache_mb = _cache_mb(spec)
            parallel(lambda n: processes.start_worker(ctx, n), new, cancel=ctx.cancel)
            events("starting", f"starting {len(new)} worker(s)")
            processes.wait_servers(ctx, new)
            events("scaled", f"{workers} worker(s) ready")
        elif workers < len(current):
            leaving = current[workers:]
            processes.stop(ctx, leaving, grace_s=8.0)
            vms.delete(ctx, leaving, events)
            events("scaled", f"removed {len(leaving)} worker(s); {workers} remain")

    def start_trainers(self, dep: Deployment, launch: TrainerLaunch, events: EventSink) -> None:
        if self._spec is None:
            self._spec = JobSpec.model_validate_json(Path(launch.spec_json).read_text())
        spec = self._spec
        ctx = self._context(dep, spec)
        ctx.cancel.clear()
        vms.restore_trainer_nodes(dep, launch.count)
        try:
            if len(dep.by_role("trainer")) < launch.count or any(not gcp(n).vm.host for n in dep.by_role("trainer")):
                if stage.uses_code(spec):  # a baseline was not checked by `check`: before its VMs, as `check` does
                    check_code_size(launch.base_dir)
                self._create_trainers(ctx, spec, launch.count, events)  # a baseline (colocated, ideal): no `up` made them
        except BaseException as exc:
            self._cleanup_failed_up(dep, events, exc)
            raise
        ctx.watching()
        launch.metrics_dir.mkdir(parents=True, exist_ok=True)
        objects = stage.trainer_files(ctx, spec, launch.spec_json, launch.base_dir)
        with_code = stage.uses_code(spec)
        parallel(lambda n: processes.start_trainer(ctx, n, launch, objects, with_code),
                 dep.by_role("trainer")[: launch.count], cancel=ctx.cancel)
        events("training", f"{launch.count} trainer(s) started ({launch.mode}) on Google Cloud")

    def _create_trainers(self, ctx: Context, spec: JobSpec, count: int, events: EventSink) -> None:
        findings = self._preflight(spec, ctx.clients, workers=0)  # a baseline: its trainers are all it makes
        stage.bucket(ctx)
        self._accounts(ctx, findings, events)
        stage.software(ctx, spec, {machine_kind(spec.trainer.machine).kind}, events)
        self._beat(ctx)
        have = {n.index for n in ctx.dep.by_role("trainer")}
        machines = vms.record(ctx, spec, "trainer", [i for i in range(count) if i not in have], spec.trainer.machine)
        reports = vms.create(ctx, machines, rules=False, events=events)
        vms.check_versions(ctx, reports)

    def poll(self, dep: Deployment, events: EventSink) -> Poll:
        """The trainers' state and the servers found ended, from the latest readings; and what Compute Engine and SSH
        say of the VMs (recovery.py): stopped or deleted ones, restores that finished, an outage. Processes on VMs
        out of reach, stopped or being brought back are not judged meanwhile."""
        ctx = self._context(dep)
        unreachable = {host: since for host, (since, _) in ctx.watching().unreachable().items()}
        look = self._recovery_for(ctx).look(dep, unreachable)
        running, codes = processes.trainers(ctx, look.unseen)
        return Poll(TrainerState(running=running, exit_codes=codes, blind=look.blind),
                    processes.exited_servers(ctx, look.unseen), lost=look.lost, back=look.back, outage=look.outage)

    def _recovery_for(self, ctx: Context) -> Recovery:
        if self._recovery is None:
            self._recovery = Recovery(list_statuses=lambda: restore.vm_statuses(ctx),
                                      restore=lambda node: restore.bring_back(ctx, node),
                                      outage_limit_s=ctx.settings.outage_limit_s)
        return self._recovery

    def restart(self, dep: Deployment, node: Node, events: EventSink) -> None:
        """The server again on its VM, at its port (the dispatcher from its journal). A VM the last poll reported
        stopped is started again first, in the background (recovery.py, restore.py), and a later poll reports it
        back. A VM that stopped answering meanwhile (stopped, an outage) is left to the next polls: its host is unseen
        then, and they report what became of it; should it answer again with the server still ended, the server is
        reported again."""
        ctx = self._context(dep)
        if self._recovery is not None and self._recovery.lost(node):
            self._recovery.bring_back(node)
            return
        try:
            if node.role == "dispatcher":
                processes.start_dispatcher(ctx, node)
            else:
                processes.start_worker(ctx, node)
        except SshUnreachable:
            return

    def log_tail(self, dep: Deployment, node: Node) -> str:
        return processes.log_tail(self._context(dep), node)

    def sample(self, dep: Deployment) -> list[Sample]:
        """CPU and RSS of every remote process, from the watcher's last two readings."""
        if self._ctx is None or self._ctx.dep is not dep:
            return []
        return processes.sample(self._ctx)

    def stop_trainers(self, dep: Deployment) -> None:
        """Stop the trainer processes and bring their last metrics and logs home. The trainer VMs stay (a sweep
        measures again on them); `down` deletes them with the rest."""
        ctx = self._context(dep)
        trainers = [n for n in dep.by_role("trainer") if gcp(n).remote_pid is not None]
        if ctx.watcher is not None:
            ctx.watcher.cycle()  # the last metrics lines first
        processes.stop(ctx, trainers, grace_s=5.0)
        processes.collect_logs(ctx, trainers)

    def down(self, dep: Deployment, events: EventSink) -> None:
        if dep.state is None:
            if self._clients is None:
                dep.status = "down"
                dep.save()
                events("down", "nothing was created on Google Cloud")
                return
            dep.state = GcpDeployment(settings=self._clients.settings)  # checked, maybe begun: look there by label
        ctx = self._context(dep)
        if self._recovery is not None:
            self._recovery.close()
        teardown.down(ctx, events, keep=self._inside)
        self._stop_beating()

    def _beat(self, ctx: Context) -> None:
        """This process supervises the run from now on: its VMs' watchdogs hear from it (heartbeat.py)."""
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(ctx.clients, ctx.dep.run_id)
        self._heartbeat.start()

    def _stop_beating(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()

    # -- what a run creates that bills (billing.py) --------------------------------------------------------------
    def bill(self, spec: JobSpec, workers: int, trainers: int) -> Bill:
        return billing.bill(spec, workers, trainers)

    def billed(self, kept: dict[str, Any] | None, spec_json: str, workers: int, trainers: int) -> Billed:
        return billing.billed(kept, spec_json, workers, trainers)

    # -- HandsOff: a run supervised on its dispatcher VM (handoff.py) ----------------------------------------------
    def hands_off(self, spec: JobSpec, mode: str) -> bool:
        return handoff.hands_off(spec, mode)

    def limits(self, spec: JobSpec) -> HandOffLimits:
        return handoff.limits(spec)

    def detaching(self, spec: JobSpec) -> SpecError | None:
        return handoff.detaching(spec)

    def prepare_hand_off(self, spec: JobSpec) -> None:
        """Before `check` and `up` of a run to be handed over: nothing of it is reached from here (no SSH key, no SSH
        rule from here needed; the dispatcher VM starts the supervisor, which starts the servers: launch_servers),
        and its dispatcher VM, which will run the supervisor, is created standard (on-demand) whatever
        service.provisioning says: a preempted supervisor would leave the run unsupervised until its VMs' watchdogs
        end it."""
        self._hands_off = True

    def hand_off(self, dep: Deployment, files: dict[str, bytes], base_dir: Path, events: EventSink) -> None:
        handoff.hand_off(self._context(dep), files, base_dir, events)
        self._stop_beating()  # the supervisor on the dispatcher VM beats from now on

    def handed_off(self, dep: Deployment) -> bool:
        return isinstance(dep.state, GcpDeployment) and dep.state.supervisor is not None

    def run_objects(self, dep: Deployment) -> RunObjects:
        return handoff.run_objects(self._context(dep))

    def supervisor_status(self, dep: Deployment) -> str:
        if self._supervisor_watch is None:
            self._supervisor_watch = handoff.SupervisorWatch()
        return self._supervisor_watch.status(self._context(dep))

    def adopt(self, dep: Deployment, spec: JobSpec) -> None:
        self._spec = spec
        self._beat(self._context(dep))
        self._inside = handoff.adopt(self._context(dep))

    def check_supervisor(self, dep: Deployment, spec: JobSpec, events: EventSink | None = None) -> None:
        """The supervisor's first act on the dispatcher VM: it beats from here on (the user's machine stopped when
        it handed over), then checks its permissions."""
        self._beat(self._context(dep))
        handoff.check_supervisor(self._context(dep), spec, events)

    def delete_self(self, dep: Deployment) -> None:
        if self._inside is not None:
            handoff.delete_self(self._context(dep), self._inside)

    # -- ChecksPlace: `dsctl check gcp` (preflight.py) -------------------------------------------------------------
    def check_place(self, spec: JobSpec, where: Where) -> list[CheckResult]:
        """Every check a run of `spec` meets before anything is created, each with its verdict; creates nothing."""
        settings = resolve(spec, project=where.get("project"), zone=where.get("zone"))
        return preflight.report(Clients(settings), spec, settings.run_software,
                                reaches_vms=(spec.gcp.supervisor if spec.gcp else "vm") == "here")

    # -- Plans: the machines priced, and a question, before anything bills (plan.py) ------------------------------
    def plan_text(self, spec: JobSpec, workers: int | None, *, pipeline_rate: PipelineRate | None = None) -> str:
        return priced_plan(spec, workers, pipeline_rate=pipeline_rate).render()

    def confirm(self, spec: JobSpec, workers: int | None, *, yes: bool, ask: Callable[[str], bool],
                echo: Callable[[str], None], pipeline_rate: PipelineRate | None = None) -> bool:
        return ask_first(spec, workers, yes=yes, ask=ask, echo=echo, pipeline_rate=pipeline_rate)

    # -- FindsByLabel: a run's resources with no local state (bylabel.py; where to look: locating.py) ---------------
    def looks_there(self, where: Where) -> bool:
        return bylabel.looks_there(where)

    def down_by_label(self, run_id: str, where: Where, log: Callable[[str], None]) -> str:
        found = bylabel.down_where(run_id, where, log)
        return "nothing found on Google Cloud." if found.empty else f"deleted {found.summary()}"

    def run_objects_by_label(self, run_id: str, where: Where) -> RunObjects:
        return bylabel.record_where(run_id, where)


# What the orchestrator calls: a Google Cloud answer none of them expected is one paragraph naming the call.
for _name in ("check", "up", "wait_ready", "scale_workers", "start_trainers", "restart", "stop_trainers", "down",
              "hand_off", "adopt", "check_supervisor", "launch_servers", "delete_self", "confirm", "check_place",
              "down_by_label", "run_objects_by_label", "supervisor_status"):
    setattr(GcpProvider, _name, explained(getattr(GcpProvider, _name)))


def _cache_mb(spec: JobSpec) -> int:
    """Each worker's cross-trainer cache (service.cross_trainer_cache)."""
    return spec.service.cross_trainer_cache_mb if spec.service.cross_trainer_cache else 0
