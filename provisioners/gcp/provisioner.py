"""The gcp provider: the provisioner contract on Compute Engine VMs, TPU VMs, Cloud Storage and SSH.

A job's life, as the orchestrator drives it (see provisioners/contract.py):
  check        resolve project, zone, credentials and the run's software (software.py); preflight.py's
               checks against the live project (SpecError, exit 2, before anything is made)
  up           key pair; stage the dsctl wheel, the wheelhouses (wheelhouse.py) and a builtin's data
               (data.py); record every resource in state BEFORE creating it; create the firewall rules +
               dispatcher + workers (one bulk insert) + trainer VMs/TPU VMs in parallel; as each is
               RUNNING (a TPU READY): SSH, wait for its bootstrap; check TensorFlow versions everywhere;
               start dispatcher and workers
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
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from dsctl.runtime.logtail import useful_lines
from dsctl.runtime.sampler import Sample
from dsctl.specs.schema import JobSpec

from ..contract import Deployment, EventSink, Node, TrainerLaunch, TrainerState
from . import compute, data, firewall, naming, operations, preflight, remote, startup, versions, wheelhouse
from .clients import Clients
from .errors import CloudTimeout, GcpError, RemoteError, SshUnreachable
from .keys import ensure_key_pair, key_dir, load_key_pair
from .naming import run_filter
from .recovery import Recovery
from .resources import Fleet, Machine
from .retry import Cancelled
from .settings import GcpSettings, check_credentials, resolve
from .ssh import Ssh
from .storage import Staging, code_archive
from .watch import Watched, Watcher

MAX_RESTARTS_PER_WORKER = 5
SSH_THREADS = 64
STOP_BUDGET_S = 30.0


def _dsctl_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("dsctl")
    except metadata.PackageNotFoundError:
        return None


class Relay:
    """An event sink worker threads may call: their events are held and delivered on the thread that made the
    relay (the orchestrator's, which owns the run store's SQLite connection and the live view) when it flushes."""

    def __init__(self, sink: EventSink):
        self.sink = sink
        self.owner = threading.get_ident()
        self.pending: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, kind: str, message: str) -> None:
        if threading.get_ident() != self.owner:
            with self.lock:
                self.pending.append((kind, message))
            return
        self.flush()
        self.sink(kind, message)

    def flush(self) -> None:
        if threading.get_ident() != self.owner:
            return
        with self.lock:
            items, self.pending = self.pending, []
        for kind, message in items:
            self.sink(kind, message)


def _uses_code(spec: JobSpec) -> bool:
    """The trainers need the spec's folder: user code (an entrypoint, a model, the user's own command)."""
    return bool(spec.pipeline.entrypoint or spec.trainer.model.kind in ("python", "keras") or spec.trainer.command)


def relay(events: EventSink) -> Relay:
    return events if isinstance(events, Relay) else Relay(events)


def parallel(fn, items: list, *, threads: int = SSH_THREADS, cancel: threading.Event | None = None,
             events: Relay | None = None) -> list:
    """fn(item) for every item in threads; the first exception is raised once every thread has returned.

    On an exception (or Ctrl-C) `cancel` is set first, so the others stop waiting and return quickly.
    Events the threads raise through `events` are delivered while waiting.
    """
    if not items:
        return []
    pool = ThreadPoolExecutor(max_workers=min(len(items), threads), thread_name_prefix="dsctl-ssh")
    futures = [pool.submit(fn, item) for item in items]
    errors: list[Exception] = []
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            if events is not None:
                events.flush()
            for f in done:
                if f.exception() is not None:
                    errors.append(f.exception())
                    if cancel is not None:
                        cancel.set()
    except BaseException:  # Ctrl-C in the waiting thread
        if cancel is not None:
            cancel.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if events is not None:
            events.flush()
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
        self._restarts: dict[int, int] = {}  # worker index (-1: the dispatcher) -> restarts
        self._cancel = threading.Event()
        self._state_lock = threading.Lock()
        self._staged_wheel_version: str | None = None
        self._findings: preflight.Findings | None = None
        self._recovery: Recovery | None = None
        self._max_run_s: float | None = None  # Compute Engine's own limit on the VMs of a run supervised on the cloud
        self._inside: str | None = None  # the VM this process runs on, when it supervises the run from there

    # -- context ------------------------------------------------------------------------------
    def check(self, spec: JobSpec, workers: int) -> None:
        """Everything that can refuse the run before anything is created: settings, software, the live project."""
        self._settings = resolve(spec)
        data.root(spec, self._settings.bucket)
        self._clients = Clients(self._settings)
        self._preflight(spec)

    def _preflight(self, spec: JobSpec) -> preflight.Findings:
        if self._findings is None:
            self._findings = preflight.run(self._clients, spec, self._settings.kinds)
        return self._findings

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

    def _metadata(self, dep: Deployment, kind: str, role: str = "worker") -> dict:
        s = self._settings
        kp = load_key_pair(dep.run_dir)
        md = {"ssh-keys": kp.metadata_entry(s.ssh_user), "enable-oslogin": "FALSE", "dsctl-run": dep.run_id}
        if kind == "gpu":
            md["install-nvidia-driver"] = "True"  # the Deep Learning VM image installs the driver at first boot
        if s.bootstrap:
            staged = self._gcp_node(dep).extra["staged_software"]
            md["startup-script"] = startup.script(
                kind=s.kinds.for_kind(kind), tf_version=s.tensorflow_version, bucket=s.bucket,
                wheelhouse_prefix=staged["wheelhouses"][kind], dsctl_prefix=Staging(self._clients, dep.run_id).staging_prefix,
                dsctl_wheel=staged["wheel"], storage_host=s.storage_host, supervisor=role == "dispatcher")
        return md

    def _layout(self, dep: Deployment, node: Node) -> remote.Layout:
        return remote.Layout(node.extra["dir"])

    # -- machines -------------------------------------------------------------------------------
    def _plan_nodes(self, dep: Deployment, spec: JobSpec, role: str, indices: list[int], machine: str) -> list[Machine]:
        """Record nodes for VMs about to be created (saved before any API call) and return what to create."""
        s = self._settings
        kind = compute.machine_kind(machine)
        tag = naming.network_tag(dep.run_id)
        metadata = self._metadata(dep, kind.kind, role)
        image = s.kinds.for_kind(kind.kind).image  # a boot image, or a TPU VM's runtime version
        provisioning = spec.trainer.provisioning if role == "trainer" else spec.service.provisioning
        out = []
        for i in indices:
            name = naming.instance_name(dep.run_id, role, i)
            # Workers share one bulk insert, hence one set of labels: their index is in their names only.
            labels = naming.labels(dep.run_id, spec.name, role, s.labels, index=None if role == "worker" else i)
            vm = compute.VmConfig(machine=machine, labels=labels, tag=tag, metadata=metadata, image=image,
                                  provisioning=provisioning, max_run_s=self._max_run_s if kind.kind != "tpu" else None)
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

    def _create(self, dep: Deployment, machines: list[Machine], rules: bool, events: EventSink) -> dict[str, dict]:
        """Create machines (and the run's firewall rules); as each VM runs, SSH to it, wait for its bootstrap and
        probe its versions. Returns the probe reports by node label."""
        s = self._settings
        events = relay(events)
        fleet = self._fleet(dep, events)
        new_rules = []
        if rules and not dep.by_role("firewall"):
            new_rules = firewall.run_rules(dep.run_id, naming.network_tag(dep.run_id), s.dispatcher_port, s.worker_port)
            for i, rule in enumerate(new_rules):
                dep.nodes.append(Node(role="firewall", index=i, extra={"name": rule.name, "state": "creating"}))
        self._save(dep)  # intent first: a kill -9 from here on leaves names `dsctl down` can delete
        t0 = time.monotonic()
        fleet.create(machines, new_rules)
        for m in machines:
            self._node_of(dep, m).extra["state"] = "created"
        for fw in dep.by_role("firewall"):
            fw.extra["state"] = "created"
        self._save(dep)

        def running(m: Machine, internal: str | None, external: str | None) -> None:
            if s.public_ips and not external:
                raise RemoteError(f"{m.name} has no external address although gcp.public_ips is true; dsctl cannot "
                                  "reach it over SSH from here.")
            with self._state_lock:
                self._node_of(dep, m).extra.update(state="running", internal_ip=internal, external_ip=external,
                                                   host=external if s.public_ips else internal)

        def prepare(ms: list[Machine]) -> list[dict]:
            return parallel(lambda m: self._prepare_vm(self._node_of(dep, m)), ms, cancel=self._cancel)

        def vms() -> list[dict]:
            group = [m for m in machines if m.kind != "tpu"]
            if not group:
                return []
            fleet.wait_running(group, s.running_timeout_s, running)
            self._save(dep)  # once for the group: 640 saves of a 640-node state would be quadratic
            events("cloud", f"{len(group)} VM(s) running after {time.monotonic() - t0:.1f} s; connecting over SSH")
            return prepare(group)

        def one_tpu(m: Machine) -> list[dict]:
            fleet.wait_tpu(m, running)
            self._save(dep)
            events("cloud", f"TPU VM {m.name} ready after {time.monotonic() - t0:.1f} s; connecting over SSH")
            return prepare([m])

        jobs = [vms] + [lambda m=m: one_tpu(m) for m in machines if m.kind == "tpu"]
        reports = [r for group in parallel(lambda job: job(), jobs, cancel=self._cancel, events=events) for r in group]
        order = [m for m in machines if m.kind != "tpu"] + [m for m in machines if m.kind == "tpu"]
        for m in machines:
            if m.role == "trainer":
                self._register_trainer_vm(dep, self._node_of(dep, m))
        self._save(dep)
        return dict(zip((f"{m.role}-{m.index}" for m in order), reports))

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
        """The new machines' TensorFlow against the trainers' (checked before, if the trainers are not new)."""
        trainer_vms = self._gcp_node(dep).extra.get("trainer_vms", {})
        known = [n.extra for n in dep.by_role("trainer")] + list(trainer_vms.values())
        recorded = next((e["tensorflow"] for e in known if e.get("tensorflow")), None)
        tf, who = versions.reference(reports, recorded, self._settings.tensorflow_version)
        versions.check(reports, reference_tf=tf, who=who, local_dsctl=_dsctl_version(),
                       staged_dsctl=self._staged_wheel_version)

    # -- processes -------------------------------------------------------------------------------
    def _free_port(self, node: Node) -> int:
        res = self._ssh.run(node.extra["host"], remote.free_port(self._settings.python), doing="choosing a port")
        try:
            return int(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RemoteError(f"could not choose a free port on {node.extra['instance']}: {res.stderr.strip()[-200:]}")

    def _launch(self, dep: Deployment, node: Node, module: str, args: list[str], metrics_local: str | None = None,
                on_exit: list[tuple[str, str]] | None = None, env: dict | None = None,
                file_env: dict[str, dict[str, str]] | None = None, tree: bool = False) -> None:
        layout = self._layout(dep, node)
        res = self._ssh.run(node.extra["host"], remote.launch(layout, self._settings.python, module, args, env,
                                                              file_env=file_env, tree=tree),
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
        port = node.extra.get("port") or s.dispatcher_port or self._free_port(node)  # a restart keeps its port
        node.extra.update(port=port, fault_tolerant=spec.service.fault_tolerant)
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
            self._preflight(spec)
            kinds = {"cpu", compute.machine_kind(spec.trainer.machine).kind}
            self._stage(dep, spec, kinds, events)
            machines = self._plan_nodes(dep, spec, "dispatcher", [0], spec.service.dispatcher_machine)
            machines += self._plan_nodes(dep, spec, "worker", list(range(workers)), spec.service.worker_machine)
            machines += self._plan_nodes(dep, spec, "trainer", list(range(spec.trainer.count)), spec.trainer.machine)
            cache_mb = spec.service.cross_trainer_cache_mb if spec.service.cross_trainer_cache else 0
            for n in dep.by_role("worker"):
                n.extra["cache_mb"] = cache_mb
            reports = self._create(dep, machines, rules=True, events=events)
            self._check_versions(dep, reports)
            self._ensure_watcher()
            self._start_dispatcher(dep, spec)
            parallel(lambda n: self._start_worker(dep, n), dep.by_role("worker"), cancel=self._cancel)
            events("starting", f"dispatcher and {workers} worker(s) starting on Google Cloud ({self._settings.zone})")
        except BaseException as exc:
            self._cleanup_failed_up(dep, events, exc)
            raise

    def _stage(self, dep: Deployment, spec: JobSpec, kinds: set[str], events: EventSink) -> None:
        """Everything the VMs fetch from Cloud Storage, staged before any VM exists: the bucket (readable by the
        VMs' service account), this dsctl's wheel, one wheelhouse per VM kind, a builtin's data files."""
        s = self._settings
        gcp = self._gcp_node(dep)
        staged = gcp.extra.setdefault("staged_software", {"wheelhouses": {}})
        staging = Staging(self._clients, dep.run_id)
        if not gcp.extra.get("bucket_ready"):
            staging.ensure_bucket()
            if staging.grant_reader(self._preflight(spec).service_account):
                events("cloud", f"gave the VMs' service account read access to gs://{s.bucket}")
            gcp.extra["bucket_ready"] = True
        if s.bootstrap and "wheel" not in staged:
            from .wheel import build_wheel

            path = build_wheel(Path(dep.run_dir) / "staging")
            gcp.extra["staged"] = True
            self._save(dep)  # before the upload: `down` deletes the run's staging objects
            staging.upload(path.name, path)
            staged["wheel"] = path.name
            events("cloud", f"staged {path.name} in {staging.url('')}")
        if s.bootstrap:
            self._staged_wheel_version = staged["wheel"].split("-")[1]
            for kind in sorted(kinds - set(staged["wheelhouses"])):
                # The dispatcher's kind also carries what the run's supervisor needs (the dispatcher installs it).
                supervisor = kind == compute.machine_kind(spec.service.dispatcher_machine).kind
                recipe = wheelhouse.Recipe.for_kind(s.kinds.for_kind(kind), supervisor=supervisor)
                house = wheelhouse.build(recipe, log=lambda msg: events("cloud", msg))
                sent = wheelhouse.stage(self._clients.storage, s.bucket, house, log=lambda msg: events("cloud", msg))
                staged["wheelhouses"][kind] = house.prefix
                events("cloud", f"{kind} VMs install from gs://{s.bucket}/{house.prefix} ({house.size / 1e6:.0f} MB; "
                                f"{'uploaded now' if sent else 'already there'})")
        root = data.root(spec, s.bucket)
        if root and not gcp.extra.get("data_root"):
            sent = data.stage(spec, self._clients.storage, root, Path(dep.run_dir).parent.parent / "cache",
                              log=lambda msg: events("cloud", msg))
            gcp.extra["data_root"] = root
            events("cloud", f"{spec.pipeline.builtin} data in {root} ({'uploaded now' if sent else 'already there'})")
        self._save(dep)

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
        uses_code = _uses_code(spec)
        objects = self._stage_trainer_files(dep, spec, launch.spec_json, launch.base_dir)
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
            cache_dir = self._gcp_node(dep).extra.get("data_root") or layout.cache
            args = launch.harness_args(node.index, spec=layout.spec, metrics=layout.metrics, cache_dir=cache_dir,
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
            if launch.command:
                args.append("--vm-python")  # the command's `python` is the VM's, which has TensorFlow and dsctl
            # TensorFlow's PJRT TPU runtime on a TensorFlow TPU VM (software.PJRT_ENV); a command runner's program and
            # what it starts count in the trainer's CPU and memory (remote.status).
            self._launch(dep, node, launch.module, args, metrics_local=metrics_local, on_exit=on_exit,
                         file_env=self._settings.kinds.for_kind(node.extra["kind"]).trainer_file_env,
                         tree=launch.command)

        parallel(start, dep.by_role("trainer")[: launch.count], cancel=self._cancel)
        events("training", f"{launch.count} trainer(s) started ({launch.mode}) on Google Cloud")

    def _stage_trainer_files(self, dep: Deployment, spec: JobSpec, spec_json: Path, base_dir: Path) -> list[str]:
        """The spec (and the spec's folder, for user code) in the run's staging prefix, for the trainer VMs to fetch.
        A run handed over to a supervisor (hand_off) was staged from the user's machine, where the code is."""
        gcp = self._gcp_node(dep)
        uses_code = _uses_code(spec)
        if gcp.extra.get("trainer_files"):
            return list(gcp.extra["trainer_files"])
        staging = Staging(self._clients, dep.run_id)
        staging.ensure_bucket()
        objects = [staging.upload("spec.json", Path(spec_json))]
        gcp.extra["staged"] = True
        if uses_code:
            objects.append(staging.upload("code.tar.gz", code_archive(base_dir, exclude=[Path(dep.run_dir).parent.parent])))
        return objects

    def _create_trainers(self, dep: Deployment, spec: JobSpec, count: int, events: EventSink) -> None:
        self._preflight(spec)
        self._stage(dep, spec, {compute.machine_kind(spec.trainer.machine).kind}, events)
        have = {n.index for n in dep.by_role("trainer")}
        machines = self._plan_nodes(dep, spec, "trainer", [i for i in range(count) if i not in have],
                                    spec.trainer.machine)
        reports = self._create(dep, machines, rules=False, events=events)
        self._check_versions(dep, reports)

    # -- the contract: readiness, supervision, metrics ------------------------------------------------
    def wait_ready(self, dep: Deployment, events: EventSink) -> None:
        self._wait_servers(dep, [n for n in dep.nodes if n.role in ("dispatcher", "worker") and not n.extra.get("ready")])
        events("ready", f"dispatcher and {len(dep.by_role('worker'))} worker(s) ready")

    def _log_tail(self, node: Node) -> str:
        try:
            res = self._ssh.run(node.extra["host"], remote.tail(remote.Layout(node.extra["dir"]).log),
                                doing="reading a log")
            return "\n".join(useful_lines(res.stdout)[-12:])
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
        unreachable = {h: since for h, (since, _) in self._watcher.unreachable().items()}
        recovery = self._recovery_for(dep)
        blind = recovery.check(dep, unreachable, events)
        snap = self._watcher.snapshot()
        # What cannot be seen now (no SSH) or is being brought back is not judged on an old reading.
        unseen = {n.extra.get("host") for n in dep.nodes if n.extra.get("host") in unreachable or recovery.restoring(n)}
        self._supervise_dispatcher(dep, snap, unseen, events)
        self._supervise_workers(dep, snap, unseen, events)
        running, codes = [], {}
        for node in dep.by_role("trainer"):
            if "remote_pid" not in node.extra:
                continue
            st = snap.get(("trainer", node.index))
            if node.extra.get("host") in unseen or st is None or st.running(node.extra.get("start_time")):
                running.append(node.index)
            else:
                codes[node.index] = st.exit_code
        return TrainerState(running=running, exit_codes=codes, blind=blind, stopped_s=dict(recovery.stopped_s))

    # -- keeping the run going: outages and stopped VMs (recovery.py decides, this acts) ----------------
    def _recovery_for(self, dep: Deployment) -> Recovery:
        if self._recovery is None:
            self._recovery = Recovery(list_statuses=lambda: self._vm_statuses(dep),
                                      restore=lambda node: self._bring_back(dep, node),
                                      outage_limit_s=self._settings.outage_limit_s)
        return self._recovery

    def _vm_statuses(self, dep: Deployment) -> dict[str, str]:
        """Every VM of the run by name: Compute Engine instances, and TPU VMs if the run has any."""
        from . import tpu

        out = {name: st for name, (st, _, _) in compute.statuses(self._clients, run_filter(dep.run_id)).items()}
        if any(n.extra.get("kind") == "tpu" for n in dep.nodes):
            out.update({tpu.short_id(n): n.state.name for n in tpu.list_nodes(self._clients, dep.run_id)})
        return out

    def _bring_back(self, dep: Deployment, node: Node) -> float:
        """Start a stopped worker's (or fault-tolerant dispatcher's) VM, reconnect, restart its process at its old
        port; returns when the VM was RUNNING again (monotonic). Runs in a background thread."""
        s = self._settings
        name = node.extra["instance"]
        if self._watcher is not None:
            self._watcher.forget((node.role, node.index))  # its process died with the VM
        deadline = time.monotonic() + s.running_timeout_s
        started = False
        while True:
            status, internal, external = compute.statuses(self._clients, run_filter(dep.run_id)).get(name, (None,) * 3)
            if status is None:
                raise RemoteError(f"VM {name} no longer exists")
            if status == "RUNNING" and started:
                break
            if status in ("TERMINATED", "STOPPED", "SUSPENDED") and not started:
                operations.wait(self._clients, compute.start(self._clients, name), doing=f"starting VM {name}",
                                timeout_s=s.running_timeout_s)
                started = True
            elif status == "RUNNING":
                started = True  # someone started it already
                continue
            if time.monotonic() > deadline:
                raise CloudTimeout(f"VM {name} did not run again within {s.running_timeout_s:.0f} s (status {status})")
            time.sleep(1.0)
        running_at = time.monotonic()
        if internal != node.extra.get("internal_ip"):
            raise RemoteError(f"VM {name} came back with internal address {internal}, not {node.extra.get('internal_ip')}; "
                              "the trainers' clients wait for the old one")
        old_host = node.extra.get("host")
        with self._state_lock:
            node.extra.update(external_ip=external, host=external if s.public_ips else internal, ready=False)
        self._ssh.drop(old_host)
        self._prepare_vm(node)  # SSH answers; the startup script's marker is still there from its first boot
        if node.role == "dispatcher":
            self._start_dispatcher(dep, self._spec)
        else:
            self._start_worker(dep, node)
        self._wait_servers(dep, [node])
        return running_at

    def _supervise_dispatcher(self, dep: Deployment, snap: dict, unseen: set, events: EventSink) -> None:
        """As the local provider: a fault-tolerant dispatcher is restarted at its address from its journal
        (on its VM's disk); any other dead dispatcher fails the job at once."""
        for node in dep.by_role("dispatcher"):
            st = snap.get(("dispatcher", 0))
            if "remote_pid" not in node.extra or node.extra.get("host") in unseen or st is None \
                    or st.at < node.extra.get("launched_at", 0) or st.running(node.extra.get("start_time")):
                continue
            if not node.extra.get("fault_tolerant") or self._spec is None:
                raise RemoteError(f"the dispatcher ({node.extra['instance']}) exited (code {st.exit_code}) and the job "
                                  "is not fault-tolerant, so its trainers cannot go on; set service.fault_tolerant: true "
                                  f"to have dsctl restart it from its journal. Its log ends with:\n{self._log_tail(node)}")
            count = self._restarts.get(-1, 0) + 1
            self._restarts[-1] = count
            if count > MAX_RESTARTS_PER_WORKER:
                raise RemoteError(f"the dispatcher died {count} times; giving up. Its log ends with:\n{self._log_tail(node)}")
            events("dispatcher-restarted", f"the dispatcher exited (code {st.exit_code}); restarting it at "
                                           f"{node.address} from its journal")
            self._start_dispatcher(dep, self._spec)

    def _supervise_workers(self, dep: Deployment, snap: dict, unseen: set, events: EventSink) -> None:
        for node in dep.by_role("worker"):
            if "remote_pid" not in node.extra or node.extra.get("host") in unseen:
                continue
            st = snap.get(("worker", node.index))
            if st is None or st.at < node.extra.get("launched_at", 0) or st.running(node.extra.get("start_time")):
                continue
            count = self._restarts.get(node.index, 0) + 1
            self._restarts[node.index] = count
            if count > MAX_RESTARTS_PER_WORKER:
                raise RemoteError(f"worker {node.index} died {count} times; giving up. Its log ends with:\n"
                                  f"{self._log_tail(node)}")
            try:
                self._start_worker(dep, node)
            except SshUnreachable:
                continue  # its VM went quiet meanwhile (stopped, an outage): decided on the next polls
            events("worker-restarted", f"worker {node.index} exited (code {st.exit_code}); restarted it at {node.address}")

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
            machines = self._plan_nodes(dep, spec, "worker", list(range(len(current), workers)),
                                        spec.service.worker_machine)
            try:
                reports = self._create(dep, machines, rules=False, events=events)
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

    # -- runs supervised on the cloud (orchestrator/supervise.py) ----------------------------------------
    def prepare_hand_off(self, spec: JobSpec) -> None:
        """Before `up` of a run to be handed over: its VMs carry gcp.max_duration_s (plus an hour) as Compute
        Engine's maxRunDuration, so they end even if the supervisor is lost (TPU VMs have no such limit)."""
        self._max_run_s = spec.gcp.max_duration_s + 3600 if spec.gcp else 86400 + 3600

    def hand_off(self, dep: Deployment, files: dict[str, bytes], base_dir: Path, events: EventSink) -> None:
        """Start the run's supervisor on the dispatcher VM with `files` (name -> contents) in its run dir, and stop
        watching the VMs from here. The spec and the user's code (base_dir) go to Cloud Storage first, from here."""
        s = self._settings
        spec = JobSpec.model_validate_json(files["spec.json"])
        staged = self._stage_trainer_files(dep, spec, Path(dep.run_dir) / "spec.json", base_dir)
        self._gcp_node(dep).extra["trainer_files"] = staged
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        disp = dep.by_role("dispatcher")[0]
        base = f"{disp.extra['dir']}/supervisor"
        run_dir = f"{base}/home/runs/{dep.run_id}"
        dep.save()
        bundle = {f"{run_dir}/{name}": (data, 0o600) for name, data in files.items()}
        bundle[f"{run_dir}/state.json"] = ((Path(dep.run_dir) / "state.json").read_bytes(), 0o600)
        keys = key_dir(dep.run_dir)
        for name in ("id_ed25519", "id_ed25519.pub"):
            bundle[f"{run_dir}/ssh/{name}"] = ((keys / name).read_bytes(), 0o600)
        self._ssh.put(disp.extra["host"], bundle)
        env = {"DSCTL_HOME": f"{base}/home", **{k: v for k, v in (
            ("DSCTL_GCE_ENDPOINT", s.compute_endpoint), ("DSCTL_TPU_ENDPOINT", s.tpu_endpoint),
            ("DSCTL_CRM_ENDPOINT", s.crm_endpoint), ("STORAGE_EMULATOR_HOST", s.storage_host)) if v}}
        layout = remote.Layout(base)
        res = self._ssh.run(disp.extra["host"], remote.launch(layout, s.python, "dsctl.cli.main", ["supervise", run_dir],
                                                              env), doing="starting the run's supervisor")
        if res.code != 0:
            raise RemoteError(f"could not start the run's supervisor on {disp.extra['instance']}: "
                              f"{(res.stderr or res.stdout).strip()[-300:]}")
        pid, start = remote.parse_launch(res.stdout)
        dep.nodes.append(Node(role="supervisor", index=0, extra={
            "instance": disp.extra["instance"], "host": disp.extra["host"], "dir": base, "remote_pid": pid,
            "start_time": start}))
        self._save(dep)
        events("handed-over", f"the run is supervised on its dispatcher VM {disp.extra['instance']} from now on")

    def supervisor_status(self, dep: Deployment) -> str:
        """'running', 'exited (code N)', or why it is not known; one SSH command to the dispatcher VM."""
        nodes = dep.by_role("supervisor")
        if not nodes:
            return "no supervisor"
        node = nodes[0]
        if self._ssh is None:
            self._context(dep)
        try:
            res = self._ssh.run(node.extra["host"], remote.status([node.extra["dir"]]), doing="checking the supervisor",
                                timeout=30)
        except RemoteError as exc:
            return f"unknown ({exc})"
        st = remote.parse_status(res.stdout, time.monotonic()).get(node.extra["dir"])
        if st is None:
            return "unknown"
        return "running" if st.running(node.extra.get("start_time")) else f"exited (code {st.exit_code})"

    def adopt(self, dep: Deployment, spec: JobSpec) -> None:
        """On the dispatcher VM: take over a deployment handed over by `hand_off`. Every VM is reached at its
        internal address from here; the dispatcher and workers are watched from now on."""
        self._spec = spec
        self._inside = dep.by_role("dispatcher")[0].extra["instance"]
        self._context(dep)
        dep.nodes = [n for n in dep.nodes if n.role != "supervisor"]
        for extra in [n.extra for n in dep.nodes] + list(self._gcp_node(dep).extra.get("trainer_vms", {}).values()):
            if extra.get("internal_ip"):
                extra["host"] = extra["internal_ip"]
        self._ensure_watcher()
        now = time.monotonic()
        for n in dep.nodes:
            if n.role in ("dispatcher", "worker") and n.extra.get("remote_pid"):
                n.extra["launched_at"] = now  # a time of this machine's clock: readings from now on count
                self._watcher.watch(Watched(key=(n.role, n.index), host=n.extra["host"], layout=self._layout(dep, n),
                                            launched_at=now))
        self._save(dep)

    def check_supervisor(self, dep: Deployment, spec: JobSpec) -> None:
        """On the dispatcher VM, before touching anything: may this VM's service account do what a supervisor
        does? Raises GcpError naming what it lacks and how to grant it (the user's machine then deletes the run)."""
        self._context(dep)
        missing = preflight.missing_permissions(self._clients, preflight.supervisor_permissions(spec, self._settings.public_ips),
                                                "checking the dispatcher VM's permissions")
        if missing:
            sa = self._settings.service_account or "the project's default compute service account"
            raise GcpError(
                f"the run's supervisor on the dispatcher VM runs as the VMs' service account ({sa}), which lacks "
                f"{len(missing)} permission(s) it needs on project {self._settings.project}: {', '.join(missing[:8])}"
                f"{' ...' if len(missing) > 8 else ''}. Grant that account roles/compute.instanceAdmin.v1, "
                "roles/compute.securityAdmin and roles/storage.objectAdmin (and roles/tpu.admin for TPU trainers), "
                "or set gcp.supervisor: here to supervise the run from this machine (dsctl up only, no --detach).")

    def run_objects(self, dep: Deployment):
        """Where a supervised run's record is published (orchestrator/cloudrecord.py)."""
        from .storage import RunObjects

        if self._clients is None:
            self._context(dep)
        return RunObjects(self._clients.storage, self._settings.bucket, dep.run_id)

    def delete_self(self, dep: Deployment) -> None:
        """The supervisor's last act, after the run's record is published: delete the VM it runs on, which
        ends this process."""
        if self._inside is None:
            return
        op = compute.delete(self._clients, self._inside)
        if op is not None:
            operations.wait(self._clients, op, doing=f"deleting VM {self._inside}", timeout_s=300)

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
        for n in by_name.values():
            n.extra["deleting"] = True  # a VM on its way out is not one to start again

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
        events = relay(events)
        try:
            Fleet(self._clients, dep.run_id, log=lambda msg: events("cloud", msg)).delete(instances, tpus, fws, gone)
        finally:
            events.flush()

    def down(self, dep: Deployment, events: EventSink) -> None:
        if self._gcp_node(dep) is None and self._settings is None:
            dep.status = "down"
            self._save(dep)
            events("down", "nothing was created on Google Cloud")
            return
        self._context(dep)
        events = relay(events)
        self._cancel.set()  # anything still waiting on the way up stops
        if self._watcher is not None:
            self._watcher.stop()
        if self._recovery is not None:
            self._recovery.close()
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
        # A supervisor deletes the VM it runs on last of all (delete_self), after its record is published.
        mine = [n for n in machines if n.extra.get("instance") == self._inside]
        self._delete_nodes(dep, [n for n in machines if n not in mine], events, firewall=True)
        fleet = Fleet(self._clients, dep.run_id, log=lambda msg: events("cloud", msg))
        found = fleet.sweep(keep={self._inside} if self._inside else set())
        events.flush()
        # Billing resources are gone; now the bookkeeping: a copy of the results, the run's staging objects.
        try:
            staging = Staging(self._clients, dep.run_id)
            if self._gcp_node(dep).extra.get("staged") or any(n.extra.get("remote_pid") for n in machines):
                staging.collect(Path(dep.run_dir))
                left = staging.delete_staging()
                if left:
                    events("cloud", f"{len(left)} staging object(s) could not be deleted: {', '.join(left[:3])}")
        except Exception as exc:  # keeping a copy in GCS is a convenience; deleting VMs was not
            events("cloud", f"copying metrics and logs to Cloud Storage, or deleting the staging objects, failed: {exc}")
        dep.status = "down"
        self._save(dep)
        extra = f"; also removed {found.summary()} found by label" if not found.empty else ""
        events("down", f"all Google Cloud resources of the run deleted in {time.monotonic() - t0:.1f} s{extra}")
