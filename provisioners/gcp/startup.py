"""The startup script that gives a VM the run's TensorFlow and this dsctl, from Cloud Storage only.

It runs as root at every boot (the guest environment's metadata script runner) and needs
no apt and no PyPI, so it works the same on 640 VMs at once and on VMs whose only way out
is Private Google Access:

0. start the run's watchdog (watchdog.py), before anything can fail: the VM deletes itself
   once the run's supervisor is gone, whatever became of its bootstrap;
1. fetch the run's wheelhouse (wheelhouse.py; every file checked against its manifest's
   sha256) and the staged dsctl wheel from Cloud Storage, with the image's own Python and
   the VM's service-account token from the metadata server;
2. make /opt/dsctl/venv with `python -m venv --without-pip`, which needs neither ensurepip
   nor Debian's python3-venv package (on a TensorFlow TPU runtime with --system-site-packages,
   to see the runtime's TensorFlow); an image whose Python has no venv module at all gets a plain
   directory of packages and a `python` wrapper at the same path instead;
3. install with pip run from its own wheel, `--no-index --find-links` the wheelhouse;
4. check that TensorFlow imports at exactly the run's version (on a JAX TPU VM, jax at
   software.JAX_VERSION too; on a GPU VM, also wait for the NVIDIA driver that the Deep
   Learning VM image installs at boot);
5. write /var/lib/dsctl/bootstrap.json: {"ok": true, "tensorflow": ..., "seconds": ...,
   "storage_bytes": ...} or {"ok": false, "error": ...}, which dsctl waits for over SSH;
6. on the dispatcher VM, start the run's supervisor from the hand-over in Cloud Storage (starter.py).

Every value that reaches the script is quoted here.
"""

from __future__ import annotations

import shlex

from . import starter, watchdog
from .remote import FETCH, REAL_STORAGE
from .software import KindSoftware

MARKER = "/var/lib/dsctl/bootstrap.json"
LOG = "/var/lib/dsctl/bootstrap.log"
VENV = "/opt/dsctl/venv"
WHEELS = "/opt/dsctl/wheelhouse"
GPU_DRIVER_WAIT_S = 900


def script(*, kind: KindSoftware, tf_version: str, bucket: str, wheelhouse_prefix: str, dsctl_prefix: str,
           dsctl_wheel: str, storage_host: str | None = None, supervisor: bool = False) -> str:
    """The bash startup script for one kind of VM (cpu, gpu, tpu) of a run; with `supervisor` (the dispatcher
    VM), dsctl's supervisor extra too, and once everything is installed the starter (starter.py), which starts the
    run's supervisor (orchestrator/supervise.py) from the hand-over in Cloud Storage where the run is handed over."""
    q = shlex.quote
    storage = storage_host or REAL_STORAGE
    venv_flags = "--without-pip" + (" --system-site-packages" if kind.uses_image_tensorflow else "")
    requirements = " ".join(q(r) for r in kind.requirements)
    where = f"gs://{bucket}/"
    extra = "[supervisor]" if supervisor else ""
    imports = "import dsctl.runtime.worker" + ("; import dsctl.cli.main, dsctl.orchestrator.supervise, "
                                               "google.cloud.compute_v1, google.cloud.oslogin_v1, "
                                               "google.cloud.storage, fabric" if supervisor else "")
    # Messages are made here and quoted as one word each: a spec value in them is never read by the shell.
    msg = {
        "version": q(f"the image's Python is not {kind.python_version}, which the wheelhouse was built for "
                     "(set gcp.image_python_version)"),
        "fetching": q(f"fetching the wheelhouse and dsctl from {where}"),
        "wheelhouse": q(f"could not download the wheelhouse {where}{wheelhouse_prefix} (see {LOG}: the VM needs a "
                        "route to Cloud Storage, external address, Cloud NAT or Private Google Access, and its "
                        "service account needs Storage Object Viewer on the bucket)"),
        "dsctl": q(f"could not download {where}{dsctl_prefix}{dsctl_wheel} (see {LOG})"),
        "pip": q(f"pip could not install {' and '.join(kind.requirements) or 'dsctl'} from the wheelhouse (see {LOG})"),
        "tensorflow": q(f"TensorFlow on this VM is not {tf_version}: "),
    }
    jax_check = ""
    if kind.jax:  # imported without touching the TPU: the program is the one to open it
        wrong = q(f"jax on this VM is not {kind.jax}: ")
        jax_check = (f"\nJ=$({VENV}/bin/python -c 'import jax; print(jax.__version__)' 2>/dev/null | tail -n 1)\n"
                     f'[ "$J" = {q(kind.jax)} ] || fail {wrong}"it is ${{J:-not importable}}"')
    gpu_wait = ""
    if kind.kind == "gpu":
        tries = GPU_DRIVER_WAIT_S // 5  # one nvidia-smi each 5 s
        gpu_wait = f"""
step "waiting for the NVIDIA driver (the image installs it at boot)"
i=0; until nvidia-smi -L > /dev/null 2>&1; do
  i=$((i+1)); [ $i -gt {tries} ] && fail "the NVIDIA driver did not come up within {GPU_DRIVER_WAIT_S} s (nvidia-smi)"
  sleep 5
done"""
    # The image's Python, checked against the version the wheelhouse was built for (its first argument).
    check_python = """'import sys; v = "%d.%d" % sys.version_info[:2]; sys.exit(v != sys.argv[1] and "Python " + v)'"""
    fetch = f'"$PY" -c {q(FETCH)} {q(storage)} {q(bucket)}'
    return f"""#!/bin/bash
# dsctl bootstrap ({kind.kind} VM): the run's TensorFlow and dsctl, from Cloud Storage only.
set -uo pipefail
mkdir -p /var/lib/dsctl {WHEELS}
exec >> {LOG} 2>&1
{watchdog.start_lines(kind.python)}
[ -s {MARKER} ] && grep -q '"ok": true' {MARKER} && exit 0   # done at an earlier boot (a supervisor's too)
PY={q(kind.python)}
T0=$(date +%s.%N)
phase() {{ printf '%s=%s ' "$1" "$(date +%s.%N)" >> /var/lib/dsctl/phases; }}
step() {{ echo "dsctl bootstrap: $1"; }}
fail() {{
  "$PY" -c 'import json, sys; print(json.dumps({{"ok": False, "error": sys.argv[1]}}))' "$1" > {MARKER}.tmp 2>/dev/null \\
    || printf '{{"ok": false, "error": "%s"}}\\n' "bootstrap failed" > {MARKER}.tmp
  mv {MARKER}.tmp {MARKER}; exit 1
}}
[ -x "$PY" ] || fail "the image has no Python at $PY (set gcp.image_python)"
"$PY" -c {check_python} {q(kind.python_version)} \\
  || fail {msg["version"]}

step {msg["fetching"]}
{fetch} {q(wheelhouse_prefix)} {WHEELS} manifest > /var/lib/dsctl/fetch-wheels.json \\
  || fail {msg["wheelhouse"]}
{fetch} {q(dsctl_prefix)} {WHEELS} objects {q(dsctl_wheel)} > /var/lib/dsctl/fetch-dsctl.json \\
  || fail {msg["dsctl"]}
phase fetched

step "creating {VENV}"
if [ ! -x {VENV}/bin/python ]; then
  if ! "$PY" -m venv {venv_flags} {VENV}; then
    step "this Python cannot make a venv: installing into {VENV}/site with a wrapper instead"
    rm -rf {VENV} && mkdir -p {VENV}/bin {VENV}/site || fail "could not create {VENV}"
    printf '#!/bin/sh\\nPYTHONPATH={VENV}/site${{PYTHONPATH:+:$PYTHONPATH}} exec %s "$@"\\n' "$PY" > {VENV}/bin/python
    chmod 755 {VENV}/bin/python
    TARGET="--target {VENV}/site"
  fi
fi
PIP=$(ls {WHEELS}/pip-*.whl 2>/dev/null | head -n 1)
[ -n "$PIP" ] || fail "the wheelhouse has no pip wheel"
phase venv

step "installing from the wheelhouse (no index)"
{VENV}/bin/python "$PIP/pip" install --no-index --find-links {WHEELS} --no-cache-dir --disable-pip-version-check \\
    --no-warn-script-location --quiet ${{TARGET:-}} {requirements} {q(f"{WHEELS}/{dsctl_wheel}{extra}")} \\
  || fail {msg["pip"]}
phase installed

V=$({VENV}/bin/python -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null | tail -n 1)
[ "$V" = {q(tf_version)} ] || fail {msg["tensorflow"]}"it is ${{V:-not importable}}"
{VENV}/bin/python -c {q(imports)} || fail "dsctl's runtime does not import"{jax_check}
phase checked{gpu_wait}

"$PY" - "$T0" {MARKER} "$V" <<'EOF'
import json, sys, time
t0, marker, version = float(sys.argv[1]), sys.argv[2], sys.argv[3]
fetched = sum(json.load(open("/var/lib/dsctl/" + f))["bytes"] for f in ("fetch-wheels.json", "fetch-dsctl.json"))
phases = dict(p.split("=") for p in open("/var/lib/dsctl/phases").read().split())
out = {{"ok": True, "tensorflow": version, "seconds": round(time.time() - t0, 2), "storage_bytes": fetched,
       "phases_s": {{k: round(float(v) - t0, 2) for k, v in phases.items()}}}}
open(marker + ".tmp", "w").write(json.dumps(out) + "\\n")
EOF
mv {MARKER}.tmp {MARKER}
{starter.start_lines(f"{VENV}/bin/python") if supervisor else ""}"""
