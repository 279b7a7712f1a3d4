"""`dsctl profile`'s measurement on small real tf.data pipelines, in this process: it names the transformation that
holds most of the CPU where that is known, its transformations' CPU adds up to what the OS counted, and the
pipeline changes it measures (an order, options, a parallel map) are the ones dsctl applies."""

from __future__ import annotations

import textwrap

import pytest

pytestmark = pytest.mark.integration  # imports TensorFlow in this process

tf = pytest.importorskip("tensorflow")

from dsctl.orchestrator.profiling.analysis import table  # noqa: E402
from dsctl.runtime import reorder  # noqa: E402
from dsctl.runtime.pipelines import PipelineError  # noqa: E402
from dsctl.runtime.pipelines.spec_pipeline import build_spec_pipeline  # noqa: E402
from dsctl.runtime.profiling.chain import py_function_use, python_chain  # noqa: E402
from dsctl.runtime.profiling.measure import measure  # noqa: E402
from dsctl.runtime.profiling.rewrite import parallelize  # noqa: E402
from dsctl.specs import load_spec_text  # noqa: E402

EXPENSIVE = textwrap.dedent("""
    import tensorflow as tf
    import dsctl

    W = tf.eye(64)

    def heavy(i):
        m = tf.random.stateless_uniform([64, 64], seed=tf.stack([i, tf.constant(1, tf.int64)]))
        _, m = tf.while_loop(lambda k, m: k < 60, lambda k, m: (k + 1, tf.tanh(tf.matmul(m, W))), (tf.constant(0), m))
        return {"id": i, "x": tf.reduce_mean(m, axis=0)}

    def light(e):
        return {"id": e["id"], "x": e["x"] * 2.0}

    def make_dataset(order_test=False):
        ds = tf.data.Dataset.range(1 << 20).map(heavy, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.map(light, num_parallel_calls=tf.data.AUTOTUNE)
        if order_test:
            ds = dsctl.reorderable(ds, "post", {
                "big": lambda d: d.map(lambda e: {"id": e["id"], "x": tf.tile(e["x"], [4])}),
                "even": lambda d: d.filter(lambda e: e["id"] % 2 == 0),
            })
        return ds.batch(16).prefetch(tf.data.AUTOTUNE)
""")


def _spec(tmp_path, pipeline: str):
    (tmp_path / "pipe.py").write_text(EXPENSIVE)
    text = f"name: p\ntrainer: {{steps: 10}}\npipeline: {pipeline}\n"
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return load_spec_text(text, source=str(path))


def _profiled(ds, seconds: float = 1.5):
    _, chain = python_chain(ds)
    m = measure(ds.repeat(), label="t", seconds=seconds, warmup_s=0.5, chain=chain)
    return table(m)


def _adds_up(rows, rate) -> float:
    """The transformations' CPU per batch over the OS's: at most 1 by construction (self time above the CPU is
    scaled down), and below 0.8 when CPU went missing (a transformation left out, counts from the wrong window)."""
    return sum(r.cpu_s_per_batch for r in rows) / rate.cpu_s_per_batch


def test_the_images_builtins_decode_holds_most_of_its_cpu_and_the_cpu_adds_up(home):
    # 160-pixel JPEGs cropped to 32: decoding is most of the work (checked: the crop and flip touch 1/25 the pixels)
    loaded = load_spec_text("name: i\ntrainer: {steps: 10}\npipeline: {builtin: images, params: {num_files: 2, "
                            "images_per_file: 32, image_size: 160, crop_size: 32, epochs: null}}\n", source="i.yaml")
    ds = build_spec_pipeline(loaded.spec, cache_dir=home / "cache", base_dir=home)
    rows, rate = _profiled(ds)
    heaviest = max(rows, key=lambda r: r.cpu_s_per_batch)
    assert heaviest.label == "map(_decode)", [(r.label, r.share) for r in rows]
    assert heaviest.inflation is not None and heaviest.inflation > 3  # JPEG bytes in, pixels out
    assert _adds_up(rows, rate) >= 0.8, rate


def test_an_entrypoints_known_expensive_map_holds_most_of_its_cpu_and_the_cpu_adds_up(tmp_path, home):
    loaded = _spec(tmp_path, '{entrypoint: "pipe:make_dataset"}')
    ds = build_spec_pipeline(loaded.spec, cache_dir=home / "cache", base_dir=tmp_path)
    rows, rate = _profiled(ds)
    heaviest = max(rows, key=lambda r: r.cpu_s_per_batch)
    assert heaviest.label == "map(heavy)" and heaviest.share > 0.8, [(r.label, r.share) for r in rows]
    assert next(r for r in rows if r.label == "map(light) + batch(16)").share < 0.1  # fused by tf.data
    assert _adds_up(rows, rate) >= 0.8, rate


def test_the_specs_order_and_options_reach_the_dataset_the_workers_get(tmp_path, home):
    loaded = _spec(tmp_path, '{entrypoint: "pipe:make_dataset", params: {order_test: true}, '
                             'order: {post: [even, big]}, options: {map_parallelization: false, deterministic: false}}')
    plan = reorder.Plan()
    ds = build_spec_pipeline(loaded.spec, cache_dir=home / "cache", base_dir=tmp_path, plan=plan)
    assert plan.sections["post"].used == ["even", "big"] and plan.sections["post"].written == ["big", "even"]
    _, chain = python_chain(ds)
    labels = [c.label for c in chain]
    assert labels.index("filter(lambda)") < labels.index("map(lambda)")  # the filter now runs first
    assert ds.options().experimental_optimization.map_parallelization is False and ds.options().deterministic is False
    first = next(iter(ds))
    assert first["x"].shape == (16, 256) and all(int(i) % 2 == 0 for i in first["id"])
    for order, says in (('order: {post: [even]}', "must list each step"), ('order: {nope: [a]}', "section 'nope'")):
        bad = _spec(tmp_path, f'{{entrypoint: "pipe:make_dataset", params: {{order_test: true}}, {order}}}')
        with pytest.raises(PipelineError, match=says):
            build_spec_pipeline(bad.spec, cache_dir=home / "cache", base_dir=tmp_path)


def test_an_order_whose_steps_do_not_commute_is_refused_naming_the_step():
    ds = tf.data.Dataset.range(8).map(lambda i: {"id": i})
    def unwrap(e):
        return e["id"]

    def double(e):
        return {"id": e["id"] * 2}

    steps = {"double": lambda d: d.map(double), "unwrap": lambda d: d.map(unwrap)}
    with reorder.ordered({"s": ["double", "unwrap"]}):
        assert [int(x) for x in reorder.reorderable(ds, "s", steps).take(2)] == [0, 2]
    with reorder.ordered({"s": ["unwrap", "double"]}), pytest.raises(PipelineError, match="step 'double'"):
        reorder.reorderable(ds, "s", steps)


def test_a_sequential_map_made_parallel_in_the_graph_gives_the_same_elements_in_parallel():
    ds = tf.data.Dataset.range(64).map(lambda i: i * 3).batch(8)
    objects, chain = python_chain(ds)
    index = next(c.index for c in chain if c.sequential_map)
    fast = parallelize(ds, index, 4)
    assert [list(b.numpy()) for b in fast] == [list(b.numpy()) for b in ds]
    it = iter(fast)
    next(it)
    nodes = tf.data.experimental.get_model_proto(it).nodes.values()
    assert any(p.name == "parallelism" and p.value == 4 for n in nodes for p in n.parameters)
    with pytest.raises(ValueError, match="not a sequential MapDataset"):
        parallelize(ds, len(objects) - 1, 4)


def test_python_in_a_pipeline_is_found():
    assert py_function_use(tf.data.Dataset.range(3).map(lambda x: x + 1)) is None
    used = py_function_use(tf.data.Dataset.range(3).map(lambda x: tf.py_function(lambda v: v, [x], tf.int64)))
    assert used is not None and used.startswith("EagerPyFunc in map(")


def test_a_pipeline_that_fails_is_the_users_error_in_one_paragraph(tmp_path):
    from dsctl.runtime.profiling.child import Profiler, UserError

    (tmp_path / "bad.py").write_text("import tensorflow as tf\n\ndef fails():\n    return tf.data.Dataset.from_tensor_slices("
                                     "['1', 'x']).map(tf.strings.to_number).repeat().batch(2)\n")
    spec = load_spec_text("name: b\ntrainer: {steps: 10}\npipeline: {entrypoint: 'bad:fails'}\n", source="b.yaml").spec
    profiler = Profiler(spec, tmp_path, tmp_path / "cache", tmp_path / "out.jsonl")
    with pytest.raises(UserError, match=r"^the pipeline failed while dsctl ran it: InvalidArgumentError: in the "
                                        r"function of a map: StringToNumberOp could not correctly convert string: x "
                                        r"\(in op StringToNumber\)$"):
        profiler.measure({"seconds": 1, "warmup_s": 0.1}, 1)
