"""Check a spec's entrypoints (pipeline.entrypoint, trainer.model.entrypoint) in a child process
with a time limit.

Importing the user's module runs the user's code: a module that loops or waits at import
would hang `dsctl validate` and `dsctl up` forever if it were imported here. The child
(entrypoint_child.py) checks what the runtime needs: each module imports, has the function,
and a pipeline function called with `pipeline.params` returns a tf.data.Dataset.

The user's code may also start processes, daemons among them (setsid, a double fork), which
leave any process group. So the child is run by a `ChildRunner` the caller gives: one that
ends the child and everything it started when the check ends, passes its limit, or dsctl is
interrupted. The one dsctl uses puts the child in a cgroup of its own
(dsctl.orchestrator.preflight.check_entrypoints, with provisioners/containment.py); this
package, which imports nothing of dsctl's, cannot, and so runs no user code itself
(`specs.load_spec` only reads and validates). `in_process_group` is the runner where no
container can be made: it ends the child's process group only.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from . import exits
from .errors import SpecError

if TYPE_CHECKING:
    from .loaded import LoadedSpec

CHILD = Path(__file__).with_name("entrypoint_child.py")
TIMEOUT_ENV = "DSCTL_ENTRYPOINT_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0  # importing TensorFlow alone takes 7 s on a busy 2-core machine
# Requests already checked in this process (`up --detach` loads twice), with the pipeline's cardinality they found.
_passed: dict[str, int | None] = {}


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


class ChildRunner(Protocol):
    def __call__(self, argv: list[str], limit_s: float) -> tuple[int | None, bool]:
        """Run `argv` (stdin, stdout and stderr the null device) for at most `limit_s` seconds; end it and everything
        it started before returning, whatever happens (Ctrl-C included). (exit code, whether it passed the limit)."""
        ...


def check_entrypoints(loaded: LoadedSpec, run: ChildRunner) -> None:
    """Raise a SpecError at the entrypoint's line if it does not import, has no such function,
    does not return a dataset, or takes longer than the limit. The child runs through `run`. The length of the
    dataset a pipeline entrypoint returned goes to `loaded.pipeline_cardinality` (specs/epochs.py reads it)."""
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
        loaded.pipeline_cardinality = _passed[request]
        return
    limit = timeout_s()
    watched = exits.watch(os.getpid())  # the child's memory cgroups are this process's (or below them)
    result, code, timed_out = _run_child(request, limit, run)
    if result.get("ok") and not timed_out:
        cardinality = result.get("cardinality")
        _passed[request] = loaded.pipeline_cardinality = cardinality if isinstance(cardinality, int) else None
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
    if code is not None and code in (exits.KILLED, exits.SHELL_KILLED):
        raise loaded.error(loc, (
            f"checking module '{module}' ended without a result: its process "
            f"{exits.describe_exit(code, exits.oom_evidence(None, watched))}."))
    ended = f"exited with code {code}" if code is None or code >= 0 else exits.describe_exit(code)
    raise loaded.error(loc, (
        f"checking module '{module}' ended without a result (its process {ended}): the module "
        "or the function ended the process (os._exit) or crashed it."))


def _run_child(request: str, limit: float, run: ChildRunner) -> tuple[dict, int | None, bool]:
    """(what the child reported, its exit code, whether it passed the limit)."""
    with tempfile.TemporaryDirectory(prefix="dsctl-entrypoint-") as tmp:
        out, inp = os.path.join(tmp, "result.json"), os.path.join(tmp, "request.json")
        with open(inp, "w") as f:
            f.write(request)  # a file, not an argument: params may be longer than an argument can be
        code, timed_out = run([sys.executable, str(CHILD), inp, out], limit)
        try:
            with open(out) as f:
                result = json.load(f)
        except (OSError, ValueError):
            result = {}
    return result, code, timed_out
