"""The trainer harness: read the pipeline (through the service or not), run the model step, emit metrics.

    python -m dsctl.runtime.trainer --spec spec.json --mode service --dispatcher HOST:PORT \
        --index 0 --metrics trainer-0.jsonl

Modes, all in this one harness so they are measured the same way:
- service: the pipeline runs on tf.data service workers (`distribute`), with the spec's options.
- colocated: the pipeline runs here, on the trainer's own CPUs (the paper's baseline).
- ideal: `take(1).cache().repeat()`, input that is never the bottleneck (paper §4.1).

Per window it writes batches, batches/s, mean batch time and the input stall
(time blocked in next()), plus tokens and padded tokens for text batches.
A keras model (trainer.model.kind: keras) trains with model.fit instead of this loop
(keras_runner.py), under the strategy --accelerator/--accelerators call for, saving to
--checkpoint-dir and restoring from --restore-from; its windows have the same fields
plus the loss and the model's metrics.
Exit codes: 0 done, 2 the user's pipeline or model is at fault, 1 other failures.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, cast

from dsctl.specs.schema import JobSpec

from . import autocache, placement, trainer_args
from .loop import MeasuredLoop
from .metrics import MetricsWriter, Stop
from .models import ModelError, make_step

if TYPE_CHECKING:
    from dsctl.specs.pipelines import ImagesParams

SHARDING = {
    "parallel_epochs": "OFF", "off": "OFF",
    "distributed_epoch": "DYNAMIC", "dynamic": "DYNAMIC",
    "file": "FILE", "data": "DATA", "file_or_data": "FILE_OR_DATA", "hint": "HINT",
}


IDEAL_COUNT_S = 60.0  # the longest --mode ideal counts a pass whose length TensorFlow cannot tell


def build_input(spec: JobSpec, mode: str, index: int, dispatcher: str | None, cache_dir: Path | str, base_dir: Path,
                repeat: bool = False):
    """The dataset the trainer iterates, for one of the three modes (build_input_and_length)."""
    return build_input_and_length(spec, mode, index, dispatcher, cache_dir, base_dir, repeat)[0]


def build_input_and_length(spec: JobSpec, mode: str, index: int, dispatcher: str | None, cache_dir: Path | str,
                           base_dir: Path, repeat: bool = False):
    """(the dataset the trainer iterates in `mode`, (batches, elements) one pass of the pipeline holds read alone,
    each None when not known or endless).

    repeat=True makes a finite pipeline repeat, for measurements of steady-state
    throughput (sweeps) that must not run out of data. An epoch is one pass over the dataset in every mode:
    ideal replays its first batch as many times as a pass has batches (so a program's epochs stay epochs), and is
    endless only for an endless pipeline.
    """
    import tensorflow as tf

    from dsctl.runtime.pipelines import is_infinite
    from dsctl.runtime.pipelines.spec_pipeline import build_spec_pipeline

    svc = spec.service
    coord = svc.coordinated_reads
    bucketing = (coord.bucket_boundaries, coord.num_consumers) if (coord and mode == "service") else None
    # the builtin or entrypoint, with the spec's pipeline.order and pipeline.options
    ds = build_spec_pipeline(spec, cache_dir=cache_dir, base_dir=base_dir,
                             bucketing=bucketing if spec.pipeline.builtin else None)
    if not spec.pipeline.builtin:
        if (coord or svc.cross_trainer_cache) and mode == "service" and not is_infinite(ds):
            from dsctl.runtime.pipelines.errors import PipelineError

            raise PipelineError(
                f"pipeline.entrypoint: {spec.pipeline.entrypoint} returned a finite dataset, but "
                "coordinated reads and the cross-trainer cache need an infinite one; end it with .repeat()."
            )

    if repeat and not is_infinite(ds):
        ds = ds.repeat()
    length = _pass_length(spec, ds)
    finish = _finisher(spec)
    if mode == "ideal":
        replays = _ideal_pass(spec, ds, length[0])
        return finish(ds).take(1).cache().repeat(replays), (replays if replays >= 0 else None, length[1])
    if mode == "colocated":
        return finish(ds).prefetch(tf.data.AUTOTUNE), length

    service = tf.data.experimental.service
    kwargs = dict(
        processing_mode=getattr(service.ShardingPolicy, SHARDING[svc.processing_mode]),
        service=f"grpc://{dispatcher}",
        job_name=svc.job_name,
        compression=svc.compression,
        max_outstanding_requests=svc.max_outstanding_requests,
    )
    if coord:
        kwargs.update(consumer_index=index, num_consumers=coord.num_consumers)
    if svc.cross_trainer_cache:
        kwargs["cross_trainer_cache"] = service.CrossTrainerCache(trainer_id=f"trainer-{index}")
    if svc.placement != "remote":
        assert dispatcher is not None, "service mode has a dispatcher"
        # auto: Pecan's first phase is remote only; the run's policy asks for local workers later (placement.on_window)
        placement.start(dispatcher, svc.local_workers if svc.placement == "hybrid" else 0,
                        adjustable=svc.placement == "auto")
        kwargs["target_workers"] = placement.TARGET_WORKERS
        return finish(placement.counted(placement.producer_tagged(ds).apply(service.distribute(**kwargs)))), length
    return finish(ds.apply(service.distribute(**kwargs))), length


def _pass_length(spec: JobSpec, ds) -> tuple[int | None, int | None]:
    """(batches, elements) in one pass over the pipeline read alone: a builtin's from its params, an entrypoint's
    batches from TensorFlow's cardinality when it can tell it; None for an endless pipeline."""
    from dsctl.runtime.pipelines import is_infinite
    from dsctl.specs.pipelines import batches_per_pass, examples_per_epoch

    if is_infinite(ds):
        return None, None
    p = spec.pipeline
    if p.builtin is not None:
        epochs = p.params.get("epochs") or 0
        return batches_per_pass(p.builtin, p.params), examples_per_epoch(p.builtin, p.params) * epochs
    cardinality = int(ds.cardinality())
    return (cardinality if cardinality >= 0 else None), None


def _ideal_pass(spec: JobSpec, ds, batches: int | None) -> int:
    """How many batches --mode ideal replays a pass: -1 (endless) for an endless pipeline, else the pass's own
    length, counted here (within IDEAL_COUNT_S) when TensorFlow cannot tell it (after a filter or a flat_map)."""
    from dsctl.runtime.pipelines import PipelineError, is_infinite

    if is_infinite(ds):
        return -1
    if batches is not None:
        return batches
    deadline = time.monotonic() + IDEAL_COUNT_S
    counted = 0
    for _ in ds:
        counted += 1
        if time.monotonic() > deadline:
            raise PipelineError(
                f"pipeline: --mode ideal replays the pipeline's first batch as many times as one pass has batches, so "
                f"that each epoch stays an epoch; TensorFlow cannot tell this pipeline's length, and counting it "
                f"passed {IDEAL_COUNT_S:g} s ({counted} batches so far). Give the dataset its length "
                "(ds.apply(tf.data.experimental.assert_cardinality(N)) in --mode ideal), make it endless and bound "
                "the job with trainer.steps, or measure it in the other modes.")
    return counted


def _finisher(spec: JobSpec):
    """The trainer-side end of a builtin that sends a smaller element than the model gets (images: uint8
    on the wire, float32 to the model), applied after `distribute` and at the same point in the other
    modes so that every mode computes the same thing; the identity for the rest."""
    if spec.pipeline.builtin != "images":
        return lambda ds: ds
    from dsctl.runtime.pipelines import images, validate_params

    params = cast("ImagesParams", validate_params("images", spec.pipeline.params))
    return lambda ds: images.finish(ds, params)


class Harness:
    """dsctl's own training loop: the measured loop (loop.py) calling the model's step per batch."""

    def __init__(self, spec: JobSpec, writer: MetricsWriter, steps: int | None, duration_s: float | None,
                 record_ids: str | None, window_s: float | None = None, record_steps: str | None = None,
                 queue_fill: bool = False):
        self.stop = Stop()
        self.loop = MeasuredLoop(writer, steps=steps, duration_s=duration_s, window_s=window_s or spec.trainer.window_s,
                                 warmup_batches=spec.trainer.warmup_batches, queue_fill=queue_fill,
                                 record_ids=record_ids, record_steps=record_steps, stop=self.stop)

    def run(self, ds, step_fn) -> str:
        """Per batch it only times, counts and calls the step: the benchmark in benchmarks/ holds it to within a
        few percent of a bare loop."""
        loop = self.loop
        for batch in loop.run(ds):
            step_fn(batch, loop.stats)
        loop.finish()
        assert loop.reason is not None, "run() says why it stopped"
        return loop.reason


def main(argv: list[str] | None = None) -> int:
    args = trainer_args.parse(argv, "dsctl-trainer", __doc__)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    spec = JobSpec.model_validate_json(Path(args.spec).read_text())
    steps, duration = args.steps, args.duration_s
    if steps is None and duration is None:
        steps, duration = spec.trainer.steps, spec.trainer.duration_s
    writer = MetricsWriter(args.metrics, args.index)
    keras_model = spec.trainer.model.kind == "keras"
    if not keras_model:  # a keras run says it started once its model is built and restored (restored_step)
        writer.emit("start", pid=os.getpid(), mode=args.mode, restored_step=0)
    harness = Harness(spec, writer, steps, duration, args.record_ids, args.window_s, args.record_steps,
                      queue_fill=args.mode == "service")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: harness.stop.set_by(signum))
    from dsctl.runtime.pipelines.errors import PipelineError

    try:
        cache_dir = args.cache_dir if args.cache_dir.startswith("gs://") else Path(args.cache_dir)
        plan = autocache.plan_for(spec, args.mode, cache_dir)  # None unless the spec has `autocache:`
        if plan is not None and plan.mode == "profile":  # dsctl's profiling phase, not training
            from .autocache_profile import profile

            profile(spec, args.mode, args.dispatcher, cache_dir, Path(args.base_dir), plan, writer)
            return 0
        with autocache.active(plan):
            ds, length = build_input_and_length(spec, args.mode, args.index, args.dispatcher, cache_dir,
                                                Path(args.base_dir), repeat=args.repeat)
        harness.loop.epochs.pass_batches, harness.loop.epochs.pass_examples = length
        autocache.report(plan, writer.emit)
        if keras_model:
            from .keras_runner import train

            train(spec, ds, writer, base_dir=Path(args.base_dir), steps=steps, duration_s=duration,
                  window_s=args.window_s, stop=harness.stop, accelerator=args.accelerator,
                  accelerators=args.accelerators, checkpoint_dir=args.checkpoint_dir, restore_from=args.restore_from,
                  mode=args.mode, then=lambda: _finish_and_exit(plan, writer, args.index))
        else:
            step_fn = make_step(spec.trainer.model, Path(args.base_dir))
            try:
                harness.run(ds, step_fn)
            except Exception as exc:  # noqa: BLE001 - the cache's failure is recovered from; anything else re-raised
                harness.loop.iterator = None  # the failed pipeline goes (its service job, its snapshot writers)
                if not autocache.recover(plan, exc, writer.emit, served=harness.loop.batches, computes_on=True):
                    raise
                print(f"dsctl trainer: {plan.state['reason'] if plan and plan.state else exc}", file=sys.stderr)
                harness.run(_computed(spec, args, cache_dir), step_fn)
        autocache.after_run(plan, writer.emit, args.index)
        placement.finish(writer.emit)
    except (PipelineError, ModelError) as exc:
        writer.emit("error", kind="user", message=str(exc))
        print(f"dsctl trainer: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - reported to the launcher, then a non-zero exit
        # A cache that failed under a keras model's fit: cleaned up, and said in one paragraph naming it.
        told = autocache.recover(plan, exc, writer.emit, served=None, computes_on=False)
        writer.emit("error", kind="runtime", message=told or f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
        return 1
    finally:
        writer.close()
    return 0


def _computed(spec: JobSpec, args: trainer_args.TrainerArgs, cache_dir: Path | str):
    """The job's pipeline without its cache (every hint a no-op), after the cache failed mid-job. Through the service
    it is a new job: a shared job name gets a suffix, as the old job's tasks failed (the other trainers, whose
    tasks failed too, rebuild with the same name and share the new job)."""
    svc = spec.service
    if svc.job_name:
        spec = spec.model_copy(update={"service": svc.model_copy(update={"job_name": f"{svc.job_name}-computed"})})
    with autocache.active(autocache.Plan(mode="compute")):
        return build_input(spec, args.mode, args.index, args.dispatcher, cache_dir, Path(args.base_dir),
                           repeat=args.repeat)


def _finish_and_exit(plan, writer: MetricsWriter, index: int) -> None:
    """What main() does after training, then the exit: called by the keras runner as soon as `fit` is done,
    before `fit` drops its service iterator (slow to destroy, see keras_runner.train)."""
    autocache.after_run(plan, writer.emit, index)
    placement.finish(writer.emit)
    writer.close()
    _exit(0)


def _exit(code: int) -> None:
    """End without the interpreter's teardown, which would destroy the service iterator slowly, but with what a
    normal exit runs: the atexit handlers (TensorFlow's remove the autograph sources it wrote to the temp dir and
    finish asynchronous checkpoint writes)."""
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
