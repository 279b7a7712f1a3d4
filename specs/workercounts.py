"""Worker-count specs for `dsctl sweep --workers`: the counts a sweep visits.

Grammar (one or more items separated by commas; the result is sorted and de-duplicated,
because a sweep's table and plots read left to right by worker count):

    N         one count                      8           -> [8]
    A..B      double from A, always end at B 8..640      -> [8, 16, 32, 64, 128, 256, 512, 640]
    A..B:S    step by S, always end at B     1..6:1      -> [1, 2, 3, 4, 5, 6]
                                             1..6:4      -> [1, 5, 6]
    X,Y,...   a list (items may be ranges)   64,8,16,16  -> [8, 16, 64]

B is always included, in both range forms, so the largest count asked for is always
measured. Counts are whole numbers >= 1; A must not exceed B (A..A is just A).

A..B doubling is the paper's Figure 9 sweep as users type it (8..640), but read as a range it
can surprise (1..4 never measures 3): doubling_note() says so, and a sweep prints it with the
counts before it measures anything.
"""

from __future__ import annotations

import re

from .errors import SpecError

EVERY_COUNT_MAX = 32  # doubling_note suggests A..B:1 only for ranges this short (not 8..640:1, 633 points)
MAX_POINTS = 1000  # a sweep point is a deployment; more than this is a typo, not a plan
_NUMBER = re.compile(r"\d+")
_FORMS = (
    "Valid forms: A..B doubles from A and always includes B (8..640 gives 8, 16, 32, 64, 128, "
    "256, 512, 640); A..B:S steps by S and always includes B (1..6:1 gives 1, 2, 3, 4, 5, 6); "
    "a comma list gives those counts, sorted (8,16,64). Every count is a whole number of at "
    "least 1 and a range must not run backwards."
)


def parse_worker_counts(text: str, *, option: str = "--workers", zero_ok: bool = False) -> list[int]:
    """Parse a worker-count spec into sorted unique counts; SpecError (exit 2) if it is not one. With `zero_ok`
    (`--local-workers`: 0 is remote-only placement) counts may be 0, and A..B doubling from 0 goes 0, 1, 2, 4, ..."""
    given = "" if text is None else str(text)
    forms = _FORMS.replace("at least 1", "at least 0") if zero_ok else _FORMS

    def fail(problem: str) -> SpecError:
        return SpecError(f"{given.strip()!r} is not a worker-count spec for {option}: {problem}. {forms}", field=option)

    if not given.strip():
        raise fail("it is empty")
    counts: set[int] = set()
    for item in given.split(","):
        item = item.strip()
        if not item:
            raise fail("it has an empty item between commas")
        counts.update(_item(item, fail, zero_ok))
        if len(counts) > MAX_POINTS:
            raise fail(f"it gives more than {MAX_POINTS} worker counts")
    return sorted(counts)


def doubling_note(text: str) -> str | None:
    """For a valid spec: which A..B items skip counts by doubling, and how to get every count; None if none does.

    1..4 -> "1..4 doubles from 1; write 1..4:1 for every count"."""
    counts, skipping = parse_worker_counts(text, zero_ok=True), []
    for item in text.split(","):
        first, dots, last = item.strip().partition("..")
        if dots and ":" not in last:
            start, end = int(first), int(last)
            if sum(start <= c <= end for c in counts) < end - start + 1:
                skipping.append(f"{start}..{end}")
    if not skipping:
        return None
    every = [r for r in skipping if _span(r) <= EVERY_COUNT_MAX]
    how = f"write {_and([r + ':1' for r in every])} for every count" if every else "write A..B:S to step by S"
    if len(skipping) == 1:
        return f"{skipping[0]} doubles from {skipping[0].split('..')[0]}; {how}"
    return f"{_and(skipping)} double from their first counts; {how}"


def _span(rng: str) -> int:
    start, _, end = rng.partition("..")
    return int(end) - int(start) + 1


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _item(item: str, fail, zero_ok: bool = False) -> list[int]:
    if ".." not in item:
        if ":" in item:
            raise fail(f"{item} has a step but no range (a step needs A..B:S)")
        return [_count(item, fail, zero_ok)]
    start_text, _, rest = item.partition("..")
    end_text, colon, step_text = rest.partition(":")
    start, end = _count(start_text, fail, zero_ok), _count(end_text, fail, zero_ok)
    if start > end:
        raise fail(f"the range {item} runs backwards (write {end}..{start})")
    if colon:
        step = _whole(step_text, fail, "step")
        if step == 0:
            raise fail(f"the step in {item} is 0")
        if (end - start) // step + 1 > MAX_POINTS:
            raise fail(f"{item} gives more than {MAX_POINTS} worker counts")
        out = list(range(start, end, step))
    else:
        out, n = [], start
        while n < end:
            out.append(n)
            n = n * 2 if n else 1
    return out + [end]


def _count(text: str, fail, zero_ok: bool = False) -> int:
    n = _whole(text, fail, "worker count")
    if n == 0 and not zero_ok:
        raise fail("a worker count of 0 has no workers to measure")
    return n


def _whole(text: str, fail, what: str) -> int:
    text = text.strip()
    if text.startswith("-") and _NUMBER.fullmatch(text[1:].strip()):
        raise fail(f"{what} {text} is negative")
    if not _NUMBER.fullmatch(text):
        raise fail(f"{what} {text!r} is not a whole number" if text else f"a {what} is missing")
    return int(text)
