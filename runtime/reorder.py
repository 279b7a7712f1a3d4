"""Reorderable sections: steps of a pipeline the user says may run in any order.

    ds = dsctl.reorderable(ds, "augment", {
        "upscale": lambda ds: ds.map(upscale, num_parallel_calls=tf.data.AUTOTUNE),   # 4x the bytes
        "keep_labelled": lambda ds: ds.filter(has_label),                            # drops 3 of 4
    })

Why it is built this way:
- Only the user knows which transformations commute (a filter on the label commutes with a map that
  leaves the label alone; a crop does not commute with a decode), so dsctl reorders only what a
  section names, as Pecan's AutoOrder reorders only what its user did not pin. Each step is a function
  from dataset to dataset, so a step may be several transformations.
- The order is decided before the graph is built, as autocache's hints are: `ordered(order)` holds the
  spec's `pipeline.order` while the pipeline function runs, and the section applies its steps in that
  order (its written order when the spec names none). The graph the workers get is then plain tf.data;
  they need nothing of dsctl.
- An order other than the written one is checked as it is built: every step must take the elements it
  is given there (TensorFlow traces it), and the section must give what its written order gives (the
  same element structure, types and compatible shapes); otherwise a PipelineError names the step.
- `dsctl profile` reads back every section (`Plan.sections`): its input dataset, its steps and the order
  used, to measure each step alone and rank them (orchestrator/profiling/advice.py).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass
class Section:
    """One reorderable section as the pipeline built it."""

    name: str
    written: list[str]  # the steps in the order the code lists them
    used: list[str]  # the order they ran in
    steps: dict[str, Callable[[Any], Any]]
    input: Any  # the dataset the section starts from


@dataclass
class Plan:
    """The orders sections follow while a pipeline is built, and the sections it built (in order)."""

    orders: dict[str, list[str]] = field(default_factory=dict)
    sections: dict[str, Section] = field(default_factory=dict)


_ACTIVE: list[Plan] = []


@contextlib.contextmanager
def ordered(orders: Mapping[str, list[str]] | None = None, plan: Plan | None = None):
    """Sections built inside this block follow `orders` (the spec's pipeline.order); yields the plan, which
    records every section built. Outside any block a section runs in its written order."""
    plan = plan or Plan(orders=dict(orders or {}))
    _ACTIVE.append(plan)
    try:
        yield plan
    finally:
        _ACTIVE.pop()


def _error(message: str):
    from dsctl.runtime.pipelines.errors import PipelineError

    return PipelineError(message)


def _apply(ds, steps: Mapping[str, Callable[[Any], Any]], order: list[str], name: str):
    for step in order:
        try:
            ds = steps[step](ds)
        except Exception as exc:  # noqa: BLE001 - tracing a step at a new position: the user's to see
            raise _error(f"pipeline.order.{name}: step {step!r} cannot run at position {order.index(step) + 1} of "
                         f"{order}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
        if not hasattr(ds, "element_spec"):
            raise _error(f"reorderable section {name!r}: step {step!r} returned {type(ds).__name__}, not a "
                         "tf.data.Dataset; each step is a function from a dataset to a dataset")
    return ds


def _same_elements(a, b) -> bool:
    """Whether two element specs have the same structure and types, and shapes either could hold."""
    import tensorflow as tf

    try:
        tf.nest.assert_same_structure(a, b)
    except (ValueError, TypeError):
        return False
    return all(x.is_compatible_with(y) or y.is_compatible_with(x) for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)))


def reorderable(ds, name: str, steps: Mapping[str, Callable[[Any], Any]]):
    """Apply `steps` (name -> function from dataset to dataset) to `ds` in the order dsctl was given for section
    `name` (the spec's `pipeline.order`), else in the order written. See the module docstring."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"reorderable: a section's name is letters, digits, '-' and '_', got {name!r}")
    if not isinstance(steps, Mapping) or not steps:
        raise ValueError(f"reorderable({name!r}): steps is a mapping of names to functions (dataset -> dataset)")
    for step, fn in steps.items():
        if not isinstance(step, str) or not NAME_RE.match(step):
            raise ValueError(f"reorderable({name!r}): a step's name is letters, digits, '-' and '_', got {step!r}")
        if not callable(fn):
            raise ValueError(f"reorderable({name!r}): step {step!r} is {type(fn).__name__}, not a function")
    written = list(steps)
    plan = _ACTIVE[-1] if _ACTIVE else None
    if plan is not None and name in plan.sections:
        raise ValueError(f"reorderable: the section name {name!r} is used twice in one pipeline; name each its own")
    order = list(plan.orders.get(name, written)) if plan is not None else written
    if sorted(order) != sorted(written):
        raise _error(f"pipeline.order.{name}: {order} must list each step of the section once; its steps are: "
                     f"{', '.join(written)}")
    out = _apply(ds, steps, order, name)
    if order != written:
        reference = _apply(ds, steps, written, name)
        if not _same_elements(out.element_spec, reference.element_spec):
            raise _error(f"pipeline.order.{name}: in the order {order} the section gives {out.element_spec}, but "
                         f"written ({written}) it gives {reference.element_spec}; its steps do not commute in that "
                         "order")
    if plan is not None:
        plan.sections[name] = Section(name=name, written=written, used=order, steps=dict(steps), input=ds)
    return out
