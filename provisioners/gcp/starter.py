"""The run's supervisor started by its dispatcher VM from Cloud Storage: handing a run over opens no connection.

`dsctl up` on the user's machine creates the run's VMs through the APIs, then writes the hand-over (the run's
state, its spec and what the supervisor is told: handoff.py) to gs://BUCKET/dsctl/runs/RUN/handoff/, its
manifest last. Nothing on the user's machine connects to a VM: a project whose VMs have no external address, or
whose firewall lets nothing in from outside, is handed over the same way.

On the dispatcher VM, once its startup script has installed the run's software (startup.py), this program
(`python -m dsctl.provisioners.gcp.starter`, run as root) reads its configuration (StarterConfig) from the
metadata attribute STARTER_KEY, waits for the manifest, writes the files it lists into the supervisor's run
folder (0600, in a folder of root's beside the run's others) and starts `dsctl supervise RUN_DIR` there the
way every server of a run is started (remote.launch: its pid and exit code in files), then exits. Its log is
LOG. A second boot of the VM finds the supervisor's pid file and starts nothing.

Cloud Storage is read with the VM's service-account token from the metadata server (metadata.google.internal,
or GCE_METADATA_HOST where a test stands in for it) and its JSON API, the standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import remote
from .storage import run_prefix

STARTER_KEY = "dsctl-starter"  # the dispatcher VM's metadata attribute holding its StarterConfig
LOG = "/var/log/dsctl-starter.log"
MANIFEST = "manifest.json"  # written last: the hand-over is complete once it is there
POLL_S = 2.0


def handoff_prefix(run_id: str) -> str:
    """Where the hand-over's objects are, in the run's bucket."""
    return run_prefix(run_id) + "handoff/"


def supervisor_dir(remote_dir: str, run_id: str, vm_name: str) -> str:
    """The supervisor's folder on the dispatcher VM: beside the run's folders (remote_dir), not in them, since
    those are made by the VMs' OS Login user and this one by root."""
    return f"{remote_dir.rstrip('/')}-supervisor/{run_id}/{vm_name}"


def supervisor_run_dir(base: str, run_id: str) -> str:
    """The supervisor's run folder (its DSCTL_HOME is base/home)."""
    return f"{base}/home/runs/{run_id}"


@dataclass(frozen=True)
class StarterConfig:
    """What the dispatcher VM's starter needs, as the metadata attribute STARTER_KEY holds it."""

    run_id: str
    bucket: str
    storage: str  # the Cloud Storage endpoint
    dir: str  # the supervisor's folder (supervisor_dir)
    python: str  # the VM's Python that has dsctl
    env: dict[str, str] = field(default_factory=dict)  # the endpoints the supervisor calls (GcpSettings)
    wait_s: float = 86400.0  # how long the hand-over may take to appear

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StarterConfig:
        return cls(**json.loads(text))


def _log(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} dsctl starter: {msg}", flush=True)


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _metadata(path: str) -> str:
    host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    req = urllib.request.Request(f"http://{host}/computeMetadata/v1/{path}", headers={"Metadata-Flavor": "Google"})
    with _NO_PROXY.open(req, timeout=10) as resp:
        return resp.read().decode()


def _token() -> str | None:
    try:
        return json.loads(_metadata("instance/service-accounts/default/token"))["access_token"]
    except Exception as exc:  # noqa: BLE001 - no token: the request says why it was refused
        _log(f"no access token from the metadata server: {exc}")
        return None


def _object(cfg: StarterConfig, name: str) -> bytes | None:
    """An object of the hand-over, or None while it is not there."""
    url = (f"{cfg.storage.rstrip('/')}/storage/v1/b/{urllib.parse.quote(cfg.bucket, safe='')}/o/"
           f"{urllib.parse.quote(handoff_prefix(cfg.run_id) + name, safe='')}?alt=media")
    token = _token()
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with _NO_PROXY.open(req, timeout=60) as resp:
            return resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def _retrying(read, what: str, tries: int = 10):
    """read(), tried again on any failure (408, 429, 5xx, a refused connection) with backoff from 1 s to 30 s, as
    Google advises for Cloud Storage (https://cloud.google.com/storage/docs/retry-strategy); the last failure
    propagates."""
    wait = 1.0
    for attempt in range(tries):
        try:
            return read()
        except Exception as exc:  # noqa: BLE001 - said, then tried again
            if attempt == tries - 1:
                raise
            _log(f"{what}: {exc}; trying again in {wait:.0f} s")
            time.sleep(wait)
            wait = min(wait * 2, 30.0)
    return None


def _safe_name(name: str) -> bool:
    """A file name of the hand-over: a plain name, never a path (the manifest is read from Cloud Storage)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def start(cfg: StarterConfig, poll_s: float = POLL_S) -> int:
    """Wait for the hand-over, write it, start the supervisor; the exit status of this program."""
    layout = remote.Layout(cfg.dir)
    if Path(layout.pid).exists():
        _log(f"the run's supervisor was started before ({layout.pid}); nothing to do")
        return 0
    deadline = time.monotonic() + cfg.wait_s
    _log(f"waiting for gs://{cfg.bucket}/{handoff_prefix(cfg.run_id)}{MANIFEST}")
    while True:
        try:
            manifest = _object(cfg, MANIFEST)
        except Exception as exc:  # noqa: BLE001 - Cloud Storage out of reach for a moment: try again
            _log(f"reading the manifest: {exc}")
            manifest = None
        if manifest is not None:
            break
        if time.monotonic() > deadline:
            _log(f"no hand-over within {cfg.wait_s:.0f} s; the run's watchdogs end its VMs")
            return 1
        time.sleep(poll_s)
    names = json.loads(manifest)["files"]
    run_dir = Path(supervisor_run_dir(cfg.dir, cfg.run_id))
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name in names:
        if not _safe_name(name):
            _log(f"refusing the hand-over's file name {name!r}")
            return 1
        data = _retrying(lambda name=name: _object(cfg, name), f"reading {name}")
        if data is None:
            _log(f"the hand-over lists {name} but it is not in Cloud Storage")
            return 1
        path = run_dir / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    env = {"DSCTL_HOME": f"{cfg.dir}/home", **cfg.env}
    command = remote.launch(layout, cfg.python, "dsctl.cli.main", ["supervise", str(run_dir)], env)
    res = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        _log(f"could not start the supervisor: {(res.stderr or res.stdout).strip()[-500:]}")
        return 1
    pid, _ = remote.parse_launch(res.stdout)
    _log(f"started the run's supervisor, pid {pid}, in {cfg.dir}")
    return 0


def main() -> int:
    while True:
        try:
            text = _metadata(f"instance/attributes/{STARTER_KEY}")
            break
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                _log(f"this VM has no {STARTER_KEY} attribute: it supervises no run")
                return 0
            _log(f"reading the configuration: {exc}")
        except Exception as exc:  # noqa: BLE001 - the metadata server not up yet
            _log(f"reading the configuration: {exc}")
        time.sleep(5)
    return start(StarterConfig.from_json(text))


def start_lines(python: str) -> str:
    """Bash lines (for the dispatcher VM's startup script, run as root once its software is installed) that start
    this program in the background, so the startup script itself ends."""
    from shlex import quote as q

    run = f"{q(python)} -m dsctl.provisioners.gcp.starter"
    return f"""# The run's supervisor, from the hand-over in Cloud Storage (dsctl starter.py).
(setsid nohup {run} >> {LOG} 2>&1 < /dev/null &)
"""


if __name__ == "__main__":
    sys.exit(main())
