"""Helpers for tests that drive dsctl end to end: the CLI as a subprocess, specs on disk, leftovers."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "specs" / "examples"


def processes_under(home: Path) -> list[psutil.Process]:
    """Processes whose command line names a path inside `home` (every dsctl child does: its run dir)."""
    out = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            env_home = (p.info["environ"] or {}).get("DSCTL_HOME")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if p.pid == os.getpid():
            continue
        if str(home) in cmd or env_home == str(home):
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def dsctl(*args: str, timeout: float = 300, check: bool = False, env: dict | None = None,
          **kw) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (with the test's DSCTL_HOME), capturing output; 200 columns wide unless
    `env` says otherwise."""
    proc = subprocess.run([sys.executable, "-m", "dsctl.cli.main", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200", **(env or {})}, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"dsctl {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def write_spec(dir: Path, text: str, name: str = "job.yaml") -> Path:
    path = dir / name
    path.write_text(textwrap.dedent(text))
    return path


def wait_for(predicate, timeout: float = 60, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# -- network namespaces the tests make themselves ----------------------------------------------------------------

NETNS_PREFIX = "dsctl-test-"  # /run/netns/dsctl-test-<pid of the test process that made it>-<tag>

def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class ClientNetns:
    """A network namespace of the test's own, joined to this one by a veth pair.

    Both ends get addresses the test picks in 10.199.0.0/16 (a /30 per pair), so test traffic
    goes to those two addresses only, never to another address of the machine. From inside,
    `host_ip` is this (the host's) network namespace: whatever listens on a wildcard address
    here is reachable there, as from any machine on a network the host is on.
    """

    def __init__(self) -> None:
        tag = os.urandom(3).hex()
        # Its maker's pid in the name: the test session's end removes one whose maker is gone (tests/conftest.py),
        # and leaves another session's alone.
        self.name = f"{NETNS_PREFIX}{os.getpid()}-{tag}"
        self.host_if, self.client_if = f"dsh{tag}", f"dsc{tag}"  # interface names: at most 15 characters
        used = _ip("-4", "-o", "addr", "show", check=False).stdout
        third = next(n for n in random.sample(range(2, 252), 250) if f"10.199.{n}." not in used)
        self.host_ip, self.client_ip = f"10.199.{third}.1", f"10.199.{third}.2"

    @staticmethod
    def unavailable() -> str | None:
        """Why a test cannot make one here, or None."""
        if os.geteuid() != 0:
            return "making a network namespace and a veth pair for the outside client needs root"
        if not shutil.which("ip"):
            return "iproute2 (ip) is not installed"
        return None

    def __enter__(self) -> ClientNetns:
        try:
            _ip("netns", "add", self.name)
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.client_if, "netns", self.name)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("-n", self.name, "addr", "add", f"{self.client_ip}/30", "dev", self.client_if)
            _ip("-n", self.name, "link", "set", self.client_if, "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        _ip("link", "del", self.host_if, check=False)  # removes both ends
        _ip("netns", "del", self.name, check=False)

    def argv(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def connect(self, ports: list[int], timeout: float = 3.0) -> dict[int, str]:
        """From inside: try a TCP connection to host_ip at each port; 'connected', or the error's name."""
        code = (
            "import json, socket, sys\n"
            "out = {}\n"
            "for port in map(int, sys.argv[2:]):\n"
            "    try:\n"
            f"        socket.create_connection((sys.argv[1], port), timeout={timeout}).close()\n"
            "        out[port] = 'connected'\n"
            "    except OSError as exc:\n"
            "        out[port] = type(exc).__name__\n"
            "print(json.dumps(out))\n"
        )
        proc = subprocess.run(self.argv(sys.executable, "-c", code, self.host_ip, *map(str, ports)),
                              capture_output=True, text=True, timeout=60, check=True)
        return {int(k): v for k, v in json.loads(proc.stdout).items()}


def listening_ports(pid: int | str = "self") -> set[int]:
    """TCP ports in LISTEN state in the network namespace of process `pid` (from its /proc/PID/net)."""
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def wildcard_listeners(ports: set[int]) -> list[str]:
    """Sockets of this (the host's) network namespace listening on one of `ports` at a wildcard address."""
    return [f"{c.laddr.ip}:{c.laddr.port} (pid {c.pid})" for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port in ports and c.laddr.ip in ("0.0.0.0", "::")]


HOLD_PORT = """
import socket, sys
# SO_REUSEPORT, like tf.data service's own gRPC servers: bound beside the live server, it keeps the
# port once that server dies, as any process holding it would.
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen()
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def hold_port(port: int, prefix: list[str]) -> subprocess.Popen:
    """A process (started with `prefix`, e.g. in a run's network namespace) listening on `port` until its stdin closes."""
    proc = subprocess.Popen([*prefix, sys.executable, "-c", HOLD_PORT, str(port)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held", "the port holder could not bind"
    return proc


# A keras model small enough to train in seconds (a builder function, as a spec's `trainer.model.builder` names).
TINY_KERAS_MODEL = '''
import keras

def build_model(features=8, classes=4):
    inputs = keras.Input((features,))
    model = keras.Model(inputs, keras.layers.Dense(classes)(inputs))
    model.compile(optimizer=keras.optimizers.Adam(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
'''


def stepped_job(dir: Path, name: str, steps: int, step_time_ms: int) -> Path:
    """A one-worker job over an endless synthetic dataset: `steps` batches of a `step_time_ms` model step."""
    return write_spec(dir, f"""
        name: {name}
        service: {{workers: 1}}
        trainer: {{model: {{step_time_ms: {step_time_ms}}}, steps: {steps}, warmup_batches: 2}}
        pipeline: {{builtin: synthetic, params: {{latency_ms: 0, batch_size: 8, epochs: null}}}}
    """)


@contextlib.contextmanager
def tmpfs(folder: Path, size: str):
    """`folder` (made here) as a tmpfs of `size` (e.g. "5m"), unmounted at the end; the test is skipped where this
    machine does not let it be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def remove_cgroup(folder: Path) -> list[int]:
    """Kill every process in a cgroup folder (v1 or v2) and remove it, trying for up to 5 s (a killed process leaves
    cgroup.procs a moment later); the pids it killed. The folder is left where it cannot be removed."""
    killed: list[int] = []
    for _ in range(50):
        try:
            pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
        except OSError:
            break
        killed += [p for p in pids if p not in killed]
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        try:
            folder.rmdir()
            break
        except OSError:
            time.sleep(0.1)
    return killed
