"""dsctl: run TensorFlow's tf.data service for training jobs from YAML specs."""

__version__ = "0.1.0"


def autocache(ds, name: str):
    """Mark a point of a tf.data pipeline where dsctl may cache it (`ds = dsctl.autocache(ds, "source")`).

    Put it after reading, or after deterministic transformations, before anything random. A no-op
    unless dsctl's autocache policy chose this point for the job (see docs/spec-reference.md#autocache).
    Imported lazily, so `import dsctl` stays light on worker and trainer machines.
    """
    from dsctl.runtime.autocache import autocache as hint

    return hint(ds, name)


def reorderable(ds, name: str, steps):
    """Mark steps of a tf.data pipeline that may run in any order (`ds = dsctl.reorderable(ds, "augment",
    {"crop": lambda ds: ds.map(crop), "keep": lambda ds: ds.filter(keep)})`).

    Each step is a function from a dataset to a dataset. They run in the order written unless the spec's
    `pipeline.order` names another for this section; `dsctl profile` ranks them as Pecan's AutoOrder does
    (data-shrinking steps first) and measures that order (see docs/profiling.md). Imported lazily, as autocache.
    """
    from dsctl.runtime.reorder import reorderable as section

    return section(ds, name, steps)
