"""Every machine must run the trainer's TensorFlow (and this dsctl): check it before anything starts.

tf.data service sends serialized dataset graphs from the trainers to the
dispatcher and workers; a worker on another TensorFlow version may fail to run
them, or fail much later in ways that are hard to trace. So dsctl asks each VM
which versions it has (remote.PROBE, no TensorFlow import) and refuses a
mismatch with one clear error, before any server starts.
"""

from __future__ import annotations

from importlib import metadata

from .errors import VersionMismatch


def local_dsctl() -> str | None:
    """This dsctl's version (the VMs must run the same)."""
    try:
        return metadata.version("dsctl")
    except metadata.PackageNotFoundError:
        return None


def _base(version: str | None) -> str | None:
    return version.split("+")[0] if version else None


def reference(reports: dict[str, dict], recorded_trainer_tf: str | None, expected_tf: str) -> tuple[str, str]:
    """(the TensorFlow every machine must run, whose it is): the trainers' (first trainer's), else the run's."""
    trainers = sorted(k for k in reports if k.startswith("trainer") and reports[k].get("tensorflow"))
    if trainers:
        return reports[trainers[0]]["tensorflow"], f"the trainer ({trainers[0]})"
    if recorded_trainer_tf:
        return recorded_trainer_tf, "the trainers"
    return expected_tf, "the run (gcp.tensorflow_version, else this machine's TensorFlow)"


def check(reports: dict[str, dict], *, reference_tf: str, who: str, local_dsctl: str | None,
          staged_dsctl: str | None = None) -> None:
    """reports: node label ("trainer-0", "worker-3") -> probe JSON. Raise VersionMismatch on any difference."""
    missing = sorted(k for k, r in reports.items() if not r.get("tensorflow"))
    if missing:
        raise VersionMismatch(
            f"TensorFlow is not installed on {', '.join(missing)} ({who} uses {reference_tf}). "
            "With gcp.bootstrap: true the startup script installs it; with a custom image, install "
            f"TensorFlow {reference_tf} there, or point gcp.python at a Python that has it."
        )
    wrong = {k: r["tensorflow"] for k, r in reports.items() if _base(r["tensorflow"]) != _base(reference_tf)}
    if wrong:
        listed = ", ".join(f"{k} has {v}" for k, v in sorted(wrong.items())[:6])
        more = f" (and {len(wrong) - 6} more)" if len(wrong) > 6 else ""
        raise VersionMismatch(
            f"TensorFlow versions differ: {who} runs TensorFlow {reference_tf}, but {listed}{more}. tf.data service "
            "sends serialized dataset graphs between machines, so every machine must run the trainer's TensorFlow; "
            f"dsctl refuses to start the job. Install TensorFlow {reference_tf} everywhere (gcp.bootstrap: true "
            "does), or set gcp.tensorflow_version to the version your image has."
        )
    no_dsctl = sorted(k for k, r in reports.items() if not r.get("dsctl"))
    if no_dsctl:
        raise VersionMismatch(f"dsctl is not installed on {', '.join(no_dsctl)}; use gcp.bootstrap: true, or install "
                              f"dsctl {local_dsctl} in the image's Python (gcp.python).")
    want = staged_dsctl or local_dsctl
    if want:
        exact = staged_dsctl is not None
        odd = {k: r["dsctl"] for k, r in reports.items()
               if (r["dsctl"] != want if exact else _base(r["dsctl"]) != _base(want))}
        if odd:
            listed = ", ".join(f"{k} has {v}" for k, v in sorted(odd.items())[:6])
            raise VersionMismatch(f"dsctl versions differ: this dsctl is {want}, but {listed}. The VMs must run the "
                                  "same dsctl as the machine that starts them.")
