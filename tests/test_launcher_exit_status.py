"""A trainer the launcher forked ends; the launcher reaps it and writes how (provisioners/local/provider.py).

On a loaded machine the launcher can write that well after the trainer is gone: a trainer pushed to its memory
cgroup's limit makes every process in the cgroup fault its pages back in, the launcher included. A CI run once saw
a trainer killed by the kernel's out-of-memory killer reported as "exited with code -1" because dsctl stopped
waiting after 10 s while the launcher still lived. While the launcher lives its answer is waited for; once it has
ended without one, the status is lost and the error says so, not "code -1".

Processes here are this test's own: a record of it with its true start time is a live process, one with a start
time an hour off is a process that has ended (its pid reused).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

from dsctl.provisioners import Deployment, Node, ProcessRef
from dsctl.provisioners.local import LocalProvider
from dsctl.provisioners.local import provider as local
from dsctl.provisioners.local.launcher import Launcher
from dsctl.provisioners.local.state import LocalDeployment, LocalNode
from dsctl.runtime.readiness import write_json_atomic

STARTED = psutil.Process().create_time()
ENDED = STARTED - 3600.0


def deployment(tmp_path: Path, launcher_alive: bool) -> Deployment:
    """A run whose launcher is alive or not and whose one trainer has ended, no exit file written for it yet."""
    launcher = ProcessRef(pid=os.getpid(), pgid=os.getpgid(0), create_time=STARTED if launcher_alive else ENDED)
    trainer = Node(role="trainer", index=0, pid=os.getpid(), pgid=os.getpgid(0), create_time=ENDED, state=LocalNode())
    return Deployment(run_id="r", provider="local", run_dir=str(tmp_path), nodes=[trainer],
                      state=LocalDeployment(launcher=launcher))


def gone_for(provider: LocalProvider, seconds: float) -> None:
    """As if the provider had first seen the trainer gone `seconds` ago."""
    provider._vanished[os.getpid()] = time.monotonic() - seconds


def test_a_live_launchers_answer_is_waited_for_however_late_it_comes(tmp_path):
    dep, provider = deployment(tmp_path, launcher_alive=True), LocalProvider()
    gone_for(provider, 60.0)  # far past the 10 s that once reported the status lost
    state = provider.poll(dep, lambda *_: None).trainers
    assert state.running == [0] and state.exit_codes == {}

    said = "was killed by the kernel's out-of-memory killer (SIGKILL): it ran out of memory. Evidence: ..."
    Launcher(tmp_path).dir.mkdir()
    write_json_atomic(Launcher(tmp_path).dir / f"exit-{os.getpid()}.json", {"code": -9, "ended": said, "oom": True})
    state = LocalProvider().poll(dep, lambda *_: None).trainers  # any dsctl process reads the launcher's answer
    assert state.exit_codes == {0: -9} and state.endings == {0: said}


def test_a_status_the_launcher_ended_without_giving_is_reported_lost_and_why(tmp_path):
    dep = deployment(tmp_path, launcher_alive=False)
    state = LocalProvider().poll(dep, lambda *_: None).trainers
    assert state.running == [] and state.exit_codes == {0: -1}
    log = tmp_path / "logs" / "launcher.log"
    assert state.endings[0] == f"ended, and its exit status is lost: the launcher that forked it ended without saying " \
                               f"how (see {log})"


def test_a_live_launcher_silent_past_its_limit_is_named(tmp_path):
    dep, provider = deployment(tmp_path, launcher_alive=True), LocalProvider()
    gone_for(provider, local.LAUNCHER_REAP_WAIT_S + 1)
    state = provider.poll(dep, lambda *_: None).trainers
    assert state.exit_codes == {0: -1}
    assert state.endings[0].startswith("ended, and its exit status is lost: the launcher that forked it has not said "
                                       f"how within {local.LAUNCHER_REAP_WAIT_S:.0f} s"), state.endings
