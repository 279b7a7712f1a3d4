"""The provider contract: what every place to run implements, and what only some can do.

A provider is a folder (provisioners/local, provisioners/gcp, ...) whose class implements
`Provider` and registers itself by name (registry.py). The orchestrator drives every provider
the same way, for one measurement of one job:

    check -> up -> wait_ready -> start_trainers -> poll/sample (repeatedly) -> stop_trainers -> down
                                 scale_workers at any time after wait_ready; restart when told to

A provider does things and reports what it sees; it decides nothing that is the same everywhere.
Whether an exited server or a lost machine is restarted, how often, which losses end the run, how
long an outage may last and what the run's record says about each is the orchestrator's
(orchestrator/supervision.py): `poll` reports, typed (`Poll`: servers whose process ended, machines
found stopped or gone, restarts of machines that finished, an outage), and `restart` carries a
restart out. Everything a provider creates is recorded in the deployment (state.py) before it is
created, so `down` in a new process removes it.

Every provider also declares what a run creates that bills (`bill`: its machines by role, and every other thing
that bills, its extras: addresses, disks, ...), which the cost model prices from the spec's catalog (by default
the provider's own, specs/places.py); and reads back what a recorded run created (`billed`). Nothing above the
providers knows what a place bills for.

What only some places can do is an optional capability: a protocol below that the provider's
class also implements. The orchestrator asks `isinstance(provider, HandsOff)`, never a provider's
name:
- HandsOff: the run's supervision moves onto a machine of the run, which outlives the user's.
- Plans: creating the machines costs money: a plan with prices first, and a question.
- FindsByLabel: a run's resources can be found and removed with no local state at all.
- Capacity: the place holds a bounded number of workers (this machine's memory).
- Contains: every process of a deployment is in a container the kernel tracks (a cgroup): what it holds can be
  counted, daemons its processes started included (`dsctl status`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from dsctl.costmodel.extras import Extra
from dsctl.costmodel.hybrid import PipelineRate
from dsctl.runtime.sampler import Sample
from dsctl.specs import SpecError
from dsctl.specs.schema import Accelerator, JobSpec, Mode

from .state import Deployment, Node, StateCodec

EventSink = Callable[[str, str], None]  # (kind, message), e.g. ("worker-restarted", "worker 1 ...")


@dataclass
class TrainerLaunch:
    """What to run on the trainer machines for one measurement."""

    mode: Mode
    spec_json: Path
    metrics_dir: Path
    base_dir: Path
    cache_dir: Path
    count: int
    steps: int | None = None
    duration_s: float | None = None
    record_ids: bool = False
    repeat: bool = False  # repeat a finite pipeline: steady-state measurements must not run out of data
    window_s: float | None = None  # metrics window override (sweeps align measurements to short windows)
    record_steps: bool = False  # per-batch timings and token counts, for modelling synchronous training
    cpus: list[int] | None = None  # pin trainer processes to these cores (local provider)
    accelerator: Accelerator = "none"  # what the trainer machine has, for the keras model's strategy
    accelerators: int = 0  # how many (GPUs, TPU devices) per trainer machine
    # The run's checkpoint folder, and the one of the run it resumes (a local path or gs://);
    # each trainer is given its own folder below them (trainer_checkpoint_dir).
    checkpoint_dir: str | None = None  # save checkpoints below here
    restore_from: str | None = None  # restore each trainer's latest checkpoint from below here first
    command: bool = False  # the trainers run the spec's trainer.command (runtime/command.py), not dsctl's harness

    @property
    def module(self) -> str:
        """What each trainer runs: `python -m <module> <harness_args>`."""
        return "dsctl.runtime.command" if self.command else "dsctl.runtime.trainer"

    @staticmethod
    def trainer_checkpoint_dir(base: str, index: int) -> str:
        """Trainer `index`'s own folder below a run's checkpoint folder: trainers never share checkpoints."""
        return f"{base.rstrip('/')}/trainer-{index}"

    def harness_args(self, index: int, *, spec: str, metrics: str, cache_dir: str, base_dir: str,
                     dispatcher: str | None) -> list[str]:
        """`python -m <module>` arguments (runtime/trainer_args.py), with paths as the trainer's machine sees them."""
        args = ["--spec", spec, "--mode", self.mode, "--index", str(index), "--metrics", metrics,
                "--cache-dir", cache_dir, "--base-dir", base_dir]
        if self.mode == "service":
            args += ["--dispatcher", str(dispatcher)]
        if self.steps is not None:
            args += ["--steps", str(self.steps)]
        if self.duration_s is not None:
            args += ["--duration-s", str(self.duration_s)]
        if self.repeat:
            args.append("--repeat")
        if self.window_s:
            args += ["--window-s", str(self.window_s)]
        if self.accelerator != "none":
            args += ["--accelerator", self.accelerator, "--accelerators", str(self.accelerators)]
        if self.checkpoint_dir:
            args += ["--checkpoint-dir", self.trainer_checkpoint_dir(self.checkpoint_dir, index)]
        if self.restore_from:
            args += ["--restore-from", self.trainer_checkpoint_dir(self.restore_from, index)]
        return args


@dataclass
class TrainerState:
    """The trainers as the orchestrator sees them after a poll."""

    running: list[int]
    exit_codes: dict[int, int]
    # index -> how its process ended, in words (dsctl.specs.exits: an out-of-memory kill named with its evidence),
    # where the provider can tell; the orchestrator words the bare exit code of any other
    endings: dict[int, str] = field(default_factory=dict)
    blind: bool = False  # the trainers cannot be seen right now (an outage): no progress is not a stall
    # role -> machine-seconds its machines spent stopped so far; the supervisor fills it in from MachineBack reports
    # (a provider leaves it empty)
    stopped_s: dict[str, float] = field(default_factory=dict)


@dataclass
class ServerExit:
    """A dispatcher or worker whose process has ended; the supervisor decides whether it is restarted. `why`: how it
    ended, where the provider ended it itself (a hung server, killed: it stopped answering)."""

    node: Node
    code: int
    why: str | None = None


@dataclass
class MachineLost:
    """A node's machine found not running: stopped (`status` as the place lists it: TERMINATED, PREEMPTED, ...; a Spot
    preemption, host maintenance or a stop) or gone (`status` None: deleted outside dsctl). Its process ended with it.
    Reported on every poll until the supervisor has the node restarted (the provider starts its machine again, in the
    background, and reports a MachineBack when it is done) or ends the run."""

    node: Node
    machine: str  # the machine as a message names it: "VM dsctl-r-worker-1"
    status: str | None
    gone_how: str = ""  # (status None) how it can have gone, in the place's words


@dataclass
class MachineBack:
    """A restart of a node whose machine was lost has finished: its machine ran again `stopped_s` after it was found
    stopped, and its process was started again `relaunch_s` after that; or, with `error`, it could not be."""

    node: Node
    machine: str
    stopped_s: float = 0.0
    relaunch_s: float = 0.0
    error: str | None = None


@dataclass
class Outage:
    """Machines that run, as far as the place knows, but cannot be reached (a laptop offline, a dropped VPN): their
    processes go on but cannot be seen, and nothing is judged of them while it lasts. How long one may last is the
    spec's (`limit_field`); the supervisor records it and ends the run past it."""

    since: float  # time.monotonic() when the first of them stopped answering
    machines: list[str]  # one name each: "vm-worker-1"
    limit_s: float
    limit_field: str  # the spec field that sets limit_s: "gcp.outage_limit_s"
    noun: str = "machine"  # what the machines are called: "VM"
    channel: str = "its connection"  # how they are reached: "SSH"
    listed: str = ""  # what the place itself says of them: "Compute Engine lists them as RUNNING"


@dataclass
class Poll:
    """What a provider saw in one look at a running deployment."""

    trainers: TrainerState
    exited: list[ServerExit] = field(default_factory=list)
    lost: list[MachineLost] = field(default_factory=list)
    back: list[MachineBack] = field(default_factory=list)
    outage: Outage | None = None


BillRole = Literal["dispatcher", "workers", "trainers"]


@dataclass(frozen=True)
class MachineGroup:
    """The machines of one role a run creates: how many, of which machine type, bought how, and what the place
    calls them (a plan's line)."""

    role: BillRole
    machine: str
    count: int
    provisioning: Literal["standard", "spot"]
    kind: str = "VM"  # "VM", "TPU VM", "GPU VM", "process"


@dataclass(frozen=True)
class Bill:
    """What a run creates that bills, as its provider declares it: its machines, everything else that bills (extras,
    which Equation 1 leaves out: priced beside its total), and `kept`, the provider's own record of it, kept with the
    run's record when it ends and read back by the provider's `billed` (typed there; plain JSON here)."""

    machines: tuple[MachineGroup, ...]
    extras: tuple[Extra, ...] = ()
    kept: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Billed:
    """What a recorded run created, as its provider reads it back, and how that is known (`how`, said beside its
    price: "recorded", "from the run's spec", "as for a gcp run of this spec", or "not recorded: <why>" with no
    bill)."""

    bill: Bill | None
    how: str


class Provider(Protocol):
    """Every place to run implements this; see the module docstring for the order of calls."""

    name: ClassVar[str]
    codec: ClassVar[StateCodec]  # reads its own state back from a state file (state.py)
    # Its processes run on this machine, the one dsctl runs on: a spec's program is looked for here, and a trainer
    # may be `local` (this machine itself, unpriced).
    runs_here: ClassVar[bool]
    # None: its machines are its own, priced as it bills them. A provider's name: its processes stand for the machines
    # the spec names, as that place would create them, and are priced (and said to be) as a run there.
    stands_in_for: ClassVar[str | None]

    def bill(self, spec: JobSpec, workers: int, trainers: int) -> Bill:
        """What a run of `spec` with `workers` workers (0: colocated, no service) and `trainers` trainers creates
        that bills; needs nothing but the spec (a plan, a run's end, an estimate)."""

    def billed(self, kept: dict[str, Any] | None, spec_json: str, workers: int, trainers: int) -> Billed:
        """What a recorded run created: from `kept` (a Bill's kept, recorded when it ended), or for a record
        without it, from its spec where that can be told (spec_json: the spec as recorded)."""

    def check(self, spec: JobSpec, workers: int, base_dir: Path) -> None:
        """Refuse (SpecError) what this place cannot run, before anything is created."""

    def up(self, spec: JobSpec, dep: Deployment, workers: int, events: EventSink) -> None:
        """Create the machines and start the dispatcher and `workers` workers (dispatcher_address is known after)."""

    def wait_ready(self, dep: Deployment, events: EventSink) -> None:
        """Return when the dispatcher and every worker serve."""

    def scale_workers(self, dep: Deployment, workers: int, events: EventSink) -> None:
        """Add workers (and wait until they serve) or remove the highest-numbered ones."""

    def start_trainers(self, dep: Deployment, launch: TrainerLaunch, events: EventSink) -> None:
        """Start `launch.count` trainers; each trainer node's `metrics` says where its metrics reach this machine."""

    def poll(self, dep: Deployment, events: EventSink) -> Poll:
        """One look: the trainers' state, the servers whose process has ended (reported once each), and, where
        machines can be lost or out of reach, what became of them (Poll)."""

    def restart(self, dep: Deployment, node: Node, events: EventSink) -> None:
        """Start an exited dispatcher (from its journal) or worker again at its own address; a node reported in
        MachineLost: start its machine again first (it may take minutes: in the background, reported as MachineBack)."""

    def log_tail(self, dep: Deployment, node: Node) -> str:
        """The last lines of the node's log, for an error message."""

    def sample(self, dep: Deployment) -> list[Sample]:
        """CPU and resident memory of every process of the deployment since the last sample."""

    def stop_trainers(self, dep: Deployment) -> None:
        """Stop the trainers (a sweep measures again on the same deployment)."""

    def down(self, dep: Deployment, events: EventSink) -> None:
        """Remove everything the deployment holds; safe to call twice and from a new process."""


class RunObjects(Protocol):
    """Where a run supervised on the cloud publishes its record (orchestrator/cloudrecord.py)."""

    def put(self, name: str, data: bytes) -> None: ...

    def get(self, name: str) -> bytes | None: ...

    def names(self, prefix: str = "") -> list[str]: ...


@dataclass(frozen=True)
class HandOffLimits:
    """How long a run supervised on the cloud may last, may go without hearing from an attached follower, and may
    take from its hand-over to its first batch (its supervisor starts the servers: machines boot, install); and the
    spec fields that set the first two, which every message about them names."""

    max_duration_s: float
    outage_limit_s: float
    first_batch_s: float = 300.0
    max_duration_field: str = "max_duration_s"  # e.g. gcp.max_duration_s
    outage_limit_field: str = "outage_limit_s"  # e.g. gcp.outage_limit_s


@runtime_checkable
class HandsOff(Protocol):
    """The run's supervision moves onto one of its machines (orchestrator/supervise.py), so the job outlives the
    user's machine and following it costs that machine the same whatever the worker count."""

    def hands_off(self, spec: JobSpec, mode: str) -> bool:
        """Whether this run is to be supervised on the cloud (the spec may ask to supervise it from here)."""

    def limits(self, spec: JobSpec) -> HandOffLimits: ...

    def detaching(self, spec: JobSpec) -> SpecError | None:
        """Why `dsctl up --detach` of this spec cannot hand the run off (e.g. the spec asks to supervise it from
        here), or None."""

    def prepare_hand_off(self, spec: JobSpec) -> None:
        """Before `up`: what the machines of a run supervised on the cloud need (e.g. their own time limit). From
        then on `up` only creates the machines; the supervisor starts the servers there (launch_servers)."""

    def hand_off(self, dep: Deployment, files: dict[str, bytes], base_dir: Path, events: EventSink) -> None:
        """Have the run's supervisor start on a machine of the run with `files` in its run dir, without connecting
        to any machine from here; return once it has started."""

    def handed_off(self, dep: Deployment) -> bool:
        """Whether this deployment's run is supervised on the cloud now."""

    def run_objects(self, dep: Deployment) -> RunObjects: ...

    def supervisor_status(self, dep: Deployment) -> str:
        """'running', 'exited (code N)', or why it is not known."""

    def adopt(self, dep: Deployment, spec: JobSpec) -> None:
        """On the supervising machine: take over a deployment handed over from the user's machine."""

    def launch_servers(self, dep: Deployment, events: EventSink) -> None:
        """On the supervising machine, after adopt: start the servers `up` created the machines for (the
        orchestrator then waits for them with wait_ready)."""

    def check_supervisor(self, dep: Deployment, spec: JobSpec, events: EventSink | None = None) -> None:
        """On the supervising machine, before anything: may it do what a supervisor does? (raises if not; what it
        waits for meanwhile goes to `events`)"""

    def delete_self(self, dep: Deployment) -> None:
        """The supervisor's last act, once the record is published: remove the machine it runs on."""


@runtime_checkable
class Plans(Protocol):
    """Creating this provider's machines costs money: `dsctl up --dry-run` shows the plan, `up` asks first."""

    def plan_text(self, spec: JobSpec, workers: int | None, *, pipeline_rate: PipelineRate | None = None) -> str:
        """The plan (machines, zone, prices, estimated cost), created nothing; needs no credentials. `rate`: a profile
        of the pipeline, from which a hybrid placement's plan predicts the remote workers it saves."""

    def confirm(self, spec: JobSpec, workers: int | None, *, yes: bool, ask: Callable[[str], bool],
                echo: Callable[[str], None], pipeline_rate: PipelineRate | None = None) -> bool:
        """Check what can be checked, show the plan and ask; True to go ahead. SpecError where nobody can answer."""


LocateUse = Literal["down", "record", "check"]  # finding a run's resources, its published record, a place to check


@dataclass(frozen=True)
class LocateOption:
    """A command-line option that says where to look (`dsctl down RUN --project P`), as a provider that finds runs by
    label declares it: the commands get their options from the providers (orchestrator/locate.py), never the other
    way round. `uses`: which lookups it serves (down: a run's resources; record: a supervised run's published record,
    for `dsctl logs` and `dsctl runs show`; check: the place `dsctl check` checks)."""

    name: str  # the option's name: --<name>
    help: str
    uses: frozenset[LocateUse] = frozenset({"down", "record", "check"})
    hint: bool = True  # said where users are told how to look elsewhere ("add --project P --zone Z")


class Where:
    """Where to look for a run with no local state, or a place to check: the values given to the options that locate
    (LocateOption), by name; an option not given is None."""

    def __init__(self, **values: str | None) -> None:
        self._values = {name: value for name, value in values.items() if value}

    def get(self, name: str) -> str | None:
        return self._values.get(name)

    @property
    def given(self) -> bool:
        return bool(self._values)

    def said(self) -> str:
        """As the command line gave it: '--project p --bucket b'."""
        return " ".join(f"--{name} {value}" for name, value in self._values.items())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Where) and other._values == self._values

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values.items())))

    def __repr__(self) -> str:
        return f"Where({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"


@dataclass(frozen=True)
class CheckResult:
    """One check of a place before a run is created there (`dsctl check PROVIDER` shows them; `dsctl up` refuses at
    the first that failed): what was checked, how it came out, what was found, and how to fix a failure or warning.
    `field` is the spec field a failure points at; `plan_note` marks what the plan repeats."""

    name: str
    status: Literal["ok", "warn", "fail", "skip"]
    detail: str
    fix: str = ""
    field: str | None = None
    plan_note: bool = False


@runtime_checkable
class ChecksPlace(Protocol):
    """A place whose account, project and network can be checked before anything is created there."""

    def check_place(self, spec: JobSpec, where: Where) -> list[CheckResult]:
        """Every check a run of `spec` would meet, whatever the others found; creates nothing."""


@runtime_checkable
class FindsByLabel(Protocol):
    """A run's resources carry its name: they can be found, and removed, with no local state. Where to look is said
    with the options its registration points at (specs/places.py Place.locate: a tuple of LocateOption), which the
    commands that find runs offer."""

    def looks_there(self, where: Where) -> bool:
        """Whether `where` (or the environment) names a place of this provider to look in."""

    def down_by_label(self, run_id: str, where: Where, log: Callable[[str], None]) -> str:
        """Delete what carries the run's label; what was found and deleted, as a sentence for the user (which says
        so when nothing was found)."""

    def run_objects_by_label(self, run_id: str, where: Where) -> RunObjects:
        """A supervised run's published record, found by its id."""


@runtime_checkable
class Capacity(Protocol):
    """The place holds a bounded number of workers (this machine's memory)."""

    def capacity(self, trainers: int) -> int: ...



@dataclass(frozen=True)
class Contents:
    """What a deployment's container holds now: how many processes, and those that are none of its known servers,
    trainers or launcher nor in their sessions (daemons they started: setsid, a double fork), described."""

    container: str  # where (a cgroup's path)
    processes: int
    others: list[str] = field(default_factory=list)  # "pid N (command)"


@runtime_checkable
class Contains(Protocol):
    """Every process of a deployment is in a container the kernel tracks, so `dsctl status` can count what it holds,
    daemons included (and `down` ends them with it)."""

    def contents(self, dep: Deployment) -> Contents | None:
        """What the deployment's container holds; None where it has none (the machine allowed no cgroup)."""
