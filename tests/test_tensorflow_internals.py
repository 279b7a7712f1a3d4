"""The TensorFlow internals dsctl's runtime relies on: not public API, so a TensorFlow release may change them.

One test per internal, exercising it the way dsctl does (in this process, small datasets, servers on
loopback ports). When one fails, its message names the internal and the dsctl module to update; the
rest of the suite may then fail in less telling ways (a queue fill that is always None, a dispatcher
whose worker count is never written, a cache that is never sealed).

    internal                                                   used by
    iterator._iterator_resource                                runtime/queuefill.py
    tf.raw_ops.IteratorGetModelProto + model_pb2.ModelProto    runtime/queuefill.py
      (its `DataService` node's buffered_elements)
    tensorflow.python.data.experimental.ops.testing.sleep      runtime/pipelines/synthetic.py, runtime/autocache_bench.py
    service_config_pb2.DispatcherConfig (and its fields)       runtime/dispatcher.py
    service_config_pb2.WorkerConfig (and its fields)           runtime/worker.py
    DispatchServer._num_workers()                              runtime/dispatcher.py (its status, its heartbeat)
    WorkerServer._num_tasks()                                  runtime/worker.py (its heartbeat)
    WorkerServer._address                                      runtime/worker.py
    DispatchServer._stop / WorkerServer._stop                  runtime/serve.py
    Dataset._as_serialized_graph() + graph_pb2.GraphDef        runtime/autocache.py (fingerprint)
    snapshot_pb2.SnapshotMetadataRecord, snapshot.metadata     runtime/autocache.py (finalized_run, seal)
    Keras's CompileMetrics class name; total/count of means    runtime/keras_runner.py (_leaf_metrics, _metric_state)
    Options().experimental_optimization.inject_prefetch        runtime/keras_input.py (InputMeter.wrap)
    get_model_proto: a node's processing_time, num_elements,   runtime/profiling/model.py (read)
      bytes, node_class, inputs, parameters
    Dataset._inputs(), _map_func._func, _sleep_microseconds    runtime/profiling/chain.py (python_chain)
    DatasetFromGraph + from_variant of a rewritten GraphDef     runtime/profiling/rewrite.py (parallelize)
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.integration  # imports TensorFlow (and Keras) in this process, starts tf.data servers in it

tf = pytest.importorskip("tensorflow")


def changed(internal: str, module: str, detail: str = "") -> str:
    """The failure message: what changed, in which TensorFlow, and which dsctl module to update."""
    return (f"TensorFlow {tf.__version__} changed {internal}, which dsctl relies on: update {module}"
            + (f" ({detail})" if detail else "") + ".")


def stop(server) -> None:
    """As runtime/serve.py stops a server: _stop() in a thread, given a few seconds (tensorflow#56490)."""
    stopper = threading.Thread(target=server._stop, daemon=True)
    stopper.start()
    stopper.join(timeout=5)


# -- the servers, configured as runtime/dispatcher.py and runtime/worker.py configure them -----------------------------

DISPATCHER_FIELDS = ("port", "protocol", "work_dir", "fault_tolerant_mode", "worker_timeout_ms")
WORKER_FIELDS = ("dispatcher_address", "worker_address", "port", "protocol", "heartbeat_interval_ms",
                 "cross_trainer_cache_size_bytes", "shutdown_quiet_period_ms")


def dispatcher_config(work_dir: str = "", fault_tolerant: bool = False):
    from tensorflow.core.protobuf import service_config_pb2

    config = service_config_pb2.DispatcherConfig(port=0, protocol="grpc", work_dir=work_dir,
                                                 fault_tolerant_mode=fault_tolerant)
    config.worker_timeout_ms = 5000
    return config


def worker_config(dispatcher: str):
    from tensorflow.core.protobuf import service_config_pb2

    return service_config_pb2.WorkerConfig(
        dispatcher_address=dispatcher.removeprefix("grpc://"), worker_address="localhost:%port%", port=0,
        protocol="grpc", heartbeat_interval_ms=100, cross_trainer_cache_size_bytes=1024 * 1024,
        shutdown_quiet_period_ms=100)


@pytest.fixture(scope="module")
def service():
    """One dispatcher and one worker in this process, made from the protos as dsctl makes them."""
    dispatcher = tf.data.experimental.service.DispatchServer(dispatcher_config())
    worker = tf.data.experimental.service.WorkerServer(worker_config(dispatcher.target))
    yield dispatcher, worker
    stop(worker)
    stop(dispatcher)


def test_dispatcher_config_has_the_fields_dsctl_sets():
    from tensorflow.core.protobuf import service_config_pb2

    fields = service_config_pb2.DispatcherConfig.DESCRIPTOR.fields_by_name
    missing = [f for f in DISPATCHER_FIELDS if f not in fields]
    assert not missing, changed(f"service_config_pb2.DispatcherConfig (no field {', '.join(missing)})",
                                "runtime/dispatcher.py")


def test_worker_config_has_the_fields_dsctl_sets():
    from tensorflow.core.protobuf import service_config_pb2

    fields = service_config_pb2.WorkerConfig.DESCRIPTOR.fields_by_name
    missing = [f for f in WORKER_FIELDS if f not in fields]
    assert not missing, changed(f"service_config_pb2.WorkerConfig (no field {', '.join(missing)})",
                                "runtime/worker.py", "the proto is the only way to set the cross-trainer cache size")


def test_a_fault_tolerant_dispatcher_from_the_proto_journals_to_its_work_dir(tmp_path):
    """runtime/dispatcher.py passes the proto itself (DispatchServer takes it as is) and restarts a dispatcher from
    its journal in work_dir."""
    try:
        dispatcher = tf.data.experimental.service.DispatchServer(dispatcher_config(str(tmp_path), fault_tolerant=True))
    except Exception as exc:  # noqa: BLE001
        pytest.fail(changed("DispatchServer(service_config_pb2.DispatcherConfig(...))", "runtime/dispatcher.py",
                            f"the server no longer takes the proto: {exc!r}"))
    try:
        assert dispatcher.target.startswith("grpc://localhost:"), changed("DispatchServer.target", "runtime/dispatcher.py")
        assert any(tmp_path.iterdir()), changed("the fault-tolerant dispatcher's journal (nothing in its work_dir)",
                                                "runtime/dispatcher.py")
    finally:
        stop(dispatcher)


def test_the_dispatcher_counts_its_workers_with_num_workers(service):
    dispatcher, _ = service
    assert hasattr(dispatcher, "_num_workers"), changed("DispatchServer._num_workers()", "runtime/dispatcher.py",
                                                        "the status file's worker count")
    deadline = time.monotonic() + 10
    while dispatcher._num_workers() < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dispatcher._num_workers() == 1, changed("DispatchServer._num_workers()", "runtime/dispatcher.py",
                                                   "it no longer counts the registered worker")


def test_the_worker_answers_its_heartbeat_probe_with_num_tasks(service):
    _, worker = service
    assert isinstance(getattr(worker, "_num_tasks", lambda: None)(), int), changed(
        "WorkerServer._num_tasks()", "runtime/worker.py", "the worker's heartbeat probe; without it a wedged worker is "
        "found only when its process is stopped")


def test_the_worker_says_its_port_in_its_address(service):
    _, worker = service
    address = getattr(worker, "_address", None)
    assert isinstance(address, str), changed("WorkerServer._address", "runtime/worker.py")
    host, _, port = address.rpartition(":")
    assert host and port.isdigit() and int(port) > 0, changed("WorkerServer._address", "runtime/worker.py",
                                                              f"'{address}' is not host:port")


def test_servers_stop_with_their_private_stop():
    dispatcher = tf.data.experimental.service.DispatchServer(dispatcher_config())
    worker = tf.data.experimental.service.WorkerServer(worker_config(dispatcher.target))
    for server in (worker, dispatcher):
        assert callable(getattr(server, "_stop", None)), changed(f"{type(server).__name__}._stop", "runtime/serve.py")
        stopper = threading.Thread(target=server._stop, daemon=True)
        stopper.start()
        stopper.join(timeout=10)
        assert not stopper.is_alive(), changed(f"{type(server).__name__}._stop", "runtime/serve.py",
                                               "it did not return within 10 s on an idle server")


# -- the client's queue fill (runtime/queuefill.py) --------------------------------------------------------------------

def distributed(service, sleep_us: int = 1000):
    """A service dataset as the harness reads it, each element `sleep_us` late on the worker, a small client buffer."""
    from tensorflow.python.data.experimental.ops import testing as tf_data_testing

    dispatcher, _ = service
    ds = tf.data.Dataset.range(10_000).apply(tf_data_testing.sleep(sleep_us)).batch(2)
    return ds.apply(tf.data.experimental.service.distribute("parallel_epochs", dispatcher.target,
                                                            max_outstanding_requests=4))


def model_of(iterator):
    from tensorflow.core.framework import model_pb2

    model = model_pb2.ModelProto()
    model.ParseFromString(tf.raw_ops.IteratorGetModelProto(iterator=iterator._iterator_resource).numpy())
    return model


def test_a_service_iterator_has_an_iterator_resource(service):
    iterator = iter(distributed(service))
    next(iterator)
    assert getattr(iterator, "_iterator_resource", None) is not None, changed(
        "the iterator's _iterator_resource", "runtime/queuefill.py (read_model_fill)",
        "without it the queue fill is None and Cachew's scale-down rule never fires")


def test_iterator_get_model_proto_gives_a_model_proto(service):
    iterator = iter(distributed(service))
    next(iterator)
    assert hasattr(tf.raw_ops, "IteratorGetModelProto"), changed("tf.raw_ops.IteratorGetModelProto",
                                                                 "runtime/queuefill.py (read_model_fill)")
    try:
        model = model_of(iterator)
    except Exception as exc:  # noqa: BLE001
        pytest.fail(changed("IteratorGetModelProto or model_pb2.ModelProto", "runtime/queuefill.py (read_model_fill)",
                            repr(exc)))
    assert len(model.nodes) > 0, changed("the autotuning model (no nodes)", "runtime/queuefill.py (read_model_fill)")


def test_the_data_service_node_counts_the_elements_buffered_in_the_client(service):
    """A consumer slower than the worker: the client's buffer fills, and the DataService node says so."""
    from dsctl.runtime.queuefill import NODE, read_model_fill

    iterator = iter(distributed(service))
    next(iterator)
    names = sorted(n.name for n in model_of(iterator).nodes.values())
    assert NODE in names, changed(f"the autotuning model's node names (no '{NODE}' among {names})",
                                  "runtime/queuefill.py (NODE)")
    node = next(n for n in model_of(iterator).nodes.values() if n.name == NODE)
    assert "buffered_elements" in type(node).DESCRIPTOR.fields_by_name, changed(
        "model_pb2.ModelProto.Node (no buffered_elements)", "runtime/queuefill.py (read_model_fill)")
    read = read_model_fill(iterator)
    assert read is not None, changed("the iterator's _iterator_resource", "runtime/queuefill.py (read_model_fill)")
    fills = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(f and f > 0 for f in fills):
        time.sleep(0.2)  # a slow model step: the worker (500 batches/s) fills the client's buffer meanwhile
        fills.append(read())
        next(iterator)
    assert any(f and f > 0 for f in fills), changed(
        f"the DataService node's buffered_elements (it stayed {fills} while the client's buffer filled)",
        "runtime/queuefill.py (read_model_fill)")


# -- SleepDataset (runtime/pipelines/synthetic.py, runtime/autocache_bench.py) -------------------------------------------

def test_testing_sleep_delays_each_element_and_is_a_graph_op():
    """`latency_ms` is SleepDataset: a delay per element that uses no CPU and survives serialization to workers."""
    try:
        from tensorflow.python.data.experimental.ops import testing as tf_data_testing

        ds = tf.data.Dataset.range(5).apply(tf_data_testing.sleep(20_000))
    except Exception as exc:  # noqa: BLE001
        pytest.fail(changed("tensorflow.python.data.experimental.ops.testing.sleep",
                            "runtime/pipelines/synthetic.py and runtime/autocache_bench.py", repr(exc)))
    start = time.perf_counter()
    assert [int(x) for x in ds] == [0, 1, 2, 3, 4]
    assert time.perf_counter() - start >= 5 * 0.020 * 0.9, changed(
        "testing.sleep (5 elements of 20 ms came sooner than 100 ms)", "runtime/pipelines/synthetic.py")
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    assert "SleepDataset" in {n.op for n in graph.node}, changed(
        "testing.sleep (no SleepDataset op in the serialized graph: workers would not sleep)",
        "runtime/pipelines/synthetic.py")


# -- autocache: the graph's fingerprint and TensorFlow's snapshot (runtime/autocache.py) ---------------------------------

def test_a_datasets_serialized_graph_parses_as_a_graph_def_and_fingerprints_alike_twice():
    from tensorflow.core.framework import graph_pb2

    from dsctl.runtime.autocache import fingerprint

    def build():
        return tf.data.Dataset.range(10).map(lambda x: x * 2).batch(2)

    ds = build()
    assert callable(getattr(ds, "_as_serialized_graph", None)), changed("Dataset._as_serialized_graph()",
                                                                       "runtime/autocache.py (fingerprint)")
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    ops = {n.op for n in graph.node}
    assert {"RangeDataset", "MapDataset", "BatchDatasetV2"} <= ops, changed(
        f"the serialized dataset graph (ops {sorted(ops)})", "runtime/autocache.py (fingerprint)")
    assert [f.signature.name for f in graph.library.function], changed(
        "the serialized dataset graph (the map function is not in its library)", "runtime/autocache.py (fingerprint)")
    assert fingerprint(build()) == fingerprint(build()), changed(
        "the serialized dataset graph (the same pipeline built twice fingerprints differently)",
        "runtime/autocache.py (fingerprint's normalisation of function names and metadata)")


def test_a_finished_snapshot_has_finalized_metadata_naming_its_run(tmp_path):
    """What autocache.finalized_run reads before it seals a cache: <path>/<fingerprint>/snapshot.metadata, a
    SnapshotMetadataRecord with `finalized` and `run_id`, the run's files in <fingerprint>/<run_id>/."""
    from tensorflow.core.protobuf import snapshot_pb2

    from dsctl.runtime.autocache import METADATA, finalized_run

    path = tmp_path / "cache"
    ds = tf.data.Dataset.range(20).map(lambda x: x * 2).snapshot(str(path), compression=None)  # as autocache puts
    assert sum(int(x) for x in ds) == 380
    found = None
    deadline = time.monotonic() + 10
    while found is None and time.monotonic() < deadline:
        found = finalized_run(str(path))
        time.sleep(0.1)
    subs = sorted(p.name for p in path.iterdir()) if path.exists() else []
    assert found is not None, changed(f"the snapshot's layout or metadata (no finalized {METADATA} below {subs})",
                                      "runtime/autocache.py (METADATA, finalized_run)")
    sub, meta = found
    assert isinstance(meta, snapshot_pb2.SnapshotMetadataRecord)
    assert meta.finalized and meta.run_id, changed("snapshot_pb2.SnapshotMetadataRecord (finalized, run_id)",
                                                   "runtime/autocache.py (finalized_run, seal)")
    files = list((path / sub / meta.run_id).iterdir())
    assert files, changed(f"the snapshot's layout (nothing in {sub}/{meta.run_id}/)", "runtime/autocache.py (seal)")


# -- Keras (runtime/keras_runner.py, runtime/keras_input.py) ---------------------------------------------------------------

def test_compiled_metrics_are_one_compile_metrics_with_mean_totals_and_counts():
    import keras

    from dsctl.runtime.keras_runner import _leaf_metrics, _metric_state

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    model.fit(np.ones((8, 4), np.float32), np.ones((8, 1), np.float32), batch_size=4, epochs=1, verbose=0)
    kinds = [type(m).__name__ for m in model.metrics]
    assert "CompileMetrics" in kinds, changed(
        f"Keras {keras.__version__}'s compiled metrics (model.metrics are {kinds}, none a CompileMetrics)",
        "runtime/keras_runner.py (_leaf_metrics)")
    names = [m.name for m in _leaf_metrics(model)]
    assert sorted(names) == ["loss", "mae"], changed(
        f"Keras {keras.__version__}'s compiled metrics (leaves {names})", "runtime/keras_runner.py (_leaf_metrics)")
    state = _metric_state(model)
    for name in ("loss", "mae"):
        assert isinstance(state.get(name), tuple) and state[name][1] == 8.0, changed(
            f"Keras {keras.__version__}'s mean metrics' total and count ({name}: {state.get(name)})",
            "runtime/keras_runner.py (_metric_state)", "a window's loss is the change in total over the change in count")


def test_inject_prefetch_can_be_turned_off_and_then_nothing_runs_ahead_of_the_input_meter():
    from tensorflow.core.framework import model_pb2

    from dsctl.runtime.keras_input import InputMeter

    def nodes(ds) -> list[str]:
        iterator = iter(ds)
        for _ in range(3):
            next(iterator)
        model = model_pb2.ModelProto()
        model.ParseFromString(tf.raw_ops.IteratorGetModelProto(iterator=iterator._iterator_resource).numpy())
        return sorted(n.name for n in model.nodes.values())

    try:
        tf.data.Options().experimental_optimization.inject_prefetch = False
    except AttributeError as exc:
        pytest.fail(changed("tf.data.Options().experimental_optimization.inject_prefetch", "runtime/keras_input.py",
                            repr(exc)))
    synchronous = tf.data.Dataset.range(100).map(lambda x: (x, tf.timestamp()))  # a map tf.data cannot parallelize
    assert "Prefetch" in nodes(synchronous), changed(
        "inject_prefetch (no prefetch is injected after a synchronous map any more: the option in "
        "InputMeter.wrap may be obsolete)", "runtime/keras_input.py")
    wrapped = InputMeter().wrap(tf.data.Dataset.range(100).batch(4))
    assert wrapped.options().experimental_optimization.inject_prefetch is False
    assert "Prefetch" not in nodes(wrapped), changed(
        "inject_prefetch (a prefetch still runs ahead of the input meter's map, so it would time the prefetch "
        "instead of the training step)", "runtime/keras_input.py (InputMeter.wrap)")


def test_the_autotune_model_and_the_python_chain_say_what_dsctl_profile_reads():
    from tensorflow.python.data.experimental.ops import testing

    from dsctl.runtime.profiling.chain import python_chain
    from dsctl.runtime.profiling.model import read
    from dsctl.runtime.profiling.rewrite import parallelize

    def double(x):
        return x * 2

    ds = tf.data.Dataset.range(64).apply(testing.sleep(100)).map(double).batch(4)
    it = iter(ds)
    for _ in range(4):
        next(it)
    output, nodes = read(tf.data.experimental.get_model_proto(it))
    names = {n.name for n in nodes.values()}
    assert nodes[output].name == "Root" and {"Sleep", "Range"} <= names, changed(
        "the autotune model's node names", "runtime/profiling/chain.py (kind_of_model)", str(names))
    batch = next(n for n in nodes.values() if n.name in ("MapAndBatch", "BatchV2"))
    assert batch.elements >= 4 and batch.bytes_out > 0 and batch.processing_ns > 0 and batch.inputs, changed(
        "ModelProto.Node's counters", "runtime/profiling/model.py (read)", str(batch))
    _, chain = python_chain(ds)
    assert [c.label for c in chain] == ["range", "sleep(0.1 ms)", "map(double)", "batch(4)"], changed(
        "Dataset._inputs / _map_func._func / _sleep_microseconds", "runtime/profiling/chain.py", str(chain))
    assert [int(x) for x in parallelize(ds, 2, 2).unbatch().take(3)] == [0, 2, 4], changed(
        "DatasetFromGraph of a GraphDef with a ParallelMapDatasetV2", "runtime/profiling/rewrite.py")
