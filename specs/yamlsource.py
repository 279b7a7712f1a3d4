"""YAML loading that remembers where every value came from, so errors can name file:line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError, dotted


@dataclass
class YamlSource:
    """Parsed YAML plus the line (1-based) of every mapping key and sequence item."""

    path: str
    data: Any
    lines: dict[tuple, int] = field(default_factory=dict)

    def line_of(self, loc: tuple) -> int | None:
        """Line of the deepest known prefix of `loc` (a missing key points at its parent)."""
        loc = tuple(loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return self.lines.get((), None)

    def where(self, loc: tuple = ()) -> str:
        line = self.line_of(loc)
        return f"{self.path}:{line}" if line else self.path

    def error(self, loc: tuple, message: str) -> SpecError:
        return SpecError(message, where=self.where(loc), field=dotted(loc) or None)


def _index_lines(node: yaml.Node, path: tuple, lines: dict[tuple, int], source: str) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                raise SpecError(
                    f"key '{key}' appears twice (first on line {seen[key]}); each key may be given once.",
                    where=f"{source}:{line}",
                    field=dotted(path + (key,)),
                )
            seen[key] = line
            lines[path + (key,)] = line
            _index_lines(value_node, path + (key,), lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _index_lines(item, path + (i,), lines, source)


def parse_yaml(text: str, source: str) -> YamlSource:
    """Parse YAML text; syntax errors become a SpecError naming the line and column."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        problem = problem.replace("found character '\\t' that cannot start any token", "found a tab; YAML indents with spaces only")
        context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and context_mark is not None and mark is not None and context_mark.line != mark.line:
            # e.g. an unclosed bracket: say where the construct began, which is often the line to fix.
            started = f"{context} that starts on line {context_mark.line + 1}"
            problem = f"{started} {problem}" if problem.startswith("but ") else f"{problem} ({started})"
        column = f" (column {mark.column + 1})" if mark else ""
        raise SpecError(
            f"this is not valid YAML{column}: {problem}. Check indentation (spaces, not tabs), "
            "that every 'key: value' has a space after the colon, and that brackets and quotes are closed.",
            where=where,
        ) from None
    lines: dict[tuple, int] = {}
    if node is not None:
        _index_lines(node, (), lines, source)
    return YamlSource(path=source, data=data, lines=lines)


def read_yaml(path: str | Path) -> YamlSource:
    """Read and parse a YAML file; a missing or unreadable file is a SpecError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"file not found: {p}. Pass the path of a YAML file.") from None
    except IsADirectoryError:
        raise SpecError(f"{p} is a directory, not a YAML file.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read {p}: {exc}.") from None
    return parse_yaml(text, str(path))
