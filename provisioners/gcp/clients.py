"""The Google Cloud API clients one run uses, built with its endpoints and credentials.

Compute Engine and Cloud TPU clients are REST clients, one set per thread: each
holds its own HTTP connection, so hundreds of calls can be in flight at once
(one shared client would funnel them through a pool of ten connections).
An API whose endpoint is overridden (tests, private endpoints) gets anonymous
credentials; the others use Application Default Credentials. Cloud Resource
Manager (the project's number, the caller's permissions) is a REST client too.
"""

from __future__ import annotations

import threading
from functools import cached_property
from typing import TYPE_CHECKING

from .settings import SCOPES, GcpSettings

if TYPE_CHECKING:
    from google.auth.credentials import Credentials


class Clients:
    def __init__(self, settings: GcpSettings):
        self.settings = settings
        self._local = threading.local()
        self._lock = threading.Lock()
        self._adc: Credentials | None = None

    # -- credentials -------------------------------------------------------------
    def _credentials(self, overridden: bool):
        if overridden:
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()
        with self._lock:
            if self._adc is None:
                import google.auth

                self._adc, _ = google.auth.default(scopes=SCOPES)
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

        if self.settings.storage_host:
            # The client reads STORAGE_EMULATOR_HOST itself; anonymous credentials, explicit project.
            from google.auth.credentials import AnonymousCredentials

            return storage.Client(project=self.settings.project, credentials=AnonymousCredentials())
        return storage.Client(project=self.settings.project, credentials=self._credentials(False))
