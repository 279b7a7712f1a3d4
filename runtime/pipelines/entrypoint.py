"""User pipelines: 'package.module:function' returning a tf.data.Dataset.

The trainer imports the user's module (the tf.data service workers do not: they
receive the serialized graph), with the spec file's directory first on sys.path
so a module that sits beside the spec imports without packaging. Every failure
becomes a PipelineError that says what to fix.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from pathlib import Path

import tensorflow as tf

from .errors import PipelineError


def _import(module_name: str, base_dir: Path):
    base = str(Path(base_dir).resolve())
    if base not in sys.path:
        sys.path.insert(0, base)
    importlib.invalidate_caches()  # the module may have been written after startup
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        parts = module_name.split(".")
        ours = {".".join(parts[: i + 1]) for i in range(len(parts))}
        if exc.name in ours:
            raise PipelineError(
                f"Cannot import pipeline module '{module_name}': no module '{exc.name}' was found in {base} "
                f"(the spec's directory, searched first) or elsewhere on sys.path. Put {parts[0]}.py (or the "
                f"package folder {parts[0]}/) next to the spec file, or install it in this environment."
            ) from exc
        raise PipelineError(
            f"Importing pipeline module '{module_name}' failed because it imports '{exc.name}', which is not "
            f"installed in this environment (ModuleNotFoundError: {exc})."
        ) from exc
    except Exception as exc:  # noqa: BLE001 - any import-time error is the user's to see
        raise PipelineError(
            f"Importing pipeline module '{module_name}' raised {type(exc).__name__}: {exc}"
        ) from exc


def load_entrypoint_dataset(entrypoint: str, params: dict, base_dir: Path) -> tf.data.Dataset:
    """Import 'module:function', call function(**params), return the tf.data.Dataset it made."""
    module_name, sep, func_name = entrypoint.partition(":")
    if not sep or not module_name or not func_name:
        raise PipelineError(f"The pipeline entrypoint must look like 'package.module:function', got {entrypoint!r}.")
    module = _import(module_name, base_dir)
    func = getattr(module, func_name, None)
    if func is None:
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None))]
        close = difflib.get_close_matches(func_name, public, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise PipelineError(
            f"Module '{module_name}' ({getattr(module, '__file__', '?')}) has no function '{func_name}'.{hint}"
        )
    if not callable(func):
        raise PipelineError(f"'{entrypoint}' is a {type(func).__name__}, not a function returning a tf.data.Dataset.")
    try:
        result = func(**params)
    except PipelineError:  # dsctl's own helpers inside it (a reorderable section) already say what to fix
        raise
    except Exception as exc:  # noqa: BLE001
        raise PipelineError(
            f"The pipeline function '{entrypoint}' raised {type(exc).__name__}: {exc} "
            f"(it was called with params {sorted(params) or 'none'})."
        ) from exc
    if not isinstance(result, tf.data.Dataset):
        raise PipelineError(
            f"The pipeline function '{entrypoint}' returned {type(result).__module__}.{type(result).__qualname__}, "
            "not a tf.data.Dataset. Return the dataset itself (for example tf.data.Dataset.from_tensor_slices(...) "
            "followed by .batch(...)); note that from_generator and py_function pipelines cannot run on tf.data "
            "service workers."
        )
    return result
