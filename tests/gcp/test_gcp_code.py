"""What the trainer VMs get of the spec's folder, and how a command trainer is started and measured there.

Fast tests, no cloud and no TensorFlow: `.dsctlignore` (provisioners/gcp/ignore.py) as code_archive applies
it, the size limit's message, and, with real processes on this machine, the launch command's environment
that only a VM with libtpu gets and the status command's count of a command runner's process tree.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from dsctl.provisioners.gcp import remote
from dsctl.provisioners.gcp.ignore import Ignore, parse
from dsctl.provisioners.gcp.storage import CODE_LIMIT_BYTES, code_archive
from dsctl.specs import SpecError
from helpers import wait_for


def _tree(root: Path, files: dict[str, int | str]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, int):  # a sparse file of that size: no disk, no time
            with open(path, "wb") as f:
                f.truncate(content)
        else:
            path.write_text(content)


def _names(archive: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return sorted(m.name for m in tar.getmembers())


# -- .dsctlignore ---------------------------------------------------------------------------------------------------
def test_dsctlignore_leaves_out_what_its_patterns_name_as_gitignore_would(tmp_path):
    _tree(tmp_path, {
        "train.py": "", "job.yaml": "", "keep.ckpt": "", "model.ckpt": "", "runs/a/model.ckpt": "",
        "data/x.csv": "", "src/data": "a file named data", "build/out.o": "", "src/build/gen.py": "",
        "docs/a.png": "", "docs/img/b.png": "", "docs/img/b.md": "", "logs/1.txt": "", "tmp/t": "", "a/b/tmp/t": "",
        "cache/keep.txt": "", "cache/x": "", "#notes.txt": "", "a.txt": "", "b.txt": "", "c.txt": "",
        "lib/util.py": "", "out/keep.txt": "", "out/o": "",
    })
    # The last pattern ends in three spaces (written \x20), which gitignore trims.
    (tmp_path / ".dsctlignore").write_text(textwrap.dedent("""\
        # checkpoints, at any depth, but one
        *.ckpt
        !keep.ckpt

        data/
        /build
        docs/**/*.png
        **/tmp
        logs/**
        cache/*
        !cache/keep.txt
        \\#notes.txt
        [ab].txt
        out/
        !out/keep.txt
        lib/util.py\x20\x20\x20
        """))
    assert _names(code_archive(tmp_path)) == sorted([
        "train.py", "job.yaml",
        "keep.ckpt",  # taken back by `!keep.ckpt`
        "src/data",  # `data/` names folders only
        "src/build/gen.py",  # `/build` is rooted at the spec's folder
        "docs/img/b.md",  # `docs/**/*.png`: png files only
        "cache/keep.txt",  # `cache/*` leaves the folder read, so `!cache/keep.txt` takes it back
        "c.txt",  # `[ab].txt` is a or b
    ])  # and not out/keep.txt: `out/` leaves the folder unread, which no `!` undoes (as in git)


def test_the_last_matching_line_decides_and_folder_patterns_skip_files():
    ignore = Ignore(tuple(parse("*.log\n!debug.log\nsub/debug.log\nmodels/\n?x\n[!a-c]y\n")))
    assert ignore.ignored("a.log", False) and ignore.ignored("d/e/a.log", False)
    assert not ignore.ignored("debug.log", False) and ignore.ignored("sub/debug.log", False)
    assert ignore.ignored("models", True) and not ignore.ignored("models", False)
    assert ignore.ignored("ax", False) and not ignore.ignored("abx", False) and not ignore.ignored("a/x", False)
    assert ignore.ignored("dy", False) and not ignore.ignored("by", False)
    assert not Ignore().ignored("anything", False)


def test_dsctls_own_exclusions_stay_whatever_the_ignore_file_says(tmp_path):
    _tree(tmp_path, {"train.py": "", ".env": "SECRET=1", ".git/config": "", "pkg/m.py": "", "pkg/__pycache__/m.pyc": "",
                     "env/pyvenv.cfg": "", "env/lib/x.py": "", "home/runs/r/state.json": ""})
    (tmp_path / "linked").symlink_to(tmp_path / "pkg")
    (tmp_path / ".dsctlignore").write_text("!.env\n!.git/\n")
    assert _names(code_archive(tmp_path, exclude=[tmp_path / "home"])) == ["pkg/m.py", "train.py"]


# -- the size limit -------------------------------------------------------------------------------------------------
def test_a_folder_over_the_limit_is_one_paragraph_naming_its_size_its_largest_entries_and_dsctlignore(tmp_path):
    mb = 2**20
    _tree(tmp_path, {"train.py": "print()", "checkpoints/a.ckpt": 40 * mb, "checkpoints/b.ckpt": 30 * mb,
                     "data/part-0": 25 * mb, "data/part-1": 5 * mb, "notes.bin": 12 * mb, "small.txt": "x"})
    with pytest.raises(SpecError) as info:
        code_archive(tmp_path)
    text = str(info.value)
    assert "\n" not in text and info.value.field is None
    assert f"{tmp_path.resolve()} holds 112.0 MB in 7 files" in text
    assert f"more than the {CODE_LIMIT_BYTES // mb} MB limit" in text
    # Largest first, folders summed: what to put in .dsctlignore.
    assert "Largest: checkpoints/ (70.0 MB), data/ (30.0 MB), notes.bin (12.0 MB)." in text
    assert ".dsctlignore" in text and "`*.ckpt`" in text

    # Leaving out what it names makes the folder fit.
    (tmp_path / ".dsctlignore").write_text("checkpoints/\n*.bin\n")
    assert _names(code_archive(tmp_path)) == ["data/part-0", "data/part-1", "small.txt", "train.py"]


# -- starting a trainer on a VM -------------------------------------------------------------------------------------
def _fake_python(tmp_path: Path, body: str) -> Path:
    program = tmp_path / "python"
    program.write_text("#!/bin/sh\n" + body)
    program.chmod(0o755)
    return program


def test_the_pjrt_environment_reaches_a_trainer_only_where_the_tpu_library_is(tmp_path):
    """software.PJRT_ENV is given where its file exists: on a TensorFlow TPU runtime; elsewhere TensorFlow would refuse
    to import with it (the path does not exist)."""
    from dsctl.provisioners.gcp import software

    # Called as `python -m LABEL`: writes its environment to env-LABEL.txt, whole.
    program = _fake_python(tmp_path, 'd=$(dirname "$0"); env > "$d/env-$2.tmp" && mv "$d/env-$2.tmp" "$d/env-$2.txt"\n')
    library = tmp_path / "lib tpu.so"
    pjrt = {str(library): {**software.PJRT_ENV, "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": str(library)}}

    def launched(label: str) -> dict[str, str]:
        layout = remote.Layout(str(tmp_path / label))
        out = subprocess.run(["bash", "-c", remote.launch(layout, str(program), label, [], file_env=pjrt)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        path = tmp_path / f"env-{label}.txt"
        wait_for(path.exists, timeout=10, what="the program's environment")
        return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)

    assert "NEXT_PLUGGABLE_DEVICE_USE_C_API" not in launched("before")
    library.write_bytes(b"")
    env = launched("after")
    assert env["NEXT_PLUGGABLE_DEVICE_USE_C_API"] == "true" and env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == str(library)


def test_a_command_runners_status_counts_the_cpu_and_memory_of_everything_below_it(tmp_path):
    """The trainer's program runs as a child of the runner (runtime/command.py), and may start its own: the status
    command the watcher runs every second counts them for a dir launched with tree=True, and only then."""
    # An idle "runner" whose child and grandchild burn CPU.
    program = _fake_python(tmp_path, "sh -c 'sh -c \"while :; do :; done\" & while :; do :; done' &\nsleep 60\n")
    layouts = {tree: remote.Layout(str(tmp_path / f"node-{tree}")) for tree in (False, True)}
    starts = {}
    try:
        for tree, layout in layouts.items():
            out = subprocess.run(["bash", "-c", remote.launch(layout, str(program), "m", [], tree=tree)],
                                 capture_output=True, text=True, timeout=30)
            starts[tree] = remote.parse_launch(out.stdout)
        below = psutil.Process(starts[True][0])

        def burnt() -> float:  # CPU-seconds the busy descendants have used so far, as psutil reads them
            return sum(sum(p.cpu_times()[:2]) for p in below.children(recursive=True))

        wait_for(lambda: burnt() > 0.6, timeout=60, what="the descendants to use some CPU")  # however busy the machine
        floor = burnt()
        res = subprocess.run(["bash", "-c", remote.status([lay.dir for lay in layouts.values()])], capture_output=True,
                             text=True, timeout=30)
        statuses = remote.parse_status(res.stdout, time.monotonic())
        plain, tree = statuses[layouts[False].dir], statuses[layouts[True].dir]
        assert plain.running(starts[False][1]) and tree.running(starts[True][1])
        assert plain.cpu_seconds < 0.2  # the idle process alone
        assert tree.cpu_seconds >= floor - 0.05  # its busy descendants, read a moment before (CPU time only grows)
        own_rss = psutil.Process(starts[True][0]).memory_info().rss
        below = sum(p.memory_info().rss for p in psutil.Process(starts[True][0]).children(recursive=True))
        assert abs(tree.rss_bytes - (own_rss + below)) < 0.2 * (own_rss + below)
        assert plain.rss_bytes == pytest.approx(psutil.Process(starts[False][0]).memory_info().rss, rel=0.2)
    finally:
        for pid, _ in starts.values():
            try:
                root = psutil.Process(pid)
                for p in [root, *root.children(recursive=True)]:
                    p.kill()
            except psutil.Error:
                pass


def test_a_status_line_with_a_tree_adds_it_to_the_process_own_figures():
    line = "S\t/d\t42\t\tS 10 5 777\t100\t\t\t100\t4096\t1\t250 50\n"
    st = remote.parse_status(line, 1.0)["/d"]
    assert st.cpu_ticks == 10 + 5 + 250 and st.cpu_seconds == pytest.approx(2.65)
    assert st.rss_bytes == (100 + 50) * 4096
    plain = remote.parse_status(line.replace("\t250 50", "\t"), 1.0)["/d"]
    assert plain.cpu_ticks == 15 and plain.rss_bytes == 100 * 4096
