"""Entry point run on each worker machine: TensorFlow's own WorkerServer.

    python -m dsctl.runtime.worker --dispatcher 10.0.0.2:5050 --port 5051

The worker gets dataset graphs from the dispatcher; it needs none of the
user's Python code. A fixed --port lets a supervisor restart a dead worker at
the same address, which is what unblocks clients that were reading from it.
"""

from __future__ import annotations

import argparse

from .readiness import ready_payload
from .serve import quiet_tensorflow, refuse_taken_port, serve_until_signalled


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="dsctl-worker", description=__doc__)
    ap.add_argument("--dispatcher", required=True, help="host:port of the dispatcher")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="localhost", help="address clients use to reach this worker")
    ap.add_argument("--cross-trainer-cache-mb", type=int, default=0)
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    ap.add_argument("--ready-file", default=None)
    ap.add_argument("--shutdown-quiet-ms", type=int, default=1000, help="time to answer in-flight requests on stop")
    args = ap.parse_args(argv)

    refuse_taken_port("worker", args.port)
    quiet_tensorflow()
    import tensorflow as tf
    from tensorflow.core.protobuf import service_config_pb2

    # The proto (not the Python namedtuple) is the only way to set the cross-trainer cache size.
    config = service_config_pb2.WorkerConfig(
        dispatcher_address=args.dispatcher.removeprefix("grpc://"),
        worker_address=f"{args.host}:%port%",
        port=args.port,
        protocol="grpc",
        heartbeat_interval_ms=args.heartbeat_ms,
        cross_trainer_cache_size_bytes=args.cross_trainer_cache_mb * 1024 * 1024,
        # On SIGTERM (a scale-down), answer the requests in flight before the server goes away.
        shutdown_quiet_period_ms=args.shutdown_quiet_ms,
    )
    server = tf.data.experimental.service.WorkerServer(config)
    port = int(server._address.rsplit(":", 1)[1])
    # The heartbeat probe: _num_tasks() takes the worker's own lock, so a worker that answers it is not wedged.
    serve_until_signalled(server, args.ready_file, ready_payload("worker", port, address=server._address),
                          heartbeat=getattr(server, "_num_tasks", lambda: None))


if __name__ == "__main__":
    main()
