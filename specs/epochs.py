"""Epochs: whether a job's pipeline ends, and what the service's processing mode makes of one epoch.

A training program written the common way loops over a finite dataset once per epoch and evaluates
between epochs. Read alone, one pass is one epoch; through the tf.data service it stays one only
with `distributed_epoch` (each element once across the workers): under `parallel_epochs` (the
default, sharding OFF) every worker produces the whole dataset, so with n workers a pass holds n
copies of every element. A job whose length is the pipeline's (no trainer.steps, no duration_s) is
refused then; one with a cap is warned. Nothing here imports TensorFlow: an entrypoint pipeline's
length is what its check in a child process read (`ds.cardinality()`, specs/entrypoint_child.py).
"""

from __future__ import annotations

from .errors import SpecError
from .loaded import LoadedSpec

INFINITE, UNKNOWN = -1, -2  # tf.data's INFINITE_CARDINALITY and UNKNOWN_CARDINALITY
COPYING_MODES = ("parallel_epochs", "off")  # every worker produces the whole dataset


def pipeline_ends(loaded: LoadedSpec) -> bool | None:
    """Whether one pass over the pipeline ends: a builtin's `epochs`, an entrypoint's checked cardinality (a length
    TensorFlow cannot tell, after a filter or a flat_map, counts as an end); None when it was not checked."""
    spec = loaded.spec
    if spec.pipeline.builtin is not None:
        return spec.pipeline.params.get("epochs") is not None
    card = loaded.pipeline_cardinality
    return None if card is None else card != INFINITE


def _finite(loaded: LoadedSpec) -> str:
    spec = loaded.spec
    if spec.pipeline.builtin is not None:
        return f"a finite pipeline (pipeline.params.epochs: {spec.pipeline.params.get('epochs')})"
    if loaded.pipeline_cardinality == UNKNOWN:
        return "a finite pipeline (its dataset ends, at a length TensorFlow cannot tell)"
    return f"a finite pipeline (its dataset ends after {loaded.pipeline_cardinality} batches)"


def epoch_findings(loaded: LoadedSpec, workers: int, mode: str = "service") -> tuple[list[SpecError], list[SpecError]]:
    """(problems, warnings) of reading this spec's epochs with `workers` workers in `mode`: an entrypoint's endless
    dataset with nothing else to end the job is refused (a builtin's is, by rules.py); and, pointing at
    service.processing_mode, parallel_epochs with several workers is refused when the pipeline's end is what ends the
    job, warned when trainer.steps or duration_s cut it."""
    spec = loaded.spec
    svc, trainer = spec.service, spec.trainer
    if trainer.steps is None and trainer.duration_s is None and pipeline_ends(loaded) is False:
        return [loaded.error(("trainer",), "give 'steps' (a number of training steps) or 'duration_s' (seconds to "
                             f"train): the dataset {spec.pipeline.entrypoint} returns never ends (it repeats), so "
                             "nothing else would end the job. Or let it end (no .repeat()), and the job (your "
                             "program's epoch loop) ends with the data.")], []
    if mode != "service" or svc.processing_mode not in COPYING_MODES or workers < 2 or not pipeline_ends(loaded):
        return [], []
    what = (f"{svc.processing_mode} with {_finite(loaded)} and {workers} workers: every worker "
            f"produces the whole dataset, so one pass over it (an epoch of your program's loop over "
            f"dsctl.train.batches(ds), or the job itself) holds {workers} copies of every element, {workers} times the "
            "batches it has read alone.")
    fix = ("Use processing_mode: distributed_epoch (the dispatcher hands each element to one worker: one copy per "
           "epoch), or make the pipeline endless (epochs: null) and bound the job with trainer.steps.")
    where = ("service", "processing_mode")
    if trainer.steps is None and trainer.duration_s is None:
        return [loaded.error(where, f"{what} The job's length is its pipeline's (no trainer.steps or duration_s), so it "
                                    f"would train on {workers} copies of the data. {fix}")], []
    cap = f"trainer.steps ({trainer.steps})" if trainer.steps is not None else f"trainer.duration_s ({trainer.duration_s:g})"
    return [], [loaded.error(where, f"{what} {cap} cuts the job wherever that falls. {fix}")]
