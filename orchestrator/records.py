"""What a run's record is, typed: its row, its summary, its events; one definition the store, the CLI and the JSON
output (`--json`, the cloud record) share.

The store keeps a run's summary as JSON (runs.summary_json). Read back, it is a RunSummary (a job, or a sweep's
point), a SweepSummary (a sweep) or a ProfileSummary (a profile), each field typed; a field the run never had is
unset, and written back as it was: absent (`as_json` leaves unset fields out, so the JSON a run had is the JSON it
keeps). A key this dsctl does not know (written by a newer one) is kept as it was. Records written by older versions
load: every field is optional, as every one of them was added at some point.

Code reads a record's fields as attributes. `record.summary["batches"]` also works, and gives exactly what the
record's JSON holds under that key (KeyError for a key it does not hold): for readers of that JSON, such as tests
and scripts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import Self

from dsctl.specs.schema import Mode

if TYPE_CHECKING:
    from .profiling.record import Profile

# a sweep's points are runs of their own, under it (parent_id); a profile (`dsctl profile`) is a run too
RunKind = Literal["job", "sweep", "point", "profile"]
RecordMode = Mode | Literal["profile"]  # how a run ran: a job's mode, or a profile's profiling process
Ending = Literal["succeeded", "failed", "interrupted"]  # how a run ended (orchestrator/endings.py judges it)
RunStatus = Literal["running", Ending]


class Record(BaseModel):
    """A typed record read from JSON and written back as it was: unset fields stay out of its JSON, unknown keys
    stay in it."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)

    def as_json(self) -> dict[str, Any]:
        """The record as its JSON has it: the fields it holds (set), by their JSON names, and the keys it kept."""
        return self.model_dump(exclude_unset=True, by_alias=True)

    def updated(self, **values: Any) -> Self:
        """A copy holding `values` too (validated as the fields they set), the rest as it was."""
        return self.model_validate({**self.as_json(), **values})

    def _keys(self) -> list[str]:
        fields_by_alias = {name: info.alias or name for name, info in type(self).model_fields.items()}
        return [fields_by_alias[n] for n in fields_by_alias if n in self.model_fields_set] + list(self.model_extra or {})

    def __getitem__(self, key: str) -> Any:
        """What the record's JSON holds under `key`; KeyError for a key it does not hold."""
        if key not in self._keys():
            raise KeyError(key)
        return self.as_json()[key]

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return key in self._keys()

    def keys(self) -> list[str]:
        return self._keys()


# -- a job's summary -------------------------------------------------------------------------------------------------
class LossNonfinite(Record):
    """Where the model's loss first stopped being a finite number."""

    trainer: int
    value: str  # nan | inf | -inf
    batches: int  # the batches that trainer had trained by the end of that window


class BoardFiles(Record):
    """Where a run's TensorBoard event files are, where they were copied, and why writing them stopped."""

    dir: str | None = None
    copy_to: str | None = Field(None, alias="copy")
    error: str | None = None


class CacheUsed(Record):
    """The autocache cache a run wrote (put) or read (get): what `dsctl cost report` prices."""

    hint: str | None = None
    path: str | None = None
    state: Literal["put", "get"] | None = None
    sealed: bool = False
    bytes: int | None = None
    storage_kind: str | None = None
    failed: Literal["write", "read"] | None = None


class AutocacheSummary(Record):
    """What autocache chose for the run, why, and the cache it used."""

    choice: str | None = None  # compute, or the hint cached at
    reason: str | None = None
    hits: list[str] | None = None  # the hints a job with the same pipeline sealed a cache at
    inputs: dict[str, Any] | None = None
    cache: CacheUsed | None = None


class CacheStorage(Record):
    """A run's autocache cache priced by the month it is kept and for the job's own time (not in the run's total)."""

    kind: str
    gb: float
    state: str
    path: str | None = None
    gb_month: float | None = None
    per_month: float | None = None
    during_job: float | None = None


class CostSummary(Record):
    """The run's price when it ended (orchestrator/pricing.py cost_summary), or why it could not be priced (`error`);
    and what it created besides its machines, as its provider recorded it (`created`), with their price
    (`additions`: beside Equation 1's total, never in it)."""

    total: float | None = None
    service: float | None = None
    trainers: float | None = None
    per_1000_batches: float | None = None
    basis: str | None = None
    catalog: str | None = None
    note: str | None = None
    service_provisioning: str | None = None
    trainer_provisioning: str | None = None
    provisioning: str | None = None
    cache_storage: CacheStorage | None = None
    created: dict[str, Any] | None = None  # the provider's own record of what the run created (its Bill.kept)
    additions: dict[str, Any] | None = None
    # Hybrid placement: the pipeline's cost by where it ran; local is a share of the trainers' (never added), None
    # when not known, with how the local workers' CPU was known.
    remote_preprocessing: float | None = None
    local_preprocessing: float | None = None
    local_cpu_source: str | None = None
    error: str | None = None


class TrainerPlacement(Record):
    """One trainer's placement record (runtime/placement.py): the batches it received from its own process's workers
    and from the remote ones, and from each producing process ("host:pid"), counted where they arrived."""

    trainer: int
    process: str | None = None
    local_batches: int = 0
    remote_batches: int = 0
    by_producer: dict[str, int] = Field(default_factory=dict)


class PlacementSummary(Record):
    """Where a hybrid run's pipeline ran: the workers inside each trainer process, and the batches all trainers
    received from them and from the remote workers (measured here, from each trainer's placement record)."""

    placement: str | None = None
    local_workers: int | None = None  # per trainer
    local_batches: int | None = None
    remote_batches: int | None = None
    trainers: list[TrainerPlacement] = Field(default_factory=list)


class RunSummary(Record):
    """The numbers users compare, for one run (a job, or a sweep's point): throughput, input stall, utilization, and
    what the run did. Every number is measured here, from the run's own metrics (orchestrator/summary.py)."""

    batches: int | None = None
    batches_per_s: float | None = None  # per trainer, over the wall clock after warm-up
    total_batches_per_s: float | None = None
    step_batches_per_s: float | None = None  # per trainer, over its training step time
    outside_s: float | None = None  # per trainer, outside its loop over the batches (evaluation, checkpoints)
    outside_frac: float | None = None
    input_stall_frac: float | None = None
    model_step_s: float | None = None  # per batch, the model's own step: batch time less input wait (measured windows)
    duration_s: float | None = None
    time_to_first_batch_s: float | None = None
    padded_token_frac: float | None = None
    # Mean cores busy and resident GB per process of each role, CPU-seconds used, and per batch.
    worker_cpu_cores: float | None = None
    worker_mem_gb: float | None = None
    worker_cpu_seconds: float | None = None
    worker_cpu_seconds_per_batch: float | None = None
    dispatcher_cpu_cores: float | None = None
    dispatcher_mem_gb: float | None = None
    dispatcher_cpu_seconds: float | None = None
    dispatcher_cpu_seconds_per_batch: float | None = None
    trainer_cpu_cores: float | None = None
    trainer_mem_gb: float | None = None
    trainer_cpu_seconds: float | None = None
    trainer_cpu_seconds_per_batch: float | None = None
    # Hybrid placement: where the batches came from, and the CPU the in-process workers used (vCPUs busy per trainer,
    # CPU-seconds of all trainers) with how it is known (local_cpu_source: estimated, or why not known).
    placement: PlacementSummary | None = None
    local_cpu_cores: float | None = None
    local_cpu_seconds: float | None = None
    local_cpu_source: str | None = None
    # The model's loss in its first and last window (mean over trainers), and where it stopped being finite.
    loss_first: float | None = None
    loss_last: float | None = None
    loss_nonfinite: LossNonfinite | None = None
    # A program's epochs (passes read to their end), what a pass holds read alone, and what ended the reading.
    epochs: int | None = None
    ended_by: str | None = None  # end_of_data | closed | steps | duration | signal
    epoch_batches: list[int] | None = None
    epoch_examples: list[int] | None = None
    pass_batches: int | None = None
    pass_examples: int | None = None
    epoch_note: str | None = None
    # "windows": some trainers' end records were missing, and their part was rebuilt from their stored windows.
    summary_source: Literal["windows"] | None = None
    rebuilt_trainers: list[int] | None = None
    # A finite synthetic dataset read through the service: every element counted.
    elements_expected: int | None = None
    elements_received: int | None = None
    elements_lost: int | None = None
    elements_duplicated: int | None = None
    # Machine-seconds each role's machines spent stopped (preempted VMs), not billed meanwhile.
    worker_stopped_s: float | None = None
    dispatcher_stopped_s: float | None = None
    trainer_stopped_s: float | None = None
    # An autoscaled run: its policy, the time-weighted worker count, the count it ended with.
    autoscale_policy: str | None = None
    mean_workers: float | None = None
    final_workers: int | None = None
    autocache: AutocacheSummary | None = None
    # Training: the step a resumed run restored, the last step every trainer can resume from, where.
    restored_step: int | None = None
    checkpoint_step: int | None = None
    checkpoint_dir: str | None = None
    tensorboard: BoardFiles | None = None
    cost: CostSummary | None = None
    recorded_by: str | None = None  # a record closed by `dsctl down` or `dsctl runs import`: how it was


# -- a sweep's summary -----------------------------------------------------------------------------------------------
class SweepPoint(Record):
    """One worker count of a sweep: measured here (a point run of its own), or fitted or predicted by the throughput
    model (`source`)."""

    workers: int
    local_workers: int | None = None  # per trainer, inside its process (sweep --local-workers); None: remote only
    run_id: str | None = None
    mode: Mode | None = None
    predicted: bool = False
    source: str | None = None  # measured here | fitted | predicted
    batches_per_s: float | None = None
    cost_per_1000_batches: float | None = None
    input_stall_frac: float | None = None
    worker_cpu_cores: float | None = None
    worker_mem_gb: float | None = None
    speedup: float | None = None
    fraction_of_ideal: float | None = None
    cost_saving: float | None = None


class Baseline(Record):
    """A sweep's colocated or ideal baseline: measured here, or given (`given`: from where)."""

    batches_per_s: float | None = None
    cost_per_1000_batches: float | None = None
    run_id: str | None = None
    given: str | None = None


class RecommendedCount(Record):
    """One worker count a sweep recommends, and the one sentence that justifies it (orchestrator/recommend.py)."""

    workers: int
    local_workers: int | None = None
    batches_per_s: float | None = None
    cost_per_1000_batches: float | None = None
    predicted: bool = False
    reason: str = ""


class SweepRecommendation(Record):
    """What a sweep recommends: the fewest workers within tolerance of the best, the cheapest, and why nothing where
    its measurements contradict each other (orchestrator/recommend.py)."""

    smallest: RecommendedCount | None = None
    cheapest: RecommendedCount | None = None
    best_bps: float | None = None
    best_workers: int | None = None
    best_predicted: bool | None = None
    tolerance: float | None = None
    noise: float | None = None
    warning: str | None = None
    refused: str | None = None
    extend: str | None = None
    # sweep --local-workers: the cheapest point of the (remote x local) surface within tolerance of its best measured
    # throughput, and that rule in words; smallest/cheapest above are then the remote-only points' answers.
    surface: RecommendedCount | None = None
    rule: str | None = None


class SweepSummary(Record):
    """A sweep: the worker counts it visited, each point, the baselines, the fitted model, what it recommends."""

    counts: list[int] | None = None
    workers_asked: str | None = None
    local_counts: list[int] | None = None  # sweep --local-workers: in-process workers per trainer, each count swept
    local_asked: str | None = None
    points: list[SweepPoint] = Field(default_factory=list)
    baselines: dict[str, Baseline] = Field(default_factory=dict)
    model: dict[str, Any] | None = None
    window: str | None = None
    warmup_s: float | None = None
    measures: str | None = None
    strategy: str | None = None
    tolerance: float | None = None
    timings: dict[str, float] | None = None
    recommendation: SweepRecommendation | None = None
    plots: list[str] | None = None
    recorded_by: str | None = None


# -- a profile's summary --------------------------------------------------------------------------------------------
class ProfileSummary(Record):
    """A profile (`dsctl profile`): the profile's own JSON as `dsctl profile --json` prints it, kept whole (its
    typed form is orchestrator/profiling/record.py's Profile: `profile()`), and the two figures `dsctl runs` lists."""

    kind: str | None = None  # "dsctl-profile" once the profile was made; unset when the run failed first
    batches_per_s: float | None = None  # one worker-like process, measured here
    duration_s: float | None = None  # the measured window

    def profile(self) -> Profile | None:
        """The profile, typed; None for a profile run that recorded none (it failed)."""
        from .profiling.record import Profile, is_profile

        data = self.as_json()
        return Profile.from_dict(data) if is_profile(data) else None


Summary = RunSummary | SweepSummary | ProfileSummary
SUMMARIES: dict[str, type[SweepSummary] | type[ProfileSummary]] = {"sweep": SweepSummary, "profile": ProfileSummary}


def summary_of(kind: str, data: dict[str, Any] | Record | None) -> Summary:
    """A record's summary from its JSON, typed by the kind of run it is."""
    if isinstance(data, Record):
        data = data.as_json()
    return SUMMARIES.get(kind, RunSummary).model_validate(data or {})


def summary_json(summary: Summary | dict[str, Any]) -> str:
    """A summary as the store keeps it (runs.summary_json)."""
    data = summary.as_json() if isinstance(summary, Record) else summary
    return json.dumps(data)


# -- a run's row, its events ----------------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """One recorded run: its row in runs.db (a job, a sweep or a sweep's point), with its summary typed."""

    id: str
    name: str
    kind: RunKind
    parent_id: str | None
    provider: str
    mode: RecordMode
    status: RunStatus
    spec_path: str | None
    spec_yaml: str | None
    spec_json: str
    spec_hash: str
    workers: int
    trainers: int
    created_at: float
    ended_at: float | None
    run_dir: str | None
    error: str | None
    summary: Summary = field(default_factory=RunSummary)
    resumed_from: str | None = None  # the run whose checkpoints this one restored
    checkpoint_dir: str | None = None  # this run's checkpoints (one trainer-<i> folder per trainer below it)

    def __post_init__(self) -> None:
        if not isinstance(self.summary, (RunSummary, SweepSummary, ProfileSummary)):  # a summary given as its JSON
            self.summary = summary_of(self.kind, self.summary)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RunRecord:
        """A record from its row (runs.db's columns, as the store and a cloud record have them); columns this dsctl
        does not know are left out."""
        known = {f.name for f in fields(cls)} - {"summary"}
        data = {k: v for k, v in row.items() if k in known}
        return cls(summary=summary_of(str(row.get("kind")), json.loads(row.get("summary_json") or "{}")), **data)

    def as_dict(self) -> dict[str, Any]:
        """The record as `--json` prints it: its columns, its summary as recorded, its spec parsed."""
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("spec_yaml",
                                                                                                      "spec_json")}
        d["summary"] = self.summary.as_json()
        d["spec"] = json.loads(self.spec_json)
        return d

    @property
    def job(self) -> RunSummary:
        """The summary of a job or a point (a sweep's is a SweepSummary: an empty RunSummary stands for it)."""
        return self.summary if isinstance(self.summary, RunSummary) else RunSummary()

    @property
    def sweep(self) -> SweepSummary:
        """The summary of a sweep (anything else: an empty one)."""
        return self.summary if isinstance(self.summary, SweepSummary) else SweepSummary()

    @property
    def profiled(self) -> ProfileSummary:
        """The summary of a profile (anything else: an empty one)."""
        return self.summary if isinstance(self.summary, ProfileSummary) else ProfileSummary()


class CloudProgress(Record):
    """A run supervised on the cloud, as its supervisor last said it in latest.json: what the live view shows."""

    phase: str | None = None
    batches: int | None = None
    batches_per_s: float | None = None
    workers: int | None = None
    restarts: int | None = None
    last_event: str | None = None


class RunEvent(Record):
    """Something that happened to a run (a restart, a scaling, an epoch), as its record and `dsctl logs` say it."""

    run_id: str | None = None
    t: float
    kind: str
    message: str | None = None

    @property
    def key(self) -> tuple[float, str, str | None]:
        """What tells one event from another (the same event read twice is shown once)."""
        return self.t, self.kind, self.message


class CloudLatest(Record):
    """latest.json, what a run's supervisor on the cloud publishes at every turn (orchestrator/cloudrecord.py): the
    run's row as its store has it, its progress, how many parts of its record there are, when it was written (its age
    is the supervisor's heartbeat) and its latest events."""

    run: dict[str, Any] | None = None  # the run's row (runs.db's columns)
    progress: CloudProgress = Field(default_factory=CloudProgress)
    parts: int = 0
    written_at: float | None = None
    events: list[RunEvent] = Field(default_factory=list)

    @property
    def record(self) -> RunRecord | None:
        """The run's record, as its supervisor has it."""
        return RunRecord.from_row(self.run) if self.run else None

    @property
    def status(self) -> str | None:
        """The run's status (running, succeeded, ...), None before its row is published."""
        return str(self.run.get("status")) if self.run and self.run.get("status") else None

    @property
    def ended(self) -> bool:
        """The run has ended (its supervisor recorded how)."""
        return self.status not in (None, "running")
