"""A real OpenSSH server for tests, listening on several loopback addresses: one per stand-in VM.

The fake Compute API gives each instance a distinct loopback address
(127.0.0.2, 127.0.0.3, ...); this sshd listens on a range of them, so dsctl
connects to "each VM" at its networkIP exactly as it would in a VPC. Commands
run as the current user, as real processes on this machine.

Authorized keys come from the stand-in's instances: `AuthorizedKeysWriter`
plays the guest agent, writing every live instance's `ssh-keys` metadata to the
file sshd reads, so a key dsctl forgot to put in metadata does not work here either.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import shutil
import socket
import subprocess
import threading
import time
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
    def __init__(self, workdir: Path, addresses: list[str], port: int | None = None):
        self.dir = Path(workdir)
        self.addresses = addresses
        self.port = port or free_port()
        self.user = getpass.getuser()
        self.authorized_keys = self.dir / "authorized_keys"
        self.proc: subprocess.Popen | None = None
        self.log = self.dir / "sshd.log"
        self.home = self.dir / "home"

    def _config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        host_key = self.dir / "host_ed25519"
        if not host_key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
        self.home.mkdir(exist_ok=True)
        self.authorized_keys.touch()
        os.chmod(self.authorized_keys, 0o600)
        lines = [f"ListenAddress {a}" for a in self.addresses] + [
            f"Port {self.port}",
            f"HostKey {host_key}",
            f"PidFile {self.dir / 'sshd.pid'}",
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
            # A fresh VM's user has an empty home; this machine's ~/.bashrc (which bash
            # sources for every ssh command) would otherwise add ~150 ms to each one.
            f"SetEnv HOME={self.home}",
        ]
        cfg = self.dir / "sshd_config"
        cfg.write_text("\n".join(lines) + "\n")
        return cfg

    def start(self) -> "Sshd":
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        cfg = self._config()
        check = subprocess.run([SSHD, "-t", "-f", str(cfg)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"sshd config rejected: {check.stderr}")
        out = open(self.log, "ab")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        out.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.addresses[0], self.port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"sshd did not start; see {self.log}: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class AuthorizedKeysWriter:
    """The guest agent's job, for the stand-in: live instances' ssh-keys metadata -> authorized_keys.

    Metadata entries look like `user:ssh-ed25519 AAAA... comment`; only keys for
    the sshd's user are installed (as the guest agent installs each user's own).
    """

    def __init__(self, sshd: Sshd):
        self.sshd = sshd
        self.keys: dict[str, list[str]] = {}  # instance selfLink/name -> key lines
        self.lock = threading.Lock()

    @staticmethod
    def _metadata_keys(resource: dict) -> list[str]:
        md = resource.get("metadata") or {}
        if "items" in md:  # Compute Engine: {"items": [{"key": ..., "value": ...}]}
            values = [i.get("value", "") for i in md["items"] if i.get("key") == "ssh-keys"]
        else:  # Cloud TPU: a plain map
            values = [md.get("ssh-keys", "")]
        return [line for v in values for line in v.splitlines() if line.strip()]

    def _rewrite(self) -> None:
        lines = []
        for entries in self.keys.values():
            for entry in entries:
                user, _, key = entry.partition(":")
                if user == self.sshd.user and key:
                    lines.append(key)
        tmp = self.sshd.authorized_keys.with_suffix(".tmp")
        tmp.write_text("".join(l + "\n" for l in dict.fromkeys(lines)))
        os.chmod(tmp, 0o600)
        tmp.replace(self.sshd.authorized_keys)

    def created(self, resource: dict) -> None:
        with self.lock:
            self.keys[resource.get("selfLink") or resource["name"]] = self._metadata_keys(resource)
            self._rewrite()

    def deleted(self, resource: dict) -> None:
        with self.lock:
            self.keys.pop(resource.get("selfLink") or resource["name"], None)
            self._rewrite()
