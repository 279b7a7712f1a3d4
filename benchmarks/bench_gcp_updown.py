"""Benchmark: a 640-worker deployment on the stand-ins: create and delete times, and what its VMs download to boot.

    python benchmarks/bench_gcp_updown.py [--workers 640] [--latency-ms 200] [--no-boot] [--out bench.json]

1. Create and delete. The Compute Engine stand-in (standins/fake_gce.py) runs in its own
   process and answers every call after --latency-ms; operations finish 50 ms after they
   start, VMs reach RUNNING 200 ms after creation and vanish 100 ms after deletion. dsctl's
   own code does the work (provisioners/gcp/resources.py: the two firewall rules, the
   dispatcher, ONE bulk insert for the workers, waiting with the operations API, polling for
   RUNNING with list calls; parallel deletion confirmed by listing). SSH and the processes on
   the VMs are not part of this figure. Printed beside the sequential estimate (one call after
   another, each VM inserted, waited for and checked on its own: 3 calls per VM) and the goal
   (each under 10 s).
2. Boot (needs root; standins/vmboot.py): ONE worker VM, a Debian 12 root filesystem whose
   network reaches only a metadata-server stand-in and the Cloud Storage emulator, runs dsctl's
   real startup script against the wheelhouse dsctl builds (pip download, cached) and stages.
   Measured: its bootstrap seconds and the bytes the stand-ins served it. Every worker VM runs
   the same script against the same objects, so the figure for --workers VMs is that VM's bytes
   times the count (computed, and printed as such). The goal is 0 bytes from outside Cloud
   Storage: the VM has no route to PyPI, apt or anything else, and the servers count what they
   served.
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
    ap.add_argument("--no-boot", action="store_true", help="skip the boot measurement")
    args = ap.parse_args()
    result = updown(args)
    if not args.no_boot:
        result.update(boot(args.workers))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


def boot(workers: int) -> dict:
    """One worker VM's real bootstrap from Cloud Storage, measured; the fleet's bytes computed from it."""
    import tempfile

    sys.path.insert(0, str(REPO / "standins"))
    import vmboot

    from dsctl.provisioners.gcp import software, startup, wheelhouse
    from dsctl.provisioners.gcp.settings import local_tensorflow_version
    from dsctl.provisioners.gcp.wheel import build_wheel
    from dsctl.specs import load_spec_text

    reason = vmboot.unsupported_reason()
    if reason:
        print(f"  boot: not measured here ({reason})")
        return {}
    spec = load_spec_text("name: b\nprovider: gcp\ntrainer: {machine: n2-standard-8, steps: 1}\n"
                          "pipeline: {builtin: synthetic}\ngcp: {project: acme-ml, zone: us-central1-b}\n").spec
    sw = software.resolve(spec, local_tensorflow_version())
    kind = sw.for_kind("cpu")
    house = wheelhouse.build(wheelhouse.Recipe.for_kind(kind), log=lambda msg: print(f"  {msg}"))
    bucket, prefix = "bench-staging", "dsctl/runs/bench/staging/"
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(Path(tmp) / "dist")
        with vmboot.BootedVm(Path(tmp) / "vm", bucket=bucket) as vm:
            client = vm.storage_client()
            wheelhouse.stage(client, bucket, house)
            client.bucket(bucket).blob(prefix + wheel.name).upload_from_filename(str(wheel))
            vm.metadata.set_attribute("startup-script", startup.script(
                kind=kind, tf_version=sw.tensorflow_version, bucket=bucket, wheelhouse_prefix=house.prefix,
                dsctl_prefix=prefix, dsctl_wheel=wheel.name, storage_host=vm.gcs_endpoint))
            with vm.capture_to_vm() as by_source:  # every frame sent to the VM over its one link, by source
                res = vm.run_startup_script(timeout_s=900)
            if not res.ok:
                raise SystemExit(f"the startup script failed: {res}")
            marker = json.loads(vm.exec(["cat", startup.MARKER]).check().stdout)
            served = vm.bytes_served()
            stand_ins = {f"ip {vm.gateway_ip}", "ip 169.254.169.254"}  # Cloud Storage; metadata server and resolver
    # IP bytes (headers included) by source address, counted on the link; ARP and neighbour discovery apart.
    from_stand_ins = sum(v for k, v in by_source.items() if k in stand_ins)
    other = sum(v for k, v in by_source.items() if k.startswith("ip ") and k not in stand_ins)
    missed = by_source.get("dropped packets", 0)
    print("one worker VM's boot (measured here: Debian 12 root filesystem, network = metadata server + Cloud Storage only)")
    print(f"  bootstrap {marker['seconds']:.1f} s  ({', '.join(f'{k} {v:.1f} s' for k, v in marker['phases_s'].items())})")
    print(f"  from Cloud Storage: {served.storage / 1e6:8.1f} MB (served); on the link from the two stand-ins "
          f"{from_stand_ins / 1e6:.1f} MB with headers, link control {by_source.get('link', 0)} bytes; from anywhere "
          f"else: {other} bytes   goal 0: {'met' if other == 0 and not missed else 'MISSED'}"
          + (f" (the capture missed {missed} packets: not conclusive)" if missed else ""))
    print(f"for {workers} worker VMs (computed: the one VM's bytes x {workers}): {served.storage * workers / 1e9:.1f} GB from "
          f"Cloud Storage, {other * workers} bytes from anywhere else")
    return {"boot_s": marker["seconds"], "boot_phases_s": marker["phases_s"], "boot_storage_bytes": served.storage,
            "boot_metadata_and_dns_bytes": served.metadata + served.dns, "boot_outside_bytes": other,
            "boot_link_bytes_by_source": by_source, "fleet_storage_bytes_computed": served.storage * workers}


def updown(args) -> dict:
    fake = subprocess.Popen([sys.executable, str(REPO / "standins" / "fake_gce.py"), "--latency-ms",
                             str(args.latency_ms), "--provisioning-ms", "100", "--stopping-ms", "100", "--op-ms", "50"],
                            stdout=subprocess.PIPE, text=True)
    try:
        endpoint = fake.stdout.readline().strip()
        os.environ["DSCTL_GCE_ENDPOINT"] = endpoint
        os.environ["DSCTL_TPU_ENDPOINT"] = endpoint
        os.environ["DSCTL_CRM_ENDPOINT"] = endpoint
        from dsctl.provisioners.gcp import compute, firewall, naming
        from dsctl.provisioners.gcp.clients import Clients
        from dsctl.provisioners.gcp.resources import Fleet, Machine
        from dsctl.provisioners.gcp.settings import GcpSettings

        run_id = f"bench-{int(time.time())}"
        settings = GcpSettings(project=PROJECT, zone=ZONE, running_timeout_s=600).with_env_endpoints()
        fleet = Fleet(Clients(settings), run_id)
        tag = naming.network_tag(run_id)
        rules = firewall.run_rules(run_id, tag, 5050, 5051)

        def machine(role: str, index: int) -> Machine:
            vm = compute.VmConfig(machine="n2-standard-8", labels=naming.labels(run_id, "bench", role, index=index),
                                  tag=tag, metadata={"enable-oslogin": "TRUE"},
                                  image="projects/debian-cloud/global/images/family/debian-12")
            return Machine(role=role, index=index, name=naming.instance_name(run_id, role, index), vm=vm)

        machines = [machine("dispatcher", 0)] + [machine("worker", i) for i in range(args.workers)]
        n = len(machines)
        lat = args.latency_ms / 1000.0
        calls0 = stats(endpoint)["calls"]

        t0 = time.perf_counter()
        fleet.create(machines, rules)
        running = []
        fleet.wait_running(machines, 600, lambda m, internal, external: running.append(internal))
        create_s = time.perf_counter() - t0
        calls1 = stats(endpoint)["calls"]
        assert len(running) == n and stats(endpoint)["instances"] == n

        t0 = time.perf_counter()
        fleet.delete([m.name for m in machines], [], [r.name for r in rules])
        delete_s = time.perf_counter() - t0
        calls2 = stats(endpoint)["calls"]
        left = stats(endpoint)
        assert left["instances"] == 0 and left["firewalls"] == 0, left

        # Sequential: for each VM insert + wait + get (3 calls), plus each firewall rule's insert + wait; the same
        # for deletion (delete + wait + get that says 404).
        seq_create = (3 * n + 2 * len(rules)) * lat
        seq_delete = (3 * n + 2 * len(rules)) * lat
        result = {
            "workers": args.workers, "vms": n, "latency_ms": args.latency_ms,
            "create_s": round(create_s, 2), "create_calls": calls1 - calls0, "create_sequential_estimate_s": round(seq_create, 1),
            "delete_s": round(delete_s, 2), "delete_calls": calls2 - calls1, "delete_sequential_estimate_s": round(seq_delete, 1),
        }
        print(f"{args.workers} workers + 1 dispatcher + 2 firewall rules, {args.latency_ms:.0f} ms per API call "
              f"(stand-in in its own process, {os.cpu_count()} CPUs)")
        print(f"  create (firewall, dispatcher, ONE bulk insert, wait RUNNING): {create_s:6.2f} s, "
              f"{calls1 - calls0:5d} API calls   sequential estimate {seq_create:6.1f} s   "
              f"speedup {seq_create / create_s:5.1f}x   goal < {GOAL_S:.0f} s: {'met' if create_s < GOAL_S else 'MISSED'}")
        print(f"  delete (parallel, confirmed gone by listing):                {delete_s:6.2f} s, "
              f"{calls2 - calls1:5d} API calls   sequential estimate {seq_delete:6.1f} s   "
              f"speedup {seq_delete / delete_s:5.1f}x   goal < {GOAL_S:.0f} s: {'met' if delete_s < GOAL_S else 'MISSED'}")
        return result
    finally:
        fake.terminate()
        fake.wait(10)


if __name__ == "__main__":
    main()
