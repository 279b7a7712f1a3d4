"""The autocache step of a job: profile on the workers, decide, hand the decision to the trainers.

With `autocache: {mode: auto}` the job's deployment is up but no trainer trains yet: one trainer
process profiles the pipeline through the service (its end and every hint, and the cache's
storage), and exits. Autoscaling is held meanwhile simply because the scaling policy sees no
training windows until training starts (Cachew profiles at one worker, then scales: §6.4).
The policy (policies/autocache.py) picks compute or a hint; the trainers are then started with
a copy of the spec whose `autocache.mode` is that choice, which is how the decision reaches the
dataset graph before `distribute`. The decision, its inputs and its projection are an event of
the run and part of its summary; the live view shows the phase and the decision.
"""

from __future__ import annotations

import time
from pathlib import Path

from dsctl.costmodel import load_catalog
from dsctl.costmodel.storage import fit_read_model, held_out_errors
from dsctl.provisioners import Deployment, TrainerLaunch
from dsctl.specs import SpecError

from .context import RunContext
from .home import dsctl_home
from .outcome import RunFailed
from .policies.autocache import decide, hints_from_points
from .tail import JsonlTail

PROFILE_TIMEOUT_S = 300.0
SHARDED = ("distributed_epoch", "dynamic", "file", "data", "file_or_data", "hint")


def needs_profile(spec, mode: str) -> bool:
    ac = spec.autocache
    return ac is not None and ac.mode == "auto" and mode in ("service", "colocated")


def elements_per_epoch(spec) -> int:
    """N of the projection: the builtins' epoch when known, else 10,000 elements (the choice does not
    depend on N, only the projected seconds do)."""
    p = spec.pipeline.params or {}
    if spec.pipeline.builtin == "synthetic":
        return int(p.get("elements", 4096))
    if spec.pipeline.builtin == "images":
        return int(p.get("num_files", 8)) * int(p.get("images_per_file", 64))
    if spec.pipeline.builtin == "text":
        return int(p.get("num_files", 8)) * int(p.get("sequences_per_file", 256))
    return 10_000


def storage_model(measured: dict):
    """The read model fitted on the fit sizes, and its relative errors on the held-out sizes."""
    fit = [(p["bytes"], p["s_per_element"]) for p in measured["fit"]]
    held = [(p["bytes"], p["s_per_element"]) for p in measured["held_out"]]
    model = fit_read_model(fit)
    return model, [{"bytes": b, "measured_s": s, "predicted_s": model.read_s(b), "error": e}
                   for (b, s), e in zip(held, held_out_errors(model, held))]


def decide_from_profile(spec, profile: dict, gb_month: float | None):
    """The decision and the record of its inputs, from one `autocache_profile` record."""
    points = {p["point"]: p for p in profile["points"]}
    end = points["end"]
    if not end.get("s_per_element"):
        raise RunFailed("autocache profiling read no elements at the pipeline's end; see the profile log")
    hints = hints_from_points(points, profile["hints"])
    model, checks = storage_model(profile["storage"])
    decision = decide(end["s_per_element"], hints, model, n_elements=elements_per_epoch(spec), gb_month=gb_month,
                      tolerance=spec.autocache.tolerance)
    inputs = {"points": profile["points"], "storage_model": {"fixed_s": model.fixed_s, "s_per_byte": model.s_per_byte,
                                                             "held_out": checks},
              "storage_kind": spec.autocache.storage_kind(), "gb_month": gb_month}
    return decision, inputs


def _price(spec) -> float | None:
    try:
        return load_catalog(spec.pricing).storage_gb_month(spec.autocache.storage_kind())
    except SpecError:
        return None  # priced by time alone; the event says so


def profile_and_decide(ctx: RunContext, dep: Deployment) -> tuple[Path, dict]:
    """Run the profiling trainer, decide, record; the spec file the trainers get, and the decision (the summary's
    `autocache`)."""
    spec = ctx.spec
    if ctx.mode == "service" and spec.service.processing_mode in SHARDED:
        ctx.event("autocache", "autocache: compute (caching needs processing_mode: parallel_epochs; under "
                               f"{spec.service.processing_mode} each worker would cache only its share)")
        return _with_mode(ctx, "compute"), {"choice": "compute", "reason": "sharded processing"}
    ctx.phase("profiling autocache")
    profile_spec = _with_mode(ctx, "profile", name="spec-profile.json")
    metrics_dir = ctx.run_dir / "autocache-profile"
    launch = TrainerLaunch(mode=ctx.mode, spec_json=profile_spec, metrics_dir=metrics_dir,
                           base_dir=ctx.loaded.base_dir, cache_dir=dsctl_home() / "cache", count=1)
    ctx.provider.start_trainers(dep, launch, ctx.event)
    profile = _wait_profile(ctx, dep, JsonlTail(metrics_dir / "trainer-0.jsonl"))
    if profile.get("hits"):
        choice = profile["hits"][-1]  # the one nearest the end saves the most work (Cachew: highest throughput)
        reason = (f"cache hit: a job with the same pipeline sealed a cache at {', '.join(profile['hits'])}; reading "
                  f"{choice} without profiling")
        ctx.event("autocache", f"autocache: {choice}: {reason}")
        return _with_mode(ctx, choice), {"choice": choice, "reason": reason, "hits": profile["hits"]}
    gb_month = _price(spec)
    decision, inputs = decide_from_profile(spec, profile, gb_month)
    ctx.store.add_event(ctx.run_id, "autocache-profile", _profile_text(inputs))
    priced = "" if gb_month is not None else f" (no {inputs['storage_kind']} price in {spec.pricing}: by time alone)"
    ctx.event("autocache", f"autocache: {decision.choice}: {decision.reason}{priced}")
    return _with_mode(ctx, decision.choice), {**decision.as_dict(), "inputs": inputs}


def _profile_text(inputs: dict) -> str:
    pts = "; ".join(f"{p['point']}: {p['s_per_element'] * 1e3:.3f} ms/element, {p['bytes_per_element']:.0f} B"
                    for p in inputs["points"] if p.get("s_per_element"))
    sm = inputs["storage_model"]
    checks = ", ".join(f"{c['bytes']} B {c['error']:+.0%}" for c in sm["held_out"])
    return (f"measured: {pts}; storage read model {sm['fixed_s'] * 1e6:.0f} us + {sm['s_per_byte'] * 1e9:.2f} ns/B "
            f"per element (held-out sizes: {checks})")


def _wait_profile(ctx: RunContext, dep: Deployment, tail: JsonlTail) -> dict:
    deadline = time.monotonic() + PROFILE_TIMEOUT_S
    profile = error = None
    while True:
        for rec in tail.read():
            if rec.get("event") == "autocache_profile":
                profile = rec
            elif rec.get("event") == "error":
                error = rec
        state = ctx.supervisor.poll()
        if not state.running:
            break
        if profile is not None:  # its exit can take seconds to be seen on a loaded machine: do not wait for it
            ctx.provider.stop_trainers(dep)
            break
        if time.monotonic() > deadline:
            raise RunFailed(f"autocache profiling did not finish within {PROFILE_TIMEOUT_S:.0f} s; see "
                            f"{tail.path.parent}/trainer-0.log")
        time.sleep(0.2)
    for rec in tail.read():
        if rec.get("event") == "autocache_profile":
            profile = rec
        elif rec.get("event") == "error":
            error = rec
    if profile is None:
        if error and error.get("kind") == "user":
            raise SpecError(error.get("message", ""), where=ctx.loaded.source.path)
        why = error.get("message") if error else f"see {tail.path.parent}/trainer-0.log"
        raise RunFailed(f"autocache profiling failed: {why}")
    return profile


def _with_mode(ctx: RunContext, mode: str, name: str = "spec-trainers.json") -> Path:
    spec = ctx.spec
    assert spec.autocache is not None, "only a job with autocache: profiles and decides"
    out = spec.model_copy(update={"autocache": spec.autocache.model_copy(update={"mode": mode})})
    path = ctx.run_dir / name
    path.write_text(out.model_dump_json(indent=1))
    return path


def cache_used(rec: dict, known: dict | None, spec) -> dict | None:
    """What the run's cache is, from trainer 0's autocache records: where, which hint, written (put) or read
    (get), how many bytes and on what storage (what `dsctl cost report` prices). A put's bytes come with
    its seal; a put never sealed keeps bytes None (nothing later jobs would read, so nothing to keep). A cache that
    failed mid-job (runtime/autocache.py: recover) says so: a failed put was removed (nothing kept, nothing priced);
    a failed get was moved aside, and is priced as it was read until someone removes it."""
    if rec.get("failed") in ("write", "read") and known is not None:
        failed = {**known, "failed": rec["failed"]}
        return {**failed, "sealed": False, "bytes": None} if rec["failed"] == "write" else failed
    state, path = rec.get("state"), rec.get("path")
    if state not in ("put", "get") or not path:
        return known
    sealed = rec.get("kind") == "autocache-sealed"
    return {"hint": rec.get("hint"), "path": path, "state": state, "sealed": state == "get" or sealed,
            "bytes": rec.get("bytes"), "storage_kind": spec.autocache.storage_kind()}
