"""DSCTL_HOME: where dsctl keeps its records, runs and caches, and keeps them the user's alone.

The home is made 0700 when dsctl makes it; a home the user made is never changed (a group's shared folder stays
shared) and one that others can read is warned about; what dsctl wrote below it is kept 0700/0600 (the process
umask is 0o077 from the CLI's first moment). A home that cannot hold records (a file, read-only, not the user's, a
path too long) is one HomeError paragraph saying why and what to do, from the error that using it gave.

What the orchestrator did on its own and the user must hear of (an open home, a damaged runs.db moved aside) goes
to `notices`, a logger whose WARNING records the CLI shows (cli/errors.py); the orchestrator prints nothing.
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
import stat
from pathlib import Path

from dsctl.errors import DsctlError

notices = logging.getLogger("dsctl.notice")


class StoreError(DsctlError):
    """The records cannot be used now (exit 1); the message names the file and what to do."""


class HomeError(StoreError):
    """DSCTL_HOME cannot hold dsctl's records (exit 1); the message names it, why, and what to do."""


PRIVATE_UMASK = 0o077  # records, specs, state, logs and metrics: the user's alone (0600 files, 0700 dirs)


def dsctl_home() -> Path:
    """DSCTL_HOME (default ~/.dsctl): where runs, records and caches are kept."""
    return Path(os.environ.get("DSCTL_HOME") or Path.home() / ".dsctl")


def private_umask() -> None:
    """From here on, everything this process writes, and every process it starts, is the user's alone (umask
    0o077). The CLI asks for it first thing (cli/errors.py run_app); a RunStore does when it opens the home."""
    os.umask(PRIVATE_UMASK)


def tighten(path: Path, mode: int) -> bool:
    """chmod `path` to `mode` if it is ours, not a symlink and looser; True if it was changed. Only the permission
    bits change: a folder's setgid bit (a group's shared folder) is kept."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    perms = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or perms & 0o777 & ~mode == 0:
        return False
    if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
        return False  # a shared directory such as /tmp: not ours to close
    keep = stat.S_ISGID if stat.S_ISDIR(st.st_mode) else 0
    os.chmod(path, perms & (mode | keep))
    return True


def private_home(home: Path) -> None:
    """Make DSCTL_HOME hold dsctl's records, the user's alone, and keep them so for everything this process writes.

    Sets the process umask to 0o077 (inherited by every process dsctl starts) and creates the home 0700 if it is
    missing. A home dsctl did not create is never changed: its mode is the user's choice (a group's shared folder,
    mode 2775, stays so), and one that other users can read is warned about, saying how to close it
    (`notices`). What dsctl itself wrote below it and an older dsctl left open (runs/, every run in it: 0700
    folders, 0600 files; the database files on every open) is tightened. A home that cannot hold records (a file,
    under a file, read-only, not the user's to write, too long a path) is one HomeError paragraph.
    """
    private_umask()
    created = _make_home(home)
    runs = home / "runs"
    try:
        if runs.is_dir() and tighten(runs, 0o700):
            for root, dirs, files in os.walk(runs):
                for name in dirs:
                    tighten(Path(root) / name, 0o700)
                for name in files:
                    tighten(Path(root) / name, 0o600)
        else:
            runs.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        pass  # a full disk: the records matter more; the next open tries again
    if not created:
        _warn_if_open(home)


def _make_home(home: Path) -> bool:
    """The home, as a folder this user can write in; True if it was created now. HomeError otherwise."""
    try:
        st = os.stat(home)
    except FileNotFoundError:
        try:
            home.mkdir(mode=0o700, parents=True)
            return True
        except FileExistsError:
            return _make_home(home)  # made by another dsctl command meanwhile (or a file is there now)
        except OSError as exc:
            raise HomeError(home_problem(home, exc)) from None
    except OSError as exc:
        raise HomeError(home_problem(home, exc)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise HomeError(home_problem(home, FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(home))))
    if not os.access(home, os.W_OK | os.X_OK):
        code = errno.EROFS if read_only(home) else errno.EACCES
        raise HomeError(home_problem(home, PermissionError(code, os.strerror(code), str(home))))
    return False


def read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def home_problem(home: Path, exc: OSError) -> str:
    """One paragraph: why `home` (DSCTL_HOME) cannot hold dsctl's records, from the error using it gave, and what
    to do."""
    named = f"DSCTL_HOME ({home})"
    fix = "set DSCTL_HOME to a folder of yours that you can write in (the default is ~/.dsctl)"
    code = exc.errno
    if code == errno.ENOTDIR or code == errno.EEXIST:
        blocker = next((p for p in (home, *home.parents) if p.exists() and not p.is_dir()), None)
        if blocker == home:
            return (f"{named} is a file, not a folder: dsctl keeps its runs and records in a folder there. Move the "
                    f"file away, or {fix}, and run the command again.")
        if blocker is not None:
            return (f"{named} cannot be a folder: {blocker} is a file, not a folder. Move that file away, or {fix}, "
                    "and run the command again.")
    if code == errno.EROFS or (code in (errno.EACCES, errno.EPERM) and read_only(existing(home))):
        return (f"{named} is on a read-only file system, and dsctl writes its records there (runs.db, a folder per "
                f"run). Remount it read-write, or {fix}; to read these records from elsewhere, copy the folder and "
                "point DSCTL_HOME at the copy.")
    if code in (errno.EACCES, errno.EPERM):
        return (f"{named} is not yours to write in (permission denied at {exc.filename or home}), and dsctl writes "
                f"its records there. Ask its owner for write access, or {fix}, and run the command again.")
    if code == errno.ENAMETOOLONG:
        return (f"DSCTL_HOME ({str(home)[:80]}...) is too long a path for this file system (with the names dsctl "
                f"adds below it); {fix}, and run the command again.")
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"{named} cannot be written: the disk is full; free some space there and run the command again."
    return f"{named} cannot be used ({exc.strerror or exc}): {fix}, and run the command again."


def remedy(exc: OSError, where: str | Path) -> str:
    """What to do about a write to `where` that `exc` refused, by its real cause: a full disk, a read-only file
    system, a folder that is not the user's to write in."""
    code = exc.errno
    if code in (errno.EROFS,) or (code in (errno.EACCES, errno.EPERM) and read_only(existing(Path(where)))):
        return f"{where} is on a read-only file system: remount it read-write (or set DSCTL_HOME to a folder that is not)"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"free some space in {where}"
    return f"make {where} writable by you"


def existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists."""
    return next((p for p in (path, *path.parents) if p.exists()), Path("/"))


def home_error(exc: OSError) -> HomeError | None:
    """An error of the file system about a path in DSCTL_HOME (a read-only mount, a file where a folder goes, a name
    too long) as the one paragraph the CLI prints; None for anything else (a bug, shown as one)."""
    if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG,
                         errno.ELOOP, errno.EISDIR) or not exc.filename:
        return None
    home = dsctl_home()
    path = os.fsdecode(exc.filename) if isinstance(exc.filename, (str, bytes)) else str(exc.filename)
    if path != str(home) and not path.startswith(str(home).rstrip("/") + "/") and not str(home).startswith(path):
        return None
    if exc.errno == errno.ENAMETOOLONG and path != str(home) and len(os.fsencode(str(home))) < 1024:
        name = Path(path).name
        return HomeError(f"{path[:120]}...: a name of {len(os.fsencode(name))} bytes is too long for a file name "
                         "here (at most 255); a run id is a file name, so use a shorter one.")
    return HomeError(home_problem(home, exc))


_warned: set[str] = set()


def _warn_if_open(home: Path) -> None:
    """Warn (once per process) when other users can read or write in the home: dsctl keeps its own files to the
    user, but the list of runs, and anything else put there, is open. A home that no one else can reach (a folder
    on the way is closed to them) is not warned about."""
    try:
        real = home.resolve()
        perms = stat.S_IMODE(os.stat(real).st_mode)
        if perms & 0o066 == 0 or any(stat.S_IMODE(os.stat(p).st_mode) & 0o011 == 0 for p in real.parents):
            return
    except OSError:
        return
    if str(real) in _warned:
        return
    _warned.add(str(real))
    who = "other users" if perms & 0o006 else "its group"
    can = "read and write in it" if perms & 0o022 and perms & 0o044 else ("write in it" if perms & 0o022 else "read it")
    notices.warning(f"DSCTL_HOME ({home}) is open to {who}: they can {can} (mode {perms:04o}). dsctl keeps what it "
                    "writes there to you (records 0600, a folder per run 0700), but it did not create that folder, "
                    f"so it leaves its mode as it is. To keep your runs to yourself: chmod 700 {shlex.quote(str(home))} "
                    "(or set DSCTL_HOME to a folder of your own).")
