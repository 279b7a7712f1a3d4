"""A run supervised on one of its own machines (a HandsOff provider), from the user's machine: provisioned here,
handed to its supervisor there, and followed by the record the supervisor publishes.

`dsctl up` of such a run (`up.py`) provisions the machines from here (the provider's `up` creates them only), hands
the job to the supervisor (`dsctl supervise` on the dispatcher VM, orchestrator/supervise.py, which starts the
servers and runs the job with the same JobRunner), and waits until the supervisor publishes a first batch or the
run's end. Detached, it returns then; attached, it follows the run to its end through the one follow loop
(cloudruns.follow) and brings its record home. Any failure before the supervisor has the run tears everything down
from here.
"""

from __future__ import annotations

import json
import time

from dsctl.provisioners import HandsOff

from . import cloudrecord, cloudruns
from .outcome import Outcome, RunFailed
from .records import CloudLatest, RunSummary
from .run import JobRunner


def hands_off(runner: JobRunner) -> bool:
    """Whether this run is supervised on one of its machines (its provider can, and its spec asks for it)."""
    return isinstance(runner.provider, HandsOff) and runner.provider.hands_off(runner.spec, runner.mode)


class HandOff:
    """The hand-over of one run (a JobRunner's, not yet prepared) to its supervisor on the cloud, and following it."""

    def __init__(self, runner: JobRunner):
        assert isinstance(runner.provider, HandsOff), f"provider {runner.provider.name} cannot hand a run off"
        self.runner, self.cloud = runner, runner.provider

    def start(self, attached: bool = False, wait_s: float | None = None, poll_s: float = 1.0) -> CloudLatest:
        """Provision from here, hand the job to the supervisor, and return once it has published that the trainers
        run (or that the run already ended): what it published. Any failure until then tears everything down here."""
        r = self.runner
        self.cloud.prepare_hand_off(r.spec)  # before the checks: what is checked depends on it
        dep = r.prepare(reserve=False)  # the supervisor records the run's outcome, on its machine
        started = r.store.recorded(r.run_id).created_at
        outcome = Outcome()
        try:
            with outcome.classify(r.run_id):
                r.phase("provisioning")
                r.provider.up(r.spec, dep, r.workers, r.event)  # the machines only: the supervisor starts the servers
                dep.status = "up"
                dep.save()
                r.phase("handing over")
                self.cloud.hand_off(dep, self.files(attached), r.loaded.base_dir, r.event)
                first_batch_s = self.cloud.limits(r.spec).first_batch_s if wait_s is None else wait_s
                latest = self._wait_supervisor(first_batch_s, poll_s)
                if latest.status in ("failed", "interrupted"):
                    error = (latest.run or {}).get("error")
                    raise RunFailed(f"the run's supervisor on the dispatcher VM reported: {error}", r.run_id)
        except BaseException:
            r.finish(dep, outcome.status, outcome.error, started, keep_up=False)
            raise
        return latest

    def files(self, attached: bool) -> dict[str, bytes]:
        """What the supervisor gets in its run dir: the spec (as written and as resolved) and the hand-over (the run's
        row, its workers, its scaling policy, whether someone follows it, the checkpoints it resumes)."""
        r = self.runner
        handoff = {"run": r.store.run_row(r.run_id), "workers": r.workers,
                   "autoscale": r.policy.name if r.policy else None, "attached": attached,
                   "resume": r.resume.as_dict() if r.resume else None}
        files = {"spec.json": (r.run_dir / "spec.json").read_bytes(), "handoff.json": json.dumps(handoff).encode()}
        if (r.run_dir / "spec.yaml").exists():
            files["spec.yaml"] = (r.run_dir / "spec.yaml").read_bytes()
        return files

    def _wait_supervisor(self, wait_s: float, poll_s: float, look_every_s: float = 15.0) -> CloudLatest:
        """Until the supervisor publishes a first batch or the run's end; no longer than wait_s, nor once the
        supervisor is seen gone (looked at every look_every_s)."""
        dep = self.runner.deployment
        objects = self.cloud.run_objects(dep)
        deadline = time.monotonic() + wait_s
        next_look = time.monotonic() + look_every_s
        while True:
            latest = cloudrecord.read_latest(objects)
            if latest is not None and (latest.ended or latest.progress.batches):
                return latest
            now = time.monotonic()
            if now > deadline or now > next_look:
                status = self.cloud.supervisor_status(dep)
                next_look = now + look_every_s
                if now > deadline or status.startswith("gone"):
                    waited = f"within {wait_s:.0f} s" if now > deadline else "before it was lost"
                    raise RunFailed(f"the run's supervisor on the dispatcher VM has not reported a first batch "
                                    f"{waited} (its process: {status}); everything was deleted.")
            time.sleep(poll_s)

    def follow(self, poll_s: float = 2.0) -> RunSummary:
        """An attached `dsctl up` of a run handed over: its progress from what the supervisor publishes, until it
        ends; then its record here. Ctrl-C asks the supervisor to stop the run (a second one deletes it all from
        here). Raises RunFailed if the run did not succeed."""
        r = self.runner
        dep = r.deployment
        objects = self.cloud.run_objects(dep)

        def show(latest: CloudLatest) -> None:
            p, progress = latest.progress, r.progress
            progress.phase = p.phase or progress.phase
            progress.batches = p.batches or 0
            progress.batches_per_s = p.batches_per_s
            progress.workers_ready = p.workers or progress.workers_ready
            progress.restarts = p.restarts or 0
            progress.last_event = p.last_event or progress.last_event
            r.listener(progress)

        limits = self.cloud.limits(r.spec)
        try:
            # Heartbeats well within the limit, so the supervisor never takes a slow one for a gone follower.
            cloudruns.follow(objects, show, outage_limit_s=limits.outage_limit_s, limit_field=limits.outage_limit_field,
                             poll_s=poll_s, heartbeat_s=min(cloudruns.HEARTBEAT_S, limits.outage_limit_s / 3))
        except KeyboardInterrupt:
            try:
                r.phase("stopping")
                cloudruns.stop(r.store, objects, r.run_id, "the attached `dsctl up` (Ctrl-C)")
            finally:
                r.provider.down(dep, r.event)  # whatever the supervisor left, or all of it after a 2nd Ctrl-C
            raise
        except TimeoutError as exc:
            raise RunFailed(str(exc), r.run_id) from None
        cloudruns.refresh(r.store, dep, take_down_left=True)  # what its supervisor could not delete, from here
        record = r.store.recorded(r.run_id)
        r.summary = record.job
        if record.status != "succeeded":
            raise RunFailed(f"the run {record.status}: {record.error}", r.run_id)
        return r.summary
