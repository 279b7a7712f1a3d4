"""dsctl.train: all a training program needs to read its input through dsctl and be measured.

Put your program in the spec (`trainer.command: python train.py --lr 0.1`) and read the run's data
through this module; `dsctl up job.yaml` then runs it as each trainer, through the tf.data service
(or colocated, or ideal, by --mode), and measures it as it measures its own trainers:

    from dsctl import train

    ds = train.dataset(spec="job.yaml")          # the spec's pipeline, as this run reads it
    for epoch in range(num_epochs):
        for batch in train.batches(ds):          # one pass over a finite pipeline: one epoch
            loss = step(batch)
            train.report(loss=loss)              # into the run's record and TensorBoard
        evaluate()                               # the program's own time, recorded apart

The same program also runs without dsctl (`python train.py`): then `dataset(spec=...)` builds
that spec's pipeline in this process, and nothing of the spec bounds the program: its own loop
(its epochs, its flags) decides how long it reads. Inside a run, the run's own spec is used
whatever `spec` says, so the argument may stay.

- dataset(spec=None): a `tf.data.Dataset` of the spec's pipeline as this run reads it: through the
  run's tf.data service with the spec's processing mode, sharding, job name, coordinated reads
  (this trainer's consumer index), compression and cross-trainer cache; or colocated; or ideal.
- batches(ds, numpy=False): iterates `ds` and is what dsctl measures: batches/s, batch time and
  input stall (the time the program waits for its next batch), in the same metrics windows as
  every trainer, so `runs show`, `cost report`, sweeps, autoscaling and TensorBoard work as for any
  run. Each call is one pass (an epoch of a finite pipeline, recorded as one), and the time
  between calls is the program's own (evaluation, checkpoints), recorded apart. Inside a run it
  stops at trainer.steps batches over all passes (a cap; less the step a resumed run continues
  from), after trainer.duration_s, or when the run stops the program (SIGTERM, for a program that
  does not handle it itself): the program then goes on after its loop, to save and exit. Asking
  for batches after the cap was reached is an error naming trainer.steps. numpy=True yields
  NumPy arrays (for JAX).
- report(**scalars): the program's own figures (loss=..., accuracy=...), averaged per window.
- keras_callback(): measures a `model.fit` the program runs itself; give fit the dataset through
  the callback: `cb = train.keras_callback(); model.fit(cb.input(ds), callbacks=[cb])`. The
  program's own `validation_data=` works: each epoch is recorded with its val_ metrics, and the
  validation's time is the program's own, not training's.
- strategy(): the tf.distribute strategy the trainer machine calls for (TPUStrategy on a TPU VM,
  MirroredStrategy on several GPUs, else the default one).
- checkpoint_dir(): where this trainer saves its checkpoints (local or gs://; needs
  trainer.checkpoint in the spec); under `dsctl up --resume RUN` it already holds RUN's, to restore.
- checkpoint_saved(step): say that the checkpoint for global step `step` is saved in
  checkpoint_dir(); `--resume` continues from the last step said.
- resume_step(): the global step this run continues from (0 unless resumed).
- steps(): the cap on the job's length, trainer.steps (None for a job bounded by trainer.duration_s or
  by its pipeline's end, and outside a run, where nothing of the spec bounds the program).
- index(): which of the job's trainers this is, 0 to trainer.count - 1 (0 outside a run).

Errors in the program's use of this module raise TrainError, whose message says what to change.
"""

from dsctl.runtime.client import (
    TrainError,
    batches,
    checkpoint_dir,
    checkpoint_saved,
    dataset,
    index,
    keras_callback,
    report,
    resume_step,
    steps,
    strategy,
)

__all__ = ["TrainError", "batches", "checkpoint_dir", "checkpoint_saved", "dataset", "index", "keras_callback",
           "report", "resume_step", "steps", "strategy"]
