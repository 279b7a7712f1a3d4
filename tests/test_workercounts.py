"""`--workers` specs: the three forms, the always-included end, one-paragraph errors, and what doubling skips."""

from __future__ import annotations

import pytest

from dsctl.specs.errors import SpecError
from dsctl.specs.workercounts import MAX_POINTS, doubling_note, parse_worker_counts


@pytest.mark.parametrize("text, counts", [
    ("8..640", [8, 16, 32, 64, 128, 256, 512, 640]),     # the paper's Figure 9 sweep
    ("1..6", [1, 2, 4, 6]),
    ("8..512", [8, 16, 32, 64, 128, 256, 512]),          # end on a power: not repeated
    ("5..5", [5]),
    ("1..6:1", [1, 2, 3, 4, 5, 6]),
    ("1..6:2", [1, 3, 5, 6]),                            # the end is always included
    ("1..6:4", [1, 5, 6]),
    ("2..6:2", [2, 4, 6]),
    ("1..3:10", [1, 3]),
    ("8,16,64", [8, 16, 64]),
    ("64, 8 ,16,16", [8, 16, 64]),                       # sorted, unique, spaces allowed
    ("8", [8]),
    (" 8..32 ", [8, 16, 32]),
    ("1..4,6..12:3", [1, 2, 4, 6, 9, 12]),               # items of a list may be ranges
    ("1..3:1,2..4:1", [1, 2, 3, 4]),
])
def test_valid_specs(text, counts):
    assert parse_worker_counts(text) == counts


@pytest.mark.parametrize("text, says", [
    ("", "empty"),
    ("   ", "empty"),
    (None, "empty"),
    ("640..8", "runs backwards (write 8..640)"),
    ("0", "0"),
    ("0..8", "0"),
    ("1..6:0", "step in 1..6:0 is 0"),
    ("-8", "negative"),
    ("8..-16", "negative"),
    ("1..6:-1", "negative"),
    ("eight", "'eight' is not a whole number"),
    ("8..x", "'x' is not a whole number"),
    ("1.5", "not a whole number"),
    ("8...16", "not a whole number"),
    ("8..640:", "step is missing"),
    ("..8", "worker count is missing"),
    ("8,,16", "empty item"),
    ("8,16,", "empty item"),
    ("8:2", "step but no range"),
    (f"1..{MAX_POINTS + 5}:1", f"more than {MAX_POINTS}"),
])
def test_invalid_specs_name_option_quote_input_and_show_forms(text, says):
    with pytest.raises(SpecError) as exc:
        parse_worker_counts(text)
    msg = str(exc.value)
    assert says in msg
    assert msg.startswith("--workers: ")
    assert repr(("" if text is None else text).strip()) in msg          # quotes what was given
    for form in ("A..B", "8..640", "A..B:S", "1..6:1", "8,16,64"):      # shows the valid forms
        assert form in msg
    assert "\n" not in msg                                              # one paragraph


def test_option_name_is_configurable():
    with pytest.raises(SpecError, match=r"^--counts: "):
        parse_worker_counts("x", option="--counts")


def test_huge_doubling_range_stays_small():
    assert len(parse_worker_counts("1..1000000")) == 21


@pytest.mark.parametrize("text, note", [
    ("1..4", "1..4 doubles from 1; write 1..4:1 for every count"),
    ("8..640", "8..640 doubles from 8; write A..B:S to step by S"),
    ("1..4,8..640", "1..4 and 8..640 double from their first counts; write 1..4:1 for every count"),
    (" 1 .. 4 ,10", "1..4 doubles from 1; write 1..4:1 for every count"),
    ("1..4,8..32", "1..4 and 8..32 double from their first counts; write 1..4:1 and 8..32:1 for every count"),
    ("1..4:1", None),
    ("1..3", None),                                      # 1, 2, 3: doubling skips nothing
    ("1..4,3", None),                                    # the list gives the count doubling skips
    ("8,16,64", None),
    ("5..5", None),
])
def test_doubling_note_says_which_ranges_skip_counts_and_how_to_get_every_one(text, note):
    assert doubling_note(text) == note
