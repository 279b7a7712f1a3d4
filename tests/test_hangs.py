"""A server that stops answering is a fault found within a bound (provisioners/local/hangs.py), named in events and
restarted by the one supervision policy, or the run failed (orchestrator/supervision.py). A worker SIGSTOP'd in a real
run: tests/test_run_endings.py."""

from __future__ import annotations

import os
import time

import pytest

from dsctl.orchestrator.outcome import RunFailed
from dsctl.orchestrator.supervision import Supervisor
from dsctl.provisioners import Deployment, Node, Poll, ServerExit, TrainerState
from dsctl.provisioners.local.hangs import SILENT_S, STOPPED_S, HangWatch, why_hung
from dsctl.provisioners.local.state import LocalNode


def test_a_stopped_process_or_a_silent_heartbeat_is_a_hang_past_its_bound():
    assert why_hung(None, None) is None and why_hung(STOPPED_S - 1, 1.0) is None and why_hung(None, SILENT_S - 1) is None
    assert "stopped (state T: SIGSTOP" in why_hung(STOPPED_S, 2.0)
    assert f"has not answered its heartbeat probe for {SILENT_S:.0f} s" in why_hung(None, SILENT_S)


def serving(tmp_path, beat_age_s: float, ready: bool = True) -> Node:
    """This (running) process as a server whose last heartbeat was `beat_age_s` ago."""
    ready_file = tmp_path / "worker-0.json"
    ready_file.write_text("{}")
    then = time.time() - beat_age_s
    os.utime(ready_file, (then, then))
    return Node(role="worker", index=0, pid=os.getpid(), address="127.0.0.1:5051",
                state=LocalNode(ready=ready, ready_file=str(ready_file)))


def test_a_server_whose_heartbeat_went_silent_is_hung_and_one_still_starting_is_not(tmp_path):
    watch = HangWatch()
    assert watch.check(serving(tmp_path, 1.0)) is None
    assert "heartbeat probe" in watch.check(serving(tmp_path, SILENT_S + 5))
    assert watch.check(serving(tmp_path, SILENT_S + 5, ready=False)) is None  # wait_ready bounds a start


class OneReport:
    name = "fake"

    def __init__(self, exited: ServerExit):
        self.exited = exited

    def poll(self, dep, events) -> Poll:
        return Poll(TrainerState(running=[0], exit_codes={}), exited=[self.exited])

    def restart(self, dep, node, events) -> None:
        self.restarted = node

    def log_tail(self, dep, node) -> str:
        return ""


@pytest.mark.parametrize("role", ["worker", "dispatcher"])
def test_a_hung_server_is_restarted_or_fails_the_run_with_why(role):
    node = Node(role=role, index=0, address="127.0.0.1:5051")
    why = "stopped answering (its process has been stopped (state T: SIGSTOP, or a debugger) for 5 s) and was ended"
    provider = OneReport(ServerExit(node, -9, why=why))
    events: list[tuple[str, str]] = []
    supervisor = Supervisor(provider, Deployment(run_id="r", provider="fake", run_dir="/x", nodes=[node]),  # type: ignore[arg-type]
                            fault_tolerant=False, events=lambda kind, message: events.append((kind, message)))
    if role == "dispatcher":
        with pytest.raises(RunFailed, match="the dispatcher stopped answering"):
            supervisor.poll()
        return
    supervisor.poll()
    assert provider.restarted is node
    assert events == [("worker-restarted", f"worker 0 {why}; restarting it at 127.0.0.1:5051")]
