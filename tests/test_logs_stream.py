"""`dsctl logs` streams a program's output in bounded memory and shows a last line that no newline ends
(orchestrator/tail.py LineTail, cli/main.py logs). The 286 MB case, with its peak memory printed:
benchmarks/bench_logs.py (run here on a small log)."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from dsctl.orchestrator.tail import LineTail, OutputTail

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_logs.py"


def small(path: Path) -> LineTail:
    tail = LineTail(path)
    tail.CHUNK, tail.MAX_LINE = 7, 10  # lines cross chunks, and one is longer than a line may be
    return tail


def test_lines_across_chunks_come_whole_and_a_last_line_waits_until_the_file_is_complete(tmp_path):
    log = tmp_path / "trainer-0.log"
    log.write_bytes(b"first line\nsecond\nthird, not ended")
    tail = small(log)
    got = list(tail.iter_lines())
    assert got[:2] == [b"first line", b"second"] and b"".join(got[2:]) + tail._partial == b"third, not ended"
    assert list(tail.iter_lines()) == []  # nothing new: the half line still waits
    with open(log, "ab") as f:
        f.write(b"!\nfourth")
    rest = list(tail.iter_lines(final=True))
    assert b"".join(got[2:] + rest[:-1]) == b"third, not ended!" and rest[-1] == b"fourth"
    assert list(tail.iter_lines(final=True)) == [], "each line once"


def test_a_line_longer_than_a_line_may_be_comes_in_pieces(tmp_path):
    log = tmp_path / "trainer-0.log"
    log.write_bytes(b"x" * 35 + b"\nend")
    pieces = list(small(log).iter_lines(final=True))
    assert all(len(p) <= 10 for p in pieces) and b"".join(pieces[:-1]) == b"x" * 35 and pieces[-1] == b"end"


def test_a_large_log_is_read_in_bounded_memory(tmp_path):
    log = tmp_path / "trainer-0.log"
    line = b"step 000000 loss 0.1 a program's line of output, about a hundred bytes long ........................\n"
    with open(log, "wb") as f:
        for _ in range(200_000):  # 20 MB
            f.write(line)
        f.write(b"last, no newline")
    tracemalloc.start()
    try:
        count, last = 0, None
        for text in OutputTail(log).read(final=True):
            count, last = count + 1, text
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 200_001 and last == "last, no newline"
    assert peak < 6 * LineTail.CHUNK, f"peak {peak / 1e6:.1f} MB traced for a {log.stat().st_size / 1e6:.0f} MB log"


@pytest.mark.integration  # dsctl as a subprocess
def test_dsctl_logs_shows_a_last_line_with_no_newline_and_its_peak_memory_is_printed(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH), "--mb", "5"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "last line shown: yes" in proc.stdout and "peak resident memory" in proc.stdout, proc.stdout
