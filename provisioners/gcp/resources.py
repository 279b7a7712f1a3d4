"""Create and delete one run's cloud resources, in parallel, and confirm deletion.

`create()` starts everything at once (the firewall rules, dispatcher VM, ONE bulk
insert for all workers, each trainer VM, each TPU VM's queued resource), waits for
every operation and raises the most telling classified error if any failed.
`wait_running()` polls one list call (per 500 VMs) until every VM is RUNNING;
TPU VMs, which take minutes, are waited for one by one (`wait_tpu`, with their own
timeout). `delete()` deletes in parallel threads and returns only what it has seen
gone, so the caller's state never forgets a resource that may still bill. `sweep()`
deletes whatever carries the run's label (and the run's firewall rules and queued
resources, by name), which is how a run is removed with no local state.

The caller cleans up after a failed `create()`; nothing here leaves threads
creating things behind it: on cancel, inserts in flight finish first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from ..state import Role
from . import compute, firewall, operations, tpu
from .clients import Clients
from .errors import CloudTimeout, GcpError, QuotaExceeded, RemoteError, ZoneExhausted, describe, from_api_error
from .machinetypes import VmKind
from .naming import firewall_names, prefix, run_filter
from .retry import Cancelled

DELETE_TIMEOUT_S = 900.0
MAX_THREADS = 128


@dataclass
class Machine:
    """One VM to create: its node in the deployment and how to build it."""

    role: Role
    index: int
    name: str
    vm: compute.VmConfig
    kind: VmKind = "cpu"


@dataclass
class Found:
    """A run's resources as the API lists them."""

    instances: dict[str, str] = field(default_factory=dict)  # name -> status
    tpus: dict[str, str] = field(default_factory=dict)  # node id -> state
    firewalls: list[str] = field(default_factory=list)
    staged: list[str] = field(default_factory=list)  # the run's staging objects (found by `down_by_label`)

    @property
    def empty(self) -> bool:
        return not (self.instances or self.tpus or self.firewalls or self.staged)

    def summary(self) -> str:
        parts = []
        if self.instances:
            parts.append(describe(len(self.instances), "VM"))
        if self.tpus:
            parts.append(describe(len(self.tpus), "TPU VM"))
        if self.firewalls:
            parts.append(describe(len(self.firewalls), "firewall rule"))
        if self.staged:
            parts.append(describe(len(self.staged), "staging object"))
        return ", ".join(parts) or "nothing"


class _InFlight:
    """Counts insert calls in flight, so a cancelled create can wait for them before cleaning up."""

    def __init__(self) -> None:
        self.n = 0
        self.cond = threading.Condition()

    def __enter__(self):
        with self.cond:
            self.n += 1

    def __exit__(self, *exc):
        with self.cond:
            self.n -= 1
            self.cond.notify_all()

    def drain(self, timeout_s: float = 120.0) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.n == 0, timeout=timeout_s)


def _describe_machines(machines: list[Machine], role: str) -> str:
    of_role = [m for m in machines if m.role == role]
    if not of_role:
        return ""
    kind = "TPU VM" if of_role[0].kind == "tpu" else "VM"
    return describe(len(of_role), f"{of_role[0].vm.machine} {role} {kind}")


def _pick_error(errors: list[BaseException]) -> BaseException:
    """The error to report: quota or capacity first (they say what to change), then any other."""
    for kinds in ((QuotaExceeded, ZoneExhausted), (GcpError,), (Exception,)):
        for e in errors:
            if isinstance(e, kinds) and not isinstance(e, Cancelled):
                return e
    return errors[0]


class Fleet:
    def __init__(self, clients: Clients, run_id: str, cancel: threading.Event | None = None,
                 log: Callable[[str], None] | None = None, tpus: bool = True):
        """`tpus`: the run may have TPU VMs (False for a run whose state has none: its accounts may hold no TPU
        permission, and the project may not even have the Cloud TPU API on)."""
        self.clients = clients
        self.run_id = run_id
        self.cancel = cancel or threading.Event()
        self.log = log or (lambda msg: None)
        self.tpus = tpus
        self._inflight = _InFlight()

    @property
    def zone(self) -> str:
        return self.clients.settings.zone

    # -- create ------------------------------------------------------------------------------------------
    def _firewall(self, rule) -> None:
        with self._inflight:
            if self.cancel.is_set():
                raise Cancelled()
            op = firewall.insert(self.clients, rule, self.cancel)
        operations.wait_and_check(self.clients, op, resource="firewall rule", count=1,
                                  doing=f"creating firewall rule {rule.name}", timeout_s=300, cancel=self.cancel)

    def _instance(self, m: Machine) -> None:
        with self._inflight:
            if self.cancel.is_set():
                raise Cancelled()
            op = compute.insert(self.clients, m.name, m.vm, self.cancel)
        operations.wait_and_check(self.clients, op, resource=f"{m.vm.machine} {m.role} VM", count=1,
                                  doing=f"creating VM {m.name}", timeout_s=self.clients.settings.running_timeout_s,
                                  cancel=self.cancel)

    def _bulk(self, ms: list[Machine]) -> None:
        with self._inflight:
            if self.cancel.is_set():
                raise Cancelled()
            op = compute.bulk_insert(self.clients, [m.name for m in ms], ms[0].vm, self.cancel)
        operations.wait_and_check(self.clients, op, resource=f"{ms[0].vm.machine} {ms[0].role} VM", count=len(ms),
                                  doing=f"creating {len(ms)} {ms[0].role} VMs",
                                  timeout_s=self.clients.settings.running_timeout_s, cancel=self.cancel)

    def _tpu(self, m: Machine) -> None:
        """Ask for the TPU VM (a queued resource); `wait_tpu` waits for it to be READY."""
        with self._inflight:
            if self.cancel.is_set():
                raise Cancelled()
            node = tpu.node_body(self.clients, m.vm.machine.removeprefix("tpu-"), m.vm.image, m.vm.labels, m.vm.tag,
                                 m.vm.metadata, m.vm.service_account)
            tpu.create(self.clients, m.name, node, spot=m.vm.provisioning == "spot",
                       timeout_s=self.clients.settings.tpu_timeout_s, cancel=self.cancel)

    def _classified(self, fn: Callable, args: tuple) -> None:
        """Run one creation job; an API error raised by the call itself is classified like an operation's."""
        from google.api_core import exceptions as gx

        try:
            fn(*args)
        except gx.GoogleAPICallError as exc:
            if fn == self._firewall:
                raise from_api_error(exc, doing=f"creating firewall rule {args[0].name}") from exc
            ms = args[0] if isinstance(args[0], list) else [args[0]]
            kind = "TPU VM" if ms[0].kind == "tpu" else "VM"
            raise from_api_error(exc, doing=f"creating {describe(len(ms), f'{ms[0].role} {kind}')}",
                                 resource=f"{ms[0].vm.machine} {ms[0].role} {kind}", zone=self.zone,
                                 count=len(ms)) from exc

    def create(self, machines: list[Machine], rules: Sequence = ()) -> None:
        """Create the firewall rules and every machine, in parallel; raise the first real failure.

        Workers of one machine type go in ONE bulk insert; TPU trainers are TPU
        VMs (asked for here, READY later: `wait_tpu`); everything else is one insert per VM.
        """
        jobs: list[tuple[Callable, tuple]] = [(self._firewall, (rule,)) for rule in rules]
        workers = [m for m in machines if m.role == "worker"]
        by_type: dict[str, list[Machine]] = {}
        for m in workers:
            by_type.setdefault(m.vm.machine, []).append(m)
        for group in by_type.values():
            jobs.append((self._bulk, (group,)))
        for m in machines:
            if m.role != "worker":
                jobs.append((self._tpu if m.kind == "tpu" else self._instance, (m,)))
        summary = ", ".join(filter(None, (_describe_machines(machines, r) for r in ("dispatcher", "worker", "trainer"))))
        self.log(f"creating {summary} in {self.zone}")
        pool = ThreadPoolExecutor(max_workers=max(len(jobs), 1), thread_name_prefix="dsctl-create")
        futures = [pool.submit(self._classified, fn, args) for fn, args in jobs]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            errors = [f.exception() for f in done if f.exception() is not None]
            if errors:
                self.cancel.set()  # the others stop waiting; the caller deletes what was made
                wait(futures)
                raise _pick_error([e for e in (f.exception() for f in futures) if e is not None])
        except BaseException:
            self.cancel.set()
            self._inflight.drain()
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    # -- wait for RUNNING ------------------------------------------------------------------------------------
    def wait_tpu(self, m: Machine, on_running: Callable[[Machine, str | None, str | None], None]) -> None:
        """Wait (gcp.tpu_timeout_s) until the TPU VM is READY, then on_running(machine, internal, external)."""
        node = tpu.wait_ready(self.clients, m.name, m.vm.machine.removeprefix("tpu-"),
                              timeout_s=self.clients.settings.tpu_timeout_s, cancel=self.cancel)
        on_running(m, *tpu.addresses(node))

    def wait_running(self, machines: list[Machine], timeout_s: float,
                     on_running: Callable[[Machine, str | None, str | None], None]) -> None:
        """Poll until every (non-TPU) VM is RUNNING, calling on_running(machine, internal, external) once each."""
        s = self.clients.settings
        pending = {m.name: m for m in machines if m.kind != "tpu"}
        deadline = time.monotonic() + timeout_s
        delay = 0.3
        last: dict[str, str] = {}
        while pending:
            if self.cancel.is_set():
                raise Cancelled()
            for inst in compute.list_instances(self.clients, run_filter(self.run_id), self.cancel):
                m = pending.get(inst.name)
                if m is None:
                    continue
                last[m.name] = inst.status
                if inst.status == "RUNNING":
                    on_running(pending.pop(m.name), *compute.addresses(inst))
                elif inst.status in ("TERMINATED", "STOPPING", "STOPPED", "SUSPENDED"):
                    raise RemoteError(f"VM {m.name} ({m.vm.machine}, {m.role}) stopped while starting "
                                      f"(status {inst.status}); it may have been preempted or failed to boot.")
            if not pending:
                return
            if time.monotonic() > deadline:
                stuck = ", ".join(f"{n} ({last.get(n, 'not listed')})" for n in list(pending)[:8])
                more = f" and {len(pending) - 8} more" if len(pending) > 8 else ""
                raise CloudTimeout(
                    f"{describe(len(pending), 'VM')} did not reach RUNNING within {timeout_s:.0f} s in zone {s.zone}: "
                    f"{stuck}{more}. The zone may be short of capacity; try again, another zone (gcp.zone), or a "
                    "longer gcp.running_timeout_s."
                )
            time.sleep(min(delay, max(deadline - time.monotonic(), 0.05)))
            delay = min(delay * 1.5, 2.0)

    # -- delete ---------------------------------------------------------------------------------------------------
    def _listed_tpus(self) -> dict[str, str]:
        """The run's TPU VMs: nodes by label, and queued resources (which have no labels) by name. A run with none
        recorded is not asked about; a run found with no state is, and where TPU VMs cannot be listed (the Cloud TPU
        API off, or no permission to list them) that is said, and none are taken to be there."""
        from google.api_core import exceptions as gx

        if not self.tpus:
            return {}
        try:
            out = {tpu.short_id(n): n.state.name for n in tpu.list_nodes(self.clients, self.run_id)}
            for name in tpu.list_queued(self.clients, prefix(self.run_id)):
                out.setdefault(name, "QUEUED")
        except gx.Forbidden as exc:
            self.log(f"the project's TPU VMs could not be listed ({getattr(exc, 'message', exc)}); none of the run's "
                     "were looked for")
            return {}
        return out

    def find(self) -> Found:
        """Everything that carries the run's label (and the run's firewall rules and queued TPU resources)."""
        found = Found()
        for inst in compute.list_instances(self.clients, run_filter(self.run_id)):
            found.instances[inst.name] = inst.status
        found.tpus = self._listed_tpus()
        if not self.clients.settings.standing_rules:  # else the run made none (network.py)
            found.firewalls = [name for name in firewall_names(self.run_id) if firewall.exists(self.clients, name)]
        return found

    def _delete_instance(self, name: str) -> None:
        op = compute.delete(self.clients, name)
        if op is not None:
            operations.wait(self.clients, op, doing=f"deleting VM {name}", timeout_s=DELETE_TIMEOUT_S)

    def _delete_tpu(self, name: str) -> None:
        try:
            tpu.delete(self.clients, name, timeout_s=DELETE_TIMEOUT_S)
        except GcpError:
            raise
        except Exception as exc:  # confirmed by listing below either way
            self.log(f"deleting TPU VM {name}: {exc}")

    def _delete_firewall(self, name: str) -> None:
        op = firewall.delete(self.clients, name)
        if op is not None:
            operations.wait(self.clients, op, doing=f"deleting firewall rule {name}", timeout_s=300)

    def delete(self, instances: list[str], tpus: list[str], firewalls: list[str],
               on_gone: Callable[[str], None] | None = None, timeout_s: float = DELETE_TIMEOUT_S) -> None:
        """Delete in parallel; call on_gone(name) for each resource once the API no longer lists it.

        Raises GcpError naming what is still there after timeout_s (the caller keeps it in its state).
        """
        on_gone = on_gone or (lambda name: None)
        jobs = ([(self._delete_instance, n) for n in instances] + [(self._delete_tpu, n) for n in tpus]
                + [(self._delete_firewall, n) for n in firewalls])
        if not jobs:
            return
        errors: dict[str, str] = {}
        with ThreadPoolExecutor(max_workers=min(len(jobs), MAX_THREADS), thread_name_prefix="dsctl-delete") as pool:
            futures = {pool.submit(fn, name): name for fn, name in jobs}
            for fut, name in futures.items():
                exc = fut.exception()
                if exc is not None:
                    errors[name] = f"{name}: {exc}"
        # Confirm: only what the API no longer lists is forgotten. What could not even be deleted is not waited for.
        want_i, want_t, want_f = (set(instances) - set(errors), set(tpus) - set(errors), set(firewalls) - set(errors))
        deadline = time.monotonic() + timeout_s
        delay = 0.2
        while True:
            listed_i = {i.name for i in compute.list_instances(self.clients, run_filter(self.run_id))} if want_i else set()
            listed_t = set(self._listed_tpus()) if want_t else set()
            listed_f = {n for n in want_f if firewall.exists(self.clients, n)}
            for name in (want_i - listed_i) | (want_t - listed_t) | (want_f - listed_f):
                on_gone(name)
            want_i &= listed_i
            want_t &= listed_t
            want_f &= listed_f
            if not (want_i or want_t or want_f) and not errors:
                return
            if not (want_i or want_t or want_f) or time.monotonic() > deadline:
                left = sorted(want_i | want_t | want_f | set(errors))
                raise GcpError(
                    f"{describe(len(left), 'resource')} of run {self.run_id} could not be deleted or still exist: "
                    f"{', '.join(left[:10])}{' ...' if len(left) > 10 else ''}. "
                    + (f"Errors: {'; '.join(list(errors.values())[:3])}. " if errors else "")
                    + f"Run `dsctl down {self.run_id}` again, or delete them in the console (label dsctl-run={self.run_id})."
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)

    def sweep(self, on_gone: Callable[[str], None] | None = None, keep: AbstractSet[str] = frozenset()) -> Found:
        """Delete everything found by the run's label and firewall name (but the VMs named in `keep`);
        returns what was found."""
        try:
            found = self.find()
        except GcpError:
            raise
        except Exception as exc:
            from google.api_core import exceptions as gx

            if isinstance(exc, gx.GoogleAPICallError):
                raise from_api_error(exc, doing=f"looking for the resources of run {self.run_id}") from exc
            raise
        for name in keep:
            found.instances.pop(name, None)
        if not found.empty:
            self.log(f"deleting {found.summary()} of run {self.run_id}")
            self.delete(list(found.instances), list(found.tpus), found.firewalls, on_gone)
        return found
