"""`pipeline.options` and `pipeline.order`: what dsctl changes in a pipeline without touching its code.

`options` are tf.data `Options` set on the dataset before it is sent to the workers (they travel with
its graph, so the workers apply them): `dsctl profile` measures a pipeline with and without one and
recommends it with the difference it made; `dsctl up` applies what the spec sets. Fields left out
(null) keep TensorFlow's own default, so an empty mapping changes nothing.

`order` gives, for each reorderable section of the pipeline (`dsctl.reorderable(ds, NAME, steps)`),
the order its steps run in; `dsctl profile` ranks them as Pecan's AutoOrder does (data-shrinking steps
first) and measures the order it proposes.

A file of its own so that schema.py stays readable; like specs/autocache.py it does not import
schema.py (which imports it).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

SECTION_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_STEPS = 64  # steps in one reorderable section


class PipelineOptions(BaseModel):
    """tf.data Options dsctl sets on the pipeline (TensorFlow's `tf.data.Options`; null: TensorFlow's default)."""

    # As schema.Strict (not imported: schema.py imports this file): unknown keys are errors.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, frozen=True)

    map_parallelization: bool | None = Field(
        None, description="run stateless `map`s written without num_parallel_calls in parallel "
                          "(experimental_optimization.map_parallelization; TensorFlow's default: true)")
    inject_prefetch: bool | None = Field(
        None, description="add a prefetch after the last transformation when it is synchronous "
                          "(experimental_optimization.inject_prefetch; default: true)")
    parallel_batch: bool | None = Field(
        None, description="copy elements into batches in parallel (experimental_optimization.parallel_batch; "
                          "default: true)")
    filter_parallelization: bool | None = Field(
        None, description="run stateless `filter`s in parallel (experimental_optimization.filter_parallelization; "
                          "default: false)")
    deterministic: bool | None = Field(
        None, description="false lets parallel transformations hand out elements as they finish, not in order "
                          "(Options.deterministic; default: true)")
    autotune_cpu_budget: int | None = Field(
        None, ge=1, le=4096, description="CPU cores autotuning may plan for (autotune.cpu_budget; default: the "
                                         "machine's cores)")
    autotune_ram_budget_mb: int | None = Field(
        None, ge=1, le=10**7, description="memory autotuning may give buffers, MB (autotune.ram_budget; default: half "
                                          "the machine's memory)")

    def set_fields(self) -> dict[str, bool | int]:
        """The fields this spec sets, by name (what `dsctl profile` and `dsctl runs show` print)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


def check_order(value: dict[str, list[str]] | None) -> dict[str, list[str]] | None:
    """`pipeline.order`: section names and step names as hints are named, each step once per section."""
    if value is None:
        return value
    for section, steps in value.items():
        if not SECTION_RE.match(str(section)):
            raise ValueError(f"a reorderable section's name is letters, digits, '-' and '_', got {section!r}")
        if not steps or len(steps) > MAX_STEPS:
            raise ValueError(f"section {section!r}: give its steps in the order they run (1 to {MAX_STEPS} names)")
        bad = [s for s in steps if not isinstance(s, str) or not SECTION_RE.match(s)]
        if bad:
            raise ValueError(f"section {section!r}: a step's name is letters, digits, '-' and '_', got {bad[0]!r}")
        twice = sorted({s for s in steps if steps.count(s) > 1})
        if twice:
            raise ValueError(f"section {section!r}: step {twice[0]!r} is listed twice; list each step once")
    return value

