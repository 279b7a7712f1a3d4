"""A Keras training script that calls model.fit itself, with its own flags and callbacks, through dsctl.

    dsctl up specs/examples/script-keras.yaml
    python specs/examples/scripts/keras_fit.py --epochs 2     # the same script without dsctl (colocated)

dsctl measures the fit through `train.keras_callback()`, which also bounds it to the run's steps;
the script keeps its own callbacks (here: learning-rate decay and a checkpoint every N steps).
"""

import argparse
from pathlib import Path

import keras
import tensorflow as tf

from dsctl import train

HERE = Path(__file__).resolve().parent


class SaveEvery(keras.callbacks.Callback):
    """The script's own checkpointing: model, optimizer and step every `every` global steps."""

    def __init__(self, checkpoint: tf.train.Checkpoint, directory: str, every: int):
        super().__init__()
        self.manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=2)
        self.every = every

    def save(self) -> None:
        step = int(self.model.optimizer.iterations.numpy())
        if step != train.resume_step() and self.manager.latest_checkpoint != f"{self.manager.directory}/ckpt-{step}":
            self.manager.save(checkpoint_number=step)
            train.checkpoint_saved(step)

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) % self.every == 0:
            self.save()

    def on_train_end(self, logs=None):
        self.save()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spec", default=str(HERE.parent / "script-keras.yaml"), help="the job spec (without dsctl)")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps-per-epoch", type=int, default=100)
    ap.add_argument("--save-every", type=int, default=100)
    args = ap.parse_args()

    ds = train.dataset(spec=args.spec).map(lambda e: (e["image"], e["label"]))
    with train.strategy().scope():
        crop = ds.element_spec[0].shape[1]
        model = keras.Sequential([
            keras.Input((crop, crop, 3)),
            keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=keras.optimizers.Adam(args.lr),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        model.optimizer.build(model.trainable_variables)

    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    start = train.resume_step()
    if start:
        checkpoint.restore(f"{train.checkpoint_dir()}/ckpt-{start}").assert_existing_objects_matched()
    meter = train.keras_callback()
    decay = keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.7 if epoch else lr)
    model.fit(meter.input(ds), epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2,
              callbacks=[meter, decay, SaveEvery(checkpoint, train.checkpoint_dir(), args.save_every)])


if __name__ == "__main__":
    main()
