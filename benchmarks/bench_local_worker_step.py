"""Does an in-process worker slow the model's own step? The model step time with and without local workers, one run.

    python benchmarks/bench_local_worker_step.py [--steps 600] [--rounds 2] [--cpu-work 16] [--local 0,1,2]

The same Keras job (an MLP on the CPU, fit by dsctl's Keras runner) through `dsctl up`, one remote worker, with
service.placement: remote (0 local workers) and hybrid with 1 and 2 in-process workers, alternating in --rounds
rounds. The pipeline is `synthetic` with --cpu-work 64x64 matmuls per element, so a worker burns CPU. Printed for
each: batches/s, the input stall, the model's own step time per batch (the run summary's model_step_s: the batch time
less the input wait), and the batches the trainer read from its own process and from the remote worker (its
placement record). The ratio model step with k local workers ÷ without is the CPU the local workers took from the
model; the batches/s ratio says whether the run gained more from them than it lost. Medians over rounds; measured
here, on 2 shared cores (a trainer host with idle cores would lose less).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

MODEL = '''
import keras

def build_model(features=128, classes=8, width=512):
    inputs = keras.Input((features,))
    x = keras.layers.Dense(width, activation="relu")(inputs)
    x = keras.layers.Dense(width, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(classes)(x))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
'''

SPEC = """\
name: local-step-{local}
service: {{workers: 1, placement: {placement}, local_workers: {local}}}
trainer: {{steps: {steps}, warmup_batches: 20, model: {{kind: keras, entrypoint: "mlp:build_model"}}}}
pipeline: {{builtin: synthetic, params: {{feature_size: 128, label_classes: 8, batch_size: 64, cpu_work: {cpu_work},
            epochs: null}}}}
"""


def run(folder: Path, home: Path, local: int, steps: int, cpu_work: int) -> dict:
    spec = folder / f"local-{local}.yaml"
    spec.write_text(SPEC.format(local=local, placement="hybrid" if local else "remote", steps=steps, cpu_work=cpu_work))
    done = subprocess.run([sys.executable, "-m", "dsctl.cli.main", "up", str(spec), "--json"], capture_output=True,
                          text=True, env={**os.environ, "DSCTL_HOME": str(home)}, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"dsctl up failed for {local} local worker(s):\n{done.stdout}\n{done.stderr}")
    record = json.loads(done.stdout)
    s = record["summary"]
    metrics = home / "runs" / record["id"] / "metrics" / "trainer-0.jsonl"
    placed = [json.loads(line) for line in metrics.read_text().splitlines() if '"placement"' in line]
    place = placed[-1] if placed else {}
    return {"local": local, "batches_per_s": s["batches_per_s"], "input_stall_frac": s["input_stall_frac"],
            "model_step_s": s["model_step_s"], "local_batches": place.get("local_batches", 0),
            "remote_batches": place.get("remote_batches", s["batches"]), "run": record["id"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cpu-work", type=int, default=16)
    ap.add_argument("--local", default="0,1,2", help="local worker counts to run (0: placement remote)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    counts = [int(x) for x in a.local.split(",")]
    folder = Path(tempfile.mkdtemp(prefix="dsctl-local-step-"))
    (folder / "mlp.py").write_text(MODEL)
    home = folder / "home"
    results: dict[int, list[dict]] = {k: [] for k in counts}
    for r in range(a.rounds):
        for k in counts:
            got = run(folder, home, k, a.steps, a.cpu_work)
            results[k].append(got)
            print(f"  round {r + 1}: {k} local worker(s): {got['batches_per_s']:.2f} batches/s, input stall "
                  f"{got['input_stall_frac']:.1%}, model step {got['model_step_s'] * 1e3:.2f} ms; batches from own "
                  f"process {got['local_batches']}, remote {got['remote_batches']}", flush=True)
    base = counts[0]
    print(f"\nModel step with local workers, Keras MLP (2x512) on synthetic cpu_work {a.cpu_work}, batch 64, 1 remote "
          f"worker, {a.steps} steps; medians of {a.rounds} round(s) [measured here]")
    out = {}
    for k in counts:
        step = median(x["model_step_s"] for x in results[k])
        bps = median(x["batches_per_s"] for x in results[k])
        stall = median(x["input_stall_frac"] for x in results[k])
        out[k] = {"model_step_s": step, "batches_per_s": bps, "input_stall_frac": stall, "rounds": results[k]}
        ratio = "" if k == base else (f"   model step ÷ {base} local: {step / out[base]['model_step_s']:.2f}x, "
                                      f"batches/s ÷ {base} local: {bps / out[base]['batches_per_s']:.2f}x")
        print(f"  {k} local worker(s): model step {step * 1e3:7.2f} ms   {bps:6.2f} batches/s   input stall "
              f"{stall:6.1%}{ratio}")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
