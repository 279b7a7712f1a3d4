"""What a user's training program imports as `dsctl.train` (dsctl_pkg/train.py re-exports it).

Inside a dsctl run (trainer.command, started by runtime/command.py) the environment variable
DSCTL_TRAINER says everything about the run; outside one, `dataset(spec="job.yaml")` reads that
spec and builds its pipeline in this process (colocated), so the same program runs with plain
`python train.py` too. See dsctl_pkg/train.py for the functions' contract.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import saved, trainer_args
from .loop import MeasuredLoop, Scalars
from .metrics import MetricsWriter, Stop


class TrainError(Exception):
    """A program used dsctl.train in a way the run cannot measure or honour; the message says what to change."""


@dataclass
class _Run:
    """This process's view of its run: its spec, what it was told, and what it measured so far."""

    spec: Any  # JobSpec
    args: trainer_args.TrainerArgs | None  # None outside a dsctl run
    base_dir: Path
    writer: MetricsWriter | None = None
    started: bool = False
    plan: Any = None  # the autocache plan of the dataset built (runtime/autocache.py)
    loop: MeasuredLoop | None = None
    keras: Any = None  # the keras callback, when the program trains with model.fit
    scalars: Scalars = field(default_factory=Scalars)
    stop: Stop = field(default_factory=Stop)
    checkpoint_step: int | None = None
    spec_path: Path | None = None  # outside a run: the spec read
    pass_length: tuple[int | None, int | None] = (None, None)  # (batches, elements) of one pass read alone, if known

    @property
    def inside(self) -> bool:
        return self.args is not None

    @property
    def mode(self) -> str:
        return self.args.mode if self.args else "colocated"

    @property
    def index(self) -> int:
        return self.args.index if self.args else 0

    def bounds(self) -> tuple[int | None, float | None]:
        """(steps, duration_s) of the whole job, as the harness takes them: the launch's overrides, else the spec's.
        Outside a run, nothing: a program run on its own is as long as its own loop (its epochs, its flags)."""
        if self.args is None:
            return None, None
        if self.args.steps is not None or self.args.duration_s is not None:
            return self.args.steps, self.args.duration_s
        return self.spec.trainer.steps, self.spec.trainer.duration_s

    def budget(self) -> int | None:
        """Batches this process may read: the job's steps less those a resumed run had already trained."""
        steps, _ = self.bounds()
        return None if steps is None else max(steps - resume_step(), 0)

    def emit(self, event: str, **fields) -> None:
        if self.writer is not None:
            self.writer.emit(event, **fields)

    def fail(self, message: str, kind: str = "user") -> TrainError:
        """A TrainError, recorded first so the run's error says it in one paragraph (runtime/command.py)."""
        self.emit("error", kind=kind, message=message, source="dsctl.train")
        return TrainError(message)


_RUN: _Run | None = None
_LOCK = threading.Lock()


def _current(spec: str | os.PathLike | None = None, *, needed_by: str) -> _Run:
    global _RUN
    with _LOCK:
        if _RUN is not None and (_RUN.inside or spec is None or Path(spec).resolve() == _RUN.spec_path):
            return _RUN  # inside a run, the run's spec whatever the program names: the same program runs both ways
        args = trainer_args.from_environment()
        if args is not None:
            from dsctl.specs.schema import JobSpec

            run = _Run(spec=JobSpec.model_validate_json(Path(args.spec).read_text()), args=args,
                       base_dir=Path(args.base_dir).resolve(), writer=MetricsWriter(args.metrics, args.index))
            atexit.register(_finish)
        elif spec is not None:
            from dsctl.specs import load_spec

            loaded = load_spec(spec, check_entrypoints=False)
            run = _Run(spec=loaded.spec, args=None, base_dir=loaded.base_dir, spec_path=Path(spec).resolve())
        else:
            raise TrainError(f"dsctl.train.{needed_by}: this program is not running under dsctl (no DSCTL_TRAINER in "
                             "its environment), so it needs the job spec to read: call "
                             "dsctl.train.dataset(spec='job.yaml') first, or run it with `dsctl up job.yaml`.")
        _RUN = run
        return run


def _finish() -> None:
    """At the program's exit: the end record of a loop that did not write one (it ended with its data)."""
    run = _RUN
    if run is not None and run.loop is not None and not run.loop.finished:
        run.loop.finish()
        _after_run(run)


def _cache_dir(run: _Run) -> str | Path:
    if run.args is not None:
        return run.args.cache_dir if run.args.cache_dir.startswith("gs://") else Path(run.args.cache_dir)
    return Path(os.environ.get("DSCTL_HOME") or Path.home() / ".dsctl") / "cache"


def dataset(spec: str | os.PathLike | None = None):
    from . import autocache
    from .pipelines.errors import PipelineError
    from .trainer import build_input_and_length

    run = _current(spec, needed_by="dataset()")
    args = run.args
    cache_dir = _cache_dir(run)
    plan = autocache.plan_for(run.spec, run.mode, cache_dir)
    try:
        with autocache.active(plan):
            ds, run.pass_length = build_input_and_length(run.spec, run.mode, run.index,
                                                         args.dispatcher if args else None, cache_dir, run.base_dir,
                                                         repeat=bool(args and args.repeat))
    except PipelineError as exc:
        raise run.fail(str(exc)) from None
    if not run.started:
        run.started = True
        run.plan = plan
        run.emit("start", pid=os.getpid(), mode=run.mode, restored_step=resume_step(), trainer="command",
                 pass_batches=run.pass_length[0], pass_examples=run.pass_length[1])
        autocache.report(plan, run.emit)
    return ds


def _loop(run: _Run) -> MeasuredLoop:
    if run.loop is None:
        steps, duration = run.bounds()
        args = run.args
        run.loop = MeasuredLoop(
            run.writer, steps=run.budget(), duration_s=duration,
            window_s=(args.window_s if args and args.window_s else run.spec.trainer.window_s),
            warmup_batches=run.spec.trainer.warmup_batches, queue_fill=run.mode == "service" and run.inside,
            record_ids=args.record_ids if args else None, record_steps=args.record_steps if args else None,
            stop=run.stop, first_step=resume_step(), scalars=run.scalars, pass_length=run.pass_length)
        run.loop.checkpoint_step = run.checkpoint_step
    return run.loop


def batches(ds, numpy: bool = False) -> Iterator[Any]:
    run = _current(needed_by="batches()")
    if not run.started and run.inside:
        raise run.fail("dsctl.train.batches() was given a dataset before dsctl.train.dataset() was called; read the "
                       "run's data with ds = dsctl.train.dataset(), then iterate dsctl.train.batches(ds).")
    loop = _loop(run)
    if loop.exhausted:
        raise run.fail(_read_past(run, loop))
    convert = _to_numpy if numpy else None
    previous = _on_stop(run)
    try:
        yield from loop.run(ds, convert)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if loop.exhausted:  # steps, duration or a stop: the run's measurement is complete
        loop.finish()
        _after_run(run)


def _read_past(run: _Run, loop: MeasuredLoop) -> str:
    """What to tell a program that asks for batches after the run's were all read: the field that ended them (its
    line is then shown), how far its epochs got, and what to change."""
    steps, duration = run.bounds()
    epochs = loop.epochs
    got = (f"in {epochs.count} full epoch(s) of {_lengths(epochs.batches)} batches"
           + (f" and {loop.batches - sum(epochs.batches)} of the next" if loop.batches > sum(epochs.batches) else "")
           if epochs.count else f"before its first epoch ended ({loop.batches} batches)")
    if loop.reason == "signal":
        return (f"dsctl.train.batches() was called again after the run stopped the program (a teardown, or a sweep "
                f"changing its trainers), {got}; end the program once its loop over dsctl.train.batches(ds) ends.")
    if loop.reason == "duration":
        return (f"trainer.duration_s: the program asked for more batches after trainer.duration_s ({duration:g} s) "
                f"ended the job, {got}. End the program's own loop when dsctl.train.batches(ds) yields nothing more, "
                "or remove trainer.duration_s and let the program's epochs decide.")
    resumed = f" (less the {resume_step()} a resumed run had trained)" if resume_step() else ""
    svc = run.spec.service
    alone = epochs.pass_batches
    if (run.mode == "service" and svc.processing_mode in ("parallel_epochs", "off") and epochs.count and alone
            and epochs.batches[0] > alone):
        return (f"service.processing_mode: the program asked for more batches once all {steps} that trainer.steps "
                f"allows{resumed} were read, {got}, where its pipeline read alone has {alone} a pass: with processing_mode "
                f"{svc.processing_mode} every worker produces the whole dataset, so each epoch held a copy per worker. "
                "Use processing_mode: distributed_epoch (one copy per epoch), and remove trainer.steps to let the "
                "program's epochs decide the job's length, or raise it.")
    copies = (f" With processing_mode {svc.processing_mode} and several workers, each produces the whole dataset, so "
              "each epoch through the service holds a copy per worker; processing_mode: distributed_epoch reads one."
              if run.mode == "service" and svc.processing_mode in ("parallel_epochs", "off") and epochs.count
              and alone is None else "")  # the pass's length read alone unknown: the copies cannot be told here
    return (f"trainer.steps: the program asked for more batches once all {steps} that trainer.steps allows (the cap "
            f"on the job's training steps){resumed} were read, {got}. Remove trainer.steps and the program's own loop (its "
            f"epochs) decides the job's length, or raise it to the batches the program reads.{copies}")


def _lengths(batches: list[int]) -> str:
    """'64' when every epoch had 64 batches, else '64, 63, 64'."""
    return str(batches[0]) if len(set(batches)) == 1 else ", ".join(map(str, batches[:10])) + (
        ", ..." if len(batches) > 10 else "")


def _after_run(run: _Run) -> None:
    from . import autocache, placement

    autocache.after_run(run.plan, run.emit, run.index)
    placement.finish(run.emit)


def _on_stop(run: _Run):
    """While batches() runs in the main thread of a program that did not handle SIGTERM itself: SIGTERM (the run
    tearing down, a sweep changing its trainers) ends the loop after the current batch, so the program goes on to
    save and exit. The previous handler, to put back; None where nothing was changed."""
    if not run.inside or threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def stop(signum, frame):
        run.stop.set_by(signum)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the program

    signal.signal(signal.SIGTERM, stop)
    return signal.SIG_DFL


def _to_numpy(batch):
    import tensorflow as tf

    return tf.nest.map_structure(lambda t: t.numpy(), batch)


def report(**scalars) -> None:
    run = _current(needed_by="report()")
    values = {}
    for name, value in scalars.items():
        try:
            values[name] = float(value)
        except (TypeError, ValueError):
            raise run.fail(f"dsctl.train.report({name}=...): a reported figure is one number (a float, a NumPy or "
                           f"tensor scalar), got {type(value).__name__}.") from None
    run.scalars.add(values)


def keras_callback():
    from .keras_script import ScriptMeter

    run = _current(needed_by="keras_callback()")
    if run.keras is None:
        steps, duration = run.bounds()
        run.keras = ScriptMeter(run, budget=run.budget(), duration_s=duration, first_step=resume_step(),
                                on_end=lambda: _after_run(run))
    return run.keras


def strategy():
    from . import strategy as strategies

    run = _current(needed_by="strategy()")
    args = run.args
    return strategies.make(strategies.choose(args.accelerator if args else "none", args.accelerators if args else 0))


def resume_step() -> int:
    # Read from the environment, not from _RUN: a program restores its checkpoint before it builds its input.
    args = trainer_args.from_environment()
    return args.resume_step if args is not None else 0


def index() -> int:
    args = trainer_args.from_environment()
    return args.index if args is not None else 0


def steps() -> int | None:
    run = _current(needed_by="steps()")
    return run.bounds()[0]  # the launch's (a sweep's points run on a duration: None), else the spec's


def checkpoint_dir() -> str:
    run = _current(needed_by="checkpoint_dir()")
    if run.args is not None:
        if not run.args.checkpoint_dir:
            raise run.fail("dsctl.train.checkpoint_dir(): this run's spec has no trainer.checkpoint section; add "
                           "trainer.checkpoint: {dir: checkpoints} (a folder, or gs://bucket/path on Google Cloud).")
        return run.args.checkpoint_dir
    ck = run.spec.trainer.checkpoint
    if ck is None:
        raise TrainError("dsctl.train.checkpoint_dir(): the spec has no trainer.checkpoint section; add "
                         "trainer.checkpoint: {dir: checkpoints}.")
    if ck.dir.startswith("gs://"):
        return f"{ck.dir.rstrip('/')}/standalone/trainer-0"
    base = Path(ck.dir).expanduser()
    return str((base if base.is_absolute() else run.base_dir / base) / "standalone" / "trainer-0")


def checkpoint_saved(step: int) -> None:
    run = _current(needed_by="checkpoint_saved()")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise run.fail(f"dsctl.train.checkpoint_saved(step): step is the global training step the checkpoint holds, "
                       f"a whole number >= 0; got {step!r}.")
    path = saved.write(checkpoint_dir(), step)
    run.checkpoint_step = step
    if run.loop is not None:
        run.loop.checkpoint_step = step
    if run.keras is not None:
        run.keras.checkpoint_step = step
    run.emit("checkpoint", step=step, path=path.rsplit("/", 1)[0])
