"""A job spec as every command takes it: loaded and checked with what lies above the specs package.

specs.load_spec checks the file itself (schema, rules); here come the checks that need more than the
file: its entrypoints, imported in a child process that is contained (the child and everything the
user's code starts in it, daemons included, are in a cgroup of their own and end with the check:
provisioners/containment.py), the command it names, the price catalog it names, and its autoscale
policy with its settings.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from dsctl.costmodel.catalog import load_catalog
from dsctl.costmodel.machines import MACHINES, closest_first, known_list
from dsctl.provisioners import containment
from dsctl.provisioners.registry import provider_class
from dsctl.specs import LoadedSpec, SpecError, entrypoints, load_spec
from dsctl.specs.command import DEFAULT_ARG_MAX, activated, command_problem, exec_problem
from dsctl.specs.epochs import epoch_findings
from dsctl.specs.errors import Problems, UsageError

from .home import notices
from .localworkers import check_local_workers


def load_job(path: str | Path, *, autoscale: str | None = None, check_entrypoints: bool = True,
             workers: int | None = None, mode: str | None = "service") -> LoadedSpec:
    """The spec at `path`, checked whole: a SpecError (one paragraph, file and line) for anything wrong in it, or
    SpecErrors with every problem found. check_entrypoints=False leaves out what runs the user's code or looks for
    it (a supervisor on the cloud). `workers` and `mode` are how a run reads its epochs (specs/epochs.py: refused,
    or a warning in `loaded.warnings`), `workers` defaulting to the spec's; mode None: a sweep, which repeats the
    pipeline and reads no epochs."""
    loaded = load_spec(path)
    problems = Problems()
    if check_entrypoints:
        with problems.check():
            check_entrypoints_contained(loaded)
        with problems.check():
            check_command(loaded)
    for check in (check_machines, check_pricing):
        with problems.check():
            check(loaded)
    with problems.check():
        check_autoscale(loaded, autoscale)
    if mode is not None:
        refused, loaded.warnings = epoch_findings(loaded, workers or loaded.spec.service.workers, mode)
        problems.found += refused
    if mode in ("service", None):
        with problems.check():
            loaded.warnings += check_local_workers(loaded)
    problems.raise_any()
    return loaded


def check_machines(loaded: LoadedSpec) -> None:
    """Every machine type the spec names is one dsctl knows the shape and prices of (the cost model's, or one its
    catalog gives), else the closest known ones (a typo such as tpu-v9-8 would otherwise run, and end unpriced).
    Where the provider's processes run on this machine, a trainer may be `local`: this machine, unpriced."""
    spec = loaded.spec
    provider = provider_class(spec.provider)
    here = bool(provider is not None and provider.runs_here)
    try:
        known = load_catalog(spec.pricing, base_dir=loaded.base_dir).shapes
    except SpecError:  # check_pricing says why
        known = MACHINES
    problems = Problems()
    named = [(("service", "worker_machine"), spec.service.worker_machine),
             (("service", "dispatcher_machine"), spec.service.dispatcher_machine),
             (("trainer", "machine"), spec.trainer.machine)]
    for loc, machine in named:
        if machine == "local" and loc == ("trainer", "machine") and here:
            continue
        with problems.check():
            if machine not in known:
                close = closest_first(machine, list(known), 1)
                similar = close and difflib.SequenceMatcher(None, machine, close[0]).ratio() >= 0.6
                hint = f" Did you mean '{close[0]}'?" if similar else ""
                raise loaded.error(loc, f"unknown machine type '{machine}'.{hint} Known machine types, closest first: "
                                        f"{known_list(machine, known)}.")
    problems.raise_any()


_warned: list[str] = []  # the not-contained warning, said once per process


def check_entrypoints_contained(loaded: LoadedSpec) -> None:
    """The spec's entrypoints imported (and a pipeline function called) in a child process with a time limit
    (specs/entrypoints.py), in a cgroup of its own: when the check ends, everything the user's code started ends
    with it. Where this machine allows no cgroup, a warning says so and the child's process group is ended."""
    def uncontained(why: str) -> None:
        if not _warned:
            _warned.append(why)
            notices.warning(f"the entrypoint check's process is stopped by process group only, so a process the "
                            f"user's code starts in a session of its own (a daemon) outlives the check: {why}. "
                            f"({containment.CONTAINMENT_ENV}=none says nothing of it.)")

    def run(argv: list[str], limit_s: float) -> tuple[int | None, bool]:
        return containment.run_contained(argv, limit_s, uncontained)

    entrypoints.check_entrypoints(loaded, run)


def check_command(loaded: LoadedSpec) -> None:
    """trainer.command names a program that exists and may be executed (not run: specs/command.py), and execve would
    take it with its environment. Where the provider's machines are this one's, the program is looked for here;
    elsewhere only what the spec's folder holds (which the machines get a copy of) can be checked."""
    trainer = loaded.spec.trainer
    if trainer.command is None:
        return
    provider = provider_class(loaded.spec.provider)
    here = bool(provider is not None and provider.runs_here)
    why = command_problem(trainer.command, loaded.base_dir, {**os.environ, **trainer.env}, on_this_machine=here)
    if why:
        raise loaded.error(("trainer", "command"), why)
    # What execve takes: this machine's limit and environment where the command runs here, the usual ones elsewhere.
    refused = exec_problem(trainer.command, trainer.env, activated(dict(os.environ)) if here else {},
                           os.sysconf("SC_ARG_MAX") if here else DEFAULT_ARG_MAX)
    if refused:
        raise loaded.error(*refused)


def check_pricing(loaded: LoadedSpec) -> None:
    """Load the catalog `pricing` names, so a bad one (a negative price, a typo) fails here with its
    file and line, not when the finished run is priced."""
    try:
        load_catalog(loaded.spec.pricing, base_dir=loaded.base_dir)
    except SpecError as exc:
        if not exc.where:  # unknown name, missing file: the spec's line is the one to change
            raise loaded.error(("pricing",), exc.message) from None
        raise SpecError(f"{exc.message} (This is the price catalog that 'pricing' names at "
                        f"{loaded.source.where(('pricing',))}.)", where=exc.where, field=exc.field) from None


SET_BY_SPEC = ("min_workers", "max_workers", "start_workers", "start_note",  # autoscale's own fields, not settings
               "trainers_per_hour", "worker_cpu_per_hour", "worker_memory_per_hour", "basis", "local_cap")  # pecan: the spec's


def check_autoscale(loaded: LoadedSpec, policy: str | None = None):
    """The scaling policy a run uses (spec's `autoscale:`, or --autoscale), checked; None without autoscaling."""
    from dsctl.specs.schema import AutoscaleSpec

    from .policies import POLICIES, make_policy

    auto = loaded.spec.autoscale
    if policy is not None and (policy == "pecan") != (loaded.spec.service.placement == "auto"):
        raise UsageError(f"--autoscale {policy}: " + (
            "the pecan policy also places workers inside the trainer processes, which the spec's "
            "service.placement: auto turns on (with service.local_workers, the most per trainer); set those in the "
            "spec, whose autoscale policy is then pecan." if policy == "pecan" else
            f"the spec's service.placement: auto is placed by the pecan policy; {policy} scales remote workers "
            "only. Leave out --autoscale, or use placement: remote in the spec."), field="--autoscale")
    if policy is not None and (auto is None or auto.policy != policy):
        # Another policy than the spec's: its settings belong to the spec's policy, not this one.
        auto = (auto or AutoscaleSpec()).model_copy(update={"policy": policy, "settings": {}})
    if auto is None:
        return None
    config_model = POLICIES[auto.policy].settings
    for key in auto.settings:
        if key not in config_model.model_fields or key in SET_BY_SPEC:
            valid = sorted(k for k in config_model.model_fields if k not in SET_BY_SPEC)
            guess = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" Did you mean '{guess[0]}'?" if guess else ""
            raise loaded.error(("autoscale", "settings", key),
                               f"'{key}' is not a setting of the {auto.policy} policy.{hint} Valid settings: {', '.join(valid)}.")
    config = {"min_workers": auto.min_workers, "max_workers": auto.max_workers, **auto.settings}
    if auto.policy == "pecan":
        config.update(_placement_prices(loaded))
    if auto.start == "profile":  # the newest profile's prediction (orchestrator/profiling/uses.py)
        from .profiling.uses import start_workers

        config["start_workers"], config["start_note"] = start_workers(loaded, auto.min_workers, auto.max_workers)
    try:
        return make_policy(auto.policy, config)
    except ValueError as exc:
        raise loaded.error(("autoscale", "settings"), _one_paragraph(exc)) from None


def _placement_prices(loaded: LoadedSpec) -> dict:
    """What Pecan's policy weighs, from the run's catalog: every trainer host's $/h together, one remote worker's CPU
    and memory $/h, the basis a remote worker is charged on (the spec's cost_basis), and how many local workers each
    trainer may start (service.local_workers)."""
    from .pricing import catalog_of

    spec = loaded.spec
    catalog = catalog_of(spec, loaded.base_dir)
    trainer = catalog.machine_hour(spec.trainer.machine, provisioning=spec.trainer.provisioning,
                                   needed_by="trainer.machine")
    worker = catalog.split(spec.service.worker_machine, provisioning=spec.service.provisioning,
                           needed_by="service.worker_machine")
    cpu, memory = (worker.total, 0.0) if worker.whole else (worker.cpu, worker.memory)  # whole: all of it as CPU
    return {"trainers_per_hour": trainer * spec.trainer.count, "worker_cpu_per_hour": cpu,
            "worker_memory_per_hour": memory, "basis": spec.cost_basis, "local_cap": spec.service.local_workers}


def _one_paragraph(exc: Exception) -> str:
    import pydantic

    if isinstance(exc, pydantic.ValidationError):
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        return f"{where}: {msg}" if where else msg
    return " ".join(str(exc).split())
