"""What the dispatcher and worker entry points share: port check, signals, readiness, a heartbeat, clean stop.

The ready file is also the server's heartbeat: every half second the server is asked something that takes its own
lock (the heartbeat probe: the dispatcher's worker count, the worker's task count), and once it has answered, the
ready file's modification time is set to now. A server that stops answering (stopped by SIGSTOP, deadlocked) stops
touching it, and the local provider ends and restarts it (provisioners/local/hangs.py)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

from .readiness import port_is_free, write_json_atomic

EXIT_PORT_IN_USE = 3
BEAT_S = 0.5  # how often a serving server answers its heartbeat probe and touches its ready file


def beat(ready_file: str | None) -> None:
    """The server answered its heartbeat probe: its ready file's modification time says when."""
    if ready_file:
        try:
            os.utime(ready_file)
        except OSError:
            pass  # removed for a restart, or a full disk: the provider judges by what it sees


def port_holder(port: int) -> str | None:
    """'pid N (name)' of a process with a socket on `port`, if this process may see it."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.pid:
                try:
                    return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                except psutil.Error:
                    return f"pid {conn.pid}"
    except Exception:  # noqa: BLE001 - naming the holder is a courtesy; refusing the port is the point
        return None
    return None


def refuse_taken_port(role: str, port: int) -> None:
    """Exit with EXIT_PORT_IN_USE if something holds `port`; the message names the holder when it can."""
    if port and not port_is_free(port):
        holder = port_holder(port)
        print(
            f"dsctl {role}: port {port} is already in use by {holder or 'another process'}; "
            "stop it or pick another port (0 lets the system choose).",
            file=sys.stderr,
        )
        sys.exit(EXIT_PORT_IN_USE)


def quiet_tensorflow() -> None:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def serve_until_signalled(server, ready_file: str | None, payload: dict, heartbeat: Callable[[], None] | None = None) -> None:
    """Write the ready file, then block until SIGTERM/SIGINT and stop the server.

    TensorFlow's stop() can hang on jobs with repeated datasets (tensorflow#56490),
    so it gets a few seconds and then the process exits anyway.
    """
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if ready_file:
        write_json_atomic(ready_file, payload)
    print(f"dsctl {payload['role']}: ready on port {payload['port']}", flush=True)
    while not stop.wait(BEAT_S):
        if heartbeat:
            heartbeat()
        beat(ready_file)
    stopper = threading.Thread(target=server._stop, daemon=True)
    stopper.start()
    stopper.join(timeout=5)
    print(f"dsctl {payload['role']}: stopped", flush=True)
    sys.stdout.flush()
    os._exit(0)
