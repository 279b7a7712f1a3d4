"""Hybrid placement (service.placement: hybrid): tf.data service workers inside the trainer process, beside the remote
ones, so the trainer host's own CPUs (already paid for) run part of the pipeline (Pecan, USENIX ATC'24).

Why it is built this way (TensorFlow 2.16-2.21, measured with 2.21):
- The workers are TensorFlow's own WorkerServer, given the proto `service_config_pb2.WorkerConfig`: the Python
  WorkerConfig has no `worker_tags`, and WorkerServer takes the proto as it is (server_lib.py), the path TensorFlow's
  own service tests use.
- The tag COLOCATED is what keeps each trainer to its own: reading with `target_workers="AUTO"`, a client reads the
  workers in its own process and every untagged (remote) worker, and skips tagged workers in other processes
  (data_service_client.cc, ShouldReadFromTask). Untagged, a trainer's workers would be read by every other trainer
  as remote ones; tagged but in a process of their own, by none. Coordinated reads ignore target_workers, so
  specs/rules.py refuses them with hybrid placement.
- Which worker produced what is measured, not assumed: each element is tagged where it is made with the host and
  process id of the process making it (read from /proc: the map runs in the worker's process), counted here per
  producer, and the tag dropped before the model sees the element. The counts are the trainer's `placement` record.
- Under placement: auto the run's policy changes how many there are while the trainer runs: it writes the count it
  wants to CONTROL beside the trainers' metrics, and each trainer reads it when it writes a metrics window, starts
  or stops workers to match, and says in the window how many it has (`local_workers`). A stopped worker's tasks end
  with it; in parallel_epochs (the only mode autoscaling allows) the other workers go on producing.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TAG = "COLOCATED"  # the tag TensorFlow's AUTO reads only in its own process (IsColocatedTask, case-insensitive)
TARGET_WORKERS = "AUTO"  # this process's tagged workers and every untagged one
CONTROL = "local-workers.json"  # beside the trainers' metrics: {"local_workers": k}, written by the run's policy


@dataclass
class _LocalWorkers:
    """The workers this process started, and the batches it received, by the process that produced them."""

    dispatcher: str
    count: int  # the most running at once
    heartbeat_ms: int = 1000
    adjustable: bool = False  # placement: auto: the count follows CONTROL
    servers: list[Any] = field(default_factory=list)  # emptied when they are stopped
    table: Any = None  # producer "host:pid" -> batches received (counted())
    reported: bool = False
    stopping: bool = False


_STARTED: _LocalWorkers | None = None


def start(dispatcher: str, count: int, heartbeat_ms: int = 1000, adjustable: bool = False) -> None:
    """Start `count` workers tagged COLOCATED in this process, registered with `dispatcher` (host:port); once per
    process (a program that builds its input twice keeps the first ones). Stopped by stop(), or at exit. An
    `adjustable` process (placement: auto) may start with none and follows CONTROL from then on (on_window)."""
    global _STARTED
    if _STARTED is not None:
        return
    started = _STARTED = _LocalWorkers(dispatcher=dispatcher, count=count, heartbeat_ms=heartbeat_ms,
                                       adjustable=adjustable)
    atexit.register(stop)
    _resize(started, count)


def _resize(started: _LocalWorkers, count: int) -> None:
    """Start or stop workers until `count` run (the newest stopped first)."""
    import tensorflow as tf
    from tensorflow.core.protobuf import service_config_pb2

    while len(started.servers) < count:
        started.servers.append(tf.data.experimental.service.WorkerServer(service_config_pb2.WorkerConfig(
            dispatcher_address=started.dispatcher.removeprefix("grpc://"),
            worker_address="localhost:%port%",  # read by this process only: through its local-worker registry
            port=0, protocol="grpc", worker_tags=[TAG], heartbeat_interval_ms=started.heartbeat_ms)))
    while len(started.servers) > count:
        started.servers.pop().stop()
    started.count = max(started.count, count)


def on_window(writer) -> dict:
    """At each metrics window: follow the policy's CONTROL file beside the metrics `writer` writes (placement:
    auto), and what the window is to say of this process's in-process workers ({} without hybrid placement)."""
    metrics_path = getattr(writer, "path", None)  # None: a program run outside dsctl
    started = _STARTED
    if started is None or started.stopping:
        return {}
    if started.adjustable and metrics_path:
        wanted = _wanted(Path(metrics_path).parent / CONTROL)
        if wanted is not None and wanted != len(started.servers):
            _resize(started, wanted)
    return {"local_workers": len(started.servers)}


def _wanted(control: Path) -> int | None:
    """The count CONTROL asks for; None while there is none (or it is being replaced)."""
    try:
        wanted = json.loads(control.read_text())["local_workers"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return wanted if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted >= 0 else None


def ask(metrics_dir: Path, count: int) -> None:
    """The policy's side: ask every trainer of the run for `count` in-process workers (read at their next window)."""
    tmp = metrics_dir / f".{CONTROL}.tmp"
    tmp.write_text(json.dumps({"local_workers": count}))
    tmp.replace(metrics_dir / CONTROL)


def producer_tagged(ds):
    """`ds` with each element paired with the producing process, "host:pid", read where the element is made."""
    import tensorflow as tf

    def producer():
        host = tf.strings.strip(tf.io.read_file("/proc/sys/kernel/hostname"))
        pid = tf.strings.split(tf.io.read_file("/proc/self/stat"))[0]
        return tf.strings.join([host, pid], separator=":")

    return ds.map(lambda *parts: (parts[0] if len(parts) == 1 else parts, producer()))


def counted(ds):
    """The elements of a producer_tagged dataset read through the service, without their tag, each counted under
    the process that produced it.

    Counted in a TensorFlow table, never with `tf.py_function`: the trainer's prefetch thread runs this map, and a
    Python function there needs the GIL, which the main thread holds while it destroys the iterator and waits for
    that thread (a program that ends its loop hung at exit). The map is sequential, so read-add-write is safe."""
    import tensorflow as tf

    table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=0)
    if _STARTED is not None:
        _STARTED.table = table

    def untag(element, tag):
        done = table.insert(tag, table.lookup(tag) + 1)
        with tf.control_dependencies([done]):
            return tf.nest.map_structure(tf.identity, element, expand_composites=True)

    return ds.map(untag)


def here() -> str:
    """This process as producer_tagged names it."""
    return f"{socket.gethostname()}:{os.getpid()}"


def report(emit) -> None:
    """The `placement` record: the in-process workers and the batches received from them and from each remote
    worker's process (a producer "host:pid"; several in-process workers share this process's)."""
    started = _STARTED
    if started is None or started.reported:
        return
    started.reported = True
    received: dict[str, int] = {}
    if started.table is not None:
        keys, values = started.table.export()
        received = {k.decode(): int(v) for k, v in zip(keys.numpy(), values.numpy())}
    me = here()
    emit("placement", placement="auto" if started.adjustable else "hybrid", local_workers=started.count,
         local_workers_at_end=len(started.servers), process=me,
         local_batches=received.get(me, 0), remote_batches=sum(n for p, n in received.items() if p != me),
         by_producer=received)


def stop() -> None:
    """Stop this process's workers (their tasks end with them); what they served stays for report()."""
    started = _STARTED
    if started is None:
        return
    started.stopping = True
    servers, started.servers = started.servers, []
    for server in servers:
        server.stop()


def finish(emit) -> None:
    """At the end of training: the placement record, then the workers stopped (nothing without hybrid placement)."""
    report(emit)
    stop()
