"""`dsctl up`: from a loaded spec to a finished, detached or handed-off run, whatever the provider.

What `up` decides, in order:
1. `--resume RUN`: which checkpoints are restored (resume.py), said before anything starts.
2. The plan: a provider whose machines bill (capability Plans) shows it and asks, unless --yes;
   --dry-run shows it and stops. A local run says that nothing bills.
3. Where the run is supervised: on one of its machines when the provider can (HandsOff) and the
   spec asks for it (the run outlives this machine), else here.
4. --detach: on the cloud, return once the run trains there; here, run `dsctl up` again in a
   session of its own that keeps the service up until `dsctl down`.
The CLI renders what it is told through a `Conversation` and the result; it decides nothing.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from dsctl.errors import DsctlError, signum_of
from dsctl.provisioners import HandOffLimits, HandsOff, Plans, get_provider
from dsctl.specs import LoadedSpec, SpecError
from dsctl.specs.schema import Mode

from .handoff import HandOff, hands_off
from .home import dsctl_home
from .outcome import Interrupted, RunFailed
from .profiling.uses import pipeline_rate as profiled_rate
from .records import CloudLatest, RunRecord
from .resume import Resume, plan_resume
from .run import JobRunner, Progress, new_run_id
from .store import RunStore


class Conversation(Protocol):
    """How `up` talks to the user (the CLI implements it)."""

    def resuming(self, resume: Resume, steps: int | None) -> None:
        """Say which checkpoints the run restores, before anything starts."""

    def say(self, text: str) -> None:
        """A plan or a note, as it is."""

    def ask(self, question: str) -> bool:
        """A yes/no question."""

    def progress(self, progress: Progress) -> None:
        """The run's progress, live."""


@dataclass
class UpOptions:
    path: Path  # the spec file (a detached `dsctl up` reads it again)
    workers: int | None = None
    mode: Mode = "service"
    detach: bool = False
    autoscale: str | None = None
    dry_run: bool = False
    yes: bool = False
    resume: str | None = None  # a run id
    run_id: str | None = None
    detached_child: bool = False  # this process is the detached `dsctl up` a --detach started


@dataclass
class UpResult:
    """What came of `dsctl up`; `outcome` says which fields are set."""

    outcome: Literal["planned", "declined", "finished", "detached", "handed-off"]  # planned: a dry run; detached: here
    run_id: str | None = None
    record: RunRecord | None = None  # finished
    latest: CloudLatest | None = None  # handed-off: what the supervisor last published
    log: Path | None = None  # detached: where the detached `dsctl up` writes
    limits: HandOffLimits | None = None  # handed-off: when the cloud tears the run down at the latest, and why


def up(loaded: LoadedSpec, opt: UpOptions, talk: Conversation,
       on_sigterm: Callable[[], None] = lambda: None) -> UpResult:
    """Run `dsctl up` as `opt` says. SpecError for bad input, RunFailed if the run failed, Interrupted on Ctrl-C
    (everything it started is stopped and recorded). `on_sigterm` arms SIGTERM and SIGHUP to act as Ctrl-C once the run is
    about to start."""
    resumed = None
    if opt.resume:
        resumed = plan_resume(RunStore(), opt.resume, loaded)
        talk.resuming(resumed, loaded.spec.trainer.steps)
    if not approved(loaded, opt, talk):
        return UpResult("planned" if opt.dry_run else "declined")
    if opt.detach and not opt.detached_child and not isinstance(get_provider(loaded.spec.provider), HandsOff):
        return _detach(loaded, opt)
    runner = JobRunner(loaded, mode=opt.mode, workers=opt.workers, run_id=opt.run_id, detached=opt.detached_child,
                       autoscale=opt.autoscale, resume=resumed)
    runner.listener = talk.progress
    if opt.detach and not opt.detached_child:
        return _hand_off(loaded, runner, opt, on_sigterm)
    on_sigterm()
    try:
        if hands_off(runner):
            handoff = HandOff(runner)
            handoff.start(attached=True)
            handoff.follow()
        else:
            runner.run(keep_up=opt.detached_child)
    except KeyboardInterrupt as exc:
        raise Interrupted(f"interrupted ({signal.Signals(signum_of(exc)).name}): everything run {runner.run_id} "
                          "started has been stopped; what it measured is recorded (`dsctl runs show` has it).",
                          signum_of(exc)) from None
    except DsctlError as exc:  # a run that failed says which, and where its output and record are
        if exc.run_id is None and runner.store.get(runner.run_id) is not None:
            exc.run_id = runner.run_id
        raise
    result = UpResult("finished", runner.run_id, runner.store.get(runner.run_id))
    if opt.detached_child:
        runner.supervise_until_stopped()
    return result


def approved(loaded: LoadedSpec, opt: UpOptions, talk: Conversation) -> bool:
    """Show what a run would create and cost; where machines bill, ask before anything is created."""
    spec = loaded.spec
    provider = get_provider(spec.provider)
    hybrid = spec.service.placement == "hybrid" and opt.mode == "service"
    if not isinstance(provider, Plans):
        if opt.dry_run:
            local = (f", each with {spec.service.local_workers} in-process worker(s) (service.local_workers)"
                     if hybrid else "")
            talk.say(f"provider {spec.provider}: {opt.workers or spec.service.workers} worker process(es), "
                     f"{spec.trainer.count} trainer(s){local} on this machine; nothing bills. Nothing was started.")
        return not opt.dry_run
    rate = profiled_rate(loaded) if hybrid else None  # the remote workers hybrid placement saves, predicted
    try:
        if opt.dry_run:
            talk.say(provider.plan_text(spec, opt.workers, pipeline_rate=rate))
            talk.say("dry run: nothing was created.")
            return False
        if not provider.confirm(spec, opt.workers, yes=opt.yes or opt.detached_child, ask=talk.ask, echo=talk.say,
                                pipeline_rate=rate):
            talk.say("nothing was created.")
            return False
    except SpecError as exc:
        raise loaded.locate(exc) from None
    return True


def _hand_off(loaded: LoadedSpec, runner: JobRunner, opt: UpOptions, on_sigterm: Callable[[], None]) -> UpResult:
    """`dsctl up --detach` on a provider that supervises runs itself: provision from here, hand the job to the
    supervisor on one of the run's machines, and return once it trains (it tears everything down at its end)."""
    if opt.mode != "service":
        raise SpecError(f"--detach hands the run to the cloud, which runs the job through the service; --mode "
                        f"{opt.mode} is measured attached.", field="--detach")
    handoff = HandOff(runner)
    refusal = handoff.cloud.detaching(runner.spec)
    if refusal is not None:
        raise loaded.locate(refusal)
    on_sigterm()
    try:
        latest = handoff.start()
    except KeyboardInterrupt as exc:
        raise Interrupted(f"interrupted ({signal.Signals(signum_of(exc)).name}): everything run {runner.run_id} "
                          "started has been deleted.", signum_of(exc)) from None
    return UpResult("handed-off", runner.run_id, latest=latest, limits=handoff.cloud.limits(runner.spec))


RECORDED_WITHIN_S = 60.0  # a detached `dsctl up` records its run within about a second; past this, the log says why


def _detach(loaded: LoadedSpec, opt: UpOptions) -> UpResult:
    """Run `dsctl up` again in its own session; it keeps supervising the service until `dsctl down`."""
    run_id = new_run_id(loaded.spec.name)
    log = dsctl_home() / "runs" / run_id / "up.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "dsctl.cli.main", "up", str(opt.path), "--mode", opt.mode, "--run-id", run_id,
            "--detached-child"]
    if opt.workers:
        args += ["--workers", str(opt.workers)]
    if opt.autoscale:
        args += ["--autoscale", opt.autoscale]
    if opt.resume:
        args += ["--resume", opt.resume]
    with open(log, "ab") as out:
        child = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
    # Back to the user only once the run is recorded, so the id said is one every command knows at once.
    store, deadline = RunStore(), time.monotonic() + RECORDED_WITHIN_S
    while store.get(run_id) is None and time.monotonic() < deadline:
        if child.poll() is not None and store.get(run_id) is None:
            said = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else []
            raise RunFailed(f"the background `dsctl up` exited (code {child.returncode}) before it recorded run "
                            f"{run_id}; nothing of it runs. Its log, {log}, ends:\n" + "\n".join(said))
        time.sleep(0.1)
    return UpResult("detached", run_id, log=log)
