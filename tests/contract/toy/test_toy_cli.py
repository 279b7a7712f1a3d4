"""`dsctl up` (its plan too), `status`, `down` and `cost report` on the toy provider through the real CLI: each a
process of its own that finds the toy by its entry point (its folder on PYTHONPATH, as an installed plugin is found),
with real servers and a trainer; the run is priced from the toy's catalog with its own extras, never Google Cloud's."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from dsctl.orchestrator.store import RunStore
from helpers import dsctl, wait_for, write_spec

pytestmark = pytest.mark.slow

TOY = Path(__file__).parent
SPEC = """
name: toyrun
provider: toy
service: {workers: 1, worker_machine: toy-small, dispatcher_machine: toy-small}
trainer: {machine: toy-large, steps: 30, warmup_batches: 2, window_s: 0.5, model: {step_time_ms: 5}}
pipeline: {builtin: synthetic, params: {elements: 64, batch_size: 4, epochs: null, latency_ms: 2}}
"""
LARGE = 8 * 0.01 + 32 * 0.002  # toy-large at the toy's rates, $/h
VOLUME_GB_HOUR = 0.073 / 730


def test_a_toy_run_goes_up_shows_goes_down_and_is_priced_as_a_toy(home, tmp_path):
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(TOY.parents[1]), str(TOY), os.environ.get("PYTHONPATH"))
                                         if p)}
    spec = write_spec(tmp_path, SPEC)
    plan = dsctl("up", spec, "--dry-run", env=env, check=True).stdout
    assert "on the toy provider (processes on this machine); prices: toy-2026" in plan and "toy-large (process)" in plan
    assert "dry run: nothing was created." in plan and not (home / "runs").exists()
    started = dsctl("up", spec, "--detach", "--yes", env=env, check=True)
    run_id = re.search(r"started run (\S+) in the background", started.stdout).group(1)

    def show() -> dict:
        return json.loads(dsctl("runs", "show", run_id, "--json", env=env, check=True).stdout)

    # Recorded before `up --detach` returned: every command knows the id it said at once.
    assert RunStore().get(run_id) is not None
    # The job runs to its end; the service stays up, supervised, until `dsctl down`.
    record = wait_for(lambda: (r := show())["status"] != "running" and r, timeout=240, interval=2,
                      what="the toy job to end")
    assert record["status"] == "succeeded" and record["summary"]["batches"] == 30, record
    [row] = [r for r in json.loads(dsctl("status", "--json", env=env, check=True).stdout) if r["run"] == run_id]
    assert (row["provider"], row["status"], row["workers"], row["monitor"].startswith("pid")) == ("toy", "up", 1, True)
    assert dsctl("down", run_id, env=env, check=True).stdout.strip() == f"{run_id}: down"
    assert json.loads(dsctl("status", "--json", env=env, check=True).stdout) == []

    [cost] = json.loads(dsctl("cost", "report", run_id, "--format", "json", env=env, check=True).stdout)
    hours = cost["job_time_s"] / 3600
    assert cost["prices"] == "toy-2026" and cost["trainers"] == pytest.approx(LARGE * hours)
    assert cost["scratch_volume_cost"] == pytest.approx(2 * 10 * VOLUME_GB_HOUR * hours)  # the dispatcher's and worker's
    assert cost["lease_cost"] == pytest.approx(0.5 * hours)
    assert cost["additions_status"] == "recorded" and "ipv4_cost" not in cost
    assert all("toy" in s["source"] for s in cost["price_sources"]), cost["price_sources"]
