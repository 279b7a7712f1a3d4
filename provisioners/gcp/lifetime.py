"""How long a run's machines may live without the process that supervises them: the limits, written once.

Two ends, so nothing of a run bills on after its supervisor (`dsctl up` here, or `dsctl supervise`
on the dispatcher VM) is gone, with nobody running dsctl:
- every Compute Engine VM carries gcp.max_duration_s plus MAX_RUN_MARGIN_S as its maxRunDuration,
  with the termination action DELETE (compute.py): Compute Engine deletes it then;
- every VM and TPU VM that runs as the run's supervisor account (its dispatcher and trainers) runs a dead man's
  switch (watchdog.py) that deletes the run's VMs, then its own machine, once the supervisor's heartbeat object
  (heartbeat.py) has not changed for gcp.heartbeat_limit_s. The TPU API has no run-time limit, so for a TPU VM
  this is the only end; worker VMs, whose account may delete nothing, are ended by these watchdogs, or at worst by
  their maxRunDuration.
The watchdog's configuration reaches the VM as one metadata attribute (WATCHDOG_KEY, JSON), read from
the metadata server: no value of it passes through a shell.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from .naming import label_value, prefix
from .remote import REAL_STORAGE
from .settings import GcpSettings
from .storage import heartbeat_object

MAX_RUN_MARGIN_S = 3600.0  # the VMs outlive the run's own limit by this much: the supervisor ends it first
WATCHDOG_KEY = "dsctl-watchdog"  # the metadata attribute holding a VM's WatchdogConfig
REAL_COMPUTE = "https://compute.googleapis.com"
REAL_TPU = "https://tpu.googleapis.com"


def max_run_s(settings: GcpSettings) -> float:
    """Compute Engine's maxRunDuration for every VM of a run."""
    return settings.max_duration_s + MAX_RUN_MARGIN_S


def beat_every_s(limit_s: float) -> float:
    """How often the supervisor rewrites its heartbeat: several times within the limit (Cloud Storage takes one
    write of an object a second)."""
    return max(2.0, min(30.0, limit_s / 5))


def check_every_s(limit_s: float) -> float:
    """How often a watchdog reads the heartbeat: the machine is deleted at most this long after the limit."""
    return max(1.0, min(30.0, limit_s / 8))


@dataclass(frozen=True)
class WatchdogConfig:
    """What a VM's watchdog needs, as the metadata attribute WATCHDOG_KEY holds it. `tpu_node` (projects/P/
    locations/Z/nodes/N) makes it delete that TPU node (through its queued resource of the same name); without it
    the watchdog deletes the Compute Engine instance it runs on, named by the metadata server."""

    bucket: str
    object: str
    limit_s: float
    check_s: float
    storage: str
    compute: str
    tpu: str
    project: str
    zone: str
    run_label: str  # the value of the run's label, dsctl-run=<value>, which every Compute Engine VM of it carries
    tpu_prefix: str | None = None  # the run's TPU queued resources' names start with it (a run with TPU VMs)
    tpu_node: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WatchdogConfig:
        return cls(**json.loads(text))


def watchdog_config(settings: GcpSettings, run_id: str, *, tpus: bool, tpu_node: str | None = None) -> WatchdogConfig:
    """The watchdog configuration of a run's supervisor-account VMs (of one TPU VM with `tpu_node`, its node id);
    `tpus`: the run has TPU VMs for the watchdog to reap."""
    s = settings
    limit = s.heartbeat_limit_s
    node = f"projects/{s.project}/locations/{s.zone}/nodes/{tpu_node}" if tpu_node else None
    return WatchdogConfig(bucket=s.bucket, object=heartbeat_object(run_id), limit_s=limit, check_s=check_every_s(limit),
                          storage=s.storage_host or REAL_STORAGE, compute=s.compute_endpoint or REAL_COMPUTE,
                          tpu=s.tpu_endpoint or REAL_TPU, project=s.project, zone=s.zone,
                          run_label=label_value(run_id), tpu_prefix=prefix(run_id) if tpus else None, tpu_node=node)
