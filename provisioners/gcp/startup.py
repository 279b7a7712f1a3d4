"""The startup script that gives each VM the trainer's TensorFlow and the dsctl wheel of this version.

It runs as root at first boot: makes a virtualenv at /opt/dsctl/venv, installs
TensorFlow at exactly the run's version (tensorflow-cpu on CPU VMs,
tensorflow[and-cuda] on GPU VMs, tensorflow-tpu on TPU VMs), downloads the
staged dsctl wheel from Cloud Storage with the VM's service account and
installs it, then writes /var/lib/dsctl/bootstrap.json ({"ok": true,
"tensorflow": "2.21.0"} or {"ok": false, "error": ...}), which dsctl waits for
over SSH. dsctl then checks the versions itself (versions.py).

With gcp.bootstrap: false the VMs are expected to have both already (a custom
image), and no script is set.
"""

from __future__ import annotations

import shlex

from .remote import FETCH

MARKER = "/var/lib/dsctl/bootstrap.json"
LOG = "/var/lib/dsctl/bootstrap.log"
TPU_FIND_LINKS = "https://storage.googleapis.com/libtpu-tf-releases/index.html"


def tensorflow_requirement(kind: str, version: str) -> tuple[str, list[str]]:
    """(pip requirement, extra pip args) for a VM of this kind (cpu, gpu, tpu)."""
    if kind == "gpu":
        return f"tensorflow[and-cuda]=={version}", []
    if kind == "tpu":
        return f"tensorflow-tpu=={version}", ["-f", TPU_FIND_LINKS]
    return f"tensorflow-cpu=={version}", []


def script(*, kind: str, tf_version: str, bucket: str, staging_prefix: str, wheel: str) -> str:
    q = shlex.quote
    requirement, extra = tensorflow_requirement(kind, tf_version)
    return f"""#!/bin/bash
# dsctl bootstrap: TensorFlow {tf_version} ({kind}) and the dsctl wheel {wheel}.
set -uo pipefail
mkdir -p /var/lib/dsctl /opt/dsctl/dist
exec >> {LOG} 2>&1
[ -s {MARKER} ] && grep -q '"ok": true' {MARKER} && exit 0   # done at an earlier boot
fail() {{ printf '{{"ok": false, "error": "%s"}}\\n' "$1" > {MARKER}.tmp && mv {MARKER}.tmp {MARKER}; exit 1; }}
if ! python3 -m venv --help > /dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-pip \\
    || fail "could not install python3-venv"
fi
[ -x /opt/dsctl/venv/bin/python ] || python3 -m venv /opt/dsctl/venv || fail "could not create /opt/dsctl/venv"
/opt/dsctl/venv/bin/python -m pip install -q --upgrade pip || true
python3 -c {q(FETCH)} {q(bucket)} {q(staging_prefix)} /opt/dsctl/dist {q(wheel)} \\
  || fail "could not download the dsctl wheel from gs://{bucket}/{staging_prefix}{wheel} (does the VM's service account have Storage Object Viewer?)"
/opt/dsctl/venv/bin/python -m pip install -q {" ".join(q(a) for a in extra)} {q(requirement)} \\
  || fail "could not install {requirement}"
/opt/dsctl/venv/bin/python -m pip install -q /opt/dsctl/dist/{q(wheel)} || fail "could not install {wheel}"
V=$(/opt/dsctl/venv/bin/python -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null | tail -n 1) \\
  || fail "TensorFlow {tf_version} was installed but does not import"
printf '{{"ok": true, "tensorflow": "%s"}}\\n' "$V" > {MARKER}.tmp && mv {MARKER}.tmp {MARKER}
"""
