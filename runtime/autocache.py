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
  reads a cache only if the marker is there, every file matches it, and the cache's folders hold
  no file the marker does not list: TensorFlow's reader takes every `*.shard/NNNNNNNN.snapshot`
  of the run it finds, so a shard added beside the sealed ones would be served as part of the
  cache (duplicates, or a DataLossError for garbage). A missing marker (a job killed during its
  put epoch), a mismatch (a corrupt file), a file the marker does not list, or a file that cannot
  be read falls back to compute and says which, so a cache never serves wrong or partial data.
  Other writers' runs (run folders beside the sealed run, also written after the seal) are allowed:
  TensorFlow reads only the run its metadata names, and that metadata is checksummed.
- A cache can still fail while a job uses it: a put whose disk fills up (TensorFlow's snapshot
  writer then fails the pipeline with ResourceExhaustedError), or a get whose files change or
  stop reading after they were checked. tf.data has no operation that catches an error and
  switches to another dataset without dropping elements (`ignore_errors` drops them), so the
  fallback is the trainer's: `recover` removes a failed put's partial files (and, when the disk
  was full, leaves a note, so later jobs compute instead of filling it again) or moves an
  unreadable cache aside, and says so; dsctl's own training loop then rebuilds the pipeline
  without the cache and computes on (runtime/trainer.py). The epoch in which the cache failed
  ends where the error reached the trainer: its elements already served were trained on, the
  rest of it is not served, and training goes on with freshly computed epochs. A keras model
  trains inside `model.fit`, which cannot take a new dataset mid-fit: that trainer fails with the
  paragraph instead, its cache cleaned up so the next run does not fail the same way.
- Sharded processing (distributed_epoch) gives each worker part of the data, so one worker's
  snapshot would be a partial cache: caching is then refused (compute, with the reason).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

MARKER = "dsctl-cache.json"
NOSPACE = "dsctl-cache-nospace.json"  # left in a cache's folder by a put that ran out of space (its files removed)
METADATA = "snapshot.metadata"
STALE_S = 600.0  # an unsealed cache untouched this long was left by a job that stopped writing it; it is moved aside
RETRY_FACTOR = 2  # a put that ran out of space after N bytes is tried again once more than 2 N bytes are free
REMOVE_S = 3.0  # how long a failed put's files are removed again as writers still running add to them
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
    """Trainer 0 seals a cache its job wrote (the other trainers' jobs wrote the same one). A trainer whose put
    failed removes what other workers' writers added to it since (`recover` removed the rest)."""
    if plan is not None and plan.state and plan.state.get("failed") == "write":
        _remove_partial(plan.state["path"], keep=(NOSPACE,), for_s=0.0)
        return
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
    if status == "retry":  # a put that ran out of space before: the disk has room enough to try again
        _remove_tree(path)
        plan.events.append(("autocache-retry", f"hint {name!r} ({path}): {reason}; writing it again"))
        status = "absent"
    if status in ("incomplete", "corrupt", "unsealed", "nospace"):
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
    """(status, why, bytes): absent | complete | incomplete | stale | corrupt | unsealed | nospace | retry; bytes is
    what a complete cache holds, as its marker says (what its storage is billed for), else None. Every reason names
    the cache's folder and, where one file is at fault, that file.

    A cache is complete only when its folders hold exactly the files its marker lists (with their sizes and
    SHA-256), besides the marker itself and the runs of concurrent writers the marker names: TensorFlow's reader
    serves every shard file it finds in the run, listed or not. A file that cannot be read is a read error of the
    cache, found before the job reads it: the job computes (corrupt), it does not fail."""
    try:
        return _inspect(path, key, stale_s)
    except Exception as exc:  # noqa: BLE001 - OSError, tf.errors.OpError: a cache that cannot be read is not read
        return ("corrupt", f"the cache at {path} could not be read ({type(exc).__name__}: {_first_line(exc)}); "
                "it is not used", None)


def _inspect(path: str, key: str, stale_s: float) -> tuple[str, str, int | None]:
    if not _exists(path):
        return "absent", "no cache for this pipeline yet", None
    marker = f"{path}/{MARKER}"
    if not _exists(marker):
        if _exists(f"{path}/{NOSPACE}"):
            return _after_nospace(path)
        newest = _newest_mtime(path)
        age = time.time() - newest if newest else None
        if age is not None and age > stale_s and not path.startswith("gs://"):
            return ("stale", f"the unsealed cache at {path} has not been written for {age:.0f} s (a job stopped while "
                    "writing it: killed, or failed)", None)
        return "incomplete", (f"the cache at {path} has no completion marker ({MARKER}): a job was killed while "
                              "writing it, or another job is writing it now"), None
    try:
        meta = json.loads(_read_bytes(marker))
        files = meta["files"]
        if meta.get("key") != key:
            return "corrupt", f"the marker of {path} is for pipeline {meta.get('key')!r}, not {key!r}", None
    except (ValueError, KeyError, TypeError) as exc:
        return "corrupt", f"its completion marker {marker} is unreadable ({exc})", None
    extra = unlisted(path, meta)
    if extra:
        more = f" (and {len(extra) - 1} more unlisted file(s))" if len(extra) > 1 else ""
        return ("unsealed", f"{path}/{extra[0]} is not one of the files its marker {MARKER} lists{more}: TensorFlow "
                "would read it as part of the cache, so the cache is no longer what was sealed. Remove that file, or "
                f"the whole folder {path} to let a job write the cache again", None)
    for rel, (size, sha) in files.items():
        full = f"{path}/{rel}"
        if not _exists(full):
            return "corrupt", f"{path}/{rel} is missing", None
        try:
            got_size, got_sha = _digest(full)
        except Exception as exc:  # noqa: BLE001 - OSError, tf.errors.OpError: an unreadable file
            return "corrupt", f"{path}/{rel} could not be read ({type(exc).__name__}: {_first_line(exc)})", None
        if got_size != size or got_sha != sha:
            return ("corrupt", f"{path}/{rel} does not match its marker ({got_size} bytes, {size} expected, or another "
                    "checksum)", None)
    nbytes = int(meta.get("bytes", 0))
    return "complete", f"sealed cache of {meta.get('elements', '?')} elements, {nbytes} bytes", nbytes


def unlisted(path: str, meta: dict) -> list[str]:
    """Files below the cache's folder that its marker does not list, other than other writers' runs.

    Several writers of one put (workers, or a second epoch that started before TensorFlow finalized the first)
    each write a run folder (`<fingerprint>/<run id>/`) beside the sealed one, also after the seal; TensorFlow
    reads only the run its snapshot.metadata names (a listed, checksummed file), so such a folder is never
    served. TensorFlow also writes a fingerprint folder of its own when a later job's graph hashes differently
    (seen on Cloud Storage under load); it reads a fingerprint folder only for a graph with that hash. A file
    anywhere else, in the sealed run's folder above all, would be served."""
    listed = set(meta.get("files") or {})
    run_id = str(meta.get("run_id") or "")
    sealed_dirs = {rel.split("/", 1)[0] for rel in listed if "/" in rel}
    out = []
    for rel in _files(path):
        if rel in listed or rel.startswith(f".{MARKER}.tmp-"):  # the marker being written (seal)
            continue
        parts = rel.split("/")
        if len(parts) >= 3 and parts[0] in sealed_dirs and parts[1] != run_id and parts[1].isdigit():
            continue  # another writer's run: not the one TensorFlow reads
        if len(parts) >= 2 and parts[0].isdigit() and parts[0] not in sealed_dirs:
            continue  # TensorFlow's snapshot of another graph fingerprint: read only by a graph that hashes to it
        out.append(rel)
    return out


def _after_nospace(path: str) -> tuple[str, str, int | None]:
    """A put that ran out of space left a note (its files removed): compute, until the disk has more room than
    twice what that put had written, a lower bound on the cache's size (each failure raises the bound)."""
    note = f"{path}/{NOSPACE}"
    try:
        meta = json.loads(_read_bytes(note))
        written = int(meta["written"])
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(meta["at"])))
    except (ValueError, KeyError, TypeError) as exc:
        return "nospace", f"{note} says a put ran out of space, but it is unreadable ({exc}); remove it", None
    free = _free_bytes(path)
    need = RETRY_FACTOR * written
    if free is not None and free > need:
        return "retry", (f"a put ran out of space at {when} after writing {written} bytes; {free} bytes are free now, "
                         f"more than {need}"), None
    now = f"{free} bytes are free now" if free is not None else "the free space of Cloud Storage is not known here"
    return "nospace", (f"writing the cache at {path} ran out of space at {when} after {written} bytes, so it needs "
                       f"more than that, and {now}. Jobs compute instead and write it again once the disk has more "
                       f"than {need} bytes free; remove {note} to try now"), None


def _free_bytes(path: str) -> int | None:
    """Free bytes on the local disk holding `path` (None for gs://)."""
    if path.startswith("gs://"):
        return None
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _first_line(exc: BaseException | str) -> str:
    text = exc if isinstance(exc, str) else (getattr(exc, "message", None) or str(exc))
    return (text.strip().splitlines() or [""])[0][:300]


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
        if rel == METADATA or rel.startswith(f"{meta.run_id}/"):  # other writers' runs: TensorFlow reads only this
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


# -- a cache that fails while a job uses it: recover ---------------------------------------------------------
def failure(plan: Plan | None, exc: BaseException) -> str | None:
    """Whether `exc`, raised while reading the job's dataset, is its cache failing: "write" (the put's snapshot
    writer failed: a full disk, a lost permission), "read" (the get's reader failed), else None.

    A writer's error names the file it was writing (under the cache's folder). A reader's error does not always
    name it: a damaged shard is TensorFlow's DataLossError ("corrupted record at 0"), which nothing else in a get
    pipeline raises (what is before the hint is not run; what is after it transforms tensors), so that counts too."""
    if plan is None or not plan.state or plan.state.get("state") not in ("put", "get"):
        return None
    import tensorflow as tf

    if not isinstance(exc, tf.errors.OpError):
        return None
    names = str(plan.state["path"]) in str(exc)
    if plan.state["state"] == "put":
        return "write" if names else None
    return "read" if names or isinstance(exc, tf.errors.DataLossError) else None


def recover(plan: Plan | None, exc: BaseException, emit, *, served: int | None, computes_on: bool) -> str | None:
    """After `exc` ended the job's dataset: if it is the cache failing (`failure`), clean up, record what happened
    (an `autocache` event, one paragraph) and return that paragraph; None when it is not the cache's.

    A failed put stops writing (its iterator is gone before this is called), its partial files are removed (again
    for a few seconds, as other workers' writers may still add to them), and when the disk was full a note is left
    so later jobs compute instead of filling it again (`_after_nospace`). An unreadable cache is moved aside (on
    Cloud Storage, where a folder cannot be renamed, its marker is), so later jobs write it again. `served`: this
    trainer's batches before the failure; `computes_on`: whether the trainer rebuilds its pipeline without the
    cache (dsctl's loop) or stops (a keras model: model.fit cannot take another dataset)."""
    kind = failure(plan, exc)
    if kind is None:
        return None
    assert plan is not None and plan.state is not None, "failure() found a cache"
    state, path, hint = plan.state, plan.state["path"], plan.state["hint"]
    error = f"{type(exc).__name__}: {_first_line(_op_message(exc))}"
    then = ("dsctl computes the pipeline from here on: that epoch ended early, after the batches already served "
            f"({served} on this trainer), and training goes on with freshly computed epochs" if computes_on else
            "this trainer stops, as a keras model's model.fit cannot switch to the computed pipeline mid-fit; run "
            "the job again: it computes, or writes the cache again")
    if kind == "write":
        written = _tree_bytes(path)
        full = _is_nospace(exc)
        _remove_partial(path, keep=(NOSPACE,))
        if full:
            _write_note(path, {"written": written, "at": time.time(), "hint": hint, "key": state.get("key"),
                               "error": error})
        free = _free_bytes(path)
        after = (f"; {free} bytes are free now. Later jobs with this pipeline compute until the disk has more than "
                 f"{RETRY_FACTOR * written} bytes free ({path}/{NOSPACE} says so)" if full and free is not None else "")
        what = "ran out of space" if full else "failed"
        message = (f"hint {hint!r}: writing the cache at {path} {what} after {written} bytes ({error}). dsctl stopped "
                   f"writing it and removed its partial files{after}; {then}.")
        event = "autocache-write-failed"
    else:
        aside = _set_aside(path)
        message = (f"hint {hint!r}: reading the cache at {path} failed after its files had been checked ({error}): "
                   f"its files changed or could not be read. It was moved to {aside}, so later jobs write it again "
                   f"(remove it once you have looked); {then}.")
        event = "autocache-read-failed"
    plan.state = {**state, "state": "fallback", "reason": message, "failed": kind}
    plan.events.append((event, message))
    emit("autocache", kind=event, message=message, **plan.state)
    return message


def _op_message(exc: BaseException) -> str:
    """An OpError's own message, without the function-node prefix TensorFlow's eager errors carry."""
    text = getattr(exc, "message", None) or str(exc)
    if text.startswith("{{function_node"):
        text = text.split("}}", 1)[-1].strip()
    return text.split(" [Op:")[0]


def _is_nospace(exc: BaseException) -> bool:
    import tensorflow as tf

    return isinstance(exc, tf.errors.ResourceExhaustedError) or "No space left" in str(exc)


def _tree_bytes(path: str) -> int:
    total = 0
    try:
        for root, _dirs, names in _gfile().walk(path):
            for n in names:
                try:
                    total += _gfile().stat(f"{root.rstrip('/')}/{n}").length
                except Exception:  # noqa: BLE001 - removed meanwhile
                    continue
    except Exception:  # noqa: BLE001 - the folder is gone
        return total
    return total


def _remove_tree(path: str) -> None:
    try:
        if path.startswith("gs://"):
            _gfile().rmtree(path)
        else:
            shutil.rmtree(path)
    except Exception:  # noqa: BLE001 - already gone, or removed by another trainer meanwhile
        pass


def _remove_partial(path: str, keep: tuple[str, ...] = (), for_s: float = REMOVE_S) -> None:
    """Remove everything below `path` but the files named in `keep`, again while it keeps changing (other workers'
    writers of the same put may still write for a moment: their next write then fails)."""
    deadline = time.monotonic() + for_s
    while True:
        try:
            entries = [e.rstrip("/") for e in _gfile().listdir(path)] if _exists(path) else []
        except Exception:  # noqa: BLE001 - removed meanwhile
            entries = []
        left = [e for e in entries if e not in keep]
        for entry in left:
            full = f"{path}/{entry}"
            try:
                if _gfile().isdir(full):
                    _remove_tree(full)
                else:
                    _gfile().remove(full)
            except Exception:  # noqa: BLE001 - removed meanwhile
                pass
        if time.monotonic() >= deadline:
            return
        time.sleep(0.25)


def _write_note(path: str, note: dict) -> None:
    text = json.dumps(note, indent=1, sort_keys=True)
    if path.startswith("gs://"):
        with _gfile().GFile(f"{path}/{NOSPACE}", "w") as f:
            f.write(text)
        return
    os.makedirs(path, exist_ok=True)
    tmp = f"{path}/.{NOSPACE}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, f"{path}/{NOSPACE}")
    except OSError:  # the disk is still full: the next job finds no marker and computes (incomplete), then stale
        try:
            os.remove(tmp)
        except OSError:
            pass


def _set_aside(path: str) -> str:
    """Move an unreadable cache out of the way; where it went (its marker, on Cloud Storage)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if path.startswith("gs://"):
        aside = f"{path}/{MARKER}.unreadable-{stamp}"
        try:
            _gfile().rename(f"{path}/{MARKER}", aside, overwrite=True)
        except Exception:  # noqa: BLE001 - another trainer moved it first
            pass
        return aside
    aside = f"{path}.unreadable-{stamp}"
    try:
        os.rename(path, aside)
    except OSError:  # another trainer moved it first
        pass
    return aside

