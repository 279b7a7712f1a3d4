"""An epoch loop with evaluation, in JAX, in the shape of Flax's MNIST example, reading its input through dsctl.

    dsctl up specs/examples/script-jax-epochs.yaml                    # through the tf.data service, measured
    dsctl up specs/examples/script-jax-epochs.yaml --mode colocated   # or ideal
    python specs/examples/scripts/jax_epochs.py --num_epochs 6        # the same program without dsctl

Flax's example trains for `--num_epochs` epochs over `tfds.load("mnist")`, evaluating on the test split after
each. Here the data is digits.py's (made offline, nothing to download), the network a two-layer perceptron in
plain JAX (no Flax or Optax needed: `pip install 'dsctl[jax]'`), and what dsctl changes is three lines:

    train_ds = train.dataset(spec=args.spec)                  # was: the program's own tf.data pipeline
    for batch in train.batches(train_ds, numpy=True):         # was: for batch in train_ds.as_numpy_iterator()
        ... train.report(loss=loss)                           # the loss, into the run's record and TensorBoard

The test split stays the program's own, built and read here (never through the service, never measured). The
spec gives no trainer.steps: the program's epochs decide the job's length, inside dsctl and outside it alike.
"""

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from dsctl import train

import digits

HERE = Path(__file__).resolve().parent


def init(key, sizes):
    params = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (fan_in, fan_out)) * jnp.sqrt(2.0 / fan_in), jnp.zeros(fan_out)))
    return params


def forward(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def cross_entropy(logits, labels):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


def adam(lr, b1=0.9, b2=0.999, eps=1e-8):
    def update(grads, state, params):
        m, v, t = state
        t = t + 1
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        scale = lr * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        params = jax.tree_util.tree_map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), params, m, v)
        return params, (m, v, t)
    return update


def flat(batch):
    return batch["image"].reshape(batch["image"].shape[0], -1), batch["label"].astype(np.int32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spec", default=str(HERE.parent / "script-jax-epochs.yaml"), help="the job spec (without dsctl)")
    ap.add_argument("--num_epochs", type=int, default=4)
    ap.add_argument("--learning_rate", type=float, default=3e-3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--eval_batch_size", type=int, default=256)
    args = ap.parse_args()

    train_ds = train.dataset(spec=args.spec)  # the spec's pipeline (digits.make_dataset), as this run reads it
    test_ds = digits.make_dataset(split="test", batch_size=args.eval_batch_size, examples=1024)  # the program's own
    params = init(jax.random.PRNGKey(0), [digits.SIDE * digits.SIDE, args.hidden, digits.CLASSES])
    state = (jax.tree_util.tree_map(jnp.zeros_like, params), jax.tree_util.tree_map(jnp.zeros_like, params), 0)
    update = adam(args.learning_rate)

    @jax.jit
    def train_step(params, state, x, y):
        loss, grads = jax.value_and_grad(lambda p: cross_entropy(forward(p, x), y))(params)
        params, state = update(grads, state, params)
        return params, state, loss

    @jax.jit
    def eval_step(params, x, y):
        logits = forward(params, x)
        return cross_entropy(logits, y) * x.shape[0], jnp.sum(jnp.argmax(logits, -1) == y)

    for epoch in range(1, args.num_epochs + 1):
        t0, losses = time.perf_counter(), []
        for batch in train.batches(train_ds, numpy=True):
            params, state, loss = train_step(params, state, *flat(batch))
            losses.append(float(loss))
            train.report(loss=loss)
        total, right, n = 0.0, 0, 0
        for batch in test_ds.as_numpy_iterator():  # evaluation: the program's own time, outside its training
            x, y = flat(batch)
            batch_loss, batch_right = eval_step(params, x, y)
            total, right, n = total + float(batch_loss), right + int(batch_right), n + len(y)
        print(f"epoch {epoch}: {len(losses)} batches, train loss {np.mean(losses):.4f}, test loss {total / n:.4f}, "
              f"test accuracy {right / n:.4f} ({time.perf_counter() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
