"""A run's dead man's switch on each of its VMs: the machine deletes itself once its supervisor is gone.

PROGRAM runs on every VM and TPU VM of a run (standard library only, the image's own Python), from
the VM's startup script: as the systemd unit UNIT where systemd runs, else in a nohup'd loop. It
reads its configuration (lifetime.WatchdogConfig) from the metadata attribute lifetime.WATCHDOG_KEY,
and every `check_s` the generation of the run's heartbeat object in Cloud Storage, with the VM's
service-account token from the metadata server. When the generation has not changed for `limit_s`
by this VM's own clock (or the object has not appeared within `limit_s` of the watchdog's start),
the supervisor is taken for gone and the watchdog deletes its own machine: the Compute Engine
instance the metadata server names (instances.delete), or for a TPU VM its queued resource with
force (which deletes the node), else the node itself. A heartbeat that cannot be read counts as
not changed: a VM that cannot hear its supervisor cannot be supervised either.

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


def delete_self(cfg):
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
    log("watching gs://%s/%s: this machine is deleted once it has not changed for %.0f s"
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
            log("the run's supervisor has not been heard from for %.0f s" % silent)
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
    unit = (f"[Unit]\nDescription=dsctl: delete this VM once its run's supervisor is gone\n"
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
