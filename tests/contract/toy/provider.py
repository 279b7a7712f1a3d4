"""A toy provider: the contract kept by plain processes, with nothing of dsctl's own providers.

It exists to show that a new provider is a folder: its state classes, its codec, its class registered by name, what
its runs create and cost (its own machine types, priced from its own catalog, toy-prices.yaml, with its own extras:
a scratch volume per server, a lease per run), its plan, and its registration as a plugin's (place.py, and the entry
point of its dist-info). The contract suite (tests/contract/suite.py) and `dsctl up`, `status`, `down`, `cost report`
and `up --dry-run` run on it without a change anywhere else. Each server and trainer is `python -m <dsctl runtime
module>` in a session of its own; no launcher, no network isolation (its ports listen on loopback only, as a toy
may), no restart policy of its own (the orchestrator's supervisor decides; `restart` only starts the process again
at its port).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsctl.costmodel import Charge, Extra, load_catalog
from dsctl.provisioners import (
    Bill,
    Billed,
    Deployment,
    EventSink,
    MachineGroup,
    Node,
    Poll,
    ServerExit,
    TrainerLaunch,
    TrainerState,
    register,
)
from dsctl.provisioners.plan import ask_first, price_plan
from dsctl.provisioners.processes import is_ours, reap, stop_groups
from dsctl.provisioners.state import DeploymentState, NodeState, from_dict
from dsctl.runtime.readiness import pick_service_port, read_json
from dsctl.runtime.sampler import ProcessSampler, Sample


@dataclass
class ToyNode(NodeState):
    port: int | None = None
    ready_file: str | None = None
    argv: tuple[str, ...] = ()  # how to start it again
    exit_code: int | None = None  # reaped by this process


@dataclass
class ToyDeployment(DeploymentState):
    started: float = 0.0


class ToyCodec:
    def node_state(self, data: dict) -> ToyNode:
        return from_dict(ToyNode, {**data, "argv": tuple(data.get("argv") or ())})

    def deployment_state(self, data: dict) -> ToyDeployment:
        return from_dict(ToyDeployment, data)

    def from_legacy(self, data: dict) -> dict:
        return data  # the toy never wrote an older format


VOLUME_GB = 10  # each server process's scratch volume


def _bill(machines: tuple[MachineGroup, ...], volume_gb: int) -> Bill:
    """Its machines, a scratch volume per server (billed while it exists), and the run's lease (by the hour)."""
    servers = sum(g.count for g in machines if g.role != "trainers")
    volumes = tuple(Charge("scratch-volumes", "standard", g.count, per_machine=volume_gb, role=g.role,
                           price_unit="per_gb_month", what="scratch volumes", source_label="toy scratch volume")
                    for g in machines if g.role != "trainers")
    extras = (Extra("scratch_volumes", "scratch_volume_cost", "scratch volumes", f"{servers} x {volume_gb} GB", servers,
                    volumes),
              Extra("lease", "lease_cost", "lease", "1 lease", 1,
                    (Charge("leases", "run", 1, what="a run's lease", source_label="toy lease"),)))
    kept = {"volume_gb": volume_gb, "machines": [vars(g) for g in machines]}
    return Bill(machines=machines, extras=extras, kept=kept)


@register
class ToyProvider:
    name = "toy"
    codec = ToyCodec()
    runs_here = True  # its processes run here
    stands_in_for = None  # but its machines are its own, priced from its own catalog

    # -- what a run creates and costs; the plan before it -----------------------------------------------------------
    def bill(self, spec, workers: int, trainers: int) -> Bill:
        svc = spec.service
        machines = ((MachineGroup("dispatcher", svc.dispatcher_machine, 1, svc.provisioning, "process"),
                     MachineGroup("workers", svc.worker_machine, workers, svc.provisioning, "process"))
                    if workers else ())
        machines += (MachineGroup("trainers", spec.trainer.machine, trainers, spec.trainer.provisioning, "process"),)
        return _bill(machines, VOLUME_GB)

    def billed(self, kept: dict[str, Any] | None, spec_json: str, workers: int, trainers: int) -> Billed:
        if not kept:
            return Billed(None, "not recorded: the toy keeps what every run created")
        return Billed(_bill(tuple(MachineGroup(**g) for g in kept["machines"]), kept["volume_gb"]), "recorded")

    def plan_text(self, spec, workers: int | None, *, pipeline_rate=None) -> str:
        n = spec.service.workers if workers is None else workers
        return price_plan(self.bill(spec, n, spec.trainer.count), spec, load_catalog(spec.pricing),
                          where="on the toy provider (processes on this machine)", workers=n,
                          pipeline_rate=pipeline_rate).render()

    def confirm(self, spec, workers: int | None, *, yes: bool, ask: Callable[[str], bool],
                echo: Callable[[str], None], pipeline_rate=None) -> bool:
        if yes:
            return True
        n = spec.service.workers if workers is None else workers
        shown = price_plan(self.bill(spec, n, spec.trainer.count), spec, load_catalog(spec.pricing),
                           where="on the toy provider (processes on this machine)", workers=n, pipeline_rate=pipeline_rate)
        return ask_first(shown, ask=ask, echo=echo, question="Start these toy machines?",
                         refusal="provider: toy bills (in toy dollars); pass --yes to start it without asking.")

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen] = {}
        self._sampler = ProcessSampler()

    def _start(self, dep: Deployment, node: Node, module: str, args: list[str]) -> None:
        log = Path(dep.run_dir) / "logs" / f"{node.role}-{node.index}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self._procs[proc.pid] = proc
        import psutil

        node.pid = node.pgid = proc.pid
        node.create_time = psutil.Process(proc.pid).create_time()
        node.log = str(log)
        dep.save()

    def _server(self, dep: Deployment, role: str, index: int) -> Node:
        port = pick_service_port(exclude={n.state.port for n in dep.nodes if n.state and n.state.port})
        ready = str(Path(dep.run_dir) / "ready" / f"{role}-{index}.json")
        Path(ready).parent.mkdir(parents=True, exist_ok=True)
        if role == "dispatcher":
            argv = ("dsctl.runtime.dispatcher", "--port", str(port), "--ready-file", ready, "--fault-tolerant",
                    "--work-dir", str(Path(dep.run_dir) / "journal"))
        else:
            argv = ("dsctl.runtime.worker", "--dispatcher", dep.dispatcher_address, "--host", "127.0.0.1",
                    "--port", str(port), "--ready-file", ready)
        node = Node(role=role, index=index, address=f"127.0.0.1:{port}", state=ToyNode(port, ready, argv))
        dep.nodes.append(node)
        self._start(dep, node, argv[0], list(argv[1:]))
        return node

    def check(self, spec, workers: int, base_dir: Path) -> None:
        pass

    def up(self, spec, dep: Deployment, workers: int, events: EventSink) -> None:
        dep.state = ToyDeployment(started=time.time())
        dispatcher = self._server(dep, "dispatcher", 0)
        dep.dispatcher_address = dispatcher.address
        for i in range(workers):
            self._server(dep, "worker", i)
        events("starting", f"dispatcher and {workers} worker(s) starting")

    def _wait(self, dep: Deployment, nodes: list[Node]) -> None:
        deadline = time.monotonic() + 120
        for node in nodes:
            while not ((r := read_json(node.state.ready_file)) and r.get("pid") == node.pid):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{node.role} {node.index} not ready")
                time.sleep(0.1)

    def wait_ready(self, dep: Deployment, events: EventSink) -> None:
        self._wait(dep, dep.by_role("dispatcher") + dep.by_role("worker"))
        dep.status = "up"
        dep.save()

    def scale_workers(self, dep: Deployment, workers: int, events: EventSink) -> None:
        current = dep.by_role("worker")
        if workers > len(current):
            self._wait(dep, [self._server(dep, "worker", i) for i in range(len(current), workers)])
        else:
            leaving = current[workers:]
            stop_groups(leaving)
            dep.nodes = [n for n in dep.nodes if n not in leaving]
        dep.save()

    def start_trainers(self, dep: Deployment, launch: TrainerLaunch, events: EventSink) -> None:
        launch.metrics_dir.mkdir(parents=True, exist_ok=True)
        for i in range(launch.count):
            node = Node(role="trainer", index=i, metrics=str(launch.metrics_dir / f"trainer-{i}.jsonl"), state=ToyNode())
            dep.nodes.append(node)
            args = launch.harness_args(i, spec=str(launch.spec_json), metrics=node.metrics,
                                       cache_dir=str(launch.cache_dir), base_dir=str(launch.base_dir),
                                       dispatcher=dep.dispatcher_address)
            self._start(dep, node, launch.module, args)

    def _code(self, node: Node) -> int | None:
        proc = self._procs.get(node.pid)
        if proc is not None:
            return proc.poll()
        return None if is_ours(node) else reap(node.pid) or -1

    def poll(self, dep: Deployment, events: EventSink) -> Poll:
        exited = [ServerExit(n, code) for n in dep.by_role("dispatcher") + dep.by_role("worker")
                  if (code := self._code(n)) is not None]
        trainers = {n.index: self._code(n) for n in dep.by_role("trainer")}
        return Poll(TrainerState(running=[i for i, c in trainers.items() if c is None],
                                 exit_codes={i: c for i, c in trainers.items() if c is not None}), exited)

    def restart(self, dep: Deployment, node: Node, events: EventSink) -> None:
        Path(node.state.ready_file).unlink(missing_ok=True)
        self._start(dep, node, node.state.argv[0], list(node.state.argv[1:]))
        self._wait(dep, [node])

    def log_tail(self, dep: Deployment, node: Node) -> str:
        return "\n".join(Path(node.log).read_text().splitlines()[-12:]) if node.log else ""

    def sample(self, dep: Deployment) -> list[Sample]:
        return self._sampler.sample([(n.role, n.index, n.pid) for n in dep.nodes if n.pid])

    def stop_trainers(self, dep: Deployment) -> None:
        stop_groups(dep.by_role("trainer"), grace_s=5.0)
        dep.nodes = [n for n in dep.nodes if n.role != "trainer"]
        dep.save()

    def down(self, dep: Deployment, events: EventSink) -> None:
        for role in ("trainer", "worker", "dispatcher"):
            stop_groups(dep.by_role(role))
        dep.status = "down"
        dep.save()


def kill(node: Node) -> None:
    os.kill(node.pid, signal.SIGKILL)
