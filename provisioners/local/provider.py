"""The local provider: the dispatcher, workers and trainers as processes on this machine.

Every server listens on a loopback port, logs to the run dir, and is
recorded in the state file the moment it starts. Workers are supervised: one
that dies is restarted at its own port, because tf.data service clients wait
for a lost worker's address forever (see docs/architecture.md).

The deployment runs in a network namespace of its own with only loopback up
(the launcher makes it; everything it forks is inside): tf.data service has no
authentication and binds every interface, so that is what keeps anyone else on
the machine's network from submitting dataset graphs or registering workers.
Where namespaces are not allowed the run goes on in the machine's network and
says so (event "not-isolated"). DSCTL_LOCAL_ISOLATION=none|require changes that.

Every process of the deployment is also in one cgroup of its own (containment.py): the launcher
joins it before it runs, so all it forks, and whatever those start in sessions of their own
(daemons), is inside. Teardown stops the process groups in order, then ends the cgroup: nothing
the run started is left. Where cgroups cannot be made here the run goes on with process groups
only and says so (event "not-contained"); DSCTL_LOCAL_CONTAINMENT=none|require changes that.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any, ClassVar

import psutil

from dsctl.errors import DsctlError
from dsctl.runtime.logtail import tail as log_tail
from dsctl.runtime.readiness import pick_service_port, read_json
from dsctl.runtime.sampler import ProcessSampler, Sample
from dsctl.runtime.serve import EXIT_PORT_IN_USE
from dsctl.specs import SpecError, exits
from dsctl.specs.schema import JobSpec

from .. import containment
from ..containment import Cgroup, container_of
from ..contract import Bill, Billed, Contents, EventSink, Poll, ServerExit, TrainerLaunch, TrainerState
from ..processes import is_ours, reap, stop_groups
from ..registry import get_provider, register
from ..state import Deployment, Node, StateCodec
from .hangs import HangWatch
from .launcher import Launcher
from .processes import enter_namespaces_of, spawn
from .state import Isolation, LocalCodec, LocalDeployment, LocalNode

# Measured with `dsctl bench` style runs: an idle tf.data service worker holds
# ~300 MB resident and grows with its buffers; trainers and the dispatcher hold
# more. The budget keeps a fifth of available memory free for the OS and data.
WORKER_MEMORY_BYTES = 500 * 2**20
OTHER_PROCESS_MEMORY_BYTES = 900 * 2**20
# A worker inside a trainer process (service.placement: hybrid) shares that process's TensorFlow: what it adds is its
# threads and buffers. Measured here with TensorFlow 2.21: 5 MB resident per extra in-process worker reading 64 x 12 KB
# batches; counted at 64 MB, for pipelines with larger elements.
IN_PROCESS_WORKER_MEMORY_BYTES = 64 * 2**20
READY_TIMEOUT_S = 120.0
# A forked process's exit status comes from the launcher that reaps it. While the launcher lives its answer is on
# its way, however loaded the machine (a trainer's memory cgroup thrashing before the kernel kills it slows every
# process in it): waited for this long. A launcher that has ended says nothing more: its children's statuses are lost.
LAUNCHER_REAP_WAIT_S = 120.0
# A restarting worker whose port another process holds: tried again at the same address (the only
# one its clients will read the rest of its share from) with backoff, for this long; then moved.
WORKER_PORT_WAIT_S = 30.0
PORT_RETRY_FIRST_S, PORT_RETRY_MAX_S = 0.5, 8.0
DISPATCHER_PORT_WAIT_S = 30.0  # a dispatcher cannot move: every client and worker has its address
ISOLATION_ENV = "DSCTL_LOCAL_ISOLATION"
ISOLATION_MODES = ("auto", "none", "require")
ISOLATION_ANSWER_TIMEOUT_S = 60.0
STANDS_IN_FOR = "gcp"  # the place whose machine types a local run's processes stand for


def isolation_mode() -> str:
    """auto (default: a private network where the machine allows it), none, or require (refuse to run without)."""
    return (os.environ.get(ISOLATION_ENV) or "auto").strip().lower()


class ProcessFailed(DsctlError):
    """A process of the deployment failed to start; the message carries its log's tail."""


class PortTaken(ProcessFailed):
    """A server exited at start because another process holds its port; names that process when it can."""

    def __init__(self, node: Node, holder: str):
        self.node, self.holder = node, holder
        name = node.role if node.role == "dispatcher" else f"{node.role} {node.index}"
        super().__init__(f"the {name} cannot start: its port {_state(node).port} is taken by {holder}.")


def _state(node: Node) -> LocalNode:
    state = node.state
    assert isinstance(state, LocalNode), f"{node.role} {node.index} is not a local process"
    return state


def _holder(node: Node) -> str:
    """Who holds the node's port, from the refusal the server wrote last in its log."""
    for line in reversed(log_tail(node.log, 5).splitlines()):
        if "already in use by" in line:
            return line.split("already in use by", 1)[1].split(";", 1)[0].strip()
    return "another process"


def local_capacity(trainers: int, in_process_workers: int = 0) -> int:
    """How many workers fit in this machine's available memory beside the dispatcher and trainers (and the workers
    inside each trainer process, `in_process_workers` per trainer)."""
    budget = (psutil.virtual_memory().available * 0.8 - (trainers + 1) * OTHER_PROCESS_MEMORY_BYTES
              - trainers * in_process_workers * IN_PROCESS_WORKER_MEMORY_BYTES)
    return max(int(budget // WORKER_MEMORY_BYTES), 0)


def in_process_workers(spec: JobSpec) -> int:
    """Workers each trainer process starts in itself (hybrid placement; under auto, the most its policy may start),
    0 otherwise."""
    return spec.service.local_workers if spec.service.placement != "remote" else 0


@register
class LocalProvider:
    name: ClassVar[str] = "local"
    codec: ClassVar[StateCodec] = LocalCodec()
    runs_here: ClassVar[bool] = True
    # Its processes stand for the machines the spec names, as a run on Google Cloud (whose machine types they are)
    # would create them: a local run is priced as that run, and says so.
    stands_in_for: ClassVar[str | None] = STANDS_IN_FOR

    def __init__(self) -> None:
        self._procs: dict[tuple[str, int], subprocess.Popen] = {}
        self._sampler = ProcessSampler()
        self._cache_mb = 0
        self._launcher: Launcher | None = None
        self._service_cpus: list[int] | None = None
        self._vanished: dict[int, float] = {}  # pid -> when it was first seen gone without an exit code
        self._isolation_reported = False
        self._port_waits: dict[int, dict] = {}  # worker index -> its wait for a port another process holds
        self._watches: dict[int, exits.Watch] = {}  # pid -> a process spawned here (no launcher): its memory cgroups
        self._endings: dict[int, str] = {}  # pid -> how a process spawned here ended (judged once)
        self._hangs = HangWatch()  # servers that stopped answering (provisioners/local/hangs.py)

    # -- checks -----------------------------------------------------------------
    def capacity(self, trainers: int) -> int:
        return local_capacity(trainers)

    # -- what a run creates that bills: what a run of its spec on the place it stands in for would ---------------------
    def bill(self, spec: JobSpec, workers: int, trainers: int) -> Bill:
        return get_provider(STANDS_IN_FOR).bill(spec, workers, trainers)

    def billed(self, kept: dict[str, Any] | None, spec_json: str, workers: int, trainers: int) -> Billed:
        """As a run of its spec there would have: what it kept, else what its spec says (always, for a local run
        creates nothing whose defaults could have changed under it)."""
        there = get_provider(STANDS_IN_FOR)
        bill = there.billed(kept, spec_json, workers, trainers).bill if kept else None
        if bill is None:
            bill = there.bill(JobSpec.model_validate_json(spec_json), workers, trainers)
        return Billed(bill, f"as for a {STANDS_IN_FOR} run of this spec")

    def check(self, spec: JobSpec, workers: int, base_dir: Path) -> None:
        containment.mode()  # an unknown DSCTL_LOCAL_CONTAINMENT is refused before anything starts
        if isolation_mode() not in ISOLATION_MODES:
            raise SpecError(f"the environment variable {ISOLATION_ENV} is {os.environ.get(ISOLATION_ENV)!r}; use auto "
                            "(the default: the deployment in a network of its own where this machine allows it), none "
                            "(in this machine's network, reachable from it) or require (refuse to run without one).")
        local = in_process_workers(spec)
        capacity = local_capacity(spec.trainer.count, local)
        if workers > capacity:
            free_gb = psutil.virtual_memory().available / 2**30
            if local and workers <= local_capacity(spec.trainer.count):
                room = (psutil.virtual_memory().available * 0.8 - (spec.trainer.count + 1) * OTHER_PROCESS_MEMORY_BYTES
                        - workers * WORKER_MEMORY_BYTES)
                local_fit = max(int(room // (spec.trainer.count * IN_PROCESS_WORKER_MEMORY_BYTES)), 0)
                raise SpecError(
                    f"{workers} workers and {local} in-process worker(s) in each of {spec.trainer.count} trainer(s) do "
                    f"not fit on this machine: each worker process needs about {WORKER_MEMORY_BYTES // 2**20} MB, "
                    f"each in-process worker about {IN_PROCESS_WORKER_MEMORY_BYTES // 2**20} MB more in its "
                    f"trainer, and {free_gb:.1f} GB is available, enough for {capacity} worker(s) beside the "
                    f"dispatcher and the trainers with their in-process workers. Use service.local_workers: "
                    f"{local_fit} or fewer beside {workers} workers, or at most {capacity} workers here, or run on "
                    "Google Cloud with provider: gcp.",
                    field="service.local_workers",
                )
            with_local = f" with {local} in-process worker(s) each (service.local_workers)" if local else ""
            raise SpecError(
                f"{workers} workers do not fit on this machine: each local worker needs about "
                f"{WORKER_MEMORY_BYTES // 2**20} MB and {free_gb:.1f} GB is available, enough for {capacity} "
                f"beside the dispatcher and {spec.trainer.count} trainer(s){with_local}. Use at most {capacity} "
                "workers here, predict larger counts with `dsctl sweep --simulate`, or run on Google Cloud with "
                "provider: gcp.",
                field="service.workers",
            )

    # -- servers ----------------------------------------------------------------
    def _wait_ready(self, nodes: list[Node], dep: Deployment) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = list(nodes)
        while pending:
            self._resolve(dep)
            for node in list(pending):
                state = _state(node)
                if node.pid is None:
                    if not self._launcher_alive(dep):
                        raise ProcessFailed(f"the launcher exited before starting the {node.role}; "
                                            f"see {Path(dep.run_dir) / 'logs' / 'launcher.log'}:\n"
                                            f"{log_tail(str(Path(dep.run_dir) / 'logs' / 'launcher.log'))}")
                    continue
                assert state.ready_file is not None, f"the {node.role} was started with its ready file"
                ready = read_json(state.ready_file)
                if ready and ready.get("pid") == node.pid:
                    node.address = f"127.0.0.1:{ready['port']}"
                    state.port, state.ready, state.served = ready["port"], True, True
                    pending.remove(node)
                elif not is_ours(node):
                    code = self._exit_code(dep, node)
                    if code is None:
                        continue  # gone, its exit code not written yet: wait for it (a port refusal is told apart)
                    if code == EXIT_PORT_IN_USE and node.role in ("worker", "dispatcher"):
                        picks = state.port_picks + 1
                        if node.role == "worker" and not state.served and picks <= 5:
                            # No client knows this address yet: another port will do.
                            state.port_picks = picks
                            self._start_worker(dep, node, port=self._pick_port(dep))
                            continue
                        raise PortTaken(node, _holder(node))
                    raise ProcessFailed(
                        f"the {node.role} {node.index} exited (code {code}) before it was ready. "
                        f"Its log ({node.log}) ends with:\n{log_tail(node.log)}"
                    )
            if pending and time.monotonic() > deadline:
                names = ", ".join(f"{n.role} {n.index}" for n in pending)
                raise ProcessFailed(f"{names} not ready after {READY_TIMEOUT_S:.0f} s; see the logs in {dep.run_dir}/logs.")
            if pending:
                time.sleep(0.1)
        dep.save()

    def _launch(self, dep: Deployment, node: Node, module: str, argv: list[str], log: Path,
                cpus: list[int] | None = None) -> None:
        """Start `python -m module argv` for node: forked by the launcher when it is up, else spawned."""
        if cpus:
            _state(node).cpus = cpus
        if self._launcher is not None and self._launcher_alive(dep):
            self._launcher.request(node, module, argv, log, cpus)
        else:
            proc = self._procs[(node.role, node.index)] = spawn(node, [module, *argv], log, cpus,
                                                                self._namespace_prefix(dep), container_of(self._dep_state(dep)))
            self._watches[proc.pid] = exits.watch(proc.pid)
        dep.save()

    def _namespace_prefix(self, dep: Deployment) -> list[str]:
        """Without its launcher, a process of an isolated deployment is started in the deployment's network
        (entered through a process still in it), or its clients and servers could not reach each other."""
        isolation = self._dep_state(dep).isolation
        if isolation is None or not isolation.isolated:
            return []
        log = Path(dep.run_dir) / "logs" / "launcher.log"
        for node in dep.by_role("dispatcher") + dep.by_role("worker") + dep.by_role("trainer"):
            if node.pid and is_ours(node):
                try:
                    return enter_namespaces_of(node.pid)
                except FileNotFoundError as exc:
                    if "nsenter" in str(exc):
                        raise ProcessFailed(f"the launcher exited (see {log}), and starting a process inside the "
                                            f"run's private network without it needs nsenter, which is not "
                                            "installed (util-linux).") from None
                except OSError:
                    continue  # exited meanwhile
        raise ProcessFailed(f"the launcher and every process of the run have exited, and with them the run's private "
                            f"network; see {log}.")

    def _launcher_alive(self, dep: Deployment) -> bool:
        launcher = self._dep_state(dep).launcher
        return launcher is not None and is_ours(launcher)

    @staticmethod
    def _dep_state(dep: Deployment) -> LocalDeployment:
        if dep.state is None:
            dep.state = LocalDeployment()
        assert isinstance(dep.state, LocalDeployment), f"run {dep.run_id} is not a local deployment"
        return dep.state

    def _resolve(self, dep: Deployment) -> None:
        if self._launcher is None:
            return
        changed = False
        for node in dep.nodes:
            if node.pid is None and _state(node).launch_id:
                changed |= self._launcher.resolve(node)
                if node.pid and node.role == "trainer":  # its cgroups' out-of-memory kill counts, should its status be lost
                    self._watches[node.pid] = exits.watch(node.pid)
        if changed:
            dep.save()

    def _pick_port(self, dep: Deployment) -> int:
        return pick_service_port(exclude={n.state.port for n in dep.nodes if isinstance(n.state, LocalNode) and n.state.port})

    def _start_worker(self, dep: Deployment, node: Node, port: int | None = None) -> None:
        state = _state(node)
        ready = Path(dep.run_dir) / "ready" / f"worker-{node.index}.json"
        ready.unlink(missing_ok=True)
        if port is not None:
            state.port = port
            node.address = f"127.0.0.1:{port}"
        state.ready_file, state.ready = str(ready), False
        assert dep.dispatcher_address is not None, "workers start after the dispatcher"
        args = ["--dispatcher", dep.dispatcher_address, "--host", "127.0.0.1",
                "--port", str(state.port), "--ready-file", str(ready)]
        if state.cache_mb:
            args += ["--cross-trainer-cache-mb", str(state.cache_mb)]
        self._launch(dep, node, "dsctl.runtime.worker", args, Path(dep.run_dir) / "logs" / f"worker-{node.index}.log",
                     self._service_cpus)

    def up(self, spec: JobSpec, dep: Deployment, workers: int, events: EventSink) -> None:
        """Start the dispatcher and workers together; wait_ready() waits for them.

        Workers (and trainers) retry until the dispatcher answers, so nothing
        waits for anything else to import TensorFlow: on 2 cores that halves
        the time to the first batch.
        """
        run_dir = Path(dep.run_dir)
        self._start_launcher(dep, events, isolate=isolation_mode() != "none")
        self._service_cpus = spec.service.worker_cpus
        port = self._pick_port(dep)
        ready_file, status_file = str(run_dir / "ready" / "dispatcher.json"), str(run_dir / "dispatcher-status.json")
        state = LocalNode(port=port, ready_file=ready_file, status_file=status_file)
        disp = Node(role="dispatcher", index=0, address=f"127.0.0.1:{port}", state=state)
        dep.nodes.append(disp)
        dep.dispatcher_address = disp.address
        state.argv = ["--port", str(port), "--ready-file", ready_file, "--status-file", status_file]
        if spec.service.fault_tolerant:
            state.argv += ["--fault-tolerant", "--work-dir", str(run_dir / "journal")]
        self._launch(dep, disp, "dsctl.runtime.dispatcher", state.argv, run_dir / "logs" / "dispatcher.log",
                     self._service_cpus)
        self._cache_mb = spec.service.cross_trainer_cache_mb if spec.service.cross_trainer_cache else 0
        self._add_workers(dep, workers)
        events("starting", f"dispatcher and {workers} worker(s) starting")
        # The launcher answers before it imports TensorFlow, and forks nothing until that is done: no time lost.
        self._report_isolation(dep, events)

    def _start_launcher(self, dep: Deployment, events: EventSink, isolate: bool = False) -> None:
        """Start the launcher once per deployment, in the run's cgroup; one started for a service isolates its
        network."""
        if self._launcher is None:
            group = self._contain(dep, events)
            self._launcher = Launcher(Path(dep.run_dir))
            self._dep_state(dep).launcher = self._launcher.start(Path(dep.run_dir) / "logs" / "launcher.log",
                                                                 isolate=isolate, cgroup=group)
            dep.save()

    def _contain(self, dep: Deployment, events: EventSink) -> Cgroup | None:
        """The run's cgroup, made before its first process starts (its path saved first, so `dsctl down` after
        `kill -9` of `dsctl up` at any moment finds it); where it cannot be made, a `not-contained` warning (or,
        under DSCTL_LOCAL_CONTAINMENT=require, a refusal before anything starts)."""
        state = self._dep_state(dep)
        if state.container is not None:
            return container_of(state)
        state.container = containment.plan_run(dep.run_id)
        dep.save()
        state.container, group = containment.make_run(state.container)
        dep.save()
        if group is not None:
            events("contained", f"every process of the run is in cgroup {group.path}: its teardown and `dsctl down` "
                                "end all of them, daemons included")
        else:
            events("not-contained", containment.not_contained_warning(state.container.reason))
        return group

    def _report_isolation(self, dep: Deployment, events: EventSink) -> None:
        """Wait for the launcher to say whether the deployment has a network of its own, keep it in the state
        and tell the user; refuse to go on without one under DSCTL_LOCAL_ISOLATION=require."""
        if self._isolation_reported or self._launcher is None or self._dep_state(dep).launcher is None:
            return
        mode = isolation_mode()
        log = Path(dep.run_dir) / "logs" / "launcher.log"
        isolation: Isolation | None
        if mode == "none":
            isolation = Isolation(isolated=False, reason=f"{ISOLATION_ENV}=none")
        else:
            deadline = time.monotonic() + ISOLATION_ANSWER_TIMEOUT_S
            while (isolation := self._launcher.isolation()) is None:
                if not self._launcher_alive(dep):
                    raise ProcessFailed(f"the launcher exited while setting up the run's network; see {log}:\n"
                                        f"{log_tail(str(log))}")
                if time.monotonic() > deadline:
                    raise ProcessFailed(f"the launcher did not set up the run's network within "
                                        f"{ISOLATION_ANSWER_TIMEOUT_S:.0f} s; see {log}.")
                time.sleep(0.02)
        self._dep_state(dep).isolation = isolation
        dep.save()
        self._isolation_reported = True
        if isolation.isolated:
            events("isolated", "the service's ports are reachable only from the run's own processes: the deployment "
                               "runs in a network namespace of its own with only loopback up")
            return
        reason = isolation.reason or "unknown"
        if mode == "require":
            raise ProcessFailed(f"{ISOLATION_ENV}=require, but this machine does not let dsctl give the run a network "
                                f"namespace of its own ({reason}). Run where namespaces are allowed, or set "
                                f"{ISOLATION_ENV}=auto to run in the machine's network.")
        port = _state(dep.by_role("dispatcher")[0]).port if dep.by_role("dispatcher") else "?"
        events("not-isolated", f"warning: the run's tf.data service ports (the dispatcher's, {port}, and the "
                               "workers') listen on every interface, without authentication, and are reachable from "
                               "this machine's network while the run is up: anyone who reaches them can run dataset "
                               f"graphs as you and register workers. No private network for the run: {reason}.")

    def wait_ready(self, dep: Deployment, events: EventSink) -> None:
        self._report_isolation(dep, events)
        nodes = [n for n in dep.nodes if n.role in ("dispatcher", "worker") and not _state(n).ready]
        self._wait_ready(nodes, dep)  # a taken port fails the dispatcher (PortTaken); workers take another
        events("ready", f"dispatcher and {len(dep.by_role('worker'))} worker(s) ready")

    def _add_workers(self, dep: Deployment, workers: int) -> list[Node]:
        new = []
        for index in range(len(dep.by_role("worker")), workers):
            node = Node(role="worker", index=index, state=LocalNode(port=self._pick_port(dep), cache_mb=self._cache_mb))
            dep.nodes.append(node)
            self._start_worker(dep, node)
            new.append(node)
        return new

    def scale_workers(self, dep: Deployment, workers: int, events: EventSink) -> None:
        """Add workers (and wait for them) or stop the highest-numbered ones, on the running dispatcher."""
        current = dep.by_role("worker")
        if workers > len(current):
            new = self._add_workers(dep, workers)
            events("starting", f"starting {len(new)} worker(s)")
            self._wait_ready(new, dep)
            events("scaled", f"{workers} worker(s) ready")
        elif workers < len(current):
            leaving = current[workers:]
            stop_groups(leaving)
            for node in leaving:
                self._port_waits.pop(node.index, None)
            dep.nodes = [n for n in dep.nodes if n not in leaving]
            dep.save()
            events("scaled", f"removed {len(leaving)} worker(s); {workers} remain")

    # -- trainers ---------------------------------------------------------------
    def start_trainers(self, dep: Deployment, launch: TrainerLaunch, events: EventSink) -> None:
        self._start_launcher(dep, events)
        launch.metrics_dir.mkdir(parents=True, exist_ok=True)
        for old in dep.by_role("trainer"):
            dep.nodes.remove(old)
        for index in range(launch.count):
            state = LocalNode(command=launch.command)
            metrics = str(launch.metrics_dir / f"trainer-{index}.jsonl")
            node = Node(role="trainer", index=index, metrics=metrics, state=state)
            args = launch.harness_args(index, spec=str(launch.spec_json), metrics=metrics,
                                       cache_dir=str(launch.cache_dir), base_dir=str(launch.base_dir),
                                       dispatcher=dep.dispatcher_address)
            if launch.record_steps:
                state.steps = str(launch.metrics_dir / f"trainer-{index}.steps.json")
                args += ["--record-steps", state.steps]
            if launch.record_ids:
                state.ids = str(launch.metrics_dir / f"trainer-{index}.ids.json")
                args += ["--record-ids", state.ids]
            dep.nodes.append(node)
            self._launch(dep, node, launch.module, args, launch.metrics_dir / f"trainer-{index}.log", launch.cpus)
        events("training", f"{launch.count} trainer(s) started ({launch.mode})")

    def _exit_code(self, dep: Deployment, node: Node) -> int | None:
        """None while the node's process runs (or is not forked yet); its exit code after.

        A process the launcher forked is reaped by the launcher, which then writes its exit code; on a loaded
        machine that can lag well behind the process's end, so a vanished process without an exit file counts as
        running while the launcher lives (up to LAUNCHER_REAP_WAIT_S), and is reported lost (-1) once the launcher
        has ended without writing it: nobody else can read that status.
        """
        proc = self._procs.get((node.role, node.index))
        if proc is not None and proc.pid == node.pid:
            return proc.poll()
        if node.pid is None or is_ours(node):
            return None
        launcher = self._answers(dep)
        code = launcher.exit_code(node)
        if code is not None:
            return code
        vanished = self._vanished.setdefault(node.pid, time.monotonic())
        if self._launcher_alive(dep) and time.monotonic() - vanished < LAUNCHER_REAP_WAIT_S:
            return None
        code = launcher.exit_code(node)  # written just before the launcher ended
        return -1 if code is None else code

    def _ending(self, dep: Deployment, node: Node, code: int) -> str | None:
        """How the node's ended process ended, in words: the launcher's, who reaped it; for one spawned here, judged
        here (an out-of-memory kill named by the evidence: dsctl.specs.exits); for one whose status was lost, that,
        with any evidence of an out-of-memory kill in the cgroups it was watched in here."""
        proc = self._procs.get((node.role, node.index))
        if proc is not None and proc.pid == node.pid:
            if proc.pid not in self._endings:
                self._endings[proc.pid] = str(exits.judge(code, pid=proc.pid, watch=self._watches.pop(proc.pid, None)))
            return self._endings[proc.pid]
        said = self._answers(dep).ending(node)
        if said or code != -1:
            return said
        key = node.pid or 0
        if key not in self._endings:  # judged once: the kernel log is read once, not on every poll
            self._endings[key] = self._lost(dep, node)
        return self._endings[key]

    def _answers(self, dep: Deployment) -> Launcher:
        """The launcher's answers (exit files) for this deployment: files, so any dsctl process reads them."""
        return self._launcher or Launcher(Path(dep.run_dir))

    def _lost(self, dep: Deployment, node: Node) -> str:
        """How a trainer whose exit status was lost with its launcher ended, as far as the evidence says."""
        log = Path(dep.run_dir) / "logs" / "launcher.log"
        why = (f"the launcher that forked it has not said how within {LAUNCHER_REAP_WAIT_S:.0f} s"
               if self._launcher_alive(dep) else "the launcher that forked it ended without saying how")
        lost = f"ended, and its exit status is lost: {why} (see {log})"
        watch = self._watches.get(node.pid or 0)  # when it started, and its cgroups' kill counts then
        if not node.pid or watch is None:
            return lost
        if killed := exits.judge_lost(node.pid, watch):  # the kernel log names it: that is how it ended
            return f"{killed}. Its exit status is lost: {why} (see {log})"
        evidence = exits.oom_evidence(node.pid, watch)
        return f"{lost}. The kernel's out-of-memory killer may have ended it; evidence: {evidence}" if evidence else lost

    def poll(self, dep: Deployment, events: EventSink) -> Poll:
        """The trainers' state, and the servers found exited (a worker waiting for its taken port is tried again
        here, not reported)."""
        self._resolve(dep)
        exited = []
        for node in dep.by_role("dispatcher") + dep.by_role("worker"):
            if node.role == "dispatcher" and not _state(node).ready:
                continue  # not started yet: wait_ready judges it
            if node.index in self._port_waits and node.role == "worker":
                self._retry_taken_port(dep, node, events)
                continue
            code = self._exit_code(dep, node)
            if code is not None:
                exited.append(ServerExit(node, code))
            elif (why := self._hangs.check(node)) is not None:
                exited.append(self._end_hung(node, why, events))
        running, codes, endings = [], {}, {}
        for node in dep.by_role("trainer"):
            code = self._exit_code(dep, node)
            if code is None:
                running.append(node.index)
                continue
            codes[node.index] = code
            ended = self._ending(dep, node, code) if code != 0 else None
            if ended:
                endings[node.index] = ended
        return Poll(TrainerState(running=running, exit_codes=codes, endings=endings), exited)

    def _end_hung(self, node: Node, why: str, events: EventSink) -> ServerExit:
        """A server that stopped answering, ended (SIGTERM, continued, then SIGKILL) and reported as one that exited,
        for the supervisor to restart it or fail the run; its event names it and why."""
        who = "the dispatcher" if node.role == "dispatcher" else f"{node.role} {node.index}"
        events(f"{node.role}-hung", f"{who} ({node.address}, pid {node.pid}) stopped answering: {why}; dsctl ends it")
        stop_groups([node], grace_s=1.0)
        return ServerExit(node, -9, why=f"stopped answering ({why}) and was ended by dsctl")

    def restart(self, dep: Deployment, node: Node, events: EventSink) -> None:
        """An exited server, at its own port: the dispatcher from its journal, a worker possibly after waiting for
        its port (see _restart_worker)."""
        if node.role == "dispatcher":
            self._restart_dispatcher(dep, node, events)
        else:
            self._restart_worker(dep, node, events)

    def log_tail(self, dep: Deployment, node: Node) -> str:
        return f"({node.log})\n{log_tail(node.log)}"

    def _restart_dispatcher(self, dep: Deployment, node: Node, events: EventSink) -> None:
        """At its own port, which every client and worker has: if another process holds it, try again with
        backoff for DISPATCHER_PORT_WAIT_S, then fail the job saying who holds it."""
        since, delay = time.monotonic(), PORT_RETRY_FIRST_S
        state = _state(node)
        assert state.ready_file is not None, "the dispatcher was started with its ready file"
        while True:
            Path(state.ready_file).unlink(missing_ok=True)
            state.ready = False
            self._launch(dep, node, "dsctl.runtime.dispatcher", state.argv,
                         Path(dep.run_dir) / "logs" / "dispatcher.log", self._service_cpus)
            try:
                self._wait_ready([node], dep)
                return
            except PortTaken as exc:
                if time.monotonic() - since >= DISPATCHER_PORT_WAIT_S:
                    raise ProcessFailed(
                        f"the dispatcher cannot restart: its port {state.port} has been taken by {exc.holder} "
                        f"for {DISPATCHER_PORT_WAIT_S:.0f} s, and its clients and workers know it only at "
                        f"{node.address}. Stop that process and run the job again.") from None
                if delay == PORT_RETRY_FIRST_S:
                    events("dispatcher-port-taken", f"the dispatcher cannot restart at {node.address}: its port is "
                                                    f"taken by {exc.holder}; trying again for up to "
                                                    f"{DISPATCHER_PORT_WAIT_S:.0f} s")
                time.sleep(delay)
                delay = min(delay * 2, PORT_RETRY_MAX_S)

    def _restart_worker(self, dep: Deployment, node: Node, events: EventSink) -> None:
        """Start the worker again at its own port and wait for it. If another process holds the port, the
        worker waits for it (see _retry_taken_port) while the rest of the job goes on."""
        self._start_worker(dep, node)
        try:
            self._wait_ready([node], dep)
        except PortTaken as exc:
            now = time.monotonic()
            wait = self._port_waits.get(node.index)
            if wait is None:
                wait = self._port_waits[node.index] = {"since": now, "delay": PORT_RETRY_FIRST_S}
                events("worker-port-taken",
                       f"worker {node.index} cannot restart at {node.address}: its port is taken by {exc.holder}. "
                       f"Its clients read the rest of its share from that address only, so dsctl tries it again for "
                       f"up to {WORKER_PORT_WAIT_S:.0f} s, then moves the worker to a new port.")
            else:
                wait["delay"] = min(wait["delay"] * 2, PORT_RETRY_MAX_S)
            wait.update(next=now + wait["delay"], holder=exc.holder)
            return
        wait = self._port_waits.pop(node.index, None)
        if wait is not None:
            events("worker-port-free", f"worker {node.index} restarted at {node.address}, its port free again after "
                                       f"{time.monotonic() - wait['since']:.1f} s")

    def _retry_taken_port(self, dep: Deployment, node: Node, events: EventSink) -> None:
        """Try a worker's taken port again when its backoff is up; after WORKER_PORT_WAIT_S, move the worker.

        tf.data service has no way to hand a lost worker's share to another address: its clients go on
        with the other workers and wait for that one at the end of a finite dataset. A worker at a new
        port registers with the dispatcher as a new worker and serves the job from there."""
        wait = self._port_waits[node.index]
        now = time.monotonic()
        if now < wait["next"]:
            return
        if now - wait["since"] < WORKER_PORT_WAIT_S:
            self._restart_worker(dep, node, events)
            return
        del self._port_waits[node.index]
        old = node.address
        state = _state(node)
        state.served, state.port_picks = False, 0  # no client knows the new address: any free port will do
        self._start_worker(dep, node, port=self._pick_port(dep))
        self._wait_ready([node], dep)
        events("worker-moved",
               f"worker {node.index} restarted at {node.address}: its port at {old} was still taken by "
               f"{wait.get('holder', 'another process')} after {WORKER_PORT_WAIT_S:.0f} s. It serves the job from "
               f"the new address; tf.data service clients that were reading from {old} wait for what it had not "
               "sent them, so a job that reads a finite dataset to its end may stall there, while one bounded by "
               "steps or time goes on.")

    def stop_trainers(self, dep: Deployment) -> None:
        stop_groups(dep.by_role("trainer"), grace_s=5.0)

    def sample(self, dep: Deployment) -> list[Sample]:
        procs = [(n, n.pid) for n in dep.nodes if n.pid]
        # A user's command runs below its runner: its CPU and memory are the trainer's.
        trees = frozenset(pid for n, pid in procs if isinstance(n.state, LocalNode) and n.state.command)
        return self._sampler.sample([(n.role, n.index, pid) for n, pid in procs], trees)

    def down(self, dep: Deployment, events: EventSink) -> None:
        # Trainers first (they hang if their workers vanish), then workers, then the dispatcher.
        self._resolve(dep)
        for role in ("trainer", "worker", "dispatcher"):
            stop_groups(dep.by_role(role))
        # The launcher next, so it forks nothing more; then what it forked that the state file does not know (a
        # request answered while `dsctl up` was being killed).
        launcher = self._dep_state(dep).launcher
        if launcher is not None:
            stop_groups([launcher])
        stop_groups(Launcher(Path(dep.run_dir)).forked())
        # Last, the cgroup: what is still in it left its process group (a daemon a pipeline or a user's script
        # started), and is stopped with it.
        if not self._end_container(dep, events):
            return
        dep.status = "down"
        dep.save()
        events("down", "all processes stopped")

    def contents(self, dep: Deployment) -> Contents | None:
        """What the run's cgroup holds now (contract.Contains): the processes outside the sessions of its launcher,
        servers and trainers (each leads its own) are daemons they started, which only the cgroup still holds."""
        group = container_of(self._dep_state(dep))
        if group is None:
            return None
        launcher = self._dep_state(dep).launcher
        forked = Launcher(Path(dep.run_dir))
        for node in dep.nodes:  # forked, but `dsctl up` was killed before it wrote the pid down
            if node.pid is None and isinstance(node.state, LocalNode) and node.state.launch_id:
                forked.resolve(node)
        leaders = [n.pgid or n.pid for n in dep.nodes] + ([launcher.pgid or launcher.pid] if launcher else [])
        return containment.contents(group, {pid for pid in leaders if pid})

    def _end_container(self, dep: Deployment, events: EventSink) -> bool:
        """End the run's cgroup and everything still in it; False (the deployment stays listed, for `dsctl down`
        to try again) if the kernel did not end them in time."""
        group = container_of(self._dep_state(dep))
        if group is None:
            return True
        pids = [p.pid for p in self._procs.values()] + [n.pid for n in dep.nodes if n.pid]
        launcher = self._dep_state(dep).launcher
        if launcher is not None and launcher.pid:
            pids.append(launcher.pid)

        def reap_ours() -> None:
            for pid in pids:
                reap(pid)

        try:
            left = group.end(grace_s=containment.STRAY_GRACE_S, reap=reap_ours)
        except TimeoutError as exc:
            events("not-down", f"{exc}; `dsctl down {dep.run_id}` tries again")
            dep.save()
            return False
        except OSError as exc:
            events("not-down", f"the run's cgroup {group.path} could not be ended ({exc.strerror}); `dsctl down "
                               f"{dep.run_id}` tries again")
            dep.save()
            return False
        if left:
            events("strays-stopped", f"{len(left)} process(es) that the run's processes started outside their process "
                                     f"groups (daemons) were still running at teardown, and were stopped with the "
                                     f"run's cgroup: {'; '.join(left[:5])}{' …' if len(left) > 5 else ''}")
        return True
