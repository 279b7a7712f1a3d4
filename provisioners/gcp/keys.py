"""One SSH key pair per run (ed25519), private key mode 0600 in the run dir.

The private key is written once, with O_EXCL and mode 0600 from the start (never
world-readable, even briefly), and is never printed, logged or put in state:
state holds its path only. The public key is registered with OS Login for the identity that runs
dsctl (oslogin.py), never put in a VM's metadata; the key never leaves the machine that made it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

KEY_FILE = "id_ed25519"


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public: str  # "ssh-ed25519 AAAA... dsctl-<run>"


def key_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "ssh"


def ensure_key_pair(run_dir: str | Path, comment: str) -> KeyPair:
    """The run's key pair, generated on first use."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    d = key_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    priv_path = d / KEY_FILE
    pub_path = d / f"{KEY_FILE}.pub"
    if priv_path.exists() and pub_path.exists():
        return KeyPair(priv_path, pub_path.read_text().strip())
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption())
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH).decode()
    public = f"{public} {comment}"
    fd = os.open(priv_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, private)
    finally:
        os.close(fd)
    pub_path.write_text(public + "\n")
    return KeyPair(priv_path, public)


def load_key_pair(run_dir: str | Path) -> KeyPair | None:
    d = key_dir(run_dir)
    priv, pub = d / KEY_FILE, d / f"{KEY_FILE}.pub"
    if priv.exists() and pub.exists():
        return KeyPair(priv, pub.read_text().strip())
    return None
