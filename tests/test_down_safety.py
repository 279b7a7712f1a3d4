"""`dsctl down` stops what it can prove is the run's, and nothing else (provisioners/processes.py).

A process group is signalled only where dsctl made it (a recorded process that leads it), never the group of the
command calling `down` or of any ancestor of it; a run whose state file is unreadable is rebuilt from its cgroup and
the processes dsctl started for it, never from every process that names its folder. The real-process scenario (a CI
script following the run's log while it calls `dsctl down`) is tests/test_local_job.py.
"""

from __future__ import annotations

import json

import pytest

from dsctl.orchestrator import deployments
from dsctl.provisioners.processes import group_to_signal, started_for_run

RUN_DIR = "/home/u/.dsctl/runs/long-1201-101010-abcd"
RUN_ID = "long-1201-101010-abcd"
PY = "/home/u/.venv/bin/python3"


def test_a_group_is_signalled_only_where_its_recorded_leader_made_it_and_still_leads_it():
    assert group_to_signal(4000, 4000, 4000, forbidden={100}) == 4000
    assert group_to_signal(4001, 4000, 4000, forbidden={100}) is None  # in someone else's group (a script's)
    assert group_to_signal(4000, 4000, 4100, forbidden={100}) is None  # it moved to another group since
    assert group_to_signal(4000, None, 4000, forbidden={100}) is None


def test_the_callers_group_and_its_ancestors_groups_are_never_signalled():
    """A pid reused by a process that happens to lead the group `down` runs in (its shell script's) is not stopped
    as a group."""
    assert group_to_signal(100, 100, 100, forbidden={100, 1}) is None


@pytest.mark.parametrize("argv,sid_is_pid,ours", [
    ([PY, "-m", "dsctl.runtime.launcher", "--requests", f"{RUN_DIR}/launcher", "--isolate-network"], True, True),
    ([PY, "-m", "dsctl.runtime.worker", "--ready-file", f"{RUN_DIR}/ready/worker-0.json"], True, True),
    ([PY, "-m", "dsctl.cli.main", "up", "job.yaml", "--run-id", RUN_ID, "--detached-child"], True, True),
    # A launcher's fork that has not yet called setsid: not proved (its cgroup still holds it).
    ([PY, "-m", "dsctl.runtime.launcher", "--requests", f"{RUN_DIR}/launcher"], False, False),
    (["tail", "-f", f"{RUN_DIR}/up.log"], False, False),  # a CI script's follower, in the script's group
    (["setsid", "tail", "-f", f"{RUN_DIR}/up.log"], True, False),  # even leading a session, not dsctl's
    ([PY, "-m", "dsctl.cli.main", "logs", RUN_ID, "--follow"], True, False),  # names the run, started by the user
    ([PY, "-m", "dsctl.runtime.worker", "--ready-file", f"{RUN_DIR}-2/ready/worker-0.json"], True, False),  # another run
    ([PY, "-c", "import dsctl", f"{RUN_DIR}/x"], True, False),
])
def test_a_process_is_the_runs_when_it_leads_its_session_and_runs_dsctl_naming_the_run(argv, sid_is_pid, ours):
    pid = 4242
    assert started_for_run(argv, pid, pid if sid_is_pid else 1, RUN_DIR, RUN_ID) is ours


@pytest.mark.parametrize("garble", ["cut short", "not json", "empty", "a list"])
def test_every_garbled_state_file_is_rebuilt_and_a_run_with_nothing_left_is_not_up(home, garble):
    run_dir = home / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    whole = json.dumps({"run_id": RUN_ID, "provider": "local", "run_dir": str(run_dir), "status": "up", "nodes": []})
    (run_dir / "state.json").write_text({"cut short": whole[: len(whole) // 2], "not json": "\x00garbage{",
                                         "empty": "", "a list": "[1, 2]"}[garble])
    dep = deployments.load_or_recover(run_dir)
    assert dep.status == deployments.UNREADABLE and dep.nodes == [] and dep.run_id == RUN_ID
    assert "rebuilt from no cgroup and 0 process(es)" in deployments.rebuilt_from(dep)
    assert deployments.active_deployments() == []
