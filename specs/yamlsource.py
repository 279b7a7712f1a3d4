"""YAML loading that remembers where every value came from, so errors can name file:line.

Input is bounded: a spec (or price catalog) is at most MAX_FILE_BYTES, nests at most
MAX_DEPTH levels, and expands to at most MAX_VALUES values counting every alias (`*name`)
as the values it repeats. PyYAML has no such limits: a nine-level "billion laughs" alias
bomb is a few hundred bytes that expand to 9**9 values when walked, and a 50 MB file takes
a minute to parse. Real specs are a few KB, a few levels deep, with at most a few hundred values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError, dotted

MAX_FILE_BYTES = 1_000_000
MAX_DEPTH = 50
MAX_VALUES = 100_000


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


class _TooBig(yaml.YAMLError):
    """A bound of this module was passed; carries the line and the message."""

    def __init__(self, mark: yaml.Mark, message: str):
        super().__init__(message)
        self.problem_mark, self.problem = mark, message


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts values as it composes (an alias counts as all it repeats) and
    refuses deep nesting and recursive aliases, so nothing later walks an unbounded tree.

    It also tracks the dotted path being composed, so a syntax error can name its field.
    """

    def __init__(self, stream: str):
        super().__init__(stream)
        self.path: list = []
        self.error_path: tuple | None = None
        self.depth = 0
        self.values = 0
        self.sizes: dict[int, int] = {}  # id(node) -> values it expands to

    def compose_node(self, parent, index):
        part = index.value if isinstance(index, yaml.ScalarNode) else index if isinstance(index, int) else None
        if part is not None:
            self.path.append(part)
        self.depth += 1
        try:
            mark = self.peek_event().start_mark
            if self.depth > MAX_DEPTH:
                raise _TooBig(mark, f"values nest more than {MAX_DEPTH} levels deep here; a job spec nests a few "
                                    "levels. Check for brackets that are opened and never closed")
            alias = self.check_event(yaml.AliasEvent)
            node = super().compose_node(parent, index)
            if alias:
                size = self.sizes.get(id(node))
                if size is None:
                    raise _TooBig(mark, "this alias refers to a value that contains it (a recursive structure), "
                                        "which no job spec can be. Write the value out instead")
            else:
                kids = node.value if isinstance(node, yaml.SequenceNode) else \
                    [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else []
                size = 1 + sum(self.sizes[id(k)] for k in kids)
                self.sizes[id(node)] = size
            self.values += size if alias else 1
            if self.values > MAX_VALUES:
                raise _TooBig(mark, f"the file expands to more than {MAX_VALUES:,} values (the limit; an alias "
                                    "'*name' counts as every value its anchor '&name' repeats), far more than any "
                                    "job spec has: dsctl refuses it rather than use unbounded memory. Write the "
                                    "values out, or use fewer aliases")
            return node
        except yaml.YAMLError:
            if self.error_path is None:
                self.error_path = tuple(self.path)
            raise
        finally:
            self.depth -= 1
            if part is not None:
                self.path.pop()


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
    """Parse YAML text within the bounds above; a syntax error or a passed bound is a SpecError
    naming the line, and the field being read when the composer knows it."""
    try:
        loader = _BoundedLoader(text)  # refuses control characters (a stray ESC or NUL) already
    except yaml.reader.ReaderError as exc:
        before = text[:exc.position]
        where = f"{source}:{before.count(chr(10)) + 1}"
        raise SpecError(f"this is not valid YAML (column {exc.position - before.rfind(chr(10))}): character "
                        f"#x{exc.character:04x} is a special character that YAML does not allow (a control "
                        "character such as ESC or NUL, often pasted from a terminal); delete it.", where=where) from None
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise _syntax_error(exc, source, loader.error_path) from None
    finally:
        loader.dispose()
    lines: dict[tuple, int] = {}
    if node is not None:
        _index_lines(node, (), lines, source)
    return YamlSource(path=source, data=data, lines=lines)


def _syntax_error(exc: yaml.YAMLError, source: str, path: tuple | None) -> SpecError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{source}:{mark.line + 1}" if mark else source
    field_ = (dotted(path[:8]) + ("..." if len(path) > 8 else "")) if path else None
    if isinstance(exc, _TooBig):
        return SpecError(exc.problem + ".", where=where, field=field_)
    problem = getattr(exc, "problem", None) or str(exc)
    problem = problem.replace("found character '\\t' that cannot start any token", "found a tab; YAML indents with spaces only")
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None and mark is not None and context_mark.line != mark.line:
        # e.g. an unclosed bracket: say where the construct began, which is often the line to fix.
        started = f"{context} that starts on line {context_mark.line + 1}"
        problem = f"{started} {problem}" if problem.startswith("but ") else f"{problem} ({started})"
    column = f" (column {mark.column + 1})" if mark else ""
    return SpecError(
        f"this is not valid YAML{column}: {problem}. Check indentation (spaces, not tabs), "
        "that every 'key: value' has a space after the colon, and that brackets and quotes are closed.",
        where=where, field=field_,
    )


def read_yaml(path: str | os.PathLike[str]) -> YamlSource:
    """Read (at most MAX_FILE_BYTES) and parse a YAML file; a missing, unreadable or too large file is a SpecError."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)  # bounded: also /dev/zero or a huge file
    except FileNotFoundError:
        raise SpecError(f"file not found: {p}. Pass the path of a YAML file.") from None
    except IsADirectoryError:
        raise SpecError(f"{p} is a directory, not a YAML file.") from None
    except OSError as exc:
        raise SpecError(f"cannot read {p}: {exc}.") from None
    if len(raw) > MAX_FILE_BYTES:
        line = raw[:MAX_FILE_BYTES].count(b"\n") + 1
        raise SpecError(
            f"the file is larger than {MAX_FILE_BYTES:,} bytes (1 MB, the limit for a spec or price catalog; "
            f"it passes the limit on line {line}). Job specs are a few KB: check that this is the file you meant.",
            where=f"{path}:{line}",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = raw[:exc.start]
        line, column = before.count(b"\n") + 1, exc.start - before.rfind(b"\n")
        raise SpecError(f"byte {raw[exc.start]:#04x} (column {column}) is not UTF-8 text; save the file as UTF-8.",
                        where=f"{path}:{line}") from None
    return parse_yaml(text, str(path))
