"""Build the dsctl wheel of THIS version, for the VMs' startup script to install.

The wheel is assembled from the package files that are importable here (an
editable checkout or a regular install alike), without a build backend or
network: a wheel is a zip of the package files plus METADATA, WHEEL and RECORD.
Its version carries a hash of the files (0.1.0+g1a2b3c4d), so a VM can tell
this exact code from another build of the same release.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import zipfile
from importlib import metadata
from pathlib import Path

# Top-level subpackages of the dsctl namespace; each is copied with everything under it.
PACKAGES = ("dsctl", "dsctl.cli", "dsctl.specs", "dsctl.runtime", "dsctl.provisioners", "dsctl.costmodel",
            "dsctl.experiments", "dsctl.orchestrator")
SUFFIXES = (".py", ".yaml", ".yml", ".json", ".txt")
# What dsctl's runtime imports on a VM besides TensorFlow (which the VM's image or wheelhouse provides).
RUNTIME_REQUIREMENTS = ("pyyaml>=6", "pydantic>=2.6", "psutil>=5.9")
# What a run's supervisor needs besides (orchestrator/supervise.py: `dsctl supervise` on the dispatcher VM, with
# the Google Cloud provider): the wheel's `supervisor` extra, installed on the dispatcher VM only. The same
# specifiers as pyproject.toml's dependencies and its gcp extra (a test holds them together).
SUPERVISOR_REQUIREMENTS = ("typer>=0.12", "rich>=13", "google-cloud-compute>=1.20", "google-cloud-tpu>=1.18",
                           "google-cloud-storage>=2.16", "google-cloud-resource-manager>=1.12",
                           "google-cloud-org-policy>=1.11", "google-cloud-os-login>=2.14",
                           "google-cloud-service-usage>=1.10", "google-cloud-quotas>=0.1", "fabric>=3.2",
                           "paramiko>=3.4", "tensorboard>=2.16")  # the run's event files (orchestrator/tbevents.py)


def _package_files() -> list[tuple[str, Path]]:
    """(path inside the wheel, file here) for every package file."""
    out = []
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        target = Path(*package.split("."))
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if not path.is_file() or path.suffix not in SUFFIXES or "__pycache__" in rel.parts:
                continue
            # Nested subpackages that are top-level packages of their own are copied by their own entry.
            if package == "dsctl" and rel.parts and (Path("dsctl") / rel.parts[0]).as_posix().replace("/", ".") in PACKAGES:
                continue
            out.append(((target / rel).as_posix(), path))
    return out


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(out_dir: Path) -> Path:
    """Write dsctl-<version>+g<hash>-py3-none-any.whl into out_dir and return its path."""
    files = _package_files()
    if not any(name == "dsctl/runtime/worker.py" for name, _ in files):
        raise RuntimeError("cannot find dsctl's runtime package files to build the wheel for the VMs")
    contents = [(name, path.read_bytes()) for name, path in files]
    digest = hashlib.sha256()
    for name, data in contents:
        digest.update(name.encode() + b"\0" + data)
    try:
        base_version = metadata.version("dsctl")
    except metadata.PackageNotFoundError:
        base_version = "0.0.0"
    version = f"{base_version.split('+')[0]}+g{digest.hexdigest()[:10]}"
    dist_info = f"dsctl-{version}.dist-info"
    meta = "\n".join([
        "Metadata-Version: 2.1", "Name: dsctl", f"Version: {version}",
        "Summary: dsctl runtime for tf.data service VMs (built by dsctl for its VMs)",
        # TensorFlow is installed by the startup script (tensorflow-cpu, tensorflow[and-cuda] or
        # tensorflow-tpu at the trainer's version), so it is not a requirement here.
        *(f"Requires-Dist: {r}" for r in RUNTIME_REQUIREMENTS),
        "Provides-Extra: supervisor",
        *(f'Requires-Dist: {r}; extra == "supervisor"' for r in SUPERVISOR_REQUIREMENTS),
    ]) + "\n"
    wheel_meta = "Wheel-Version: 1.0\nGenerator: dsctl\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"dsctl-{version}-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in contents + [(f"{dist_info}/METADATA", meta.encode()), (f"{dist_info}/WHEEL", wheel_meta.encode())]:
            z.writestr(name, data)
            records.append(_record_line(name, data))
        records.append(f"{dist_info}/RECORD,,")
        z.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return path
