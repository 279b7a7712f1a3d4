"""`pipeline.options` applied: the tf.data Options a spec sets, on the dataset the workers get.

Options are part of the dataset's graph (an OptionsDataset node), so what is set here before
`distribute` is what every tf.data service worker applies when it builds its iterator, and what a
colocated trainer applies too. Options set here are merged over the pipeline's own: a field the spec
sets wins (tf.data's `Options.merge`), fields it leaves out keep what the pipeline or TensorFlow says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsctl.specs.pipeline_options import PipelineOptions

MB = 1024 * 1024


def to_tf_options(options: PipelineOptions):
    """The tf.data.Options that set exactly the fields `options` sets."""
    import tensorflow as tf

    out = tf.data.Options()
    opt = out.experimental_optimization
    for name in ("map_parallelization", "inject_prefetch", "parallel_batch", "filter_parallelization"):
        value = getattr(options, name)
        if value is not None:
            setattr(opt, name, value)
    if options.deterministic is not None:
        out.deterministic = options.deterministic
    if options.autotune_cpu_budget is not None:
        out.autotune.cpu_budget = options.autotune_cpu_budget
    if options.autotune_ram_budget_mb is not None:
        out.autotune.ram_budget = options.autotune_ram_budget_mb * MB
    return out


def apply_options(ds, options: PipelineOptions | None):
    """`ds` with the spec's options set on it; `ds` itself when the spec sets none."""
    if options is None or not options.set_fields():
        return ds
    return ds.with_options(to_tf_options(options))
