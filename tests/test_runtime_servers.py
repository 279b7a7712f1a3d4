"""The dispatcher and worker entry points as real processes: readiness, port refusal, clean stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from dsctl.runtime.readiness import pick_free_port, port_is_free, read_json
from helpers import wait_for

pytestmark = pytest.mark.slow


def start(module: str, *args: str, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, *args], stdout=log, stderr=subprocess.STDOUT)


def test_dispatcher_and_worker_start_register_refuse_taken_ports_and_stop_on_sigterm(tmp_path):
    port = pick_free_port()
    with open(tmp_path / "d.log", "w") as dlog, open(tmp_path / "w.log", "w") as wlog:
        disp = start("dsctl.runtime.dispatcher", "--port", str(port), "--fault-tolerant", "--work-dir", str(tmp_path / "j"),
                     "--ready-file", str(tmp_path / "d.json"), "--status-file", str(tmp_path / "status.json"), log=dlog)
        worker = None
        try:
            ready = wait_for(lambda: read_json(tmp_path / "d.json"), timeout=60, what="dispatcher ready file")
            assert ready["port"] == port and ready["pid"] == disp.pid
            assert (tmp_path / "j").is_dir(), "fault-tolerant dispatchers journal to the work dir"
            assert not port_is_free(port)

            # A second dispatcher on the same port would start silently (SO_REUSEPORT) and break clients.
            second = subprocess.run([sys.executable, "-m", "dsctl.runtime.dispatcher", "--port", str(port)],
                                    capture_output=True, text=True, timeout=60)
            assert second.returncode == 3
            assert f"port {port} is already in use" in second.stderr

            worker = start("dsctl.runtime.worker", "--dispatcher", f"localhost:{port}", "--ready-file",
                           str(tmp_path / "w.json"), log=wlog)
            wait_for(lambda: read_json(tmp_path / "w.json"), timeout=60, what="worker ready file")
            wait_for(lambda: (read_json(tmp_path / "status.json") or {}).get("workers") == 1, timeout=30,
                     what="the dispatcher to count the worker")
        finally:
            for proc in (worker, disp):
                if proc is not None:
                    proc.send_signal(signal.SIGTERM)
            codes = [p.wait(timeout=30) for p in (worker, disp) if p is not None]
    assert codes == [0, 0]
    assert "stopped" in (tmp_path / "d.log").read_text()
    assert port_is_free(port)


def test_trainer_reads_the_pipeline_colocated_and_writes_metrics_windows(tmp_path):
    from dsctl.specs import load_spec_text

    spec = load_spec_text("""
name: t
trainer: {steps: 1000, warmup_batches: 3, window_s: 0.05, model: {step_time_ms: 2}}
pipeline: {builtin: synthetic, params: {elements: 960, batch_size: 32, latency_ms: 0.2}}
""").spec
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    metrics = tmp_path / "m.jsonl"
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.run([sys.executable, "-m", "dsctl.runtime.trainer", "--spec", str(tmp_path / "spec.json"),
                           "--mode", "colocated", "--metrics", str(metrics), "--cache-dir", str(tmp_path / "cache"),
                           "--record-ids", str(tmp_path / "ids.json")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(temp)})
    assert proc.returncode == 0, proc.stderr
    assert not list(temp.iterdir()), "the trainer leaves nothing in the temp dir (TensorFlow's autograph sources)"
    events = [json.loads(line) for line in metrics.read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[1] == "first_batch" and kinds[-1] == "end"
    windows = [e for e in events if e["event"] == "window"]
    assert windows[0]["warmup"] is True and windows[0]["batches"] == 3
    assert sum(w["batches"] for w in windows) == 30
    assert all(w["input_wait_s"] >= 0 and w["step_s"] >= 2e-3 * w["batches"] for w in windows)
    end = events[-1]
    assert end["reason"] == "end_of_data" and end["batches"] == 30 and end["measured_batches"] == 27
    assert sorted(json.loads((tmp_path / "ids.json").read_text())) == list(range(960))
