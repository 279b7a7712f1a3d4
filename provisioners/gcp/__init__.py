"""Google Cloud provider: Compute Engine VMs for the service, TPU or GPU VMs for trainers, GCS, SSH.

    provisioner.py  the provisioner contract (check, up, start_trainers, wait_ready, poll, sample, down)
    plan.py         what `dsctl up --dry-run` shows: machines, zone, $/hour, estimated cost
    sweep.py        find_by_label / down_by_label: remove a run's resources with no local state
    commands.py     what the CLI calls: up_plan (--dry-run), confirm_up, down_without_state
    resources.py    parallel create (one bulk insert for workers), wait for RUNNING, confirmed delete
    compute.py, tpu.py, firewall.py, storage.py   one Google Cloud API each (storage.py: also the spec's folder
                                                  the trainers get, less what its .dsctlignore leaves out: ignore.py)
    operations.py, retry.py, errors.py            waiting, retrying and classifying
    ssh.py, remote.py, watch.py, keys.py          reaching the VMs and running the runtime there
    startup.py, wheel.py, versions.py             the same TensorFlow and dsctl on every VM
    settings.py, clients.py, naming.py            configuration, API clients, names and labels

Nothing here imports the Google Cloud libraries at import time (they take about a second);
each module imports them where it calls them.
"""

from .commands import confirm_up, down_without_state, run_objects_without_state, up_plan
from .errors import GcpError
from .plan import Plan, plan
from .provisioner import GcpProvisioner
from .sweep import down_by_label, find_by_label

__all__ = ["GcpError", "GcpProvisioner", "Plan", "confirm_up", "down_by_label", "down_without_state", "find_by_label",
           "plan", "run_objects_without_state", "up_plan"]
