"""Google Cloud provider: Compute Engine VMs for the service, TPU or GPU VMs for trainers, GCS, SSH.

    provider.py  GcpProvider: the provider contract and its capabilities, delegating to the modules below
    state.py        what a deployment keeps on Google Cloud (typed, in the run's state file; old files converted)
    context.py      one deployment as every step works on it: settings, API clients, SSH, built once
    vms.py          the run's VMs: recorded, created, bootstrapped, version-checked; deleted, confirmed
    stage.py        what the VMs fetch from Cloud Storage: wheel, wheelhouses, a builtin's data, the spec and code
    processes.py    the processes on the VMs: started, watched (watch.py), stopped; what a poll reports
    recovery.py     stopped and deleted VMs, SSH outages, reported to the supervisor; restore.py starts a VM again
    handoff.py      a run handed to a supervisor on its dispatcher VM (HandsOff)
    teardown.py     `down`: stopped, brought home, deleted and confirmed gone
    planning.py     what `dsctl up --dry-run` shows, and the question before anything bills (Plans)
    bylabel.py      a run's resources and record found by label, with no local state (FindsByLabel)
    threads.py      doing one thing to many VMs at once, and their events told on the orchestrator's thread
    resources.py    parallel create (one bulk insert for workers), wait for RUNNING, confirmed delete
    compute.py, tpu.py, firewall.py, storage.py   one Google Cloud API each (storage.py: also the spec's folder
                                                  the trainers get, less what its .dsctlignore leaves out: ignore.py)
    operations.py, retry.py, errors.py            waiting, retrying and classifying
    ssh.py, remote.py, watch.py, keys.py          reaching the VMs and running the runtime there
    startup.py, wheel.py, wheelhouse.py, versions.py, software.py   the same TensorFlow and dsctl on every VM
    settings.py, clients.py, naming.py, machinetypes.py   configuration, API clients, names and labels, VM kinds
    preflight.py, data.py                         checks against the live project; a builtin's data in the bucket

Nothing here imports the Google Cloud libraries at import time (they take about a second);
each module imports them where it calls them. Importing provider.py registers the provider (specs/places.py
names it); this package itself imports nothing until one of the names below is asked for, so the options that
locate runs (locating.py) are read without the rest of it.
"""

from __future__ import annotations

import importlib
from typing import Any

# What this package offers, and the module each comes from (imported when first asked for).
_EXPORTS = {"GcpCodec": "state", "GcpDeployment": "state", "GcpNode": "state", "Vm": "state", "GcpError": "errors",
            "GcpProvider": "provider", "Plan": "planning", "plan": "planning", "down_by_label": "bylabel",
            "find_by_label": "bylabel"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
