"""A run's dead man's switch: once its supervisor is gone, the run's VMs are deleted, with nobody running dsctl.

PROGRAM runs on every VM and TPU VM that runs as the run's supervisor account (the dispatcher and the trainers:
accounts.py), from the VM's startup script: as the systemd unit UNIT where systemd runs, else in a nohup'd loop. It
reads its configuration (lifetime.WatchdogConfig) from the metadata attribute lifetime.WATCHDOG_KEY, and every
`check_s` the generation of the run's heartbeat object in Cloud Storage, with the VM's service-account token from the
metadata server. When the generation has not changed for `limit_s` by this VM's own clock (or the object has not
appeared within `limit_s` of the watchdog's start), the supervisor is taken for gone and the watchdog reaps the run:
every other Compute Engine VM carrying the run's label (the workers, which may not delete anything themselves), every
TPU VM of the run (its queued resource with force, which deletes the node), then its own machine: the Compute
Engine instance the metadata server names, or for a TPU VM its queued resource. Several watchdogs may reap at once;
a VM already gone is no error. A heartbeat that cannot be read counts as not changed: a VM that cannot hear its
supervisor cannot be supervised either. Worker VMs run no watchdog: their account can delete nothing, and their
maxRunDuration bounds them should every watchdog of the run be gone too.

The metadata server is metadata.google.internal, or GCE_METADATA_HOST (as Google's own client
libraries read it) where a test stands in for it; the APIs' endpoints are in the configuration.
"""

from __future__ import annotations

import shlex

UNIT = "dsctl-watchdog.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
PROGRAM_PATH = "/opt/dsctl/watchdog.py"
LOG = "/var/log/dsctl-watchdog.log"  # where the watchdog writes without systemd (with it: the journal)
_EOF = "DSCTL_WATCHDOG_EOF"

PROGRAM = r'''
import json, os, sys, time, urllib.error, urllib.parse, urllib.request

MD = "http://%s/computeMetadata/v1/" % os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def log(msg):
    print("%s dsctl watchdog: %s" % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), msg), flush=True)


def metadata(path):
    req = urllib.request.Request(MD + path, headers={"Metadata-Flavor": "Google"})
    return NO_PROXY.open(req, timeout=10).read().decode()


def call(method, url, token):
    headers = {"Authorization": "Bearer " + token} if token else {}
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        with NO_PROXY.open(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def token():
    try:
        return json.loads(metadata("instance/service-accounts/default/token"))["access_token"]
    except Exception as exc:
        log("no access token from the metadata server: %s" % exc)
        return None


def configuration():
    while True:
        try:
            return json.loads(metadata("instance/attributes/dsctl-watchdog"))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                log("this VM has no dsctl-watchdog attribute: nothing to watch")
                sys.exit(0)
            log("reading the configuration: %s" % exc)
        except Exception as exc:
            log("reading the configuration: %s" % exc)
        time.sleep(5)


def generation(cfg):
    url = "%s/storage/v1/b/%s/o/%s" % (cfg["storage"].rstrip("/"), urllib.parse.quote(cfg["bucket"], safe=""),
                                       urllib.parse.quote(cfg["object"], safe=""))
    status, body = call("GET", url, token())
    if status == 404:
        return None
    if status != 200:
        raise RuntimeError("HTTP %d: %s" % (status, body[:200]))
    return json.loads(body)["generation"]


def instances_of_run(cfg, tok):
    """(name, zone) of every Compute Engine VM carrying the run's label, every page."""
    base = "%s/compute/v1/projects/%s/zones/%s/instances" % (cfg["compute"].rstrip("/"), cfg["project"], cfg["zone"])
    query = {"filter": 'labels.dsctl-run = "%s"' % cfg["run_label"], "maxResults": "500"}
    names = []
    while True:
        status, body = call("GET", base + "?" + urllib.parse.urlencode(query), tok)
        if status != 200:
            raise RuntimeError("listing the run's VMs: HTTP %d %s" % (status, body[:200]))
        page = json.loads(body)
        names += [i["name"] for i in page.get("items", [])]
        if not page.get("nextPageToken"):
            return names
        query["pageToken"] = page["nextPageToken"]


def queued_resources_of_run(cfg, tok):
    """Names of the run's TPU queued resources (named with the run's prefix; they carry no labels)."""
    base = "%s/v2/projects/%s/locations/%s/queuedResources" % (cfg["tpu"].rstrip("/"), cfg["project"], cfg["zone"])
    names, query = [], {"pageSize": "500"}
    while True:
        status, body = call("GET", base + "?" + urllib.parse.urlencode(query), tok)
        if status != 200:
            raise RuntimeError("listing the run's TPU VMs: HTTP %d %s" % (status, body[:200]))
        page = json.loads(body)
        names += [q["name"] for q in page.get("queuedResources", [])
                  if q["name"].rsplit("/", 1)[-1].startswith(cfg["tpu_prefix"] + "-")]
        if not page.get("nextPageToken"):
            return names
        query["pageToken"] = page["nextPageToken"]


def reap(cfg):
    """Delete the run's other VMs and TPU VMs; what could not be deleted is logged and tried again next time."""
    tok = token()
    me = cfg.get("tpu_node") or ""
    own_name = me.rsplit("/", 1)[-1] if me else metadata("instance/name")
    for name in instances_of_run(cfg, tok):
        if name != own_name:
            what = "projects/%s/zones/%s/instances/%s" % (cfg["project"], cfg["zone"], name)
            status, body = call("DELETE", cfg["compute"].rstrip("/") + "/compute/v1/" + what, tok)
            log("deleting %s: HTTP %d %s" % (what, status, body[:200].decode(errors="replace")))
    if cfg.get("tpu_prefix"):
        for name in queued_resources_of_run(cfg, tok):
            if name.rsplit("/", 1)[-1] != own_name:
                status, body = call("DELETE", cfg["tpu"].rstrip("/") + "/v2/" + name + "?force=true", tok)
                log("deleting %s: HTTP %d %s" % (name, status, body[:200].decode(errors="replace")))


def delete_self(cfg):
    try:
        reap(cfg)
    except Exception as exc:
        log("could not delete the run's other VMs: %s" % exc)
    tok = token()
    node = cfg.get("tpu_node")
    if node:
        base = cfg["tpu"].rstrip("/") + "/v2/"
        queued = node.replace("/nodes/", "/queuedResources/")
        status, body = call("DELETE", base + queued + "?force=true", tok)
        if status == 404:
            status, body = call("DELETE", base + node, tok)
        what = node
    else:
        project = metadata("project/project-id")
        zone = metadata("instance/zone").rsplit("/", 1)[-1]
        name = metadata("instance/name")
        what = "projects/%s/zones/%s/instances/%s" % (project, zone, name)
        status, body = call("DELETE", cfg["compute"].rstrip("/") + "/compute/v1/" + what, tok)
    log("deleting %s: HTTP %d %s" % (what, status, body[:300].decode(errors="replace")))
    return 200 <= status < 300


def main():
    cfg = configuration()
    limit, check = float(cfg["limit_s"]), float(cfg["check_s"])
    log("watching gs://%s/%s: the run's VMs and this machine are deleted once it has not changed for %.0f s"
        % (cfg["bucket"], cfg["object"], limit))
    seen, changed, deleted_at = "unread", time.monotonic(), None
    while True:
        try:
            g = generation(cfg)
            if g is not None and g != seen:
                seen, changed = g, time.monotonic()
        except Exception as exc:
            log("could not read the heartbeat: %s" % exc)
        silent = time.monotonic() - changed
        if silent > limit and (deleted_at is None or time.monotonic() - deleted_at > 60):
            log("the run's supervisor has not been heard from for %.0f s: ending the run's VMs" % silent)
            try:
                if delete_self(cfg):
                    deleted_at = time.monotonic()
            except Exception as exc:
                log("could not delete this machine: %s" % exc)
        time.sleep(check)


main()
'''


def start_lines(python: str) -> str:
    """Bash lines (for a startup script run as root) that install PROGRAM and start it: as a systemd unit where
    systemd is PID 1, else in a nohup'd loop that restarts it when it fails, once per boot."""
    q = shlex.quote
    run = f"{q(python)} {PROGRAM_PATH}"
    absolute = run if python.startswith("/") else f"/usr/bin/env {run}"  # systemd wants an absolute command
    unit = (f"[Unit]\nDescription=dsctl: delete the run's VMs once its supervisor is gone\n"
            f"After=network-online.target\nWants=network-online.target\n\n"
            f"[Service]\nExecStart={absolute}\nRestart=on-failure\nRestartSec=5\n\n"
            f"[Install]\nWantedBy=multi-user.target\n")
    loop = f"until {run}; do sleep 5; done"
    return f"""# The run's dead man's switch (dsctl watchdog.py), before anything else.
mkdir -p /opt/dsctl /etc/systemd/system
cat > {PROGRAM_PATH} <<'{_EOF}'
{PROGRAM.strip()}
{_EOF}
cat > {UNIT_PATH} <<'{_EOF}'
{unit}{_EOF}
if [ -d /run/systemd/system ] && command -v systemctl > /dev/null; then
  systemctl daemon-reload && systemctl enable --now {UNIT}
elif ! pgrep -f {q(PROGRAM_PATH)} > /dev/null; then
  (setsid nohup sh -c {q(loop)} >> {LOG} 2>&1 < /dev/null &)
fi
"""


def script(python: str = "python3") -> str:
    """A startup script that only starts the watchdog: for a VM whose image brings its own software
    (gcp.bootstrap: false)."""
    return "#!/bin/bash\n# dsctl: this VM's dead man's switch.\n" + start_lines(python)
