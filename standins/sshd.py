"""A real OpenSSH server for tests, listening on several loopback addresses: one per stand-in VM.

The fake Compute API gives each instance a distinct internal loopback address
(127.0.0.2, 127.0.0.3, ...) and, when it asks for one, an external address with
the same last octet (127.0.1.2, 127.0.1.3, ...). One sshd process listens on the
internal range and a second, on the same port, on the external range, so dsctl
connects to "each VM" at its networkIP or its natIP exactly as it would on the
cloud. Commands run as the
current user, as real processes on this machine.

Authorized keys come from the stand-in's instances: `AuthorizedKeysWriter`
plays the guest agent, writing the keys each live instance accepts to a file of its
own addresses (sshd picks the file by the address a client connected to), so a key
dsctl did not install the way Google's guest environment reads it does not work here
either, and a VM that is stopped or deleted answers no SSH although others with the
same key still run. As on Google Cloud, a VM with OS Login on (`enable-oslogin` TRUE in
its metadata, or in the project's) takes the keys registered with OS Login for the
POSIX user logging in and ignores `ssh-keys` metadata; one with OS Login off takes its
`ssh-keys` metadata.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def sshd_available() -> bool:
    return Path(SSHD).exists() and shutil.which("ssh-keygen") is not None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def loopback_range(first: str, count: int) -> list[str]:
    start = int(ipaddress.ip_address(first))
    return [str(ipaddress.ip_address(start + i)) for i in range(count)]


class Sshd:
    """One "VM network" of sshd listeners: a real OpenSSH server per address group, all on one port, sharing one
    host key and one authorized_keys file.

    `addresses` are the VMs' internal addresses (127.0.0.2 ...); `external_addresses`, if given, their external
    ones (127.0.1.2 ...), served by a second sshd process on the same port (OpenSSH allows at most 16 listen
    sockets per process). `env` holds extra environment variables every session gets (sshd's SetEnv); `set_env`
    adds others for a while (`set_env({})` is back to `env`).
    """

    def __init__(self, workdir: Path, addresses: list[str], port: int | None = None, *,
                 external_addresses: list[str] | None = None, env: dict[str, str] | None = None):
        self.dir = Path(workdir)
        self.addresses = list(addresses)
        self.external_addresses = list(external_addresses or [])
        self.port = port or free_port()
        self.user = getpass.getuser()
        self.authorized_keys = self.dir / "authorized_keys"  # keys every address accepts (tests write it)
        self.keys_dir = self.dir / "keys"  # keys_dir/<address>: the keys of the VM at that address
        self.base_env: dict[str, str] = dict(env or {})
        self.env: dict[str, str] = dict(self.base_env)
        self.procs: dict[str, subprocess.Popen] = {}  # group ("internal" | "external") -> its sshd
        self.log = self.dir / "sshd.log"
        self.home = self.dir / "home"

    @property
    def groups(self) -> dict[str, list[str]]:
        out = {"internal": self.addresses}
        if self.external_addresses:
            out["external"] = self.external_addresses
        return out

    @property
    def proc(self) -> subprocess.Popen | None:  # the internal listener (kept for older callers)
        return self.procs.get("internal")

    def _setenv_line(self) -> str:
        # A fresh VM's user has an empty home; this machine's ~/.bashrc (which bash sources for every ssh
        # command) would otherwise add ~150 ms to each one.
        env = {"HOME": str(self.home), **self.env}
        for k, v in env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) or '"' in v or "\n" in v:
                raise ValueError(f"cannot pass {k}={v!r} through sshd's SetEnv")
        return "SetEnv " + " ".join(f'"{k}={v}"' for k, v in env.items())

    def _config(self, group: str, addresses: list[str]) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        host_key = self.dir / "host_ed25519"
        if not host_key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
        self.home.mkdir(exist_ok=True)
        if not self.authorized_keys.exists():
            self.authorized_keys.touch()
        os.chmod(self.authorized_keys, 0o600)
        self.keys_dir.mkdir(exist_ok=True)
        lines = [f"ListenAddress {a}" for a in addresses] + [
            f"Port {self.port}",
            f"HostKey {host_key}",
            f"PidFile {self.dir / f'sshd-{group}.pid'}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "AuthenticationMethods publickey",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "Subsystem sftp internal-sftp",
            "MaxStartups 200:30:400",
            "MaxSessions 100",
            "LogLevel ERROR",
            self._setenv_line(),
        ]
        for a in addresses:  # Match blocks last: each address reads the keys of the VM it belongs to
            lines += [f"Match LocalAddress {a}", f"    AuthorizedKeysFile {self.authorized_keys} {self.keys_dir / a}"]
        cfg = self.dir / f"sshd_config.{group}"
        cfg.write_text("\n".join(lines) + "\n")
        check = subprocess.run([SSHD, "-t", "-f", str(cfg)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"sshd config rejected: {check.stderr}")
        return cfg

    def _wait_banner(self, address: str, proc: subprocess.Popen, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((address, self.port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return True
            except OSError:
                if proc.poll() is not None:
                    return False
                time.sleep(0.05)
        return False

    def start(self) -> Sshd:
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        for group, addresses in self.groups.items():
            cfg = self._config(group, addresses)
            out = open(self.log, "ab")
            proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
            out.close()
            self.procs[group] = proc
            if not self._wait_banner(addresses[0], proc):
                self.stop()
                raise RuntimeError(f"sshd ({group}) did not start; see {self.log}: {self.log.read_text()[-2000:]}")
        return self

    def set_env(self, env: dict[str, str]) -> None:
        """The constructor's environment plus `env` for new sessions: rewrite the configs and SIGHUP each sshd (it
        re-executes itself with the new configuration, keeping its PID)."""
        self.env = {**self.base_env, **env}
        for group, addresses in self.groups.items():
            self._config(group, addresses)
            proc = self.procs.get(group)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGHUP)
        time.sleep(0.2)  # the old listener closes before the re-executed one binds
        for group, addresses in self.groups.items():
            proc = self.procs.get(group)
            if proc is not None and not self._wait_banner(addresses[0], proc):
                raise RuntimeError(f"sshd ({group}) did not come back after SIGHUP; see {self.log}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class AuthorizedKeysWriter:
    """The guest agent's job, for the stand-in: what each live instance accepts -> the keys its addresses take.

    OS Login on: `oslogin_keys(user)` (the stand-in's OS Login API: unexpired keys of the identities whose POSIX
    username is `user`); call `refresh()` when those change. OS Login off: metadata entries
    `user:ssh-ed25519 AAAA... comment`, only those for the sshd's user (as the guest agent installs each user's own).
    """

    def __init__(self, sshd: Sshd, oslogin_keys: Callable[[str], list[str]] | None = None,
                 project_oslogin: Callable[[], bool] | None = None):
        self.sshd = sshd
        self.oslogin_keys = oslogin_keys or (lambda user: [])
        self.project_oslogin = project_oslogin or (lambda: False)
        self.resources: dict[str, dict] = {}  # instance selfLink/name -> the instance as created
        self.lock = threading.Lock()

    @staticmethod
    def _addresses(resource: dict) -> list[str]:
        out = []
        for nic in resource.get("networkInterfaces") or []:  # Compute Engine
            out += [nic.get("networkIP")] + [ac.get("natIP") for ac in nic.get("accessConfigs") or []]
        for ep in resource.get("networkEndpoints") or []:  # Cloud TPU
            out += [ep.get("ipAddress"), (ep.get("accessConfig") or {}).get("externalIp")]
        return [a for a in out if a]

    @staticmethod
    def _metadata(resource: dict) -> dict[str, str]:
        md = resource.get("metadata") or {}
        if "items" in md:  # Compute Engine: {"items": [{"key": ..., "value": ...}]}
            return {i.get("key", ""): i.get("value", "") for i in md["items"]}
        return {k: str(v) for k, v in md.items()}  # Cloud TPU: a plain map

    def _accepted(self, resource: dict) -> list[str]:
        md = self._metadata(resource)
        setting = md.get("enable-oslogin")
        oslogin = setting.upper() == "TRUE" if setting is not None else self.project_oslogin()
        if oslogin:
            return list(self.oslogin_keys(self.sshd.user))
        entries = [line for line in md.get("ssh-keys", "").splitlines() if line.strip()]
        return [key for user, _, key in (e.partition(":") for e in entries) if user == self.sshd.user and key]

    def _write(self, address: str, lines: list[str]) -> None:
        path = self.sshd.keys_dir / address
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in dict.fromkeys(lines)))
        os.chmod(tmp, 0o600)
        tmp.replace(path)

    def created(self, resource: dict) -> None:
        key = resource.get("selfLink") or resource["name"]
        with self.lock:
            self.resources[key] = resource
            lines = self._accepted(resource)
            for address in self._addresses(resource):
                self._write(address, lines)

    def deleted(self, resource: dict) -> None:
        key = resource.get("selfLink") or resource["name"]
        with self.lock:
            gone = self.resources.pop(key, resource)
            for address in self._addresses(gone):
                self._write(address, [])

    def refresh(self) -> None:
        """OS Login's keys changed: every live instance takes the keys it accepts now."""
        with self.lock:
            for resource in self.resources.values():
                lines = self._accepted(resource)
                for address in self._addresses(resource):
                    self._write(address, lines)
