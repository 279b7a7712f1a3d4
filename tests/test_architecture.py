"""docs/architecture.md is true of the tree, and what it says a new provider or policy touches is all they touch.

The doc's "Modules" section names every module of the dsctl package, folder by folder, and nothing that is not there;
every path it names elsewhere (`orchestrator/run.py`) exists. A scaling policy is its module and its name in the
spec's AutoscalePolicy; a shipped provider is its folder and its Place. The CLI reads run summaries by attribute:
no string-key lookup of a summary in cli/."""

from __future__ import annotations

import importlib
import re
from typing import get_args

from helpers import REPO

DOC = REPO / "docs" / "architecture.md"
# The folders of the package and the heading the doc lists each under (pyproject.toml's package-dir).
FOLDERS = ["cli", "orchestrator", "orchestrator/policies", "orchestrator/profiling", "provisioners", "provisioners/local",
           "provisioners/gcp", "costmodel", "runtime", "runtime/pipelines", "runtime/profiling", "specs", "experiments",
           "dsctl_pkg"]


def listed() -> dict[str, set[str]]:
    """Each folder's modules as the doc's Modules section names them (`name.py` under the folder's heading)."""
    section = DOC.read_text().split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for part in re.split(r"\n### ", section)[1:]:
        folder = re.match(r"`([\w/]+)/`", part).group(1)
        out[folder] = set(re.findall(r"`(\w+\.py)`", part))
    return out


def test_the_docs_module_list_is_the_tree():
    docs = listed()
    assert sorted(docs) == sorted(FOLDERS), "a folder of the package without its section (or a section of none)"
    for folder in FOLDERS:
        tree = {p.name for p in (REPO / folder).glob("*.py") if p.name != "__init__.py"}
        missing, gone = tree - docs[folder], docs[folder] - tree
        assert not missing and not gone, f"{folder}/: not in docs/architecture.md: {sorted(missing)}; " \
                                         f"named there but not in the tree: {sorted(gone)}"


def test_every_path_the_doc_names_exists():
    paths = set(re.findall(r"`((?:cli|orchestrator|provisioners|costmodel|runtime|specs|experiments|tests|tools|benchmarks"
                           r"|standins|docs)/[\w/.-]+\.(?:py|md|yaml))`", DOC.read_text()))
    assert paths and not [p for p in sorted(paths) if not (REPO / p).exists()]


def test_a_policy_is_its_module_and_its_name():
    """Every name a spec may give autoscale.policy is a module of orchestrator/policies with its POLICY, and every
    module there that defines a POLICY is named: nothing else lists them."""
    from dsctl.orchestrator.policies import POLICIES
    from dsctl.specs.schema import AutoscalePolicy

    names = set(get_args(AutoscalePolicy))
    registered = {p.stem for p in (REPO / "orchestrator" / "policies").glob("*.py")
                  if "\nPOLICY = " in p.read_text()}
    assert names == registered == set(POLICIES)
    for name in names:
        assert importlib.import_module(f"dsctl.orchestrator.policies.{name}").POLICY is POLICIES[name]


def test_a_shipped_provider_is_its_folder_and_its_place():
    """Each shipped provider's Place names a module of its own folder, which registers the provider under that name,
    and a catalog that loads; the registry lists no provider of its own."""
    from dsctl.costmodel import load_catalog
    from dsctl.provisioners.registry import provider_class
    from dsctl.specs.places import SHIPPED

    for name, place in SHIPPED.items():
        assert place.module.startswith(f"dsctl.provisioners.{name}"), (name, place.module)
        cls = provider_class(name)
        assert cls is not None and cls.name == name and cls.__module__.startswith(f"dsctl.provisioners.{name}")
        load_catalog(place.pricing)
    registry = (REPO / "provisioners" / "registry.py").read_text()
    assert not [n for n in SHIPPED if f'"{n}"' in registry]


SUMMARY_BY_KEY = re.compile(r"""summary\s*\[|summary\.get\(|\bs\s*\[\s*["']|\bs\.get\(\s*["']""")


def test_the_cli_reads_run_summaries_by_attribute_only():
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in sorted((REPO / "cli").glob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if SUMMARY_BY_KEY.search(line)]
    assert not found, "string-key lookups of run summaries in cli/:\n" + "\n".join(found)


def test_the_summary_lookup_check_sees_what_it_looks_for():
    for line in ('s = record.summary["batches"]', "cost = record.summary.get('cost')", 'fmt(s["batches_per_s"])',
                 "s.get('epochs')"):
        assert SUMMARY_BY_KEY.search(line), line
    for line in ("s.batches_per_s", "record.summary.as_json()", "summary_table(record)"):
        assert not SUMMARY_BY_KEY.search(line), line
