"""The watcher (provisioners/gcp/watch.py) against VMs that answer, fail, or hang, with an SSH double that
answers the status command the way a VM's shell does. Real SSH runs in test_gcp_recovery_job.py; here the
point is what the watcher does around it: one hung VM never holds up the others, failures back off, and a
reading stuck in flight counts as an outage and frees its connection."""

from __future__ import annotations

import threading
import time

import pytest

from dsctl.provisioners.gcp import watch
from dsctl.provisioners.gcp.errors import SshUnreachable
from dsctl.provisioners.gcp.remote import Layout
from dsctl.provisioners.gcp.ssh import Result
from dsctl.provisioners.gcp.watch import Watched, Watcher


class FakeSsh:
    """host -> "ok" (a live process), "fail" (connection refused) or "hang" (no answer until dropped)."""

    def __init__(self, behaviour: dict[str, str]):
        self.behaviour = behaviour
        self.calls: dict[str, int] = {h: 0 for h in behaviour}
        self.dropped: list[str] = []
        self.released = {h: threading.Event() for h in behaviour}

    def run(self, host, command, *, doing, timeout=60.0):
        self.calls[host] += 1
        how = self.behaviour[host]
        if how == "hang":
            self.released[host].wait(30)
            raise SshUnreachable(f"SSH to {host} dropped")
        if how == "fail":
            raise SshUnreachable(f"SSH to {host} refused")
        d = f"/vms/{host}"
        return Result(0, f"S\t{d}\t42\t\tS 10 5 777\t100\t\t\t100\t4096\t1\t\n", "")

    def drop(self, host):
        self.dropped.append(host)
        self.released[host].set()

    def read_from(self, *a, **k):
        return b""

    def get(self, *a, **k):
        return False


def watcher(behaviour: dict[str, str]) -> tuple[Watcher, FakeSsh]:
    ssh = FakeSsh(behaviour)
    w = Watcher(ssh)
    for i, host in enumerate(behaviour):
        w.watch(Watched(key=("worker", i), host=host, layout=Layout(f"/vms/{host}"), launched_at=0.0))
    return w, ssh


def test_a_hung_vm_never_holds_up_the_others_and_counts_as_unreachable_once_stuck(monkeypatch):
    monkeypatch.setattr(watch, "STUCK_S", 1.0)
    w, ssh = watcher({"a": "ok", "b": "hang"})
    t0 = time.monotonic()
    for _ in range(10):
        w.cycle(wait=False)
        time.sleep(0.03)
    assert time.monotonic() - t0 < 0.9, "the loop never waits on the hung VM"
    assert ssh.calls["b"] == 1, "a reading in flight is not started again"
    assert ssh.calls["a"] >= 5 and ("worker", 0) in w.snapshot()
    assert "b" not in w.unreachable(), "not yet stuck"
    time.sleep(0.8)
    w.cycle(wait=False)
    assert "b" in w.unreachable() and "no answer over SSH" in w.unreachable()["b"][1]
    assert ssh.dropped == ["b"], "its connection is dropped, which frees the waiting thread"
    w.stop()


def test_a_failing_vm_is_retried_with_growing_waits_and_forgiven_when_it_answers(monkeypatch):
    monkeypatch.setattr(watch, "RETRY_FIRST_S", 0.1)
    w, ssh = watcher({"a": "fail"})
    deadline = time.monotonic() + 1.6
    while time.monotonic() < deadline:
        w.cycle()
        time.sleep(0.01)
    # Waits of 0.1, 0.2, 0.4, 0.8 s: four or five tries in 1.6 s, not one per cycle (~100 cycles).
    assert 3 <= ssh.calls["a"] <= 6, ssh.calls
    since = w.unreachable()["a"][0]
    assert since <= deadline - 1.5, "unreachable since the first failure"
    ssh.behaviour["a"] = "ok"
    deadline = time.monotonic() + 3.0  # the next try is due at most 1.6 s after the last
    while w.unreachable() and time.monotonic() < deadline:
        w.cycle()
        time.sleep(0.01)
    assert w.unreachable() == {} and ("worker", 0) in w.snapshot()
    w.stop()


@pytest.mark.parametrize("forget", [True, False])
def test_only_watched_vms_are_reported_unreachable(forget):
    w, ssh = watcher({"a": "fail"})
    w.cycle()
    assert "a" in w.unreachable()
    if forget:
        w.forget(("worker", 0))
        assert w.unreachable() == {}, "a VM no longer watched (deleted, restarting) is nobody's outage"
    w.stop()
