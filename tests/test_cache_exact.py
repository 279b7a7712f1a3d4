"""A sealed autocache cache is exactly the files its marker lists, and a cache that fails while a job uses it never
fails the job with TensorFlow's raw error: reproductions with real trainer processes (an extra shard, a garbage
shard, shards that turn unreadable mid-job) and a real `dsctl up` whose cache is a 5 MB tmpfs that fills in the put
epoch.

The trainers here run colocated (`python -m dsctl.runtime.trainer --mode colocated`): the cache is read and written
by the same snapshot op as on a worker, without starting servers; the full disk runs through the service, as the
failure was seen.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from dsctl.orchestrator.store import RunStore
from dsctl.specs import load_spec_text
from helpers import dsctl, tmpfs, write_spec

pytestmark = pytest.mark.integration  # trainer processes; `dsctl up`

ELEMENTS = 96
JOB = """
name: exact
trainer: {{machine: n2-standard-8, steps: 100000, warmup_batches: 0, model: {{kind: synthetic, step_time_ms: {step_ms}}}}}
pipeline:
  builtin: synthetic
  params: {{elements: {elements}, shards: 4, batch_size: 8, feature_size: {features}, epochs: {epochs}}}
autocache: {{mode: full, cache_dir: {cache}}}
"""


def trainer(tmp: Path, cache: Path, name: str, *, epochs: int = 2, step_ms: int = 0, elements: int = ELEMENTS,
            features: int = 4, wait: bool = True):
    """One colocated trainer of a job cached at the `full` hint; (exit code, metrics records, ids) once it ends,
    or the process when wait=False."""
    spec = load_spec_text(JOB.format(elements=elements, features=features, epochs=epochs, step_ms=step_ms,
                                     cache=cache)).spec
    run = tmp / name
    run.mkdir()
    (run / "spec.json").write_text(spec.model_dump_json())
    proc = subprocess.Popen([sys.executable, "-m", "dsctl.runtime.trainer", "--spec", str(run / "spec.json"),
                             "--mode", "colocated", "--metrics", str(run / "m.jsonl"), "--cache-dir", str(tmp / "data"),
                             "--record-ids", str(run / "ids.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not wait:
        return proc
    return finished(proc, run)


def finished(proc: subprocess.Popen, run: Path):
    out, _ = proc.communicate(timeout=180)
    records = records_of(run)
    ids = json.loads((run / "ids.json").read_text()) if (run / "ids.json").exists() else []
    assert "Traceback" not in out or proc.returncode != 0, out[-3000:]
    return proc.returncode, records, ids, out


def records_of(run: Path) -> list[dict]:
    path = run / "m.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def cache_events(records: list[dict]) -> dict[str, str]:
    return {r["kind"]: r["message"] for r in records if r.get("event") == "autocache"}


@pytest.fixture(scope="module")
def sealed(tmp_path_factory) -> Path:
    """A job that put and sealed the cache (once for the module); its cache root."""
    tmp = tmp_path_factory.mktemp("sealed")
    code, records, ids, out = trainer(tmp, tmp / "ac", "put")
    assert code == 0, out[-3000:]
    assert {"autocache-put", "autocache-sealed"} <= set(cache_events(records)), records
    assert Counter(ids) == Counter(list(range(ELEMENTS)) * 2)
    return tmp / "ac"


def sealed_cache(sealed: Path, tmp: Path) -> Path:
    """A copy of the sealed cache for one test; its folder."""
    shutil.copytree(sealed, tmp / "ac")
    [path] = (tmp / "ac").glob("full-*")
    return path


def test_a_shard_added_to_a_sealed_cache_is_named_and_never_read(sealed, tmp_path):
    """A copy of a shard beside the sealed ones was served (each epoch half as many elements again, all duplicates);
    a garbage one failed every later job with DataLossError. Either makes the cache unsealed: the job computes, and
    its event names the file."""
    path = sealed_cache(sealed, tmp_path)
    shard = sorted(path.rglob("00000000.shard/00000000.snapshot"))[0]
    extra = shard.parent.parent / "00000002.shard" / "00000000.snapshot"
    extra.parent.mkdir()
    shutil.copy(shard, extra)
    code, records, ids, out = trainer(tmp_path, tmp_path / "ac", "copy")
    assert code == 0, out[-3000:]
    assert Counter(ids) == Counter(list(range(ELEMENTS)) * 2)  # no duplicates: the cache was not read
    message = cache_events(records)["autocache-fallback"]
    assert str(extra) in message and "not one of the files its marker" in message, message

    extra.write_bytes(os.urandom(extra.stat().st_size))  # a garbage shard
    code, records, ids, out = trainer(tmp_path, tmp_path / "ac", "garbage")
    assert code == 0 and "DataLossError" not in out, out[-3000:]
    assert Counter(ids) == Counter(list(range(ELEMENTS)) * 2)
    assert str(extra) in cache_events(records)["autocache-fallback"]


def test_a_cache_that_turns_unreadable_mid_job_is_set_aside_and_the_job_computes_on(sealed, tmp_path):
    """The shards are checked when the job starts, then replaced by garbage while its first get epoch reads them:
    the second epoch's read fails. The trainer moves the cache aside, says so naming it, and trains on computed
    epochs; it does not fail with DataLossError."""
    path = sealed_cache(sealed, tmp_path)
    proc = trainer(tmp_path, tmp_path / "ac", "get", epochs=3, step_ms=50, wait=False)
    run = tmp_path / "get"
    deadline = time.monotonic() + 120
    while not any(r.get("event") == "first_batch" for r in records_of(run)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.02)
    for shard in path.rglob("*.snapshot"):  # new files: the epoch being read keeps the ones it opened
        tmp = shard.with_suffix(".tmp")
        tmp.write_bytes(os.urandom(shard.stat().st_size))
        os.replace(tmp, shard)
    code, records, ids, out = finished(proc, run)
    assert code == 0 and "Traceback" not in out, out[-3000:]
    events = cache_events(records)
    assert events and "autocache-get" in events, events
    message = events["autocache-read-failed"]
    assert str(path) in message and "moved to" in message, message
    [aside] = path.parent.glob(f"{path.name}.unreadable-*")
    assert not path.exists() and str(aside) in message
    # The first epoch came from the cache; the failed one served nothing more; then three computed epochs.
    assert Counter(ids) == Counter(list(range(ELEMENTS)) * 4)
    end = [r for r in records if r.get("event") == "end"][-1]
    assert end["reason"] == "end_of_data" and end["batches"] == 4 * ELEMENTS // 8


@pytest.fixture
def small_cache(tmp_path):
    """A 5 MB tmpfs for the cache, unmounted after the test."""
    with tmpfs(tmp_path / "cache5m", "5m") as disk:
        yield disk


FULL_JOB = """
name: fills
service: {{workers: 1}}
trainer: {{machine: n2-standard-8, steps: 100000, warmup_batches: 0}}
pipeline:
  builtin: synthetic
  params: {{elements: 2048, shards: 4, batch_size: 16, feature_size: 1024, epochs: 2}}
autocache: {{mode: full, cache_dir: {cache}}}
"""


@pytest.mark.slow
def test_a_cache_disk_that_fills_in_the_put_epoch_is_emptied_and_the_job_computes_on(home, tmp_path, small_cache):
    """An epoch of 8 MB into a 5 MB tmpfs, through the service: the job used to fail with ResourceExhaustedError and
    keep its partial cache (the disk stayed full). Now the put stops, its files are removed, the job trains on
    computed epochs and succeeds, and later jobs compute without writing until the disk has room."""
    spec = write_spec(tmp_path, FULL_JOB.format(cache=small_cache))
    proc = dsctl("up", spec, "--json", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ResourceExhaustedError" not in proc.stderr
    run = json.loads(proc.stdout)
    events = {e["kind"]: e["message"] for e in RunStore().events(run["id"])}
    message = events["autocache-write-failed"]
    [path] = small_cache.glob("full-*")
    assert f"writing the cache at {path} ran out of space" in message and "removed its partial files" in message
    # Only the note is left, and the disk has its space back.
    assert [p.name for p in path.iterdir()] == ["dsctl-cache-nospace.json"]
    assert shutil.disk_usage(small_cache).used < 1 << 20
    # A later job with the pipeline computes, saying why, until the disk has more room than twice what was written.
    from dsctl.runtime import autocache as ac

    status, reason, _ = ac.inspect(str(path), path.name.split("-", 1)[1])
    assert status == "nospace" and "ran out of space" in reason and str(path) in reason, reason


def test_only_other_writers_runs_and_other_fingerprints_are_left_out_of_the_exact_check(tmp_path):
    """What TensorFlow never reads for the sealed pipeline (another writer's run folder beside the sealed run, a
    fingerprint folder of its own for a graph that hashed differently) may be there; anything else may not."""
    from dsctl.runtime import autocache

    listed = ["111/snapshot.metadata", "111/7/00000000.shard/00000000.snapshot"]
    allowed = ["111/8/00000000.shard/00000000.snapshot", "222/snapshot.metadata", "222/9/00000000.shard/x.snapshot"]
    refused = ["111/7/00000001.shard/00000000.snapshot", "111/extra.snapshot", "111/tmp/x.snapshot", "junk.txt",
               "notes/x.snapshot"]
    for rel in listed + allowed + refused:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    meta = {"run_id": "7", "files": {rel: [1, "-"] for rel in listed}}
    assert autocache.unlisted(str(tmp_path), meta) == sorted(refused)
