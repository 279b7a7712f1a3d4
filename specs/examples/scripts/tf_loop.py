"""A TensorFlow custom training loop (tf.GradientTape) that reads its input through dsctl.

    dsctl up specs/examples/script-tf-loop.yaml            # through the tf.data service, measured
    python specs/examples/scripts/tf_loop.py --steps 100    # the same program without dsctl (colocated)

A small convolutional classifier learns the `images` builtin's labels. Everything dsctl-specific is
the `train.` calls: the dataset, the measured batches, the loss reported, the strategy, and the
checkpoints that `dsctl up --resume RUN` continues from.
"""

import argparse
from pathlib import Path

import keras
import tensorflow as tf

from dsctl import train

HERE = Path(__file__).resolve().parent


def build(num_classes: int, crop: int) -> keras.Model:
    return keras.Sequential([
        keras.Input((crop, crop, 3)),
        keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(num_classes),
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spec", default=str(HERE.parent / "script-tf-loop.yaml"), help="the job spec (without dsctl)")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=300, help="steps to train (through dsctl, trainer.steps caps them)")
    ap.add_argument("--save-every", type=int, default=50, help="steps between checkpoints")
    args = ap.parse_args()

    ds = train.dataset(spec=args.spec)  # {"image": float32 [B, H, W, 3], "label": int64 [B]}
    image_spec = ds.element_spec["image"]
    with train.strategy().scope():
        model = build(num_classes=10, crop=image_spec.shape[1])
        optimizer = keras.optimizers.Adam(args.lr)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, train.checkpoint_dir(), max_to_keep=2)
    step = train.resume_step()
    if step:  # dsctl up --resume: the checkpoint of the step the run continues from
        checkpoint.restore(f"{train.checkpoint_dir()}/ckpt-{step}").assert_existing_objects_matched()
        print(f"restored step {step}", flush=True)

    @tf.function
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    for batch in train.batches(ds):  # the pipeline repeats: the program's own --steps ends its loop
        loss = train_step(batch["image"], batch["label"])
        step += 1
        train.report(loss=loss)
        if step % args.save_every == 0:
            manager.save(checkpoint_number=step)
            train.checkpoint_saved(step)
        if step >= args.steps:
            break
    manager.save(checkpoint_number=step)
    train.checkpoint_saved(step)
    print(f"trained to step {step}, last loss {float(loss):.4f}", flush=True)


if __name__ == "__main__":
    main()
