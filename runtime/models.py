"""The training step the harness runs per batch.

`synthetic` stands for an accelerator busy on the step: it sleeps, using no
host CPU, for a fixed time per step plus, optionally, a time per padded token
(so uneven batches make real stragglers, paper §3.6). `python` calls the
user's own step function with each batch.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsctl.specs.schema import ModelSpec

StepFn = Callable[[Any, dict], None]


class ModelError(Exception):
    """The model (its entrypoint, its strategy's hardware, its checkpoints) is at fault; the message is for the user."""


def synthetic_step_seconds(model: ModelSpec, stats: dict, elapsed_s: float = 0.0) -> float:
    """Step time now: the base costs, or those of the latest phase whose after_s has passed."""
    step_ms, token_us = model.step_time_ms, model.padded_token_time_us
    for phase in model.phases:
        if elapsed_s < phase.after_s:
            break
        step_ms = phase.step_time_ms if phase.step_time_ms is not None else step_ms
        token_us = phase.padded_token_time_us if phase.padded_token_time_us is not None else token_us
    return step_ms / 1e3 + stats.get("padded_tokens", 0) * token_us / 1e6


def load_function(entrypoint: str, base_dir: Path | None = None) -> Callable:
    """The user's 'module:function' (trainer.model.entrypoint), imported with base_dir first on sys.path."""
    module_name, func_name = entrypoint.split(":")
    if base_dir is not None and str(base_dir) not in sys.path:
        sys.path.insert(0, str(base_dir))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to fix
        raise ModelError(f"trainer.model.entrypoint: cannot import module '{module_name}' "
                         f"({type(exc).__name__}: {exc}).") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise ModelError(f"trainer.model.entrypoint: module '{module_name}' has no function '{func_name}'.")
    return fn


def make_step(model: ModelSpec, base_dir: Path | None = None) -> StepFn:
    if model.kind == "synthetic":
        started: list[float] = []

        def step(batch: Any, stats: dict) -> None:
            if not started:
                started.append(time.perf_counter())
            seconds = synthetic_step_seconds(model, stats, time.perf_counter() - started[0])
            if seconds > 0:
                time.sleep(seconds)
        return step

    assert model.entrypoint is not None, "rules.py: a python model has its entrypoint"
    fn = load_function(model.entrypoint, base_dir)

    def user_step(batch: Any, stats: dict) -> None:
        fn(batch)

    return user_step
