"""SSH keys through OS Login: the run's public key registered for the caller's identity, never in metadata.

Company projects enforce OS Login by organization policy (`constraints/compute.requireOsLogin`
refuses any VM that sets `enable-oslogin` to false), and instance metadata would override a
project's OS Login setting, a silent security downgrade. So every VM of a run is created with
OS Login on, and the key dsctl connects with is registered with the OS Login API for whoever
runs dsctl: the user on their machine, the VMs' service account for the run's supervisor on
its dispatcher VM (which makes and registers a key of its own: no private key ever leaves the
machine that made it). The key expires on its own after the run's longest life, so a run that
is never taken down leaves no key that works; `dsctl down` deletes it sooner.

The POSIX username to connect as is the one OS Login's login profile gives (for
`jane@example.com` typically `jane_example_com`, for a service account `sa_<id>`): dsctl
never makes one up.
"""

from __future__ import annotations

import time

from .clients import Clients
from .errors import GcpError, from_api_error
from .keys import KeyPair
from .retry import call
from .state import Login

KEY_MARGIN_S = 3600.0  # a registered key outlives the run's longest life by this much


def register(clients: Clients, key: KeyPair, lifetime_s: float) -> Login:
    """Register `key` for the caller on the run's project; the login to SSH as."""
    from google.api_core import exceptions as gx
    from google.cloud.oslogin_v1 import common

    account = clients.caller()
    expires_at = time.time() + lifetime_s + KEY_MARGIN_S
    try:
        # A key is identified by its fingerprint: importing it again is the same import, so it is retried as reads.
        response = call(clients.oslogin.import_ssh_public_key, parent=f"users/{account}",
                        project_id=clients.settings.project,
                        ssh_public_key=common.SshPublicKey(key=key.public, expiration_time_usec=int(expires_at * 1e6)),
                        doing=f"registering the run's SSH key with OS Login for {account}")
    except gx.GoogleAPICallError as exc:
        raise from_api_error(exc, doing=f"registering the run's SSH key with OS Login for {account}") from exc
    profile = response.login_profile
    accounts = list(profile.posix_accounts)
    chosen = next((a for a in accounts if a.primary), accounts[0] if accounts else None)
    if chosen is None or not chosen.username:
        raise GcpError(f"OS Login gave {account} no POSIX account on project {clients.settings.project}, so dsctl "
                       "cannot SSH to the run's VMs as it. Grant it roles/compute.osLogin on the project "
                       "(gcloud projects add-iam-policy-binding PROJECT --member=user:EMAIL "
                       "--role=roles/compute.osLogin), or ask the project's administrator.")
    fingerprint = next((fp for fp, k in profile.ssh_public_keys.items() if k.key.strip() == key.public.strip()), "")
    return Login(account=account, username=chosen.username, fingerprint=fingerprint, expires_at=expires_at)


def unregister(clients: Clients, login: Login) -> None:
    """Delete the key from OS Login (it would expire anyway); a key already gone is no error."""
    from google.api_core import exceptions as gx

    if not login.fingerprint:
        return
    try:
        call(clients.oslogin.delete_ssh_public_key, name=f"users/{login.account}/sshPublicKeys/{login.fingerprint}",
             doing=f"deleting the run's SSH key from OS Login for {login.account}")
    except gx.NotFound:
        pass
    except gx.GoogleAPICallError as exc:
        raise from_api_error(exc, doing=f"deleting the run's SSH key from OS Login for {login.account}") from exc
