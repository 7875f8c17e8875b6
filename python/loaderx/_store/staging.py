"""The one way the Python layer creates what it writes: private staging, durable publication,
and recovery of whatever a kill or a power cut leaves behind.

Every file or directory loaderx writes (a converted dataset, a copy, an unpacked archive, a
packed archive) is first built under a *private* name beside its target (same parent, so that
the final rename stays on one file system)::

    .<basename>.loaderx-<purpose>-<token>      beside the target
    .loaderx-<purpose>-<token>                 inside the target (:func:`private_dir` with
                                               ``within=True``: a mount point)

``token`` is 16 hex digits from :mod:`secrets`, so nobody can plant a symbolic link or a file at
the name in advance; a directory is made with ``mkdir`` (which fails on any existing name,
links included) with mode 0o700, a file with ``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0o600.
Nothing of another user can get inside either. The creator holds ``flock(LOCK_EX)`` on the new
entry for as long as it uses it; a staging entry whose lock can be taken has no owner any more
(its process died, or the machine lost power), and :func:`remove_stale` removes it. A lock, not a
process id: pid reuse, pid namespaces and two machines on one NFS directory do not matter.

Publishing is durable: the entry gets the mode a plain ``mkdir``/``open`` would have given it
(0o777 or 0o666 less the umask), is synced, renamed and its parent synced.

:func:`publish` renames onto nothing (``renameat2(RENAME_NOREPLACE)``; a directory may also
take the place of an empty directory, as ``rename(2)`` allows). Either the target appears
complete or it does not appear; a kill before leaves only a stale staging entry.

:func:`replace` puts a new directory in the place of an existing one. Preferred:
``renameat2(RENAME_EXCHANGE)`` swaps the two atomically; the staging name then holds the old
directory, which is removed. The states a kill can leave:

==========================================  ==================================================
target = old, staging ``new`` (locked)      the owner is alive: left alone
target = old, staging ``new`` (unlocked)    killed before the swap: staging removed
target = new, staging ``new`` = old         killed after the swap: the old directory (nobody
(unlocked)                                  locks it) is removed
==========================================  ==================================================

Where the file system cannot exchange (``EINVAL``), two renames, made recoverable by first
marking the new directory complete under the name ``ready`` (same token; its owner's lock goes
with it, since a lock belongs to the inode)::

    S0  target = old  new = new                    (building)
    S1  target = old  ready = new                  (marked complete, synced)
    S2                ready = new   old-tok = old  (old moved aside, synced)
    S3  target = new                old-tok = old  (new in place, synced)
    S4  target = new                               (old removed)

Recovery, when the owner is gone (``ready`` unlocked): S0 -- the staging is removed; S1 (the
target exists) -- ``ready`` is removed (rolled back); S2 (no target) -- ``ready`` is renamed to
the target (rolled forward), then the old is removed; S3 (no ``ready``, the target exists) --
the old is removed. An ``old`` with neither ``ready`` nor target (someone removed the new one)
is renamed back. So with the exchange the target holds the old or the new directory, complete,
at every moment and after a power cut; without it, the same holds except in S2, where the
target is missing until the next :func:`remove_stale` (every conversion and copy runs it first,
and opening a dataset whose path is missing does too) rolls the new one forward.

Mount points: an empty directory that is a mount point cannot be renamed onto (``EBUSY``), so
the new entry is built in a private directory *inside* it and :func:`move_in` moves the files
into it: the directory is first renamed to ``ready`` (complete), then every file but
``meta.zr`` (``schema.msgpack`` last of those), then ``meta.zr``, which is what makes a
directory a store, so a half-moved dataset never opens as one. A kill in between leaves a
``ready`` with no owner inside the target; :func:`remove_stale` moves the rest in (rolls
forward).

Leftovers of earlier loaderx versions (``<name>.loaderx-new-<pid>[.old]``,
``<name>.copying-<pid>``, ``<name>.unpacking-<pid>``, ``<name>.packing-<pid>``) are recognised
by a dead process id and removed; an interrupted replacement of theirs (the target missing,
``.old`` present) is rolled back.

For the crash tests, :data:`_hook` (a callable, or None) is called with the name of each step
just before it is taken (see :func:`_step`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator

from loaderx import _native
from loaderx.errors import DatasetError, LoaderxValueError

__all__ = ["private_dir", "private_file", "publish", "replace", "move_in", "remove_stale",
           "fsync_dir", "is_mount_point", "same_file", "STORE_LAST_FILE"]

#: Called with each step's name just before the step (crash tests kill the process there).
_hook: Callable[[str], None] | None = None

#: The file moved last into a mount point: its presence is what makes a directory a store.
STORE_LAST_FILE = "meta.zr"
#: Moved just before it (a store always says what its records are).
_SCHEMA_FILE = "schema.msgpack"

_TOKEN_HEX = 16
_PURPOSE = re.compile(r"[a-z]+\Z")
_READY, _OLD = "ready", "old"
_TAIL = re.compile(rf"\.loaderx-([a-z]+)-([0-9a-f]{{{_TOKEN_HEX}}})\Z")
_LEGACY = re.compile(r"(?:\.loaderx-new-|\.copying-|\.unpacking-|\.packing-)(\d+)(\.old)?\Z")


def _step(name: str) -> None:
    if _hook is not None:
        _hook(name)


# -- names ---------------------------------------------------------------------------------------


def _split(target: str | os.PathLike[str]) -> tuple[str, str]:
    """``(absolute parent, basename)`` of ``target``; a trailing slash is ignored."""
    path = os.path.abspath(os.fspath(target))
    parent, base = os.path.split(path)
    if not base:
        raise LoaderxValueError(f"{os.fspath(target)!r} names no entry of a directory (the "
                                "root); give a path inside one")
    return parent, base


def _name(base: str, purpose: str, token: str) -> str:
    return f".{base}.loaderx-{purpose}-{token}" if base else f".loaderx-{purpose}-{token}"


def _parse(entry: str, base: str) -> tuple[str, str] | None:
    """``(purpose, token)`` when ``entry`` is a staging name of ``base`` ("" inside)."""
    m = _TAIL.search(entry)
    if m is None or entry[:m.start()] != (f".{base}" if base else ""):
        return None
    return m.group(1), m.group(2)


def _check_purpose(purpose: str) -> None:
    if not _PURPOSE.match(purpose) or purpose in (_READY, _OLD):
        raise LoaderxValueError(f"staging purpose {purpose!r} must be lower-case letters and "
                                f"not {_READY!r} or {_OLD!r}")


# -- owner locks ---------------------------------------------------------------------------------


def _try_lock(path: str, directory: bool) -> int | None:
    """An fd of ``path`` holding ``flock(LOCK_EX)`` when nobody else holds it, else None (also
    when ``path`` is gone, is a link or is not of the kind asked for)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    if directory:
        flags |= os.O_DIRECTORY
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        if not directory and not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BlockingIOError
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not same_file(fd, path):  # renamed away meanwhile: what we locked is not at `path`
            raise BlockingIOError
    except OSError:
        os.close(fd)
        return None
    return fd


def same_file(fd: int, path: str) -> bool:
    """Whether ``path`` (not followed) is the file open as ``fd``: a lock taken on ``fd`` is
    a lock on what ``path`` names only while this holds."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _locked_new(make: Callable[[str], int], parent: str, base: str, purpose: str,
                directory: bool) -> tuple[str, int]:
    """Makes a new entry with ``make(path) -> fd`` under a fresh name and locks it. A remover
    may lock it between the creation and our lock (it looks unowned then): we see that as a
    refused lock or as the entry gone, and start again under another name."""
    for _ in range(100):
        path = os.path.join(parent, _name(base, purpose, secrets.token_hex(_TOKEN_HEX // 2)))
        try:
            fd = make(path)
        except FileExistsError:
            continue  # the name was taken (by chance, or by a planted link): another one
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if same_file(fd, path):
                return path, fd
        except BlockingIOError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise DatasetError(f"could not create a private {purpose} entry in {parent}: every new "
                       "one was taken away at once (is something removing files there?)")


@contextlib.contextmanager
def private_dir(target: str | os.PathLike[str], purpose: str, *,
                within: bool = False) -> Iterator[str]:
    """A new private directory (mode 0o700, unpredictable name, owner lock held until exit)
    beside ``target`` -- or, with ``within=True``, inside the existing directory ``target``
    (for a mount point: see :func:`move_in`). Missing parents are created. Yields its absolute
    path. On exit, by exception or not, it is removed unless it was renamed away (published)."""
    _check_purpose(purpose)
    if within:
        parent, base = os.path.abspath(os.fspath(target)), ""
    else:
        parent, base = _split(target)
        os.makedirs(parent, exist_ok=True)

    def make(path: str) -> int:
        os.mkdir(path, 0o700)
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    path, fd = _locked_new(make, parent, base, purpose, directory=True)
    try:
        yield path
    finally:
        try:
            if same_file(fd, path):
                _remove(path)
        finally:
            os.close(fd)


@contextlib.contextmanager
def private_file(target: str | os.PathLike[str], purpose: str) -> Iterator[tuple[str, int]]:
    """A new private file beside ``target`` (``O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC``, opened
    read-write, mode 0o600, unpredictable name, owner lock held until exit). Yields its absolute
    path and the open fd (closed on exit: do not close it). On exit it is removed unless it
    was renamed away (published)."""
    _check_purpose(purpose)
    parent, base = _split(target)

    def make(path: str) -> int:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o600)

    path, fd = _locked_new(make, parent, base, purpose, directory=False)
    try:
        yield path, fd
    finally:
        try:
            if same_file(fd, path):
                os.unlink(path)
        finally:
            os.close(fd)


# -- publishing ----------------------------------------------------------------------------------


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Makes the entries of directory ``path`` (creations, renames, removals) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _settle(src: str) -> bool:
    """Gives ``src`` the mode a plain mkdir/open would have and syncs it (a file's data, a
    directory's entries). Returns whether it is a directory."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        directory = stat.S_ISDIR(os.fstat(fd).st_mode)
        os.fchmod(fd, (0o777 if directory else 0o666) & ~_umask())
        os.fsync(fd)
    finally:
        os.close(fd)
    return directory


def _rename_noreplace(src: str, dst: str) -> bool:
    """Renames ``src`` to ``dst`` unless ``dst`` exists; False when it does."""
    try:
        return _native.rename_noreplace(src, dst)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    # No RENAME_NOREPLACE here: a hard link is the atomic no-replace for files; a directory
    # is checked and renamed (rename(2) refuses a non-empty one anyway).
    if not os.path.isdir(src) or os.path.islink(src):
        try:
            os.link(src, dst, follow_symlinks=False)
        except FileExistsError:
            return False
        os.unlink(src)
        return True
    if os.path.lexists(dst):
        return False
    os.rename(src, dst)
    return True


def _exchange(a: str, b: str) -> bool:
    """Swaps ``a`` and ``b`` atomically; False when the file system cannot."""
    try:
        _native.rename_exchange(a, b)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            return False
        raise
    return True


def _exists_error(dst: str) -> DatasetError:
    return DatasetError(f"{dst} exists; it was left as it is (remove it, or choose another "
                        "path)")


def publish(src: str, dst: str | os.PathLike[str]) -> None:
    """Renames the private entry ``src`` (from :func:`private_dir` or :func:`private_file`) to
    ``dst`` durably, never replacing anything: ``src`` gets its plain mode and is synced (the
    files inside a directory are the caller's to sync), renamed, and the parent synced. A
    directory may take the place of an empty directory (as with ``rename(2)``); anything else
    at ``dst`` is a DatasetError naming it, and ``src`` stays. An empty mount point at ``dst``
    raises OSError(EBUSY): see :func:`move_in`."""
    dst = os.path.abspath(os.fspath(dst))
    directory = _settle(src)
    _step("publish")
    if not _rename_noreplace(src, dst):
        if not (directory and _is_empty_dir(dst)):
            raise _exists_error(dst)
        try:
            os.rename(src, dst)  # onto an empty directory; refused if it got filled meanwhile
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise _exists_error(dst) from None
            raise
    _step("published")
    fsync_dir(os.path.dirname(dst))


def _is_empty_dir(path: str) -> bool:
    try:
        return not os.path.islink(path) and os.path.isdir(path) and not os.listdir(path)
    except OSError:
        return False


def replace(src_dir: str, dst: str | os.PathLike[str], *,
            swapped: Callable[[], None] | None = None) -> None:
    """Puts the private directory ``src_dir`` (from :func:`private_dir` beside ``dst``, still
    inside its ``with``) in the place of the existing ``dst``, durably, such that ``dst`` holds
    the old or the new directory at every moment (see the module docstring); then calls
    ``swapped()`` (the old one is still there, under another name) and removes the old one.
    When ``dst`` does not exist this is :func:`publish`. An OSError (a mount point: EBUSY)
    leaves both where they were, and ``swapped`` uncalled."""
    dst = os.path.abspath(os.fspath(dst))
    parent, base = os.path.split(dst)
    if os.path.dirname(os.path.abspath(src_dir)) != parent:
        raise LoaderxValueError(f"{src_dir} is not beside {dst}: a replacement must stay in "
                                "one directory")
    if not os.path.lexists(dst):
        publish(src_dir, dst)
        if swapped is not None:
            swapped()
        return
    _settle(src_dir)
    _step("exchange")
    if _exchange(src_dir, dst):
        _step("exchanged")
        fsync_dir(parent)
        _after_swap(swapped, src_dir)  # src_dir now names the old directory
        return
    try:  # an empty directory can simply be renamed onto, atomically
        os.rename(src_dir, dst)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    else:
        fsync_dir(parent)
        if swapped is not None:
            swapped()
        return
    token = secrets.token_hex(_TOKEN_HEX // 2)
    ready = os.path.join(parent, _name(base, _READY, token))
    old = os.path.join(parent, _name(base, _OLD, token))
    _step("mark-ready")
    os.rename(src_dir, ready)
    fsync_dir(parent)
    _step("move-old")
    try:
        os.rename(dst, old)
    except BaseException:
        os.rename(ready, src_dir)  # back to S0: the caller's with-block removes it
        raise
    fsync_dir(parent)
    _step("move-new")
    try:
        os.rename(ready, dst)
    except BaseException:
        os.rename(old, dst)
        os.rename(ready, src_dir)
        raise
    fsync_dir(parent)
    _after_swap(swapped, old)


def _after_swap(swapped: Callable[[], None] | None, old: str) -> None:
    try:
        if swapped is not None:
            swapped()
    finally:
        _step("remove-old")
        _remove(old)


def is_mount_point(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory another file system (or a bind mount) is mounted on:
    it cannot be renamed onto, nor renamed away."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isdir(path) or os.path.islink(path):
        return False
    if os.path.ismount(path):
        return True
    try:  # bind mounts of the same file system: ismount (st_dev) misses them
        with open("/proc/self/mountinfo") as f:
            real = os.path.realpath(path)
            return any(_unescape(line.split()[4]) == real for line in f if len(line.split()) > 4)
    except OSError:
        return False


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def move_in(src_dir: str, dst_dir: str | os.PathLike[str]) -> None:
    """Moves the files of the private directory ``src_dir`` (from :func:`private_dir` with
    ``within=True`` inside ``dst_dir``, still inside its ``with``; its files synced) into the
    existing directory ``dst_dir``, for a target that cannot be renamed onto (a mount point).
    ``meta.zr`` goes last and ``schema.msgpack`` just before it, so an interrupted move never
    leaves something that opens as a store; a kill is rolled forward by :func:`remove_stale`.
    A name that exists in ``dst_dir`` is a DatasetError (what was moved goes back)."""
    dst_dir = os.path.abspath(os.fspath(dst_dir))
    src_dir = os.path.abspath(src_dir)
    if os.path.dirname(src_dir) != dst_dir:
        raise LoaderxValueError(f"{src_dir} is not inside {dst_dir}")
    found = _parse(os.path.basename(src_dir), "")
    if found is None:
        raise LoaderxValueError(f"{src_dir} is not a private directory of loaderx")
    for name in os.listdir(src_dir):
        if os.path.lexists(os.path.join(dst_dir, name)):
            raise _exists_error(os.path.join(dst_dir, name))
    _settle(src_dir)
    ready = os.path.join(dst_dir, _name("", _READY, found[1]))
    _step("mark-ready")
    os.rename(src_dir, ready)
    fsync_dir(dst_dir)
    moved: list[str] = []
    try:
        _move_files(ready, dst_dir, moved)
    except BaseException:
        for name in reversed(moved):
            with contextlib.suppress(OSError):
                os.rename(os.path.join(dst_dir, name), os.path.join(ready, name))
        with contextlib.suppress(OSError):
            os.rename(ready, src_dir)
        raise


def _move_files(ready: str, dst_dir: str, moved: list[str]) -> None:
    """The rolling-forward part of :func:`move_in` (also run by recovery): every file of
    ``ready`` not yet in ``dst_dir``, in the safe order; then ``ready`` is removed."""
    last = (_SCHEMA_FILE, STORE_LAST_FILE)
    names = sorted(os.listdir(ready), key=lambda n: (last.index(n) + 1 if n in last else 0, n))
    for name in names:
        if name == STORE_LAST_FILE:
            fsync_dir(dst_dir)  # everything else is in place before the store appears
        _step(f"move-in:{name}")
        if not _rename_noreplace(os.path.join(ready, name), os.path.join(dst_dir, name)):
            raise _exists_error(os.path.join(dst_dir, name))
        moved.append(name)
    fsync_dir(dst_dir)
    _step("remove-ready")
    os.rmdir(ready)
    fsync_dir(dst_dir)


# -- recovery ------------------------------------------------------------------------------------


def _remove(path: str) -> None:
    """Removes ``path`` without following links: a directory tree, or one file or link."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)  # fd-based: never follows a planted link
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def remove_stale(target: str | os.PathLike[str]) -> None:
    """Removes the staging entries of ``target`` whose owner is gone (beside it, and inside it
    when it is a directory), and finishes or undoes their interrupted replacements and moves
    (see the module docstring). Entries whose owner still holds its lock are left alone. Run it
    before writing to ``target``."""
    parent, base = _split(target)
    try:
        entries = os.listdir(parent)
    except (FileNotFoundError, NotADirectoryError):
        return
    dst = os.path.join(parent, base)
    groups: dict[str, dict[str, str]] = {}
    for entry in entries:
        found = _parse(entry, base)
        if found is not None:
            groups.setdefault(found[1], {})[found[0]] = os.path.join(parent, entry)
        elif entry.startswith(base):
            _remove_legacy(parent, base, entry)
    for names in groups.values():
        _recover(names, dst)
    if os.path.isdir(dst) and not os.path.islink(dst):
        _recover_inside(dst)


def _recover(names: dict[str, str], dst: str) -> None:
    """One token's entries beside ``dst`` (purpose -> path)."""
    ready, old = names.pop(_READY, None), names.pop(_OLD, None)
    if ready is not None:
        fd = _try_lock(ready, directory=True)
        if fd is None:
            if os.path.lexists(ready):
                return  # the owner is alive, and mid-replacement: the old is its to handle
        else:
            try:
                if os.path.lexists(dst):
                    _remove(ready)  # S1: killed before the old moved aside -> roll back
                else:
                    _rename_noreplace(ready, dst)  # S2 -> roll forward
                    fsync_dir(os.path.dirname(dst))
            finally:
                os.close(fd)
    if old is not None:
        if os.path.lexists(dst):
            _remove(old)  # S3 (or rolled forward above)
        else:
            _rename_noreplace(old, dst)  # the new one is gone: the old one is better than none
            fsync_dir(os.path.dirname(dst))
    for path in names.values():
        _remove_unowned(path)


def _remove_unowned(path: str) -> None:
    try:
        directory = stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return
    fd = _try_lock(path, directory)
    if fd is None:
        return  # owned, or not ours (a link or a FIFO planted at a staging name)
    try:
        _remove(path)
    finally:
        os.close(fd)


def _recover_inside(dst: str) -> None:
    try:
        entries = os.listdir(dst)
    except OSError:
        return
    for entry in entries:
        found = _parse(entry, "")
        if found is None:
            continue
        path = os.path.join(dst, entry)
        if found[0] != _READY:
            _remove_unowned(path)
            continue
        fd = _try_lock(path, directory=True)
        if fd is None:
            continue
        try:
            _move_files(path, dst, [])  # complete: roll the move forward
        except (OSError, DatasetError):
            pass  # a name taken meanwhile: left for a person to look at
        finally:
            os.close(fd)


def _remove_legacy(parent: str, base: str, entry: str) -> None:
    """Staging of loaderx versions before this module, named after a process id."""
    m = _LEGACY.match(entry[len(base):])
    if m is None or _alive(int(m.group(1))):
        return
    path, dst = os.path.join(parent, entry), os.path.join(parent, base)
    if m.group(2) and not os.path.lexists(dst):
        os.rename(path, dst)  # killed between the two renames of an overwrite: roll back
        fsync_dir(parent)
        return
    _remove(path)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
