"""The gcp provider: the provisioner contract on Compute Engine VMs, TPU VMs, Cloud Storage and SSH.

A job's life, as the orchestrator drives it (see provisioners/contract.py):
  check        resolve project, zone, credentials (SpecError, exit 2, before anything is made)
  up           key pair; stage the dsctl wheel; record every resource in state BEFORE creating it;
               create firewall rule + dispatcher + workers (one bulk insert) + trainer VMs/TPU VMs in
               parallel; wait for RUNNING; SSH; check TensorFlow versions; start dispatcher and workers
  start_trainers  stage spec (+ code) in GCS, fetch them on the trainer VMs, start the trainers
  wait_ready   until the dispatcher and every worker have written their ready file
  poll/sample  from the background watcher: restart dead workers, copy metrics home, CPU/RSS
  down         stop processes, collect logs and metrics (also to GCS), delete everything in parallel,
               confirm it is gone, then sweep by label for anything unrecorded
A failure or Ctrl-C inside `up` deletes everything created so far before the error propagates.

Nodes in the Deployment: dispatcher/worker/trainer nodes are the VMs and the processes on them
(extra: instance, kind, machine, host, dir, remote_pid, start_time, port); a `gcp` node holds the
settings (so `dsctl down` in a new process finds the same project and zone) and a `firewall`
node the firewall rule. Remote pids live in extra, never in Node.pid (that is a local pid).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dsctl.runtime.sampler import Sample
from dsctl.specs.schema import JobSpec

from ..contract import Deployment, EventSink, Node, TrainerLaunch, TrainerState
from . import compute, naming, remote, startup, versions
from .clients import Clients
from .errors import CloudTimeout, GcpError, RemoteError
from .keys import ensure_key_pair, key_dir, load_key_pair
from .resources import Fleet, Machine
from .retry import Cancelled
from .settings import GcpSettings, check_credentials, resolve
from .ssh import Ssh
from .storage import Staging, code_archive
from .watch import Watched, Watcher

MAX_RESTARTS_PER_WORKER = 5
UNREACHABLE_S = 60.0
SSH_THREADS = 64
STOP_BUDGET_S = 30.0


def _dsctl_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("dsctl")
    except metadata.PackageNotFoundError:
        return None


def parallel(fn, items: list, *, threads: int = SSH_THREADS, cancel: threading.Event | None = None) -> list:
    """fn(item) for every item in threads; the first exception is raised once every thread has returned.

    On an exception (or Ctrl-C) `cancel` is set first, so the others stop waiting and return quickly.
    """
    if not items:
        return []
    pool = ThreadPoolExecutor(max_workers=min(len(items), threads), thread_name_prefix="dsctl-ssh")
    futures = [pool.submit(fn, item) for item in items]
    errors: list[Exception] = []
    try:
        for f in futures:
            try:
                f.result()
            except Exception as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
                if cancel is not None:
                    cancel.set()
    except BaseException:  # Ctrl-C in the waiting thread
        if cancel is not None:
            cancel.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if errors:  # the first real one: the others may only say they were cancelled because of it
        raise next((e for e in errors if not isinstance(e, Cancelled)), errors[0])
    return [f.result() for f in futures]


class GcpProvisioner:
    name = "gcp"

    def __init__(self) -> None:
        self._spec: JobSpec | None = None
        self._settings: GcpSettings | None = None
        self._clients: Clients | None = None
        self._ssh: Ssh | None = None
        self._watcher: Watcher | None = None
        self._restarts: dict[int, int] = {}
        self._cancel = threading.Event()
        self._state_lock = threading.Lock()
        self._staged_wheel_version: str | None = None

    # -- context ------------------------------------------------------------------------------
    def check(self, spec: JobSpec, workers: int) -> None:
        self._settings = resolve(spec)

    def _gcp_node(self, dep: Deployment) -> Node | None:
        nodes = dep.by_role("gcp")
        return nodes[0] if nodes else None

    def _context(self, dep: Deployment, spec: JobSpec | None = None) -> GcpSettings:
        """Settings, clients and SSH for this deployment: from the spec on the way up, from state on the way down."""
        if self._settings is None:
            node = self._gcp_node(dep)
            if node is not None:
                self._settings = GcpSettings.from_dict(node.extra["settings"]).with_env_endpoints()
                check_credentials(self._settings)
            elif spec is not None:
                self._settings = resolve(spec)
            else:
                raise GcpError(f"run {dep.run_id} has no Google Cloud settings in its state; nothing to do.")
        if self._gcp_node(dep) is None:
            dep.nodes.append(Node(role="gcp", index=0, extra={
                "settings": self._settings.as_dict(), "prefix": naming.prefix(dep.run_id),
                "tag": naming.network_tag(dep.run_id)}))
            self._save(dep)
        if self._clients is None:
            self._clients = Clients(self._settings)
        if self._ssh is None:
            kp = load_key_pair(dep.run_dir)
            if kp is None and spec is not None:
                kp = ensure_key_pair(dep.run_dir, comment=f"dsctl-{dep.run_id}")
            if kp is not None:
                self._ssh = Ssh(self._settings.ssh_user, self._settings.ssh_port, kp.private_path,
                                key_dir(dep.run_dir) / "known_hosts")
        return self._settings

    def _save(self, dep: Deployment) -> None:
        with self._state_lock:
            dep.save()

    def _fleet(self, dep: Deployment, events: EventSink) -> Fleet:
        return Fleet(self._clients, dep.run_id, self._cancel, log=lambda msg: events("cloud", msg))

    def _metadata(self, dep: Deployment, kind: str, wheel: str | None) -> dict:
        s = self._settings
        kp = load_key_pair(dep.run_dir)
        md = {"ssh-keys": kp.metadata_entry(s.ssh_user), "enable-oslogin": "FALSE", "dsctl-run": dep.run_id}
        if s.bootstrap and wheel:
            md["startup-script"] = startup.script(kind=kind, tf_version=s.tensorflow_version, bucket=s.bucket,
                                                  staging_prefix=Staging(self._clients, dep.run_id).staging_prefix,
                                                  wheel=wheel)
        return md

    def _layout(self, dep: Deployment, node: Node) -> remote.Layout:
        return remote.Layout(node.extra["dir"])

    # -- machines -------------------------------------------------------------------------------
    def _plan_nodes(self, dep: Deployment, spec: JobSpec, role: str, indices: list[int], machine: str,
                    wheel: str | None) -> list[Machine]:
        """Record nodes for VMs about to be created (saved before any API call) and return what to create."""
        s = self._settings
        kind = compute.machine_kind(machine)
        tag = naming.network_tag(dep.run_id)
        metadata = self._metadata(dep, kind.kind, wheel)
        out = []
        for i in indices:
            name = naming.instance_name(dep.run_id, role, i)
            # Workers share one bulk insert, hence one set of labels: their index is in their names only.
            labels = naming.labels(dep.run_id, spec.name, role, s.labels, index=None if role == "worker" else i)
            vm = compute.VmConfig(machine=machine, labels=labels, tag=tag, metadata=metadata)
            node = Node(role=role, index=i, extra={
                "instance": name, "kind": kind.kind, "machine": machine, "state": "creating",
                "dir": remote.node_dir(s.remote_dir, dep.run_id, name)})
            dep.nodes.append(node)
            if role == "trainer":
                self._register_trainer_vm(dep, node)
            out.append(Machine(role=role, index=i, name=name, vm=vm, kind=kind.kind))
        return out

    def _node_of(self, dep: Deployment, m: Machine) -> Node:
        return next(n for n in dep.nodes if n.role == m.role and n.index == m.index)

    # Trainer VMs outlive one measurement: the orchestrator drops trainer nodes after stop_trainers (sweeps
    # measure several times on one deployment), so the VMs are also registered in the `gcp` node, from
    # which start_trainers brings their nodes back and `down` deletes them.
    def _register_trainer_vm(self, dep: Deployment, node: Node) -> None:
        keep = ("instance", "kind", "machine", "state", "dir", "internal_ip", "host", "tensorflow")
        with self._state_lock:
            self._gcp_node(dep).extra.setdefault("trainer_vms", {})[str(node.index)] = {
                k: node.extra[k] for k in keep if k in node.extra}

    def _restore_trainer_nodes(self, dep: Deployment, count: int) -> None:
        have = {n.index for n in dep.by_role("trainer")}
        for key, extra in sorted(self._gcp_node(dep).extra.get("trainer_vms", {}).items(), key=lambda kv: int(kv[0])):
            if int(key) not in have and int(key) < count:
                dep.nodes.append(Node(role="trainer", index=int(key), extra=dict(extra)))

    def _forget_trainer_vm(self, dep: Deployment, name: str) -> None:
        vms = self._gcp_node(dep).extra.get("trainer_vms", {})
        for key in [k for k, v in vms.items() if v.get("instance") == name]:
            del vms[key]

    def _create(self, dep: Deployment, machines: list[Machine], firewall: bool, events: EventSink) -> dict[str, dict]:
        """Create machines (and the firewall rule), wait for RUNNING and SSH, probe versions. Returns probe reports."""
        s = self._settings
        fleet = self._fleet(dep, events)
        fw = None
        if firewall and not dep.by_role("firewall"):
            fw = (naming.firewall_name(dep.run_id), naming.network_tag(dep.run_id))
            dep.nodes.append(Node(role="firewall", index=0, extra={"name": fw[0], "state": "creating"}))
        self._save(dep)  # intent first: a kill -9 from here on leaves names `dsctl down` can delete
        t0 = time.monotonic()
        fleet.create(machines, fw)
        for m in machines:
            self._node_of(dep, m).extra["state"] = "created"
        if fw:
            dep.by_role("firewall")[0].extra["state"] = "created"
        self._save(dep)

        def running(m: Machine, internal: str | None, external: str | None) -> None:
            node = self._node_of(dep, m)
            node.extra.update(state="running", internal_ip=internal, host=external or internal)

        fleet.wait_running(machines, s.running_timeout_s, running)
        self._save(dep)
        events("cloud", f"{len(machines)} VM(s) running after {time.monotonic() - t0:.1f} s; connecting over SSH")
        reports = parallel(lambda m: self._prepare_vm(self._node_of(dep, m)), machines, cancel=self._cancel)
        for m in machines:
            if m.role == "trainer":
                self._register_trainer_vm(dep, self._node_of(dep, m))
        self._save(dep)
        return dict(zip((f"{m.role}-{m.index}" for m in machines), reports))

    def _prepare_vm(self, node: Node) -> dict:
        """SSH reachable; startup script done (if any); report versions."""
        s = self._settings
        host = node.extra["host"]
        what = f"{node.role} {node.index} ({node.extra['instance']})"
        self._ssh.wait_reachable(host, timeout_s=s.ssh_timeout_s, what=what, cancel=self._cancel)
        if s.bootstrap:
            deadline = time.monotonic() + s.startup_timeout_s
            while True:  # in short waits, so a teardown does not wait for the whole install
                if self._cancel.is_set():
                    raise Cancelled()
                chunk = min(20.0, max(deadline - time.monotonic(), 1.0))
                res = self._ssh.run(host, remote.wait_file(startup.MARKER, chunk),
                                    doing="waiting for the startup script", timeout=chunk + 30)
                if res.code == 0 or time.monotonic() >= deadline:
                    break
            try:
                marker = json.loads(res.stdout.strip().splitlines()[-1]) if res.code == 0 else None
            except (json.JSONDecodeError, IndexError):
                marker = None
            if marker is None:
                raise CloudTimeout(f"the startup script on {what} did not finish within {s.startup_timeout_s:.0f} s "
                                   f"(it installs TensorFlow {s.tensorflow_version}); see {startup.LOG} on the VM.")
            if not marker.get("ok"):
                raise RemoteError(f"the startup script on {what} failed: {marker.get('error')}. "
                                  f"See {startup.LOG} on the VM.")
        res = self._ssh.run(host, remote.probe(s.python, f"{node.role}-{node.index}"), doing="checking versions")
        report = remote.parse_probe(res.stdout)
        if report is None:
            raise RemoteError(f"could not run {s.python} on {what} (exit {res.code}): {res.stderr.strip()[-300:]}. "
                              "Set gcp.python to the VM's Python that has TensorFlow and dsctl.")
        with self._state_lock:
            node.extra["tensorflow"] = report.get("tensorflow")
        return report

    def _check_versions(self, dep: Deployment, reports: dict[str, dict]) -> None:
        recorded = next((n.extra["tensorflow"] for n in dep.by_role("trainer")
                         if n.extra.get("tensorflow") and f"trainer-{n.index}" not in reports), None)
        tf, who = versions.reference(reports, recorded, self._settings.tensorflow_version)
        versions.check(reports, reference_tf=tf, who=who, local_dsctl=_dsctl_version(),
                       staged_dsctl=self._staged_wheel_version)

    # -- processes -------------------------------------------------------------------------------
    def _free_port(self, node: Node) -> int:
        res = self._ssh.run(node.extra["host"], f"{remote.q(self._settings.python)} -c "
                            + remote.q("import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"),
                            doing="choosing a port")
        try:
            return int(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RemoteError(f"could not choose a free port on {node.extra['instance']}: {res.stderr.strip()[-200:]}")

    def _launch(self, dep: Deployment, node: Node, module: str, args: list[str], metrics_local: str | None = None,
                on_exit: list[tuple[str, str]] | None = None, env: dict | None = None) -> None:
        layout = self._layout(dep, node)
        res = self._ssh.run(node.extra["host"], remote.launch(layout, self._settings.python, module, args, env),
                            doing=f"starting the {node.role}")
        if res.code != 0:
            raise RemoteError(f"could not start the {node.role} {node.index} on {node.extra['instance']}: "
                              f"{(res.stderr or res.stdout).strip()[-300:]}")
        pid, start = remote.parse_launch(res.stdout)
        launched = time.monotonic()
        with self._state_lock:  # several launches run in parallel; state is saved whole
            node.extra.update(remote_pid=pid, start_time=start, launched_at=launched, ready=False)
            node.log = str(Path(dep.run_dir) / "logs" / f"{node.role}-{node.index}.log")
            dep.save()
        self._watcher.watch(Watched(key=(node.role, node.index), host=node.extra["host"], layout=layout,
                                    launched_at=launched, metrics_local=metrics_local, on_exit=on_exit or []))

    def _ensure_watcher(self) -> None:
        if self._watcher is None:
            self._watcher = Watcher(self._ssh)
        self._watcher.start()

    def _start_dispatcher(self, dep: Deployment, spec: JobSpec) -> None:
        s = self._settings
        node = dep.by_role("dispatcher")[0]
        port = s.dispatcher_port or self._free_port(node)
        node.extra["port"] = port
        node.address = f"{node.extra['internal_ip']}:{port}"
        dep.dispatcher_address = node.address
        layout = self._layout(dep, node)
        args = ["--port", str(port), "--ready-file", layout.ready]
        if spec.service.fault_tolerant:
            args += ["--fault-tolerant", "--work-dir", layout.journal]
        self._launch(dep, node, "dsctl.runtime.dispatcher", args)

    def _start_worker(self, dep: Deployment, node: Node) -> None:
        s = self._settings
        port = node.extra.get("port") or s.worker_port or self._free_port(node)
        with self._state_lock:
            node.extra["port"] = port
            node.address = f"{node.extra['internal_ip']}:{port}"
        layout = self._layout(dep, node)
        args = ["--dispatcher", dep.dispatcher_address, "--host", node.extra["internal_ip"],
                "--port", str(node.extra["port"]), "--ready-file", layout.ready]
        cache_mb = node.extra.get("cache_mb", 0)
        if cache_mb:
            args += ["--cross-trainer-cache-mb", str(cache_mb)]
        self._launch(dep, node, "dsctl.runtime.worker", args)

    # -- the contract: up -------------------------------------------------------------------------
    def up(self, spec: JobSpec, dep: Deployment, workers: int, events: EventSink) -> None:
        self._spec = spec
        self._cancel.clear()
        try:
            self._context(dep, spec)
            wheel = self._stage_wheel(dep, events) if self._settings.bootstrap else None
            machines = self._plan_nodes(dep, spec, "dispatcher", [0], spec.service.dispatcher_machine, wheel)
            machines += self._plan_nodes(dep, spec, "worker", list(range(workers)), spec.service.worker_machine, wheel)
            machines += self._plan_nodes(dep, spec, "trainer", list(range(spec.trainer.count)), spec.trainer.machine, wheel)
            cache_mb = spec.service.cross_trainer_cache_mb if spec.service.cross_trainer_cache else 0
            for n in dep.by_role("worker"):
                n.extra["cache_mb"] = cache_mb
            reports = self._create(dep, machines, firewall=True, events=events)
            self._check_versions(dep, reports)
            self._ensure_watcher()
            self._start_dispatcher(dep, spec)
            parallel(lambda n: self._start_worker(dep, n), dep.by_role("worker"), cancel=self._cancel)
            events("starting", f"dispatcher and {workers} worker(s) starting on Google Cloud ({self._settings.zone})")
        except BaseException as exc:
            self._cleanup_failed_up(dep, events, exc)
            raise

    def _stage_wheel(self, dep: Deployment, events: EventSink) -> str:
        from .wheel import build_wheel

        staging = Staging(self._clients, dep.run_id)
        staging.ensure_bucket()
        path = build_wheel(Path(dep.run_dir) / "staging")
        self._staged_wheel_version = path.name.split("-")[1]
        staging.upload(path.name, path)
        gcp = self._gcp_node(dep)
        gcp.extra.update(wheel=path.name, staged=True)
        self._save(dep)
        events("cloud", f"staged {path.name} in {staging.url('')}")
        return path.name

    def _cleanup_failed_up(self, dep: Deployment, events: EventSink, exc: BaseException) -> None:
        self._cancel.set()
        if self._settings is None or self._clients is None:
            return  # nothing was created
        try:
            self.down(dep, events)
            note = "Everything the run had created was deleted."
        except KeyboardInterrupt:
            raise
        except Exception as cleanup_exc:
            note = (f"Deleting what the run had created failed too ({cleanup_exc}); run `dsctl down {dep.run_id}` "
                    "to try again.")
        if isinstance(exc, GcpError):
            exc.add_sentence(note)

    # -- the contract: trainers ---------------------------------------------------------------------
    def _spec_for(self, launch: TrainerLaunch) -> JobSpec:
        if self._spec is None:
            self._spec = JobSpec.model_validate_json(Path(launch.spec_json).read_text())
        return self._spec

    def start_trainers(self, dep: Deployment, launch: TrainerLaunch, events: EventSink) -> None:
        spec = self._spec_for(launch)
        self._cancel.clear()
        self._context(dep, spec)
        self._restore_trainer_nodes(dep, launch.count)
        try:
            if len(dep.by_role("trainer")) < launch.count or any(
                    not n.extra.get("host") for n in dep.by_role("trainer")):
                # Baseline modes (colocated, ideal): no `up`, so the trainer VMs are made here.
                self._create_trainers(dep, spec, launch.count, events)
        except BaseException as exc:
            self._cleanup_failed_up(dep, events, exc)
            raise
        self._ensure_watcher()
        launch.metrics_dir.mkdir(parents=True, exist_ok=True)
        staging = Staging(self._clients, dep.run_id)
        staging.ensure_bucket()
        objects = [staging.upload("spec.json", Path(launch.spec_json))]
        self._gcp_node(dep).extra["staged"] = True
        uses_code = bool(spec.pipeline.entrypoint or spec.trainer.model.kind == "python")
        if uses_code:
            objects.append(staging.upload("code.tar.gz", code_archive(launch.base_dir, exclude=[Path(dep.run_dir).parent.parent])))
        storage_host = self._settings.storage_host

        def start(node: Node) -> None:
            layout = self._layout(dep, node)
            res = self._ssh.run(node.extra["host"],
                                remote.fetch(self._settings.python, self._settings.bucket, staging.staging_prefix,
                                             layout.dir, objects, storage_host),
                                doing="fetching the spec and code from Cloud Storage", timeout=300)
            if res.code != 0:
                raise RemoteError(f"trainer {node.index} ({node.extra['instance']}) could not fetch the spec"
                                  f"{' and code' if uses_code else ''} from {staging.url('')}: "
                                  f"{(res.stderr or res.stdout).strip()[-400:]}")
            metrics_local = str(launch.metrics_dir / f"trainer-{node.index}.jsonl")
            with self._state_lock:
                node.extra["metrics"] = metrics_local
            args = launch.harness_args(node.index, spec=layout.spec, metrics=layout.metrics, cache_dir=layout.cache,
                                       base_dir=layout.code if uses_code else layout.dir,
                                       dispatcher=dep.dispatcher_address)
            # launch.cpus pins local processes to cores; a trainer VM has its cores to itself.
            on_exit = [(layout.log, str(launch.metrics_dir / f"trainer-{node.index}.log"))]
            if launch.record_steps:
                with self._state_lock:
                    node.extra["steps"] = str(launch.metrics_dir / f"trainer-{node.index}.steps.json")
                args += ["--record-steps", f"{layout.dir}/steps.json"]
                on_exit.append((f"{layout.dir}/steps.json", node.extra["steps"]))
            if launch.record_ids:
                with self._state_lock:
                    node.extra["ids"] = str(launch.metrics_dir / f"trainer-{node.index}.ids.json")
                args += ["--record-ids", layout.ids]
                on_exit.append((layout.ids, node.extra["ids"]))
            self._launch(dep, node, "dsctl.runtime.trainer", args, metrics_local=metrics_local, on_exit=on_exit)

        parallel(start, dep.by_role("trainer")[: launch.count], cancel=self._cancel)
        events("training", f"{launch.count} trainer(s) started ({launch.mode}) on Google Cloud")

    def _create_trainers(self, dep: Deployment, spec: JobSpec, count: int, events: EventSink) -> None:
        wheel = self._stage_wheel(dep, events) if self._settings.bootstrap else None
        have = {n.index for n in dep.by_role("trainer")}
        machines = self._plan_nodes(dep, spec, "trainer", [i for i in range(count) if i not in have],
                                    spec.trainer.machine, wheel)
        reports = self._create(dep, machines, firewall=False, events=events)
        self._check_versions(dep, reports)

    # -- the contract: readiness, supervision, metrics ------------------------------------------------
    def wait_ready(self, dep: Deployment, events: EventSink) -> None:
        self._wait_servers(dep, [n for n in dep.nodes if n.role in ("dispatcher", "worker") and not n.extra.get("ready")])
        events("ready", f"dispatcher and {len(dep.by_role('worker'))} worker(s) ready")

    def _log_tail(self, node: Node) -> str:
        try:
            res = self._ssh.run(node.extra["host"], remote.tail(remote.Layout(node.extra["dir"]).log),
                                doing="reading a log")
            keep = [l for l in res.stdout.splitlines() if "oneDNN" not in l and "cpu_feature_guard" not in l]
            return "\n".join(keep[-12:])
        except RemoteError as exc:
            return f"(log not readable: {exc})"

    def _wait_servers(self, dep: Deployment, nodes: list[Node]) -> None:
        deadline = time.monotonic() + self._settings.ready_timeout_s
        pending = list(nodes)
        while pending:
            snap = self._watcher.snapshot()
            for node in list(pending):
                st = snap.get((node.role, node.index))
                if st is None:
                    continue
                if st.ready and st.ready.get("pid") == node.extra.get("remote_pid"):
                    node.extra.update(ready=True, port=st.ready["port"])
                    node.address = f"{node.extra['internal_ip']}:{st.ready['port']}"
                    pending.remove(node)
                elif not st.running(node.extra.get("start_time")):
                    raise RemoteError(
                        f"the {node.role} {node.index} on {node.extra['instance']} exited (code {st.exit_code}) before it "
                        f"was ready. Its log ({node.extra['dir']}/out.log on the VM) ends with:\n{self._log_tail(node)}")
            if pending and time.monotonic() > deadline:
                names = ", ".join(f"{n.role} {n.index}" for n in pending[:8])
                raise CloudTimeout(f"{names} not ready after {self._settings.ready_timeout_s:.0f} s "
                                   f"(gcp.ready_timeout_s); their logs are in {self._settings.remote_dir}/{dep.run_id} on the VMs.")
            if pending:
                time.sleep(0.2)
        self._save(dep)

    def poll(self, dep: Deployment, events: EventSink) -> TrainerState:
        if self._watcher is None:
            self._context(dep)
            self._ensure_watcher()
        snap = self._watcher.snapshot()
        lost = {h: since for h, (since, _) in self._watcher.unreachable().items()
                if time.monotonic() - since > UNREACHABLE_S}
        self._supervise_workers(dep, snap, lost, events)
        running, codes = [], {}
        for node in dep.by_role("trainer"):
            if "remote_pid" not in node.extra:
                continue
            st = snap.get(("trainer", node.index))
            if node.extra.get("host") in lost:
                codes[node.index] = -1
                events("trainer-lost", f"trainer {node.index} ({node.extra['instance']}) has not answered SSH for "
                                       f"{UNREACHABLE_S:.0f} s")
            elif st is None or st.running(node.extra.get("start_time")):
                running.append(node.index)
            else:
                codes[node.index] = st.exit_code
        return TrainerState(running=running, exit_codes=codes)

    def _supervise_workers(self, dep: Deployment, snap: dict, lost: dict, events: EventSink) -> None:
        for node in dep.by_role("worker"):
            if "remote_pid" not in node.extra:
                continue
            if node.extra.get("host") in lost:
                raise RemoteError(f"worker {node.index} ({node.extra['instance']}) has not answered SSH for "
                                  f"{UNREACHABLE_S:.0f} s; its VM may have been preempted or stopped.")
            st = snap.get(("worker", node.index))
            if st is None or st.at < node.extra.get("launched_at", 0) or st.running(node.extra.get("start_time")):
                continue
            count = self._restarts.get(node.index, 0) + 1
            self._restarts[node.index] = count
            if count > MAX_RESTARTS_PER_WORKER:
                raise RemoteError(f"worker {node.index} died {count} times; giving up. Its log ends with:\n"
                                  f"{self._log_tail(node)}")
            events("worker-restarted", f"worker {node.index} exited (code {st.exit_code}); restarting it at {node.address}")
            self._start_worker(dep, node)

    def sample(self, dep: Deployment) -> list[Sample]:
        """CPU (cores busy over the watcher's last interval) and RSS of every remote process."""
        if self._watcher is None:
            return []
        out = []
        for (role, index), (prev, cur) in self._watcher.readings().items():
            if cur.state is None or cur.pid is None or cur.state in ("Z", "X"):
                continue
            cores = max((cur.cpu_seconds - prev.cpu_seconds) / (cur.at - prev.at), 0.0)
            out.append(Sample(role, index, cur.pid, cores, cur.rss_bytes, cur.cpu_seconds))
        return out

    def scale_workers(self, dep: Deployment, workers: int, events: EventSink) -> None:
        current = dep.by_role("worker")
        spec = self._spec
        if spec is None:
            raise GcpError("scaling needs the run's spec; scale from the process that started the run.")
        self._context(dep, spec)
        if workers > len(current):
            wheel = self._gcp_node(dep).extra.get("wheel")
            machines = self._plan_nodes(dep, spec, "worker", list(range(len(current), workers)),
                                        spec.service.worker_machine, wheel)
            try:
                reports = self._create(dep, machines, firewall=False, events=events)
                self._check_versions(dep, reports)
            except BaseException:
                self._delete_nodes(dep, [self._node_of(dep, m) for m in machines], events)
                raise
            new = [self._node_of(dep, m) for m in machines]
            cache_mb = spec.service.cross_trainer_cache_mb if spec.service.cross_trainer_cache else 0
            for n in new:
                n.extra["cache_mb"] = cache_mb
            parallel(lambda n: self._start_worker(dep, n), new, cancel=self._cancel)
            events("starting", f"starting {len(new)} worker(s)")
            self._wait_servers(dep, new)
            events("scaled", f"{workers} worker(s) ready")
        elif workers < len(current):
            leaving = current[workers:]
            self._stop_processes(leaving, grace_s=8.0)
            self._delete_nodes(dep, leaving, events)
            events("scaled", f"removed {len(leaving)} worker(s); {workers} remain")

    def stop_trainers(self, dep: Deployment) -> None:
        """Stop the trainer processes and bring their last metrics and logs home. The trainer VMs stay
        (a sweep measures again on them); `down` deletes them with the rest."""
        trainers = [n for n in dep.by_role("trainer") if "remote_pid" in n.extra]
        if self._watcher is not None:
            self._watcher.cycle()  # the last metrics lines first
        self._stop_processes(trainers, grace_s=5.0)
        self._collect_logs(dep, trainers)

    # -- the contract: down ------------------------------------------------------------------------------
    def _stop_processes(self, nodes: list[Node], grace_s: float) -> None:
        def stop(node: Node) -> None:
            try:
                self._ssh.run(node.extra["host"], remote.stop(remote.Layout(node.extra["dir"]),
                                                              node.extra.get("start_time"), grace_s),
                              doing=f"stopping the {node.role}", timeout=grace_s + 15)
            except RemoteError:
                pass  # an unreachable VM is deleted anyway
            if self._watcher is not None:
                self._watcher.forget((node.role, node.index))

        live = [n for n in nodes if n.extra.get("remote_pid") and n.extra.get("host")]
        if live and self._ssh is not None:
            parallel(stop, live)

    def _collect_logs(self, dep: Deployment, nodes: list[Node]) -> None:
        """Servers' logs to <run>/logs, trainers' to <run>/metrics (unless the watcher already brought them)."""
        run_dir = Path(dep.run_dir)

        def get(node: Node) -> None:
            if node.role == "trainer":
                local = run_dir / "metrics" / f"trainer-{node.index}.log"
                if local.exists():
                    return
            else:
                local = run_dir / "logs" / f"{node.role}-{node.index}.log"
            try:
                self._ssh.get(node.extra["host"], remote.Layout(node.extra["dir"]).log, local)
            except RemoteError:
                pass

        live = [n for n in nodes if n.extra.get("remote_pid") and n.extra.get("host")]
        if live and self._ssh is not None:
            parallel(get, live)

    def _delete_nodes(self, dep: Deployment, nodes: list[Node], events: EventSink, firewall: bool = False) -> None:
        """Delete the nodes' VMs in parallel; each node leaves the state only once its VM is confirmed gone."""
        by_name = {n.extra["instance"]: n for n in nodes if n.extra.get("instance")}

        def gone(name: str) -> None:
            with self._state_lock:
                node = by_name.get(name)
                if node is not None and node in dep.nodes:
                    dep.nodes.remove(node)
                for fw in dep.by_role("firewall"):
                    if fw.extra.get("name") == name:
                        dep.nodes.remove(fw)
                self._forget_trainer_vm(dep, name)
                dep.save()

        instances = [name for name, n in by_name.items() if n.extra.get("kind") != "tpu"]
        tpus = [name for name, n in by_name.items() if n.extra.get("kind") == "tpu"]
        fws = [fw.extra["name"] for fw in dep.by_role("firewall")] if firewall else []
        Fleet(self._clients, dep.run_id, log=lambda msg: events("cloud", msg)).delete(instances, tpus, fws, gone)

    def down(self, dep: Deployment, events: EventSink) -> None:
        if self._gcp_node(dep) is None and self._settings is None:
            dep.status = "down"
            self._save(dep)
            events("down", "nothing was created on Google Cloud")
            return
        self._context(dep)
        self._cancel.set()  # anything still waiting on the way up stops
        if self._watcher is not None:
            self._watcher.stop()
        self._restore_trainer_nodes(dep, 10**6)  # trainer VMs the orchestrator no longer lists are still ours
        machines = [n for n in dep.nodes if n.role in ("trainer", "worker", "dispatcher")]
        t0 = time.monotonic()
        if self._ssh is not None:
            # Trainers first (they hang if their workers vanish), then the service; logs come home.
            try:
                self._stop_processes([n for n in machines if n.role == "trainer"], grace_s=5.0)
                self._stop_processes([n for n in machines if n.role != "trainer"], grace_s=8.0)
                self._collect_logs(dep, machines)
            except Exception as exc:  # best effort: the VMs are deleted below either way
                events("cloud", f"stopping processes: {exc}")
            self._ssh.close()
        try:
            staging = Staging(self._clients, dep.run_id)
            if self._gcp_node(dep).extra.get("staged") or any(n.extra.get("remote_pid") for n in machines):
                staging.collect(Path(dep.run_dir))
                staging.delete_staging()
        except Exception as exc:  # keeping a copy in GCS is a convenience; deleting VMs is not
            events("cloud", f"copying metrics and logs to Cloud Storage failed: {exc}")
        self._delete_nodes(dep, machines, events, firewall=True)
        fleet = Fleet(self._clients, dep.run_id, log=lambda msg: events("cloud", msg))
        found = fleet.sweep()
        dep.status = "down"
        self._save(dep)
        extra = f"; also removed {found.summary()} found by label" if not found.empty else ""
        events("down", f"all Google Cloud resources of the run deleted in {time.monotonic() - t0:.1f} s{extra}")
