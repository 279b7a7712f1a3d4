"""The dsctl package's import graph: no import cycle anywhere, each layer importing only the layers below it, and no
code outside the providers asking which provider a run is on.

The graph is read from the source (ast), not by importing it: every `import` and `from ... import` a module
executes, at module level or inside a function, is an edge (an import under `if TYPE_CHECKING:` runs never and
is left out). `from pkg import name` is an edge to pkg.name when that is a module, else to pkg. A package's own
__init__ is not counted as imported by its modules: Python runs it first, but that is not a dependency the
module's author wrote, and counting it would make every package that re-exports its modules a cycle.

The layers, lowest first (a layer may import the ones listed for it, and dsctl.errors, the one error base):
    specs        nothing else of dsctl
    runtime      specs
    costmodel    specs
    provisioners runtime, specs, costmodel (a provider that plans machines prices them: contract.Plans; and
                 a machine type's accelerators are in costmodel's machine shapes)
    orchestrator provisioners, costmodel, runtime, specs
    experiments  orchestrator, costmodel, specs, provisioners, runtime (the reproductions of the papers' figures
                 run jobs through the orchestrator, and model what they measured with the runtime's step costs)
    cli          orchestrator, experiments, specs, costmodel
The provider a run is on is its provider's business: outside provisioners/ (and the spec's own rules of what
each provider accepts, specs/schema.py and specs/rules.py) nothing compares a provider's name with "local" or
"gcp"; code asks a provider's capabilities instead (provisioners/contract.py).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]

LAYERS = {
    "specs": set(),
    "runtime": {"specs"},
    "costmodel": {"specs"},
    "provisioners": {"runtime", "specs", "costmodel"},
    "orchestrator": {"provisioners", "costmodel", "runtime", "specs"},
    "experiments": {"orchestrator", "costmodel", "specs", "provisioners", "runtime"},
    "cli": {"orchestrator", "experiments", "specs", "costmodel"},
}
EVERYWHERE = {"dsctl.errors"}  # the error base every layer raises from (one exit code per kind of failure)
PROVIDER_CHECK = re.compile(
    r"""provider\w*\s*(==|!=|\bin\b|\bnot\s+in\b)\s*[(\[{]?\s*["'](local|gcp)["']"""
    r"""|["'](local|gcp)["']\s*(==|!=)\s*[\w.]*provider""")
MAY_NAME_PROVIDERS = ("provisioners/", "specs/schema.py", "specs/rules.py")


@dataclass(frozen=True)
class Module:
    name: str  # dsctl.provisioners.gcp.compute
    path: Path
    package: bool  # an __init__.py


# The example training scripts are users' programs shipped as examples: they import dsctl.train, the client API
# every user's script imports, and belong to no layer.
USER_PROGRAMS = {"dsctl.specs.examples.scripts"}


def modules() -> dict[str, Module]:
    """Every module of the dsctl package, by its dotted name, from pyproject.toml's package-dir (users' example
    programs left out)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    out: dict[str, Module] = {}
    for package in (p for p in config["packages"] if p not in USER_PROGRAMS):
        dirs = config["package-dir"]
        where = REPO / (dirs[package] if package in dirs else _under(dirs, package))
        for path in sorted(where.glob("*.py")):
            is_init = path.name == "__init__.py"
            name = package if is_init else f"{package}.{path.stem}"
            out[name] = Module(name, path, is_init)
    return out


def _under(package_dir: dict[str, str], package: str) -> str:
    """A package not named in package-dir lives below the nearest one that is (dsctl.specs.examples)."""
    parent, _, rest = package.rpartition(".")
    while parent not in package_dir:
        parent, _, head = parent.rpartition(".")
        rest = f"{head}/{rest}"
    return f"{package_dir[parent]}/{rest.replace('.', '/')}"


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, type_hints: bool = False):
    """Every import statement that can run (not those under `if TYPE_CHECKING:`, unless `type_hints`)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node) and not type_hints:
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def edges(known: dict[str, Module], type_hints: bool = False) -> dict[str, set[str]]:
    """module -> the dsctl modules it imports (with `type_hints`, those it imports for type hints only too)."""
    graph: dict[str, set[str]] = {}
    for mod in known.values():
        package = mod.name if mod.package else mod.name.rpartition(".")[0]
        found: set[str] = set()
        for node in _imports(ast.parse(mod.path.read_text(), str(mod.path)), type_hints):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        graph[mod.name] = {name for name in found if name in known and name != mod.name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for source, targets in sorted(graph.items()):
        mine = _layer(source)
        if mine is None:
            continue
        for target in sorted(targets):
            theirs = _layer(target)
            if target in EVERYWHERE or theirs == mine or theirs in LAYERS[mine]:
                continue
            out.append(f"{source} imports {target}")
    return out


def provider_checks(known: dict[str, Module]) -> list[str]:
    out = []
    for mod in known.values():
        where = mod.path.relative_to(REPO).as_posix()
        if where.startswith(MAY_NAME_PROVIDERS):
            continue
        for number, line in enumerate(mod.path.read_text().splitlines(), 1):
            if PROVIDER_CHECK.search(line):
                out.append(f"{where}:{number}: {line.strip()}")
    return out


def test_the_graph_sees_every_kind_of_import():
    """The reader itself: relative, absolute, function-level and `from . import module` imports are edges;
    TYPE_CHECKING imports are not."""
    graph = edges(modules())
    assert "dsctl.provisioners.state" in graph["dsctl.provisioners.local.state"]  # from ..state import ...
    assert "dsctl.runtime.readiness" in graph["dsctl.orchestrator.takedown"]  # inside sweep_on
    assert "dsctl.provisioners.contract" not in graph["dsctl.provisioners.registry"]  # under TYPE_CHECKING
    assert "dsctl.provisioners.contract" in edges(modules(), type_hints=True)["dsctl.provisioners.registry"]
    assert "dsctl.provisioners.gcp.remote" in graph["dsctl.provisioners.gcp.watch"]  # from . import remote
    assert "dsctl.specs" in graph["dsctl.provisioners.contract"]  # from dsctl.specs import SpecError


def test_the_provider_check_sees_every_form():
    for line in ('if spec.provider == "gcp":', "ok = dep.provider != 'local'", 'if "gcp" == loaded.spec.provider:',
                 'if provider in ("local", "gcp"):', 'provider_name not in ["gcp"]'):
        assert PROVIDER_CHECK.search(line), line
    for line in ('provider = get_provider(spec.provider)', 'if isinstance(provider, HandsOff):', 'name == "gcp"'):
        assert not PROVIDER_CHECK.search(line), line


def test_no_import_cycles():
    found = cycles(edges(modules()))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_import_cycles_even_through_type_hints():
    """A module that needs another's types only (under TYPE_CHECKING) still depends on it: no circle there either
    (the provider registry's types once closed contract -> state -> registry -> contract)."""
    found = cycles(edges(modules(), type_hints=True))
    assert not found, "import cycles through type hints:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_each_layer_imports_only_the_layers_below_it():
    found = layer_violations(edges(modules()))
    assert not found, "imports across the layers (see this file's docstring):\n" + "\n".join(found)


def test_only_the_providers_ask_which_provider_a_run_is_on():
    found = provider_checks(modules())
    assert not found, "provider names compared outside provisioners/ (ask a capability instead):\n" + "\n".join(found)
