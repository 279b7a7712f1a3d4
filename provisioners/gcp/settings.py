"""Resolved settings of one run on Google Cloud: spec's `gcp:` section + environment + credentials.

Project and zone come from the spec, else the environment (GOOGLE_CLOUD_PROJECT,
CLOUDSDK_CORE_PROJECT; CLOUDSDK_COMPUTE_ZONE), else (project only) Application
Default Credentials. Endpoints can be overridden for tests and private endpoints:
DSCTL_GCE_ENDPOINT (Compute Engine), DSCTL_TPU_ENDPOINT (Cloud TPU),
DSCTL_CRM_ENDPOINT (Cloud Resource Manager), STORAGE_EMULATOR_HOST (Cloud
Storage); an overridden API is called with
anonymous credentials. DSCTL_SSH_PORT and DSCTL_REMOTE_PYTHON override the
spec's ssh_port and python.

The settings are plain data, saved in the run's state, so `dsctl down` in a new
process talks to the same project, zone and endpoints.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from importlib import metadata

from dsctl.specs import SpecError
from dsctl.specs.schema import GCP_PROJECT_RE, GcpSpec, JobSpec

from .software import resolve as resolve_software

BOOTSTRAP_PYTHON = "/opt/dsctl/venv/bin/python"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


@dataclass
class GcpSettings:
    project: str
    zone: str
    network: str = "default"
    subnetwork: str | None = None
    service_account: str | None = None
    public_ips: bool = True
    ssh_user: str = "dsctl"
    ssh_port: int = 22
    boot_disk_gb: int = 50
    boot_disk_type: str = "pd-balanced"
    bucket: str = ""
    dispatcher_port: int = 5050
    worker_port: int = 5051
    tensorflow_version: str = ""
    bootstrap: bool = True
    python: str = "python3"
    remote_dir: str = "/var/tmp/dsctl"
    running_timeout_s: float = 300.0
    tpu_timeout_s: float = 1800.0
    ssh_timeout_s: float = 300.0
    startup_timeout_s: float = 900.0
    ready_timeout_s: float = 300.0
    outage_limit_s: float = 600.0
    max_duration_s: float = 86400.0
    labels: dict = field(default_factory=dict)
    software: dict = field(default_factory=dict)  # software.Software.as_dict(): the TensorFlow and images per VM kind
    compute_endpoint: str | None = None
    tpu_endpoint: str | None = None
    crm_endpoint: str | None = None
    storage_host: str | None = None

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    @property
    def kinds(self) -> "Software":
        from .software import Software

        return Software.from_dict(self.software)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "GcpSettings":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def with_env_endpoints(self) -> "GcpSettings":
        """The endpoints of *this* process's environment (a `dsctl down` may run with other ones)."""
        env = os.environ
        self.compute_endpoint = env.get("DSCTL_GCE_ENDPOINT") or None
        self.tpu_endpoint = env.get("DSCTL_TPU_ENDPOINT") or None
        self.crm_endpoint = env.get("DSCTL_CRM_ENDPOINT") or None
        self.storage_host = env.get("STORAGE_EMULATOR_HOST") or None
        return self


def local_tensorflow_version() -> str | None:
    """This machine's TensorFlow version, without importing TensorFlow."""
    for name in ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tensorflow-intel", "tf-nightly", "tf-nightly-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _adc_project() -> str | None:
    try:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError
    except ImportError:
        return None
    try:
        _, project = google.auth.default(scopes=SCOPES)
    except DefaultCredentialsError:
        return None
    return project


def _no_credentials_error() -> SpecError:
    return SpecError(
        "provider: gcp needs Google Cloud credentials and none were found. dsctl uses Application Default "
        "Credentials: run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
        "service account key file, or run dsctl on a VM with a service account."
    )


def check_credentials(settings: GcpSettings) -> None:
    """Fail early (SpecError, exit 2) when an API that is not overridden has no credentials."""
    if settings.compute_endpoint and settings.tpu_endpoint and settings.crm_endpoint and settings.storage_host:
        return
    try:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError
    except ImportError:
        raise SpecError("provider: gcp needs the Google Cloud client libraries: pip install 'dsctl[gcp]'.") from None
    try:
        google.auth.default(scopes=SCOPES)
    except DefaultCredentialsError:
        raise _no_credentials_error() from None


def resolve(spec: JobSpec, *, check_creds: bool = True) -> GcpSettings:
    """The run's settings; SpecError (exit 2) when project, zone or credentials are missing."""
    g = spec.gcp or GcpSpec()
    env = os.environ
    overridden = bool(env.get("DSCTL_GCE_ENDPOINT"))
    project = g.project or env.get("GOOGLE_CLOUD_PROJECT") or env.get("CLOUDSDK_CORE_PROJECT")
    if not project and not overridden:
        project = _adc_project()
    if not project:
        raise SpecError(
            "provider: gcp needs a Google Cloud project: set gcp.project in the spec, or GOOGLE_CLOUD_PROJECT in "
            "the environment, or a default project for Application Default Credentials "
            "(`gcloud config set project P` then `gcloud auth application-default login`).",
            field="gcp.project",
        )
    if not GCP_PROJECT_RE.match(project):
        raise SpecError(f"the project id {project!r} (from the environment or the credentials) is not a Google Cloud "
                        "project id: 6-30 lower-case letters, digits or dashes, starting with a letter.",
                        field="gcp.project")
    zone = g.zone or env.get("CLOUDSDK_COMPUTE_ZONE")
    if not zone:
        raise SpecError(
            "provider: gcp needs a zone to create the machines in: set gcp.zone in the spec (e.g. us-central1-a; "
            "TPU v2-8 VMs are offered in us-central1-b, -c and -f) or CLOUDSDK_COMPUTE_ZONE in the environment.",
            field="gcp.zone",
        )
    software = resolve_software(spec, local_tensorflow_version())
    ssh_port = int(env.get("DSCTL_SSH_PORT") or g.ssh_port)
    python = env.get("DSCTL_REMOTE_PYTHON") or g.python or (BOOTSTRAP_PYTHON if g.bootstrap else "python3")
    settings = GcpSettings(
        project=project, zone=zone, network=g.network, subnetwork=g.subnetwork, service_account=g.service_account,
        public_ips=g.public_ips, ssh_user=g.ssh_user, ssh_port=ssh_port, boot_disk_gb=g.boot_disk_gb,
        boot_disk_type=g.boot_disk_type, bucket=g.bucket or f"{project}-dsctl", dispatcher_port=g.dispatcher_port,
        worker_port=g.worker_port, tensorflow_version=software.tensorflow_version, bootstrap=g.bootstrap, python=python,
        remote_dir=g.remote_dir, running_timeout_s=g.running_timeout_s, tpu_timeout_s=g.tpu_timeout_s,
        ssh_timeout_s=g.ssh_timeout_s, startup_timeout_s=g.startup_timeout_s, ready_timeout_s=g.ready_timeout_s,
        outage_limit_s=g.outage_limit_s, max_duration_s=g.max_duration_s, labels=dict(g.labels), software=software.as_dict(),
    ).with_env_endpoints()
    if check_creds:
        check_credentials(settings)
    return settings
