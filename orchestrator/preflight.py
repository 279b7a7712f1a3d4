"""Checks of a loaded spec that need the orchestrator's parts: its autoscale policy.

(Whether the user's entrypoints import and return what they should is checked when the spec
is loaded, in a child process with a time limit: dsctl.specs.entrypoints.)
"""

from __future__ import annotations

import difflib

from dsctl.specs import LoadedSpec


def check_autoscale(loaded: LoadedSpec, policy: str | None = None):
    """The scaling policy a run uses (spec's `autoscale:`, or --autoscale), checked; None without autoscaling."""
    from dsctl.orchestrator.policies import make_policy
    from dsctl.specs.schema import AutoscaleSpec

    from dsctl.orchestrator.policies import POLICIES

    auto = loaded.spec.autoscale
    if policy is not None and (auto is None or auto.policy != policy):
        # Another policy than the spec's: its settings belong to the spec's policy, not this one.
        auto = (auto or AutoscaleSpec()).model_copy(update={"policy": policy, "settings": {}})
    if auto is None:
        return None
    config_model = POLICIES[auto.policy][1]
    for key in auto.settings:
        if key not in config_model.model_fields or key in ("min_workers", "max_workers"):
            valid = sorted(k for k in config_model.model_fields if k not in ("min_workers", "max_workers"))
            guess = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" Did you mean '{guess[0]}'?" if guess else ""
            raise loaded.error(("autoscale", "settings", key),
                               f"'{key}' is not a setting of the {auto.policy} policy.{hint} Valid settings: {', '.join(valid)}.")
    config = {"min_workers": auto.min_workers, "max_workers": auto.max_workers, **auto.settings}
    try:
        return make_policy(auto.policy, config)
    except ValueError as exc:
        raise loaded.error(("autoscale", "settings"), _one_paragraph(exc)) from None


def _one_paragraph(exc: Exception) -> str:
    import pydantic

    if isinstance(exc, pydantic.ValidationError):
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        return f"{where}: {msg}" if where else msg
    return " ".join(str(exc).split())
