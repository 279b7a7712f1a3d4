"""The Google Cloud API clients one run uses, built with its endpoints and credentials.

Compute Engine and Cloud TPU clients are REST clients, one set per thread: each
holds its own HTTP connection, so hundreds of calls can be in flight at once
(one shared client would funnel them through a pool of ten connections).
Every API is called with Application Default Credentials, at its own endpoint or one
that overrides it (a private endpoint, a test's stand-in); only where there are no
credentials at all is an overridden endpoint called anonymously. Cloud Resource
Manager (the project's number, the caller's permissions, the project's IAM policy),
IAM (the VMs' service account, iam.py), Organization Policy (the policies that
would refuse a run) and OS Login (SSH keys for the caller) are REST clients too.
`caller()` says who the credentials are: OS Login keys and IAM members name it.
"""

from __future__ import annotations

import configparser
import os
import threading
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from dsctl.specs import SpecError

from .iam import IamRest
from .settings import SCOPES, GcpSettings, no_credentials_error

if TYPE_CHECKING:
    from google.auth.credentials import Credentials


class Clients:
    def __init__(self, settings: GcpSettings):
        self.settings = settings
        self._local = threading.local()
        self._lock = threading.Lock()
        self._adc: Credentials | None = None
        self._caller: str | None = None

    # -- credentials -------------------------------------------------------------
    def _credentials(self, overridden: bool):
        """Application Default Credentials (one set for every API: they refresh themselves); an endpoint that is
        overridden is called without credentials only where there are none (SpecError elsewhere)."""
        with self._lock:
            if self._adc is None:
                import google.auth
                from google.auth.exceptions import DefaultCredentialsError

                try:
                    self._adc, _ = google.auth.default(scopes=SCOPES)
                except DefaultCredentialsError:
                    if not overridden:
                        raise no_credentials_error() from None
                    from google.auth.credentials import AnonymousCredentials

                    return AnonymousCredentials()
            return self._adc

    def _options(self, endpoint: str | None):
        from google.api_core.client_options import ClientOptions

        return ClientOptions(api_endpoint=endpoint) if endpoint else None

    # -- Compute Engine (per thread) ------------------------------------------------
    def _compute(self, name: str):
        cache = self._local.__dict__
        if name not in cache:
            from google.cloud import compute_v1

            endpoint = self.settings.compute_endpoint
            cls = getattr(compute_v1, name)
            cache[name] = cls(credentials=self._credentials(bool(endpoint)), client_options=self._options(endpoint))
        return cache[name]

    @property
    def instances(self):
        return self._compute("InstancesClient")

    @property
    def zone_operations(self):
        return self._compute("ZoneOperationsClient")

    @property
    def firewalls(self):
        return self._compute("FirewallsClient")

    @property
    def global_operations(self):
        return self._compute("GlobalOperationsClient")

    # Read-only catalogs and the network, for the checks before anything is created (preflight.py).
    @property
    def machine_types(self):
        return self._compute("MachineTypesClient")

    @property
    def accelerator_types(self):
        return self._compute("AcceleratorTypesClient")

    @property
    def images(self):
        return self._compute("ImagesClient")

    @property
    def networks(self):
        return self._compute("NetworksClient")

    @property
    def subnetworks(self):
        return self._compute("SubnetworksClient")

    @property
    def routers(self):
        return self._compute("RoutersClient")

    @property
    def regions(self):
        """regions.get: the region's quotas (quota.py)."""
        return self._compute("RegionsClient")

    # -- Cloud Resource Manager: the project's number and the caller's permissions ----------------
    @property
    def projects(self):
        cache = self._local.__dict__
        if "projects" not in cache:
            from google.cloud import resourcemanager_v3

            endpoint = self.settings.crm_endpoint
            cache["projects"] = resourcemanager_v3.ProjectsClient(
                credentials=self._credentials(bool(endpoint)), transport="rest", client_options=self._options(endpoint))
        return cache["projects"]

    def _rest(self, key: str, make):
        """A REST client of the Google library `make(credentials=..., transport="rest", client_options=...)`, one
        per thread like the others."""
        cache = self._local.__dict__
        if key not in cache:
            endpoint = getattr(self.settings, f"{key}_endpoint")
            cache[key] = make(credentials=self._credentials(bool(endpoint)), transport="rest",
                              client_options=self._options(endpoint))
        return cache[key]

    # -- IAM: the VMs' service account (iam.py) -----------------------------------------------------------
    @property
    def iam(self) -> IamRest:
        cache = self._local.__dict__
        if "iam" not in cache:
            endpoint = self.settings.iam_endpoint
            cache["iam"] = IamRest(self._credentials(bool(endpoint)), endpoint)
        return cache["iam"]

    # -- Organization Policy: the effective policies that would refuse a run (orgpolicy.py) --------------------
    @property
    def orgpolicy(self):
        from google.cloud import orgpolicy_v2

        return self._rest("orgpolicy", orgpolicy_v2.OrgPolicyClient)

    # -- OS Login: SSH keys registered for the caller (oslogin.py) -------------------------------------------
    @property
    def oslogin(self):
        """google.cloud.oslogin_v1.OsLoginServiceClient (REST) at DSCTL_OSLOGIN_ENDPOINT or Google's."""
        from google.cloud import oslogin_v1

        return self._rest("oslogin", oslogin_v1.OsLoginServiceClient)

    # -- Service Usage: which APIs are on (services.py); Cloud Quotas: TPU quota (quota.py) -------------------------
    @property
    def serviceusage(self):
        from google.cloud import service_usage_v1

        return self._rest("serviceusage", service_usage_v1.ServiceUsageClient)

    @property
    def quotas(self):
        from google.cloud import cloudquotas_v1

        return self._rest("quotas", cloudquotas_v1.CloudQuotasClient)

    # -- Compute Engine's projects: global quotas, the Shared VPC host ---------------------------------------------
    @property
    def compute_projects(self):
        return self._compute("ProjectsClient")

    # -- who is calling ---------------------------------------------------------------------------------------
    def caller(self) -> str:
        """The email of the account this process calls Google Cloud as (OS Login keys are registered for it; IAM
        bindings name it). From the credentials: a service account's email, or the signed-in user's account where
        google-auth knows it; where they do not say (anonymous credentials on a stand-in, user credentials without
        an account), the account gcloud names: CLOUDSDK_CORE_ACCOUNT, else gcloud's active configuration.
        SpecError (exit 2) saying how to name it when nothing does."""
        with self._lock:
            if self._caller is not None:
                return self._caller
        account = _from_credentials(self._credentials(bool(self.settings.oslogin_endpoint))) or gcloud_account()
        if not account:
            raise SpecError(
                "dsctl could not tell which Google account it calls Google Cloud as (the credentials do not say), "
                "and it needs to: SSH keys are registered with OS Login for that account. Set CLOUDSDK_CORE_ACCOUNT "
                "to its email (e.g. export CLOUDSDK_CORE_ACCOUNT=you@example.com), or `gcloud config set account "
                "you@example.com`.")
        with self._lock:
            self._caller = account
        return account

    # -- Cloud TPU (per thread) -----------------------------------------------------
    @property
    def tpu(self):
        cache = self._local.__dict__
        if "tpu" not in cache:
            from google.cloud import tpu_v2

            endpoint = self.settings.tpu_endpoint
            cache["tpu"] = tpu_v2.TpuClient(credentials=self._credentials(bool(endpoint)), transport="rest",
                                            client_options=self._options(endpoint))
        return cache["tpu"]

    # -- Cloud Storage (shared; the client is thread-safe for these calls) ---------------
    @cached_property
    def storage(self):
        from google.cloud import storage

        # At STORAGE_EMULATOR_HOST where it is set (the client reads it itself), with the same credentials.
        return storage.Client(project=self.settings.project,
                              credentials=self._credentials(bool(self.settings.storage_host)))


def _from_credentials(creds) -> str | None:
    """The account credentials are for, where google-auth exposes it (None for anonymous ones)."""
    email = getattr(creds, "service_account_email", None)
    if email == "default":  # on a VM: the metadata server names the account once the credentials are refreshed
        try:
            from google.auth.transport.requests import Request

            creds.refresh(Request())
            email = creds.service_account_email
        except Exception:
            email = None
    if email and email != "default":
        return email
    account = getattr(creds, "account", None)  # user credentials (gcloud auth application-default login)
    return account or None


def gcloud_account() -> str | None:
    """The account gcloud calls with: CLOUDSDK_CORE_ACCOUNT, else [core] account of gcloud's active configuration."""
    account = os.environ.get("CLOUDSDK_CORE_ACCOUNT")
    if account:
        return account
    config = Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
    try:
        active = (config / "active_config").read_text().strip() or "default"
    except OSError:
        active = "default"
    parser = configparser.ConfigParser()
    try:
        parser.read(config / "configurations" / f"config_{active}")
    except configparser.Error:
        return None
    return parser.get("core", "account", fallback=None) or None
