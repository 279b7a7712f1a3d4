"""A keras trainer's checkpoints in-process: saved on the global step's grid, restored with the optimizer's state,
and every unusable restore directory is one paragraph naming it."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.integration  # trains Keras models in this process (TensorFlow is imported when the file is)

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from dsctl.runtime import checkpoint  # noqa: E402
from dsctl.runtime.models import ModelError  # noqa: E402


def tiny(seed: int = 0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.optimizer.build(model.trainable_variables)
    return model


def train(model, steps: int) -> None:
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = np.argmax(x[:, :3], axis=1)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat(), steps_per_epoch=steps, epochs=1, verbose=0)


def test_restore_brings_back_weights_optimizer_and_step(tmp_path):
    model = tiny()
    train(model, 7)
    saver = checkpoint.Saver(model, str(tmp_path), every_steps=5)
    assert saver.save(7).endswith("ckpt-7") and saver.last_step == 7
    fresh = tiny(seed=1)
    assert not np.allclose(fresh.get_weights()[0], model.get_weights()[0])
    assert checkpoint.restore(fresh, str(tmp_path)) == 7
    for a, b in zip(fresh.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(fresh.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_saves_fall_on_multiples_of_the_global_step():
    saver = checkpoint.Saver.__new__(checkpoint.Saver)
    saver.every_steps, saver._passed = 15, 40  # a run restored at step 40
    assert [s for s in range(41, 101) if saver.due(s)] == [45, 60, 75, 90]
    saver._passed = 0
    assert [s for s in (4, 8, 12, 16, 20, 24, 28, 32) if saver.due(s)] == [16, 32]  # steps_per_execution 4, every 15


@pytest.mark.parametrize("damage", ["missing", "empty", "truncated", "garbage-index", "another-model"])
def test_an_unusable_restore_dir_is_one_paragraph_naming_it(tmp_path, damage):
    directory = tmp_path / "ck"
    if damage != "missing":
        directory.mkdir()
    if damage in ("truncated", "garbage-index", "another-model"):
        model = tiny()
        checkpoint.Saver(model, str(directory), every_steps=None).save(3)
        if damage == "truncated":
            data = next(directory.glob("ckpt-3.data-*"))
            data.write_bytes(data.read_bytes()[:100])
        elif damage == "garbage-index":
            (directory / "ckpt-3.index").write_text("garbage")
    if damage == "another-model":
        inputs = keras.Input((6,))
        other = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(5)(inputs)))
        other.compile(optimizer="sgd", loss="mse")
        other.optimizer.build(other.trainable_variables)
        target = other
    else:
        target = tiny()
    with pytest.raises(ModelError) as info:
        checkpoint.restore(target, str(directory))
    message = str(info.value)
    assert message.startswith(f"cannot resume from {directory}: ") and "\n" not in message
    assert "start the run afresh" in message
