"""Type-check the dsctl package with mypy: `python tools/typecheck.py` (exit status 1 on any finding).

The package's import names are not its folders (pyproject.toml's [tool.setuptools] package-dir maps
`dsctl` to dsctl_pkg/, `dsctl.cli` to cli/, ...) and it is installed editable, which mypy cannot follow.
So this builds build/typecheck/dsctl/, a tree of symlinks laid out as the import names say, runs
`mypy -p dsctl` there with the [tool.mypy] settings of pyproject.toml, and prints mypy's findings with
the repository's own paths (cli/main.py, not build/typecheck/dsctl/cli/main.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mypy depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"


def package_dirs(pyproject: Path) -> dict[str, Path]:
    """Each package of [tool.setuptools] package-dir, with the folder it is in (absolute)."""
    config = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    return {name: (pyproject.parent / folder).resolve() for name, folder in config["package-dir"].items()}


def build_tree(mapping: dict[str, Path], tree: Path) -> dict[Path, Path]:
    """Lay the packages out under `tree` by import name, as symlinks; returns each link with its target.

    The top package is a real folder holding a link to each of its files; a subpackage is a link to its
    folder, unless its parent's folder already holds it under its own name (dsctl.runtime.pipelines in
    runtime/pipelines). Made afresh each time; mypy's cache beside it (build/typecheck/.mypy_cache) is kept."""
    for top in {name.partition(".")[0] for name in mapping}:
        if (tree / top).exists():
            shutil.rmtree(tree / top)
    links: dict[Path, Path] = {}
    for name in sorted(mapping, key=lambda n: n.count(".")):
        folder = mapping[name]
        parent = name.rpartition(".")[0]
        if not parent:
            top = tree / name
            top.mkdir(parents=True)
            for entry in sorted(folder.iterdir()):
                if entry.name != "__pycache__":
                    links[top / entry.name] = entry
                    (top / entry.name).symlink_to(entry)
            continue
        if parent in mapping and mapping[parent] / name.rpartition(".")[2] == folder:
            continue  # in the tree already, inside its parent's folder
        link = tree / Path(*name.split("."))
        if link.exists() or link.is_symlink():
            raise SystemExit(f"typecheck: {name} ({folder}) collides with {link}, already in the tree")
        links[link] = folder
        link.symlink_to(folder, target_is_directory=True)
    return links


def real_path(line: str, links: dict[Path, Path]) -> str:
    """A mypy line with its path in the symlink tree replaced by the repository path it stands for."""
    path, sep, rest = line.partition(":")
    if not sep:
        return line
    full = TREE / path
    for link, target in sorted(links.items(), key=lambda kv: -len(kv[0].parts)):
        if full == link or link in full.parents:
            real = target / full.relative_to(link)
            try:
                return f"{real.relative_to(ROOT)}{sep}{rest}"
            except ValueError:
                return f"{real}{sep}{rest}"
    return line


def main() -> int:
    pyproject = ROOT / "pyproject.toml"
    links = build_tree(package_dirs(pyproject), TREE)
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(pyproject), "-p", "dsctl"]
    # From inside the tree, so that `dsctl` is found there (not through the editable install, nor a MYPYPATH of the
    # caller's environment).
    env = {**os.environ, "MYPYPATH": ""}
    proc = subprocess.run(cmd, cwd=TREE, env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        print(real_path(line, links))
    if proc.stderr:
        print(proc.stderr, end="", file=sys.stderr)
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
