"""Benchmark: does following `dsctl profile`'s first recommendation pay, and does its worker count match a sweep?

    python benchmarks/bench_profile.py [--seconds 5] [--rounds 2] [--sweep 1..10:1] [--skip-sweep]

Part 1. Four deliberately misconfigured pipelines (benchmarks/profile_cases/cases.py): a sequential map, no
prefetch, an inflating map before a filter, a cacheable expensive prefix. Each is profiled; its first
recommendation is then followed as a user would: its spec field set in a copy of the spec (pipeline.options,
pipeline.order, autocache.mode), or, for a code change, the case's own fixed pipeline (cases.py's parameters,
with the number of calls the recommendation names). Before and after are then measured in one run, alternating,
`--rounds` times each in the same profiling process dsctl uses (a window of `--seconds` after a warm-up; a
prefetch's pair with the trainer's step time per batch, which is what a prefetch overlaps), and the ratios of
the means printed: batches/s after ÷ before, CPU-s per batch before ÷ after. Goal: 2× or more on three of four.

Part 2. The worker count `dsctl profile` predicts for a latency-bound job (a 2 ms per-element wait, 16 elements
a batch, a 5 ms trainer step: 200 batches/s to feed) beside the knee of a real local sweep of the same job: the
smallest count within 3% of the best measured batches/s. The prediction uses the profile alone (one process, CPU
per batch and the pipeline's sequential limits): every sweep point is held out from it. Goal: within one worker
or 15%. (CPU-bound scaling cannot be swept on this 2-core machine: every local worker shares its cores.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
CASES = ("sequential_map", "no_prefetch", "inflate_then_filter", "expensive_prefix")
KNEE_SPEC = """
name: bench-profile-knee
provider: local
service: {workers: 1}
trainer: {model: {kind: synthetic, step_time_ms: 5}, steps: 100000}
pipeline: {builtin: synthetic, params: {latency_ms: 2, batch_size: 16, epochs: null}}
"""


def merged(base: dict, patch: dict) -> dict:
    out = dict(base)
    for key, value in patch.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def followed(case: str, spec_path: Path, rec) -> tuple[Path, str]:
    """(the spec with the recommendation followed, what was done)."""
    spec = yaml.safe_load(spec_path.read_text())
    if rec.spec_patch is not None:
        after = merged(spec, rec.spec_patch)
        done = f"spec: {json.dumps(rec.spec_patch)}"
    else:  # a code change: the case's own fixed pipeline
        calls = re.search(r"num_parallel_calls=(\d+|tf\.data\.AUTOTUNE)", rec.apply)
        if case != "sequential_map" or calls is None:
            raise SystemExit(f"{case}: the first recommendation ({rec.title}) is a code change this benchmark has no "
                             f"fixed version of: {rec.apply}")
        n = -1 if calls.group(1).startswith("tf.") else int(calls.group(1))
        after = merged(spec, {"pipeline": {"params": {"parallel_calls": n}}})
        done = f"code: num_parallel_calls={calls.group(1)} (cases.sequential_map(parallel_calls={n}))"
    path = spec_path.with_name(f"{spec_path.stem}-after.yaml")
    path.write_text(yaml.safe_dump(after, sort_keys=False))
    return path, done


def measure_pair(before: Path, after: Path, *, seconds: float, rounds: int, step_s: float, work: Path):
    """Means over `rounds` alternating windows of each spec, in the profiling process dsctl uses."""
    from dsctl.orchestrator.preflight import load_job
    from dsctl.orchestrator.profiling.process import STARTUP_S, ProfilerProcess
    from dsctl.orchestrator.store import dsctl_home
    from dsctl.runtime.profiling.record import Variant, measurement_from, to_json

    out: dict[str, list] = {"before": [], "after": []}
    children = {}
    try:
        for name, path in (("before", before), ("after", after)):
            loaded = load_job(path, mode=None)
            folder = work / name
            folder.mkdir(parents=True, exist_ok=True)
            spec_json = folder / "spec.json"
            spec_json.write_text(loaded.spec.model_dump_json())
            children[name] = ProfilerProcess(spec_json, loaded.base_dir, dsctl_home() / "cache", folder)
            children[name].start()
            children[name].ask("inspect", STARTUP_S)
        for _ in range(rounds):
            for name in ("before", "after"):
                # a cache's first epoch is written in the warm-up, as a job's is
                m = measurement_from(children[name].ask(
                    "measure", 300, variant=to_json(Variant(label=name, consumer_step_s=step_s)), seconds=seconds,
                    warmup_s=8.0 if name == "after" else 2.0))
                out[name].append(m)
    finally:
        for child in children.values():
            child.close()
    return {k: (statistics.mean(m.batches_per_s for m in v), statistics.mean(m.cpu_s_per_batch for m in v))
            for k, v in out.items()}


def part1(args, work: Path) -> list[dict]:
    from dsctl.orchestrator.profiling.session import ProfileOptions, profile_job

    shutil.copytree(HERE / "profile_cases", work / "cases")
    rows = []
    for case in CASES:
        spec = work / "cases" / f"{case}.yaml"
        profile = profile_job(spec, ProfileOptions(seconds=args.seconds))
        if not profile.recommendations:
            rows.append({"case": case, "recommendation": None})
            continue
        rec = profile.recommendations[0]
        after, done = followed(case, spec, rec)
        step = rec.effect.consumer_step_s if rec.effect else 0.0
        got = measure_pair(spec, after, seconds=args.seconds, rounds=args.rounds, step_s=step, work=work / case)
        (b_bps, b_cpu), (a_bps, a_cpu) = got["before"], got["after"]
        rows.append({"case": case, "profile": profile.run_id, "recommendation": rec.title, "followed": done,
                     "step_ms": step * 1e3, "before_bps": b_bps, "after_bps": a_bps, "speedup": a_bps / b_bps,
                     "before_cpu_ms": b_cpu * 1e3, "after_cpu_ms": a_cpu * 1e3, "cpu_cut": b_cpu / a_cpu,
                     "profile_effect_gain": rec.effect.gain if rec.effect else None})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def part2(args, work: Path) -> dict:
    from dsctl.orchestrator.profiling.session import ProfileOptions, profile_job

    spec = work / "knee.yaml"
    spec.write_text(KNEE_SPEC)
    profile = profile_job(spec, ProfileOptions(seconds=args.seconds, recommend=False))
    env = {**os.environ}
    proc = subprocess.run([sys.executable, "-m", "dsctl.cli.main", "sweep", str(spec), "--workers", args.sweep,
                           "--window", "4s", "--json"], check=True, capture_output=True, text=True, env=env)
    summary = json.loads(proc.stdout)["summary"]
    points = {p["workers"]: p["batches_per_s"] for p in summary["points"] if not p["predicted"]}
    best = max(points.values())
    knee = min(n for n, bps in points.items() if bps >= 0.97 * best)
    predicted = profile.prediction.workers
    return {"profile": profile.run_id, "formula": profile.prediction.formula, "predicted": predicted,
            "sweep": summary.get("counts"), "points": points, "ideal_bps": summary["baselines"]["ideal"]["batches_per_s"],
            "knee": knee, "held_out": sorted(points), "within": abs(predicted - knee) <= max(1, 0.15 * knee)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sweep", default="1..10:1")
    ap.add_argument("--skip-sweep", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dsctl-bench-profile-"))
    os.environ["DSCTL_HOME"] = str(work / "home")
    rows = part1(args, work)
    print("\nfirst recommendation followed, measured here (means of", args.rounds, "alternating windows of",
          f"{args.seconds:g} s each):")
    print(f"{'case':<22} {'recommendation':<52} {'batches/s before → after':>26} {'':>8} "
          f"{'CPU per batch before → after':>30} {'':>8}")
    wins = 0
    for r in rows:
        if r.get("recommendation") is None:
            print(f"{r['case']:<22} no recommendation")
            continue
        wins += max(r["speedup"], r["cpu_cut"]) >= 2
        step = f" (with a {r['step_ms']:g} ms step)" if r["step_ms"] else ""
        print(f"{r['case']:<22} {r['recommendation'][:52]:<52} {r['before_bps']:>11.1f} → {r['after_bps']:<11.1f}"
              f" {r['speedup']:>6.2f}× {r['before_cpu_ms']:>12.3g} ms → {r['after_cpu_ms']:<9.3g} ms "
              f"{r['cpu_cut']:>6.2f}×{step}")
        print(f"{'':<22} followed: {r['followed']}")
    print(f"2× or more (batches/s up or CPU per batch down) on {wins} of {len(rows)}")
    if not args.skip_sweep:
        k = part2(args, work)
        print(f"\npredicted workers (profile {k['profile']}, the profile alone): {k['predicted']}")
        print(f"  {k['formula']}")
        print(f"measured knee of a local sweep (smallest count within 3% of the best; ideal "
              f"{k['ideal_bps']:.1f} b/s measured): {k['knee']} — held out from the prediction: every point, "
              f"{k['held_out']}")
        print("  " + ", ".join(f"{n}: {bps:.1f}" for n, bps in sorted(k["points"].items())) + " batches/s")
        print(f"within one worker or 15%: {'yes' if k['within'] else 'no'}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
