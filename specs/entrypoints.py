"""Check a spec's entrypoints (pipeline.entrypoint, trainer.model.entrypoint) in a child process
with a time limit.

Importing the user's module runs the user's code: a module that loops or waits at import
would hang `dsctl validate` and `dsctl up` forever if it were imported here. The child
(entrypoint_child.py) runs in its own process group, which is killed, with anything the
module started, when the check ends, passes its limit, or dsctl is interrupted. It checks
what the runtime needs: each module imports, has the function, and a pipeline function
called with `pipeline.params` returns a tf.data.Dataset.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import SpecError

if TYPE_CHECKING:
    from .loaded import LoadedSpec

CHILD = Path(__file__).with_name("entrypoint_child.py")
TIMEOUT_ENV = "DSCTL_ENTRYPOINT_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0  # importing TensorFlow alone takes 7 s on a busy 2-core machine
_passed: set[str] = set()  # requests already checked in this process (`up --detach` loads twice)


def timeout_s() -> float:
    """The time limit: DSCTL_ENTRYPOINT_TIMEOUT_S seconds, default 60."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 3600:
        raise SpecError(f"{TIMEOUT_ENV} must be a number of seconds above 0 and at most 3600, got {raw!r}; "
                        f"unset it for the default ({DEFAULT_TIMEOUT_S:g} s).")
    return value


def check_entrypoints(loaded: LoadedSpec) -> None:
    """Raise a SpecError at the entrypoint's line if it does not import, has no such function,
    does not return a dataset, or takes longer than the limit."""
    spec = loaded.spec
    pipeline = spec.pipeline.entrypoint
    model = spec.trainer.model.entrypoint if spec.trainer.model.kind in ("python", "keras") else None
    entry = pipeline or model
    if not entry:
        return
    request = json.dumps({
        "base_dir": str(loaded.base_dir),
        "pipeline": {"entrypoint": pipeline, "params": spec.pipeline.params} if pipeline else None,
        "model": model,
    }, sort_keys=True, default=str)
    if request in _passed:
        return
    limit = timeout_s()
    result, code, timed_out = _run_child(request, limit)
    if result.get("ok") and not timed_out:
        _passed.add(request)
        return
    field = result.get("field") or ("pipeline.entrypoint" if pipeline else "trainer.model.entrypoint")
    loc = tuple(field.split("."))
    if "message" in result:
        raise loaded.error(loc, result["message"])
    module = result.get("module") or entry.split(":")[0]
    if timed_out:
        doing = (f"importing module '{module}' and calling '{result.get('function')}'" if field.startswith("pipeline")
                 else f"importing module '{module}'")
        raise loaded.error(loc, (
            f"{doing} did not finish within {limit:g} s, the limit for checking an entrypoint ({TIMEOUT_ENV} "
            "changes it), so the check was stopped and its process killed. Look for code in the module, or in "
            "the function, that waits or loops: a network call, a prompt for input, a `while True`."))
    raise loaded.error(loc, (
        f"checking module '{module}' ended without a result (its process exited with code {code}): the module "
        "or the function ended the process (os._exit) or crashed it."))


def _run_child(request: str, limit: float) -> tuple[dict, int | None, bool]:
    """(what the child reported, its exit code, whether it passed the limit); the child's process
    group is killed before this returns, whatever happens (Ctrl-C included)."""
    with tempfile.TemporaryDirectory(prefix="dsctl-entrypoint-") as tmp:
        out, inp = os.path.join(tmp, "result.json"), os.path.join(tmp, "request.json")
        with open(inp, "w") as f:
            f.write(request)  # a file, not an argument: params may be longer than an argument can be
        proc = subprocess.Popen([sys.executable, str(CHILD), inp, out], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its own group (start_new_session): the child and what it started
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        try:
            with open(out) as f:
                result = json.load(f)
        except (OSError, ValueError):
            result = {}
    return result, proc.returncode, timed_out
