"""The end of a process's log, as a user should read it in an error: without TensorFlow's start-up noise."""

from __future__ import annotations

from pathlib import Path

NOISE = ("oneDNN", "cpu_feature_guard", "absl::InitializeLog", "To enable the following instructions")


def is_noise(line: str) -> bool:
    """TensorFlow's start-up chatter, printed by every process that imports it whatever its log level."""
    return any(n in line for n in NOISE)


def useful_lines(text: str) -> list[str]:
    """The lines of `text` that say something (not TensorFlow's start-up chatter, not blank)."""
    return [line for line in text.splitlines() if line.strip() and not is_noise(line)]


def tail(path: str | Path | None, lines: int = 12, max_bytes: int = 256 * 1024) -> str:
    """The last `lines` useful lines of the file at `path` (read from its last `max_bytes`); "" if there is none."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(size - max_bytes, 0))
            text = f.read().decode(errors="replace")
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return ""
    return "\n".join(useful_lines(text)[-lines:])


def last(text: str, lines: int = 6, width: int = 240) -> list[str]:
    """The last non-blank lines of `text`, each cut to `width`, as they were indented (a traceback reads as one only
    line by line): quoted after an error's paragraph (dsctl.errors.quoted)."""
    return [line.rstrip()[:width] for line in text.splitlines() if line.strip()][-lines:]
