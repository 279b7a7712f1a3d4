"""`.dsctlignore`: the files of the spec's folder that the trainer VMs do not get.

On Google Cloud every trainer VM gets a copy of the spec's folder (storage.code_archive), and
users keep checkpoints, datasets and notebooks beside their code. A `.dsctlignore` in that folder
lists what to leave out, in the syntax users know from .gitignore (and .gcloudignore,
.dockerignore):

  - blank lines and lines starting with `#` are skipped; `\\#` and `\\!` start a pattern with
    that character; trailing spaces are dropped unless escaped (`\\ `);
  - `*` matches anything but `/`, `?` one character but `/`, `[abc]`, `[a-z]`, `[!abc]` one
    of a set; a backslash takes the next character as it is;
  - a pattern with a `/` at its start or in its middle is relative to the spec's folder
    (`/build`, `data/raw`); one without matches a name at any depth (`*.ckpt`, `__snapshots__`);
  - a trailing `/` matches folders only (`logs/`);
  - `**/` at the start matches in every folder, `/**/` zero or more folders, `/**` at the end
    everything inside;
  - `!pattern` takes back an earlier exclusion; the last matching line decides. As in git, a file
    cannot be taken back when a folder above it is left out (the folder is not read at all).

Only the `.dsctlignore` at the top of the spec's folder is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FILE = ".dsctlignore"


@dataclass(frozen=True)
class Rule:
    """One pattern line: the relative paths it matches, whether it takes them back (`!`), folders only (`/`)."""

    regex: re.Pattern
    negate: bool
    dirs_only: bool


def _char_class(pattern: str, i: int) -> tuple[str, int] | None:
    """The regex of a `[...]` set starting at pattern[i], and the index after it; None if it is not closed."""
    j = i + 1
    if j < len(pattern) and pattern[j] in "!^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 1
    if j >= len(pattern):
        return None
    body = pattern[i + 1:j]
    negate = body[:1] in ("!", "^")
    body = body[1:] if negate else body
    chars = "".join("-" if ch == "-" else re.escape(ch) for ch in body)
    return ("[^/" if negate else "[") + chars + "]", j + 1


def _translate(pattern: str) -> str:
    """A gitignore glob (without its leading `/` or trailing `/`) as a regex over a relative POSIX path."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**", i):
            at_start = i == 0
            at_end = i + 2 == n
            before_slash = at_start or pattern[i - 1] == "/"
            after_slash = at_end or pattern[i + 2] == "/"
            if before_slash and after_slash:
                if at_end:  # `dir/**`: everything inside (the `/` before it is already in `out`)
                    out.append(".*")
                    i += 2
                else:  # `**/x` or `a/**/x`: zero or more folders
                    out.append("(?:.*/)?")
                    i += 3
                continue
            out.append("[^/]*")  # any other `**` is a plain `*`
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            cls = _char_class(pattern, i)
            if cls is None:
                out.append(re.escape(c))
                i += 1
            else:
                out.append(cls[0])
                i = cls[1]
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _strip_trailing_spaces(line: str) -> str:
    while line.endswith(" ") and not line.endswith("\\ "):
        line = line[:-1]
    return line


def parse(text: str) -> list[Rule]:
    """The rules of a .dsctlignore's text, in order."""
    rules = []
    for raw in text.splitlines():
        line = _strip_trailing_spaces(raw.rstrip("\r"))
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        body = line[1:] if negate else line  # `\#` and `\!` are escapes: _translate takes them as they are
        dirs_only = body.endswith("/")
        body = body.rstrip("/")
        if not body:
            continue
        anchored = "/" in body
        body = body.lstrip("/")
        regex = _translate(body)
        if not anchored:
            regex = "(?:.*/)?" + regex
        rules.append(Rule(re.compile(regex, re.DOTALL), negate, dirs_only))
    return rules


@dataclass(frozen=True)
class Ignore:
    """What a spec's folder leaves out of the trainers' copy."""

    rules: tuple[Rule, ...] = ()

    @classmethod
    def of_folder(cls, base_dir: Path) -> Ignore:
        path = Path(base_dir) / FILE
        if not path.is_file():
            return cls()
        return cls(tuple(parse(path.read_text(errors="replace"))))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """Whether a path (relative to the spec's folder, with `/`) is left out; the last matching rule decides."""
        out = False
        for rule in self.rules:
            if rule.dirs_only and not is_dir:
                continue
            if rule.regex.fullmatch(rel):
                out = not rule.negate
        return out
