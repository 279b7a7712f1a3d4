"""IAM v1 service accounts over REST: get, create, and an account's own IAM policy.

Google's Python library for this API (google-cloud-iam, `iam_admin_v1`) speaks gRPC only, and
every other API dsctl calls goes over REST (one transport, one endpoint override per API, the
same loopback stand-ins in tests). So this is the REST API itself
(https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts), through
google-auth's authorized session; an error answer becomes the google.api_core exception the
client libraries raise (`retry.call` and `errors.py` treat it like theirs).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

DEFAULT_ENDPOINT = "https://iam.googleapis.com"


@dataclass(frozen=True)
class ServiceAccount:
    email: str
    unique_id: str
    name: str  # projects/PROJECT/serviceAccounts/EMAIL


class IamRest:
    """The calls dsctl makes; each takes (and ignores) the `retry` and `timeout` that retry.call passes."""

    def __init__(self, credentials, endpoint: str | None):
        from google.auth.transport.requests import AuthorizedSession

        self._session = AuthorizedSession(credentials)
        self._base = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        if "://" not in self._base:
            self._base = "https://" + self._base

    def _request(self, method: str, path: str, body: dict | None = None, timeout: float | None = 60.0) -> dict:
        from google.api_core import exceptions as gx

        response = self._session.request(method, f"{self._base}/v1/{path}", json=body, timeout=timeout)
        if response.status_code >= 400:
            raise gx.from_http_response(response)
        return response.json() if response.content else {}

    def get_service_account(self, project: str, email: str, *, retry=None, timeout: float | None = 60.0
                            ) -> ServiceAccount:
        """projects.serviceAccounts.get; google.api_core NotFound if there is none."""
        data = self._request("GET", f"projects/{project}/serviceAccounts/{quote(email, safe='@')}", timeout=timeout)
        return _account(data)

    def create_service_account(self, project: str, account_id: str, display_name: str, description: str, *,
                               retry=None, timeout: float | None = 60.0) -> ServiceAccount:
        """projects.serviceAccounts.create; google.api_core Conflict if it exists."""
        body = {"accountId": account_id, "serviceAccount": {"displayName": display_name, "description": description}}
        return _account(self._request("POST", f"projects/{project}/serviceAccounts", body, timeout=timeout))

    def get_account_policy(self, project: str, email: str, *, retry=None, timeout: float | None = 60.0) -> dict:
        """projects.serviceAccounts.getIamPolicy: who may act as the account (the Policy as JSON)."""
        return self._request("POST", f"projects/{project}/serviceAccounts/{quote(email, safe='@')}:getIamPolicy",
                             {}, timeout=timeout)

    def set_account_policy(self, project: str, email: str, policy: dict, *, retry=None,
                           timeout: float | None = 60.0) -> dict:
        """projects.serviceAccounts.setIamPolicy, with the etag read (a concurrent change: Conflict/Aborted)."""
        return self._request("POST", f"projects/{project}/serviceAccounts/{quote(email, safe='@')}:setIamPolicy",
                             {"policy": policy}, timeout=timeout)


    def test_account_permissions(self, email: str, permissions: list[str], *, retry=None,
                                 timeout: float | None = 60.0) -> list[str]:
        """projects.serviceAccounts.testIamPermissions: which of `permissions` the caller holds on the account itself
        (iam.serviceAccounts.actAs is granted there, or inherited from the project); NotFound if there is none."""
        data = self._request("POST", f"projects/-/serviceAccounts/{quote(email, safe='@')}:testIamPermissions",
                             {"permissions": list(permissions)}, timeout=timeout)
        return list(data.get("permissions", []))


def _account(data: dict) -> ServiceAccount:
    return ServiceAccount(email=data.get("email", ""), unique_id=data.get("uniqueId", ""), name=data.get("name", ""))
