"""IAM, Organization Policy and OS Login as dsctl calls them: the endpoints, who the caller is, and the stand-in.

The clients are the real Google libraries (and iam.py's REST calls) against the loopback
stand-in; the stand-in refuses what Google's documentation says the real APIs refuse.
"""

from __future__ import annotations

import pytest
from conftest import CALLER, PROJECT, act_as

from dsctl.specs import SpecError

PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl dsctl"


def _clients():
    from dsctl.provisioners.gcp.clients import Clients
    from dsctl.provisioners.gcp.settings import GcpSettings

    return Clients(GcpSettings(project=PROJECT, zone="us-central1-b").with_env_endpoints())


def test_each_api_endpoint_comes_from_its_own_variable(monkeypatch):
    from dsctl.provisioners.gcp.clients import Clients
    from dsctl.provisioners.gcp.settings import GcpSettings

    ports = {"IAM": 9101, "ORGPOLICY": 9102, "OSLOGIN": 9103, "CRM": 9104}
    for api, port in ports.items():
        monkeypatch.setenv(f"DSCTL_{api}_ENDPOINT", f"http://127.0.0.1:{port}")
    settings = GcpSettings(project="acme-ml", zone="us-central1-b").with_env_endpoints()
    assert (settings.iam_endpoint, settings.orgpolicy_endpoint, settings.oslogin_endpoint) == (
        "http://127.0.0.1:9101", "http://127.0.0.1:9102", "http://127.0.0.1:9103")
    clients = Clients(settings)
    assert clients.iam._base == "http://127.0.0.1:9101"
    assert clients.orgpolicy._transport._host == "http://127.0.0.1:9102"
    assert clients.oslogin._transport._host == "http://127.0.0.1:9103"
    assert clients.projects._transport._host == "http://127.0.0.1:9104"
    # Settings saved in a run's state keep them, so `dsctl down` elsewhere finds the same APIs.
    from dataclasses import asdict

    assert GcpSettings.from_dict(asdict(settings)).oslogin_endpoint == "http://127.0.0.1:9103"


def test_the_caller_is_who_gcloud_names_when_the_credentials_do_not_say(monkeypatch, tmp_path):
    from dsctl.provisioners.gcp.clients import Clients
    from dsctl.provisioners.gcp.settings import GcpSettings

    monkeypatch.setenv("DSCTL_OSLOGIN_ENDPOINT", "http://127.0.0.1:9")  # anonymous credentials
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.delenv("CLOUDSDK_CORE_ACCOUNT", raising=False)
    settings = GcpSettings(project="acme-ml", zone="us-central1-b").with_env_endpoints()
    with pytest.raises(SpecError) as info:
        Clients(settings).caller()
    assert "CLOUDSDK_CORE_ACCOUNT" in str(info.value) and "gcloud config set account" in str(info.value)
    # gcloud's active configuration names it ...
    config = tmp_path / "gcloud" / "configurations"
    config.mkdir(parents=True)
    (tmp_path / "gcloud" / "active_config").write_text("work")
    (config / "config_work").write_text("[core]\naccount = jane@example.com\nproject = acme-ml\n")
    assert Clients(settings).caller() == "jane@example.com"
    # ... and CLOUDSDK_CORE_ACCOUNT before it, as for gcloud itself.
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "ops@example.com")
    assert Clients(settings).caller() == "ops@example.com"


def test_credentials_that_name_their_account_win():
    from google.oauth2 import credentials as user_credentials

    from dsctl.provisioners.gcp.clients import _from_credentials

    assert _from_credentials(user_credentials.Credentials("t", account="jane@example.com")) == "jane@example.com"
    assert _from_credentials(user_credentials.Credentials("t")) is None
    from google.auth.credentials import AnonymousCredentials

    assert _from_credentials(AnonymousCredentials()) is None


def test_os_login_keys_through_the_real_client(cloud, monkeypatch, tmp_path):
    from google.api_core import exceptions as gx
    from google.cloud.oslogin_v1 import common

    clients = _clients()
    assert clients.caller() == CALLER
    cloud.posix_usernames.clear()  # the usernames Google derives, not those set for the test sshd
    monkeypatch.setattr(cloud, "every_posix_username", None)
    reply = clients.oslogin.import_ssh_public_key(parent=f"users/{CALLER}", project_id=PROJECT,
                                                  ssh_public_key=common.SshPublicKey(key=PUBLIC_KEY))
    account = reply.login_profile.posix_accounts[0]
    assert account.username == "tester_example_com" and account.primary
    (fingerprint, key), = reply.login_profile.ssh_public_keys.items()
    assert key.key == PUBLIC_KEY and len(fingerprint) == 64
    assert cloud.oslogin_keys("tester_example_com") == [PUBLIC_KEY]
    profile = clients.oslogin.get_login_profile(request={"name": f"users/{CALLER}", "project_id": PROJECT})
    assert list(profile.ssh_public_keys) == [fingerprint]
    clients.oslogin.delete_ssh_public_key(name=f"users/{CALLER}/sshPublicKeys/{fingerprint}")
    assert cloud.oslogin_keys("tester_example_com") == []
    with pytest.raises(gx.NotFound):
        clients.oslogin.delete_ssh_public_key(name=f"users/{CALLER}/sshPublicKeys/{fingerprint}")
    with pytest.raises(gx.BadRequest):
        clients.oslogin.import_ssh_public_key(parent=f"users/{CALLER}", ssh_public_key=common.SshPublicKey(key="nope"))
    # An expired key no longer lets anyone in; a service account's username is sa_<its unique id>.
    clients.oslogin.import_ssh_public_key(parent=f"users/{CALLER}", ssh_public_key=common.SshPublicKey(
        key=PUBLIC_KEY, expiration_time_usec=1))
    assert cloud.oslogin_keys("tester_example_com") == []
    sa = clients.iam.create_service_account(PROJECT, "robot-one", "Robot", "")
    # A profile is its owner's: nobody else registers keys in it ("must be the authenticated user").
    with pytest.raises(gx.Forbidden):
        clients.oslogin.import_ssh_public_key(parent=f"users/{sa.email}", ssh_public_key=common.SshPublicKey(
            key=PUBLIC_KEY))
    act_as(monkeypatch, cloud, sa.email, tmp_path)
    reply = _clients().oslogin.import_ssh_public_key(parent=f"users/{sa.email}",
                                                     ssh_public_key=common.SshPublicKey(key=PUBLIC_KEY))
    assert reply.login_profile.posix_accounts[0].username == f"sa_{sa.unique_id}"
    assert cloud.oslogin_keys(f"sa_{sa.unique_id}") == [PUBLIC_KEY]


def test_service_accounts_and_policies_as_the_apis_refuse_them(cloud, monkeypatch, tmp_path):
    from google.api_core import exceptions as gx

    clients = _clients()
    for bad in ("short", "a" * 31, "Upper-case", "ends-with-", "9starts-with-digit"):
        with pytest.raises(gx.BadRequest, match="account ID"):
            clients.iam.create_service_account(PROJECT, bad, "x", "")
    sa = clients.iam.create_service_account(PROJECT, "dsctl-vms", "dsctl VMs", "why")
    assert sa.email == f"dsctl-vms@{PROJECT}.iam.gserviceaccount.com" and sa.unique_id.isdigit()
    assert clients.iam.get_service_account(PROJECT, sa.email) == sa
    with pytest.raises(gx.Conflict):
        clients.iam.create_service_account(PROJECT, "dsctl-vms", "again", "")
    with pytest.raises(gx.NotFound):
        clients.iam.get_service_account(PROJECT, f"nobody-here@{PROJECT}.iam.gserviceaccount.com")
    # The project's policy: read-modify-write with its etag; a stale etag is refused (409 ABORTED).
    policy = clients.projects.get_iam_policy(request={"resource": f"projects/{PROJECT}"})
    number = cloud.project_number(PROJECT)
    assert any(b.role == "roles/editor" and f"serviceAccount:{number}-compute@developer.gserviceaccount.com"
               in b.members for b in policy.bindings)  # an older project: its default account is an Editor
    policy.bindings.add(role="roles/storage.objectAdmin", members=[f"serviceAccount:{sa.email}"])
    clients.projects.set_iam_policy(request={"resource": f"projects/{PROJECT}", "policy": policy})
    assert cloud.roles_of(PROJECT, sa.email) == {"roles/storage.objectAdmin"}
    with pytest.raises(gx.Conflict, match="concurrent policy changes"):
        clients.projects.set_iam_policy(request={"resource": f"projects/{PROJECT}", "policy": policy})
    fresh = clients.projects.get_iam_policy(request={"resource": f"projects/{PROJECT}"})
    fresh.bindings.add(role="roles/viewer", members=[f"serviceAccount:ghost-acct@{PROJECT}.iam.gserviceaccount.com"])
    with pytest.raises(gx.BadRequest, match="does not exist"):
        clients.projects.set_iam_policy(request={"resource": f"projects/{PROJECT}", "policy": fresh})
    # Someone who may read the policy and nothing else.
    reader = cloud.add_custom_role(PROJECT, "policyReader", ["resourcemanager.projects.getIamPolicy"])
    cloud.grant("user:auditor@example.com", reader, f"projects/{PROJECT}")
    act_as(monkeypatch, cloud, "auditor@example.com", tmp_path)
    limited = _clients()
    assert limited.projects.get_iam_policy(request={"resource": f"projects/{PROJECT}"}).bindings
    with pytest.raises(gx.Forbidden, match="iam.serviceAccounts.create"):
        limited.iam.create_service_account(PROJECT, "other-one", "x", "")
    with pytest.raises(gx.Forbidden, match="setIamPolicy"):
        limited.projects.set_iam_policy(request={"resource": f"projects/{PROJECT}", "policy": fresh})
    # A call with no token at all is not anyone: 401, as is a token the service did not issue.
    import urllib.error
    import urllib.request

    for headers in ({}, {"Authorization": "Bearer ya29.forged"}):
        request = urllib.request.Request(f"{cloud.endpoint}/v3/projects/{PROJECT}:getIamPolicy", data=b"{}",
                                         headers=headers, method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        assert info.value.code == 401


def test_effective_organization_policies(cloud, monkeypatch, tmp_path):
    from google.api_core import exceptions as gx

    clients = _clients()
    name = f"projects/{PROJECT}/policies/compute.vmExternalIpAccess"
    assert not clients.orgpolicy.get_effective_policy(name=name).spec.rules
    cloud.set_org_policy("compute.vmExternalIpAccess", [{"denyAll": True}])
    rules = clients.orgpolicy.get_effective_policy(name=name).spec.rules
    assert len(rules) == 1 and rules[0].deny_all
    # Someone without orgpolicy.policy.get (Compute Admin holds none of it) may not read them.
    cloud.grant("user:operator@example.com", "roles/compute.admin", f"projects/{PROJECT}")
    act_as(monkeypatch, cloud, "operator@example.com", tmp_path)
    with pytest.raises(gx.Forbidden):
        _clients().orgpolicy.get_effective_policy(name=name)
