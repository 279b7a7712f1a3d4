"""The job spec: one YAML file describing one training job's input-processing deployment.

Field-level checks live here (types, ranges, allowed values). Rules that relate
several fields to each other live in rules.py so that each can point at the
line that has to change.

Every number has an upper bound and must be finite: numbers feed cost estimates and
process counts, and `workers: 100000` or `steps: 1e26` should fail at `dsctl validate`
with file and line, not later (or never, as an $8.9e19 estimate). The bounds are far
above real jobs: the paper's largest sweep has 640 workers.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .autocache import AutocacheSpec
from .pipeline_options import PipelineOptions, check_order
from .places import places, quoted

ProcessingMode = Literal[
    "parallel_epochs",  # = ShardingPolicy.OFF: every worker produces the whole dataset
    "distributed_epoch",  # = ShardingPolicy.DYNAMIC: each element once, split by the dispatcher
    "off", "dynamic", "file", "data", "file_or_data", "hint",
]
PROCESSING_MODES = get_args(ProcessingMode)
# How a run reads its pipeline: through the tf.data service, in the trainer process (the paper's baseline), or
# ideal input that never stalls (§4.1).
Mode = Literal["service", "colocated", "ideal"]
MODES: tuple[Mode, ...] = get_args(Mode)
# What a trainer machine has, for its distribution strategy (from its machine type's shape: costmodel/machines.py).
Accelerator = Literal["none", "gpu", "tpu"]
ACCELERATORS: tuple[Accelerator, ...] = get_args(Accelerator)
BuiltinPipeline = Literal["synthetic", "images", "text"]
BUILTIN_PIPELINES = get_args(BuiltinPipeline)
ENTRYPOINT_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
NAME_RE = re.compile(r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$")

# Where a service-mode run's pipeline runs: on the service's (remote) workers only, or also on workers inside each
# trainer process, on the trainer host's own CPUs (Pecan's hybrid placement; runtime/placement.py), a fixed number
# (hybrid) or as many, with as many remote workers, as Pecan's policy finds cheapest (auto: autoscale policy pecan).
Placement = Literal["remote", "hybrid", "auto"]
MAX_LOCAL_WORKERS = 64  # per trainer process; each is a WorkerServer with its own threads on the trainer host's CPUs
MAX_WORKERS = 4096  # tf.data service workers (service.workers, autoscale.*_workers): 6x the paper's 640
MAX_TRAINERS = 1024  # trainer hosts (trainer.count, coordinated_reads.num_consumers)
MAX_ACCELERATORS = 64  # per trainer host; the largest machine types dsctl knows have 8
MAX_STEPS = 10**9  # trainer.steps, warmup_batches: about 9,000 times the paper's 112,320-step ResNet50 job
MAX_DURATION_S = 30 * 24 * 3600.0  # 30 days: trainer.duration_s, model phases' after_s
MAX_STEP_MS = 3_600_000.0  # an hour per training step
MAX_TIMEOUT_S = 86_400.0  # a day: gcp timeouts, metrics windows


class Strict(BaseModel):
    """Unknown keys are errors: a typo must never silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class CoordinatedReads(Strict):
    """Paper §3.6: every consumer reads round r from the same worker, so batches in a step have similar lengths."""

    num_consumers: int = Field(ge=1, le=MAX_TRAINERS, description="trainers reading in lockstep; must equal trainer.count")
    bucket_boundaries: list[int] = Field(min_length=1, max_length=1024, description="sequence-length bucket edges, increasing")

    @field_validator("bucket_boundaries")
    @classmethod
    def _increasing(cls, v: list[int]) -> list[int]:
        if any(b <= 0 for b in v):
            raise ValueError(f"bucket boundaries must be positive lengths, got {v}")
        if any(b >= a for a, b in zip(v[1:], v)):
            raise ValueError(f"bucket boundaries must be strictly increasing, got {v}")
        return v


class ServiceSpec(Strict):
    workers: int = Field(1, ge=1, le=MAX_WORKERS, description="tf.data service workers")
    worker_machine: str = "n2-standard-8"
    dispatcher_machine: str = "n2-standard-8"
    processing_mode: ProcessingMode = "parallel_epochs"
    job_name: str | None = Field(None, min_length=1, description="shared job name: trainers share one job")
    cross_trainer_cache: bool = False
    cross_trainer_cache_mb: int = Field(256, ge=1, le=1_048_576, description="per-worker cache for ephemeral sharing")
    coordinated_reads: CoordinatedReads | None = None
    compression: Literal["AUTO", "SNAPPY"] | None = None
    fault_tolerant: bool = True
    max_outstanding_requests: int | None = Field(None, ge=1, le=65_536)
    provisioning: Literal["standard", "spot"] = Field(
        "standard", description="how the dispatcher and worker VMs are bought (and priced): on-demand or Spot")
    worker_cpus: list[int] | None = Field(
        None, min_length=1, description="local provider: pin workers and the dispatcher to these cores (like taskset)")
    placement: Placement = Field(
        "remote", description="where the pipeline runs in service mode: remote (the service's workers only), hybrid "
                              "(also local_workers workers inside each trainer process, read beside the remote ones) "
                              "or auto (remote and local worker counts chosen by cost while the job runs: Pecan)")
    local_workers: int = Field(
        0, ge=0, le=MAX_LOCAL_WORKERS, description="hybrid placement: tf.data service workers started inside each "
                                                   "trainer process; auto: the most it may start")


class ModelPhase(Strict):
    """From `after_s` seconds after the first batch on, the step costs this instead (a spec'd phase change)."""

    after_s: float = Field(gt=0, le=MAX_DURATION_S)
    step_time_ms: float | None = Field(None, ge=0, le=MAX_STEP_MS)
    padded_token_time_us: float | None = Field(None, ge=0, le=1e6)


class ModelSpec(Strict):
    """What one training step is. `synthetic` sleeps like an accelerator busy on the step; `python` calls the
    user's step function; `keras` trains the user's compiled Keras model with `fit`."""

    kind: Literal["synthetic", "python", "keras"] = "synthetic"
    step_time_ms: float = Field(0.0, ge=0, le=MAX_STEP_MS, description="fixed time per step")
    padded_token_time_us: float = Field(0.0, ge=0, le=1e6, description="extra time per padded token in the batch")
    entrypoint: str | None = Field(
        None, description="'module:function' called with each batch (kind: python), "
                          "or returning a compiled Keras model (kind: keras)")
    params: dict = Field(default_factory=dict, description="keyword arguments of the Keras model function (kind: keras)")
    phases: list[ModelPhase] = Field(default_factory=list, max_length=1000, description="later step costs (synthetic model)")

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_form(cls, v: str | None) -> str | None:
        if v is not None and not ENTRYPOINT_RE.match(v):
            raise ValueError(f"entrypoint must look like 'package.module:function', got {v!r}")
        return v

    @field_validator("phases")
    @classmethod
    def _phases_in_order(cls, v: list[ModelPhase]) -> list[ModelPhase]:
        if any(b.after_s <= a.after_s for a, b in zip(v, v[1:])):
            raise ValueError("phases must be listed in increasing after_s")
        return v


GCS_PATH_RE = re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/[^\x00-\x1f]*)?$")


class CheckpointSpec(Strict):
    """Where (and, for a keras model, how often) a trainer saves its training state: a keras model's with
    tf.train.CheckpointManager, a command's with whatever it uses, in `dsctl.train.checkpoint_dir()`."""

    dir: str = Field(min_length=1, max_length=1024, description="a local folder or gs://bucket/path")
    every_steps: int | None = Field(
        None, ge=1, le=MAX_STEPS, description="keras models: save every this many steps, and at the end (a command saves "
                                              "when it chooses)")

    @field_validator("dir")
    @classmethod
    def _dir_form(cls, v: str) -> str:
        if "://" in v and not v.startswith("gs://"):
            raise ValueError(f"a checkpoint dir is a local path or a Cloud Storage URL (gs://bucket/path), got {v!r}")
        if v.startswith("gs://") and not GCS_PATH_RE.match(v):
            raise ValueError(f"a Cloud Storage checkpoint dir looks like gs://my-bucket/path (a bucket name of 3-222 "
                             f"lower-case letters, digits, dots, dashes or underscores), got {v!r}")
        if any(ord(c) < 32 for c in v):
            raise ValueError(f"a checkpoint dir cannot contain control characters, got {v!r}")
        return v


# The scaling policies a spec may name, each the module orchestrator/policies/<name>.py (which defines POLICY): a new
# policy is that module and its name here.
AutoscalePolicy = Literal["cachew", "cpu", "pecan"]


class AutoscaleSpec(Strict):
    """Scale workers while the job runs (Cachew's policy, or the CPU-utilization baseline)."""

    policy: AutoscalePolicy = "cachew"
    min_workers: int = Field(1, ge=1, le=MAX_WORKERS, description="the job starts here")
    start: Literal["min", "profile"] = Field(
        "min", description="min: start at min_workers; profile: at the worker count the newest `dsctl profile` of this "
                           "job's pipeline predicted (within min_workers..max_workers)")
    max_workers: int = Field(8, ge=1, le=MAX_WORKERS)
    settings: dict = Field(default_factory=dict, description="policy constants, e.g. threshold, pause_batches")


ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_COMMAND_ARGS = 1024
MAX_ARG_CHARS = 16_384


def _command_word(value: object, position: int) -> str:
    """One word of trainer.command as text: numbers as written by YAML (3, 0.1); anything else is refused."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        shown = {True: "true", False: "false", None: "null"}.get(value, type(value).__name__) \
            if isinstance(value, (bool, type(None))) else type(value).__name__
        raise ValueError(f"word {position} of the command is {shown}, not text; put it in quotes")
    word = str(value)
    if "\x00" in word:
        raise ValueError(f"word {position} of the command contains a NUL character")
    if len(word) > MAX_ARG_CHARS:
        raise ValueError(f"word {position} of the command is longer than {MAX_ARG_CHARS} characters")
    return word


class TrainerSpec(Strict):
    machine: str = "n2-standard-8"
    count: int = Field(1, ge=1, le=MAX_TRAINERS, description="trainer hosts (tf.data service clients)")
    accelerators_per_trainer: int | None = Field(None, ge=0, le=MAX_ACCELERATORS, description="default: the machine type's")
    model: ModelSpec = Field(default_factory=ModelSpec)
    command: list[str] | None = Field(
        None, description="your own training program, run instead of trainer.model: an argument list, or a string split "
                          "as a shell would (never run by one), run from the spec's folder with your environment plus "
                          "trainer.env; it reads the run's data with dsctl.train")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables added for trainer.command")
    framework: Literal["tensorflow", "jax"] = Field(
        "tensorflow", description="what trainer.command trains with; on a TPU VM it decides the TPU software (TensorFlow's "
                                  "TPU runtime, or JAX's with jax's TPU wheels)")
    timeout_s: float | None = Field(
        None, gt=0, le=MAX_DURATION_S, description="the trainers' time limit: a run whose trainers still run after this "
                                                   "long (a hung script) fails and is torn down")
    nonfinite_loss: Literal["record", "fail"] = Field(
        "record", description="a loss that is no longer a finite number (NaN, infinite: the model diverged): record "
                              "it as such and train on, or fail the run at once")
    steps: int | None = Field(None, ge=1, le=MAX_STEPS)
    duration_s: float | None = Field(None, gt=0, le=MAX_DURATION_S)
    warmup_batches: int = Field(5, ge=0, le=MAX_STEPS, description="batches excluded from throughput")
    window_s: float = Field(1.0, gt=0, le=MAX_TIMEOUT_S, description="metrics window length")
    cpus: list[int] | None = Field(None, min_length=1, description="local provider: pin trainers to these cores")
    provisioning: Literal["standard", "spot"] = Field(
        "standard", description="how trainer VMs are bought (and priced): on-demand or Spot")
    checkpoint: CheckpointSpec | None = Field(None, description="keras models and commands: save and restore training state")
    tensorboard_dir: str | None = Field(
        None, min_length=1, max_length=1024,
        description="also copy the run's TensorBoard event files to <this>/<run id>/: a local folder or gs://bucket/path")

    @field_validator("command", mode="before")
    @classmethod
    def _command_words(cls, v: object) -> object:
        """A string is split as a POSIX shell splits words (quotes, backslashes), and never run by a shell."""
        if v is None:
            return v
        if isinstance(v, str):
            try:
                words = shlex.split(v)
            except ValueError as exc:
                raise ValueError(f"the command {v!r} cannot be split into words: {exc} (check its quotes)") from None
        elif isinstance(v, list):
            words = [_command_word(w, i) for i, w in enumerate(v)]
        else:
            raise ValueError("a command is a list of words, e.g. [python, train.py, --lr, '0.1'], or one string, "
                             "e.g. 'python train.py --lr 0.1'")
        if not words or not words[0]:
            raise ValueError("the command is empty; give the program to run, e.g. 'python train.py'")
        if len(words) > MAX_COMMAND_ARGS:
            raise ValueError(f"the command has {len(words)} words; at most {MAX_COMMAND_ARGS}")
        return [_command_word(w, i) for i, w in enumerate(words)]

    @field_validator("env", mode="before")
    @classmethod
    def _env_form(cls, v: object) -> object:
        if not isinstance(v, dict):
            return v  # pydantic says what a mapping is
        out = {}
        for key, value in v.items():
            if not isinstance(key, str) or not ENV_NAME_RE.match(key):
                raise ValueError(f"{key!r} is not an environment variable name (letters, digits and '_', not starting "
                                 "with a digit)")
            if key.startswith("DSCTL_"):
                raise ValueError(f"{key}: variables starting with DSCTL_ are set by dsctl itself")
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ValueError(f"{key}: a value is text (or a number); put it in quotes")
            if "\x00" in str(value):
                raise ValueError(f"{key}: a value cannot contain a NUL character")
            out[key] = str(value)
        return out

    @field_validator("tensorboard_dir")
    @classmethod
    def _tensorboard_dir_form(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if ("://" in v and not v.startswith("gs://")) or (v.startswith("gs://") and not GCS_PATH_RE.match(v)):
            raise ValueError(f"a TensorBoard folder is a local path or a Cloud Storage URL like gs://my-bucket/path, "
                             f"got {v!r}")
        if any(ord(c) < 32 for c in v):
            raise ValueError(f"a TensorBoard folder cannot contain control characters, got {v!r}")
        return v


class PipelineSpec(Strict):
    builtin: BuiltinPipeline | None = None
    entrypoint: str | None = Field(None, description="'module:function' returning a tf.data.Dataset")
    params: dict = Field(default_factory=dict)
    options: PipelineOptions | None = Field(None, description="tf.data Options dsctl sets on the pipeline "
                                                                 "(dsctl profile recommends them)")
    order: dict[str, list[str]] | None = Field(None, description="for each reorderable section "
                                                                 "(dsctl.reorderable), the order its steps run in")

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_form(cls, v: str | None) -> str | None:
        if v is not None and not ENTRYPOINT_RE.match(v):
            raise ValueError(f"entrypoint must look like 'package.module:function', got {v!r}")
        return v

    @field_validator("order")
    @classmethod
    def _order(cls, v: dict[str, list[str]] | None) -> dict[str, list[str]] | None:
        return check_order(v)


GCP_PROJECT_RE = re.compile(r"^([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$")  # with a legacy domain: prefix
GCP_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
GCP_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
GCP_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
GCP_LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")


SERVICE_ACCOUNT_RE = re.compile(r"^[a-z0-9._%+-]+@[a-z0-9.-]+\.gserviceaccount\.com$")


class ServiceAccountsSpec(Strict):
    """Which service account each kind of VM runs as (an email); a kind left out is dsctl's own."""

    supervisor: str | None = Field(None, min_length=1, description="the dispatcher and trainer VMs: supervise the run "
                                                                   "and end its VMs")
    workers: str | None = Field(None, min_length=1, description="the tf.data service workers: read the run's objects")

    @field_validator("supervisor", "workers")
    @classmethod
    def _email(cls, v: str | None) -> str | None:
        if v is not None and not SERVICE_ACCOUNT_RE.match(v):
            raise ValueError(f"a service account is its email, e.g. runner@my-project.iam.gserviceaccount.com, got {v!r}")
        return v

    def items(self) -> list[tuple[str, str]]:
        return [(k, v) for k, v in (("supervisor", self.supervisor), ("workers", self.workers)) if v]


class GcpSpec(Strict):
    """Where and how `provider: gcp` creates machines. Every field has a default; project and
    zone may come from the environment instead (Application Default Credentials, CLOUDSDK_*)."""

    project: str | None = Field(None, description="project id; default: GOOGLE_CLOUD_PROJECT or the ADC project")
    zone: str | None = Field(None, description="e.g. us-central1-a; default: CLOUDSDK_COMPUTE_ZONE")
    network: str = Field("default", min_length=1, description="VPC network name or URL")
    subnetwork: str | None = Field(None, min_length=1, description="subnetwork name or URL (custom-mode VPCs)")
    service_account: str | None = Field(None, min_length=1,
                                        description="one service account for every VM (checked for what the dispatcher, "
                                                    "trainers and workers each need; dsctl never changes its roles); "
                                                    "default: dsctl's own per kind of VM (gcp.service_accounts); none "
                                                    "is refused (the VMs' watchdogs need an account to end them)")
    service_accounts: ServiceAccountsSpec | None = Field(
        None, description="the accounts the VMs run as, by kind; each one left out is dsctl's own (dsctl-supervisor@, "
                          "dsctl-workers@PROJECT.iam.gserviceaccount.com), made with exactly the roles its VMs need "
                          "where you may, else checked for them")
    data_buckets: list[str] = Field(default_factory=list,
                                    description="buckets the run's pipeline and programs read (datasets): the VMs' "
                                                "accounts get Storage Object Viewer on each")
    shielded_vm: bool = Field(True, description="Shielded VM with Secure Boot, vTPM and integrity monitoring on every "
                                                "VM whose image supports it; false: Compute Engine's defaults")
    public_ips: bool = Field(True, description="ephemeral external addresses, SSH reaches them there; "
                                               "false: run dsctl inside the VPC")
    ssh_port: int = Field(22, ge=1, le=65535, description="overridden by DSCTL_SSH_PORT")
    image: str = Field("projects/debian-cloud/global/images/family/debian-12", description="boot image of CPU VMs")
    gpu_image: str = Field("projects/deeplearning-platform-release/global/images/family/"
                           "common-cu129-ubuntu-2204-nvidia-580",
                           description="boot image of GPU trainer VMs "
                                       "(a Deep Learning VM image, which comes with its NVIDIA driver)")
    image_python: str | None = Field(None, min_length=1,
                                     description="the image's own Python, which makes the venv; default: known per image")
    image_python_version: str | None = Field(None, pattern=r"^3\.[0-9]{1,2}$",
                                             description="its version, e.g. '3.11'; default: known per image")
    tpu_runtime_version: str | None = Field(
        None, min_length=1, description="TPU VM software version; default: the TensorFlow runtime for the TPU generation "
                                        "and TensorFlow version, or JAX's TPU image with trainer.framework: jax")
    tpu_timeout_s: float = Field(1800.0, gt=0, le=MAX_TIMEOUT_S,
                                 description="for a TPU VM to be created and READY (TPUs take minutes)")
    boot_disk_gb: int = Field(50, ge=10, le=65_536)
    boot_disk_type: str = "pd-balanced"
    bucket: str | None = Field(None, description="staging bucket; default: <project>-dsctl (created if missing)")
    dispatcher_port: int = Field(5050, ge=0, le=65535, description="0: chosen on the VM")
    worker_port: int = Field(5051, ge=0, le=65535, description="0: chosen on each VM")
    tensorflow_version: str | None = Field(
        None, pattern=r"^2\.[0-9]+\.[0-9]+$",
        description="one TensorFlow for every VM; default: this machine's if every machine kind has it, "
                    "else the newest that does")
    bootstrap: bool = Field(True, description="install TensorFlow and dsctl from a staged wheelhouse at boot; "
                                              "false: the image has them")
    python: str | None = Field(None, description="Python on the VMs; default: the bootstrap venv, or python3")
    remote_dir: str = Field("/var/tmp/dsctl", min_length=1, description="working directory on the VMs")
    running_timeout_s: float = Field(300.0, gt=0, le=MAX_TIMEOUT_S, description="for a VM to reach RUNNING (a TPU VM READY)")
    ssh_timeout_s: float = Field(300.0, gt=0, le=MAX_TIMEOUT_S, description="for SSH to answer once a VM runs")
    startup_timeout_s: float = Field(900.0, gt=0, le=MAX_TIMEOUT_S,
                                     description="for the startup script to install TensorFlow and dsctl")
    ready_timeout_s: float = Field(300.0, gt=0, le=MAX_TIMEOUT_S,
                                   description="for the dispatcher and workers to serve once started")
    supervisor: Literal["vm", "here"] = Field(
        "vm", description="where a run is supervised: vm (its dispatcher VM, with the VMs' service account; the run "
                          "outlives this machine, and dsctl up --detach needs it) or here (this machine, which must "
                          "stay connected: dsctl up only)")
    max_duration_s: float = Field(86400.0, gt=0, le=MAX_DURATION_S,
                                  description="a run supervised on the cloud (dsctl up --detach) is torn down after "
                                              "this long even if its job goes on; the VMs of every run also carry it "
                                              "(plus an hour) as Compute Engine's maxRunDuration, which deletes them "
                                              "then, in case the supervisor is lost")
    heartbeat_limit_s: float = Field(600.0, ge=15, le=MAX_TIMEOUT_S,
                                     description="every VM and TPU VM of a run deletes itself once the run's supervisor "
                                                 "(dsctl up here, or dsctl supervise on the dispatcher VM) has not "
                                                 "written its heartbeat to the bucket for this long")
    outage_limit_s: float = Field(600.0, gt=0, le=7 * 24 * 3600,
                                  description="how long a run goes on while dsctl cannot reach its VMs over SSH (a laptop "
                                              "asleep, a VPN drop); past it the run fails and is torn down")
    labels: dict[str, str] = Field(default_factory=dict, description="extra labels on every resource")

    @field_validator("project")
    @classmethod
    def _project(cls, v: str | None) -> str | None:
        if v is not None and not GCP_PROJECT_RE.match(v):
            raise ValueError(f"a project id is 6-30 lower-case letters, digits or dashes, starting with a letter "
                             f"(e.g. my-project-123), got {v!r}")
        return v

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str | None) -> str | None:
        if v is not None and not GCP_BUCKET_RE.match(v):
            raise ValueError(f"a bucket name is 3-222 lower-case letters, digits, dots, dashes or underscores, "
                             f"starting and ending with a letter or digit, got {v!r}")
        return v

    @field_validator("data_buckets")
    @classmethod
    def _data_buckets(cls, v: list[str]) -> list[str]:
        for name in v:
            if not GCP_BUCKET_RE.match(name.removeprefix("gs://").rstrip("/")):
                raise ValueError(f"a bucket name is 3-222 lower-case letters, digits, dots, dashes or underscores, "
                                 f"got {name!r}")
        return [name.removeprefix("gs://").rstrip("/") for name in v]

    @model_validator(mode="after")
    def _one_way_to_name_accounts(self) -> GcpSpec:
        if self.service_account and self.service_accounts and self.service_accounts.items():
            raise ValueError("name either one account for every VM (service_account) or one per kind "
                             "(service_accounts), not both")
        return self

    @field_validator("zone")
    @classmethod
    def _zone(cls, v: str | None) -> str | None:
        if v is not None and not GCP_ZONE_RE.match(v):
            raise ValueError(f"zone must look like 'us-central1-a', got {v!r}")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not GCP_LABEL_KEY_RE.match(key) or not GCP_LABEL_VALUE_RE.match(value):
                raise ValueError(
                    f"label {key}={value!r}: keys are 1-63 lower-case letters, digits, '-' or '_' starting with a "
                    "letter; values are up to 63 of the same"
                )
            if key.startswith("dsctl-"):
                raise ValueError(f"label {key}: keys starting with 'dsctl-' are set by dsctl itself")
        return v


class JobSpec(Strict):
    name: str = Field(description="lower-case letters, digits and dashes; names the run and its resources")
    provider: str = Field("local", description="where the run goes: a provider shipped with dsctl (local, gcp) or "
                                                "one a package installed (specs/places.py)")
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    trainer: TrainerSpec
    pipeline: PipelineSpec
    autoscale: AutoscaleSpec | None = None
    autocache: AutocacheSpec | None = Field(None, description="cache the pipeline at an autocache hint when faster")
    pricing: str = Field("gcp-us-central1-2025", description="a shipped price catalog name or a path to a prices "
                                                            "YAML; default: the provider's own")
    cost_basis: Literal["utilization", "vm-hours"] = "utilization"
    gcp: GcpSpec | None = Field(None, description="Google Cloud settings, used with provider: gcp")

    @model_validator(mode="before")
    @classmethod
    def _auto_placement_scales(cls, data: Any) -> Any:
        """placement: auto is placed by Pecan's policy, which scales the remote workers too: its autoscale section
        (written or not: the section's defaults) names that policy unless it names one (specs/rules.py refuses
        another)."""
        service = data.get("service") if isinstance(data, dict) else None
        if isinstance(service, dict) and service.get("placement") == "auto":
            auto = data.get("autoscale")
            if auto is None:
                data = {**data, "autoscale": {"policy": "pecan"}}
            elif isinstance(auto, dict) and "policy" not in auto:
                data = {**data, "autoscale": {"policy": "pecan", **auto}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _provider_pricing(cls, data: Any) -> Any:
        """A spec that names no catalog is priced from its provider's own (specs/places.py)."""
        if isinstance(data, dict) and "pricing" not in data:
            place = places().get(str(data.get("provider", "local")))
            if place is not None:
                data = {**data, "pricing": place.pricing}
        return data

    @field_validator("provider")
    @classmethod
    def _provider(cls, v: str) -> str:
        known = places()
        if v not in known:  # said as pydantic says a Literal's choices, so validate() offers the closest
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": quoted(list(known))})
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(
                f"name must be 1-40 lower-case letters, digits or dashes, starting with a letter, got {v!r}"
            )
        return v
