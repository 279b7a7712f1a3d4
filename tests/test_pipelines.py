"""Builtin input pipelines, entrypoint loading and batch stats, run in-process.

Datasets are tiny (a few hundred elements) so the whole file runs in seconds on
2 shared cores. The last tests start an in-process tf.data service (dispatcher
and workers as threads of this process) to check what only the service shows:
DYNAMIC sharding of the synthetic source and coordinated reads with buckets.
"""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

# Builds TensorFlow datasets and in-process tf.data servers (TensorFlow is imported when the file is).
pytestmark = pytest.mark.integration

tf = pytest.importorskip("tensorflow")

from dsctl.runtime.pipelines import (  # noqa: E402 - after importorskip: needs TensorFlow
    PipelineError,
    _cache,
    batch_stats,
    build_dataset,
    is_infinite,
    load_entrypoint_dataset,
    prepare_data,
    synthetic,
    text,
    validate_params,
)
from dsctl.runtime.pipelines import images as images_pipeline  # noqa: E402

FAIL = tf.data.experimental.ExternalStatePolicy.FAIL

IMAGES = {"num_files": 3, "images_per_file": 16, "image_size": 32, "crop_size": 24, "batch_size": 8, "shuffle_buffer": 16}
TEXT = {"num_files": 4, "sequences_per_file": 64, "min_length": 4, "max_length": 128, "batch_size": 8, "shuffle_buffer": 64}
BOUNDARIES = [16, 32, 64]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One data cache for the module: generation is deterministic in the params."""
    return tmp_path_factory.mktemp("pipeline-cache")


def batches(ds) -> list[dict]:
    return list(ds.as_numpy_iterator())


def padded_fraction(bs: list[dict]) -> float:
    stats = [batch_stats(b) for b in bs]
    return 1 - sum(s["tokens"] for s in stats) / sum(s["padded_tokens"] for s in stats)


# --- synthetic ---------------------------------------------------------------


def test_synthetic_each_id_once_per_epoch_with_shapes_and_batch_count(cache):
    ds = build_dataset("synthetic", {"elements": 300, "shards": 7, "epochs": 2, "feature_size": 8, "batch_size": 32},
                       cache_dir=cache)
    bs = batches(ds)
    assert len(bs) == -(-600 // 32)  # ceil: batches run across the epoch boundary
    assert [len(b["id"]) for b in bs] == [32] * 18 + [600 - 18 * 32]
    assert all(b["x"].shape == (len(b["id"]), 8) and b["x"].dtype == np.float32 for b in bs)
    assert all(b["id"].dtype == np.int64 for b in bs)
    ids = np.concatenate([b["id"] for b in bs])
    # flat_map walks the shards in order, so each epoch is exactly 0..n-1.
    assert (ids[:300] == np.arange(300)).all() and (ids[300:] == np.arange(300)).all()
    assert not is_infinite(ds)


def test_synthetic_shards_are_contiguous_id_ranges():
    ranges = [list(synthetic._shard_range(10, 3)(tf.constant(i, tf.int64)).as_numpy_iterator()) for i in range(3)]
    assert ranges == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]


def test_synthetic_epochs_none_is_infinite(cache):
    ds = build_dataset("synthetic", {"elements": 10, "shards": 2, "epochs": None, "batch_size": 4}, cache_dir=cache)
    assert is_infinite(ds)
    ids = np.concatenate([b["id"] for b in ds.take(5).as_numpy_iterator()])
    assert list(ids) == list(range(10)) * 2


def _iterate_timed(ds) -> tuple[int, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    n = sum(len(b["id"]) for b in ds.as_numpy_iterator())
    return n, time.perf_counter() - wall, time.process_time() - cpu


def test_latency_sleeps_per_element_without_using_cpu(cache):
    params = {"elements": 200, "shards": 4, "batch_size": 20, "feature_size": 4}
    fast = build_dataset("synthetic", params, cache_dir=cache)
    slow = build_dataset("synthetic", {**params, "latency_ms": 5}, cache_dir=cache)
    _iterate_timed(fast)  # warm up
    n, wall_fast, _ = _iterate_timed(fast)
    n_slow, wall, cpu = _iterate_timed(slow)
    assert n == n_slow == 200
    expected_sleep = 200 * 5e-3
    assert wall >= 0.8 * expected_sleep, (wall, expected_sleep)  # a lower bound: robust on a busy machine
    assert wall > wall_fast
    assert cpu < 0.5 * wall, f"sleeping used CPU: {cpu:.2f}s CPU in {wall:.2f}s"


def test_cpu_work_burns_cpu_and_keeps_values(cache):
    params = {"elements": 200, "shards": 4, "batch_size": 50, "feature_size": 16}
    plain = build_dataset("synthetic", params, cache_dir=cache)
    heavy = build_dataset("synthetic", {**params, "cpu_work": 40}, cache_dir=cache)
    _iterate_timed(plain)
    _, _, cpu_plain = _iterate_timed(plain)
    _, _, cpu_heavy = _iterate_timed(heavy)
    assert cpu_heavy > cpu_plain + 0.05, (cpu_plain, cpu_heavy)  # 8000 64x64 matmuls
    a, b = batches(plain), batches(heavy)
    np.testing.assert_allclose(np.concatenate([x["x"] for x in a]), np.concatenate([x["x"] for x in b]), atol=1e-6)


# --- images ------------------------------------------------------------------


def test_images_batches_have_crop_shape_float_and_all_examples(cache):
    ds = build_dataset("images", {**IMAGES, "transfer_dtype": "float32"}, cache_dir=cache)
    bs = batches(ds)
    assert sum(len(b["label"]) for b in bs) == 3 * 16
    for b in bs:
        assert b["image"].shape == (len(b["label"]), 24, 24, 3) and b["image"].dtype == np.float32
        assert b["label"].dtype == np.int64
        assert 0.0 <= b["image"].min() and b["image"].max() <= 1.0
    images = np.concatenate([b["image"] for b in bs])
    assert images.std() > 0.05 and not np.allclose(images[0], images[1])  # not blank, not all equal
    assert batch_stats(bs[0]) == {"examples": 8, "tokens": 0, "padded_tokens": 0}


def test_images_uint8_transfer_finished_on_the_trainer_equals_the_float32_path(cache):
    """The default sends uint8 (a quarter of the bytes); after `finish` the model gets the same values."""
    sent = batches(build_dataset("images", IMAGES, cache_dir=cache))
    assert sent[0]["image"].dtype == np.uint8
    params = validate_params("images", IMAGES)
    assert params.transfer_dtype == "uint8"
    got = batches(images_pipeline.finish(build_dataset("images", IMAGES, cache_dir=cache), params))
    as_float = {**IMAGES, "transfer_dtype": "float32"}
    want = batches(images_pipeline.finish(build_dataset("images", as_float, cache_dir=cache),
                                          validate_params("images", as_float)))
    assert len(got) == len(want) == len(sent)
    for g, w, u in zip(got, want, sent):
        assert g["image"].dtype == w["image"].dtype == np.float32
        np.testing.assert_array_equal(g["image"], w["image"])
        np.testing.assert_array_equal(g["label"], w["label"])
        assert u["image"].nbytes * 4 == w["image"].nbytes


def test_finish_normalises_each_channel_resnet_style(cache):
    """finish(): uint8 pixel p becomes (p / 255 - mean) / std per channel, ImageNet's mean and std."""
    sent = batches(build_dataset("images", IMAGES, cache_dir=cache))
    got = batches(images_pipeline.finish(build_dataset("images", IMAGES, cache_dir=cache), validate_params("images", IMAGES)))
    mean, std = np.array(images_pipeline.MEAN, np.float32), np.array(images_pipeline.STD, np.float32)
    for s, g in zip(sent, got):
        np.testing.assert_allclose(g["image"], (s["image"].astype(np.float32) / 255 - mean) / std, rtol=0, atol=1e-5)
        np.testing.assert_array_equal(g["label"], s["label"])


def test_images_labels_decide_the_colour(cache):
    """Each class has its own colour: images of one class are closer to their class's mean colour than to any
    other class's, so a model can learn the label (random crops and flips keep colour)."""
    params = {**IMAGES, "num_classes": 3, "num_files": 2, "images_per_file": 48, "transfer_dtype": "float32"}
    bs = batches(build_dataset("images", params, cache_dir=cache))
    colours = np.concatenate([b["image"].mean(axis=(1, 2)) for b in bs])
    labels = np.concatenate([b["label"] for b in bs])
    assert set(labels.tolist()) == {0, 1, 2} and labels.max() < 3
    centres = np.stack([colours[labels == c].mean(axis=0) for c in range(3)])
    nearest = np.argmin(((colours[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
    assert (nearest == labels).mean() > 0.9


def test_text_labels_come_with_their_class_marker_tokens(cache):
    params = {**TEXT, "vocab_size": 1000, "num_classes": 4}
    bs = batches(build_dataset("text", params, cache_dir=cache))
    own = other = real = 0
    for b in bs:
        assert b["label"].dtype == np.int64 and b["label"].shape == b["lengths"].shape
        for tokens, length, label in zip(b["tokens"], b["lengths"], b["label"]):
            seq = tokens[:length]
            markers = [set(text.marker_tokens(c, 4, 1000).tolist()) for c in range(4)]
            own += sum(t in markers[label] for t in seq)
            other += sum(t in markers[c] for c in range(4) if c != label for t in seq)
            real += length
    # a quarter of the tokens are their class's markers; other classes' markers only appear by chance (24 of 1000 ids)
    assert 0.2 < own / real < 0.3 and other / real < 0.03


def test_synthetic_label_is_the_argmax_of_the_first_features(cache):
    bs = batches(build_dataset("synthetic", {"elements": 64, "feature_size": 8, "label_classes": 3}, cache_dir=cache))
    for b in bs:
        np.testing.assert_array_equal(b["label"], np.argmax(b["x"][:, :3], axis=1))
    assert "label" not in batches(build_dataset("synthetic", {"elements": 16}, cache_dir=cache))[0]
    with pytest.raises(PipelineError, match="label_classes"):
        build_dataset("synthetic", {"feature_size": 4, "label_classes": 5}, cache_dir=cache)


def images_spec(cache: Path):
    from dsctl.specs import load_spec_text

    return load_spec_text(
        "name: t\ntrainer: {steps: 1}\n"
        f"pipeline: {{builtin: images, params: {{num_files: 3, images_per_file: 16, image_size: 32, crop_size: 24, "
        f"batch_size: 8, cache_dir: '{cache}'}}}}\n"
    ).spec


@pytest.mark.parametrize("mode", ["colocated", "ideal"])
def test_trainer_finishes_uint8_images_in_every_mode(cache, mode):
    from dsctl.runtime.trainer import build_input

    batch = next(iter(build_input(images_spec(cache), mode, 0, None, cache, cache)))
    assert batch["image"].dtype == tf.float32 and batch["image"].shape == (8, 24, 24, 3)


def test_images_transfer_dtype_is_checked(cache):
    with pytest.raises(PipelineError, match="transfer_dtype: Input should be 'uint8' or 'float32'"):
        build_dataset("images", {**IMAGES, "transfer_dtype": "float16"}, cache_dir=cache)


def test_images_generated_once_and_reused(tmp_path):
    params = {**IMAGES, "num_files": 2}
    first = prepare_data("images", params, cache_dir=tmp_path)
    assert first.parent == tmp_path and first.name.startswith("images-")
    files = sorted(first.iterdir())
    assert len(files) == 3  # 2 TFRecords + manifest
    mtimes = {f.name: f.stat().st_mtime_ns for f in files}
    time.sleep(0.05)
    build_dataset("images", params, cache_dir=tmp_path)
    assert {f.name: f.stat().st_mtime_ns for f in first.iterdir()} == mtimes
    other = prepare_data("images", {**params, "seed": 1}, cache_dir=tmp_path)
    assert other != first  # different generation params, different directory
    assert prepare_data("images", {**params, "batch_size": 4}, cache_dir=tmp_path) == first  # batching is not generation
    assert prepare_data("images", {**params, "transfer_dtype": "float32"}, cache_dir=tmp_path) == first


def test_images_params_cache_dir_overrides_argument(tmp_path):
    mine = tmp_path / "mine"
    got = prepare_data("images", {**IMAGES, "num_files": 1, "cache_dir": str(mine)}, cache_dir=tmp_path / "default")
    assert got.parent == mine and not (tmp_path / "default").exists()


def test_concurrent_generation_is_safe(tmp_path):
    start = threading.Barrier(3)
    results, errors = [], []

    def build():
        start.wait()
        try:
            results.append(prepare_data("text", {**TEXT, "num_files": 2}, cache_dir=tmp_path))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(results) == 3 and len(set(results)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [results[0].name]  # no temporary dirs left
    assert len(_cache.read_manifest(results[0])["files"]) == 2


def test_losing_the_rename_race_reuses_the_winner(tmp_path):
    final = tmp_path / "data-x"

    def winner(tmp: Path) -> list[str]:
        (tmp / "a").write_text("winner")
        return ["a"]

    def loser(tmp: Path) -> list[str]:
        # Another process finishes and renames while this one is still writing.
        _cache.materialize(final, winner, {"who": "winner"})
        (tmp / "a").write_text("loser")
        return ["a"]

    assert _cache.materialize(final, loser, {"who": "loser"}) == final
    assert (final / "a").read_text() == "winner"
    assert _cache.read_manifest(final)["who"] == "winner"
    assert [p.name for p in tmp_path.iterdir()] == ["data-x"]


def test_incomplete_cache_dir_is_an_error(tmp_path):
    params = {**IMAGES, "num_files": 1}
    final = prepare_data("images", params, cache_dir=tmp_path)
    (final / _cache.MANIFEST).unlink()
    with pytest.raises(PipelineError, match="no manifest.json.*delete it"):
        prepare_data("images", params, cache_dir=tmp_path)


# --- text --------------------------------------------------------------------


@pytest.mark.parametrize("distribution", ["lognormal", "uniform"])
def test_text_lengths_within_bounds_and_padding_is_zero(cache, distribution):
    ds = build_dataset("text", {**TEXT, "length_distribution": distribution}, cache_dir=cache)
    bs = batches(ds)
    assert sum(len(b["lengths"]) for b in bs) == 4 * 64
    for b in bs:
        assert b["tokens"].dtype == np.int32 and b["lengths"].dtype == np.int32
        assert b["tokens"].shape[1] == b["lengths"].max()  # padded to the longest in the batch
        assert (b["lengths"] >= 4).all() and (b["lengths"] <= 128).all()
        assert ((b["tokens"] != 0).sum(axis=1) == b["lengths"]).all()  # tokens are >= 1, padding is 0


def test_sample_lengths_deterministic_and_bounded():
    a = text.sample_lengths(np.random.default_rng(3), 500, 8, 512, "lognormal")
    b = text.sample_lengths(np.random.default_rng(3), 500, 8, 512, "lognormal")
    assert (a == b).all() and a.min() >= 8 and a.max() <= 512
    assert 30 < np.median(a) < 130  # near the geometric mean (64): skewed, mostly short


def test_batch_stats_on_hand_checkable_batches():
    batch = {"tokens": np.array([[5, 6, 7, 8, 9], [1, 2, 0, 0, 0], [3, 0, 0, 0, 0]], np.int32),
             "lengths": np.array([5, 2, 1], np.int32)}
    assert batch_stats(batch) == {"examples": 3, "tokens": 8, "padded_tokens": 15}
    eager = {k: tf.constant(v) for k, v in batch.items()}
    assert batch_stats(eager) == {"examples": 3, "tokens": 8, "padded_tokens": 15}
    assert batch_stats((np.zeros((4, 2)), np.zeros(4)))["examples"] == 4
    assert batch_stats(tf.zeros([6, 3]))["examples"] == 6


def test_bucketing_wastes_less_padding_deterministically(cache):
    params = {**TEXT, "epochs": None}

    def fractions():
        plain = batches(build_dataset("text", params, cache_dir=cache).take(24))
        bucketed = batches(build_dataset("text", params, cache_dir=cache, bucketing=(BOUNDARIES, 2)).take(24))
        return padded_fraction(plain), padded_fraction(bucketed)

    plain, bucketed = fractions()
    assert bucketed < plain, (plain, bucketed)
    assert fractions() == (plain, bucketed)  # same seed, same numbers


def test_bucketing_rounds_share_one_padded_length(cache):
    n = 3
    pads = text.bucket_pad_lengths(BOUNDARIES, 128)
    assert pads == [16, 32, 64, 128]
    bs = batches(build_dataset("text", {**TEXT, "epochs": None}, cache_dir=cache, bucketing=(BOUNDARIES, n)).take(30))
    assert all(len(b["lengths"]) == 8 for b in bs)
    edges = [0] + BOUNDARIES + [128]
    for r in range(0, len(bs), n):
        rnd = bs[r:r + n]
        widths = {b["tokens"].shape[1] for b in rnd}
        assert len(widths) == 1, f"round {r // n} mixes padded lengths {widths}"
        width = widths.pop()
        bucket = pads.index(width)
        lengths = np.concatenate([b["lengths"] for b in rnd])
        assert (lengths > edges[bucket]).all() and (lengths <= edges[bucket + 1]).all()


def test_bucketing_finite_input_drops_partial_rounds(cache):
    bs = batches(build_dataset("text", TEXT, cache_dir=cache, bucketing=(BOUNDARIES, 2)))
    assert len(bs) % 2 == 0 and all(len(b["lengths"]) == 8 for b in bs)
    kept = sum(len(b["lengths"]) for b in bs)
    assert 4 * 64 - 4 * 8 * 2 < kept <= 4 * 64  # at most one short round per bucket is dropped


# --- build errors and serializability ----------------------------------------


def test_build_errors_are_pipeline_errors(cache):
    with pytest.raises(PipelineError, match="Unknown builtin pipeline 'imags'.*Did you mean 'images'"):
        build_dataset("imags", {}, cache_dir=cache)
    with pytest.raises(PipelineError, match="elements"):
        build_dataset("synthetic", {"elements": 0}, cache_dir=cache)
    with pytest.raises(PipelineError, match="batchsize"):
        build_dataset("synthetic", {"batchsize": 4}, cache_dir=cache)
    with pytest.raises(PipelineError, match="only to the 'text' pipeline"):
        build_dataset("synthetic", {}, cache_dir=cache, bucketing=([8], 2))
    with pytest.raises(PipelineError, match="strictly increasing"):
        build_dataset("text", TEXT, cache_dir=cache, bucketing=([32, 16], 2))


@pytest.mark.parametrize("builtin,params,bucketing", [
    ("synthetic", {"elements": 50, "shards": 5, "latency_ms": 1, "cpu_work": 2}, None),
    ("images", IMAGES, None),
    ("text", TEXT, None),
    ("text", {**TEXT, "epochs": None}, (BOUNDARIES, 2)),
])
def test_graphs_serialize_without_external_state(cache, builtin, params, bucketing):
    """What tf.data service sends to remote workers: must not depend on py_function or stateful ops."""
    ds = build_dataset(builtin, params, cache_dir=cache, bucketing=bucketing)
    assert len(ds._as_serialized_graph(external_state_policy=FAIL).numpy()) > 0


# --- entrypoints -------------------------------------------------------------


@pytest.fixture
def user_dir(tmp_path, monkeypatch, request) -> tuple[Path, str]:
    """A directory for a user's module, a unique module name, and sys.path restored afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    name = f"user_pipe_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}_{os.getpid()}"
    return tmp_path, name


def write(directory: Path, name: str, body: str) -> None:
    (directory / f"{name}.py").write_text(textwrap.dedent(body))


def test_entrypoint_returns_dataset_with_params_as_kwargs(user_dir):
    d, name = user_dir
    write(d, name, """
        import tensorflow as tf
        def make_dataset(n, batch_size=2):
            return tf.data.Dataset.range(n).batch(batch_size)
    """)
    ds = load_entrypoint_dataset(f"{name}:make_dataset", {"n": 5, "batch_size": 2}, d)
    assert [list(b) for b in ds.as_numpy_iterator()] == [[0, 1], [2, 3], [4]]
    assert sys.path[0] == str(d.resolve())


def test_entrypoint_in_a_package_beside_the_spec(user_dir):
    d, name = user_dir
    (d / name).mkdir()
    (d / name / "__init__.py").write_text("")
    write(d / name, "data", """
        import tensorflow as tf
        def make(): return tf.data.Dataset.range(3)
    """)
    assert len(list(load_entrypoint_dataset(f"{name}.data:make", {}, d))) == 3


def test_entrypoint_module_not_found_names_module_and_dir(user_dir):
    d, name = user_dir
    with pytest.raises(PipelineError) as err:
        load_entrypoint_dataset(f"{name}:make", {}, d)
    assert f"'{name}'" in str(err.value) and str(d.resolve()) in str(err.value)


def test_entrypoint_missing_dependency_is_named(user_dir):
    d, name = user_dir
    write(d, name, "import surely_not_installed_pkg_xyz\ndef make(): pass\n")
    with pytest.raises(PipelineError, match="imports 'surely_not_installed_pkg_xyz'.*not installed"):
        load_entrypoint_dataset(f"{name}:make", {}, d)


def test_entrypoint_import_error_is_reported(user_dir):
    d, name = user_dir
    write(d, name, "raise RuntimeError('bad config at import')\n")
    with pytest.raises(PipelineError, match="raised RuntimeError: bad config at import"):
        load_entrypoint_dataset(f"{name}:make", {}, d)


def test_entrypoint_no_such_function_lists_close_names(user_dir):
    d, name = user_dir
    write(d, name, """
        def make_dataset(): pass
        def make_datasets_fast(): pass
        def unrelated(): pass
    """)
    with pytest.raises(PipelineError) as err:
        load_entrypoint_dataset(f"{name}:make_datset", {}, d)
    msg = str(err.value)
    assert "no function 'make_datset'" in msg and "'make_dataset'" in msg and "unrelated" not in msg


def test_entrypoint_function_raised(user_dir):
    d, name = user_dir
    write(d, name, """
        def make(path):
            raise FileNotFoundError(f"no data at {path}")
    """)
    with pytest.raises(PipelineError, match=r"raised FileNotFoundError: no data at /nowhere.*\['path'\]"):
        load_entrypoint_dataset(f"{name}:make", {"path": "/nowhere"}, d)
    with pytest.raises(PipelineError, match="raised TypeError"):  # params that do not fit the signature
        load_entrypoint_dataset(f"{name}:make", {"paht": "/x"}, d)


def test_entrypoint_wrong_return_type_is_named(user_dir):
    d, name = user_dir
    write(d, name, "def make(): return [1, 2, 3]\n")
    with pytest.raises(PipelineError, match="returned builtins.list, not a tf.data.Dataset"):
        load_entrypoint_dataset(f"{name}:make", {}, d)


# --- through an in-process tf.data service -----------------------------------


@pytest.fixture(scope="module")
def service():
    """Dispatcher + 2 workers as threads of this process (loopback, port 0); stopped after the module."""
    svc = tf.data.experimental.service
    dispatcher = svc.DispatchServer(svc.DispatcherConfig(port=0))
    address = dispatcher.target.split("://")[1]
    workers = [svc.WorkerServer(svc.WorkerConfig(dispatcher_address=address)) for _ in range(2)]
    yield dispatcher.target
    for w in workers:
        w._stop()
    dispatcher._stop()


@pytest.mark.timeout(120)
def test_distributed_epoch_gives_each_synthetic_id_once(cache, service):
    ds = build_dataset("synthetic", {"elements": 300, "shards": 10, "batch_size": 16}, cache_dir=cache)
    ds = ds.apply(tf.data.experimental.service.distribute("distributed_epoch", service))
    ids = np.sort(np.concatenate([b["id"] for b in ds.as_numpy_iterator()]))
    assert (ids == np.arange(300)).all()


@pytest.mark.timeout(120)
def test_coordinated_reads_give_each_round_one_padded_length(cache, service):
    ds = build_dataset("text", {**TEXT, "epochs": None}, cache_dir=cache, bucketing=(BOUNDARIES, 2))
    widths: dict[int, list[int]] = {}

    def consume(i: int) -> None:
        it = iter(ds.apply(tf.data.experimental.service.distribute(
            "parallel_epochs", service, job_name="pipelines-coordinated", consumer_index=i, num_consumers=2)))
        widths[i] = [next(it)["tokens"].shape[1] for _ in range(8)]

    threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert set(widths) == {0, 1}, "a consumer did not finish"
    assert widths[0] == widths[1]


@pytest.mark.timeout(120)
def test_service_sends_uint8_and_the_trainer_gets_float32(cache, service):
    """Through `distribute`: the model gets float32 made from uint8 pixels (every value a pixel times 1/255,
    normalised per channel)."""
    from dsctl.runtime.trainer import build_input

    ds = build_input(images_spec(cache), "service", 0, service.split("://")[1], cache, cache)
    bs = batches(ds)
    assert sum(len(b["label"]) for b in bs) == 2 * 3 * 16  # parallel_epochs: one epoch per worker
    mean, std = np.float32(images_pipeline.MEAN), np.float32(images_pipeline.STD)
    for b in bs:
        assert b["image"].dtype == np.float32 and b["image"].shape[1:] == (24, 24, 3)
        pixels = np.round((b["image"] * std + mean) * 255).astype(np.uint8)
        np.testing.assert_allclose(b["image"], (pixels.astype(np.float32) * np.float32(1 / 255) - mean) / std,
                                   rtol=0, atol=1e-5)
