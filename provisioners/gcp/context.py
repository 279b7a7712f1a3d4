"""One deployment on Google Cloud as every step of the provider works on it, built once.

On the way up it is made from the spec's settings (resolved by `check`) and records the deployment's
state before anything is created (the run's SSH key is made where this process reaches VMs: sign_in);
on the way down, or in another process (`dsctl down` after kill -9, the run's supervisor on its
dispatcher VM), it is made from the deployment's state with this process's endpoints. Either way what it holds is fixed from then
on: the settings, the API clients made with them, the run's SSH key (none: a run that never reached a
VM from here), the run's cancel event, and the lock under which threads change nodes and save the state. The
SSH connections wait for the key's OS Login registration (`sign_in`, which names the user to
connect as), the watcher for the first process to watch.
"""

from __future__ import annotations

import threading
import time

from ..contract import EventSink
from ..state import Deployment
from . import oslogin
from .clients import Clients
from .errors import GcpError
from .keys import KeyPair, ensure_key_pair, key_dir, load_key_pair
from .resources import Fleet
from .settings import GcpSettings, check_credentials
from .ssh import Ssh
from .state import GcpDeployment, GcpNode, of
from .watch import Watcher


class Context:
    def __init__(self, dep: Deployment, clients: Clients, key: KeyPair | None, ssh: Ssh | None = None):
        """`ssh`: connections already made (a test's SSH that fails); otherwise made from `key` when first used."""
        self.dep = dep
        self.clients = clients
        self.settings: GcpSettings = clients.settings
        self._key = key
        self._ssh = ssh
        self.cancel = threading.Event()  # set: whatever still waits on the way up stops (a failure, Ctrl-C, down)
        self.lock = threading.Lock()  # threads change nodes and save the whole state: one at a time
        self.watcher: Watcher | None = None  # reads the processes over SSH once the first one runs (watch.py)

    @property
    def has_ssh(self) -> bool:
        """False for a run without its SSH key here (it never reached a VM from here): nothing of it is reached."""
        return self._key is not None or self._ssh is not None

    @property
    def ssh(self) -> Ssh:
        """The run's SSH connections, for the steps that reach its VMs (every run that made one has its key), as
        the user OS Login gave the key's identity."""
        if self._ssh is not None:
            return self._ssh
        if self._key is None:
            raise GcpError(f"run {self.dep.run_id} has no SSH key in {key_dir(self.dep.run_dir)}, so its VMs cannot "
                           "be reached.")
        self._ssh = Ssh(self.state.ssh_user, self.settings.ssh_port, self._key.private_path,
                        key_dir(self.dep.run_dir) / "known_hosts")
        return self._ssh

    def sign_in(self, lifetime_s: float) -> None:
        """Register this machine's key for the run with OS Login for this process's identity, unless it already is
        (valid for `lifetime_s` more); SSH connects as the user OS Login names from then on."""
        login = self.state.login
        if login is not None and login.account == self.clients.caller() and login.expires_at > time.time() + 60:
            return
        if self._key is None:
            self._key = ensure_key_pair(self.dep.run_dir, comment=f"dsctl-{self.dep.run_id}")
        self.state.login = oslogin.register(self.clients, self._key, lifetime_s)
        self.save()
        if self._ssh is not None:
            self._ssh.close()
            self._ssh = None

    def sign_out(self) -> None:
        """Delete the run's key from OS Login (the run's VMs are gone); it would expire on its own."""
        login = self.state.login
        if login is not None and login.account == self.clients.caller():
            oslogin.unregister(self.clients, login)

    @property
    def state(self) -> GcpDeployment:
        return of(self.dep)

    def save(self) -> None:
        with self.lock:
            self.dep.save()

    def fleet(self, events: EventSink, *, cancellable: bool = True) -> Fleet:
        """The run's resources through the APIs; a deletion is not cancellable (it must finish)."""
        tpus = any(vm.kind == "tpu" for vm in self.state.trainer_vms.values()) or any(
            isinstance(n.state, GcpNode) and n.state.vm.kind == "tpu" for n in self.dep.nodes)
        return Fleet(self.clients, self.dep.run_id, self.cancel if cancellable else None,
                     log=lambda msg: events("cloud", msg), tpus=tpus)

    def watching(self) -> Watcher:
        """The watcher, running."""
        if self.watcher is None:
            self.watcher = Watcher(self.ssh)
        self.watcher.start()
        return self.watcher


def for_run(dep: Deployment, clients: Clients) -> Context:
    """On the way up: the deployment's state recorded (before anything is created, so `dsctl down` knows where to
    look). The run's SSH key is made by `sign_in`, where this process is to reach the VMs: a run handed over to its
    dispatcher VM has none on the user's machine."""
    if dep.state is None:
        dep.state = GcpDeployment(settings=clients.settings)
        dep.save()
    return Context(dep, clients, None)


def from_state(dep: Deployment) -> Context:
    """On the way down, or in another process: the project and zone the run was made in, this environment's
    endpoints and credentials, and the run's key if it has one."""
    if dep.state is None:
        raise GcpError(f"run {dep.run_id} has no Google Cloud settings in its state; nothing to do.")
    settings = of(dep).settings.with_env_endpoints()
    check_credentials(settings)
    return Context(dep, Clients(settings), load_key_pair(dep.run_dir))
