"""What `dsctl up` would create on Google Cloud, and what it costs: shown by `--dry-run`, and before asking.

`plan(spec, workers)` needs no credentials and creates nothing: the run's Bill (billing.py: its VMs, how each is
bought, their external IPv4 addresses and boot disks) priced as every provider's plan is (provisioners/plan.py), and
what only a gcp run has: the dispatcher VM that runs the supervisor bought on-demand, which TensorFlow every VM
gets and how (software.py), how dsctl reaches the VMs, and what else is created. With credentials, `confirm` adds
what preflight.py found and asks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

from dsctl.costmodel import load_catalog
from dsctl.costmodel.hybrid import PipelineRate
from dsctl.costmodel.provisioning import PROVISIONING_LABEL
from dsctl.specs.schema import GcpSpec, JobSpec

from ..plan import Plan, ask_first, price_plan, priced
from . import naming
from .billing import bill_of, created_from_spec
from .firewall import ALLOW_PRIORITY, DENY_PRIORITY, ports
from .machinetypes import machine_kind
from .settings import local_tensorflow_version
from .software import Software
from .software import resolve as resolve_software
from .storage import CODE_LIMIT_BYTES


def software_lines(software: Software, trainer_kind: str) -> list[str]:
    out = [f"TensorFlow {software.tensorflow_version} on every VM ({software.why})."]
    for k in software.kinds.values():
        who = {"cpu": "dispatcher, workers and trainers" if trainer_kind == "cpu" else "dispatcher and workers",
               "gpu": "GPU trainers", "tpu": "TPU trainers"}[k.kind]
        if k.jax:
            out.append(f"{who}: JAX's TPU software {k.image}; jax[tpu]=={k.jax} (jax, jaxlib, libtpu) and {k.tensorflow} "
                       f"(the tf.data client) for Python {k.python_version} from a wheelhouse built here and staged in "
                       "Cloud Storage.")
        elif k.uses_image_tensorflow:
            pjrt = ", ".join(f"{name}={value}" for env in k.trainer_file_env.values() for name, value in env.items())
            out.append(f"{who}: TPU runtime {k.image} (TensorFlow included), dsctl added for Python {k.python_version}; "
                       f"trainers run with TensorFlow's PJRT TPU runtime ({pjrt}).")
        else:
            out.append(f"{who}: {k.image.rsplit('/', 1)[-1]}, {k.tensorflow} for Python {k.python_version} from a "
                       "wheelhouse built here and staged in Cloud Storage (no PyPI or apt on the VMs).")
    return out


def plan(spec: JobSpec, workers: int | None = None, *, batches_per_s: float | None = None,
         run_id: str = "<run>", project: str | None = None, zone: str | None = None,
         pipeline_rate: PipelineRate | None = None) -> Plan:
    """The machines `dsctl up` would create for `spec` (with `workers` workers), priced (provisioners/plan.py), with what
    a gcp run also gets: the TensorFlow every VM runs, what else is created, how the VMs are reached; creates nothing.

    SpecError (exit 2) when the run could not start: no TensorFlow version for every machine kind,
    an image whose Python is unknown, a multi-host TPU.
    """
    from . import data

    g = spec.gcp or GcpSpec()
    n_workers = spec.service.workers if workers is None else workers
    catalog = load_catalog(spec.pricing)
    notes: list[str] = []
    software = resolve_software(spec, local_tensorflow_version())
    svc, tr = spec.service, spec.trainer
    created = created_from_spec(spec, workers=n_workers)
    if n_workers and created.vms[0].provisioning != svc.provisioning:
        notes.append("the dispatcher VM runs the run's supervisor, so it is on-demand whatever "
                     "service.provisioning says: a preempted supervisor would leave the run unsupervised.")
        if not priced(catalog, svc.dispatcher_machine, created.vms[0].provisioning):
            notes.append(f"this catalog has no on-demand price for {svc.dispatcher_machine}: the dispatcher is "
                         f"priced here as {PROVISIONING_LABEL[svc.provisioning]}, below what it will cost.")
            created = replace(created, vms=(replace(created.vms[0], provisioning=svc.provisioning), *created.vms[1:]))
    project = project or g.project or os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT")
    zone = zone or g.zone or os.environ.get("CLOUDSDK_COMPUTE_ZONE")
    where = f"on Google Cloud (project {project or '(not set)'}, zone {zone or '(not set)'})"
    result = price_plan(bill_of(created), spec, catalog, where=where, workers=n_workers, batches_per_s=batches_per_s,
                        pipeline_rate=pipeline_rate)
    result.notes[:0] = notes
    result.software = software_lines(software, machine_kind(tr.machine).kind)
    if not project:
        result.notes.append("no project is set (gcp.project or GOOGLE_CLOUD_PROJECT); the default project of "
                            "Application Default Credentials will be used, if any.")
    if not zone:
        result.notes.append("no zone is set: set gcp.zone (or CLOUDSDK_COMPUTE_ZONE) before `dsctl up`.")
    if n_workers:
        prefix = naming.prefix(run_id) if run_id != "<run>" else "dsctl-<run>"
        result.creates.append(
            f"firewall rules {prefix}-svc and {prefix}-deny (tcp {', '.join(ports(g.dispatcher_port, g.worker_port))} "
            f"and SSH allowed between the run's VMs at priority {ALLOW_PRIORITY}, the service ports denied to all "
            f"others at {DENY_PRIORITY}, above the network's own rules such as the default network's "
            "default-allow-internal)")
    bucket = g.bucket or (f"{project}-dsctl" if project else "<project>-dsctl")
    staged = "the dsctl wheel, the spec" if g.bootstrap else "the spec"
    if spec.pipeline.entrypoint or spec.trainer.model.kind in ("python", "keras") or spec.trainer.command:
        staged += (f" and the spec's folder: your code, less what its .dsctlignore leaves out, at most "
                   f"{CODE_LIMIT_BYTES // 2**20} MB")
    result.creates.append(f"staging objects under gs://{bucket}/dsctl/runs/{run_id}/ ({staged}; deleted with the run)")
    if g.bootstrap:
        result.creates.append(f"a wheelhouse per VM kind, downloaded here once and kept in gs://{bucket}/dsctl/wheelhouses/")
    data_root = data.root(spec, bucket)
    if data_root:
        result.creates.append(f"the {spec.pipeline.builtin} builtin's TFRecords, generated here once and kept in "
                              f"{data_root}/ (the workers read them there)")
    if g.supervisor == "vm":
        result.notes.append("this machine connects to no VM: the run is handed over through Cloud Storage, and its "
                            "supervisor on the dispatcher VM reaches the others over SSH at internal addresses (the "
                            "run's own firewall rule admits it); sweeps and the colocated and ideal baselines are "
                            "supervised from here and connect from here.")
    if g.public_ips:
        result.notes.append("every VM gets an ephemeral external address; a run supervised from here connects over "
                            "SSH to it (the network must admit tcp:22 from here, as the default network's "
                            "default-allow-ssh does).")
    else:
        result.notes.append("VMs get internal addresses only (a run supervised from here needs dsctl inside the VPC); "
                            "their subnet needs Private Google Access or a Cloud NAT to reach Cloud Storage (checked "
                            "before anything is created).")
    if "spot" in (svc.provisioning, tr.provisioning):
        result.notes.append("Spot VMs can be preempted at any time; a preempted VM ends the run (dsctl tears down; "
                            "it does not yet restart preempted VMs).")
    return result


def confirm(spec: JobSpec, workers: int | None, *, yes: bool, ask: Callable[[str], bool],
            echo: Callable[[str], None], interactive: bool | None = None, pipeline_rate: PipelineRate | None = None) -> bool:
    """Show the plan and ask before creating anything that bills; True to go ahead (at once with `yes`).

    Project, zone, credentials, permissions and the network are checked first (SpecError, preflight.py), so nobody
    is asked about a run that cannot start. `ask(question) -> bool` is e.g. typer.confirm; without a terminal
    (`interactive`: sys.stdin is one) and without --yes this refuses (SpecError) instead of waiting for an answer
    nobody can give.
    """
    if yes:
        return True
    from . import preflight
    from .clients import Clients
    from .settings import resolve

    settings = resolve(spec)
    # Refuses before asking, if it must. SSH from here is checked where the run is supervised from here only; a run
    # that turns out to be (another --mode) is refused by the provider's own check, still before anything is made.
    handed_off = (spec.gcp.supervisor if spec.gcp else "vm") == "vm"
    findings = preflight.run(Clients(settings), spec, settings.run_software, reaches_vms=not handed_off,
                             workers=workers)
    shown = plan(spec, workers, project=settings.project, zone=settings.zone, pipeline_rate=pipeline_rate)
    shown.notes += findings.notes
    return ask_first(shown, ask=ask, echo=echo, question="Create these machines on Google Cloud?",
                     refusal="provider: gcp creates machines that bill by the hour; pass --yes to create them without "
                             "asking (or --dry-run to see the plan only).", interactive=interactive)
