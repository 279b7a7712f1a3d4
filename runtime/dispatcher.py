"""Entry point run on the dispatcher machine: TensorFlow's own DispatchServer.

    python -m dsctl.runtime.dispatcher --port 5050 --work-dir /var/dsctl/journal --fault-tolerant

With --fault-tolerant the dispatcher journals its state to --work-dir; restarted
on the same port and work dir, clients continue where they were.
"""

from __future__ import annotations

import argparse
import time

from .readiness import ready_payload, write_json_atomic
from .serve import quiet_tensorflow, refuse_taken_port, serve_until_signalled


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="dsctl-dispatcher", description=__doc__)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--work-dir", default=None, help="journal directory (required with --fault-tolerant)")
    ap.add_argument("--fault-tolerant", action="store_true")
    ap.add_argument("--ready-file", default=None)
    ap.add_argument("--status-file", default=None, help="rewritten every second with the registered worker count")
    ap.add_argument("--worker-timeout-ms", type=int, default=None)
    args = ap.parse_args(argv)
    if args.fault_tolerant and not args.work_dir:
        ap.error("--fault-tolerant needs --work-dir")

    refuse_taken_port("dispatcher", args.port)
    quiet_tensorflow()
    import tensorflow as tf
    from tensorflow.core.protobuf import service_config_pb2

    config = service_config_pb2.DispatcherConfig(
        port=args.port,
        protocol="grpc",
        work_dir=args.work_dir or "",
        fault_tolerant_mode=args.fault_tolerant,
    )
    if args.worker_timeout_ms:
        config.worker_timeout_ms = args.worker_timeout_ms
    server = tf.data.experimental.service.DispatchServer(config)
    port = int(server.target.rsplit(":", 1)[1])
    last = [0.0]
    count = getattr(server, "_num_workers", lambda: None)  # pinned by tests/test_tensorflow_internals.py

    def report_workers() -> None:
        # _num_workers() is test-only API; it is the one view of registrations there is, and the heartbeat probe
        # (it takes the dispatcher's own lock: a dispatcher that answers it is not wedged).
        now = time.time()
        workers = count()
        if args.status_file and now - last[0] >= 1.0 and workers is not None:
            last[0] = now
            write_json_atomic(args.status_file, {"workers": workers, "at": now})


    serve_until_signalled(server, args.ready_file, ready_payload("dispatcher", port, target=server.target), report_workers)


if __name__ == "__main__":
    main()
