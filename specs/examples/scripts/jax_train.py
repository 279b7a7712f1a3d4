"""A JAX program that reads its input through dsctl: numpy batches, a jitted step, its own checkpoints.

    dsctl up specs/examples/script-jax.yaml
    python specs/examples/scripts/jax_train.py --steps 100   # the same program without dsctl (colocated)

JAX programs read their input with tf.data; here that input is the run's, through the tf.data
service, as NumPy arrays (`train.batches(ds, numpy=True)`). A two-layer network with Adam, written
in plain JAX so that nothing beyond jax itself is needed (`pip install 'dsctl[jax]'`).
"""

import argparse
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from dsctl import train

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


def loss_fn(params, x, y):
    logits = forward(params, x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


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


def save(directory: str, step: int, params, state) -> None:
    """The program's own checkpoint: every array in one .npz, named by its step; then dsctl is told."""
    leaves = jax.tree_util.tree_leaves((params, state))
    os.makedirs(directory, exist_ok=True)
    np.savez(os.path.join(directory, f"step-{step}.npz"), *[np.asarray(leaf) for leaf in leaves])
    train.checkpoint_saved(step)


def restore(directory: str, step: int, params, state):
    with np.load(os.path.join(directory, f"step-{step}.npz")) as saved:
        leaves = [jnp.asarray(saved[f"arr_{i}"]) for i in range(len(saved.files))]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure((params, state)), leaves)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spec", default=str(HERE.parent / "script-jax.yaml"), help="the job spec (without dsctl)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300, help="steps to train (through dsctl, trainer.steps caps them)")
    ap.add_argument("--save-every", type=int, default=100)
    args = ap.parse_args()

    ds = train.dataset(spec=args.spec)
    crop = ds.element_spec["image"].shape[1]
    params = init(jax.random.PRNGKey(0), [crop * crop * 3, args.hidden, 10])
    state = (jax.tree_util.tree_map(jnp.zeros_like, params), jax.tree_util.tree_map(jnp.zeros_like, params), 0)
    step = train.resume_step()
    if step:  # dsctl up --resume: the arrays saved at the step the run continues from
        params, state = restore(train.checkpoint_dir(), step, params, state)
        print(f"restored step {step}", flush=True)
    update = adam(args.lr)

    @jax.jit
    def train_step(params, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        params, state = update(grads, state, params)
        return params, state, loss

    for batch in train.batches(ds, numpy=True):
        x = batch["image"].reshape(batch["image"].shape[0], -1)
        params, state, loss = train_step(params, state, x, batch["label"].astype(np.int32))
        step += 1
        train.report(loss=loss)
        if step % args.save_every == 0:
            save(train.checkpoint_dir(), step, params, state)
        if step >= args.steps:  # the pipeline repeats: the program's own --steps ends its loop
            break
    save(train.checkpoint_dir(), step, params, state)
    print(f"trained to step {step}, last loss {float(loss):.4f}", flush=True)


if __name__ == "__main__":
    main()
