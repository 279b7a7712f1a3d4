"""`kill -9` of `dsctl up` at any moment, then `dsctl down`: nothing is left and every run has a status.

Twelve seeded moments, one in each twelfth of a short job's life (provisioning, training, tearing down).
The trials run four at a time in one DSCTL_HOME, as a team's jobs would; `dsctl down --all` runs once
the four `up`s of a round are gone, so it never takes down a trial still being timed.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

import psutil
import pytest

from dsctl.orchestrator.store import RunStore
from helpers import dsctl, processes_under, write_spec

pytestmark = pytest.mark.slow

SEED, TRIALS, AT_ONCE = 20261125, 12, 4
LIFE_S = 16.0  # a round's `up`s live about this long on this machine: the moments fall in [0, LIFE_S)
JOB = """
    name: killed
    service: {workers: 1}
    trainer: {model: {step_time_ms: 2}, steps: 1500, warmup_batches: 2}
    pipeline: {builtin: synthetic, params: {latency_ms: 1, batch_size: 8, epochs: null}}
"""
ENDED = {"succeeded", "failed", "interrupted"}


def _round(spec, moments: list[float]) -> list[str]:
    """Start one `up` per moment, kill -9 each at its moment (if still running); say how each ended."""
    started = time.monotonic()
    ups = [subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", str(spec)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in moments]
    ends = []
    for up, at in sorted(zip(ups, moments), key=lambda pair: pair[1]):
        time.sleep(max(0.0, started + at - time.monotonic()))
        if up.poll() is None:
            up.kill()
            ends.append(f"killed at {at:.1f} s")
        else:
            ends.append(f"ended by itself (exit {up.returncode}) before {at:.1f} s")
        up.communicate(timeout=60)
    return ends


def _service_ports(home) -> set[int]:
    """The ports the runs' dispatchers and workers were given (from each run's state file)."""
    ports = set()
    for state in (home / "runs").glob("*/state.json"):
        try:
            nodes = json.loads(state.read_text()).get("nodes", [])
        except ValueError:
            continue
        ports |= {int(n["address"].rsplit(":", 1)[1]) for n in nodes if n.get("address")}
    return ports


def _listening(ports: set[int]) -> list:
    return [c.laddr for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.laddr.port in ports]


def test_kill_9_of_up_at_twelve_random_moments_then_down_leaves_nothing(home, tmp_path):
    spec = write_spec(tmp_path, JOB)
    rng = random.Random(SEED)
    # Stratified: one moment in each twelfth of the life, so few trials still cover all of it; shuffled, so
    # each round of four has early and late ones.
    moments = [(i + rng.random()) * LIFE_S / TRIALS for i in range(TRIALS)]
    rng.shuffle(moments)
    ends = []
    for first in range(0, TRIALS, AT_ONCE):
        ends += _round(spec, moments[first:first + AT_ONCE])
        ports = _service_ports(home)
        down = dsctl("down", "--all", timeout=180)
        assert down.returncode == 0 and "Traceback" not in down.stderr, down.stderr
        assert processes_under(home) == [], f"left running after `dsctl down --all` ({ends})"
        assert _listening(ports) == [], "a service port still listens"
        assert json.loads(dsctl("status", "--json", check=True).stdout) == []
    assert sum(e.startswith("killed") for e in ends) >= TRIALS // 2, ends
    records = RunStore().list(kinds=("job",))
    assert records, "the runs that started are recorded"
    unended = [(r.id, r.status) for r in records if r.status not in ENDED]
    assert unended == [], f"runs without a final status: {unended}"
    assert all(r.ended_at for r in records)
