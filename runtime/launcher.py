"""A pre-loaded process that forks dsctl's runtime entry points on request.

Importing TensorFlow takes seconds of CPU; a machine starting a dispatcher,
several workers and a trainer would pay it once per process, all competing
for the same cores. The launcher imports TensorFlow once, before any
TensorFlow runtime exists (no ops run, no servers, no threads of its own),
then forks a child per request: the child starts its own session and log, and
runs the entry point's main() as if started with `python -m`. Each child is a
separate OS process running TensorFlow's own server or the trainer harness.

Requests are JSON files dropped into --requests DIR (written atomically):
    {"id": "worker-3", "module": "dsctl.runtime.worker", "argv": [...], "log": "/path/worker-3.log",
     "cpus": [1]}            (optional: pin the child to these cores)
The launcher answers with DIR/<id>.pid ({"pid": N}) and, when the child
exits, DIR/exit-<pid>.json ({"code": C, "ended": "was killed by ...", "oom": bool}):
how it ended in words (dsctl.specs.exits), an out-of-memory kill named with its evidence.

With --isolate-network the launcher first moves itself into a network namespace
of its own with only loopback up, so everything it forks does too: tf.data
service has no authentication and binds every interface, and there its ports
are reachable by the deployment's own processes only. It answers with
DIR/isolation.json: {"isolated": true, "userns": bool, "netns": "net:[...]"}
or {"isolated": false, "reason": "..."} when this machine does not allow it
(the deployment then runs in the machine's network, as without the flag).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import importlib
import json
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .readiness import write_json_atomic

if TYPE_CHECKING:
    from dsctl.specs.exits import Watch

# -- a network of the deployment's own -----------------------------------------------------------
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_CAPABILITY_VERSION_3 = 0x20080522
PRIVATE_UMASK = 0o077  # logs, metrics and ready files are the user's alone

_WHY = {
    errno.EPERM: "creating namespaces is not permitted here (a container, seccomp or AppArmor policy, or "
                 "kernel.unprivileged_userns_clone = 0)",
    errno.EACCES: "creating namespaces is not permitted here (a security policy)",
    errno.ENOSPC: "the namespace limit is reached (user.max_net_namespaces or user.max_user_namespaces is 0 or used up)",
    errno.EUSERS: "the user-namespace nesting limit is reached",
    errno.EINVAL: "the kernel does not support network or user namespaces",
    errno.ENOSYS: "the kernel does not support namespaces",
}


class _Step(OSError):
    """Which step of the namespace setup failed, and the errno."""


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _call(step: str, result: int) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise _Step(code, f"{step}: {os.strerror(code)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _enter_private_network() -> bool:
    """unshare a network namespace (with a user namespace when not root) and bring loopback up in it.

    Root needs only the network namespace, and stays what it was. Anyone else gets a user
    namespace in which their own uid and gid map to themselves (so files, signals, /proc and
    psutil see the same user from outside), uses the capabilities it grants to bring loopback
    up, and then drops them, so nothing the launcher forks holds any. Returns whether a user
    namespace was made; raises _Step naming what failed. Must run before any thread exists.
    """
    libc = _libc()
    uid, gid = os.geteuid(), os.getegid()
    userns = False
    try:
        _call("unshare(CLONE_NEWNET)", libc.unshare(CLONE_NEWNET))
    except _Step:  # not privileged (or a container that withholds it): a user namespace grants it
        _call("unshare(CLONE_NEWUSER | CLONE_NEWNET)", libc.unshare(CLONE_NEWUSER | CLONE_NEWNET))
        userns = True
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        except OSError as exc2:
            raise _Step(exc2.errno or errno.EPERM, f"mapping the user into the user namespace: {exc2.strerror}") from None
    try:
        _loopback_up()
    except OSError as exc:
        raise _Step(exc.errno or errno.EPERM, f"bringing loopback up: {exc.strerror}") from None
    if userns:
        header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
        _call("dropping capabilities (capset)", libc.capset(ctypes.byref(header), data))
    return userns


def _reason(exc: OSError) -> str:
    why = _WHY.get(exc.errno or 0)
    return f"{exc.strerror}" + (f": {why}" if why else "")


def isolate_network() -> dict:
    """Move this process into a network of its own (see the module docstring); what happened, as a dict.

    The setup is tried first in a throwaway child: a machine that lets a process create the
    namespaces but not set them up (loopback down, no uid map) must not leave the launcher in a
    network where nothing can connect. Only when the child succeeded does the launcher do it.
    """
    read, write = os.pipe()
    probe = os.fork()
    if probe == 0:
        os.close(read)
        try:
            _enter_private_network()
            os.write(write, b"{}")
        except OSError as exc:
            os.write(write, json.dumps({"reason": _reason(exc)}).encode())
        except BaseException as exc:  # noqa: BLE001 - a probe never returns into the launcher
            os.write(write, json.dumps({"reason": f"{type(exc).__name__}: {exc}"}).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        answer = f.read()
    os.waitpid(probe, 0)
    try:
        result = json.loads(answer or b'{"reason": "the namespace probe died"}')
    except ValueError:
        result = {"reason": "the namespace probe answered garbage"}
    if "reason" in result:
        return {"isolated": False, "reason": result["reason"]}
    try:
        userns = _enter_private_network()
    except OSError as exc:  # the probe could, the launcher cannot: never run half-isolated
        raise SystemExit(f"dsctl launcher: could not isolate the deployment's network: {_reason(exc)}") from None
    return {"isolated": True, "userns": userns, "netns": os.readlink("/proc/self/ns/net")}


def _run_child(request: dict) -> None:
    """In the forked child: become its own process group, log to its file, run main(argv)."""
    code = 1
    try:
        os.setsid()
        if request.get("cpus"):
            os.sched_setaffinity(0, request["cpus"])
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.argv = [request["module"], *request["argv"]]
        module = importlib.import_module(request["module"])
        result = module.main(request["argv"])
        code = result if isinstance(result, int) else 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the child must never return into the launcher's loop
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reap(requests: Path, watches: dict[int, Watch]) -> int:
    """Write an exit file for each child that has ended, with how it ended in words (an out-of-memory kill named
    by the evidence its memory cgroups' counters, read at its fork in `watches`, and the kernel log give: only the
    reaper of a process has its exit status); how many there were."""
    from dsctl.specs import exits

    reaped = 0
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        code = os.waitstatus_to_exitcode(status)
        ended = exits.judge(code, pid=pid, watch=watches.pop(pid, None))
        write_json_atomic(requests / f"exit-{pid}.json", {"code": code, "ended": str(ended), "oom": ended.oom})
        reaped += 1


def serve(requests: Path, busy_poll_s: float = 0.01, idle_poll_s: float = 0.25) -> None:
    """Start what is asked for in `requests` and reap what ends. Polled every `busy_poll_s` right after
    something happened (a deployment starts all its processes at once), backing off to `idle_poll_s`
    when nothing does: at 100 looks a second an idle launcher cost 2-3% of a core
    (benchmarks/bench_data_path.py), at 4 a second a new worker still starts within a quarter second."""
    from dsctl.specs import exits  # here: the launcher has isolated its network, which needs no threads, by now

    stop = []
    watches: dict[int, Watch] = {}  # pid -> its memory cgroups' out-of-memory kill counts when it was forked
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    write_json_atomic(requests / "launcher-ready.json", {"pid": os.getpid(), "ready_at": time.time()})
    print(f"dsctl launcher: ready (TensorFlow preloaded), watching {requests}", flush=True)
    poll_s = busy_poll_s
    while not stop:
        started = 0
        for path in sorted(requests.glob("*.req")):
            try:
                request = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            path.unlink(missing_ok=True)
            pid = os.fork()
            if pid == 0:
                _run_child(request)
            watches[pid] = exits.watch(pid)
            write_json_atomic(requests / f"{request['id']}.pid", {"pid": pid})
            print(f"dsctl launcher: started {request['id']} as pid {pid}", flush=True)
            started += 1
        reaped = _reap(requests, watches)
        poll_s = busy_poll_s if started or reaped else min(poll_s * 2, idle_poll_s)
        time.sleep(poll_s)
    print("dsctl launcher: stopped", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="dsctl-launcher", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", required=True, type=Path)
    ap.add_argument("--isolate-network", action="store_true",
                    help="run the deployment in a network namespace of its own with only loopback up")
    args = ap.parse_args(argv)
    os.umask(PRIVATE_UMASK)
    args.requests.mkdir(parents=True, exist_ok=True)
    if args.isolate_network:
        # Before TensorFlow: unshare(CLONE_NEWUSER) refuses a process with threads.
        isolation = isolate_network()
        write_json_atomic(args.requests / "isolation.json", isolation)
        print(f"dsctl launcher: isolation {json.dumps(isolation)}", flush=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow  # noqa: F401 - the point of this process: import once, fork many

    serve(args.requests)


if __name__ == "__main__":
    main()
