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
