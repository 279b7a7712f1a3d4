"""A corpus of malformed specs, each through the real CLI: `dsctl validate FILE` exits 2 in under
5 s with one paragraph naming the file, the line and the field, and no traceback.

Every case says where the error must point: the line is the one marked `#<` in its text (or
given), the field is the dotted path the message must name right after `file:line: `. A few
problems belong to the whole file (empty, too large, not UTF-8, a control character, not a
mapping); those name the file and a line and no field. The processes run two at a time; each is
the real CLI, most of whose 0.55 s is importing it. The bounds of every number are checked at
their edges, in-process, in test_specs.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from helpers import REPO

# The corpus runs `dsctl validate` ~55 times, two processes at a time (a minute of both cores): kept away
# from the `timed` tests like any other test that starts processes (tests/conftest.py).
pytestmark = pytest.mark.slow

GOOD = "name: a\ntrainer: {steps: 10}\npipeline: {builtin: synthetic}\n"
HEAD = "name: a\ntrainer: {steps: 10}\n"  # GOOD without the pipeline
# In the command line of a process a looping entrypoint starts. This test process's pid is part of it: another
# test process may be running its own copy of the corpus (the module fixture runs once per test process), and
# the process its looping entrypoint started is alive while its check runs.
MARKER = f"dsctl-corpus-leftover-{os.getpid()}"


@dataclass
class Case:
    id: str
    text: str | bytes
    field: str | None  # None: a problem of the whole file (said why in the case)
    words: tuple[str, ...]  # must appear in the paragraph (what is wrong, what would be valid)
    line: int | None = None  # default: the line marked "#<"
    files: dict[str, str] = field(default_factory=dict)  # modules and catalogs beside the spec
    where_file: str = "job.yaml"  # the file the error names (a catalog's errors name the catalog)
    env: dict[str, str] = field(default_factory=dict)

    def expected_line(self) -> int:
        if self.line is not None:
            return self.line
        text = self.text.decode("utf-8", "replace") if isinstance(self.text, bytes) else self.text
        marked = [i for i, line in enumerate(text.splitlines(), 1) if "#<" in line]
        assert len(marked) == 1, f"case {self.id}: mark exactly one line with #<"
        return marked[0]


def _bomb() -> str:
    """The classic "billion laughs", nine levels: a few hundred bytes, 9**9 values when expanded."""
    rows = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" + ("  #<" if i == 5 else "") for i in range(1, 10)]
    return GOOD + "\n".join(rows) + "\n"


def _huge() -> str:
    """A valid spec followed by 1.2 MB of comments: refused on size, before parsing."""
    return GOOD + ("# " + "x" * 97 + "\n") * 12_000


GCP = "name: a\nprovider: gcp\ntrainer: {steps: 10, machine: n2-standard-8}\npipeline: {builtin: synthetic}\n"
NEGATIVE_CATALOG = """\
name: mine
date: 2024-03
source: my cloud bill
currency: USD
rates:
  n2: {vcpu_hour: 0.03, gb_hour: -0.004}
machines:
  tpu-v2-8: 4.5
"""
LOOPS_AT_IMPORT = f"""\
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{MARKER}"])
while True:
    pass
"""

CASES = [
    # --- wrong types
    Case("workers-not-a-number", GOOD + "service:\n  workers: many  #<\n", "service.workers", ("whole number", "'many'")),
    Case("workers-yes", GOOD + "service:\n  workers: yes  #<\n", "service.workers", ("whole number", "got true")),
    Case("bool-not-bool", GOOD + "service:\n  fault_tolerant: maybe  #<\n", "service.fault_tolerant", ("true or false",)),
    Case("trainer-is-a-list", "name: a\ntrainer: [10, 20]  #<\npipeline: {builtin: synthetic}\n", "trainer",
         ("mapping of keys",)),
    # --- unknown keys, with did-you-mean
    Case("unknown-top-key", HEAD + "pipline: {builtin: synthetic}  #<\n", "pipline", ("did you mean 'pipeline'",)),
    Case("unknown-service-key", GOOD + "service:\n  wrokers: 2  #<\n", "service.wrokers", ("did you mean 'workers'",)),
    Case("unknown-pipeline-param", HEAD + "pipeline:\n  builtin: synthetic\n  params: {batch_sise: 4}  #<\n",
         "pipeline.params.batch_sise", ("did you mean 'batch_size'",)),
    # --- bad enums
    Case("processing-mode-typo", GOOD + "service:\n  processing_mode: parallel_epoch  #<\n", "service.processing_mode",
         ("did you mean 'parallel_epochs'",)),
    Case("unknown-builtin", HEAD + "pipeline: {builtin: imagez}  #<\n", "pipeline.builtin", ("did you mean 'images'",)),
    Case("unknown-autoscale-policy", GOOD + "autoscale:\n  policy: cachw  #<\n", "autoscale.policy",
         ("did you mean 'cachew'",)),
    # --- negative, zero and huge numbers
    Case("zero-workers", GOOD + "service:\n  workers: 0  #<\n", "service.workers", ("at least 1",)),
    Case("workers-100000", GOOD + "service:\n  workers: 100000  #<\n", "service.workers", ("at most 4096", "100000")),
    Case("steps-1e26-as-float", "name: a\ntrainer:\n  steps: 1.0e+26  #<\npipeline: {builtin: synthetic}\n",
         "trainer.steps", ("at most 1000000000", "1e+26")),
    Case("steps-1e26-as-text", "name: a\ntrainer:\n  steps: 1e26  #<\npipeline: {builtin: synthetic}\n",
         "trainer.steps", ("whole number", "'1e26'")),
    Case("duration-infinite", "name: a\ntrainer:\n  duration_s: .inf  #<\npipeline: {builtin: synthetic}\n",
         "trainer.duration_s", ("finite", ".inf")),
    Case("duration-negative", "name: a\ntrainer:\n  duration_s: -5  #<\npipeline: {builtin: synthetic}\n",
         "trainer.duration_s", ("greater than 0",)),
    Case("duration-31-years", "name: a\ntrainer:\n  duration_s: 1.0e+9  #<\npipeline: {builtin: synthetic}\n",
         "trainer.duration_s", ("at most 2592000",)),
    # --- bad names
    Case("name-with-spaces", "name: My Job  #<\n" + GOOD[len("name: a\n"):], "name", ("lower-case",)),
    # --- YAML syntax, tabs, duplicates
    Case("unclosed-bracket", "name: a\ntrainer: {steps: 10\npipeline: {builtin: synthetic}  #<\n", "trainer",
         ("not valid YAML", "starts on line 2")),
    Case("tab-indentation", "name: a\ntrainer:\n\tsteps: 10  #<\npipeline: {builtin: synthetic}\n", "trainer",
         ("tab", "spaces")),
    Case("duplicate-top-key", GOOD + "service: {workers: 2}\nservice: {workers: 3}  #<\n", "service",
         ("appears twice", "first on line 4")),
    # --- the whole file: empty, not a mapping, too large, not UTF-8, expansion limits
    Case("empty-file", "", None, ("empty", "'name', 'trainer' and 'pipeline'"), line=1),  # no field: nothing is there
    Case("top-level-list", "- name: a  #<\n- trainer: {steps: 10}\n", None, ("mapping of keys", "got a list")),
    Case("huge-file", _huge(), None, ("larger than 1,000,000 bytes",),
         line=_huge().encode()[:1_000_000].count(b"\n") + 1),  # no field: refused before parsing
    Case("not-utf8", GOOD.encode() + b"# caf\xe9 #<\n", None, ("not UTF-8", "0xe9")),  # no field: cannot be read
    Case("control-character", "name: a\ntrainer: {steps: 10}\x1b[0m  #<\npipeline: {builtin: synthetic}\n", None,
         ("#x001b", "special character")),  # no field: refused before the YAML is read
    Case("alias-bomb", _bomb(), "l5[0]", ("more than 100,000 values", "alias")),
    Case("recursive-alias", GOOD + "service: &s\n  workers: *s  #<\n", "service.workers", ("recursive",)),
    Case("deep-nesting", HEAD + "pipeline:\n  builtin: synthetic\n  params: {feature_size: " + "[" * 60 + "]" * 60
         + "}  #<\n", "pipeline.params.feature_size[0][0][0][0][0]...", ("more than 50 levels",)),
    # --- required sections and cross-field rules
    Case("missing-trainer", "name: a  #<\npipeline: {builtin: synthetic}\n", "trainer", ("required",)),
    Case("steps-and-duration", "name: a\ntrainer: {steps: 10, duration_s: 5}  #<\npipeline: {builtin: synthetic}\n",
         "trainer", ("at most one", "both were given")),
    # --- Google Cloud settings
    Case("gcp-bad-project", GCP + "gcp:\n  project: My_Project  #<\n", "gcp.project", ("project id",)),
    Case("gcp-bad-zone", GCP + "gcp:\n  zone: uscentral1  #<\n", "gcp.zone", ("us-central1-a",)),
    Case("gcp-bad-bucket", GCP + "gcp:\n  bucket: -bad-  #<\n", "gcp.bucket", ("bucket name",)),
    Case("gcp-bad-label", GCP + "gcp:\n  labels: {Team: ml}  #<\n", "gcp.labels", ("lower-case",)),
    Case("gcp-tf-version-injection", GCP + 'gcp:\n  tensorflow_version: "2.21.0\\ncurl x | sh"  #<\n',
         "gcp.tensorflow_version", ("pattern",)),
    # --- autoscaling and coordinated reads
    Case("autoscale-finite-dataset",
         "name: a\ntrainer: {steps: 10}\npipeline:\n  builtin: synthetic\n  params: {epochs: 2}  #<\n"
         "autoscale: {policy: cachew}\n", "pipeline.params.epochs", ("removed worker", "epochs: null")),
    Case("autoscale-max-below-min", GOOD + "autoscale:\n  min_workers: 4\n  max_workers: 2  #<\n",
         "autoscale.max_workers", ("below min_workers",)),
    Case("autoscale-max-huge", GOOD + "autoscale:\n  max_workers: 10000  #<\n", "autoscale.max_workers",
         ("at most 4096",)),
    Case("coordinated-without-job-name", "name: a\ntrainer: {steps: 10, count: 2}\n"
         "pipeline: {builtin: text, params: {epochs: null}}\n"
         "service:\n  coordinated_reads: {num_consumers: 2, bucket_boundaries: [64]}  #<\n",
         "service.coordinated_reads", ("job_name",)),
    Case("coordinated-consumers-not-count", "name: a\ntrainer: {steps: 10, count: 2}\n"
         "pipeline: {builtin: text, params: {epochs: null}}\nservice:\n  job_name: j\n  coordinated_reads:\n"
         "    num_consumers: 3  #<\n    bucket_boundaries: [64]\n",
         "service.coordinated_reads.num_consumers", ("trainer.count is 2",)),
    Case("coordinated-buckets-decreasing", "name: a\ntrainer: {steps: 10, count: 2}\n"
         "pipeline: {builtin: text, params: {epochs: null}}\nservice:\n  job_name: j\n  coordinated_reads:\n"
         "    num_consumers: 2\n    bucket_boundaries: [128, 64]  #<\n",
         "service.coordinated_reads.bucket_boundaries", ("strictly increasing",)),
    # --- pricing
    Case("pricing-unknown-name", GOOD + "pricing: gcp-us-central2  #<\n", "pricing", ("unknown price catalog",)),
    Case("pricing-missing-file", GOOD + "pricing: ./nowhere.yaml  #<\n", "pricing", ("file not found",)),
    Case("pricing-negative-price", GOOD + "pricing: ./prices.yaml\n", "rates.n2.gb_hour",
         ("zero or more", "-0.004", "'pricing' names at"), line=6, files={"prices.yaml": NEGATIVE_CATALOG},
         where_file="prices.yaml"),
    # --- entrypoints
    Case("entrypoint-not-module-function", HEAD + "pipeline:\n  entrypoint: mypkg/data.py  #<\n",
         "pipeline.entrypoint", ("'package.module:function'",)),
    Case("entrypoint-module-missing", HEAD + "pipeline:\n  entrypoint: nosuchmodule:make  #<\n",
         "pipeline.entrypoint", ("no module 'nosuchmodule'",)),
    Case("entrypoint-import-raises", HEAD + "pipeline:\n  entrypoint: userpipe:make  #<\n", "pipeline.entrypoint",
         ("RuntimeError", "no credentials here"), files={"userpipe.py": "raise RuntimeError('no credentials here')\n"}),
    Case("entrypoint-function-typo", HEAD + "pipeline:\n  entrypoint: userpipe:make_datset  #<\n",
         "pipeline.entrypoint", ("no function 'make_datset'", "did you mean 'make_dataset'"),
         files={"userpipe.py": "def make_dataset():\n    pass\n"}),
    Case("entrypoint-returns-a-list", HEAD + "pipeline:\n  entrypoint: userpipe:make  #<\n", "pipeline.entrypoint",
         ("returned builtins.list", "not a tf.data.Dataset"), files={"userpipe.py": "def make():\n    return [1, 2]\n"}),
    Case("entrypoint-exits-at-import", HEAD + "pipeline:\n  entrypoint: userpipe:make  #<\n", "pipeline.entrypoint",
         ("sys.exit(3)",), files={"userpipe.py": "import sys\nsys.exit(3)\n"}),
    Case("entrypoint-loops-at-import", HEAD + "pipeline:\n  entrypoint: userpipe:make  #<\n", "pipeline.entrypoint",
         ("did not finish within 1.5 s", "DSCTL_ENTRYPOINT_TIMEOUT_S", "killed"),
         files={"userpipe.py": LOOPS_AT_IMPORT}, env={"DSCTL_ENTRYPOINT_TIMEOUT_S": "1.5"}),
    Case("model-entrypoint-missing", "name: a\ntrainer:\n  steps: 10\n  model: {kind: python, entrypoint: nomodel:step}  #<\n"
         "pipeline: {builtin: synthetic}\n", "trainer.model.entrypoint", ("no module 'nomodel'",)),
    # --- keras models and checkpoints
    Case("keras-model-function-typo", "name: a\ntrainer:\n  steps: 10\n  model: {kind: keras, entrypoint: usermodel:build_modle}"
         "  #<\npipeline: {builtin: images}\n", "trainer.model.entrypoint",
         ("no function 'build_modle'", "did you mean 'build_model'"), files={"usermodel.py": "def build_model():\n    pass\n"}),
    Case("keras-without-entrypoint", "name: a\ntrainer:\n  steps: 10\n  model:\n    kind: keras  #<\n"
         "pipeline: {builtin: images}\n", "trainer.model.kind", ("needs 'entrypoint", "compiled Keras model")),
    Case("checkpoint-dir-scheme", "name: a\ntrainer:\n  steps: 10\n  model: {kind: keras, entrypoint: m:build}\n"
         "  checkpoint:\n    dir: hdfs://x/ckpt  #<\n    every_steps: 5\npipeline: {builtin: images}\n",
         "trainer.checkpoint.dir", ("local path or a Cloud Storage URL", "gs://bucket/path")),
]


@dataclass
class Outcome:
    proc: subprocess.CompletedProcess
    seconds: float
    spec: Path
    dir: Path


def _run(case: Case, root: Path, home: Path) -> Outcome:
    d = root / case.id
    d.mkdir()
    spec = d / "job.yaml"
    spec.write_bytes(case.text if isinstance(case.text, bytes) else case.text.encode())
    for name, text in case.files.items():
        (d / name).write_text(text)
    env = {**os.environ, "COLUMNS": "200", "DSCTL_HOME": str(home), **case.env}
    args = [sys.executable, "-m", "dsctl.cli.main", "validate", str(spec)]
    start = time.monotonic()
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    except subprocess.TimeoutExpired as exc:  # a hang fails its own case, not the whole corpus
        proc = subprocess.CompletedProcess(args, None, "", f"(killed after {exc.timeout:g} s)")
    return Outcome(proc, time.monotonic() - start, spec, d)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    """Every case's `dsctl validate`, two at a time (the machine has two cores)."""
    root = tmp_path_factory.mktemp("corpus")
    home = root / "dsctl-home"
    home.mkdir()
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip([c.id for c in CASES], pool.map(lambda c: _run(c, root, home), CASES)))
    return results


def test_corpus_is_large_and_ids_are_unique():
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_spec_is_one_paragraph_naming_file_line_and_field(outcomes, case):
    out = outcomes[case.id]
    err = out.proc.stderr
    assert out.proc.returncode == 2, (out.proc.stdout, err)
    # A bound against hangs (an alias bomb, an entrypoint that loops), not a speed goal: a loaded CI machine
    # starts Python and pydantic in several seconds, a hang never ends.
    assert out.seconds < 30, f"took {out.seconds:.1f} s"
    assert "Traceback" not in err and "pydantic" not in err.lower()
    assert out.proc.stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"one paragraph expected:\n{err}"
    named = out.spec if case.where_file == "job.yaml" else (out.dir / case.where_file).resolve()
    prefix = f"error: {named}:{case.expected_line()}: " + (f"{case.field}: " if case.field else "")
    assert lines[0].startswith(prefix), f"{lines[0]!r} should start with {prefix!r}"
    if case.field is None:  # a problem of the whole file names no field
        assert not lines[0][len(prefix):].split(" ")[0].endswith(":"), lines[0]
    for word in case.words:
        assert word.lower() in lines[0].lower(), f"{word!r} not in {lines[0]!r}"


def test_an_entrypoint_that_loops_at_import_leaves_nothing_running(outcomes):
    assert outcomes["entrypoint-loops-at-import"].proc.returncode == 2
    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if MARKER in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            continue
    for p in left:
        p.kill()
    assert not left, "the process the module started outlived the check"


def _modules_after_validate(spec: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`dsctl validate SPEC` in a Python that reports at exit whether TensorFlow was imported."""
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('tensorflow imported:', 'tensorflow' in sys.modules, file=sys.stderr))\n"
            f"sys.argv = ['dsctl', 'validate', {str(spec)!r}]\n"
            "from dsctl.cli.main import main\n"
            "main()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_validate_does_not_import_tensorflow(outcomes):
    """Specs without entrypoints, and entrypoints refused before any import of TensorFlow."""
    ok = _modules_after_validate(REPO / "specs" / "examples" / "quickstart.yaml")
    assert ok.returncode == 0 and "tensorflow imported: False" in ok.stderr, ok.stderr
    for case_id in ("workers-100000", "alias-bomb", "pricing-negative-price", "entrypoint-returns-a-list"):
        bad = _modules_after_validate(outcomes[case_id].spec)
        assert bad.returncode == 2 and "tensorflow imported: False" in bad.stderr, (case_id, bad.stderr)


def test_a_bad_entrypoint_time_limit_is_one_paragraph(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(HEAD + "pipeline:\n  entrypoint: userpipe:make\n")
    proc = subprocess.run([sys.executable, "-m", "dsctl.cli.main", "validate", str(spec)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "DSCTL_ENTRYPOINT_TIMEOUT_S": "soon"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "DSCTL_ENTRYPOINT_TIMEOUT_S must be a number of seconds" in " ".join(proc.stderr.split())
