"""`dsctl profile`'s arithmetic, on measurements made up here (no TensorFlow): the model's snapshots summed per
transformation, the table's columns, what bounds throughput, the worker formula, the candidates and their order,
and the records' round trips. Each rule has a case that a plausible mistake would fail: inflation inverted, CPU
per element divided by the wrong count, workers from wall time instead of CPU time."""

from __future__ import annotations

import math

import pytest

from dsctl.orchestrator.profiling import advice
from dsctl.orchestrator.profiling.analysis import predict, table, worker_bounds
from dsctl.orchestrator.profiling.record import Effect, Profile, Recommendation
from dsctl.runtime.profiling.chain import align, kind_of_model
from dsctl.runtime.profiling.model import NodeSample, Tracker
from dsctl.runtime.profiling.record import (
    ChainStep,
    Hint,
    Measurement,
    OpMeasure,
    SectionInfo,
    StepMeasure,
    Structure,
    Variant,
    measurement_from,
    to_json,
    variant_from,
)
from dsctl.specs.pipeline_options import PipelineOptions


def op(path: str, *, self_s: float = 0.0, out: int = 100, inn: int = 100, bin_: int = 1000, bout: int = 1000,
       asynchronous: bool = False, parallelism: float | None = None, tunable: bool = False, wait_s: float = 0.0,
       py: int | None = None, label: str | None = None, kind: str = "map") -> OpMeasure:
    name = path.rsplit("/", 1)[-1]
    return OpMeasure(path=path, name=name, label=label or name, kind=kind, parent=path.rsplit("/", 1)[0],
                     inner=False, asynchronous=asynchronous, py_index=py, self_s=self_s, elements_out=out,
                     elements_in=inn, bytes_in=bin_, bytes_out=bout, parallelism=parallelism, tunable=tunable,
                     wait_s=wait_s)


def measurement(ops, *, batches: int = 100, seconds: float = 1.0, cpu_s: float = 1.0, cores: int = 2,
                step: float = 0.0, examples: float | None = None) -> Measurement:
    return Measurement(label="as written", seconds=seconds, warmup_s=1.0, batches=batches, cpu_s=cpu_s, cores=cores,
                       consumer_step_s=step, ops=tuple(ops), batch_bytes=1000.0, examples_per_batch=examples)


# -- the autotune model's snapshots --------------------------------------------------------------------------------

def node(nid, name, inputs=(), *, ns=0, el=0, bin_=0, bout=0, cls=3, params=()):
    return NodeSample(id=nid, name=name, node_class=cls, inputs=tuple(inputs), processing_ns=ns, elements=el,
                      bytes_in=bin_, bytes_out=bout, parameters=params)


def test_counts_are_window_deltas_summed_over_the_iterators_a_repeat_makes():
    """A repeat's input is a new iterator each epoch; each adds what it counted while seen, the first from where the
    window started."""
    t = Tracker()
    t.start(1, {1: node(1, "Root", [2], ns=10, el=5), 2: node(2, "Repeat", [3], ns=100, el=5, bin_=50, bout=50),
                3: node(3, "Map", [], ns=1000, el=5, bout=50)})
    t.observe(1, {1: node(1, "Root", [2], ns=20, el=10), 2: node(2, "Repeat", [4], ns=150, el=10, bin_=100, bout=100),
                  4: node(4, "Map", [], ns=400, el=3, bout=30)})  # epoch 2's Map; epoch 1's ended at 5 elements
    t.observe(1, {1: node(1, "Root", [2], ns=30, el=12), 2: node(2, "Repeat", [4], ns=160, el=12, bin_=100, bout=100),
                  4: node(4, "Map", [], ns=600, el=5, bout=50)})
    by = {x.path: x for x in t.totals()}
    m = by["Root/Repeat/Map"]
    assert (m.instances, m.elements, m.self_ns) == (2, 5, 600)  # epoch 1 added nothing in the window; epoch 2 all of it
    assert by["Root/Repeat"].elements == 7 and by["Root/Repeat"].self_ns == 60
    assert [x.path for x in t.totals()] == ["Root/Repeat/Map", "Root/Repeat", "Root"]  # sources first


def test_what_an_ended_iterator_counted_after_its_last_snapshot_is_scaled_from_its_consumers_bytes():
    t = Tracker()
    t.start(1, {1: node(1, "Root", [2]), 2: node(2, "Repeat", [3]), 3: node(3, "Map", [])})
    # epoch 1's Map was last seen at 40 bytes out; it ended at 100; the Repeat (alive) received 200 in all
    t.observe(1, {1: node(1, "Root", [2]), 2: node(2, "Repeat", [4], bin_=60), 3: node(3, "Map", [], ns=400, el=4, bout=40),
                  4: node(4, "Map", [], ns=200, el=2, bout=20)})
    t.observe(1, {1: node(1, "Root", [2]), 2: node(2, "Repeat", [4], bin_=200, bout=200),
                  4: node(4, "Map", [], ns=1000, el=10, bout=100)})
    m = {x.path: x for x in t.totals()}["Root/Repeat/Map"]
    assert m.correction == pytest.approx(200 / 140)
    assert m.bytes_out == pytest.approx(200) and m.elements == pytest.approx(14 * 200 / 140)
    assert m.self_ns / m.elements == pytest.approx(1400 / 14)  # per element: as seen


def test_interleave_iterators_share_one_path_and_a_zip_input_keeps_its_place_while_the_other_is_made():
    t = Tracker()
    # a zip whose second input is not made yet, then is: the first keeps its path
    t.start(1, {1: node(1, "Root", [2]), 2: node(2, "Zip", [3]), 3: node(3, "Range", [])})
    t.observe(1, {1: node(1, "Root", [2]), 2: node(2, "Zip", [3, 4]), 3: node(3, "Range", [], el=5),
                  4: node(4, "Random", [], el=5), 5: node(5, "X", [])})
    paths = {x.path for x in t.totals()}
    assert {"Root/Zip/Range", "Root/Zip/Random[1]"} <= paths
    t = Tracker()
    t.start(1, {1: node(1, "Root", [2]), 2: node(2, "ParallelInterleaveV4", [3, 4, 5], cls=2), 3: node(3, "TensorSlice"),
                4: node(4, "TFRecord", el=3), 5: node(5, "TFRecord", el=4)})
    t.observe(1, {1: node(1, "Root", [2]), 2: node(2, "ParallelInterleaveV4", [3, 4, 5], cls=2), 3: node(3, "TensorSlice"),
                  4: node(4, "TFRecord", el=6), 5: node(5, "TFRecord", el=9)})
    inner = {x.path: x for x in t.totals()}["Root/ParallelInterleaveV4/TFRecord*"]
    assert inner.inner and inner.instances == 2 and inner.elements == 3 + 5


# -- the table -----------------------------------------------------------------------------------------------------

def test_inflation_is_bytes_out_over_bytes_in_and_cpu_per_element_is_per_element_produced():
    decode = op("Root/Filter/Decode", self_s=0.4, inn=100, out=100, bin_=1_000, bout=8_000, label="map(decode)", py=1)
    keep = op("Root/Filter", self_s=0.2, inn=100, out=25, bin_=8_000, bout=2_000, label="filter(keep)", kind="filter",
              py=2)
    rows, rate = table(measurement([decode, keep], cpu_s=0.6, batches=25))
    d, f = rows
    assert d.inflation == pytest.approx(8.0) and f.inflation == pytest.approx(0.25)  # inverted: 0.125 and 4
    assert f.cpu_s_per_element == pytest.approx(0.2 / 25)  # per element produced, not per element received (0.002)
    assert d.cpu_s_per_element == pytest.approx(0.4 / 100)
    assert f.cpu_s_per_batch == pytest.approx(0.2 / 25) and rate.cpu_s_per_batch == pytest.approx(0.6 / 25)
    assert sum(r.share for r in rows) == pytest.approx(1.0)
    assert rate.self_coverage == pytest.approx(1.0) and rate.scale == pytest.approx(1.0)


def test_self_time_above_the_oss_cpu_is_scaled_down_and_what_no_transformation_holds_is_outside():
    busy = [op("Root/A", self_s=3.0, py=0), op("Root/A/B", self_s=1.0, py=1)]
    rows, rate = table(measurement(busy, cpu_s=2.0, batches=10))
    assert rate.self_coverage == pytest.approx(2.0) and rate.scale == pytest.approx(0.5)
    assert [r.cpu_s_per_batch for r in rows] == pytest.approx([0.15, 0.05])  # sums to the 0.2 s the OS counted
    rows, rate = table(measurement(busy, cpu_s=5.0, batches=10))  # 1 s of CPU in no transformation
    assert rate.scale == 1.0 and rate.outside_cpu_s_per_batch == pytest.approx(0.1)


def test_the_busiest_resource_bounds_throughput():
    # 100 batches/s; the consumer's thread spends 9.5 ms per batch in a sequential map, CPU at 10%
    seq = op("Root/Map", self_s=0.95, py=0, label="map(fetch)")
    rows, rate = table(measurement([seq, op("Root/Map/Range", self_s=0.01, kind="source")], cpu_s=0.2, batches=100))
    # its source runs in the same thread: 9.6 ms per batch in all
    assert rows[0].bounds and rows[0].thread == "consumer" and rows[0].utilization == pytest.approx(0.96)
    assert "consumer" in rate.bound
    # CPU-bound: the process used all its cores; the transformation with most CPU is named
    par = [op("Root/P", self_s=1.5, asynchronous=True, parallelism=2, tunable=True, label="map(decode)"),
           op("Root/P/Q", self_s=0.3, label="map(small)")]
    rows, rate = table(measurement(par, cpu_s=1.9, seconds=1.0, cores=2))
    assert rows[0].bounds and not rows[1].bounds and rate.bound.startswith("CPU")


def test_workers_come_from_cpu_time_not_wall_time():
    """0.1 CPU-seconds per batch measured on 2 cores (wall 0.05 s per batch): an 8-core worker makes 80 batches/s, so
    400 batches/s need 5 workers; from wall time one would say 400 x 0.05 = 20."""
    m = measurement([op("Root/P", self_s=10.0, asynchronous=True, parallelism=2, tunable=True)], batches=100,
                    seconds=5.0, cpu_s=10.0, cores=2)
    p = predict(m, target_bps=400.0, target_source="--target-bps", worker_machine="n2-standard-8", cores_per_worker=8)
    assert p.per_worker_bps == pytest.approx(80.0) and p.limit == "CPU"
    assert p.workers == 5
    assert "8 cores ÷ 100 ms CPU per batch" in p.formula and p.formula.endswith("= 5")


def test_a_sequential_wait_bounds_a_worker_whatever_its_cores():
    """quickstart's shape: a 2 ms sleep per element, 16 per batch, in one thread: 31 batches/s per worker at most."""
    sleep = op("Root/Prefetch/Batch/Map/Sleep", self_s=0.001, wait_s=16 * 0.002 * 100, py=2, label="sleep(2 ms)")
    m = measurement([sleep, op("Root/Prefetch/Batch/Map", self_s=0.1, asynchronous=True, parallelism=2, tunable=True),
                     op("Root/Prefetch/Batch", self_s=0.01), op("Root/Prefetch", self_s=0.01, asynchronous=True)],
                    batches=100, seconds=3.3, cpu_s=0.2)
    p = predict(m, target_bps=200.0, target_source="spec", worker_machine="n2-standard-8", cores_per_worker=8)
    assert p.limit == "input thread of Map" and p.per_worker_bps == pytest.approx(1 / 0.0320, rel=0.01)
    assert p.workers == 7
    assert predict(m, target_bps=None, target_source="none", worker_machine="x", cores_per_worker=8).workers is None


def test_fixed_parallel_calls_bound_a_worker_and_autotuned_ones_do_not():
    fixed = op("Root/P", self_s=2.0, asynchronous=True, parallelism=4, tunable=False, label="map(f)")
    tuned = op("Root/P", self_s=2.0, asynchronous=True, parallelism=4, tunable=True, label="map(f)")
    assert [b.bps for b in worker_bounds(measurement([fixed], cpu_s=0.5), 8) if "call" in b.what] == [pytest.approx(200.0)]
    assert not [b for b in worker_bounds(measurement([tuned], cpu_s=0.5), 8) if "call" in b.what]


# -- matching the model's transformations to the code's -----------------------------------------------------------

def test_fused_and_added_transformations_are_matched_to_what_the_code_wrote():
    python = [("source", "range"), ("map", "map(fetch)"), ("options", "options"), ("batch", "batch(16)"),
              ("prefetch", "prefetch(AUTOTUNE)")]
    model = [("R/P/MB/Range", kind_of_model("Range", False)), ("R/P/MB", kind_of_model("MapAndBatch", True)),
             ("R/P", kind_of_model("Prefetch", True)), ("R/P2", kind_of_model("Prefetch", True))]
    got = align(model, python)
    assert got["R/P/MB/Range"] == (0, "range") and got["R/P/MB"] == (1, "map(fetch) + batch(16)")
    assert got["R/P"] == (4, "prefetch(AUTOTUNE)") and "R/P2" not in got  # the second prefetch: tf.data's own
    assert kind_of_model("FlatMap", True) == ("flat_map",) and kind_of_model("ShuffleAndRepeat", True) == ("shuffle", "repeat")


# -- candidates ----------------------------------------------------------------------------------------------------

def structure(chain=(), hints=(), sections=(), map_parallelization=True) -> Structure:
    return Structure(chain=tuple(chain), hints=tuple(hints), sections=tuple(sections),
                     map_parallelization=map_parallelization, inject_prefetch=True, autotune=True, finite=False,
                     element="")


def test_a_bounding_sequential_map_is_parallelized_by_option_when_it_is_stateless_else_by_code():
    chain = [ChainStep(0, "source", "range"), ChainStep(1, "map", "map(fetch)", sequential_map=True, stateless=True)]
    seq = [op("Root/Map", self_s=0.95, py=1, label="map(fetch)"), op("Root/Map/Range", self_s=0.01, py=0, kind="source")]
    m = measurement(seq, cpu_s=0.9, batches=100)
    rows, rate = table(m)
    c = advice.parallelize(structure(chain, map_parallelization=False), m, rows, rate.scale, None)
    assert c is not None and c.recommendation.spec_patch == {"pipeline": {"options": {"map_parallelization": True}}}
    assert c.variant.options is not None and c.variant.options.map_parallelization is True
    chain[1] = ChainStep(1, "map", "map(fetch)", sequential_map=True, stateless=False)
    c = advice.parallelize(structure(chain), m, rows, rate.scale, None)
    assert c is not None and c.recommendation.spec_patch is None and c.variant.parallelize == (1, -1)
    assert "num_parallel_calls=tf.data.AUTOTUNE" in c.recommendation.apply
    # a map that mostly waits (self time 10x its CPU) gets an explicit number of calls
    m = measurement(seq, cpu_s=0.09, batches=100)
    rows, rate = table(m)
    c = advice.parallelize(structure(chain), m, rows, rate.scale, None)
    assert c is not None and c.variant.parallelize is not None and c.variant.parallelize[1] >= 2 * m.cores


def test_a_prefetch_is_proposed_only_for_reader_thread_work_the_step_could_overlap():
    busy = [op("Root/Sleep", self_s=0.0, wait_s=1.0, py=1, label="sleep(0.625 ms)"), op("Root/Sleep/Range", py=0)]
    m = measurement(busy, batches=100, seconds=2.0, cpu_s=0.1)
    rows, _ = table(m)
    c = advice.prefetch(structure(), m, rows, 0.01, None)
    assert c is not None and c.baseline_step_s == 0.01 and c.variant.consumer_step_s == 0.01
    assert advice.prefetch(structure(), m, rows, 0.0, None) is None  # a trainer with no step: nothing to overlap
    idle = [op("Root/Prefetch", self_s=0.001, asynchronous=True, py=1), op("Root/Prefetch/Map", self_s=0.5, py=0)]
    m = measurement(idle, batches=100, seconds=2.0, cpu_s=0.5)
    assert advice.prefetch(structure(), m, table(m)[0], 0.01, None) is None


def test_the_cache_goes_at_the_deepest_hint_that_fits_and_saves_enough():
    ops_ = [op("R/B/M2/M1/S", self_s=0.1, py=0, kind="source", bout=1000, out=100),
            op("R/B/M2/M1", self_s=0.6, py=1, bout=10_000, out=100), op("R/B/M2", self_s=0.2, py=2, bout=40_000, out=100),
            op("R/B", self_s=0.1, py=3, kind="batch")]
    m = measurement(ops_, cpu_s=1.0, batches=10, examples=10)
    rows, _ = table(m)
    hints = [Hint("source", 0, -2), Hint("decoded", 1, -2), Hint("full", 2, -2)]
    s = structure(hints=hints)
    c = advice.cache(s, m, rows, elements_per_epoch=1000, budget_bytes=1e9, budget_source="given", sharded=False)
    assert c is not None and c.recommendation.spec_patch == {"autocache": {"mode": "full"}}  # 400 kB fits: deepest
    c = advice.cache(s, m, rows, elements_per_epoch=1000, budget_bytes=200_000, budget_source="given", sharded=False)
    assert c is not None and c.recommendation.spec_patch == {"autocache": {"mode": "decoded"}}  # 'full' is 400 kB
    assert advice.cache(s, m, rows, elements_per_epoch=1000, budget_bytes=50_000, budget_source="given",
                        sharded=False) is None  # 'source' fits but saves 10% of the CPU
    assert c.variant.cache == "decoded"  # an epoch of 100 batches at 10 batches/s: written for real in the warm-up


def test_autoorder_ranks_steps_by_bytes_out_over_bytes_in_and_keeps_unmeasured_ones_in_place():
    steps = [StepMeasure("aug", "upscale", 100, 100, 1000, 16_000, 3.0), StepMeasure("aug", "keep", 100, 25, 1000, 250, 0.1)]
    assert advice.auto_order(["upscale", "flip", "keep"], steps) == ["keep", "flip", "upscale"]
    cands = advice.reorder(structure(sections=[SectionInfo("aug", ("upscale", "keep"), ("upscale", "keep"))]), steps)
    assert len(cands) == 1 and cands[0].variant.order == {"aug": ["keep", "upscale"]}
    assert cands[0].recommendation.spec_patch == {"pipeline": {"order": {"aug": ["keep", "upscale"]}}}
    assert not advice.reorder(structure(sections=[SectionInfo("aug", ("upscale", "keep"), ("keep", "upscale"))]), steps)


# -- records -------------------------------------------------------------------------------------------------------

def test_records_survive_json():
    m = measurement([op("Root/A", self_s=1.0, wait_s=0.5)], step=0.01)
    assert measurement_from(to_json(m)) == m
    v = Variant(label="x", options=PipelineOptions(inject_prefetch=True), order={"a": ["b"]}, parallelize=(3, 16))
    assert variant_from(to_json(v)) == v
    rows, rate = table(m)
    p = predict(m, target_bps=10.0, target_source="t", worker_machine="n2-standard-8", cores_per_worker=8)
    prof = Profile(job="j", spec_path="j.yaml", run_id="r", created_at=1.0, seconds=1.0, element="e", finite=False,
                   rows=rows, rate=rate, prediction=p,
                   recommendations=[Recommendation("cache", "t", "d", "a", {"autocache": {"mode": "x"}},
                                                   Effect(10.0, 40.0, 0.2, 0.05))])
    d = prof.to_dict()
    assert d["recommendations"][0]["effect"]["gain"] == pytest.approx(4.0)
    assert Profile.from_dict(d) == prof
    assert math.isinf(Effect(0.0, 1.0, 1.0, 1.0).speedup)


# -- what profiles feed ----------------------------------------------------------------------------------------------

def _profile(run_id: str, workers: int | None, target: float | None = 200.0) -> Profile:
    m = measurement([op("Root/A", self_s=0.1, wait_s=3.2, label="sleep")], batches=100, seconds=3.3, cpu_s=0.2)
    rows, rate = table(m)
    p = predict(m, target_bps=target, target_source="spec", worker_machine="n2-standard-8", cores_per_worker=8)
    prof = Profile(job="j", spec_path="j.yaml", run_id=run_id, created_at=1.0, seconds=3.0, element="e", finite=False,
                   rows=rows, rate=rate, prediction=p)
    if workers is not None:
        from dataclasses import replace

        prof.prediction = replace(p, workers=workers)
    return prof


def _record(store, prof: Profile, spec, status: str = "succeeded") -> None:
    from dsctl.orchestrator.profiling.session import profile_summary
    from dsctl.specs import spec_hash

    store.create_run(id=prof.run_id, name=spec.name, kind="profile", provider="local", mode="profile", status=status,
                     spec_json=spec.model_dump_json(), spec_hash=spec_hash(spec), workers=1, trainers=1)
    store.update_run(prof.run_id, summary=profile_summary(prof))


def test_autoscale_start_profile_starts_at_the_newest_matching_profiles_count_within_bounds(home):
    from dsctl.orchestrator.preflight import check_autoscale
    from dsctl.orchestrator.store import RunStore
    from dsctl.specs import load_spec_text

    text = ("name: j\ntrainer: {steps: 10}\npipeline: {builtin: synthetic, params: {epochs: null}}\n"
            "autoscale: {min_workers: 2, max_workers: 6, start: profile}\n")
    loaded = load_spec_text(text, source="j.yaml")
    assert check_autoscale(loaded).initial_workers == 2  # no profile yet: min_workers, and the note says why
    store = RunStore()
    other = load_spec_text(text.replace("epochs: null", "epochs: null, latency_ms: 3"), source="j.yaml")
    _record(store, _profile("j-profile-a", 4), loaded.spec)
    _record(store, _profile("j-profile-b", 3), other.spec)  # newer, but another pipeline
    _record(store, _profile("j-profile-c", 5), loaded.spec, status="failed")
    policy = check_autoscale(loaded)
    assert policy.initial_workers == 4 and "j-profile-a predicted 4" in policy.config.start_note
    _record(store, _profile("j-profile-d", 9), loaded.spec)
    assert check_autoscale(loaded).initial_workers == 6  # kept within min_workers..max_workers
    # the record reads back typed, the profile whole, and `dsctl runs` lists its measured rate
    from dsctl.cli.render import runs_table
    from dsctl.orchestrator.runs import list_runs

    record = store.find("j-profile-a")
    assert record.profiled.profile() == _profile("j-profile-a", 4) and record.job.batches_per_s is None
    table = runs_table(list_runs(), width=200)
    rates = list(table.columns[[c.header for c in table.columns].index("batches/s")].cells)
    assert rates and set(rates) == {f"{_profile('x', 4).rate.batches_per_s:,.2f}"}


def test_a_sweep_is_calibrated_from_a_profile_per_trainer(home, tmp_path):
    import json

    from dsctl.orchestrator.profiling.uses import calibration_from, load_profile

    prof = _profile("p", 7, target=400.0)  # 2 trainers consume 400 batches/s; a worker makes 31.25
    cal = calibration_from(prof, trainers=2, trainer_vcpus=96)
    assert cal.ideal == pytest.approx(200.0) and cal.points == {1: pytest.approx(prof.prediction.per_worker_bps / 2)}
    assert cal.colocated == pytest.approx(prof.prediction.per_worker_bps)  # the sequential wait holds on a trainer too
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(prof.to_dict()))
    assert load_profile(str(path)) == prof
    path.write_text("{}")
    with pytest.raises(Exception, match="not a dsctl profile"):
        load_profile(str(path))


def test_pipeline_options_and_order_are_checked_in_the_spec():
    from dsctl.specs import SpecError, load_spec_text

    base = "name: j\ntrainer: {steps: 10}\npipeline: {builtin: synthetic, %s}\n"
    spec = load_spec_text(base % "options: {map_parallelization: true, autotune_cpu_budget: 8}", source="j.yaml").spec
    assert spec.pipeline.options is not None
    assert spec.pipeline.options.set_fields() == {"map_parallelization": True, "autotune_cpu_budget": 8}
    for bad, says in (("options: {map_parallelisation: true}", "map_parallelisation"),
                      ("options: {autotune_cpu_budget: 0}", "autotune_cpu_budget"),
                      ("order: {aug: [a, a]}", "listed twice"), ("order: {aug: []}", "1 to 64"),
                      ("order: {'a b': [x]}", "section's name")):
        with pytest.raises(SpecError, match=says) as err:
            load_spec_text(base % bad, source="j.yaml")
        assert "j.yaml:3" in str(err.value)


def test_a_hybrid_plan_predicts_the_remote_workers_saved_from_the_newest_profile_of_its_pipeline(home):
    """`dsctl up --dry-run` of a hybrid spec on Google Cloud: without a profile the plan says it cannot predict the
    remote workers saved; once this job's pipeline is profiled, it predicts them from that profile, named."""
    from pathlib import Path

    from dsctl.orchestrator.up import UpOptions, approved
    from dsctl.specs import load_spec_text

    text = ("name: j\nprovider: gcp\nservice: {workers: 4, placement: hybrid, local_workers: 2}\n"
            "trainer: {machine: tpu-v2-8, steps: 10}\npipeline: {builtin: synthetic, params: {epochs: null}}\n"
            "gcp: {project: my-project-123, zone: us-central1-b}\n")
    loaded = load_spec_text(text, source="j.yaml")

    class Talk:
        said: list[str] = []

        def say(self, text: str) -> None:
            self.said.append(text)

    def plan() -> str:
        talk = Talk()
        talk.said = []
        assert approved(loaded, UpOptions(path=Path("j.yaml"), dry_run=True), talk) is False  # type: ignore[arg-type]
        return "\n".join(talk.said)

    assert "Remote workers saved: not predicted: no profile of this job's pipeline" in plan()
    from dsctl.orchestrator.store import RunStore

    _record(RunStore(), _profile("j-profile-h", 2), loaded.spec)
    shown = plan()
    assert "Remote workers saved (predicted from profile j-profile-h:" in shown, shown
    assert "this one has 4 remote and 2 in-process" in shown, shown
