"""Resolved settings of one run on Google Cloud: spec's `gcp:` section + environment + credentials.

Project and zone come from the spec, else the environment (GOOGLE_CLOUD_PROJECT,
CLOUDSDK_CORE_PROJECT; CLOUDSDK_COMPUTE_ZONE), else (project only) Application
Default Credentials. Endpoints can be overridden for tests and private endpoints:
DSCTL_GCE_ENDPOINT (Compute Engine), DSCTL_TPU_ENDPOINT (Cloud TPU),
DSCTL_CRM_ENDPOINT (Cloud Resource Manager), DSCTL_IAM_ENDPOINT (IAM: the VMs'
service account), DSCTL_ORGPOLICY_ENDPOINT (Organization Policy),
DSCTL_OSLOGIN_ENDPOINT (OS Login), DSCTL_SERVICEUSAGE_ENDPOINT (Service Usage: the
APIs that are on), DSCTL_QUOTAS_ENDPOINT (Cloud Quotas: TPU quota), STORAGE_EMULATOR_HOST
(Cloud Storage); every API is called with Application Default Credentials
(clients.py), and where the credentials do not say who the caller is, CLOUDSDK_CORE_ACCOUNT
does (`Clients.caller`). DSCTL_SSH_PORT and DSCTL_REMOTE_PYTHON override the spec's
ssh_port and python.

The settings are plain data, saved in the run's state, so `dsctl down` in a new
process talks to the same project, zone and endpoints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from importlib import metadata

from dsctl.specs import SpecError
from dsctl.specs.schema import GCP_PROJECT_RE, GcpSpec, JobSpec

from .software import Software
from .software import resolve as resolve_software

BOOTSTRAP_PYTHON = "/opt/dsctl/venv/bin/python"  # the venv the startup script makes (gcp.bootstrap)
PLAIN_PYTHON = "python3"  # the VMs' Python when the image brings TensorFlow and dsctl (gcp.bootstrap: false)
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


def _spec_default(name: str):
    """GcpSpec's default for the field `name`: every Google Cloud default is written once, in the spec's schema
    (specs/schema.py), and a settings object made without a spec (a run found by label) has the same."""
    spec_field = GcpSpec.model_fields[name]
    return field(default_factory=lambda: spec_field.get_default(call_default_factory=True))


@dataclass
class GcpSettings:
    """The spec's `gcp:` section as resolved for one run. A field named as one of GcpSpec's is that field, with its
    default; the others are resolved from the environment, the credentials or the machines of the run."""

    project: str
    zone: str
    network: str = _spec_default("network")
    subnetwork: str | None = _spec_default("subnetwork")
    service_account: str | None = _spec_default("service_account")
    # The account each kind of VM runs as (accounts.py: supervisor, workers), once the checks decided it.
    vm_accounts: dict[str, str] = field(default_factory=dict)
    shielded_vm: bool = _spec_default("shielded_vm")
    shielded_kinds: list[str] = field(default_factory=list)  # VM kinds whose boot image supports Shielded VM
    standing_rules: bool = False  # the network's standing dsctl firewall rules, not the run's own (network.py)
    public_ips: bool = _spec_default("public_ips")
    ssh_port: int = _spec_default("ssh_port")  # DSCTL_SSH_PORT overrides the spec's
    boot_disk_gb: int = _spec_default("boot_disk_gb")
    boot_disk_type: str = _spec_default("boot_disk_type")
    bucket: str = ""  # gcp.bucket, else <project>-dsctl
    dispatcher_port: int = _spec_default("dispatcher_port")
    worker_port: int = _spec_default("worker_port")
    bootstrap: bool = _spec_default("bootstrap")
    python: str = PLAIN_PYTHON  # DSCTL_REMOTE_PYTHON, else gcp.python, else the bootstrap venv's or python3
    remote_dir: str = _spec_default("remote_dir")
    running_timeout_s: float = _spec_default("running_timeout_s")
    tpu_timeout_s: float = _spec_default("tpu_timeout_s")
    ssh_timeout_s: float = _spec_default("ssh_timeout_s")
    startup_timeout_s: float = _spec_default("startup_timeout_s")
    ready_timeout_s: float = _spec_default("ready_timeout_s")
    outage_limit_s: float = _spec_default("outage_limit_s")
    max_duration_s: float = _spec_default("max_duration_s")
    heartbeat_limit_s: float = _spec_default("heartbeat_limit_s")
    labels: dict[str, str] = _spec_default("labels")
    software: Software | None = None  # the TensorFlow and images per VM kind (None: a run found by label needs none)
    compute_endpoint: str | None = None  # DSCTL_GCE_ENDPOINT
    tpu_endpoint: str | None = None  # DSCTL_TPU_ENDPOINT
    crm_endpoint: str | None = None  # DSCTL_CRM_ENDPOINT
    iam_endpoint: str | None = None  # DSCTL_IAM_ENDPOINT
    orgpolicy_endpoint: str | None = None  # DSCTL_ORGPOLICY_ENDPOINT
    oslogin_endpoint: str | None = None  # DSCTL_OSLOGIN_ENDPOINT
    serviceusage_endpoint: str | None = None  # DSCTL_SERVICEUSAGE_ENDPOINT
    quotas_endpoint: str | None = None  # DSCTL_QUOTAS_ENDPOINT (Cloud Quotas: TPU quota)
    storage_host: str | None = None  # STORAGE_EMULATOR_HOST

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    @property
    def network_project(self) -> str:
        """The project that holds the run's network: a Shared VPC host's when gcp.network names it
        (projects/HOST/global/networks/NET), else the run's own. Firewall rules and subnets live there."""
        for value in (self.network, self.subnetwork or ""):
            parts = value.split("/")
            if "projects" in parts:
                return parts[parts.index("projects") + 1]
        return self.project

    @property
    def firewall_project(self) -> str | None:
        """The project that holds the run's own firewall rules; None where the run makes none (it uses the network's
        standing dsctl rules, network.py)."""
        return None if self.standing_rules else self.network_project

    def account_for(self, role: str) -> str | None:
        """The service account a VM of `role` (dispatcher | worker | trainer) runs as: the workers' own, else the
        supervisor's (accounts.py)."""
        return self.vm_accounts.get("workers" if role == "worker" else "supervisor")

    @property
    def run_software(self) -> Software:
        """`software`, for the steps of a run made from its spec: resolve() sets it (only a run found by label has
        none, and it makes nothing)."""
        assert self.software is not None, "settings resolved from a spec have the run's software"
        return self.software

    @property
    def tensorflow_version(self) -> str:
        """The one TensorFlow every VM of the run runs."""
        return self.run_software.tensorflow_version

    @classmethod
    def from_dict(cls, data: dict) -> GcpSettings:
        """Settings as a state file holds them (dataclasses.asdict); keys this dsctl does not know are ignored."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "software" in values:
            values["software"] = Software.from_dict(values["software"]) if values["software"] else None
        return cls(**values)

    def with_env_endpoints(self) -> GcpSettings:
        """The endpoints of *this* process's environment (a `dsctl down` may run with other ones)."""
        for attribute, variable in ENDPOINT_VARIABLES.items():
            setattr(self, attribute, os.environ.get(variable) or None)
        return self

    def endpoint_environment(self) -> dict[str, str]:
        """The variables that point another process (the run's supervisor on its VM) at these endpoints."""
        return {variable: value for attribute, variable in ENDPOINT_VARIABLES.items()
                if (value := getattr(self, attribute))}


# Each overridable endpoint and the environment variable that overrides it.
ENDPOINT_VARIABLES = {
    "compute_endpoint": "DSCTL_GCE_ENDPOINT", "tpu_endpoint": "DSCTL_TPU_ENDPOINT",
    "crm_endpoint": "DSCTL_CRM_ENDPOINT", "iam_endpoint": "DSCTL_IAM_ENDPOINT",
    "orgpolicy_endpoint": "DSCTL_ORGPOLICY_ENDPOINT", "oslogin_endpoint": "DSCTL_OSLOGIN_ENDPOINT",
    "serviceusage_endpoint": "DSCTL_SERVICEUSAGE_ENDPOINT", "quotas_endpoint": "DSCTL_QUOTAS_ENDPOINT",
    "storage_host": "STORAGE_EMULATOR_HOST",
}


def local_tensorflow_version() -> str | None:
    """This machine's TensorFlow version, without importing TensorFlow."""
    for name in ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tensorflow-intel", "tf-nightly", "tf-nightly-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def adc_project() -> str | None:
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


def no_credentials_error() -> SpecError:
    return SpecError(
        "provider: gcp needs Google Cloud credentials and none were found. dsctl uses Application Default "
        "Credentials: run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
        "service account key file, or run dsctl on a VM with a service account."
    )


def check_credentials(settings: GcpSettings) -> None:
    """Fail early (SpecError, exit 2) when an API that is not overridden has no credentials."""
    if settings.compute_endpoint and settings.tpu_endpoint and settings.crm_endpoint and settings.storage_host:
        return  # every API a run needs is elsewhere (the others, if not, say so when first used: clients.py)
    try:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError
    except ImportError:
        raise SpecError("provider: gcp needs the Google Cloud client libraries: pip install 'dsctl[gcp]'.") from None
    try:
        google.auth.default(scopes=SCOPES)
    except DefaultCredentialsError:
        raise no_credentials_error() from None


def resolve(spec: JobSpec, *, check_creds: bool = True, project: str | None = None,
            zone: str | None = None) -> GcpSettings:
    """The run's settings; SpecError (exit 2) when project, zone or credentials are missing. `project` and `zone`
    (dsctl check gcp --project --zone) come before the spec's."""
    g = spec.gcp or GcpSpec()
    env = os.environ
    overridden = bool(env.get("DSCTL_GCE_ENDPOINT"))
    project = project or g.project or env.get("GOOGLE_CLOUD_PROJECT") or env.get("CLOUDSDK_CORE_PROJECT")
    if not project and not overridden:
        project = adc_project()
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
    zone = zone or g.zone or env.get("CLOUDSDK_COMPUTE_ZONE")
    if not zone:
        raise SpecError(
            "provider: gcp needs a zone to create the machines in: set gcp.zone in the spec (e.g. us-central1-a; "
            "TPU v2-8 VMs are offered in us-central1-b and -c) or CLOUDSDK_COMPUTE_ZONE in the environment.",
            field="gcp.zone",
        )
    software = resolve_software(spec, local_tensorflow_version())
    same = {f.name: getattr(g, f.name) for f in fields(GcpSettings) if f.name in GcpSpec.model_fields}
    settings = GcpSettings(**{
        **same, "project": project, "zone": zone, "labels": dict(g.labels), "bucket": g.bucket or f"{project}-dsctl",
        "ssh_port": int(env.get("DSCTL_SSH_PORT") or g.ssh_port),
        "python": env.get("DSCTL_REMOTE_PYTHON") or g.python or (BOOTSTRAP_PYTHON if g.bootstrap else PLAIN_PYTHON),
        "software": software,
    }).with_env_endpoints()
    if check_creds:
        check_credentials(settings)
    return settings
