"""One writer per directory: a run, a shard of one, or a training OUT is written by one process at a time.

    with lock.hold(output_dir):      # refuses at once (Busy) while another process holds it
        ...write...

The lock is an OS advisory lock (fcntl.flock) on DIR/.lock, held through the open file: the kernel lets it
go when the process ends, however it ends (kill -9, the OOM killer, a node that reboots), so a file left
behind never blocks a rerun. The pid, host, start time and command written into the file only serve the
refusal's message. The file is removed when the holder is done, and so is a directory the lock created
that is still empty (a start that fails leaves nothing behind).

Within one process the lock is reentrant for the thread holding it (a training stage holds OUT while its
inner run holds OUT/debates; a one-trial run holds its directory twice), and refused to any other thread.

On NFS, Linux maps flock to the server's byte-range locks (NFSv4, or NFSv3 with lockd), which hold across
nodes; a filesystem mounted with nolock or local_lock (and Lustre without -o flock) only sees locks of the
same node. A filesystem without locks at all gets a warning, and the run goes on unlocked.
"""
import contextlib
import errno
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock, as before
    fcntl = None

log = logging.getLogger(__name__)

LOCK = ".lock"
# flock's answers where the filesystem keeps no locks (as opposed to "someone holds it").
UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}

_held = {}  # realpath of a directory -> [thread ident, depth] for the locks this process holds
_mutex = threading.Lock()


class LockError(RuntimeError):
    """The directory cannot be locked for writing: it cannot be made, or another process holds it (Busy)."""


class Busy(LockError):
    """Another process (or another thread of this one) is writing the directory; the message names it."""


@contextlib.contextmanager
def hold(directory, flag="--output-dir"):
    """Hold `directory`'s lock for the block, creating the directory if need be. Raises Busy naming the
    holder when another process has it; `flag` names the setting the message suggests changing."""
    directory = Path(directory)
    created = _make(directory)
    key = os.path.realpath(directory)
    with _mutex:
        mine = _held.get(key)
        if mine is not None and mine[0] != threading.get_ident():
            raise Busy(f"{directory} is being written by another thread of this process (pid {os.getpid()}); "
                       f"wait for it to end or choose another {flag}")
        if mine is not None:
            mine[1] += 1
    if mine is not None:
        try:
            yield
        finally:
            with _mutex:
                mine[1] -= 1
        return
    fd = None
    try:
        fd = _acquire(directory, flag)
        with _mutex:
            _held[key] = [threading.get_ident(), 1]
        try:
            yield
        finally:
            with _mutex:
                del _held[key]
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(directory / LOCK)  # while still holding it: see _acquire on a file unlinked meanwhile
            os.close(fd)
        for made in created:  # deepest first; stops at the first that holds something
            try:
                made.rmdir()
            except OSError:
                break


def _make(directory):
    """Create `directory` (and its missing parents); the ones created, deepest first."""
    missing, here = [], directory.absolute()
    while not here.exists():
        missing.append(here)
        here = here.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise LockError(f"{directory} is a file, not a directory") from None
    except OSError as err:
        raise LockError(f"cannot create {directory}: {err.strerror}") from None
    return missing


def _acquire(directory, flag):
    """The descriptor of DIR/.lock, locked; None where the filesystem has no locks (or no fcntl)."""
    if fcntl is None:
        return None
    path = directory / LOCK
    for _ in range(10):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the directory was removed by a holder leaving it: make it again
            directory.mkdir(parents=True, exist_ok=True)
            continue
        except OSError as err:
            raise LockError(f"cannot write the lock file {path}: {err.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Busy(f"{directory} is being written by another process ({holder(path)}); wait for it to end, "
                       f"or choose another {flag}") from None
        except OSError as err:
            os.close(fd)
            if err.errno not in UNSUPPORTED:
                raise
            log.warning("%s: the filesystem keeps no file locks (%s): nothing stops a second process from "
                        "writing here at the same time", directory, err.strerror)
            return None
        # A holder that was leaving may have unlinked the file between our open and our lock: then the lock is
        # on a file nobody else will open. Only a lock on the file the path names now counts.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            _describe(fd)
            return fd
        os.close(fd)
    raise LockError(f"{directory}: could not take its lock {path} (it kept changing); try again")


def _describe(fd):
    """Write who holds the lock into its file, for the message of whoever is refused."""
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:300]}
    with contextlib.suppress(OSError):  # a full disk: the lock holds all the same, only the message is poorer
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)


def holder(path):
    """Who holds the lock file `path`, in words: "pid 4242 on node7, started 2026-11-23 14:02:11 UTC: run_debate.py
    --split dev ..."."""
    try:
        info = json.loads(Path(path).read_text(encoding="utf-8"))
        return f"pid {info['pid']} on {info['host']}, started {info['started']}: {info['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "it has not said who it is yet"
