"""Benchmark: create and delete a 640-worker deployment on the Compute Engine stand-in with 200 ms per API call.

    python benchmarks/bench_gcp_updown.py [--workers 640] [--latency-ms 200] [--out bench.json]

The stand-in (tests/gcp/fake_gce.py) runs in its own process and answers every
call after --latency-ms; operations finish 50 ms after they start, VMs reach
RUNNING 200 ms after creation and vanish 100 ms after deletion. dsctl's own
code does the work (provisioners/gcp/resources.py: the firewall rule, the
dispatcher, ONE bulk insert for the workers, waiting with the operations API,
polling for RUNNING with list calls; parallel deletion confirmed by listing).
SSH and the processes on the VMs are not part of this figure.

Prints, for create and for delete: seconds measured, API calls made, and the
sequential estimate (one call after another, each VM inserted, waited for and
checked on its own: 3 calls per VM), beside the goal (each under 10 s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT, ZONE = "bench-project", "us-central1-b"
GOAL_S = 10.0


def stats(endpoint: str) -> dict:
    with urllib.request.urlopen(f"{endpoint}/_fake/stats", timeout=30) as r:
        return json.load(r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=640)
    ap.add_argument("--latency-ms", type=float, default=200.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    fake = subprocess.Popen([sys.executable, str(REPO / "tests" / "gcp" / "fake_gce.py"), "--latency-ms",
                             str(args.latency_ms), "--provisioning-ms", "100", "--stopping-ms", "100", "--op-ms", "50"],
                            stdout=subprocess.PIPE, text=True)
    try:
        endpoint = fake.stdout.readline().strip()
        os.environ["DSCTL_GCE_ENDPOINT"] = endpoint
        os.environ["DSCTL_TPU_ENDPOINT"] = endpoint
        from dsctl.provisioners.gcp import compute, naming
        from dsctl.provisioners.gcp.clients import Clients
        from dsctl.provisioners.gcp.resources import Fleet, Machine
        from dsctl.provisioners.gcp.settings import GcpSettings

        run_id = f"bench-{int(time.time())}"
        settings = GcpSettings(project=PROJECT, zone=ZONE, image="projects/debian-cloud/global/images/family/debian-12",
                               running_timeout_s=600).with_env_endpoints()
        fleet = Fleet(Clients(settings), run_id)
        tag = naming.network_tag(run_id)

        def machine(role: str, index: int) -> Machine:
            vm = compute.VmConfig(machine="n2-standard-8", labels=naming.labels(run_id, "bench", role, index=index),
                                  tag=tag, metadata={"ssh-keys": "dsctl:ssh-ed25519 AAAA bench"})
            return Machine(role=role, index=index, name=naming.instance_name(run_id, role, index), vm=vm)

        machines = [machine("dispatcher", 0)] + [machine("worker", i) for i in range(args.workers)]
        n = len(machines)
        lat = args.latency_ms / 1000.0
        calls0 = stats(endpoint)["calls"]

        t0 = time.perf_counter()
        fleet.create(machines, (naming.firewall_name(run_id), tag))
        running = []
        fleet.wait_running(machines, 600, lambda m, internal, external: running.append(internal))
        create_s = time.perf_counter() - t0
        calls1 = stats(endpoint)["calls"]
        assert len(running) == n and stats(endpoint)["instances"] == n

        t0 = time.perf_counter()
        fleet.delete([m.name for m in machines], [], [naming.firewall_name(run_id)])
        delete_s = time.perf_counter() - t0
        calls2 = stats(endpoint)["calls"]
        left = stats(endpoint)
        assert left["instances"] == 0 and left["firewalls"] == 0, left

        # Sequential: for each VM insert + wait + get (3 calls), plus the firewall rule's insert + wait; the same
        # for deletion (delete + wait + get that says 404).
        seq_create = (3 * n + 2) * lat
        seq_delete = (3 * n + 2) * lat
        result = {
            "workers": args.workers, "vms": n, "latency_ms": args.latency_ms,
            "create_s": round(create_s, 2), "create_calls": calls1 - calls0, "create_sequential_estimate_s": round(seq_create, 1),
            "delete_s": round(delete_s, 2), "delete_calls": calls2 - calls1, "delete_sequential_estimate_s": round(seq_delete, 1),
        }
        print(f"{args.workers} workers + 1 dispatcher + 1 firewall rule, {args.latency_ms:.0f} ms per API call "
              f"(stand-in in its own process, {os.cpu_count()} CPUs)")
        print(f"  create (firewall, dispatcher, ONE bulk insert, wait RUNNING): {create_s:6.2f} s, "
              f"{calls1 - calls0:5d} API calls   sequential estimate {seq_create:6.1f} s   "
              f"speedup {seq_create / create_s:5.1f}x   goal < {GOAL_S:.0f} s: {'met' if create_s < GOAL_S else 'MISSED'}")
        print(f"  delete (parallel, confirmed gone by listing):                {delete_s:6.2f} s, "
              f"{calls2 - calls1:5d} API calls   sequential estimate {seq_delete:6.1f} s   "
              f"speedup {seq_delete / delete_s:5.1f}x   goal < {GOAL_S:.0f} s: {'met' if delete_s < GOAL_S else 'MISSED'}")
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
    finally:
        fake.terminate()
        fake.wait(10)


if __name__ == "__main__":
    main()
