"""Small files through which runtime processes tell the launcher they are ready.

A ready file is written atomically (temp file + rename), so a launcher polling
for it never reads half a file, locally or over SSH.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path


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


def pick_free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ready_payload(role: str, port: int, **extra) -> dict:
    return {"role": role, "pid": os.getpid(), "port": port, "ready_at": time.time(), **extra}
