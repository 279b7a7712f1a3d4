"""Find and remove a run's resources by label, with no local state (`dsctl down RUN` after a lost run dir).

Instances and TPU VMs are found by the label dsctl-run=<run>; the firewall rule
(firewall rules have no labels) by the name derived from the run id. Deletion
is parallel and confirmed, as for a normal `down`.
"""

from __future__ import annotations

from typing import Callable

from .clients import Clients
from .resources import Fleet, Found
from .settings import GcpSettings, check_credentials


def _fleet(project: str, zone: str, run_id: str, log: Callable[[str], None] | None) -> Fleet:
    settings = GcpSettings(project=project, zone=zone).with_env_endpoints()
    check_credentials(settings)
    return Fleet(Clients(settings), run_id, log=log)


def find_by_label(project: str, zone: str, run_id: str) -> Found:
    """What exists of run `run_id` in project/zone: VMs and TPU VMs (name -> status) and its firewall rule."""
    return _fleet(project, zone, run_id, None).find()


def down_by_label(project: str, zone: str, run_id: str, log: Callable[[str], None] | None = None) -> Found:
    """Delete everything of run `run_id` found by label (and its firewall rule); returns what was found.

    Raises GcpError naming what is still there if deletion is not confirmed in time.
    """
    return _fleet(project, zone, run_id, log).sweep()
