"""Users' own training programs (trainer.command) run by `dsctl up` and `dsctl sweep` as real processes: the three
example programs train through a real dispatcher and workers, a killed program resumes from its checkpoint, and a
failing, hung or misbehaving program ends the run with one paragraph and nothing left running (the `home` fixture
fails a test that leaves a process behind)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers import EXAMPLES, dsctl, wait_for, write_spec

pytestmark = pytest.mark.slow

EXAMPLE_SPECS = ("script-tf-loop", "script-keras", "script-jax")


def copy_example(name: str, dest: Path) -> Path:
    """The shipped example in a folder of the test's own, so its checkpoints land there."""
    shutil.copytree(EXAMPLES / "scripts", dest / "scripts")
    return Path(shutil.copy(EXAMPLES / f"{name}.yaml", dest / f"{name}.yaml"))


def events(home: Path, run: str, trainer: int = 0, sub: str = "") -> list[dict]:
    path = home / "runs" / run / "metrics" / sub / f"trainer-{trainer}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name", EXAMPLE_SPECS)
def test_an_example_program_trains_through_the_service_and_its_loss_falls(home, tmp_path, name):
    spec = copy_example(name, tmp_path)
    record = json.loads(dsctl("up", spec, "--json", check=True).stdout)
    summary = record["summary"]
    assert record["status"] == "succeeded" and record["mode"] == "service"
    assert summary["batches"] == 300 and summary["checkpoint_step"] == 300
    assert summary["loss_last"] < 0.5 * summary["loss_first"], (summary["loss_first"], summary["loss_last"])
    assert summary["trainer_cpu_cores"] > 0.05  # the program's own CPU, below its runner, is the trainer's
    evs = events(home, record["id"])
    end = [e for e in evs if e["event"] == "end"][-1]
    assert end["step"] == 300 and end["reason"] == "steps"
    windows = [e for e in evs if e["event"] == "window"]
    assert all(w["input_wait_s"] >= 0 and w["step_s"] > 0 for w in windows)
    if name != "script-keras":  # a loop over batches() samples the service client's queue, as the harness does
        assert any(w["queue_fill"] is not None for w in windows if not w["warmup"])


def test_a_killed_program_resumes_from_its_checkpoint_and_the_two_runs_add_up_to_the_steps(home, tmp_path):
    spec = copy_example("script-tf-loop", tmp_path)
    text = spec.read_text().replace("--lr 0.01", "--lr 0.01 --save-every 25").replace("steps: 300", "steps: 1200")
    text = text.replace("--steps 300", "--steps 1200")
    spec.write_text(text)
    up = subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", str(spec), "--json"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    metrics = lambda: next((home / "runs").glob("script-tf-loop-*/metrics/trainer-0.jsonl"), None)  # noqa: E731
    wait_for(lambda: metrics() and metrics().read_text().count('"checkpoint"') >= 3, timeout=120,
             what="three checkpoints")
    program = next(p for p in psutil.process_iter(["cmdline", "cwd"]) if "scripts/tf_loop.py" in " ".join(
        p.info["cmdline"] or []) and (p.info["cwd"] or "").startswith(str(tmp_path)))  # not another test's program
    program.send_signal(signal.SIGKILL)
    out, err = up.communicate(timeout=120)
    assert up.returncode == 1 and "was killed by signal 9 (SIGKILL)" in err, err
    first = json.loads(dsctl("runs", "--json", check=True).stdout)[0]
    saved = first["summary"]["checkpoint_step"]
    assert saved >= 75 and saved % 25 == 0

    second = json.loads(dsctl("up", spec, "--resume", first["id"], "--json", check=True).stdout)
    assert second["status"] == "succeeded" and second["resumed_from"] == first["id"]
    assert second["summary"]["restored_step"] == saved
    assert second["summary"]["batches"] == 1200 - saved  # the steps left: the two runs add up to the spec's
    assert second["summary"]["checkpoint_step"] == 1200
    # the weights came back: the resumed run starts near where the first one was, not at an untrained loss
    assert second["summary"]["loss_first"] < 0.7 * first["summary"]["loss_first"]
    out = dsctl("logs", second["id"], check=True).stdout
    assert f"trainer-0 | restored step {saved}" in out and "trained to step 1200" in out


def test_the_same_program_runs_without_dsctl_to_its_own_length(home, tmp_path):
    """`python train.py` with no dsctl run: dataset(spec=...) builds that spec's pipeline here, the program's own
    --steps ends its loop (the spec's trainer.steps is dsctl's cap on a run, not the program's length: 40 < 300 <
    60), and checkpoints go to the spec's folder, under standalone/."""
    spec = copy_example("script-tf-loop", tmp_path)
    spec.write_text(spec.read_text().replace("steps: 300", "steps: 40"))
    env = {k: v for k, v in os.environ.items() if k != "DSCTL_TRAINER"}
    proc = subprocess.run([sys.executable, "scripts/tf_loop.py", "--spec", spec.name, "--save-every", "20",
                           "--steps", "60"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "trained to step 60," in proc.stdout
    saved = tmp_path / "checkpoints" / "script-tf-loop" / "standalone" / "trainer-0"
    assert (saved / "ckpt-60.index").exists() and (saved / "ckpt-40.index").exists()


FAILS_LATER = """
import sys
from dsctl import train
ds = train.dataset()
for n, batch in enumerate(train.batches(ds), 1):
    if n == 12:
        print("about to fail: learning rate too high", flush=True)
        sys.exit(3)
"""

HANGS = """
import time
from dsctl import train
for n, batch in enumerate(train.batches(train.dataset()), 1):
    if n == 5:
        print("waiting for a lock that never comes", flush=True)
        time.sleep(3600)
"""

TINY = """
name: cmd
trainer:
  command: {command}
  steps: {steps}
  warmup_batches: 2
  window_s: 0.5
{extra}pipeline: {{builtin: synthetic, params: {{elements: 256, batch_size: 8, epochs: null, latency_ms: 1}}}}
"""


def tiny(tmp_path: Path, program: str, steps: int = 100, extra: str = "") -> Path:
    (tmp_path / "train.py").write_text(program)
    return write_spec(tmp_path, TINY.format(command="python train.py", steps=steps, extra=extra))


def test_a_program_that_fails_after_some_batches_fails_the_run_in_one_paragraph_with_its_output(home, tmp_path):
    proc = dsctl("up", tiny(tmp_path, FAILS_LATER), "--mode", "colocated")
    assert proc.returncode == 1
    run = json.loads(dsctl("runs", "--json", check=True).stdout)[0]
    error, last = proc.stderr.strip().splitlines()[-2:]  # after the live view's progress lines
    assert error.startswith("error: trainer 0 failed: the command `python train.py` exited with code 3 after 12 batch(es) "
                            "of 100. The last lines it printed are below. (run ")
    assert error.endswith(f"`dsctl logs {run['id']}` shows what it printed, `dsctl runs show {run['id']}` what it "
                          "measured)")
    assert last == "  | about to fail: learning rate too high"  # the program's lines, as lines
    assert run["status"] == "failed" and run["summary"]["batches"] >= 2
    assert "trainer-0 | about to fail: learning rate too high" in dsctl("logs", run["id"], check=True).stdout


def test_a_hung_program_is_ended_by_the_trainers_time_limit(home, tmp_path):
    spec = tiny(tmp_path, HANGS, extra="  timeout_s: 12\n")
    t0 = time.monotonic()
    proc = dsctl("up", spec, "--mode", "colocated")
    assert proc.returncode == 1 and "trainer.timeout_s: 1 trainer(s) were still running 12 s after they started" in proc.stderr
    assert time.monotonic() - t0 < 60


SWEPT = """
from dsctl import train
for batch in train.batches(train.dataset()):
    pass
print(f"stopped after the sweep", flush=True)
"""


def test_a_sweep_keeps_one_program_running_while_the_workers_change(home, tmp_path):
    (tmp_path / "train.py").write_text(SWEPT)
    spec = write_spec(tmp_path, """
        name: cmd-sweep
        trainer: {command: python train.py, steps: 100, warmup_batches: 2}
        pipeline: {builtin: synthetic, params: {elements: 256, batch_size: 4, epochs: null, latency_ms: 10}}
    """)
    sweep = json.loads(dsctl("sweep", spec, "--workers", "1..2", "--window", "1s", "--json", check=True, timeout=400).stdout)
    summary = sweep["summary"]
    assert [p["workers"] for p in summary["points"]] == [1, 2]
    assert all(p["batches_per_s"] > 0 for p in summary["points"])
    assert summary["baselines"]["colocated"]["batches_per_s"] > 0 and summary["baselines"]["ideal"]["batches_per_s"] > 0
    service = events(home, sweep["id"], sub="service")
    starts = [e for e in service if e["event"] == "start"]
    assert len(starts) == 1  # one program for every worker count
    assert [e for e in service if e["event"] == "end"][-1]["reason"] == "signal"  # the sweep stopped it, it ended cleanly


COORDINATED = """
import json
from dsctl import train
print(f"trainer {train.index()}", flush=True)
lengths = [int(batch["tokens"].shape[1]) for batch in train.batches(train.dataset())]
with open(f"lengths-{train.index()}.json", "w") as f:
    json.dump(lengths, f)
"""


def test_coordinated_reads_give_each_program_its_own_consumer_index(home, tmp_path):
    (tmp_path / "train.py").write_text(COORDINATED)
    spec = write_spec(tmp_path, """
        name: cmd-coord
        service:
          workers: 2
          job_name: shared
          coordinated_reads: {num_consumers: 2, bucket_boundaries: [16, 32]}
        trainer: {command: python train.py, count: 2, steps: 40, warmup_batches: 2, timeout_s: 120}
        pipeline: {builtin: text, params: {batch_size: 8, max_length: 48, epochs: null}}
    """)
    record = json.loads(dsctl("up", spec, "--json", check=True).stdout)
    assert record["status"] == "succeeded" and record["trainers"] == 2
    out = dsctl("logs", record["id"], check=True).stdout
    assert "trainer-0 | trainer 0" in out and "trainer-1 | trainer 1" in out
    # Each round both consumers read the same bucket from one worker: step by step, the same padded length.
    lengths = [json.loads((tmp_path / f"lengths-{i}.json").read_text()) for i in (0, 1)]
    assert len(lengths[0]) == len(lengths[1]) == 40 and lengths[0] == lengths[1]
    assert len(set(lengths[0])) > 1  # several buckets were read, so equal lengths are not a coincidence


def test_validate_names_a_missing_program_at_its_line_and_starts_nothing(home, tmp_path):
    spec = write_spec(tmp_path, TINY.format(command="./train.sh --epochs 3", steps=10, extra=""))
    proc = dsctl("validate", spec)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: {spec}:4: trainer.command: ./train.sh does not exist (looked for "
                                   f"{tmp_path}/train.sh; a relative path is relative to the spec's folder).")
    (tmp_path / "train.sh").write_text("#!/bin/sh\n")
    proc = dsctl("validate", spec)
    assert proc.returncode == 2 and "is not an executable file" in proc.stderr


STEPS_12MS = """
import time
from dsctl import train
for batch in train.batches(train.dataset()):
    time.sleep(0.012)  # the program's step
"""


def test_an_autoscaled_program_gets_workers_from_the_windows_it_is_measured_by(home, tmp_path):
    # A worker serves a batch every 40 ms (8 elements x 5 ms) and the program steps in 12 ms: input-bound, so
    # Cachew's policy adds workers from what the program's own batches() windows say.
    (tmp_path / "train.py").write_text(STEPS_12MS)
    spec = write_spec(tmp_path, """
        name: cmd-autoscale
        trainer: {command: python train.py, duration_s: 16, warmup_batches: 5, window_s: 0.5}
        pipeline: {builtin: synthetic, params: {batch_size: 8, latency_ms: 5, epochs: null}}
        autoscale: {policy: cachew, max_workers: 3, settings: {window_batches: 40, pause_batches: 20}}
    """)
    record = json.loads(dsctl("up", spec, "--json", check=True).stdout)
    assert record["summary"]["autoscale_policy"] == "cachew"
    decisions = [e["message"] for e in json.loads(dsctl("runs", "show", record["id"], "--json", check=True).stdout)["events"]
                 if e["kind"] == "autoscale"]
    assert decisions and decisions[0].startswith("add → 2 worker(s)"), decisions
    assert record["summary"]["final_workers"] >= 2


DAEMONIZES = """
import os, time
from dsctl import train
if os.fork() == 0:  # a helper that detaches itself: a session of its own, its parent gone
    os.setsid()
    if os.fork() == 0:
        time.sleep(3600)
    os._exit(0)
for batch in train.batches(train.dataset()):
    time.sleep(0.01)
"""


def test_down_after_kill_9_of_up_stops_the_program_and_the_daemon_it_started(home, tmp_path):
    spec = tiny(tmp_path, DAEMONIZES, steps=100_000)
    up = subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", str(spec), "--json"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    metrics = lambda: next((home / "runs").glob("cmd-*/metrics/trainer-0.jsonl"), None)  # noqa: E731
    wait_for(lambda: metrics() and '"window"' in metrics().read_text(), timeout=120, what="the program's first window")
    up.kill()
    up.wait()
    assert dsctl("down", "--all", check=True).returncode == 0
    # the `home` fixture fails this test if anything of the run (the daemon inherits DSCTL_HOME) is still running


def epochs_printed(stdout: str) -> list[int]:
    """The batches of each epoch an example epoch program printed ("epoch 3: 64 batches, ...")."""
    return [int(n) for n in re.findall(r"^(?:trainer-0 \| )?epoch \d+: (\d+) batches", stdout, re.MULTILINE)]


def test_an_epoch_program_with_evaluation_trains_in_every_mode_with_the_epochs_it_has_alone(home, tmp_path):
    """An epoch loop over a finite pipeline with evaluation between epochs (the JAX example, no trainer.steps),
    2 workers with distributed_epoch: through the service, colocated and ideal it trains (its loss falls), records
    its epochs, and each epoch has the batches it has run alone, where its own --num_epochs, past the spec's
    trainer.steps cap, runs to its end."""
    spec = copy_example("script-jax-epochs", tmp_path)
    capped = tmp_path / "capped.yaml"  # a cap below the program's 6 x 64 batches: it must not end a program alone
    capped.write_text(spec.read_text().replace("  warmup_batches: 5", "  steps: 200\n  warmup_batches: 5"))
    env = {k: v for k, v in os.environ.items() if k != "DSCTL_TRAINER"}
    alone = subprocess.run([sys.executable, "scripts/jax_epochs.py", "--spec", capped.name, "--num_epochs", "6"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-2000:]
    per_epoch = epochs_printed(alone.stdout)
    assert per_epoch == [64] * 6, alone.stdout

    spec.write_text(spec.read_text().replace("--num_epochs 4", "--num_epochs 3"))
    runs = {}
    for mode in ("service", "colocated", "ideal"):
        record = json.loads(dsctl("up", spec, "--mode", mode, "--json", check=True).stdout)
        s = runs[mode] = record["summary"]
        assert record["status"] == "succeeded" and s["ended_by"] == "end_of_data", (mode, s)
        assert s["epochs"] == 3 and s["epoch_batches"] == per_epoch[:3] and s["batches"] == 3 * 64, (mode, s)
        assert "epoch_note" not in s, s["epoch_note"]  # the same batches as alone: nothing to explain
        assert s["loss_last"] < 0.5 * s["loss_first"], (mode, s["loss_first"], s["loss_last"])
        assert s["outside_s"] > 0 and s["step_batches_per_s"] >= s["batches_per_s"]  # its evaluation, kept apart
        out = dsctl("logs", record["id"], check=True).stdout
        assert epochs_printed(out) == per_epoch[:3] and "test accuracy" in out
        assert out.count("epoch: trainer 0: epoch ") == 3  # the run's own events, one an epoch
    listed = dsctl("runs", env={"COLUMNS": "80"}).stdout
    assert all(len(line) <= 80 for line in listed.splitlines())
    assert all(f" {record_id} " in listed for record_id in (r["id"] for r in json.loads(
        dsctl("runs", "--json", check=True).stdout))), listed


def test_a_keras_fit_with_validation_data_records_its_epochs_and_their_validation(home, tmp_path):
    """model.fit(..., validation_data=...) through keras_callback: training trains, Keras's validation after each
    epoch is recorded with the epoch and its time is the program's own, not a slow last step."""
    spec = copy_example("script-keras-validation", tmp_path)
    record = json.loads(dsctl("up", spec, "--json", check=True).stdout)
    s = record["summary"]
    assert record["status"] == "succeeded" and s["epochs"] == 3 and s["epoch_batches"] == [64, 64, 64]
    assert s["loss_last"] < 0.5 * s["loss_first"], (s["loss_first"], s["loss_last"])
    assert s["outside_s"] > 0
    shown = json.loads(dsctl("runs", "show", record["id"], "--json", check=True).stdout)
    epochs = [e["message"] for e in shown["events"] if e["kind"] == "epoch"]
    assert len(epochs) == 3 and all("val_accuracy" in e and "val_loss" in e for e in epochs), epochs
    windows = [w for w in shown["windows"] if not w["warmup"]]
    assert all(w["loss"] is not None and w["loss"] < 5 for w in windows)  # training's loss, never the validation's
