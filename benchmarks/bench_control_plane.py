"""Benchmark: what following a running Google Cloud job costs the user's machine, for 8, 64 and 640 workers.

    python benchmarks/bench_control_plane.py [--minutes 1] [--workers 8,64,640]

A run on Google Cloud is supervised on its dispatcher VM (orchestrator/supervise.py); the user's
`dsctl up` only follows what that supervisor publishes to Cloud Storage (orchestrator/cloudruns.py
`follow`: latest.json every 2 s, a heartbeat every 30 s). Per worker count, for --minutes of a
running job:

- cloud side: the supervisor's real Publisher (orchestrator/cloudrecord.py) publishing every 10 s to
  the Cloud Storage emulator, fed what a supervisor records for that many workers: a utilization
  sample per worker (and the dispatcher) every 0.5 s, a metrics window every second, an event now
  and then. Its workers are not run (this machine cannot hold 640): what the follower reads does
  not depend on anything but these records.
- the user's machine: the real follower, through a TCP proxy in front of the emulator that counts
  every connection it opens and every byte in both directions.

Printed, measured here: the user machine's connections and kilobytes per minute (goal: flat in the
worker count) and, for the cloud side, the kilobytes the supervisor published per minute (they grow
with the workers and stay in Cloud Storage, read only by `dsctl runs show`). Computed, for contrast:
the previous design watched every VM from the user's machine, one SSH command per VM per second.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

BUCKET = "bench-control-plane"


class CountingProxy:
    """127.0.0.1:<port> -> target, counting accepted connections and bytes each way."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.connections = self.up = self.down = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self) -> None:
        with self.lock:
            self.connections = self.up = self.down = 0

    def _accept(self) -> None:
        while True:
            client, _ = self.sock.accept()
            with self.lock:
                self.connections += 1
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server, "up"), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, "down"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, way: str) -> None:
        try:
            while data := src.recv(65536):
                with self.lock:
                    setattr(self, way, getattr(self, way) + len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def storage_client(endpoint: str):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project="bench", credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": endpoint})


def one_count(workers: int, seconds: float, emulator: str, proxy: CountingProxy, home: Path) -> dict:
    from dsctl.orchestrator import cloudrecord, cloudruns
    from dsctl.orchestrator.store import RunStore
    from dsctl.provisioners.gcp.storage import RunObjects
    from dsctl.runtime.sampler import Sample

    run_id = f"bench-{workers}"
    store = RunStore(home / f"{run_id}.db")
    store.create_run(id=run_id, name="bench", kind="job", provider="gcp", mode="service", status="running",
                     spec_json="{}", spec_hash="x", workers=workers, trainers=1, run_dir=None)
    cloud = RunObjects(storage_client(emulator), BUCKET, run_id)
    stop = threading.Event()
    published = {"bytes": 0}

    def supervisor() -> None:
        """What a supervisor of `workers` workers records, and its Publisher, on the cloud side."""
        own = RunStore(home / f"{run_id}.db")
        objects = _Counting(cloud, published)
        publisher = cloudrecord.Publisher(own, objects, run_id)
        t0, step, next_publish = time.time(), 0, time.monotonic() + 10
        while not stop.is_set():
            now = time.time()
            own.add_utilization(run_id, now, [Sample("worker", i, 1000 + i, 0.8, 3 << 30, step * 0.4)
                                               for i in range(workers)] + [Sample("dispatcher", 0, 999, 0.1, 1 << 30, 0)])
            if step % 2 == 0:
                own.add_window(run_id, {"trainer": 0, "t_start": now - t0 - 1, "t_end": now - t0, "batches": 12,
                                        "batches_per_s": 12.0, "mean_batch_time_s": 0.083, "input_wait_s": 0.01,
                                        "step_s": 0.99, "warmup": 0}, workers)
            if step % 40 == 0:
                own.add_event(run_id, "worker-restarted", f"worker {step % workers} exited (code -9); restarted")
            if time.monotonic() >= next_publish:
                publisher.publish({"phase": "training", "batches": step * 6, "batches_per_s": 12.0,
                                   "workers": workers, "restarts": step // 40})
                next_publish += 10
            step += 1
            stop.wait(0.5)
        own.update_run(run_id, status="succeeded", ended_at=time.time())
        publisher.publish({"phase": "done", "workers": workers})

    feeder = threading.Thread(target=supervisor, daemon=True)
    feeder.start()
    time.sleep(10.5)  # the first publish: the follower joins a job that is already running
    proxy.reset()
    follower = RunObjects(storage_client(f"http://127.0.0.1:{proxy.port}"), BUCKET, run_id)
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    t0 = time.monotonic()
    looks = {"n": 0}
    cloudruns.follow(follower, lambda latest: looks.__setitem__("n", looks["n"] + 1), outage_limit_s=600, poll_s=2.0)
    elapsed = time.monotonic() - t0
    feeder.join(30)
    minutes = elapsed / 60
    return {"workers": workers, "minutes": minutes, "connections_per_min": proxy.connections / minutes,
            "kb_per_min": (proxy.up + proxy.down) / 1e3 / minutes, "looks": looks["n"],
            "published_kb_per_min": published["bytes"] / 1e3 / minutes}


class _Counting:
    """The supervisor's objects, counting what it publishes."""

    def __init__(self, objects, counter: dict):
        self.objects, self.counter = objects, counter

    def put(self, name: str, data: bytes) -> None:
        self.counter["bytes"] += len(data)
        self.objects.put(name, data)

    def get(self, name: str):
        return self.objects.get(name)

    def names(self, prefix: str = ""):
        return self.objects.names(prefix)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--workers", default="8,64,640")
    args = ap.parse_args()
    from gcp_storage_emulator.server import create_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    emulator = f"http://127.0.0.1:{port}"
    proxy = CountingProxy(("127.0.0.1", port))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DSCTL_HOME"] = tmp
        for n in (int(x) for x in args.workers.split(",")):
            rows.append(one_count(n, args.minutes * 60, emulator, proxy, Path(tmp)))
            r = rows[-1]
            print(f"{n:4d} workers: user's machine {r['connections_per_min']:.2f} connections/min, "
                  f"{r['kb_per_min']:.1f} kB/min ({r['looks']} looks in {r['minutes']:.2f} min); cloud side: supervisor "
                  f"published {r['published_kb_per_min']:.0f} kB/min", flush=True)
    server.stop()
    kb = [r["kb_per_min"] for r in rows]
    print(f"measured here: user's machine, largest / smallest kB per minute across {args.workers} workers: "
          f"{max(kb) / min(kb):.2f} (goal: flat, 1.0 within noise). Connections: one per request here, because "
          "the Cloud Storage emulator closes each one; the client keeps them open where the server allows it.")
    for r in rows:
        print(f"computed, the former design (one SSH status command per VM per second from the user's machine): "
              f"{r['workers']} workers = {60 * (r['workers'] + 2):,} SSH commands/min")


if __name__ == "__main__":
    main()
