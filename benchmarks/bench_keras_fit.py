"""Benchmark of what dsctl adds to `model.fit`: its metrics callback and the input meter around the dataset.

    python benchmarks/bench_keras_fit.py [--steps 200] [--rounds 3] [--mode service|ideal]

One dispatcher and one worker in this process serve the `images` builtin (40-pixel JPEGs
cropped to 32, batches of 32, uint8 on the wire, finished on the trainer as dsctl does); the
compact ResNet example (specs/examples/models/compact_resnet.py) trains on it with
`model.fit(steps_per_epoch=STEPS)`, alternately
  - bare: the service dataset mapped to (image, label), no callback;
  - dsctl: the same dataset through runtime/keras_input.py's meter, with runtime/keras_runner.py's
    Meter callback writing windows to a file, as a keras trainer runs it.
Each round times one fit per arm (after a fit that traces the step), on the same model, the arms'
order alternating between rounds. `--mode ideal` reads one cached batch instead (input never
waits), which isolates the per-batch cost of the callback and the meter. Prints, measured in
this run, batches/s per arm and round and the median of dsctl / bare (goal >= 0.97).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mode", choices=("service", "ideal"), default="service")
    args = ap.parse_args()

    import tensorflow as tf

    from dsctl.runtime.keras_input import InputMeter, to_xy
    from dsctl.runtime.keras_runner import Meter
    from dsctl.runtime.metrics import MetricsWriter
    from dsctl.runtime.trainer import build_input
    from dsctl.specs import load_spec_text

    sys.path.insert(0, str(REPO / "specs" / "examples"))
    from models.compact_resnet import build_model

    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    address = dispatcher.target.split("://")[1]
    worker = service.WorkerServer(service.WorkerConfig(dispatcher_address=address))
    tmp = Path(tempfile.mkdtemp(prefix="dsctl-bench-keras-"))
    spec = load_spec_text(f"""
name: bench
trainer: {{steps: {args.steps}, warmup_batches: 0, model: {{kind: keras, entrypoint: "models.compact_resnet:build_model"}}}}
pipeline: {{builtin: images, params: {{num_files: 4, images_per_file: 64, image_size: 40, crop_size: 32,
           batch_size: 32, epochs: null, cache_dir: '{tmp / "data"}'}}}}
""").spec
    model = build_model(crop_size=32, num_classes=10)
    xy = to_xy("images")

    def bare():
        return build_input(spec, args.mode, 0, address, tmp, tmp).map(xy)

    def dsctl(meter):
        return meter.wrap(build_input(spec, args.mode, 0, address, tmp, tmp), xy)

    def timed(ds, callbacks) -> float:
        a = time.perf_counter()
        model.fit(ds, epochs=1, steps_per_epoch=args.steps, callbacks=callbacks, verbose=0, shuffle=False)
        return args.steps / (time.perf_counter() - a)

    model.fit(bare(), epochs=1, steps_per_epoch=20, verbose=0, shuffle=False)  # traces the step once
    rows = []
    for r in range(args.rounds):
        writer = MetricsWriter(str(tmp / f"metrics-{r}.jsonl"), 0)
        meter = InputMeter()
        callback = Meter(spec, writer, meter, 1.0, threading.Event(), None, None, 0)
        if r % 2:
            ours = timed(dsctl(meter), [callback])
            plain = timed(bare(), [])
        else:
            plain = timed(bare(), [])
            ours = timed(dsctl(meter), [callback])
        writer.close()
        rows.append((plain, ours))
        print(f"round {r + 1}: bare {plain:.2f} batches/s, dsctl {ours:.2f} batches/s, ratio {ours / plain:.3f}",
              flush=True)
    ratio = statistics.median(o / p for p, o in rows)
    print(f"dsctl / bare model.fit ({args.mode}), median of {args.rounds} rounds (measured here, {args.steps} steps each): "
          f"{ratio:.3f} (goal >= 0.97)")
    worker.stop()
    dispatcher.stop()


if __name__ == "__main__":
    main()
    os._exit(0)
