"""Autocache hints: where a pipeline may be cached, and what a hint does in this job.

    ds = dsctl.autocache(ds, "source")     # in a user's pipeline; the builtins have their own hints

Why it is built this way:
- The hint is plain graph. dsctl's orchestrator decides the caching mode before the trainer
  builds the dataset (`pipeline.autocache` in the spec JSON the trainer reads), so the trainer
  builds the graph for that mode and tf.data service ships it to the workers as usual: at the
  chosen hint a `snapshot` op, everywhere else nothing. Workers need nothing of dsctl.
- put and get are TensorFlow's own `Dataset.snapshot`: placed before the pipeline's `repeat`,
  its first pass writes while serving (put) and finalizes its metadata when the pass ends; every
  later pass (epoch) and every later job reads it instead of computing what is before the hint
  (get). Concurrent writers (several workers under parallel_epochs) write separate runs and the
  metadata names one complete run.
- The cache is keyed by a hash of the dataset graph up to the hint, with the per-process
  function-name counters taken out (`fingerprint`): the same pipeline in another job finds it, a
  changed one (another parameter, another seed) does not.
- A completion marker (`dsctl-cache.json`) is written last, by trainer 0 once TensorFlow's
  metadata says the snapshot is finalized; it lists every file with its size and SHA-256. A job
  reads a cache only if the marker is there and every file matches it; a missing marker
  (a job killed during its put epoch) or a mismatch (a corrupt file) falls back to compute and
  says why, so a cache never serves wrong or partial data.
- Sharded processing (distributed_epoch) gives each worker part of the data, so one worker's
  snapshot would be a partial cache: caching is then refused (compute, with the reason).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

MARKER = "dsctl-cache.json"
METADATA = "snapshot.metadata"
STALE_S = 600.0  # an unsealed cache untouched this long was left by a killed job; it is moved aside
MODES = ("compute", "profile")  # besides a hint's name: cache at that hint
REPLAY = "replay:"  # profiling only: "replay:<hint>" feeds the rest of the pipeline from memory at that hint
REPLAY_ELEMENTS = 32  # elements kept in memory and repeated by a replay


@dataclass
class Plan:
    """What the hints do while the trainer builds its dataset (one plan per build)."""

    mode: str = "compute"  # compute | profile | <hint name>: cache at that hint
    cache_root: str = ""
    sharded: bool = False  # the service shards the data between workers: caching would be partial
    stale_s: float = STALE_S
    points: dict = field(default_factory=dict)  # hint name -> the dataset at that point (in order)
    state: dict | None = None  # at the cached hint: {hint, key, path, state: put|get|fallback, reason}
    events: list = field(default_factory=list)  # (kind, message) for the run's record


_ACTIVE: list[Plan] = []


SHARDED = ("distributed_epoch", "dynamic", "file", "data", "file_or_data", "hint")


def plan_for(spec, mode: str, data_cache_dir) -> Plan | None:
    """The trainer's plan from the spec's `autocache:` (None without one). The orchestrator has
    replaced `auto` by its decision (a hint's name, or compute) or by `profile` for the profiling
    phase; `auto` reaching a trainer directly (no orchestrator) computes. The ideal mode reads
    one cached batch anyway, so it never caches."""
    ac = getattr(spec, "autocache", None)
    if ac is None:
        return None
    chosen = "compute" if ac.mode == "auto" or mode == "ideal" else ac.mode
    root = ac.cache_dir or f"{str(data_cache_dir).rstrip('/')}/autocache"
    if not root.startswith("gs://"):
        root = os.path.expanduser(root)
    sharded = mode == "service" and spec.service.processing_mode in SHARDED
    return Plan(mode=chosen, cache_root=root, sharded=sharded)


def report(plan: Plan | None, emit) -> None:
    """After the build: what each hint does, as events for the run's record. A mode naming a
    hint the pipeline does not have is the user's error (PipelineError)."""
    if plan is None:
        return
    if plan.mode not in MODES and plan.mode not in plan.points:
        from dsctl.runtime.pipelines.errors import PipelineError

        have = ", ".join(plan.points) or "none (call dsctl.autocache(ds, NAME) in the pipeline)"
        raise PipelineError(f"autocache.mode: {plan.mode!r} is not a hint of this pipeline; its hints are: {have}.")
    for kind, message in plan.events:
        emit("autocache", kind=kind, message=message, **(plan.state or {}))


def after_run(plan: Plan | None, emit, index: int) -> None:
    """Trainer 0 seals a cache its job wrote (the other trainers' jobs wrote the same one)."""
    if plan is None or not plan.state or plan.state.get("state") != "put" or index != 0:
        return
    kind, message, nbytes = seal(plan.state)
    plan.state["bytes"] = nbytes
    emit("autocache", kind=kind, message=message, **plan.state)


@contextlib.contextmanager
def active(plan: Plan | None):
    """Hints called inside this block follow `plan`; outside any block (or with None) a hint is a no-op."""
    if plan is None:
        yield None
        return
    _ACTIVE.append(plan)
    try:
        yield plan
    finally:
        _ACTIVE.pop()


def autocache(ds, name: str):
    """A point where caching is acceptable for training: after reading, or after deterministic
    transformations, before anything random. Returns `ds`, or `ds` read from / written to a cache
    when dsctl chose this hint for the job."""
    if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"autocache: a hint's name is letters, digits, '-' and '_', got {name!r}")
    plan = _ACTIVE[-1] if _ACTIVE else None
    if plan is None:
        return ds
    if name in plan.points:
        raise ValueError(f"autocache: the hint name {name!r} is used twice in one pipeline; give each hint its own name")
    plan.points[name] = ds
    if plan.mode == REPLAY + name:  # what comes after the hint, as a get epoch runs it with a free read
        return ds.take(REPLAY_ELEMENTS).cache().repeat()
    if plan.mode != name:
        return ds
    return _cache_at(plan, ds, name)


def fingerprint(ds) -> str:
    """A hash of the dataset graph up to here (16 hex digits), the same in every process that builds it.

    The serialized graph names its functions after a per-process counter
    (`__inference_Dataset_map_fn_47`) and tags nodes with creation metadata, so those are
    normalised first: functions are renamed (and listed) in the order they are referenced from the
    dataset's nodes, metadata and seed generators' counters are dropped.
    (TensorFlow's own DatasetFingerprint op was not stable here: range, flat_map, map, map built
    twice in one process gave two fingerprints.)
    """
    import re

    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    for node in [*graph.node, *(n for f in graph.library.function for n in f.node_def)]:
        if "metadata" in node.attr:
            del node.attr["metadata"]
    functions = {f.signature.name: f for f in graph.library.function}
    parts = ["".join(str(n) for n in graph.node)]
    if functions:
        pattern = re.compile("|".join(sorted((re.escape(n) for n in functions), key=len, reverse=True)))
        order: dict[str, str] = {}

        def visit(text: str) -> None:
            for m in pattern.finditer(text):
                order.setdefault(m.group(0), f"fn{len(order)}")

        visit(parts[0])
        done = 0
        while done < len(order):  # breadth first through the functions the nodes (then functions) call
            name = list(order)[done]
            parts.append(str(functions[name]))
            visit(parts[-1])
            done += 1
        parts = [pattern.sub(lambda m: order[m.group(0)], p) for p in parts]
    # A seeded shuffle's seed generator is a resource named after a per-process counter too.
    text = re.sub(r"(SeedGenerator)_\d+", r"\1", "\n".join(parts))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_path(root: str, name: str, key: str) -> str:
    return f"{str(root).rstrip('/')}/{name}-{key}"


def _cache_at(plan: Plan, ds, name: str):
    key = fingerprint(ds)
    path = cache_path(plan.cache_root, name, key)
    info = {"hint": name, "key": key, "path": path}
    if plan.sharded:
        reason = ("the service shards the data between workers (distributed_epoch), so each worker would cache only "
                  "its share; caching needs processing_mode: parallel_epochs")
        plan.state = {**info, "state": "fallback", "reason": reason}
        plan.events.append(("autocache-fallback", f"hint {name!r}: compute, not cached: {reason}"))
        return ds
    status, reason, nbytes = inspect(path, key, plan.stale_s)
    if status == "stale":
        aside = f"{path}.abandoned-{time.strftime('%Y%m%d-%H%M%S')}"
        _rename(path, aside)
        plan.events.append(("autocache-stale", f"hint {name!r}: {reason}; moved to {aside}, writing it again"))
        status = "absent"
    if status in ("incomplete", "corrupt"):
        plan.state = {**info, "state": "fallback", "reason": reason}
        plan.events.append(("autocache-fallback", f"hint {name!r}: compute, not cached: {reason}"))
        return ds
    state = "get" if status == "complete" else "put"
    plan.state = {**info, "state": state, "reason": reason, "bytes": nbytes}
    what = ("reading the cache a job wrote before" if state == "get"
            else "the first epoch writes the cache while serving it; later epochs read it")
    plan.events.append((f"autocache-{state}", f"hint {name!r} ({path}): {what}"))
    return ds.snapshot(path, compression=None)


# -- the cache on disk: inspect, seal -------------------------------------------------------------------
def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def _exists(path: str) -> bool:
    return _gfile().exists(path) if path.startswith("gs://") else os.path.exists(path)


def _read_bytes(path: str) -> bytes:
    with _gfile().GFile(path, "rb") as f:
        return f.read()


def _rename(src: str, dst: str) -> None:
    if src.startswith("gs://"):
        _gfile().rename(src, dst, overwrite=False)
    else:
        os.rename(src, dst)


def _files(path: str) -> list[str]:
    """Relative paths of every file below `path`, except the marker."""
    out = []
    for root, _dirs, names in _gfile().walk(path):
        for n in names:
            rel = f"{root.rstrip('/')}/{n}"[len(path.rstrip('/')) + 1:]
            if rel != MARKER:
                out.append(rel)
    return sorted(out)


def _digest(path: str) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with _gfile().GFile(path, "rb") as f:
        while True:
            chunk = f.read(1 << 22)
            if not chunk:
                break
            size += len(chunk)
            h.update(chunk)
    return size, h.hexdigest()


def inspect(path: str, key: str, stale_s: float = STALE_S) -> tuple[str, str, int | None]:
    """(status, why, bytes): absent | complete | incomplete | stale | corrupt; bytes is what a complete
    cache holds, as its marker says (what its storage is billed for), else None."""
    if not _exists(path):
        return "absent", "no cache for this pipeline yet", None
    marker = f"{path}/{MARKER}"
    if not _exists(marker):
        newest = _newest_mtime(path)
        age = time.time() - newest if newest else None
        if age is not None and age > stale_s and not path.startswith("gs://"):
            return ("stale", f"an unsealed cache nobody has written for {age:.0f} s (a job killed while writing it)",
                    None)
        return "incomplete", (f"the cache at {path} has no completion marker ({MARKER}): a job was killed while "
                              "writing it, or another job is writing it now"), None
    try:
        meta = json.loads(_read_bytes(marker))
        files = meta["files"]
        if meta.get("key") != key:
            return "corrupt", f"its marker is for pipeline {meta.get('key')!r}, not {key!r}", None
    except (ValueError, KeyError, TypeError) as exc:
        return "corrupt", f"its completion marker {marker} is unreadable ({exc})", None
    for rel, (size, sha) in files.items():
        full = f"{path}/{rel}"
        if not _exists(full):
            return "corrupt", f"{rel} is missing", None
        got_size, got_sha = _digest(full)
        if got_size != size or got_sha != sha:
            return ("corrupt", f"{rel} does not match its marker ({got_size} bytes, {size} expected, or another "
                    "checksum)", None)
    nbytes = int(meta.get("bytes", 0))
    return "complete", f"sealed cache of {meta.get('elements', '?')} elements, {nbytes} bytes", nbytes


def _newest_mtime(path: str) -> float | None:
    newest = None
    for dirpath, _dirs, names in os.walk(path):
        for n in [*names, "."]:
            try:
                m = os.stat(os.path.join(dirpath, n)).st_mtime
            except OSError:
                continue
            newest = m if newest is None else max(newest, m)
    return newest


def finalized_run(path: str) -> tuple[str, Any] | None:
    """(the snapshot's fingerprint folder, its metadata: a SnapshotMetadataRecord) once TensorFlow has finalized it;
    else None."""
    from tensorflow.core.protobuf import snapshot_pb2

    if not _exists(path):
        return None
    for sub in sorted(_gfile().listdir(path)):
        sub = sub.rstrip("/")
        meta_path = f"{path}/{sub}/{METADATA}"
        if not _exists(meta_path):
            continue
        meta = snapshot_pb2.SnapshotMetadataRecord()
        try:
            meta.ParseFromString(_read_bytes(meta_path))
        except Exception:  # noqa: BLE001 - a metadata file being rewritten: not finalized now
            continue
        if meta.finalized:
            return sub, meta
    return None


def seal(state: dict, wait_s: float = 10.0) -> tuple[str, str, int | None]:
    """After a put: write the completion marker once TensorFlow has finalized the snapshot.
    Returns (event kind, message, bytes sealed or None). Files of the finalized run only: a concurrent writer's
    unfinished run is never listed, so never read."""
    path, key = state["path"], state["key"]
    deadline = time.monotonic() + wait_s
    found = finalized_run(path)
    while found is None and time.monotonic() < deadline:
        time.sleep(0.2)
        found = finalized_run(path)
    if found is None:
        return ("autocache-unsealed", f"hint {state['hint']!r}: the put epoch did not finish (no finalized snapshot in "
                                      f"{path}); the cache is not sealed and later jobs will not read it", None)
    sub, meta = found
    files: dict[str, list] = {}  # file -> [size, sha256]
    total = 0
    for rel in _files(f"{path}/{sub}"):
        if rel == METADATA or rel.startswith(f"{meta.run_id}/"):
            size, digest = _digest(f"{path}/{sub}/{rel}")
            files[f"{sub}/{rel}"] = [size, digest]
            total += size
    marker = {"key": key, "hint": state["hint"], "run_id": meta.run_id, "bytes": total,
              "elements": int(meta.num_elements) if meta.num_elements else None,
              "sealed_at": time.time(), "files": files}
    text = json.dumps(marker, indent=1, sort_keys=True)
    if path.startswith("gs://"):
        with _gfile().GFile(f"{path}/{MARKER}", "w") as f:  # an object appears whole or not at all
            f.write(text)
    else:
        tmp = f"{path}/.{MARKER}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, f"{path}/{MARKER}")
    return ("autocache-sealed", f"hint {state['hint']!r}: cache sealed ({len(files)} files, {total} bytes) in {path}",
            total)
