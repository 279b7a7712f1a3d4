"""SSH to the run's VMs with fabric: one connection per VM, reused, safe to use from several threads.

Host keys are trusted on first use and pinned per VM in the run dir, so a later
`dsctl down` refuses a VM whose host key changed. Errors name the VM and never
carry key material. Commands are built (and quoted) by remote.py, not here.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import CloudTimeout, SshUnreachable
from .retry import Cancelled

if TYPE_CHECKING:
    from fabric import Connection

CONNECT_TIMEOUT_S = 10
# An open connection's reader thread (paramiko's Transport) wakes every this many seconds when nothing arrives, to
# see whether it was closed. paramiko's own 0.1 s cost 0.03% of a core per idle connection (measured: 120 of them,
# 3.5%), and the supervisor holds one per VM (about 18% of a core at 640 workers); at 30 s, 0.0003% each. Data still
# wakes it at once; a connection closed here ends, its thread and the VM's sshd session with it, within this time
# (nothing waits for it).
IDLE_WAKE_S = 30.0


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


class Ssh:
    def __init__(self, user: str, port: int, key: Path, known_hosts_dir: Path):
        self.user = user
        self.port = port
        self.key = Path(key)
        self.known_hosts_dir = Path(known_hosts_dir)
        self._conns: dict[str, Connection] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._sftp_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    # -- connections ---------------------------------------------------------------
    def _host_lock(self, host: str, table: dict) -> threading.Lock:
        with self._lock:
            return table.setdefault(host, threading.Lock())

    def _connection(self, host: str):
        from fabric import Config, Connection

        with self._host_lock(host, self._locks):
            conn = self._conns.get(host)
            if conn is not None and conn.is_connected:
                return conn
            if conn is not None:
                conn.close()
            config = Config(overrides={"load_ssh_configs": False, "run": {"in_stream": False, "hide": True, "warn": True}})
            conn = Connection(host, user=self.user, port=self.port, config=config, connect_timeout=CONNECT_TIMEOUT_S,
                              connect_kwargs={"key_filename": str(self.key), "look_for_keys": False,
                                              "allow_agent": False, "banner_timeout": CONNECT_TIMEOUT_S,
                                              "auth_timeout": CONNECT_TIMEOUT_S})
            self.known_hosts_dir.mkdir(parents=True, exist_ok=True)
            known = self.known_hosts_dir / f"known_hosts-{host}"
            known.touch(exist_ok=True)
            conn.client.load_host_keys(str(known))  # AutoAddPolicy then saves the first key seen here
            conn.open()
            if conn.transport is not None and conn.transport.sock is not None:
                conn.transport.sock.settimeout(IDLE_WAKE_S)  # after the handshake, which keeps paramiko's own
            self._conns[host] = conn
            return conn

    def drop(self, host: str) -> None:
        with self._lock:
            conn = self._conns.pop(host, None)
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            try:
                conn.close()
            except Exception:
                pass

    def _fail(self, host: str, doing: str, exc: Exception) -> SshUnreachable:
        self.drop(host)
        return SshUnreachable(f"SSH to {self.user}@{host}:{self.port} failed while {doing}: {type(exc).__name__}: {exc}")

    # -- use ------------------------------------------------------------------------------
    def run(self, host: str, command: str, *, doing: str, timeout: float = 60.0) -> Result:
        """Run a shell command; its exit code is returned, not raised. Connection problems raise SshUnreachable."""
        try:
            conn = self._connection(host)
            r = conn.run(command, timeout=timeout)
            return Result(r.exited, r.stdout, r.stderr)
        except Exception as exc:
            raise self._fail(host, doing, exc) from None

    def read_from(self, host: str, path: str, offset: int, limit: int = 8 << 20) -> bytes | None:
        """Bytes of a remote file from `offset` (at most `limit`); None if it does not exist."""
        try:
            conn = self._connection(host)
            with self._host_lock(host, self._sftp_locks):
                sftp = conn.sftp()
                try:
                    size = sftp.stat(path).st_size
                except FileNotFoundError:
                    return None
                if size <= offset:
                    return b""
                with sftp.open(path, "rb") as f:
                    f.seek(offset)
                    return f.read(min(size - offset, limit))
        except Exception as exc:
            raise self._fail(host, f"reading {path}", exc) from None

    def get(self, host: str, remote: str, local: Path) -> bool:
        """Copy a remote file here; False if it does not exist."""
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = self._connection(host)
            with self._host_lock(host, self._sftp_locks):
                sftp = conn.sftp()
                try:
                    sftp.get(remote, str(local))
                except FileNotFoundError:
                    return False
            return True
        except Exception as exc:
            raise self._fail(host, f"copying {remote}", exc) from None

    def put(self, host: str, files: dict[str, tuple[bytes, int]]) -> None:
        """Write remote path -> (contents, mode) over SFTP, making parent directories (mode 0700) as needed."""
        from posixpath import dirname

        try:
            conn = self._connection(host)
            with self._host_lock(host, self._sftp_locks):
                sftp = conn.sftp()
                for path, (data, mode) in files.items():
                    parts, d = [], dirname(path)
                    while d not in ("", "/"):
                        parts.append(d)
                        d = dirname(d)
                    for d in reversed(parts):
                        try:
                            sftp.stat(d)
                        except FileNotFoundError:
                            sftp.mkdir(d, 0o700)
                    with sftp.open(path, "wb") as f:
                        f.write(data)
                    sftp.chmod(path, mode)
        except Exception as exc:
            raise self._fail(host, f"copying files to {host}", exc) from None

    def wait_reachable(self, host: str, *, timeout_s: float, what: str, cancel: threading.Event | None = None) -> None:
        """Connect (and authenticate) to a VM that has just started; retry until timeout_s."""
        deadline = time.monotonic() + timeout_s
        delay = 0.2
        last: Exception | None = None
        while True:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            try:
                self._connection(host)
                return
            except Exception as exc:  # refused, timed out, banner, auth (guest agent not done yet)
                last = exc
                self.drop(host)
            if time.monotonic() + delay > deadline:
                raise CloudTimeout(
                    f"{what} at {host} did not answer SSH on port {self.port} as {self.user} within {timeout_s:.0f} s "
                    f"(last: {type(last).__name__}: {last}). dsctl connects to the VMs' external addresses (or, with "
                    "gcp.public_ips: false, their internal ones, from inside the VPC) as the user OS Login names for "
                    "your account: make sure the network admits SSH (tcp:22) from here and your account may log in "
                    "through OS Login (roles/compute.osLogin on the project)."
                ) from None
            time.sleep(delay)
            delay = min(delay * 1.5, 3.0)


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
