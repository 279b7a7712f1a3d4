"""A run's supervisor on the cloud: the job handed over by `dsctl up --detach`, run to its end there.

`dsctl up --detach` on Google Cloud provisions from the user's machine, then hands the deployment
to `dsctl supervise RUN_DIR` on the dispatcher VM (the gcp provider's hand_off / adopt), which
runs the job as `dsctl up` would: it starts the trainers, restarts workers, brings back stopped
VMs, waits out SSH outages, records windows and events in its own store, and tears everything
down when the job ends or fails, when `dsctl down` asks (cloudrecord.STOP), or when the run has
lasted gcp.max_duration_s. Its record is published every PUBLISH_S (cloudrecord.py), where any
dsctl reads it, the user's machine no longer needed. Its own VM is deleted last, after the final
record is published: until then it is the one machine still billing. It is kept when anything else
of the run is left (cloudrecord.LEFT_BEHIND says what): the supervisor's heartbeat ends with this
process, and every VM of the run then deletes itself (provisioners/gcp/watchdog.py).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from dsctl.provisioners import Deployment, HandOffLimits, HandsOff, load_deployment
from dsctl.specs import load_spec_text

from . import cloudrecord
from .preflight import load_job
from .resume import Resume
from .run import JobRunner
from .store import RunStore

PUBLISH_S = 10.0
FIRST_PUBLISH_S = 2.0


def _loaded(run_dir: Path):
    """The run's spec as the user wrote it (for its folder-relative paths), else as resolved."""
    yaml = run_dir / "spec.yaml"
    if yaml.exists():
        return load_job(yaml, check_entrypoints=False)  # the user's code runs on the trainer VMs, not here
    return load_spec_text((run_dir / "spec.json").read_text(), str(run_dir / "spec.json"))


def _progress(runner: JobRunner) -> dict:
    p = runner.progress
    return {"phase": p.phase, "batches": p.batches, "batches_per_s": p.batches_per_s, "workers": p.workers_ready,
            "restarts": p.restarts, "last_event": p.last_event}


class _Watchdog(threading.Thread):
    """Publishes the record every PUBLISH_S, and once more (the last) when told the run is over; ends the run
    (SIGTERM to this process, which tears it down like Ctrl-C) when `dsctl down` asks for it or the run passes
    its maximum duration."""

    def __init__(self, runner: JobRunner, objects: cloudrecord.Objects, deadline: float, limits: HandOffLimits,
                 attached: bool):
        super().__init__(name="dsctl-publish", daemon=True)
        self.runner, self.objects, self.deadline, self.limits = runner, objects, deadline, limits
        # An attached run: how long it may go without the follower's heartbeat.
        self.attached_limit_s = limits.outage_limit_s if attached else None
        self.over = threading.Event()
        self.reason: str | None = None
        self._beat: tuple[int | None, float] = (None, time.monotonic())  # the follower's last beat, when it changed

    def run(self) -> None:
        store = RunStore()  # this thread's own connection to the supervisor's store
        publisher = cloudrecord.Publisher(store, self.objects, self.runner.run_id)
        while True:
            # Often until the first batch (`dsctl up --detach` waits for it), then every PUBLISH_S.
            last = self.over.wait(PUBLISH_S if self.runner.progress.batches else FIRST_PUBLISH_S)
            try:
                publisher.publish(_progress(self.runner))
                if not last and self.reason is None:
                    asked = cloudrecord.stop_requested(self.objects)
                    unheard = self._unheard_s()
                    if asked is not None:
                        self._end(store, f"stopped by {asked}")
                    elif time.time() > self.deadline:
                        self._end(store, f"the run reached {self.limits.max_duration_field} and was stopped")
                    elif unheard is not None and self.attached_limit_s is not None and unheard > self.attached_limit_s:
                        self._end(store, f"the attached `dsctl up` has not been heard from for {unheard:.0f} s "
                                         f"({self.limits.outage_limit_field}), so nobody follows the run; it was "
                                         "stopped")
            except Exception:  # noqa: BLE001 - a publish that fails now is made again at the next one
                pass
            if last:
                return

    def _unheard_s(self) -> float | None:
        """Seconds since the attached follower's heartbeat last changed (by this machine's clock); None if detached."""
        if self.attached_limit_s is None:
            return None
        beat = cloudrecord.follower_beat(self.objects)
        if beat != self._beat[0]:
            self._beat = (beat, time.monotonic())
        return time.monotonic() - self._beat[1]

    def finish(self, timeout_s: float = 120.0) -> None:
        """The run is over and recorded: publish the record a last time."""
        self.over.set()
        self.join(timeout_s)

    def _end(self, store: RunStore, reason: str) -> None:
        self.reason = reason
        store.add_event(self.runner.run_id, "stopped", reason)
        os.kill(os.getpid(), signal.SIGTERM)


def supervise(run_dir: Path) -> int:
    """Run the handed-over job in `run_dir` to its end; returns the process's exit code."""
    run_dir = Path(run_dir)
    handoff = json.loads((run_dir / "handoff.json").read_text())
    row = handoff["run"]
    store = RunStore()
    if store.get(row["id"]) is None:
        store.put_run_row({**row, "run_dir": str(run_dir)})
    dep = load_deployment(run_dir)
    dep.run_dir = str(run_dir)  # the state was written on the user's machine, where the run dir is elsewhere
    runner = JobRunner(_loaded(run_dir), run_id=row["id"], store=store, workers=handoff["workers"],
                       autoscale=handoff.get("autoscale"), resume=Resume.from_dict(handoff.get("resume")))
    cloud = runner.provider
    assert isinstance(cloud, HandsOff), f"provider {cloud.name} supervises no run on the cloud"
    objects = cloud.run_objects(dep)
    try:
        cloud.check_supervisor(dep, runner.spec, lambda kind, message: store.add_event(runner.run_id, kind, message))
    except Exception as exc:  # noqa: BLE001 - said in the record; the user's machine, still waiting, deletes the run
        store.update_run(runner.run_id, status="failed", ended_at=time.time(), error=str(exc))
        store.flush()
        cloudrecord.Publisher(store, objects, runner.run_id).publish({"phase": "refused"})
        return 1
    limits = cloud.limits(runner.spec)
    watchdog = _Watchdog(runner, objects, row["created_at"] + limits.max_duration_s, limits, bool(handoff.get("attached")))
    watchdog.start()

    def bring_up(dep: Deployment) -> None:  # the servers of the machines `dsctl up` created, started from here
        cloud.adopt(dep, runner.spec)
        runner.phase("provisioning")
        cloud.launch_servers(dep, runner.event)
        runner.provider.wait_ready(dep, runner.event)

    code = 1
    try:
        runner.run_on(dep, bring_up)
        code = 0
    except KeyboardInterrupt:
        code = 130
        if watchdog.reason:
            store.update_run(runner.run_id, error=watchdog.reason)
    except Exception:  # noqa: BLE001 - recorded by the runner; what is left is the last publish and the VM
        code = 1
    finally:
        try:
            store.flush()
            watchdog.finish()
        finally:
            try:
                cloud.delete_self(dep)
            except Exception as exc:  # noqa: BLE001 - its VM stays: said where `dsctl status` reads it
                cloudrecord.record_left_behind(objects, str(exc))
                code = code or 1
    return code
