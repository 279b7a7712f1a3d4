"""TensorBoard event files of a run: scalars per window read back with TensorBoard's own loader, a board that
cannot write never stops a run, and `dsctl tensorboard` on recorded runs (the real TensorBoard, in the slow test)."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from dsctl.costmodel import load_catalog
from dsctl.orchestrator.resume import Resume
from dsctl.orchestrator.run import JobRunner
from dsctl.orchestrator.store import RunStore
from dsctl.orchestrator.tbevents import RunBoard
from dsctl.runtime.sampler import Sample
from dsctl.specs import load_spec, load_spec_text, spec_hash
from helpers import EXAMPLES, dsctl, processes_under, wait_for

SPEC = load_spec_text("""
name: fit
service: {workers: 2, worker_machine: n2-standard-8, dispatcher_machine: n2-standard-8}
trainer: {machine: n2-standard-8, steps: 300}
pipeline: {builtin: synthetic}
cost_basis: vm-hours
""").spec
CREATED = 1_000_000.0


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the folder's event files as TensorBoard reads them: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    out = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    out["_descriptions"] = {tag: acc.SummaryMetadata(tag).summary_description for tag in acc.Tags()["scalars"]}
    return out


def recorded(store: RunStore, run_id: str = "fit-1", trainers: int = 1):
    store.create_run(id=run_id, name="fit", provider="local", mode="service", status="running",
                     spec_json=SPEC.model_dump_json(), spec_hash=spec_hash(SPEC), workers=2, trainers=trainers,
                     created_at=CREATED)
    return store.get(run_id)


def win(trainer: int, wall: float, batches: int, loss: float | None = None, **extra) -> dict:
    return {"event": "window", "trainer": trainer, "wall": wall, "t_start": wall - 10.0, "t_end": wall,
            "batches": batches, "batches_per_s": batches / 10, "input_wait_s": 2.5, "step_s": 7.5, "loss": loss,
            **extra}


@pytest.mark.integration  # TensorBoard's loader imports TensorFlow in this process
def test_each_window_becomes_scalars_at_the_global_step(tmp_path):
    record = recorded(RunStore(tmp_path / "runs.db"))
    board = RunBoard(tmp_path / "run", "fit-1", trainers=1)
    board.started(0, 100)  # a resumed trainer: its curves go on from the step it restored
    for i, loss in enumerate((2.0, 1.5, 1.25), 1):
        assert board.window(0, win(0, CREATED + 1800 * i, 10, loss, metrics={"accuracy": 0.1 * i}), 2, record) is None
    assert board.close() is None

    got = scalars(tmp_path / "run" / "tensorboard")
    assert got["loss"] == [(110, 2.0), (120, 1.5), (130, 1.25)]
    assert [s for s, _ in got["metrics/accuracy"]] == [110, 120, 130]
    assert got["metrics/accuracy"][2][1] == pytest.approx(0.3)
    assert got["batches_per_s"] == [(110, 1.0), (120, 1.0), (130, 1.0)]
    assert got["input_stall_frac"] == [(110, 0.25), (120, 0.25), (130, 0.25)]
    assert got["workers"] == [(110, 2.0), (120, 2.0), (130, 2.0)]
    # vm-hours: whole machines for the time since the run was created, at the catalog's prices.
    catalog = load_catalog(SPEC.pricing)
    per_hour = 3 * catalog.machine_hour("n2-standard-8") + catalog.machine_hour("n2-standard-8")
    assert [v for _, v in got["cost_so_far_usd"]] == pytest.approx([per_hour / 2, per_hour, per_hour * 1.5], rel=1e-5)
    described = got["_descriptions"]
    assert described["cost_so_far_usd"].startswith("measured here") and catalog.name in described["cost_so_far_usd"]
    assert "vm-hours" in described["cost_so_far_usd"]
    assert all(described[t].startswith("measured here") for t in ("loss", "batches_per_s", "input_stall_frac"))


@pytest.mark.integration  # TensorBoard's loader imports TensorFlow in this process
def test_sampled_utilization_prices_the_service_on_what_it_used(tmp_path):
    spec = SPEC.model_copy(update={"cost_basis": "utilization"})
    store = RunStore(tmp_path / "runs.db")
    store.create_run(id="u-1", name="fit", provider="local", mode="service", status="running",
                     spec_json=spec.model_dump_json(), spec_hash=spec_hash(spec), workers=2, trainers=1,
                     created_at=CREATED)
    costs = []
    for cores in (0.0, 8.0):  # idle workers, then workers using all of their machine
        board = RunBoard(tmp_path / f"run-{cores}", "u-1", trainers=1)
        board.samples([Sample("worker", i, 1, cores, 2**30, 0.0) for i in range(2)])
        board.window(0, win(0, CREATED + 3600, 10), 2, store.get("u-1"))
        board.close()
        costs.append(scalars(tmp_path / f"run-{cores}" / "tensorboard")["cost_so_far_usd"][0][1])
    assert costs[1] > costs[0] > 0


@pytest.mark.integration  # TensorBoard's loader imports TensorFlow in this process
def test_several_trainers_get_their_own_tags(tmp_path):
    record = recorded(RunStore(tmp_path / "runs.db"), trainers=2)
    board = RunBoard(tmp_path / "run", "fit-1", trainers=2)
    board.window(0, win(0, CREATED + 1, 5, 2.0), 2, record)
    board.window(1, win(1, CREATED + 1, 7, 3.0), 2, record)
    board.window(1, win(1, CREATED + 2, 7, 2.5), 2, record)
    board.close()
    got = scalars(tmp_path / "run" / "tensorboard")
    assert got["trainer-0/loss"] == [(5, 2.0)]
    assert got["trainer-1/loss"] == [(7, 3.0), (14, 2.5)]
    assert got["workers"] == [(5, 2.0)]  # run-wide values come with the first trainer's windows
    assert "loss" not in got


@pytest.mark.integration  # TensorBoard's loader imports TensorFlow in this process
def test_a_local_tensorboard_dir_gets_a_copy(tmp_path):
    record = recorded(RunStore(tmp_path / "runs.db"))
    board = RunBoard(tmp_path / "run", "fit-1", trainers=1, copy_to=str(tmp_path / "boards"))
    board.window(0, win(0, CREATED + 1, 5, 2.0), 2, record)
    board.close()
    assert scalars(tmp_path / "boards" / "fit-1")["loss"] == [(5, 2.0)]


def test_a_board_that_cannot_write_warns_once_and_lets_the_run_go_on(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tensorboard").write_text("a file where the folder should be")
    board = RunBoard(tmp_path / "run", "fit-1", trainers=1)
    warning = board.window(0, win(0, CREATED + 1, 5, 2.0), 2, None)
    assert warning.startswith(f"TensorBoard event files ({tmp_path / 'run' / 'tensorboard'}) are no longer written")
    assert "the run itself goes on" in warning
    assert board.window(0, win(0, CREATED + 2, 5, 1.0), 2, None) is None  # said once
    assert board.close() is None


@pytest.mark.integration  # dsctl as a subprocess
def test_a_run_whose_board_fails_is_still_torn_down_and_recorded(home):
    """The runner's own path: a window the board cannot write, then the run's end (teardown, then records)."""
    runner = JobRunner(load_spec(EXAMPLES / "quickstart.yaml"))
    dep = runner.prepare()
    (runner.run_dir / "tensorboard").write_text("not a folder")
    runner._record(0, win(0, time.time(), 5, 2.0), {0: 0}, {}, {})
    runner.finish(dep, "succeeded", None, runner.store.get(runner.run_id).created_at, keep_up=False)
    record = runner.store.get(runner.run_id)
    assert record.status == "succeeded" and dep.status == "down"
    assert "no longer written" in record.summary["tensorboard"]["error"]
    assert record.summary["loss_first"] == 2.0
    assert any(e["kind"] == "warning" and "TensorBoard" in e["message"] for e in runner.store.events(runner.run_id))
    proc = dsctl("tensorboard", runner.run_id)
    assert proc.returncode == 2 and "has no TensorBoard event files" in proc.stderr
    assert "no longer written" in proc.stderr and "\n" not in proc.stderr.strip()


@pytest.mark.integration  # TensorBoard's loader imports TensorFlow in this process
def test_the_runner_records_what_a_resumed_run_restored_and_puts_its_scalars_at_the_global_step(home):
    resume = Resume(run_id="fit-before", restore_from="/ck/fit-before", holder="fit-before", steps=(90,))
    runner = JobRunner(load_spec(EXAMPLES / "quickstart.yaml"), resume=resume)
    dep = runner.prepare()
    assert runner.store.get(runner.run_id).resumed_from == "fit-before"
    runner._record(0, {"event": "start", "trainer": 0, "restored_step": 100}, {0: 0}, {}, {})
    runner._record(0, win(0, time.time(), 5, 2.0), {0: 0}, {}, {})
    runner.finish(dep, "succeeded", None, runner.store.get(runner.run_id).created_at, keep_up=False)
    assert scalars(runner.run_dir / "tensorboard")["loss"] == [(105, 2.0)]
    summary = runner.store.get(runner.run_id).summary
    assert summary["restored_step"] == 100  # what the trainer restored (the plan's 90 was read before it started)
    assert summary["tensorboard"]["dir"] == str(runner.run_dir / "tensorboard")


@pytest.mark.integration  # dsctl as a subprocess
def test_tensorboard_refuses_runs_without_event_files(home):
    proc = dsctl("tensorboard")
    assert proc.returncode == 2 and "no runs are recorded yet" in proc.stderr
    recorded(RunStore(), "fit-empty")
    proc = dsctl("tensorboard", "fit-empty")
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.startswith("error: run fit-empty has no TensorBoard event files") and "\n" not in err
    proc = dsctl("tensorboard", "no-such-run")
    assert proc.returncode == 2 and "no run 'no-such-run' is recorded" in proc.stderr


def runs_with_boards(home: Path, *run_ids: str) -> None:
    """Recorded runs, each with an event file of one window."""
    store = RunStore()
    for run_id in run_ids:
        record = recorded(store, run_id)
        board = RunBoard(home / "runs" / run_id, run_id, trainers=1)
        board.window(0, win(0, CREATED + 1, 5, 2.0), 2, record)
        board.close()
        store.update_run(run_id, status="succeeded", summary={"tensorboard": {"dir": str(board.dir)}})


def start_tensorboard(*runs: str) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    return subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "tensorboard", *runs, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), port


def served_tags(port: int, token: str) -> dict | None:
    request = urllib.request.Request(f"http://localhost:{port}/data/plugin/scalars/tags",
                                     headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return None


def token_in(line: str) -> str:
    found = re.search(r"\?token=([A-Za-z0-9_-]+)", line)
    assert found, f"no token in the URL printed: {line}"
    return found.group(1)


# Another local user's client: whatever it asks, it gets its answer's status and body.
CLIENT = """
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
        print(r.status); print(r.read().decode(errors="replace"))
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode(errors="replace"))
"""


def as_another_user(url: str) -> tuple[int, str]:
    """GET `url` as user nobody where this test runs as root (else as this user, without the token all the same)."""
    proc = subprocess.run(["/usr/bin/python3", "-c", CLIENT, url], capture_output=True, text=True, timeout=30,
                          cwd="/", env={"PATH": "/usr/bin:/bin"}, **({"user": 65534, "group": 65534, "extra_groups": []}
                                                                     if os.geteuid() == 0 else {}))
    status, _, body = proc.stdout.partition("\n")
    assert status.strip().isdigit(), proc.stdout + proc.stderr
    return int(status), body


def tensorboards(home: Path) -> list:
    return [p for p in processes_under(home) if "tensorboard" in " ".join(p.cmdline()) or "boardserver" in
            " ".join(p.cmdline())]


def board_pid(home: Path) -> int:
    [record] = (home / "boards").glob("*.json")
    return json.loads(record.read_text())["pid"]


@pytest.mark.slow
def test_tensorboard_serves_the_runs_by_their_ids_and_stops_on_ctrl_c(home):
    runs_with_boards(home, "fit-a", "fit-b")
    proc, port = start_tensorboard("fit-a", "fit-b")
    try:
        line = proc.stdout.readline()
        assert f"TensorBoard on run(s) fit-a, fit-b at http://localhost:{port}/?token=" in line
        token = token_in(line)
        tags = wait_for(lambda: served_tags(port, token), timeout=60, what="TensorBoard to serve")
        assert set(tags) == {"fit-a/.", "fit-b/."} and "loss" in tags["fit-a/."]  # files at the top of each folder
        # Another user of this machine reads nothing of the runs through it: not their curves, ids, nor the home.
        for path in ("/", "/data/runs", "/data/plugin/scalars/tags", "/data/environment", f"/?token={token[:-1]}x"):
            status, body = as_another_user(f"http://localhost:{port}{path}")
            assert status == 403 and "fit-a" not in body and str(home) not in body, (path, status, body[:200])
        # The URL as printed opens it: the token becomes a cookie for this port, and leaves the address bar.
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        with browser.open(f"http://localhost:{port}/?token={token}", timeout=10) as page:
            assert page.status == 200 and "token" not in page.url
        with browser.open(f"http://localhost:{port}/data/plugin/scalars/tags", timeout=10) as r:
            assert set(json.loads(r.read())) == {"fit-a/.", "fit-b/."}
        served_by = " ".join(psutil.Process(board_pid(home)).cmdline())
        assert "boardserver" in served_by and str(home) not in served_by and "fit-a" not in served_by, served_by
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not tensorboards(home)


@pytest.mark.slow
def test_after_kill_9_of_dsctl_tensorboard_status_lists_the_tensorboard_and_down_stops_it(home):
    runs_with_boards(home, "fit-a")
    proc, port = start_tensorboard("fit-a")
    try:
        line = proc.stdout.readline()
        assert f"`dsctl down tensorboard-{port}`" in line
        token = token_in(line)
        wait_for(lambda: served_tags(port, token), timeout=60, what="TensorBoard to serve")
    finally:
        proc.kill()
        proc.wait(30)  # not its pipes: TensorBoard, which outlives it, holds them open
        proc.stdout.close()
        proc.stderr.close()
    assert served_tags(port, token) is not None, "TensorBoard outlives a killed dsctl tensorboard"
    [row] = json.loads(dsctl("status", "--json", check=True).stdout)  # its URL, token and all, for its user
    assert (row["run"], row["url"], row["runs"]) == (f"tensorboard-{port}", f"http://localhost:{port}/?token={token}",
                                                     "fit-a")
    assert f"tensorboard-{port}" in dsctl("status", check=True).stdout
    proc = dsctl("down", "--all", check=True)
    assert f"tensorboard-{port}: stopped" in proc.stdout
    assert served_tags(port, token) is None and not tensorboards(home)
    assert json.loads(dsctl("status", "--json", check=True).stdout) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_tensorboard_as_ctrl_c_does(home, sig):
    runs_with_boards(home, "fit-a")
    proc, port = start_tensorboard("fit-a")
    try:
        assert f"http://localhost:{port}/" in proc.stdout.readline()
        proc.send_signal(sig)
        assert proc.wait(30) == 128 + sig
        assert f"interrupted ({signal.Signals(sig).name}): TensorBoard is stopped." in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not tensorboards(home)
    assert json.loads(dsctl("status", "--json", check=True).stdout) == []
