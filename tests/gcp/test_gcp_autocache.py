"""Autocache on the Google Cloud path, with no cloud: the policy profiles on the "VMs", the workers write
the chosen cache to gs:// and the next job's workers read it from there.

The stand-ins are those of test_gcp_job.py (Compute stand-in, real sshd, GCS emulator), and every process
on a "VM" reaches Cloud Storage through gcs_proxy.py, which serves TensorFlow's own GCS filesystem from the
emulator. So the snapshot files, the completion marker and the storage calibration all go through
TensorFlow's gs:// code, as on Google Cloud.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter

import pytest
from conftest import BUCKET, PROJECT, gcp_spec

from dsctl.orchestrator.run import JobRunner
from dsctl.orchestrator.store import RunStore
from dsctl.specs import load_spec

pytestmark = pytest.mark.slow

# A 10 ms read per element before the source hint and about 1 ms of CPU after it: through the emulator a
# cached element costs about 2.5 ms to read (measured here), so the full cache is the clear choice.
PIPELINE = ("{builtin: synthetic, params: {elements: 192, shards: 4, batch_size: 16, latency_ms: 10, cpu_work: 40, "
            "feature_size: 16, epochs: 3}}")
PREFIX = "autocache/"


def _kinds(run_id: str) -> list[str]:
    return [e["kind"] for e in RunStore().events(run_id)]


def test_auto_profiles_on_the_vms_and_the_next_job_reads_the_cache_from_cloud_storage(
        cloud, sshd, gcs_emulator, home, tmp_path):
    from gcs_proxy import GcsProxy

    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, name="cached", workers=1,
                    trainer_machine="n2-standard-8", mode="parallel_epochs", pipeline=PIPELINE)
    with spec.open("a") as f:
        f.write(f"autocache: {{mode: auto, profile_s: 0.5, cache_dir: 'gs://{BUCKET}/{PREFIX}'}}\n")

    with GcsProxy(emulator_endpoint=gcs_emulator, workdir=tmp_path / "proxy") as proxy:
        sshd.set_env(proxy.env)  # every process on a "VM" reaches Cloud Storage through the proxy
        try:
            first = JobRunner(load_spec(spec))
            s1 = first.run()
            written = proxy.bytes_written(bucket=BUCKET, prefix=PREFIX)
            read_before = proxy.bytes_read(bucket=BUCKET, prefix=PREFIX)
            second = JobRunner(load_spec(spec))
            s2 = second.run()
            read_second = proxy.bytes_read(bucket=BUCKET, prefix=PREFIX) - read_before
        finally:
            sshd.set_env({})
        refused = list(proxy.refused)

    store = RunStore()
    assert store.get(first.run_id).status == "succeeded", store.get(first.run_id).error
    assert store.get(second.run_id).status == "succeeded", store.get(second.run_id).error
    assert refused == []

    # Job 1: profiled on the trainer VM (the storage model measured on gs://), chose the full cache, wrote it.
    ac1 = s1["autocache"]
    assert ac1["choice"] == "full", ac1
    assert ac1["inputs"]["storage_kind"] == "gcs" and ac1["inputs"]["gb_month"] > 0
    kinds1 = _kinds(first.run_id)
    assert "autocache-profile" in kinds1
    assert kinds1.index("autocache") < kinds1.index("autocache-put") < kinds1.index("autocache-sealed")
    assert written > 0

    # The sealed cache in the bucket: a marker listing every object, each of the size it says.
    blobs = {b.name: b.size for b in _client().list_blobs(BUCKET, prefix=PREFIX)}
    [marker_name] = [n for n in blobs if n.endswith("/dsctl-cache.json")]
    marker = json.loads(_client().bucket(BUCKET).blob(marker_name).download_as_bytes())
    folder = marker_name.rsplit("/", 1)[0]
    assert folder.split("/")[-1].startswith("full-") and marker["hint"] == "full"
    assert marker["files"] and all(blobs[f"{folder}/{rel}"] == size for rel, (size, _sha) in marker["files"].items())

    # What the cache costs to keep: its sealed bytes on gcs, by the month (dsctl cost report prices it too).
    assert ac1["cache"]["bytes"] == marker["bytes"] and ac1["cache"]["state"] == "put"
    kept = s1["cost"]["cache_storage"]
    assert (kept["kind"], kept["gb"] * 1e9, kept["gb_month"]) == ("gcs", marker["bytes"], ac1["inputs"]["gb_month"])

    # Job 2: the same pipeline reads job 1's cache from Cloud Storage, without profiling or writing.
    ac2 = s2["autocache"]
    assert ac2["choice"] == "full" and "cache hit" in ac2["reason"]
    kinds2 = _kinds(second.run_id)
    assert "autocache-get" in kinds2
    assert "autocache-put" not in kinds2 and "autocache-profile" not in kinds2
    assert ac2["cache"]["state"] == "get" and ac2["cache"]["bytes"] == marker["bytes"]
    assert read_second >= marker["bytes"]  # the get epochs read the cache's objects from the bucket
    # Both jobs delivered the whole dataset: 3 epochs of 192 elements in batches of 16 (parallel_epochs, 1 worker).
    assert s1["batches"] == s2["batches"] == 3 * 192 // 16
    assert cloud.counts() == {"instances": 0, "firewalls": 0, "tpus": 0}


def _client():
    """The bucket as the stand-in project's owner sees it (through the storage gate)."""
    from conftest import owner_storage

    return owner_storage()


def _raw_client():
    """The emulator itself (STORAGE_EMULATOR_HOST set to it, no gate): for a test of TensorFlow's gs:// reads alone."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project=PROJECT, credentials=AnonymousCredentials())


# One job as a trainer runs it, in a process whose only GCS configuration is the proxy's environment:
# build the synthetic pipeline with the cache at gs://, read it (all of it, or `stop_after` batches and
# die as a killed job does), seal what it put. Prints the hint's state and the element ids it read.
_JOB = textwrap.dedent("""\
    import json, os, sys, tempfile
    from dsctl.runtime import autocache as ac
    from dsctl.runtime.pipelines import build_dataset
    root, features, stop_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    params = dict(elements=96, shards=4, batch_size=8, feature_size=features, epochs=2, latency_ms=2)
    plan = ac.Plan(mode="full", cache_root=root)
    with ac.active(plan):
        ds = build_dataset("synthetic", params, cache_dir=tempfile.mkdtemp())
    ids = []
    for n, batch in enumerate(ds):
        ids += [int(i) for i in batch["id"].numpy()]
        if n + 1 == stop_after:  # in the put epoch (12 batches), after TensorFlow started writing
            os._exit(9)
    ac.after_run(plan, lambda *a, **k: None, 0)
    print("RESULT " + json.dumps({"state": plan.state["state"], "reason": plan.state["reason"], "ids": ids,
                                  "path": plan.state["path"], "bytes": plan.state.get("bytes")}))
    """)


def _job(env: dict, root: str, features: int, stop_after: int = 0) -> dict | None:
    proc = subprocess.run([sys.executable, "-c", _JOB, root, str(features), str(stop_after)], env=env,
                          capture_output=True, text=True, timeout=180)
    if stop_after:
        assert proc.returncode == 9, proc.stderr[-3000:]
        return None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_a_gs_cache_that_is_corrupt_or_half_written_is_never_read(gcs_emulator, tmp_path, monkeypatch):
    """The runtime's checks through TensorFlow's gs:// filesystem: put and seal, get, then an object changed
    in the bucket (same size) and a job killed in its put epoch: both fall back to compute, with every element."""
    import os

    from gcs_proxy import GcsProxy

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    root = f"gs://{BUCKET}/fallback"
    every = Counter(list(range(96)) * 2)
    with GcsProxy(emulator_endpoint=gcs_emulator, workdir=tmp_path / "proxy") as proxy:
        env = {**os.environ, **proxy.env}
        put = _job(env, root, features=4)
        assert put["state"] == "put" and put["bytes"] > 0 and Counter(put["ids"]) == every
        got = _job(env, root, features=4)
        assert got["state"] == "get" and got["bytes"] == put["bytes"] and Counter(got["ids"]) == every

        # One snapshot object the marker lists, rewritten in the bucket with one byte flipped: same size, another
        # checksum. (The bucket may also hold fingerprint folders TensorFlow wrote for a graph that hashed
        # differently; they are never read, so a flipped byte there must not matter: pick a listed file.)
        from dsctl.runtime.autocache import MARKER

        prefix = put["path"].removeprefix(f"gs://{BUCKET}/") + "/"
        listed = json.loads(_raw_client().bucket(BUCKET).blob(prefix + MARKER).download_as_bytes())["files"]
        name = prefix + next(rel for rel in sorted(listed) if rel.endswith(".snapshot"))
        blob = _raw_client().bucket(BUCKET).blob(name)  # not a listed blob: its mediaLink names the real host
        data = bytearray(blob.download_as_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.upload_from_string(bytes(data))
        bad = _job(env, root, features=4)
        assert bad["state"] == "fallback" and "does not match its marker" in bad["reason"], bad["reason"]
        assert Counter(bad["ids"]) == every

        # Another pipeline (another feature size), killed during its put epoch: objects in the bucket, no marker.
        _job(env, root, features=5, stop_after=5)
        half = _job(env, root, features=5)
        assert half["state"] == "fallback" and "no completion marker" in half["reason"], half["reason"]
        assert half["path"] != put["path"] and Counter(half["ids"]) == every
        assert [b for b in _raw_client().list_blobs(BUCKET, prefix=half["path"].removeprefix(f"gs://{BUCKET}/"))]
        refused = list(proxy.refused)
    assert refused == []

