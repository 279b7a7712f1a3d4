"""The workers' part of a spec's pipeline, built one way for trainers, autocache profiling and `dsctl profile`.

A builtin or the user's entrypoint, built while the spec's `pipeline.order` is in force (the order each
reorderable section runs in, runtime/reorder.py), then the spec's `pipeline.options` set on it
(options.py). What comes after `distribute` (a builtin's trainer-side `finish`) is not part of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dsctl.runtime import reorder

from .options import apply_options

if TYPE_CHECKING:
    from dsctl.specs.schema import JobSpec


def build_spec_pipeline(spec: JobSpec, *, cache_dir: Path | str, base_dir: Path,
                        bucketing: tuple[list[int], int] | None = None, plan: reorder.Plan | None = None):
    """The dataset the workers run for `spec`; `plan` (optional) records the reorderable sections it built."""
    from . import build_dataset, load_entrypoint_dataset

    p = spec.pipeline
    plan = plan or reorder.Plan()
    plan.orders = dict(p.order or {})
    with reorder.ordered(plan=plan):
        if p.builtin:
            ds = build_dataset(p.builtin, p.params, cache_dir=cache_dir, bucketing=bucketing)
        else:
            assert p.entrypoint is not None, "rules.py: a pipeline is a builtin or an entrypoint"
            ds = load_entrypoint_dataset(p.entrypoint, p.params, base_dir)
    unknown = sorted(set(plan.orders) - set(plan.sections))
    if unknown:
        from .errors import PipelineError

        have = ", ".join(plan.sections) or "none (dsctl.reorderable(ds, NAME, steps) makes one)"
        raise PipelineError(f"pipeline.order names section {unknown[0]!r}, which the pipeline does not have; its "
                            f"reorderable sections are: {have}.")
    return apply_options(ds, p.options)
