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


# -- the cadence: which VM is read when, for a clock the test moves -----------------------------------------------


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class VmsSsh:
    """Every host answers for one process that runs, at half a core (CPU ticks follow the clock), ready unless
    `unready` names it; a host in `metrics` reports a metrics file of that size (a trainer's)."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.calls: list[tuple[float, str]] = []  # (when, host) of each status command
        self.unready: set[str] = set()
        self.metrics: dict[str, int] = {}

    def run(self, host, command, *, doing, timeout=60.0):
        now = self.clock()
        self.calls.append((now, host))
        ready = "" if host in self.unready else '{"role": "worker", "pid": 42, "port": 1}'
        size = str(self.metrics[host]) if host in self.metrics else ""
        ticks = int(now * 50)  # CLK_TCK 100: half a core
        return Result(0, f"S\t/vms/{host}\t42\t\tS {ticks} 0 777\t100\t{ready}\t{size}\t100\t4096\t1\t\n", "")

    def reads(self, host: str, since: float = 0.0) -> int:
        return sum(1 for t, h in self.calls if h == host and t >= since)

    def drop(self, host):
        pass

    def read_from(self, *a, **k):
        return b""

    def get(self, *a, **k):
        return False


def vms(workers: int, trainers: int, tmp_path) -> tuple[Watcher, VmsSsh, Clock]:
    clock = Clock()
    ssh = VmsSsh(clock)
    w = Watcher(ssh, clock=clock)
    w.watch(Watched(key=("dispatcher", 0), host="d", layout=Layout("/vms/d"), launched_at=0.0))
    for i in range(workers):
        w.watch(Watched(key=("worker", i), host=f"w{i:03d}", layout=Layout(f"/vms/w{i:03d}"), launched_at=0.0))
    for i in range(trainers):
        ssh.metrics[f"t{i}"] = 0
        w.watch(Watched(key=("trainer", i), host=f"t{i}", layout=Layout(f"/vms/t{i}"), launched_at=0.0,
                        metrics_local=str(tmp_path / f"trainer-{i}.jsonl")))
    return w, ssh, clock


def tick(w: Watcher, clock: Clock, seconds: int = 1) -> None:
    for _ in range(seconds):
        clock.t += 1.0
        w.cycle()


def test_servers_are_read_each_once_a_period_spread_evenly_and_trainers_every_second(tmp_path):
    w, ssh, clock = vms(workers=19, trainers=1, tmp_path=tmp_path)
    servers = ["d"] + [f"w{i:03d}" for i in range(19)]
    assert watch.server_every_s(20) == 10.0, "20 servers at 2 readings a second: each every 10 s"
    w.cycle()  # the first reading of every VM
    assert all(ssh.reads(h) == 1 for h in servers + ["t0"])
    tick(w, clock)  # and the second, for a first CPU rate
    assert all(ssh.reads(h) == 2 for h in servers + ["t0"]) and len(w.readings()) == 21
    for period in range(3):
        since = clock.t + 1
        per_cycle = []
        for _ in range(10):
            before = len(ssh.calls)
            tick(w, clock)
            per_cycle.append(sum(1 for _, h in ssh.calls[before:] if h != "t0"))
        assert [ssh.reads(h, since) for h in servers] == [1] * 20, f"period {period}: each server once in 10 s"
        assert per_cycle == [2] * 10, f"spread evenly: 2 servers a second, not all at once ({per_cycle})"
        assert ssh.reads("t0", since) == 10, "the trainer every second"
    assert not w.waiting


def test_the_servers_period_has_a_floor_and_grows_with_their_number_past_the_budget():
    assert watch.server_every_s(1) == watch.server_every_s(5) == 5.0
    assert watch.server_every_s(65) == 32.5 and watch.server_every_s(641) == 320.5
    assert watch.server_every_s(5, waiting=True) == 1.0 and watch.server_every_s(641, waiting=True) == 641 / 32


def test_a_server_is_read_every_second_until_it_is_ready_then_on_its_cadence(tmp_path):
    w, ssh, clock = vms(workers=4, trainers=0, tmp_path=tmp_path)
    ssh.unready.add("w002")
    w.cycle()
    tick(w, clock, 6)
    assert ssh.reads("w002") == 7, "not ready: every second"
    assert all(ssh.reads(h) <= 3 for h in ("d", "w000", "w001", "w003")), "ready: every 5 s"
    ssh.unready.clear()
    tick(w, clock)  # reads it ready
    since = clock.t + 1
    tick(w, clock, 10)
    assert ssh.reads("w002", since) == 2, "ready now: every 5 s"
    # Restarted (watched again): read at once, and every second until ready again.
    ssh.unready.add("w002")
    w.watch(Watched(key=("worker", 2), host="w002", layout=Layout("/vms/w002"), launched_at=clock.t))
    since = clock.t + 1
    tick(w, clock, 3)
    assert ssh.reads("w002", since) == 3


def test_servers_are_read_every_second_while_the_trainers_wait_and_back_on_their_cadence_after(tmp_path):
    w, ssh, clock = vms(workers=4, trainers=1, tmp_path=tmp_path)
    servers = ["d", "w000", "w001", "w002", "w003"]
    w.cycle()
    tick(w, clock, 10)  # the trainer writes nothing yet (starting): not judged; servers twice, then every 5 s
    assert not w.waiting and all(ssh.reads(h) <= 4 for h in servers)
    for _ in range(10):  # a line a second
        ssh.metrics["t0"] += 100
        tick(w, clock)
    assert not w.waiting
    since = clock.t + 1
    tick(w, clock, 5)  # quiet for QUIET_S: still not waiting (more than QUIET_S is)
    assert not w.waiting and all(ssh.reads(h, since) <= 1 for h in servers)
    since = clock.t + 1
    tick(w, clock, 4)  # quiet for longer: a worker may be gone, every server every second
    assert w.waiting
    assert all(ssh.reads(h, since) >= 3 for h in servers), [ssh.reads(h, since) for h in servers]
    ssh.metrics["t0"] += 100  # going again: seen by this cycle's reading, acted on from the next
    tick(w, clock, 2)
    assert not w.waiting
    since = clock.t + 1
    for _ in range(10):
        ssh.metrics["t0"] += 100
        tick(w, clock)
    assert [ssh.reads(h, since) for h in servers] == [2] * 5, "back to every 5 s"


def test_a_trainer_with_long_windows_is_judged_by_its_own_gaps(tmp_path):
    w, ssh, clock = vms(workers=4, trainers=1, tmp_path=tmp_path)
    w.cycle()
    for _ in range(3):  # a line every 10 s, seen at 1001, 1011, 1021
        ssh.metrics["t0"] += 100
        tick(w, clock, 10)
    tick(w, clock, 20)
    assert not w.waiting, "29 s quiet: less than 3 of its 10 s gaps"
    tick(w, clock, 2)
    assert w.waiting, "31 s quiet"


def test_cpu_rates_come_from_readings_however_far_apart(tmp_path):
    from types import SimpleNamespace

    from dsctl.provisioners.gcp import processes

    w, ssh, clock = vms(workers=63, trainers=0, tmp_path=tmp_path)  # 64 servers: each every 32 s
    w.cycle()
    tick(w, clock, 40)
    samples = processes.sample(SimpleNamespace(watcher=w))
    assert len(samples) == 64
    gaps = {round(cur.at - prev.at) for prev, cur in w.readings().values()}
    assert max(gaps) == 32, gaps
    assert all(abs(s.cpu_cores - 0.5) < 0.01 for s in samples), [s.cpu_cores for s in samples]
