"""Local runs are closed to everyone but the run's own processes (issue 17, "Isolation").

tf.data service has no authentication and TensorFlow binds every interface: whoever reaches a
dispatcher can run dataset graphs as the user and register a worker of their own. dsctl runs
the whole local deployment in a network namespace of its own with only loopback up. These
tests check that from the outside: a client in a network namespace the test makes itself,
joined to the host by a veth pair with addresses the test assigns (10.199.x.x), the way a
machine on the host's network would reach it. Test traffic goes to those addresses only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from dsctl.orchestrator.store import RunStore
from dsctl.provisioners import Deployment, load_deployment
from dsctl.provisioners.local.provider import LocalProvider
from dsctl.provisioners.processes import is_ours
from dsctl.runtime.readiness import read_json
from dsctl.specs import load_spec_text
from helpers import ClientNetns, listening_ports, processes_under, wait_for, wildcard_listeners, write_spec

pytestmark = pytest.mark.slow

LONG_JOB = """
    name: closed
    service: {workers: 2%s}
    trainer: {model: {step_time_ms: 5}, duration_s: 600}
    pipeline: {builtin: synthetic, params: {latency_ms: 2, batch_size: 8, epochs: null}}
"""


def namespaces_unavailable(prefix: list[str] = ()) -> str | None:
    """Why this machine (as `prefix` runs things) gives a process no network namespace of its own, or None.
    Asked of the launcher's own code in a throwaway process, so a run that is not isolated where it could
    be fails these tests instead of skipping them."""
    code = "import json; from dsctl.runtime.launcher import isolate_network; print(json.dumps(isolate_network()))"
    proc = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        return proc.stderr.strip() or f"exit {proc.returncode}"
    answer = json.loads(proc.stdout)
    return None if answer["isolated"] else answer["reason"]


@pytest.fixture
def outside():
    """A client outside the run: its own network namespace, reaching the host over a veth pair."""
    reason = ClientNetns.unavailable()
    if reason:
        pytest.skip(reason)
    with ClientNetns() as ns:
        yield ns


def _up(tmp_path: Path, prefix: list[str] = (), env: dict | None = None, extra: str = "") -> subprocess.Popen:
    spec = write_spec(tmp_path, LONG_JOB % extra)
    return subprocess.Popen([*prefix, sys.executable, "-m", "dsctl.cli.main", "up", str(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def _deployment_with(home: Path, role: str, skip: set[str] = frozenset()) -> Deployment:
    """The first run under `home` (not named in `skip`) whose `role` processes have all started."""
    def found():
        for run_dir in (home / "runs").glob("*"):
            if run_dir.name in skip:
                continue
            try:
                dep = load_deployment(run_dir)
            except (OSError, ValueError):
                continue
            if dep.by_role(role) and all(n.pid for n in dep.by_role(role)):
                return dep
        return None
    return wait_for(found, timeout=120, what=f"the {role} to start")


def _training(run_dir: Path) -> Deployment:
    metrics = run_dir / "metrics" / "trainer-0.jsonl"
    wait_for(lambda: metrics.exists() and '"window"' in metrics.read_text(), timeout=150, what="training to start")
    return load_deployment(run_dir)


def _isolation(dep: Deployment) -> dict:
    isolation = dep.state.launcher and dep.state.isolation
    return {k: v for k, v in dataclasses.asdict(isolation).items() if v is not None} if isolation else {}


def _stop(up: subprocess.Popen) -> tuple[str, str]:
    if up.poll() is None:
        up.send_signal(signal.SIGINT)
    return up.communicate(timeout=90)


def _private(home: Path) -> list[str]:
    """Everything under DSCTL_HOME that someone other than the user could read, write or enter."""
    loose = []
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            path = Path(root) / name
            mode = path.lstat().st_mode
            if not stat.S_ISLNK(mode) and stat.S_IMODE(mode) & 0o077:
                loose.append(f"{path.relative_to(home)} {oct(stat.S_IMODE(mode))}")
    mode = stat.S_IMODE(home.stat().st_mode)
    return loose + ([f"DSCTL_HOME {oct(mode)}"] if mode != 0o700 else [])


def test_no_one_outside_the_run_can_reach_the_service_or_register_a_worker(home, tmp_path, outside):
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(f"this machine does not allow network namespaces: {reason}")
    up = _up(tmp_path)
    rogue = None
    try:
        dep = _deployment_with(home, "dispatcher")
        run_dir = Path(dep.run_dir)
        dispatcher = dep.by_role("dispatcher")[0]
        # A worker of someone else's, on a machine of the host's network, pointed at the dispatcher's port.
        # Started now, so its TensorFlow import overlaps the run's.
        rogue_log = tmp_path / "rogue.log"
        with open(rogue_log, "w") as log:
            rogue = subprocess.Popen(
                outside.argv(sys.executable, "-m", "dsctl.runtime.worker", "--dispatcher",
                             f"{outside.host_ip}:{dispatcher.state.port}", "--host", outside.client_ip,
                             "--ready-file", str(tmp_path / "rogue.json")),
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})
        dep = _training(run_dir)
        assert _isolation(dep)["isolated"] is True
        dispatcher, workers = dep.by_role("dispatcher")[0], dep.by_role("worker")
        ports = {dispatcher.state.port, *(w.state.port for w in workers)}
        assert len(ports) == 3

        # The servers listen, in the run's own network namespace, and nowhere in the host's.
        assert ports <= listening_ports(dispatcher.pid)
        assert os.readlink(f"/proc/{dispatcher.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        assert wildcard_listeners(ports) == []
        assert not ports & listening_ports("self")

        # From outside: the path works (a listener the test puts on the host's veth address answers),
        # the service's ports do not.
        with socket.create_server((outside.host_ip, 0)) as control:
            control_port = control.getsockname()[1]
            reach = outside.connect([control_port, *sorted(ports)])
        assert reach.pop(control_port) == "connected"
        assert reach == {p: "ConnectionRefusedError" for p in ports}

        # The rogue worker tried to register and could not; the dispatcher still counts the run's two.
        wait_for(lambda: "Failed to Worker heartbeat" in rogue_log.read_text() or (tmp_path / "rogue.json").exists(),
                 timeout=150, what="the rogue worker to try to register")
        assert not (tmp_path / "rogue.json").exists(), "a worker from outside the run registered"
        status = wait_for(lambda: read_json(run_dir / "dispatcher-status.json"), what="the dispatcher's status")
        time.sleep(1.5)  # a registration would show within one status period (1 s)
        assert read_json(run_dir / "dispatcher-status.json")["workers"] == 2, status

        events = {e["kind"]: e["message"] for e in RunStore().events(run_dir.name)}
        assert "isolated" in events and "not-isolated" not in events
    finally:
        if rogue is not None:
            rogue.kill()
            rogue.wait(timeout=30)
        out, err = _stop(up)
    assert up.returncode == 130, err
    assert processes_under(home) == []
    assert _private(home) == []


def test_where_namespaces_are_not_allowed_the_run_goes_on_and_says_its_ports_are_open(home, tmp_path, outside):
    """A user namespace whose namespace limits are 0 stands in for a container that forbids them."""
    if not shutil.which("unshare"):
        pytest.skip("util-linux unshare is not installed")
    limited = ["unshare", "--user", "--map-root-user", "sh", "-c",
               "echo 0 > /proc/sys/user/max_net_namespaces && echo 0 > /proc/sys/user/max_user_namespaces && "
               'exec "$@"', "sh"]
    if subprocess.run([*limited, "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a user namespace here to stand in for a machine without namespaces")

    # DSCTL_LOCAL_ISOLATION=require refuses such a machine, in one paragraph, before any trainer starts.
    refused = _up(tmp_path, limited, env={"DSCTL_LOCAL_ISOLATION": "require"})
    out, err = refused.communicate(timeout=120)
    assert refused.returncode == 1
    assert "DSCTL_LOCAL_ISOLATION=require" in err and "max_net_namespaces" in err and "Traceback" not in err
    assert processes_under(home) == []

    refused_runs = {p.name for p in (home / "runs").glob("*")}
    up = _up(tmp_path, limited)
    try:
        dep = _training(Path(_deployment_with(home, "worker", skip=refused_runs).run_dir))
        isolation = _isolation(dep)
        assert isolation == {"isolated": False, "reason": isolation["reason"]}
        assert "No space left on device" in isolation["reason"]
        port = dep.by_role("dispatcher")[0].state.port
        assert wildcard_listeners({port}), "without a namespace, TensorFlow listens on every interface"
        assert outside.connect([port])[port] == "connected"
        [warning] = [e["message"] for e in RunStore().events(Path(dep.run_dir).name) if e["kind"] == "not-isolated"]
        flat = " ".join(warning.split())
        assert "reachable from this machine's network" in flat and "max_net_namespaces" in flat
    finally:
        out, err = _stop(up)
    assert up.returncode == 130, err
    assert processes_under(home) == []


def test_a_process_started_after_the_launcher_died_joins_the_runs_network(home, monkeypatch):
    """Without its launcher, the provider starts processes itself: inside the run's network, through nsenter."""
    from dsctl.provisioners.local import provider as local

    monkeypatch.setattr(local, "READY_TIMEOUT_S", 45.0)  # outside the network, the worker would never be ready
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(f"this machine does not allow network namespaces: {reason}")
    spec = load_spec_text("""
name: orphan
service: {workers: 1}
trainer: {steps: 10}
pipeline: {builtin: synthetic}
""").spec
    run_dir = home / "runs" / "orphan"
    run_dir.mkdir(parents=True)
    dep = Deployment(run_id="orphan", provider="local", run_dir=str(run_dir))
    prov = LocalProvider()
    events = []
    try:
        prov.up(spec, dep, 1, lambda kind, message: events.append(kind))
        prov.wait_ready(dep, lambda kind, message: events.append(kind))
        assert _isolation(dep)["isolated"] is True
        launcher, dispatcher = dep.state.launcher, dep.by_role("dispatcher")[0]
        os.kill(launcher.pid, signal.SIGKILL)
        wait_for(lambda: not is_ours(launcher), what="the launcher to die")
        prov.scale_workers(dep, 2, lambda kind, message: events.append(kind))
        spawned = dep.by_role("worker")[1]
        assert spawned.pid in {p.pid for p in psutil.Process().children()}, "started by the provider, not forked"
        assert os.readlink(f"/proc/{spawned.pid}/ns/net") == os.readlink(f"/proc/{dispatcher.pid}/ns/net")
        wait_for(lambda: (read_json(run_dir / "dispatcher-status.json") or {}).get("workers") == 2, timeout=60,
                 what="the dispatcher to count the new worker")
    finally:
        prov.down(dep, lambda kind, message: None)
    assert processes_under(home) == []


# -- an unprivileged user -----------------------------------------------------------------------------------

NOBODY = 65534


def _as_nobody(argv: list[str], stash: Path) -> list[str]:
    """Run argv as uid/gid 65534. If this Python sits under a directory only root may enter (pyenv in
    /root), a private mount namespace lays a 0755 tmpfs over that directory with the Python tree
    bound back in it (through the empty directory `stash`), for that process tree only."""
    setpriv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    real = Path(os.path.realpath(sys.executable))
    closed = [p for p in reversed(real.parents) if p != Path("/") and not p.stat().st_mode & 0o001]
    if not closed:
        return [*setpriv, *argv]
    top = closed[0]
    keep = top / real.relative_to(top).parts[0]
    if len(closed) > 1 or not keep.stat().st_mode & 0o001:
        pytest.skip(f"{real} is not reachable by an unprivileged user")
    stash.mkdir(exist_ok=True)
    script = ('set -e; mount --bind "$1" "$3"; mount -t tmpfs -o mode=0755 tmpfs "$2"; mkdir -p "$1"; '
              'mount --bind "$3" "$1"; shift 3; exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(keep), str(top),
            str(stash), *setpriv, *argv]


def _read_as_nobody(code: str, env: dict, stash: Path):
    """Evaluate a Python expression as that user (root opening the user's runs.db could leave root-owned
    -wal/-shm files the user cannot open); its value, through JSON."""
    proc = subprocess.run(_as_nobody([sys.executable, "-c", f"import json, sys; from dsctl.orchestrator.store import "
                                      f"RunStore; print(json.dumps({code}))"], stash),
                          env=env, cwd=env["HOME"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_an_unprivileged_users_run_is_isolated_sampled_pinned_and_taken_down():
    """Not root: the launcher makes a user namespace (the user mapped to itself) to get its network
    namespace. Everything that looks at the run from outside must still work."""
    if os.geteuid() != 0 or not all(map(shutil.which, ("setpriv", "unshare"))):
        pytest.skip("becoming an unprivileged user for this test needs root and util-linux (setpriv, unshare)")
    base = Path(tempfile.mkdtemp(prefix="dsctl-nobody-"))  # not tmp_path: pytest's directory is root's alone
    up = None
    home = base / "user" / "home"
    try:
        os.chmod(base, 0o755)
        stash, user_dir = base / "stash", base / "user"
        user_dir.mkdir()
        os.chown(user_dir, NOBODY, NOBODY)
        env = {**os.environ, "HOME": str(user_dir), "DSCTL_HOME": str(home), "COLUMNS": "200"}
        spec = user_dir / "job.yaml"
        spec.write_text(textwrap.dedent(LONG_JOB % ", worker_cpus: [0]"))
        os.chown(spec, NOBODY, NOBODY)
        reason = namespaces_unavailable(_as_nobody([], stash))
        if reason:
            pytest.skip(f"unprivileged users cannot make network namespaces here: {reason}")
        up = subprocess.Popen(_as_nobody([sys.executable, "-m", "dsctl.cli.main", "up", str(spec)], stash),
                              cwd=user_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        dep = _training(Path(_deployment_with(home, "worker").run_dir))
        assert _isolation(dep) == {**_isolation(dep), "isolated": True, "userns": True}
        run_dir = Path(dep.run_dir)
        worker = dep.by_role("worker")[0]
        proc = psutil.Process(worker.pid)
        assert proc.uids().real == NOBODY, "the same user, seen from outside"
        assert Path(f"/proc/{worker.pid}/uid_map").read_text().split() == [str(NOBODY), str(NOBODY), "1"], \
            "and inside: the user namespace maps the user to itself"
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{worker.pid}/status").read_text().splitlines())
        assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == 0, "the namespace's capabilities are dropped"
        assert proc.cpu_affinity() == [0], "service.worker_cpus pins the worker"
        assert os.readlink(f"/proc/{worker.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        # The launcher's pid files name the live processes it forked.
        forked = {json.loads(p.read_text())["pid"] for p in (run_dir / "launcher").glob("*.pid")}
        assert {n.pid for n in dep.nodes if n.role in ("dispatcher", "worker", "trainer")} <= forked
        # dsctl (as that user) samples CPU and memory of the processes in the namespace.
        def sampled():
            rows = _read_as_nobody(f"RunStore().utilization({run_dir.name!r})", env, stash)
            return [r for r in rows if r["role"] == "worker" and r["rss_bytes"] > 0 and r["cpu_seconds"] > 0]
        wait_for(sampled, timeout=30, interval=1, what="utilization samples of the workers")
        for log in (run_dir / "logs").glob("*.log"):
            st = log.stat()
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o600), log
        # kill -9 of dsctl up, then `dsctl down` as the same user: by process group and start time.
        up.kill()
        up.communicate(timeout=30)
        assert processes_under(home), "the deployment outlives a killed dsctl up"
        down = subprocess.run(_as_nobody([sys.executable, "-m", "dsctl.cli.main", "down", run_dir.name], stash),
                              cwd=user_dir, env=env, capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        assert processes_under(home) == []
        assert _read_as_nobody(f"RunStore().get({run_dir.name!r}).status", env, stash) == "interrupted"
        assert _private(home) == []
    finally:
        if up is not None and up.poll() is None:
            up.kill()
            up.communicate(timeout=30)
        for p in processes_under(home):
            p.kill()
        shutil.rmtree(base, ignore_errors=True)
