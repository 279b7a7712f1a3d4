"""A Keras script in the shape of Keras's mnist_convnet.py (compile, then fit with validation), through dsctl.

    dsctl up specs/examples/script-keras-validation.yaml
    python specs/examples/scripts/keras_validation.py --epochs 3      # the same script without dsctl

Keras's example loads MNIST with `keras.datasets.mnist.load_data()`, fits with `validation_split=0.1` and
evaluates on the test set. Here the data is digits.py's (made offline), and what dsctl changes is:

    ds = train.dataset(spec=args.spec)                        # was: x_train, y_train as NumPy arrays
    meter = train.keras_callback()                            # measures the fit
    model.fit(meter.input(ds), epochs=..., validation_data=val, callbacks=[meter])   # was: validation_split=0.1

`validation_split` slices NumPy arrays and Keras refuses it for a dataset (the run's data is one), so the
validation data is the program's own: a held-out split it builds itself and gives fit as `validation_data`.
dsctl measures the training batches only; the validation fit runs after each epoch is the program's own time,
recorded apart (outside training), and its metrics (val_loss, val_accuracy) are recorded with each epoch.
"""

import argparse
from pathlib import Path

import keras

from dsctl import train

import digits

HERE = Path(__file__).resolve().parent


def xy(batch):
    return batch["image"], batch["label"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spec", default=str(HERE.parent / "script-keras-validation.yaml"),
                    help="the job spec (without dsctl)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--validation_examples", type=int, default=512)
    args = ap.parse_args()

    ds = train.dataset(spec=args.spec).map(xy)  # the run's training data
    val = digits.make_dataset(split="test", batch_size=256, examples=args.validation_examples).map(xy)
    with train.strategy().scope():
        model = keras.Sequential([
            keras.Input(shape=(digits.SIDE, digits.SIDE, 1)),
            keras.layers.Conv2D(16, kernel_size=(3, 3), activation="relu"),
            keras.layers.MaxPooling2D(pool_size=(2, 2)),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(digits.CLASSES, activation="softmax"),
        ])
        model.compile(loss="sparse_categorical_crossentropy", optimizer=keras.optimizers.Adam(3e-3),
                      metrics=["accuracy"])
    meter = train.keras_callback()
    model.fit(meter.input(ds), epochs=args.epochs, validation_data=val, callbacks=[meter], verbose=2)
    score = model.evaluate(val, verbose=0)
    print(f"Test loss: {score[0]:.4f}", flush=True)
    print(f"Test accuracy: {score[1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
