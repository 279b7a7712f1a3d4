"""`dsctl check PROVIDER [JOB.yaml]`: whether a place is ready for a run, before anything is created there.

The checks are the provider's own (capability ChecksPlace: for Google Cloud, the credentials, the APIs that must be
on, your permissions and the VMs' accounts' on the resources they are granted on, the organization's policies, the
network and the quotas), the same ones `dsctl up` runs before its first create, so both reach the same verdict.
Without a spec, the checks are those of the smallest run the provider ships an example of (specs/examples/
<provider>-smoke.yaml), in the project and zone given or the environment's.
"""

from __future__ import annotations

from pathlib import Path

from dsctl.provisioners import CheckResult, ChecksPlace, Where, get_provider
from dsctl.specs import LoadedSpec, SpecError, load_spec

from .preflight import load_job


def _example(provider: str) -> LoadedSpec:
    """The provider's smoke example, with the place it names left out (the flags or the environment say it)."""
    from importlib import resources

    path = resources.files("dsctl.specs.examples") / f"{provider}-smoke.yaml"
    loaded = load_spec(str(path))
    spec = loaded.spec
    if spec.gcp is not None:
        spec = spec.model_copy(update={"gcp": spec.gcp.model_copy(update={"project": None, "zone": None})})
    return LoadedSpec(spec=spec, source=loaded.source)


def check_place(provider: str, spec_path: Path | None, where: Where = Where()) -> tuple[LoadedSpec, list[CheckResult]]:
    """The spec checked (the one given, else the provider's smoke example) and every check's result, where `where`
    says (the options that locate a place: else the spec's, or the environment's)."""
    place = get_provider(provider)
    if not isinstance(place, ChecksPlace):
        raise SpecError(f"provider {provider} has nothing to check before a run: it creates nothing that bills "
                        "(`dsctl validate JOB.yaml` checks a spec).", field="PROVIDER")
    if spec_path is not None:
        loaded = load_job(spec_path, check_entrypoints=False)
        if loaded.spec.provider != provider:
            raise loaded.locate(SpecError(f"{spec_path} is a provider: {loaded.spec.provider} spec, not {provider}.",
                                          field="provider"))
    else:
        loaded = _example(provider)
    try:
        return loaded, place.check_place(loaded.spec, where)
    except SpecError as exc:
        raise loaded.locate(exc) from None
