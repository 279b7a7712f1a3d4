"""Job specs: the shipped examples load, defaults are filled in, the hash means what it
says, and every malformed spec fails with one paragraph naming file:line, the field and
what would be valid. None of this may need TensorFlow."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dsctl.specs
from dsctl.specs import SpecError, load_spec, load_spec_text, spec_hash
from dsctl.specs.errors import SpecErrors

EXAMPLES_DIR = Path(dsctl.specs.__file__).parent / "examples"
EXAMPLES = (
    "quickstart",
    "images-local",
    "coordinated-reads",
    "ephemeral-sharing",
    "distributed-epoch",
    "gcp-resnet50",
    "gcp-smoke",
    "keras-resnet-local",
    "keras-text-local",
    "script-tf-loop",
    "script-keras",
    "script-jax",
    "script-jax-epochs",
    "script-keras-validation",
)


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def assert_readable(message: str) -> None:
    """One paragraph of plain guidance: no newlines, no traceback, no pydantic jargon."""
    assert "\n" not in message
    assert "Traceback" not in message
    assert "pydantic" not in message.lower()
    assert "errors.pydantic.dev" not in message
    assert "Input should be" not in message
    assert "Value error" not in message


# ---------------------------------------------------------------------------
# The examples users copy from


def test_examples_folder_holds_exactly_the_documented_examples():
    assert sorted(p.stem for p in EXAMPLES_DIR.glob("*.yaml")) == sorted(EXAMPLES)


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.integration  # the keras examples' entrypoints are checked in child processes that import TensorFlow
def test_example_loads(name):
    from dsctl.orchestrator.preflight import load_job

    loaded = load_job(EXAMPLES_DIR / f"{name}.yaml")
    assert loaded.spec.name == name  # the file name and the job name agree
    assert loaded.base_dir == EXAMPLES_DIR.resolve()
    assert len(spec_hash(loaded.spec)) == 16


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_is_commented(name):
    text = (EXAMPLES_DIR / f"{name}.yaml").read_text()
    assert text.lstrip().startswith("#"), "each example starts with a comment saying what it shows"
    assert text.count("#") >= 5


def test_quickstart_is_small_and_priced():
    s = load_spec(EXAMPLES_DIR / "quickstart.yaml").spec
    assert s.provider == "local"
    assert s.service.workers == 2
    assert s.pipeline.builtin == "synthetic"
    assert 0 < s.pipeline.params["latency_ms"] <= 5
    assert s.trainer.model.kind == "synthetic"
    assert s.trainer.model.step_time_ms == 5
    assert s.trainer.steps == 300
    assert s.trainer.machine == "tpu-v2-8" and s.trainer.accelerators_per_trainer == 8
    assert s.service.worker_machine == s.service.dispatcher_machine == "n2-standard-8"
    assert s.pricing == "paper-2023-06"


def test_feature_examples_use_their_feature():
    coord = load_spec(EXAMPLES_DIR / "coordinated-reads.yaml").spec
    assert coord.pipeline.builtin == "text" and coord.pipeline.params["epochs"] is None
    assert coord.trainer.count == coord.service.coordinated_reads.num_consumers == 2
    assert coord.service.job_name
    assert coord.service.coordinated_reads.bucket_boundaries[-1] < coord.pipeline.params["max_length"]
    assert coord.trainer.model.padded_token_time_us > 0
    assert coord.trainer.steps is not None

    share = load_spec(EXAMPLES_DIR / "ephemeral-sharing.yaml").spec
    assert share.service.cross_trainer_cache and share.service.job_name
    assert share.trainer.count == 2 and share.pipeline.params["epochs"] is None

    dist = load_spec(EXAMPLES_DIR / "distributed-epoch.yaml").spec
    assert dist.service.processing_mode == "distributed_epoch"
    p = dist.pipeline.params
    assert p["epochs"] == 1
    assert dist.trainer.steps == p["elements"] // p["batch_size"]


def test_gcp_resnet50_matches_the_paper_setup():
    s = load_spec(EXAMPLES_DIR / "gcp-resnet50.yaml").spec
    assert s.provider == "gcp"
    assert s.service.workers == 16
    assert s.service.worker_machine == s.service.dispatcher_machine == "n2-standard-8"
    assert (s.trainer.machine, s.trainer.count) == ("tpu-v2-8", 1)
    assert s.pipeline.builtin == "images" and s.pipeline.params["batch_size"] == 1024
    assert s.trainer.steps == 112320
    assert (s.pricing, s.cost_basis) == ("paper-2023-06", "vm-hours")


@pytest.mark.integration  # a child process
def test_loading_specs_does_not_import_tensorflow():
    code = (
        "import sys, pathlib\n"
        "from dsctl.specs import load_spec\n"
        # Entrypoints are checked in a child process (which may import TensorFlow: the keras examples' models
        # do), so they are left out here: test_example_loads checks them.
        f"for p in sorted(pathlib.Path({str(EXAMPLES_DIR)!r}).glob('*.yaml')): load_spec(p, check_entrypoints=False)\n"
        "assert 'tensorflow' not in sys.modules, 'spec loading imported tensorflow'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---------------------------------------------------------------------------
# Defaults


MINIMAL = """
name: minimal
trainer:
  steps: 10
pipeline:
  builtin: synthetic
"""


def test_defaults_are_filled_in():
    s = load_spec_text(MINIMAL).spec
    assert s.provider == "local"
    # List (on-demand) prices by default, for machines bought on demand: the paper's catalog prices n2 VMs as Spot.
    assert s.pricing == "gcp-us-central1-2025" and s.cost_basis == "utilization"
    assert s.service.provisioning == s.trainer.provisioning == "standard"
    svc = s.service
    assert svc.workers == 1
    assert svc.processing_mode == "parallel_epochs"
    assert svc.job_name is None and svc.coordinated_reads is None
    assert svc.cross_trainer_cache is False and svc.cross_trainer_cache_mb == 256
    assert svc.compression is None and svc.fault_tolerant is True
    t = s.trainer
    assert (t.machine, t.count, t.accelerators_per_trainer) == ("n2-standard-8", 1, None)
    assert (t.model.kind, t.model.step_time_ms, t.model.padded_token_time_us) == ("synthetic", 0.0, 0.0)
    assert (t.warmup_batches, t.window_s, t.duration_s) == (5, 1.0, None)
    assert s.pipeline.params == {
        "elements": 4096, "shards": 16, "epochs": 1, "feature_size": 64,
        "batch_size": 32, "cpu_work": 0, "latency_ms": 0.0, "label_classes": None,
    }


@pytest.mark.parametrize(
    "builtin, expected",
    [
        ("images", {"num_files": 8, "images_per_file": 64, "image_size": 80, "num_classes": 10, "crop_size": 64,
                    "batch_size": 32,
                    "epochs": 1, "shuffle_buffer": 256, "seed": 0, "cache_dir": None, "transfer_dtype": "uint8"}),
        ("text", {"num_files": 8, "sequences_per_file": 256, "min_length": 8, "max_length": 512,
                  "length_distribution": "lognormal", "vocab_size": 32000, "num_classes": 4, "batch_size": 16, "epochs": 1,
                  "shuffle_buffer": 256, "seed": 0, "cache_dir": None}),
    ],
)
def test_builtin_params_defaults(builtin, expected):
    s = load_spec_text(MINIMAL.replace("synthetic", builtin)).spec
    assert s.pipeline.params == expected


def test_given_params_are_kept_and_the_rest_defaulted():
    s = load_spec_text(MINIMAL + "  params: {latency_ms: 2, batch_size: 8}\n").spec
    assert s.pipeline.params["latency_ms"] == 2.0
    assert s.pipeline.params["batch_size"] == 8
    assert s.pipeline.params["elements"] == 4096


def test_entrypoint_pipeline_params_pass_through_unvalidated():
    text = MINIMAL.replace("builtin: synthetic", "entrypoint: my_pipelines.mod:make_dataset") + (
        "  params: {anything: [1, 2], goes: here}\n"
    )
    s = load_spec_text(text).spec
    assert s.pipeline.builtin is None
    assert s.pipeline.params == {"anything": [1, 2], "goes": "here"}


# ---------------------------------------------------------------------------
# spec_hash: what a spec means, not how it is written


REFORMATTED = """
# the same job as MINIMAL, written differently
pipeline: {builtin: "synthetic", params: {}}   # flow style, quotes, empty params
trainer:
    steps: 10          # deeper indentation
    count: 1           # a default, given explicitly
name: 'minimal'
service:
  workers: 1
  processing_mode: parallel_epochs
provider: local
"""


def test_spec_hash_ignores_formatting_comments_order_and_explicit_defaults():
    h = spec_hash(load_spec_text(MINIMAL).spec)
    assert spec_hash(load_spec_text(REFORMATTED).spec) == h
    assert spec_hash(load_spec_text(MINIMAL + "  params: {elements: 4096, shards: 16}\n").spec) == h


def test_spec_hash_is_stable_across_loads():
    path = EXAMPLES_DIR / "quickstart.yaml"
    assert spec_hash(load_spec(path).spec) == spec_hash(load_spec(path).spec)


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace("steps: 10", "steps: 11"),
        lambda t: t.replace("name: minimal", "name: other"),
        lambda t: t + "service: {workers: 2}\n",
        lambda t: t + "  params: {latency_ms: 1}\n",
        lambda t: t.replace("builtin: synthetic", "builtin: images"),
        lambda t: t + "cost_basis: vm-hours\n",
    ],
    ids=["steps", "name", "workers", "pipeline-param", "builtin", "cost-basis"],
)
def test_spec_hash_changes_with_meaning(change):
    assert spec_hash(load_spec_text(change(MINIMAL)).spec) != spec_hash(load_spec_text(MINIMAL).spec)


# ---------------------------------------------------------------------------
# Malformed specs: (id, file text, line, field or None, substrings the message must contain)

BAD_SPECS = [
    (
        "unclosed-bracket",
        """
        name: bad
        trainer: {steps: 10
        pipeline:
          builtin: synthetic
        """,
        3, "trainer", ["not valid YAML", "expected ',' or '}'", "starts on line 2", "brackets"],
    ),
    (
        "tab-indentation",
        "name: bad\ntrainer:\n\tsteps: 10\npipeline:\n  builtin: synthetic\n",
        3, "trainer", ["not valid YAML", "tab", "spaces"],
    ),
    (
        "top-level-list",
        """
        - name: bad
        - trainer: {steps: 1}
        """,
        1, None, ["mapping of keys", "got a list"],
    ),
    (
        "duplicate-key",
        """
        name: bad
        service:
          workers: 2
          workers: 3
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        """,
        4, "service.workers", ["appears twice", "first on line 3"],
    ),
    (
        "unknown-top-level-key",
        """
        name: bad
        trainer: {steps: 10}
        pipline: {builtin: synthetic}
        """,
        3, "pipline", ["unknown key 'pipline'", "Did you mean 'pipeline'?", "Valid keys here:"],
    ),
    (
        "unknown-nested-key",
        """
        name: bad
        service:
          wrokers: 2
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        """,
        3, "service.wrokers", ["unknown key 'wrokers'", "Did you mean 'workers'?"],
    ),
    (
        "unknown-pipeline-param",
        """
        name: bad
        trainer: {steps: 10}
        pipeline:
          builtin: synthetic
          params:
            batch_size: 8
            latncy_ms: 2
        """,
        7, "pipeline.params.latncy_ms", ["unknown key 'latncy_ms'", "Did you mean 'latency_ms'?", "cpu_work"],
    ),
    (
        "workers-not-a-number",
        """
        name: bad
        service:
          workers: abc
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        """,
        3, "service.workers", ["must be a whole number", "got 'abc'"],
    ),
    (
        "workers-boolean",
        """
        name: bad
        service:
          workers: yes
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        """,
        3, "service.workers", ["must be a whole number", "got true"],
    ),
    (
        "workers-fraction",
        """
        name: bad
        service: {workers: 1.5}
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        """,
        2, "service.workers", ["must be a whole number", "got 1.5"],
    ),
    (
        "zero-workers",
        """
        name: bad
        service:
          workers: 0
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        """,
        3, "service.workers", ["must be at least 1, got 0"],
    ),
    (
        "negative-workers",
        """
        name: bad
        service:
          dispatcher_machine: n2-standard-8
          workers: -3
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        """,
        4, "service.workers", ["must be at least 1, got -3"],
    ),
    (
        "null-with-default",
        """
        name: bad
        service:
          workers: null
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        """,
        3, "service.workers", ["must be a whole number, got null", "default (1)"],
    ),
    (
        "negative-step-time",
        """
        name: bad
        trainer:
          steps: 10
          model:
            kind: synthetic
            step_time_ms: -5
        pipeline: {builtin: synthetic}
        """,
        6, "trainer.model.step_time_ms", ["must be at least 0, got -5"],
    ),
    (
        "zero-duration",
        """
        name: bad
        trainer:
          duration_s: 0
        pipeline: {builtin: synthetic}
        """,
        3, "trainer.duration_s", ["must be greater than 0, got 0"],
    ),
    (
        "both-steps-and-duration",
        """
        name: bad
        trainer:
          steps: 10
          duration_s: 30
        pipeline: {builtin: synthetic}
        """,
        2, "trainer", ["at most one of 'steps'", "'duration_s'", "both were given"],
    ),
    (
        "neither-steps-nor-duration",
        """
        name: bad
        pipeline: {builtin: synthetic, params: {epochs: null}}
        trainer:
          count: 1
        """,
        3, "trainer", ["give 'steps'", "'duration_s'", "the pipeline repeats forever (pipeline.params.epochs: null)"],
    ),
    (
        "unknown-builtin",
        """
        name: bad
        trainer: {steps: 10}
        pipeline:
          builtin: imagenet
        """,
        4, "pipeline.builtin", ["'synthetic', 'images' or 'text'", "got 'imagenet'", "Did you mean 'images'?"],
    ),
    (
        "builtin-and-entrypoint",
        """
        name: bad
        trainer: {steps: 10}
        pipeline:
          builtin: synthetic
          entrypoint: mypkg.data:make_dataset
        """,
        3, "pipeline", ["exactly one of 'builtin'", "'entrypoint'", "both were given"],
    ),
    (
        "neither-builtin-nor-entrypoint",
        """
        name: bad
        trainer: {steps: 10}
        pipeline:
          params: {batch_size: 8}
        """,
        3, "pipeline", ["exactly one of 'builtin'", "neither was given"],
    ),
    (
        "malformed-entrypoint",
        """
        name: bad
        trainer: {steps: 10}
        pipeline:
          entrypoint: mypkg/data.py
        """,
        4, "pipeline.entrypoint", ["'package.module:function'", "got 'mypkg/data.py'"],
    ),
    (
        "coordinated-reads-without-job-name",
        """
        name: bad
        service:
          workers: 2
          coordinated_reads:
            num_consumers: 2
            bucket_boundaries: [64, 128]
        trainer: {steps: 10, count: 2}
        pipeline:
          builtin: text
          params: {epochs: null}
        """,
        4, "service.coordinated_reads", ["service.job_name"],
    ),
    (
        "num-consumers-not-trainer-count",
        """
        name: bad
        service:
          job_name: shared
          coordinated_reads:
            num_consumers: 4
            bucket_boundaries: [64, 128]
        trainer:
          steps: 10
          count: 2
        pipeline:
          builtin: text
          params: {epochs: null}
        """,
        5, "service.coordinated_reads.num_consumers", ["num_consumers is 4 but trainer.count is 2", "must be equal"],
    ),
    (
        "coordinated-reads-finite-epochs",
        """
        name: bad
        service:
          job_name: shared
          coordinated_reads: {num_consumers: 2, bucket_boundaries: [64, 128]}
        trainer: {steps: 10, count: 2}
        pipeline:
          builtin: text
          params:
            epochs: 3
        """,
        9, "pipeline.params.epochs", ["infinite dataset", "'epochs: null'"],
    ),
    (
        "coordinated-reads-default-epochs",
        """
        name: bad
        service:
          job_name: shared
          coordinated_reads: {num_consumers: 2, bucket_boundaries: [64, 128]}
        trainer: {steps: 10, count: 2}
        pipeline:
          builtin: text
        """,
        6, "pipeline.params.epochs", ["infinite dataset", "'epochs: null'"],
    ),
    (
        "bucket-boundaries-not-increasing",
        """
        name: bad
        service:
          job_name: shared
          coordinated_reads:
            num_consumers: 1
            bucket_boundaries: [64, 256, 128]
        trainer: {steps: 10}
        pipeline: {builtin: text, params: {epochs: null}}
        """,
        6, "service.coordinated_reads.bucket_boundaries", ["strictly increasing", "[64, 256, 128]"],
    ),
    (
        "last-bucket-boundary-reaches-max-length",
        """
        name: bad
        service:
          job_name: shared
          coordinated_reads:
            num_consumers: 1
            bucket_boundaries:
              - 64
              - 256
        trainer: {steps: 10}
        pipeline:
          builtin: text
          params: {epochs: null, max_length: 256}
        """,
        6, "service.coordinated_reads.bucket_boundaries",
        ["last bucket boundary (256)", "below pipeline.params.max_length (256)"],
    ),
    (
        "bucket-boundary-not-a-number",
        """
        name: bad
        service:
          job_name: shared
          coordinated_reads:
            num_consumers: 1
            bucket_boundaries:
              - 64
              - lots
        trainer: {steps: 10}
        pipeline: {builtin: text, params: {epochs: null}}
        """,
        8, "service.coordinated_reads.bucket_boundaries[1]", ["must be a whole number", "got 'lots'"],
    ),
    (
        "cross-trainer-cache-without-job-name",
        """
        name: bad
        service:
          cross_trainer_cache: true
        trainer: {steps: 10, count: 2}
        pipeline: {builtin: synthetic, params: {epochs: null}}
        """,
        3, "service.cross_trainer_cache", ["service.job_name"],
    ),
    (
        "cross-trainer-cache-with-distributed-epoch",
        """
        name: bad
        service:
          job_name: shared
          cross_trainer_cache: true
          processing_mode: distributed_epoch
        trainer: {steps: 10, count: 2}
        pipeline: {builtin: synthetic, params: {epochs: null}}
        """,
        5, "service.processing_mode", ["processing_mode: parallel_epochs"],
    ),
    (
        "cross-trainer-cache-finite-dataset",
        """
        name: bad
        service: {job_name: shared, cross_trainer_cache: true}
        trainer: {steps: 10, count: 2}
        pipeline:
          builtin: synthetic
          params:
            epochs: 2
        """,
        7, "pipeline.params.epochs", ["infinite dataset", "'epochs: null'"],
    ),
    (
        "cache-and-coordinated-reads",
        """
        name: bad
        service:
          job_name: shared
          cross_trainer_cache: true
          coordinated_reads: {num_consumers: 1, bucket_boundaries: [64]}
        trainer: {steps: 10}
        pipeline: {builtin: text, params: {epochs: null}}
        """,
        4, "service.cross_trainer_cache", ["cannot be combined"],
    ),
    (
        "upper-case-name",
        """
        name: ResNet50_Job
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        """,
        1, "name", ["lower-case letters, digits or dashes", "got 'ResNet50_Job'"],
    ),
    (
        "unknown-provider",
        """
        name: bad
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        provider: aws
        """,
        4, "provider", ["must be 'local' or 'gcp'", "got 'aws'"],
    ),
    (
        "unknown-processing-mode",
        """
        name: bad
        service:
          processing_mode: distributed_epochs
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        """,
        3, "service.processing_mode", ["'parallel_epochs', 'distributed_epoch'", "Did you mean 'distributed_epoch'?"],
    ),
    (
        "python-model-without-entrypoint",
        """
        name: bad
        trainer:
          steps: 10
          model:
            kind: python
        pipeline: {builtin: synthetic}
        """,
        5, "trainer.model.kind", ["needs 'entrypoint: package.module:function'"],
    ),
    (
        "synthetic-model-with-entrypoint",
        """
        name: bad
        trainer:
          steps: 10
          model: {kind: synthetic, entrypoint: "mypkg.model:train_step"}
        pipeline: {builtin: synthetic}
        """,
        4, "trainer.model.entrypoint", ["only used with 'kind: python'"],
    ),
    (
        "coordinated-reads-with-distributed-epoch",
        """
        name: bad
        service:
          job_name: shared
          processing_mode: distributed_epoch
          coordinated_reads: {num_consumers: 1, bucket_boundaries: [64]}
        trainer: {steps: 10}
        pipeline: {builtin: text, params: {epochs: null}}
        """,
        4, "service.processing_mode", ["processing_mode: parallel_epochs"],
    ),
    (
        "coordinated-reads-on-images",
        """
        name: bad
        service:
          job_name: shared
          coordinated_reads: {num_consumers: 1, bucket_boundaries: [64]}
        trainer: {steps: 10}
        pipeline:
          builtin: images
          params: {epochs: null}
        """,
        7, "pipeline.builtin", ["'text' builtin"],
    ),
    (
        "missing-required-field",
        """
        name: bad
        pipeline: {builtin: synthetic}
        """,
        1, "trainer", ["required but was not given"],
    ),
    (
        "section-not-a-mapping",
        """
        name: bad
        service: 4
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        """,
        2, "service", ["must be a mapping of keys to values", "got 4"],
    ),
    (
        "params-model-rule",
        """
        name: bad
        trainer: {steps: 10}
        pipeline:
          builtin: images
          params:
            image_size: 64
            crop_size: 96
        """,
        5, "pipeline.params", ["crop_size (96) cannot exceed image_size (64)"],
    ),
    (
        "keras-without-entrypoint",
        """
        name: bad
        trainer:
          steps: 10
          model: {kind: keras}
        pipeline: {builtin: images}
        """,
        4, "trainer.model.kind", ["model kind 'keras' needs 'entrypoint", "compiled Keras model"],
    ),
    (
        "keras-params-without-keras",
        """
        name: bad
        trainer:
          steps: 10
          model:
            kind: python
            entrypoint: "m:step"
            params: {width: 8}
        pipeline: {builtin: images}
        """,
        7, "trainer.model.params", ["keyword arguments of a Keras model function", "kind: keras"],
    ),
    (
        "keras-with-synthetic-step-time",
        """
        name: bad
        trainer:
          steps: 10
          model: {kind: keras, entrypoint: "m:build", step_time_ms: 5}
        pipeline: {builtin: images}
        """,
        4, "trainer.model", ["describe the synthetic model", "Remove them"],
    ),
    (
        "keras-synthetic-pipeline-without-labels",
        """
        name: bad
        trainer:
          steps: 10
          model: {kind: keras, entrypoint: "m:build"}
        pipeline:
          builtin: synthetic
          params: {batch_size: 8}
        """,
        7, "pipeline.params", ["yields no label", "label_classes", "model.fit"],
    ),
    (
        "checkpoint-without-keras",
        """
        name: bad
        trainer:
          steps: 10
          checkpoint: {dir: ckpts, every_steps: 100}
        pipeline: {builtin: synthetic}
        """,
        4, "trainer.checkpoint", ["only used with 'trainer.model.kind: keras'"],
    ),
    (
        "checkpoint-dir-other-scheme",
        """
        name: bad
        trainer:
          steps: 10
          model: {kind: keras, entrypoint: "m:build"}
          checkpoint:
            dir: s3://bucket/ckpts
            every_steps: 100
        pipeline: {builtin: images}
        """,
        6, "trainer.checkpoint.dir", ["local path or a Cloud Storage URL", "gs://bucket/path", "s3://bucket/ckpts"],
    ),
    (
        "checkpoint-dir-bad-bucket",
        """
        name: bad
        trainer:
          steps: 10
          model: {kind: keras, entrypoint: "m:build"}
          checkpoint:
            dir: gs://My_Bucket/ckpts
            every_steps: 100
        pipeline: {builtin: images}
        """,
        6, "trainer.checkpoint.dir", ["gs://my-bucket/path", "lower-case"],
    ),
    (
        "checkpoint-every-zero",
        """
        name: bad
        trainer:
          steps: 10
          model: {kind: keras, entrypoint: "m:build"}
          checkpoint:
            dir: ckpts
            every_steps: 0
        pipeline: {builtin: images}
        """,
        7, "trainer.checkpoint.every_steps", ["at least 1"],
    ),
    (
        "checkpoint-without-every-steps",
        """
        name: bad
        trainer:
          steps: 10
          model: {kind: keras, entrypoint: "m:build"}
          checkpoint: {dir: ckpts}
        pipeline: {builtin: images}
        """,
        5, "trainer.checkpoint.every_steps", ["required"],
    ),
    (
        "command-empty",
        """
        name: bad
        trainer:
          steps: 10
          command: "  "
        pipeline: {builtin: synthetic}
        """,
        4, "trainer.command", ["the command is empty"],
    ),
    (
        "command-unbalanced-quote",
        """
        name: bad
        trainer:
          steps: 10
          command: "python train.py --name 'my run"
        pipeline: {builtin: synthetic}
        """,
        4, "trainer.command", ["cannot be split into words", "No closing quotation"],
    ),
    (
        "command-word-not-text",
        """
        name: bad
        trainer:
          steps: 10
          command: [python, train.py, --verbose, true]
        pipeline: {builtin: synthetic}
        """,
        4, "trainer.command", ["word 3 of the command is true", "quotes"],
    ),
    (
        "command-with-model",
        """
        name: bad
        trainer:
          steps: 10
          command: [python, train.py]
          model: {kind: synthetic, step_time_ms: 5}
        pipeline: {builtin: synthetic}
        """,
        5, "trainer.model", ["either dsctl's model (trainer.model) or your own command"],
    ),
    (
        "env-without-command",
        """
        name: bad
        trainer:
          steps: 10
          env: {A: "1"}
        pipeline: {builtin: synthetic}
        """,
        4, "trainer.env", ["no command"],
    ),
    (
        "env-reserved-name",
        """
        name: bad
        trainer:
          steps: 10
          command: [python, train.py]
          env: {DSCTL_TRAINER: x}
        pipeline: {builtin: synthetic}
        """,
        5, "trainer.env", ["set by dsctl itself"],
    ),
    (
        "framework-without-command",
        """
        name: bad
        trainer:
          steps: 10
          framework: jax
        pipeline: {builtin: synthetic}
        """,
        4, "trainer.framework", ["your own program"],
    ),
]


# A command is looked for where it runs, which the provider says: checked with the job (orchestrator.preflight).
BAD_COMMANDS = [
    (
        "command-not-on-path",
        """
        name: bad
        trainer:
          steps: 10
          command: dsctl-test-no-such-program --flag
        pipeline: {builtin: synthetic}
        """,
        4, "trainer.command", ["'dsctl-test-no-such-program' is not on PATH"],
    ),
    (
        "command-script-missing",
        """
        name: bad
        trainer:
          steps: 10
          command: python no_such_train.py
        pipeline: {builtin: synthetic}
        """,
        4, "trainer.command", ["no_such_train.py, which is not in the spec's folder"],
    ),
]


@pytest.mark.parametrize("case_id, text, line, field, needles", BAD_COMMANDS, ids=[c[0] for c in BAD_COMMANDS])
def test_a_command_that_cannot_run_is_explained(tmp_path, case_id, text, line, field, needles):
    from dsctl.orchestrator.preflight import load_job

    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_job(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: {field}: "), message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    assert_readable(message)


@pytest.mark.parametrize("case_id, text, line, field, needles", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_malformed_spec_is_explained(tmp_path, case_id, text, line, field, needles):
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    err = info.value
    message = str(err)
    prefix = f"{path}:{line}: " + (f"{field}: " if field else "")
    assert message.startswith(prefix), f"{message!r} should start with {prefix!r}"
    assert err.where == f"{path}:{line}"
    assert err.field == field
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    assert_readable(message)


def test_malformed_spec_count():
    assert len(BAD_SPECS) >= 20


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"], ids=["empty", "blank-lines", "only-comment"])
def test_empty_file(tmp_path, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(f"{path}:1: ")  # line 1: where an editor opens the file to write the spec
    assert "empty" in message and "'name', 'trainer' and 'pipeline'" in message
    assert_readable(message)


def test_file_not_found(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as info:
        load_spec(missing)
    message = str(info.value)
    assert "file not found" in message and str(missing) in message
    assert_readable(message)


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path)
    assert "is a directory" in str(info.value)
    assert_readable(str(info.value))


def test_several_problems_are_each_reported_in_a_paragraph_of_their_own(tmp_path):
    """The schema's problems all at once; then the pipeline's params and every rule, each of which is checked even
    when another fails."""
    path = write(tmp_path, """
        name: bad
        service:
          workers: 0
          cross_trainer_cache_mb: 0
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        """)
    with pytest.raises(SpecErrors) as info:
        load_spec(path)
    assert str(info.value).splitlines() == [f"{path}:3: service.workers: must be at least 1, got 0.",
                                            f"{path}:4: service.cross_trainer_cache_mb: must be at least 1, got 0."]
    assert info.value.where == f"{path}:3" and info.value.field == "service.workers"  # as a SpecError: the first

    path = write(tmp_path, """
        name: bad
        service: {processing_mode: distributed_epoch, cross_trainer_cache: true}
        trainer: {steps: 10, duration_s: 5}
        pipeline: {builtin: synthetic, params: {batch_sise: 4}}
        """)
    with pytest.raises(SpecErrors) as info:
        load_spec(path)
    found = [(p.where, p.field) for p in info.value.problems]
    assert found == [(f"{path}:4", "pipeline.params.batch_sise"), (f"{path}:3", "trainer"),
                     (f"{path}:2", "service.cross_trainer_cache")], str(info.value)
    for paragraph in info.value.paragraphs():
        assert_readable(paragraph)


def test_a_typo_is_reported_once_not_also_as_the_field_it_meant_missing(tmp_path):
    path = write(tmp_path, "name: bad\ntrainer: {steps: 10}\npipline: {builtin: synthetic}\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert not isinstance(info.value, SpecErrors) and "Did you mean 'pipeline'?" in str(info.value)


def test_load_spec_text_names_its_source():
    with pytest.raises(SpecError) as info:
        load_spec_text("name: bad\ntrainer: {steps: 0}\npipeline: {builtin: synthetic}\n", source="inline.yaml")
    assert str(info.value) == "inline.yaml:2: trainer.steps: must be at least 1, got 0."


def test_loaded_spec_can_point_at_its_own_lines():
    """Errors found later (e.g. by the runtime) still name file:line."""
    loaded = load_spec(EXAMPLES_DIR / "quickstart.yaml")
    err = loaded.error(("service", "workers"), "too few workers for this test.")
    where = err.where
    line = int(where.rsplit(":", 1)[1])
    text = (EXAMPLES_DIR / "quickstart.yaml").read_text().splitlines()
    assert text[line - 1].strip().startswith("workers:")
    assert str(err).startswith(f"{where}: service.workers: too few workers")


# ---------------------------------------------------------------------------
# The reference stays true to the schema

DOC = Path(__file__).resolve().parents[1] / "docs" / "spec-reference.md"


def test_reference_full_example_loads():
    text = DOC.read_text()
    block = text.split("## Full example", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    spec = load_spec_text(block, source="spec-reference.md").spec
    assert spec.service.coordinated_reads is not None


def test_reference_documents_every_field():
    from dsctl.specs.pipeline_options import PipelineOptions
    from dsctl.specs.pipelines import PARAMS_BY_BUILTIN
    from dsctl.specs.schema import CheckpointSpec, CoordinatedReads, JobSpec, ModelSpec, PipelineSpec, ServiceSpec, TrainerSpec

    text = DOC.read_text()
    models = [JobSpec, ServiceSpec, CoordinatedReads, TrainerSpec, ModelSpec, CheckpointSpec, PipelineSpec,
              PipelineOptions, *PARAMS_BY_BUILTIN.values()]
    missing = [f"{m.__name__}.{f}" for m in models for f in m.model_fields if f"`{f}`" not in text]
    assert not missing, f"undocumented fields: {missing}"


# ---------------------------------------------------------------------------
# Bounded input: every limit holds at its edge, and what is over it is refused with file:line

import yaml  # noqa: E402

from dsctl.specs import yamlsource  # noqa: E402

BASE = {"name": "a", "trainer": {"steps": 10}, "pipeline": {"builtin": "synthetic"}}

# (dotted field, largest valid value, the bound as the message says it)
NUMBER_BOUNDS = [
    ("service.workers", 4096, "at most 4096"),
    ("autoscale.min_workers", 4096, "at most 4096"),
    ("autoscale.max_workers", 4096, "at most 4096"),
    ("trainer.count", 1024, "at most 1024"),
    ("trainer.accelerators_per_trainer", 64, "at most 64"),
    ("trainer.steps", 10**9, "at most 1000000000"),
    ("trainer.warmup_batches", 10**9, "at most 1000000000"),
    ("trainer.model.step_time_ms", 3_600_000, "at most 3600000"),
    ("pipeline.params.latency_ms", 60_000, "at most 60000"),
    ("pipeline.params.elements", 10**9, "at most 1000000000"),
]


def _spec_with(field: str, value) -> str:
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    if field.startswith("autoscale."):
        data["autoscale"] = {"min_workers": 1} if field.endswith("max_workers") else {"max_workers": 4096}
        data["pipeline"] = {"builtin": "synthetic", "params": {"epochs": None}}  # autoscaling needs endless data
    if field == "trainer.steps" or field.startswith("trainer.model"):
        data["trainer"] = {"steps": 10, "model": {}} if field.startswith("trainer.model") else {}
    node = data
    *parents, leaf = field.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return yaml.safe_dump(data, sort_keys=False)


def _line_of(text: str, key: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.strip().startswith(f"{key}:"))


@pytest.mark.parametrize("field, largest, says", NUMBER_BOUNDS, ids=[b[0] for b in NUMBER_BOUNDS])
def test_numbers_are_bounded_at_validate_time(tmp_path, field, largest, says):
    load_spec(write(tmp_path, _spec_with(field, largest)))
    leaf = field.rsplit(".", 1)[1]
    too_big = [largest + 1, float(largest + 1), 1e26]
    if isinstance(largest, int) and "time" not in leaf and "latency" not in leaf:
        too_big.append(float(largest) * 10**17)  # a float too large to be any exact whole number
    for value in too_big:
        path = write(tmp_path, _spec_with(field, value))
        with pytest.raises(SpecError) as info:
            load_spec(path)
        text = path.read_text()
        assert info.value.where == f"{path}:{_line_of(text, leaf)}" and info.value.field == field, str(info.value)
        assert says in str(info.value), str(info.value)
        assert_readable(str(info.value))


@pytest.mark.parametrize("field", ["trainer.duration_s", "trainer.window_s", "trainer.model.step_time_ms",
                                   "pipeline.params.latency_ms", "trainer.model.padded_token_time_us"])
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_numbers_are_finite(tmp_path, field, value):
    text = _spec_with(field, 1.5).replace("1.5", value)
    if field == "trainer.duration_s":
        text = text.replace("steps: 10\n", "")
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.field == field and "must be a finite number" in str(info.value), str(info.value)


def test_duration_is_bounded_to_thirty_days(tmp_path):
    ok = "name: a\ntrainer: {duration_s: 2592000}\npipeline: {builtin: synthetic}\n"
    assert load_spec(write(tmp_path, ok)).spec.trainer.duration_s == 2592000
    with pytest.raises(SpecError, match=r"job.yaml:2: trainer.duration_s: must be at most 2592000"):
        load_spec(write(tmp_path, ok.replace("2592000", "2592001")))


def test_a_whole_number_field_never_truncates_a_float(tmp_path):
    for value, says in (("2.5", "whole number"), ("1.0e+26", "at most"), ("1e26", "whole number")):
        with pytest.raises(SpecError, match=says):
            load_spec(write(tmp_path, f"name: a\ntrainer: {{steps: {value}}}\npipeline: {{builtin: synthetic}}\n"))
    assert load_spec(write(tmp_path, "name: a\ntrainer: {steps: 1.0e+3}\npipeline: {builtin: synthetic}\n")
                     ).spec.trainer.steps == 1000  # exact: written as a float, still the whole number 1000


def test_values_count_every_alias_as_what_it_repeats(monkeypatch):
    # 'a', [1, 2] (3 values), 'b', [*x, *x] (1 + 3 + 3), the root: 13 values in all
    text = "a: &x [1, 2]\nb: [*x, *x]\n"
    monkeypatch.setattr(yamlsource, "MAX_VALUES", 13)
    assert yamlsource.parse_yaml(text, "t.yaml").data == {"a": [1, 2], "b": [[1, 2], [1, 2]]}
    monkeypatch.setattr(yamlsource, "MAX_VALUES", 12)
    with pytest.raises(SpecError, match="more than 12 values"):
        yamlsource.parse_yaml(text, "t.yaml")
    monkeypatch.setattr(yamlsource, "MAX_VALUES", 10)  # 'a' and its list, 'b', then 3 + 3: the second alias passes it
    with pytest.raises(SpecError) as info:
        yamlsource.parse_yaml(text, "t.yaml")
    assert info.value.where == "t.yaml:2" and info.value.field == "b[1]"


def test_an_alias_bomb_is_refused_at_once():
    rows = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 10)]
    import time

    start = time.process_time()
    with pytest.raises(SpecError) as info:
        load_spec_text("\n".join(rows) + "\n", source="bomb.yaml")
    assert time.process_time() - start < 1.0
    assert "more than 100,000 values" in str(info.value) and info.value.where == "bomb.yaml:6"


def test_aliases_and_merge_keys_within_the_limits_still_work():
    spec = load_spec_text("name: a\nservice: {worker_machine: &m n2-standard-4, dispatcher_machine: *m}\n"
                          "trainer: {steps: 10}\npipeline:\n  builtin: synthetic\n  params:\n    <<: {batch_size: 8}\n"
                          "    elements: 64\n").spec
    assert spec.service.dispatcher_machine == "n2-standard-4" and spec.pipeline.params["batch_size"] == 8


def test_nesting_is_bounded(monkeypatch):
    monkeypatch.setattr(yamlsource, "MAX_DEPTH", 5)  # root mapping, 'a' list, list, list, 1: depth 5
    assert yamlsource.parse_yaml("a: [[[1]]]\n", "t.yaml").data == {"a": [[[1]]]}
    with pytest.raises(SpecError, match=r"t.yaml:1: a\[0\]\[0\]\[0\]\[0\]: values nest more than 5 levels"):
        yamlsource.parse_yaml("a: [[[[1]]]]\n", "t.yaml")


def test_a_recursive_alias_is_refused():
    with pytest.raises(SpecError, match=r"t.yaml:3: a\[1\]: this alias refers to a value that contains it"):
        yamlsource.parse_yaml("a: &x\n- 1\n- *x\n", "t.yaml")


def test_file_size_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(yamlsource, "MAX_FILE_BYTES", 80)
    path = tmp_path / "job.yaml"
    path.write_text("name: a\ntrainer: {steps: 10}\npipeline: {builtin: synthetic}\n" + "#" * 19 + "\n")
    assert path.stat().st_size == 80
    assert yamlsource.read_yaml(path).data["name"] == "a"
    path.write_text(path.read_text() + "#\n")
    with pytest.raises(SpecError) as info:
        yamlsource.read_yaml(path)
    assert info.value.where == f"{path}:5" and "larger than 80 bytes" in str(info.value)  # byte 81 is on line 5


def test_a_file_that_never_ends_is_refused():
    with pytest.raises(SpecError, match="larger than 1,000,000 bytes"):
        load_spec("/dev/zero")


# ---------------------------------------------------------------------------
# Entrypoints are checked in a child process; the price catalog is loaded with the job (orchestrator.preflight)


@pytest.mark.integration  # entrypoint check in a child process
def test_a_model_entrypoint_that_imports_passes_and_nothing_runs_here(tmp_path):
    from dsctl.orchestrator.preflight import load_job

    (tmp_path / "mymodel.py").write_text("import sys\nsys.modules['__main__'].IMPORTED = True\n"
                                         "def step(batch):\n    pass\n")
    spec = load_job(write(tmp_path, "name: a\ntrainer:\n  steps: 10\n  model: {kind: python, entrypoint: mymodel:step}\n"
                                     "pipeline: {builtin: synthetic}\n")).spec
    assert spec.trainer.model.entrypoint == "mymodel:step"
    assert "mymodel" not in sys.modules and not hasattr(sys.modules["__main__"], "IMPORTED")


@pytest.mark.integration  # entrypoint check in a child process
def test_entrypoints_can_be_left_unchecked(tmp_path):
    from dsctl.orchestrator.preflight import load_job

    path = write(tmp_path, "name: a\ntrainer: {steps: 10}\npipeline: {entrypoint: 'nosuchmodule:make'}\n")
    assert load_job(path, check_entrypoints=False).spec.pipeline.entrypoint == "nosuchmodule:make"
    with pytest.raises(SpecError, match="no module 'nosuchmodule'"):
        load_job(path)


@pytest.mark.slow
def test_a_pipeline_entrypoint_that_returns_a_dataset_passes(tmp_path):
    """Starts a child that imports TensorFlow (that is why it is slow); this process never does."""
    (tmp_path / "mypipe.py").write_text("import tensorflow as tf\n\ndef make(n=4):\n    return tf.data.Dataset.range(n)\n")
    path = write(tmp_path, "name: a\ntrainer: {steps: 10}\npipeline: {entrypoint: 'mypipe:make', params: {n: 8}}\n")
    code = (f"import sys\nfrom dsctl.orchestrator.preflight import load_job\nload_job({str(path)!r})\n"
            "assert 'tensorflow' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_a_negative_price_in_the_spec_catalog_is_refused_with_its_file_and_line(tmp_path):
    (tmp_path / "prices.yaml").write_text("name: mine\ndate: 2024-03\nsource: bill\ncurrency: USD\nmachines:\n"
                                          "  n2-standard-8: -0.39\n")
    path = write(tmp_path, "name: a\ntrainer: {steps: 10}\npipeline: {builtin: synthetic}\npricing: prices.yaml\n")
    from dsctl.orchestrator.preflight import load_job

    with pytest.raises(SpecError) as info:
        load_job(path)
    assert info.value.where == f"{tmp_path.resolve()}/prices.yaml:6"
    assert info.value.field == "machines.n2-standard-8" and "zero or more" in str(info.value)
    assert f"'pricing' names at {path}:4" in str(info.value)
