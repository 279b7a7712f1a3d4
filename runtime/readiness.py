"""Small files through which runtime processes tell the launcher they are ready.

A ready file is written atomically (temp file + rename), so a launcher polling
for it never reads half a file, locally or over SSH.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
from pathlib import Path

# Service ports come from below the kernel's ephemeral range, so no outgoing connection (a
# trainer's, a worker's, another program's) is ever given one as its local port while the server
# that owns it is being restarted. A new network namespace starts with the kernel's default range.
SERVICE_PORT_FLOOR = 10000
DEFAULT_EPHEMERAL_LOW = 32768


def write_json_atomic(path: str | Path, payload: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def read_json(path: str | Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def port_is_free(port: int, host: str = "0.0.0.0") -> bool:
    """True if nothing listens on `port`.

    tf.data service servers bind with SO_REUSEPORT, so a second dispatcher on a
    taken port starts without error and clients then fail with "dataset not
    found". A plain bind (SO_REUSEADDR only, so TIME_WAIT leftovers of a
    restarted worker do not count) tells a live listener apart.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def ephemeral_port_low() -> int:
    """The lowest port the kernel hands out to outgoing connections here (and in a new namespace)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = DEFAULT_EPHEMERAL_LOW
    return min(low, DEFAULT_EPHEMERAL_LOW)


def pick_service_port(exclude: set[int] | frozenset[int] = frozenset(), host: str = "127.0.0.1") -> int:
    """A free port for a dispatcher or worker, below the ephemeral range and not in `exclude`.

    `exclude` holds the ports the deployment has already handed out: in a network namespace of
    the run's own, those are the only ports anything could hold, and a check from outside it
    cannot see them.
    """
    low = ephemeral_port_low()
    if low - SERVICE_PORT_FLOOR >= 1000:
        for _ in range(100):
            port = random.randrange(SERVICE_PORT_FLOOR, low)
            if port not in exclude and port_is_free(port):
                return port
    while True:
        port = pick_free_port(host)
        if port not in exclude:
            return port


def pick_free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ready_payload(role: str, port: int, **extra) -> dict:
    return {"role": role, "pid": os.getpid(), "port": port, "ready_at": time.time(), **extra}
