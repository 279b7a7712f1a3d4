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

EXAMPLES_DIR = Path(dsctl.specs.__file__).parent / "examples"
EXAMPLES = (
    "quickstart",
    "images-local",
    "coordinated-reads",
    "ephemeral-sharing",
    "distributed-epoch",
    "gcp-resnet50",
    "gcp-smoke",
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
def test_example_loads(name):
    loaded = load_spec(EXAMPLES_DIR / f"{name}.yaml")
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


def test_loading_specs_does_not_import_tensorflow():
    code = (
        "import sys, pathlib\n"
        "from dsctl.specs import load_spec\n"
        f"for p in sorted(pathlib.Path({str(EXAMPLES_DIR)!r}).glob('*.yaml')): load_spec(p)\n"
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
        "batch_size": 32, "cpu_work": 0, "latency_ms": 0.0,
    }


@pytest.mark.parametrize(
    "builtin, expected",
    [
        ("images", {"num_files": 8, "images_per_file": 64, "image_size": 80, "crop_size": 64, "batch_size": 32,
                    "epochs": 1, "shuffle_buffer": 256, "seed": 0, "cache_dir": None}),
        ("text", {"num_files": 8, "sequences_per_file": 256, "min_length": 8, "max_length": 512,
                  "length_distribution": "lognormal", "vocab_size": 32000, "batch_size": 16, "epochs": 1,
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
        3, None, ["not valid YAML", "expected ',' or '}'", "starts on line 2", "brackets"],
    ),
    (
        "tab-indentation",
        "name: bad\ntrainer:\n\tsteps: 10\npipeline:\n  builtin: synthetic\n",
        3, None, ["not valid YAML", "tab", "spaces"],
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
        2, "trainer", ["exactly one of 'steps'", "'duration_s'", "both were given"],
    ),
    (
        "neither-steps-nor-duration",
        """
        name: bad
        pipeline: {builtin: synthetic}
        trainer:
          count: 1
        """,
        3, "trainer", ["exactly one of 'steps'", "neither was given"],
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
        6, "service.coordinated_reads.bucket_boundaries", ["last bucket boundary (256)", "below pipeline.params.max_length (256)"],
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
]


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
    assert message.startswith(f"{path}: ")
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


def test_several_problems_report_the_first_and_count_the_rest(tmp_path):
    path = write(tmp_path, """
        name: bad
        service:
          workers: 0
          cross_trainer_cache_mb: 0
        trainer: {steps: 10}
        pipeline: {builtin: synthetic}
        """)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: service.workers: must be at least 1, got 0.")
    assert "(1 more problem after this one.)" in message
    assert_readable(message)


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
    from dsctl.specs.pipelines import PARAMS_BY_BUILTIN
    from dsctl.specs.schema import CoordinatedReads, JobSpec, ModelSpec, PipelineSpec, ServiceSpec, TrainerSpec

    text = DOC.read_text()
    models = [JobSpec, ServiceSpec, CoordinatedReads, TrainerSpec, ModelSpec, PipelineSpec, *PARAMS_BY_BUILTIN.values()]
    missing = [f"{m.__name__}.{f}" for m in models for f in m.model_fields if f"`{f}`" not in text]
    assert not missing, f"undocumented fields: {missing}"
