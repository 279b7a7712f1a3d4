"""A run's TensorBoard event files: one scalar per metrics window, written as the run goes.

Written in `<run dir>/tensorboard/` by the process that follows the trainers (`dsctl up`, or the
run's supervisor on a dispatcher VM), and copied to `trainer.tensorboard_dir/<run id>/` when the spec
names a folder there, local or gs:// (every UPLOAD_S and at the end): on Google Cloud that copy is
what outlives the dispatcher VM. Each trainer's scalars are at its global
training step (the restored step plus its batches), so a resumed run continues its run's curves.

The files are TensorBoard's own format, written with TensorBoard's own record writer and protos
(its EventFileWriter imports TensorFlow through tensorboard.compat, 5 s of `dsctl`'s start; nothing
here does). Nothing here may stop a run: the first failure is returned once as a warning and the
board stops writing.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

from dsctl.costmodel import Catalog

from .pricing import price_record, stands_in_for
from .records import RunRecord, RunSummary

SUBDIR = "tensorboard"
UPLOAD_S = 30.0

# Tag -> what it is and where it comes from, shown by TensorBoard beside each chart.
DESCRIPTIONS = {
    "loss": "measured here: the model's training loss over the window (as Keras reports it)",
    "batches_per_s": "measured here: training steps per second over the window",
    "input_stall_frac": "measured here: share of the window the trainer waited for input",
    "workers": "tf.data service workers serving the run at the window's end",
    "local_workers": "measured here: tf.data service workers inside the trainer process (hybrid placement), as the "
                     "trainer said at the window's end",
}


def board_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / SUBDIR


def event_files(path: str | Path) -> list[Path]:
    """The TensorBoard event files in a folder and below it."""
    return sorted(Path(path).rglob("*tfevents*")) if Path(path).is_dir() else []


class EventFile:
    """Scalars appended to one TensorBoard event file, flushed at each write (TensorBoard shows them live)."""

    def __init__(self, logdir: Path):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        logdir.mkdir(parents=True, exist_ok=True)
        self.path = logdir / f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.0"
        self._writer = RecordWriter(open(self.path, "wb"))
        self._described: set[str] = set()
        self._write(self._event(wall_time=time.time(), file_version="brain.Event:2"))

    def scalar(self, tag: str, value: float, step: int, wall: float, description: str = "") -> None:
        v = self._summary.Value(tag=tag, simple_value=float(value))
        if tag not in self._described:  # TensorBoard keeps a tag's description from its first value
            v.metadata.summary_description = description
            v.metadata.plugin_data.plugin_name = "scalars"
            self._described.add(tag)
        self._write(self._event(wall_time=wall, step=int(step), summary=self._summary(value=[v])))

    def _write(self, event) -> None:
        self._writer.write(event.SerializeToString())
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class RunBoard:
    """The scalars of one run: per window, the model's loss and metrics, batches/s, input stall, the workers
    and the cost so far (the run's record priced as `dsctl up` prices it at the end, with the time elapsed and
    the utilization sampled so far)."""

    def __init__(self, run_dir: str | Path, run_id: str, trainers: int, copy_to: str | None = None):
        self.dir = board_dir(run_dir)
        self.run_id, self.trainers = run_id, trainers
        self.copy_to = f"{copy_to.rstrip('/')}/{run_id}" if copy_to else None  # a local folder or gs://
        self.warning: str | None = None  # the first failure, said once
        self._file: EventFile | None = None
        self._steps: dict[int, int] = {}  # trainer -> global step reached
        self._use: dict[str, list[float]] = {}  # role -> [sum of cores, sum of bytes, samples]
        self._record: RunRecord | None = None
        self._catalog: Catalog | None = None
        self._uploaded: dict[Path, int] = {}
        self._last_upload = time.monotonic()
        self._uploading: threading.Thread | None = None
        self._unpriced: str | None = None  # why the cost so far is not written (the run cannot be priced)
        self._unpriced_said = False

    # -- what the orchestrator feeds it ------------------------------------------------------
    def started(self, trainer: int, restored_step: int | None) -> str | None:
        """A trainer's `start` record: its scalars go on from the step it restored."""
        return self._guard(self._steps.__setitem__, trainer, int(restored_step or 0))

    def samples(self, samples: list) -> str | None:
        """Utilization samples, for the cost so far."""
        return self._guard(self._add_samples, samples)

    def window(self, trainer: int, rec: dict, workers: int, record: RunRecord | None) -> str | None:
        """Write one window's scalars; a warning (once) if the board cannot, or (once) if the run cannot be priced:
        then every scalar but the cost goes on."""
        warning = self._guard(self._window, trainer, rec, workers, record)
        if warning is None and self._unpriced is not None and not self._unpriced_said:
            self._unpriced_said = True
            return self._unpriced
        return warning

    def close(self) -> str | None:
        """At the run's end, after teardown: close the file and copy it to trainer.tensorboard_dir (waits for that)."""
        return self._guard(self._close)

    # -- the work ------------------------------------------------------------------------
    def _guard(self, fn, *args) -> str | None:
        if self.warning is not None:
            return None
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - event files are a view of the run, never a reason to stop it
            where = f"{self.dir}" + (f", copied to {self.copy_to}" if self.copy_to else "")
            detail = str(exc).splitlines()[0] if str(exc) else "no detail"
            self.warning = (f"TensorBoard event files ({where}) are no longer written for this run "
                            f"({type(exc).__name__}: {detail}); the run itself goes on.")
            try:
                if self._file is not None:
                    self._file.close()
            except Exception:  # noqa: BLE001 - the same failure again; the warning says it
                pass
            return self.warning
        return None

    def _add_samples(self, samples: list) -> None:
        for s in samples:
            use = self._use.setdefault(s.role, [0.0, 0.0, 0])
            use[0] += s.cpu_cores or 0.0
            use[1] += s.rss_bytes or 0
            use[2] += 1

    def _window(self, trainer: int, rec: dict, workers: int, record: RunRecord | None) -> None:
        if self._file is None:
            self._file = EventFile(self.dir)
        step = self._steps.get(trainer, 0) + int(rec.get("batches") or 0)
        self._steps[trainer] = step
        wall = float(rec.get("wall") or time.time())
        prefix = f"trainer-{trainer}/" if self.trainers > 1 else ""
        put = self._file.scalar
        if rec.get("loss") is not None:
            put(prefix + "loss", rec["loss"], step, wall, DESCRIPTIONS["loss"])
        for name, value in (rec.get("metrics") or {}).items():
            if isinstance(value, (int, float)):
                put(f"{prefix}metrics/{name}", value, step, wall, f"measured here: the model's {name} over the window")
        if rec.get("batches_per_s") is not None:
            put(prefix + "batches_per_s", rec["batches_per_s"], step, wall, DESCRIPTIONS["batches_per_s"])
        busy = (rec.get("input_wait_s") or 0.0) + (rec.get("step_s") or 0.0)
        if busy > 0:
            put(prefix + "input_stall_frac", (rec.get("input_wait_s") or 0.0) / busy, step, wall,
                DESCRIPTIONS["input_stall_frac"])
        if trainer == min(self._steps, default=trainer):  # run-wide values once per round of windows
            put("workers", workers, step, wall, DESCRIPTIONS["workers"])
            if rec.get("local_workers") is not None:
                put("local_workers", rec["local_workers"], step, wall, DESCRIPTIONS["local_workers"])
            if record is not None and self._unpriced is None:
                self._cost(record, workers, step, wall)
        self._maybe_upload()

    def _cost(self, record: RunRecord, workers: int, step: int, wall: float) -> None:
        summary = {"duration_s": max(wall - record.created_at, 1e-3), "batches": sum(self._steps.values())}
        for role, (cores, rss, n) in self._use.items():
            summary[f"{role}_cpu_cores"], summary[f"{role}_mem_gb"] = cores / n, rss / n / 2**30
        so_far = replace(record, workers=workers or record.workers, summary=RunSummary.model_validate(summary))
        try:
            _, breakdown, self._catalog = price_record(so_far, self._catalog)
        except Exception as exc:  # noqa: BLE001 - a run that cannot be priced still has its other scalars
            detail = " ".join(str(exc).split()) or type(exc).__name__
            self._unpriced = (f"TensorBoard gets no cost_so_far_usd for this run, which cannot be priced ({detail}); "
                              "its other scalars are written.")
            return
        local = " (each process priced as the machine type the spec names for it)" if stands_in_for(record.provider) else ""
        assert self._file is not None, "_window opened the file"
        self._file.scalar("cost_so_far_usd", breakdown.total, step, wall,
                          f"measured here: the run's time so far and its sampled CPU and memory, priced with catalog "
                          f"{self._catalog.name} on the {breakdown.basis} basis{local}, as `dsctl runs show` prices "
                          "the whole run")

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._uploading is not None:
            self._uploading.join()
        self._upload()

    # -- copies to trainer.tensorboard_dir ----------------------------------------------------
    def _maybe_upload(self) -> None:
        """Every UPLOAD_S, in the background: a slow network must not hold the trainers' metrics back."""
        if not self.copy_to or time.monotonic() - self._last_upload < UPLOAD_S:
            return
        if self._uploading is not None and self._uploading.is_alive():
            return
        self._last_upload = time.monotonic()

        def upload() -> None:
            try:
                self._upload()
            except Exception:  # noqa: BLE001 - tried again at the next one, and at the end (where it is said)
                pass

        self._uploading = threading.Thread(target=upload, name="dsctl-tensorboard-upload", daemon=True)
        self._uploading.start()

    def _upload(self) -> None:
        if not self.copy_to:
            return
        for path in event_files(self.dir):
            size = path.stat().st_size
            if self._uploaded.get(path) == size:
                continue
            name = path.relative_to(self.dir)
            if self.copy_to.startswith("gs://"):
                from . import gcs

                gcs.upload(path, f"{self.copy_to}/{name}")
            else:
                target = Path(self.copy_to) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
            self._uploaded[path] = size
