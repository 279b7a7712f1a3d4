"""Run by specs/entrypoints.py in a child process: import the user's entrypoints and report.

Standard library only, and run as a file (not `-m dsctl...`), so the child starts in
a few tens of milliseconds and imports TensorFlow only if the user's module does. A
pipeline function can return a tf.data.Dataset only if TensorFlow was imported, so a
module that never imports it is checked without it.

Usage: python entrypoint_child.py REQUEST_FILE RESULT_FILE (REQUEST_FILE: JSON with base_dir,
pipeline {entrypoint, params} or null, model entrypoint or null). Before each step it writes
{"field", "module", "function"} to RESULT_FILE (what the parent names if it has to kill
the child), and at the end {"ok": true, "cardinality": the pipeline's length (tf.data's: -1 endless,
-2 unknown)} or {"field", "message"}.
"""

import difflib
import importlib
import json
import os
import sys


def _report(path, result):
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


class _Refused(Exception):
    pass


BASE_DIR = ""  # the spec's folder, searched first


def _import(module_name, what):
    importlib.invalidate_caches()  # the module may have been written after startup
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        parts = module_name.split(".")
        if exc.name in {".".join(parts[: i + 1]) for i in range(len(parts))}:
            raise _Refused(
                f"cannot import {what} module '{module_name}': no module '{exc.name}' was found in {BASE_DIR} "
                f"(the spec's directory, searched first) or elsewhere on sys.path. Put {parts[0]}.py (or the "
                f"package folder {parts[0]}/) next to the spec file, or install it in this environment."
            ) from None
        raise _Refused(f"importing {what} module '{module_name}' failed because it imports '{exc.name}', which is "
                       f"not installed in this environment (ModuleNotFoundError: {exc}).") from None
    except SystemExit as exc:
        raise _Refused(f"importing {what} module '{module_name}' called sys.exit({exc.code!r}).") from None
    except BaseException as exc:  # noqa: BLE001 - any import-time error is the user's to see
        raise _Refused(f"importing {what} module '{module_name}' raised {type(exc).__name__}: {exc}") from None


def _function(module, module_name, func_name, entrypoint):
    func = getattr(module, func_name, None)
    if func is None:
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None))]
        close = difflib.get_close_matches(func_name, public, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise _Refused(f"module '{module_name}' ({getattr(module, '__file__', '?')}) has no function '{func_name}'.{hint}")
    if not callable(func):
        raise _Refused(f"'{entrypoint}' is a {type(func).__name__}, not a function.")
    return func


def _check_pipeline(entrypoint, params):
    module_name, func_name = entrypoint.split(":")
    func = _function(_import(module_name, "pipeline"), module_name, func_name, entrypoint)
    try:
        result = func(**params)
    except BaseException as exc:  # noqa: BLE001
        raise _Refused(f"the pipeline function '{entrypoint}' raised {type(exc).__name__}: {exc} "
                       f"(it was called with params {sorted(params) or 'none'}).") from None
    tf = sys.modules.get("tensorflow")
    if tf is None or not isinstance(result, tf.data.Dataset):
        raise _Refused(
            f"the pipeline function '{entrypoint}' returned {type(result).__module__}.{type(result).__qualname__}, "
            "not a tf.data.Dataset. Return the dataset itself (for example tf.data.Dataset.from_tensor_slices(...) "
            "followed by .batch(...)); note that from_generator and py_function pipelines cannot run on tf.data "
            "service workers."
        )
    try:
        return int(result.cardinality())  # the dataset's length: -1 endless, -2 not known to TensorFlow
    except Exception:  # noqa: BLE001 - the length is a help, never a reason to refuse
        return None


def _check_model(entrypoint):
    module_name, func_name = entrypoint.split(":")
    _function(_import(module_name, "model"), module_name, func_name, entrypoint)


def main(request_path, result_path):
    global BASE_DIR
    with open(request_path) as f:
        request = json.load(f)
    BASE_DIR = request["base_dir"]
    sys.path.insert(0, BASE_DIR)
    # The user's prints and TensorFlow's start-up notices are not the check's output.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    steps = []
    if request.get("pipeline"):
        p = request["pipeline"]
        steps.append(("pipeline.entrypoint", p["entrypoint"], lambda: _check_pipeline(p["entrypoint"], p["params"])))
    if request.get("model"):
        steps.append(("trainer.model.entrypoint", request["model"], lambda: _check_model(request["model"])))
    found = {}
    for field, entrypoint, check in steps:
        module, function = entrypoint.split(":")
        _report(result_path, {"field": field, "module": module, "function": function})
        try:
            cardinality = check()
        except _Refused as exc:
            _report(result_path, {"field": field, "message": str(exc)})
            return
        if field == "pipeline.entrypoint":
            found["cardinality"] = cardinality
    _report(result_path, {"ok": True, **found})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    os._exit(0)  # user modules may have started threads that would keep the process alive
