"""Side by side with what users would pick instead: dsctl, Ray Data and colocated tf.data on the same input.

    python benchmarks/bench_peers.py [--quick] [--workers 2] [--seconds 20] [--rounds 3] [--out peers.json]
    python benchmarks/bench_peers.py --ray-sweep       # how "Ray Data, best" was chosen (Ray settings only)

The `images` builtin at the paper's shape (bench_data_path.PAPER_SHAPE: 256-pixel JPEGs in 8 TFRecord
files of 64, decode, random 224 crop, flip, normalise with ImageNet's mean and std, batch 64), the SAME
files (generated once by dsctl's own `prepare_data`), read as fast as one consumer process can take
batches (a trivial step: the batch is only received), in these configurations:

  - dsctl (service): `dsctl up` with N tf.data service workers, run and measured by bench_data_path's
    own `run_dsctl` (imported, not copied): workers decode, crop and flip, send uint8, the trainer
    converts and normalises (runtime/pipelines/images.py; JPEG decoding is TensorFlow's
    `decode_jpeg`, libjpeg-turbo inside TensorFlow);
  - tf.data colocated: the same pipeline in the trainer process (`dsctl up --mode colocated`, also
    bench_data_path's `run_dsctl`); its tf.data threads use every core, so N does not apply;
  - Ray Data, documented defaults and Ray Data, best (below): a local Ray (`ray.init(num_cpus=N+1,
    include_dashboard=False)`) reads the same TFRecord files, decodes each JPEG with Pillow (its
    wheels bundle libjpeg-turbo), crops, flips and normalises in `map_batches` on CPU, in N task
    processes; the batches go to one consumer process the way Ray Train's data integration sends them:
    the consumer is a Ray actor holding 1 CPU (Ray Train's default per training worker, which Train
    excludes from Ray Data's resources, as done here with ExecutionOptions.exclude_resources), given
    `ds.streaming_split(1, equal=True)[0]` (Train's DataConfig.configure: a DataIterator whose
    streaming execution runs in a SplitCoordinator actor), and it iterates `iter_batches(batch_size=64)`
    (what `iter_torch_batches` does before converting to torch, which is not installed here).

Ray Data configurations:
  - defaults: `ray.data.read_tfrecords(paths)` (Ray's documented TFRecord reader, which imports
    TensorFlow in each Ray worker to parse tf.train.Example), `map_batches(preprocess)` with every
    argument at its default (batch_size None: one call per block; batch_format "default": numpy;
    stateless tasks, 1 CPU each, concurrency autoscaled within the CPUs Ray Data may use) returning
    float32 normalised images; `iter_batches(batch_size=64)` with prefetch_batches at its default (1).
  - best: the best setting found by `--ray-sweep` here (RAY_BEST below; the sweep's printout is in
    docs/performance.md). Every candidate keeps the work the same (decode, crop, flip, normalise, batch 64).

The dataset is small (8 batches per epoch), so every configuration reads it over and over: dsctl's
pipeline repeats (epochs null); Ray reads the file list repeated enough times for the whole run
(one execution, as one long epoch), since a new `iter_batches` per 8-batch epoch would measure Ray's
execution start-up, not its data path. dsctl's pipeline also shuffles (files each epoch, and a
256-element buffer); the Ray pipelines do not shuffle, which spares them that work.

Measured per configuration, every figure measured here, from this one run:
  - batches/s in the consumer's measured window (after the warm-up batches);
  - CPU-seconds per batch by role over that window, every process's CPU read with psutil every 0.1 s
    (bench_data_path's Sampler) and interpolated to the window:
      consumer  dsctl's trainer / the Ray consumer actor (colocated: the trainer doing everything);
      workers   tf.data service workers / the Ray worker processes that run the read and map tasks;
      control   dsctl's dispatcher / Ray's own processes: gcs_server, raylet, its agents and monitors, and
                Ray Data's actors (the SplitCoordinator that runs the streaming executor, the stats actor);
      tool      `dsctl up` and its launcher / the Ray driver script (which builds the dataset and waits);
  - MB per batch: the tensor bytes the consumer receives from other processes (computed: uint8 or
    float32 images plus int64 labels; colocated receives none), and the bytes measured moving between
    processes: the loopback bytes of the run's own network namespace (as bench_data_path measures
    them), plus, for Ray, the bytes created in its shared-memory object store (the raylet's
    cumulative_created_bytes) during the window;
  - time to first batch: from starting `dsctl up` or the Ray driver (before `import ray`) to the first
    batch in the consumer: start-up (TensorFlow, Ray, the deployment) included, the data generated before;
  - peak memory by role: the largest sum of the role's processes' resident set sizes (RSS), sampled every
    0.5 s over the whole run. RSS counts a shared page in every process that maps it: the TensorFlow pages
    dsctl's servers share with the launcher they were forked from, and the pages of Ray's shared-memory
    object store that its processes map. (The proportional set size would split them, but reading it costs
    about 45 ms per TensorFlow process, too much to sample beside the runs on 2 cores.)
Configurations alternate within each round (the order rotates from round to round); medians over rounds.
The ratios printed at the end are each peer / dsctl (service), from the same run.

--quick (a test runs it): one round of 5 s windows after 5 warm-up batches, dsctl, colocated and the two
Ray configurations; it checks that everything runs and prints, not the values.
Needs Ray Data: `pip install -e '.[bench]'` (or `pip install 'ray[data]'`); runs offline (no dashboard,
usage stats off).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from statistics import median

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_data_path as bdp  # noqa: E402  (a sibling script, not a package)

SHAPE = bdp.PAPER_SHAPE
CROP, SIZE, BATCH = SHAPE["crop_size"], SHAPE["image_size"], SHAPE["batch_size"]
MEAN = (0.485, 0.456, 0.406)  # ImageNet's per-channel mean and std of pixels in [0, 1], as runtime/pipelines/images.py
STD = (0.229, 0.224, 0.225)
MEM_POLL_S = 0.5
DISCOVER_EVERY_S = 1.0  # how often the Ray run's process tree is listed (the CPU of each known process: every 0.1 s)
ROLES = ("consumer", "workers", "control", "tool")
ENV_TAG = "BENCH_PEERS_RUN"  # every process of a Ray run inherits it: how leftovers are found

# Ray Data's documented defaults: only what the workload fixes (batch size 64 in the consumer) is set.
RAY_DEFAULTS = {"reader": "read_tfrecords", "map_batch_size": None, "normalise": "map", "prefetch_batches": 1,
                "batch_format": None, "concurrency": None, "blocks_per_file": False, "quiet": False}
# The best setting --ray-sweep found here (docs/performance.md has its printout): uint8 out of the map tasks with the
# normalisation in the consumer (as dsctl's images pipeline splits the work), files read as bytes and parsed without
# TensorFlow, 2 batches prefetched, no log streaming. Its batches/s was within this machine's noise of the fastest
# (uint8 alone), with 0.63x the defaults' time to first batch and 0.56x their peak memory.
RAY_BEST = {**RAY_DEFAULTS, "normalise": "consumer", "reader": "binary", "prefetch_batches": 2, "quiet": True}


def tensor_bytes(dtype: str) -> int:
    """A batch's tensor bytes: images of `dtype` plus int64 labels."""
    return BATCH * (CROP * CROP * 3 * (1 if dtype == "uint8" else 4) + 8)


# -- what the Ray processes run (self-contained: numpy and Pillow, no TensorFlow unless read_tfrecords needs it) --


def _tfrecords(data: bytes):
    """The records of a TFRecord file (uint64 length, uint32 masked CRC, data, uint32 masked CRC); CRCs not checked."""
    import struct

    pos, end = 0, len(data)
    while pos + 12 <= end:
        (length,) = struct.unpack_from("<Q", data, pos)
        start = pos + 12
        yield data[start:start + length]
        pos = start + length + 4


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, pos
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of a protobuf message: bytes for length-delimited, int for varints."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 2:
            n, pos = _varint(buf, pos)
            yield num, wire, buf[pos:pos + n]
            pos += n
        elif wire == 0:
            v, pos = _varint(buf, pos)
            yield num, wire, v
        elif wire == 5:
            pos += 4
        elif wire == 1:
            pos += 8
        else:
            raise ValueError(f"wire type {wire}")


def _parse_example(record: bytes) -> tuple[bytes, int]:
    """image/encoded and image/class/label of a tf.train.Example, without TensorFlow: Example.features(1) ->
    Features.feature(1, map entries: key 1, Feature 2) -> Feature.bytes_list(1).value(1) / int64_list(3).value(1)."""
    jpeg, label = b"", -1
    for _, _, features in _fields(record):
        for _, _, entry in _fields(features):
            key, feature = b"", b""
            for num, _, v in _fields(entry):
                if num == 1:
                    key = v
                elif num == 2:
                    feature = v
            for kind, _, lst in _fields(feature):
                for num, wire, v in _fields(lst):
                    if num != 1:
                        continue
                    if kind == 1 and key == b"image/encoded":
                        jpeg = v
                    elif kind == 3 and key == b"image/class/label":
                        label = v if wire == 0 else _varint(v, 0)[0]  # packed or not
    return jpeg, label


def _split_records(row: dict) -> list[dict]:
    """flat_map: one TFRecord file's bytes -> one row per image."""
    return [dict(zip(("jpeg", "label"), _parse_example(r))) for r in _tfrecords(row["bytes"])]


def _preprocess(batch: dict, crop: int, normalise: bool, mean, std) -> dict:
    """Decode (Pillow), random crop, random left-right flip; then normalise to float32 (x / 255 - mean) / std."""
    import io

    import numpy as np
    from PIL import Image

    jpegs = batch["jpeg"] if "jpeg" in batch else batch["image/encoded"]
    labels = batch["label"] if "label" in batch else batch["image/class/label"]
    rng = np.random.default_rng()
    out = np.empty((len(jpegs), crop, crop, 3), np.uint8)
    for i, data in enumerate(jpegs):
        im = Image.open(io.BytesIO(data))
        if im.mode != "RGB":
            im = im.convert("RGB")
        pixels = np.asarray(im)
        y, x = rng.integers(0, pixels.shape[0] - crop + 1), rng.integers(0, pixels.shape[1] - crop + 1)
        cut = pixels[y:y + crop, x:x + crop]
        out[i] = cut[:, ::-1] if rng.random() < 0.5 else cut
    images = _normalise(out, mean, std) if normalise else out
    return {"image": images, "label": np.asarray(labels, dtype=np.int64)}


def _normalise(images, mean, std):
    """uint8 -> float32 (x / 255 - mean) / std, as runtime/pipelines/images.py's _finish_batch: x * (1 / (255 std))
    - mean / std, two passes over the batch."""
    import numpy as np

    scale = (1.0 / (255.0 * np.asarray(std, np.float32))).astype(np.float32)
    offset = (np.asarray(mean, np.float32) / np.asarray(std, np.float32)).astype(np.float32)
    x = np.empty(images.shape, np.float32)
    np.multiply(images, scale, out=x)
    x -= offset
    return x


class _Consumer:
    """The training process's stand-in (a Ray actor, as a Ray Train worker is): iterates its DataIterator."""

    def run(self, it, conf: dict) -> int:
        import ray

        out = open(Path(conf["work"]) / "consumer.jsonl", "w")

        def emit(event, **kw):
            out.write(json.dumps({"event": event, "wall": time.time(), **kw}) + "\n")
            out.flush()

        def store_created():
            """Bytes created so far in this node's object store (the raylet's counter; a private API)."""
            try:
                from ray._private.internal_api import node_stats

                node = next(n for n in ray.nodes() if n["Alive"])
                reply = node_stats(node["NodeManagerAddress"], node["NodeManagerPort"], include_memory_info=False)
                return reply.store_stats.cumulative_created_bytes
            except Exception:  # noqa: BLE001 - a figure we can do without
                return None

        emit("start", pid=os.getpid())
        kw = {"batch_size": BATCH, "prefetch_batches": conf["prefetch_batches"]}
        if conf["batch_format"]:
            kw["batch_format"] = conf["batch_format"]
        n, counted, deadline = 0, 0, None
        for batch in it.iter_batches(**kw):
            if conf["normalise"] == "consumer":
                batch["image"] = _normalise(batch["image"], MEAN, STD)
            n += 1
            if n == 1:
                emit("first_batch", shape=list(batch["image"].shape), dtype=str(batch["image"].dtype))
            if deadline is not None:
                counted += 1
                if time.perf_counter() >= deadline:
                    break
            elif n == conf["warmup"]:
                emit("measure_start", store_bytes=store_created())
                deadline = time.perf_counter() + conf["seconds"]
        emit("end", batches=counted, store_bytes=store_created(), complete=deadline is not None and
             time.perf_counter() >= deadline)
        out.close()
        return counted


def _ray_driver(conf: dict) -> None:
    """The Ray run: start a local Ray, build the dataset, hand a streaming split to the consumer actor, wait."""
    import logging

    work = Path(conf["work"])
    t_import = time.time()
    import ray
    import ray.data
    from ray.data import ExecutionResources

    n, s = conf["workers"], conf["ray"]
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING} if s["quiet"] else {}
    ray.init(num_cpus=n + 1, include_dashboard=False, _temp_dir=conf["ray_tmp"], **quiet,
             **({"_node_ip_address": "127.0.0.1"} if conf["isolated"] else {}))  # a network of lo alone
    t_init = time.time()
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.exclude_resources = ExecutionResources(cpu=1)  # the consumer's CPU, as Ray Train reserves it
    if s["quiet"]:
        ctx.enable_progress_bars = False
    paths = conf["files"] * conf["repeats"]
    read_kw = {"override_num_blocks": len(paths)} if s["blocks_per_file"] else {}
    if s["reader"] == "read_tfrecords":
        ds = ray.data.read_tfrecords(paths, **read_kw)
    else:
        ds = ray.data.read_binary_files(paths, **read_kw).flat_map(_split_records)
    map_kw = {"fn_kwargs": {"crop": CROP, "normalise": s["normalise"] == "map", "mean": MEAN, "std": STD}}
    if s["map_batch_size"]:
        map_kw["batch_size"] = s["map_batch_size"]
    if s["batch_format"]:
        map_kw["batch_format"] = s["batch_format"]
    if s["concurrency"]:
        map_kw["concurrency"] = n if s["concurrency"] == "N" else s["concurrency"]
    ds = ds.map_batches(_preprocess, **map_kw)
    consumer = ray.remote(num_cpus=1)(_Consumer).remote()
    it = ds.streaming_split(1, equal=True)[0]
    batches = ray.get(consumer.run.remote(it, conf))
    (work / "driver.json").write_text(json.dumps({"import": t_import, "init_done": t_init, "batches": batches}))
    ray.shutdown()


# -- sampling memory beside bench_data_path's CPU sampler ----------------------------------------------------------


class MemSampler(bdp.Sampler):
    """bench_data_path's Sampler (CPU every 0.1 s, loopback bytes) plus each process's memory every 0.5 s."""

    last: MemSampler | None = None
    dsctl_runs: tuple[Path, set] | None = None  # (DSCTL_HOME/runs, the run dirs before this run): see _with_launcher

    def __init__(self, discover):
        if MemSampler.dsctl_runs is not None:
            discover = _with_launcher(discover, *MemSampler.dsctl_runs)
        super().__init__(discover)
        self.memory: list[tuple[float, dict[str, int]]] = []  # (time, {key: resident bytes})
        self._mem_thread = threading.Thread(target=self._mem_run, daemon=True)
        MemSampler.last = self

    def __enter__(self):
        super().__enter__()
        self._mem_thread.start()
        return self

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._mem_thread.join()

    def _mem_run(self) -> None:
        while not self._stop.is_set():
            sample: dict[str, int] = {}
            for (key, _pid), proc in list(self._procs.items()):
                try:
                    rss = proc.memory_info().rss  # /proc/PID/statm: cheap (PSS, from smaps_rollup, costs ~45 ms for
                except psutil.Error:              # a TensorFlow process: too much to sample beside the runs)
                    continue
                sample[key] = sample.get(key, 0) + rss
            self.memory.append((time.time(), sample))
            self._stop.wait(MEM_POLL_S)


def memory_peaks(sampler: MemSampler, role_of) -> dict:
    """Per role, the largest sum of its processes' resident memory at one sample; the same for all roles together."""
    peaks = dict.fromkeys(ROLES, 0)
    total = 0
    for _, sample in sampler.memory:
        by_role = dict.fromkeys(ROLES, 0)
        for key, rss in sample.items():
            role = role_of(key)
            if role in by_role:
                by_role[role] += rss
        for r in ROLES:
            peaks[r] = max(peaks[r], by_role[r])
        total = max(total, sum(by_role.values()))
    return {"rss": peaks, "total_rss": total}


def _with_launcher(discover, runs: Path, before: set):
    """bench_data_path.run_dsctl's discover, plus dsctl's launcher where it does not name it: it looks for a
    `launcher` node in state.json, and since typed deployment state the launcher is in state["state"]["launcher"],
    so without this the launcher's CPU and the run's loopback bytes (read in the launcher's network namespace)
    would be missing. A no-op once discover names the launcher itself."""
    found: list[Path] = []

    def wrapped():
        pids, netns = discover()
        if netns is not None or any(k.startswith("launcher") for k in pids):
            return pids, netns
        if not found and runs.exists():
            found.extend(set(runs.iterdir()) - before)
        if found:
            try:
                launcher = json.loads((found[0] / "state.json").read_text())["state"]["launcher"]
                pids = {**pids, "launcher-0": launcher["pid"]}
                netns = launcher["pid"]
            except (OSError, ValueError, KeyError, TypeError):
                pass
        return pids, netns

    return wrapped


@contextmanager
def _sampling_memory(runs: Path, before: set):
    """bench_data_path.run_dsctl with this file's MemSampler in place of its Sampler (restored after)."""
    original = bdp.Sampler
    bdp.Sampler = MemSampler
    MemSampler.dsctl_runs = (runs, before)
    try:
        yield
    finally:
        bdp.Sampler = original
        MemSampler.dsctl_runs = None


# -- the configurations --------------------------------------------------------------------------------------------

DSCTL_ROLE = {"trainer": "consumer", "worker": "workers", "dispatcher": "control", "up": "tool", "launcher": "tool"}


def run_dsctl(mode: str, workers: int, home: Path, cache: Path, seconds: float, warmup: int) -> dict:
    """dsctl up (service or colocated), run and measured by bench_data_path.run_dsctl; memory and first batch added."""
    cfg = bdp.Config("dsctl", mode, workers if mode == "service" else 0, "uint8")
    runs = home / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    t0 = time.time()
    with _sampling_memory(runs, before):
        r = bdp.run_dsctl(cfg, home, cache, seconds, warmup)
    sampler = MemSampler.last
    assert sampler is not None
    run_dir = max(set(runs.iterdir()) - before, key=lambda p: p.stat().st_mtime)
    ev = bdp._events(run_dir / "metrics" / "trainer-0.jsonl")
    per_batch = r["seconds"] / r["batches"]
    cpu = {"consumer": r["cpu_s_per_batch"]["trainer"], "workers": r["cpu_s_per_batch"]["worker"],
           "control": r["cpu_s_per_batch"]["dispatcher"],
           "tool": (r["supervision_cores"]["up"] + r["supervision_cores"]["launcher"]) * per_batch}
    return {
        "batches_per_s": r["batches_per_s"], "batches": r["batches"], "seconds": r["seconds"],
        "cpu_s_per_batch": cpu, "total_cpu_s_per_batch": sum(cpu.values()),
        "to_consumer_bytes_per_batch": tensor_bytes("uint8") if mode == "service" else 0,
        "moved_bytes_per_batch": r["wire_bytes_per_batch"] if mode == "service" else 0.0,
        "loopback_bytes_per_batch": r["wire_bytes_per_batch"] if mode == "service" else 0.0,
        "store_bytes_per_batch": None,
        "first_batch_s": ev["first_batch"]["wall"] - t0 if "first_batch" in ev else None,
        "memory": memory_peaks(sampler, lambda key: DSCTL_ROLE.get(key.split("-")[0])),
        "isolated_loopback": r["isolated_loopback"],
    }


class RayProcesses:
    """The Ray run's processes (the driver's descendants), listed every DISCOVER_EVERY_S, each given a role."""

    # A worker process's title (setproctitle) names what it runs: "ray::IDLE", a task ("ray::ReadTFRecord->
    # MapBatches(_preprocess)", Ray Data's metadata tasks), or an actor ("ray::SplitCoordinator.get", "ray::_StatsActor",
    # "ray::DashboardAgent"). An actor's process is its actor's for life; the others form the task pool.
    ACTOR = re.compile(r"^ray::_?[A-Z]\w*(\.\w+)?$")
    DATA_OP = re.compile(r"^ray::(Read|Map|FlatMap|Filter|Write|Project|Limit)|->|\(")

    def __init__(self, driver_pid: int, work: Path, isolated: bool):
        self.driver, self.work, self.isolated = driver_pid, work, isolated
        self.roles: dict[int, str] = {driver_pid: "tool"}
        self.created: dict[int, float] = {}
        self.cmd: dict[int, str] = {}
        self.ran_data: set[int] = set()
        self.actor: set[int] = set()
        self.consumer: int | None = None
        self._last = 0.0

    def discover(self):
        now = time.monotonic()
        if now - self._last >= DISCOVER_EVERY_S:
            self._last = now
            self._refresh()
        return {f"p-{pid}": pid for pid in self.roles}, (self.driver if self.isolated else None)

    def _refresh(self) -> None:
        if self.consumer is None:
            try:
                first = (self.work / "consumer.jsonl").read_text().splitlines()[0]
                self.consumer = json.loads(first)["pid"]
            except (OSError, ValueError, IndexError, KeyError):
                pass
        try:
            kids = psutil.Process(self.driver).children(recursive=True)
        except psutil.Error:
            return
        for p in kids:
            try:
                argv = p.cmdline()
                cmd = " ".join(argv)
                self.created.setdefault(p.pid, p.create_time())
                self.cmd[p.pid] = cmd
            except psutil.Error:
                continue
            title = cmd.strip().split(" ")[0] if cmd.startswith("ray::") else (argv[0] if argv else "")
            is_worker = title.startswith("ray::") or any(a.endswith("default_worker.py") for a in argv[:3])
            if title.startswith("ray::"):
                if self.DATA_OP.search(title):
                    self.ran_data.add(p.pid)
                elif self.ACTOR.match(title) and title != "ray::IDLE":
                    self.actor.add(p.pid)
            if p.pid == self.consumer:
                role = "consumer"
            elif not is_worker or (p.pid in self.actor and p.pid not in self.ran_data):
                role = "control"  # gcs_server, raylet, monitors, dashboard; agents and Ray Data's actors
            else:
                role = "workers"  # the task pool: idle, read and map tasks, Ray Data's metadata tasks
            self.roles[p.pid] = role


def _cpu_between(series: bdp.Series, start: float, end: float, created: float | None) -> float:
    """CPU-seconds in [start, end] of one process: its samples interpolated, 0 before it existed, its last value
    after it ended (bench_data_path's Series.at extrapolates, which fits processes that live through the window)."""

    def at(when: float) -> float:
        if series.t and when < series.t[0] and created is not None and created >= when:
            return 0.0
        if series.t and when > series.t[-1]:
            return series.cpu[-1]
        return series.at(when) or 0.0

    return max(0.0, at(end) - at(start))


def run_ray(setting: dict, workers: int, home: Path, files: list[str], seconds: float, warmup: int) -> dict:
    """One Ray run in a process group (and network namespace, where unshare works) of its own."""
    work = Path(tempfile.mkdtemp(prefix="ray-", dir=home))
    ray_tmp = Path(tempfile.mkdtemp(prefix="rp-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    isolated = bool(shutil.which("unshare")) and \
        subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0
    # enough passes over the files for the run at up to 80 batches/s (4x the fastest seen here); the consumer says if not
    repeats = math.ceil((warmup + 80 * seconds + 4 * BATCH) / (len(files) * SHAPE["images_per_file"] / BATCH))
    conf = {"work": str(work), "ray_tmp": str(ray_tmp), "isolated": isolated, "workers": workers, "ray": setting,
            "files": files, "repeats": repeats, "seconds": seconds, "warmup": warmup,
            "prefetch_batches": setting["prefetch_batches"], "batch_format": setting["batch_format"],
            "normalise": setting["normalise"]}
    cmd = [sys.executable, str(Path(__file__).resolve()), "_ray-driver", json.dumps(conf)]
    if isolated:
        cmd = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]
    tag = os.urandom(6).hex()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TF_CPP_MIN_LOG_LEVEL": "2", ENV_TAG: tag}
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    procs = RayProcesses(proc.pid, work, isolated)
    try:
        with MemSampler(procs.discover) as sampler:
            _, err = proc.communicate(timeout=max(180.0, 6 * seconds + 120))
    except subprocess.TimeoutExpired:
        err = "timed out"
    finally:
        leftovers = kill_tagged(tag)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    ev = bdp._events(work / "consumer.jsonl")
    if proc.returncode != 0 or "end" not in ev:
        raise SystemExit(f"the Ray run failed ({setting}):\n{err[-4000:]}")
    if not ev["end"].get("complete"):
        raise SystemExit(f"the Ray dataset ran out before the window ended ({setting}): raise `repeats` in run_ray")
    start, end = ev["measure_start"]["wall"], ev["end"]["wall"]
    batches = ev["end"]["batches"]
    cpu = dict.fromkeys(ROLES, 0.0)
    parts: dict[str, float] = {}
    for key, series in sampler.series.items():
        pid = int(key.split("-")[1])
        role = procs.roles[pid]
        used = _cpu_between(series, start, end, procs.created.get(pid))
        cpu[role] += used / batches
        if role == "control":
            name = next((short for needle, short in _NAMES if needle in procs.cmd.get(pid, "")), "other")
            parts[name] = parts.get(name, 0.0) + used / batches
    lo = (sampler.lo.at(end) - sampler.lo.at(start)) / batches if isolated and len(sampler.lo.t) >= 2 else None
    a, b = ev["measure_start"].get("store_bytes"), ev["end"].get("store_bytes")
    store = (b - a) / batches if a is not None and b is not None else None
    dtype = "float32" if setting["normalise"] == "map" else "uint8"
    try:
        driver = json.loads((work / "driver.json").read_text())
        phases = {"ray_init_done_s": driver["init_done"] - t0, "consumer_start_s": ev["start"]["wall"] - t0}
    except (OSError, ValueError, KeyError):
        phases = {}
    return {
        "batches_per_s": batches / (end - start), "batches": batches, "seconds": end - start,
        "cpu_s_per_batch": cpu, "total_cpu_s_per_batch": sum(cpu.values()), "control_parts": parts,
        "to_consumer_bytes_per_batch": tensor_bytes(dtype),
        "moved_bytes_per_batch": (lo or 0.0) + (store or 0.0) if (lo is not None or store is not None) else None,
        "loopback_bytes_per_batch": lo, "store_bytes_per_batch": store,
        "first_batch_s": ev["first_batch"]["wall"] - t0,
        "memory": memory_peaks(sampler, lambda key: procs.roles[int(key.split("-")[1])]),
        "isolated_loopback": isolated, "left_running": leftovers, "phases": phases,
        "first_batch_shape": ev["first_batch"].get("shape"), "first_batch_dtype": ev["first_batch"].get("dtype"),
    }


_NAMES = (("ray/raylet/raylet ", "raylet"), ("ray/gcs/gcs_server ", "gcs"), ("ray::SplitCoordinator", "coordinator"),
          ("ray::DashboardAgent", "agents"), ("ray::RuntimeEnvAgent", "agents"), ("dashboard.py", "dashboard"),
          ("monitor.py", "monitors"), ("Actor", "data actors"))  # the control part a process's command line names


def kill_tagged(tag: str) -> int:
    """Kill every process that carries this run's tag in its environment (Ray's, if ray.shutdown left any)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(ENV_TAG) == tag:
                found.append(p)
        except psutil.Error:
            continue
    for p in found:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(found, timeout=10)
    return len(found)


# -- the report ----------------------------------------------------------------------------------------------------


def data_files(cache: Path) -> list[str]:
    """The TFRecord files dsctl generated for the `images` builtin at this shape (its manifest's list)."""
    (directory,) = [d for d in cache.iterdir() if d.name.startswith("images-") and (d / "manifest.json").exists()]
    return [str(directory / name) for name in json.loads((directory / "manifest.json").read_text())["files"]]


def _med(rs: list[dict], get):
    vals = [v for v in (get(r) for r in rs) if v is not None]
    return median(vals) if vals else None


def summarize(rs: list[dict]) -> dict:
    return {
        "rounds": len(rs),
        "batches_per_s": _med(rs, lambda r: r["batches_per_s"]),
        "cpu_s_per_batch": {k: _med(rs, lambda r, k=k: r["cpu_s_per_batch"][k]) for k in ROLES},
        "total_cpu_s_per_batch": _med(rs, lambda r: r["total_cpu_s_per_batch"]),
        "to_consumer_bytes_per_batch": rs[0]["to_consumer_bytes_per_batch"],
        "moved_bytes_per_batch": _med(rs, lambda r: r["moved_bytes_per_batch"]),
        "loopback_bytes_per_batch": _med(rs, lambda r: r["loopback_bytes_per_batch"]),
        "store_bytes_per_batch": _med(rs, lambda r: r["store_bytes_per_batch"]),
        "first_batch_s": _med(rs, lambda r: r["first_batch_s"]),
        "memory_rss": {k: _med(rs, lambda r, k=k: r["memory"]["rss"][k]) for k in ROLES},
        "memory_total_rss": _med(rs, lambda r: r["memory"]["total_rss"]),
        "control_parts": {k: _med(rs, lambda r, k=k: r.get("control_parts", {}).get(k))
                          for k in sorted({k for r in rs for k in r.get("control_parts", {})})},
    }


def mb(x):
    return None if x is None else x / 1e6


def _f(x, fmt: str, width: int) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:{width}{fmt}}"


def report(s: dict[str, dict], base: str) -> list[str]:
    lines = ["All figures measured here, from this one run (medians over rounds where rounds > 1).", ""]
    lines.append(f"{'configuration':28} {'b/s':>6}  {'CPU-s/batch:':>12} {'consumer':>8} {'workers':>7} {'control':>7} "
                 f"{'tool':>6} {'total':>6}  {'MB/batch:':>9} {'to cons.':>8} {'moved':>6}  {'1st batch s':>11}  "
                 f"{'peak MB (RSS):':>14} {'consumer':>8} {'workers':>7} {'control':>7} {'tool':>6} {'total':>6}")
    for label, r in s.items():
        c, m = r["cpu_s_per_batch"], r["memory_rss"]
        lines.append(
            f"{label:28} {_f(r['batches_per_s'], '.2f', 6)}  {'':12} {_f(c['consumer'], '.4f', 8)} "
            f"{_f(c['workers'], '.4f', 7)} {_f(c['control'], '.4f', 7)} {_f(c['tool'], '.4f', 6)} "
            f"{_f(r['total_cpu_s_per_batch'], '.4f', 6)}  {'':9} {_f(mb(r['to_consumer_bytes_per_batch']), '.2f', 8)} "
            f"{_f(mb(r['moved_bytes_per_batch']), '.2f', 6)}  {_f(r['first_batch_s'], '.1f', 11)}  {'':14} "
            f"{_f(mb(m['consumer']), '.0f', 8)} {_f(mb(m['workers']), '.0f', 7)} {_f(mb(m['control']), '.0f', 7)} "
            f"{_f(mb(m['tool']), '.0f', 6)} {_f(mb(r['memory_total_rss']), '.0f', 6)}")
    lines += [
        "  roles: consumer = dsctl's trainer / the Ray consumer actor; workers = tf.data service workers / Ray worker",
        "  processes (read + map tasks); control = dsctl's dispatcher / Ray's gcs_server, raylet, agents and Ray Data's",
        "  actors; tool = `dsctl up` + launcher / the Ray driver. MB/batch: to cons. = tensor bytes the consumer receives",
        "  (computed); moved = measured: loopback bytes of the run's network namespace, plus Ray's object store bytes",
        "  created. 1st batch = from starting `dsctl up` / the Ray driver to the consumer's first batch.",
    ]
    for label, r in s.items():
        extra = []
        if r["control_parts"]:
            extra.append("control CPU-s/batch " + ", ".join(f"{k} {v:.4f}" for k, v in r["control_parts"].items()
                                                             if v is not None))
        if r["store_bytes_per_batch"] is not None or r["loopback_bytes_per_batch"]:
            extra.append(f"moved = loopback {_f((r['loopback_bytes_per_batch'] or 0) / 1e6, '.2f', 0)} MB"
                         + (f" + object store {r['store_bytes_per_batch'] / 1e6:.2f} MB"
                            if r["store_bytes_per_batch"] is not None else ""))
        if extra:
            lines.append(f"  {label}: " + "; ".join(extra))
    lines.append("")
    b = s[base]
    for label, r in s.items():
        if label == base:
            continue

        def ratio(key, r=r):
            x, y = r.get(key), b.get(key)
            return "-" if not x or not y else f"{x / y:.2f}x"

        lines.append(f"{label} / {base} (measured here): batches/s {ratio('batches_per_s')}, CPU-s per batch "
                     f"{ratio('total_cpu_s_per_batch')}, bytes moved per batch {ratio('moved_bytes_per_batch')}, "
                     f"time to first batch {ratio('first_batch_s')}, peak memory {ratio('memory_total_rss')}")
    return lines


def labels(workers: int) -> dict[str, tuple]:
    return {
        f"dsctl service {workers}w": ("dsctl", "service"),
        "tf.data colocated": ("dsctl", "colocated"),
        "Ray Data defaults": ("ray", RAY_DEFAULTS),
        "Ray Data best": ("ray", RAY_BEST),
    }


def run_one(what: tuple, workers: int, home: Path, cache: Path, files: list[str], seconds: float, warmup: int) -> dict:
    kind, arg = what
    if kind == "dsctl":
        return run_dsctl(arg, workers, home, cache, seconds, warmup)
    return run_ray(arg, workers, home, files, seconds, warmup)


def sweep_settings() -> list[tuple[str, dict]]:
    """Ray settings tried by --ray-sweep: the defaults; one change at a time; then the changes that helped, together."""
    d = RAY_DEFAULTS
    u8 = {**d, "normalise": "consumer"}
    combined = {**u8, "reader": "binary", "prefetch_batches": 2, "quiet": True}
    return [
        ("defaults", d),
        ("reader binary (no TF in workers)", {**d, "reader": "binary"}),
        ("map batch_size 64", {**d, "map_batch_size": BATCH}),
        ("one block per file", {**d, "blocks_per_file": True}),
        ("concurrency N", {**d, "concurrency": "N"}),
        ("prefetch_batches 2", {**d, "prefetch_batches": 2}),
        ("prefetch_batches 4", {**d, "prefetch_batches": 4}),
        ("quiet: no log streaming, no progress bars", {**d, "quiet": True}),
        ("uint8 out, normalise in consumer", u8),
        ("uint8 + binary", {**u8, "reader": "binary"}),
        ("uint8 + prefetch 2", {**u8, "prefetch_batches": 2}),
        ("uint8 + quiet", {**u8, "quiet": True}),
        ("uint8 + binary + quiet", {**u8, "reader": "binary", "quiet": True}),
        ("uint8 + binary + prefetch 2", {**u8, "reader": "binary", "prefetch_batches": 2}),
        ("uint8 + binary + prefetch 2 + quiet", combined),
        ("uint8 + binary + prefetch 4 + quiet", {**combined, "prefetch_batches": 4}),
        ("uint8 + binary + prefetch 2 + quiet + block per file", {**combined, "blocks_per_file": True}),
        ("uint8 + binary + prefetch 2 + quiet + concurrency N", {**combined, "concurrency": "N"}),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one round of 5 s windows after 5 warm-up batches")
    ap.add_argument("--workers", type=int, default=2, help="preprocessing processes: dsctl workers, Ray's map CPUs")
    ap.add_argument("--seconds", type=float, default=None, help="measured window per configuration (default 20, quick 5)")
    ap.add_argument("--warmup", type=int, default=None, help="batches left out first (default 20, quick 5)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds, medians reported (default 3, quick 1)")
    ap.add_argument("--ray-sweep", action="store_true", help="only Ray: the defaults, one change at a time, the best")
    ap.add_argument("--out", type=Path, default=None, help="write every figure as JSON here")
    args = ap.parse_args()
    seconds = args.seconds or (5.0 if args.quick else 20.0)
    warmup = args.warmup or (5 if args.quick else 20)
    rounds = args.rounds or (1 if args.quick else 3)
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("pyarrow") is None:
        raise SystemExit("bench_peers.py needs Ray Data: pip install -e '.[bench]' (or pip install 'ray[data]')")

    home = Path(tempfile.mkdtemp(prefix="dsctl-bench-peers-"))
    cache = home / "cache"
    t0 = time.time()
    try:
        bdp.prepare(cache)
        files = data_files(cache)
        if args.ray_sweep:
            configs = {name: ("ray", setting) for name, setting in sweep_settings()}
        else:
            configs = labels(args.workers)
        names = list(configs)
        by_label: dict[str, list[dict]] = {}
        for rnd in range(rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                r = run_one(configs[name], args.workers, home, cache, files, seconds, warmup)
                by_label.setdefault(name, []).append(r)
                print(f"# round {rnd + 1}, {name}: {r['batches_per_s']:.2f} batches/s, "
                      f"{r['total_cpu_s_per_batch']:.4f} CPU-s/batch, first batch {r['first_batch_s']:.1f} s",
                      file=sys.stderr, flush=True)
        s = {name: summarize(by_label[name]) for name in names}
        shape = ", ".join(f"{k} {v}" for k, v in SHAPE.items() if k != "epochs")
        print(f"images at the paper's shape ({shape}); the same TFRecord files for every configuration; "
              f"{args.workers} preprocessing processes (dsctl workers, Ray map CPUs); {seconds:g} s windows after "
              f"{warmup} warm-up batches, {rounds} round(s), {time.time() - t0:.0f} s in all; {os.cpu_count()} cores; "
              f"Ray {_version('ray')}, TensorFlow {_version('tensorflow-cpu', 'tensorflow')}, Pillow {_version('pillow')}")
        if args.ray_sweep:
            for name, setting in sweep_settings():
                print(f"  {name}: {json.dumps(setting)}")
        else:
            print(f"  Ray Data defaults: {json.dumps(RAY_DEFAULTS)}")
            print(f"  Ray Data best:     {json.dumps(RAY_BEST)}")
        print("\n".join(report(s, names[0])))
        if args.out:
            args.out.write_text(json.dumps({"summary": s, "runs": by_label}, indent=1))
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _version(*dists: str) -> str:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "?"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_ray-driver":
        _ray_driver(json.loads(sys.argv[2]))
    else:
        main()
