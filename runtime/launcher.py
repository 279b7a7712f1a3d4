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
exits, DIR/exit-<pid>.json ({"code": C}).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from .readiness import write_json_atomic


def _run_child(request: dict) -> None:
    """In the forked child: become its own process group, log to its file, run main(argv)."""
    code = 1
    try:
        os.setsid()
        if request.get("cpus"):
            os.sched_setaffinity(0, request["cpus"])
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
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


def _reap(requests: Path) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        write_json_atomic(requests / f"exit-{pid}.json", {"code": os.waitstatus_to_exitcode(status)})


def serve(requests: Path, poll_s: float = 0.01) -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    write_json_atomic(requests / "launcher-ready.json", {"pid": os.getpid(), "ready_at": time.time()})
    print(f"dsctl launcher: ready (TensorFlow preloaded), watching {requests}", flush=True)
    while not stop:
        for path in sorted(requests.glob("*.req")):
            try:
                request = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            path.unlink(missing_ok=True)
            pid = os.fork()
            if pid == 0:
                _run_child(request)
            write_json_atomic(requests / f"{request['id']}.pid", {"pid": pid})
            print(f"dsctl launcher: started {request['id']} as pid {pid}", flush=True)
        _reap(requests)
        time.sleep(poll_s)
    print("dsctl launcher: stopped", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="dsctl-launcher", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", required=True, type=Path)
    args = ap.parse_args(argv)
    args.requests.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow  # noqa: F401 - the point of this process: import once, fork many

    serve(args.requests)


if __name__ == "__main__":
    main()
