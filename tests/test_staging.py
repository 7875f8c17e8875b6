"""loaderx.staging: private, unpredictable staging; durable publication and replacement; and
recovery of every state a kill leaves (each step is killed in its own child process)."""

from __future__ import annotations

import errno
import fcntl
import os
import pathlib
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from loaderx import _native, staging
from loaderx.errors import DatasetError


def make_tree(path: pathlib.Path, ident: str) -> None:
    path.mkdir(exist_ok=True)
    for name in ("0.zr", "schema.msgpack", "meta.zr"):
        (path / name).write_text(f"{ident}:{name}")


def ident_of(path: pathlib.Path, hidden: bool = True) -> str:
    """"old" or "new" when ``path`` holds that tree complete (and nothing else; hidden
    entries aside unless ``hidden``); else what is wrong."""
    if not path.is_dir():
        return "missing"
    names = sorted(p.name for p in path.iterdir() if hidden or not p.name.startswith("."))
    if names != ["0.zr", "meta.zr", "schema.msgpack"]:
        return f"incomplete {names}"
    idents = {(path / n).read_text().split(":")[0] for n in names}
    return idents.pop() if len(idents) == 1 else f"mixed {idents}"


@pytest.fixture(params=["exchange", "two-renames"])
def mode(request, monkeypatch):
    """Both replacement protocols: renameat2's exchange, and the recoverable fallback used
    where the file system answers EINVAL to it."""
    if request.param == "two-renames":
        def refuse(a, b):
            raise OSError(errno.EINVAL, "not supported here")
        monkeypatch.setattr(_native, "rename_exchange", refuse)
    return request.param


# -- private entries ------------------------------------------------------------------------------


def test_private_dir_is_new_private_locked_and_removed(tmp_path):
    target = tmp_path / "d"
    with staging.private_dir(target, "new") as a, staging.private_dir(target, "new") as b:
        assert a != b and os.path.dirname(a) == str(tmp_path)
        name = os.path.basename(a)
        assert name.startswith(".d.loaderx-new-") and len(name) == len(".d.loaderx-new-") + 16
        assert stat.S_IMODE(os.lstat(a).st_mode) == 0o700
        fd = os.open(a, os.O_RDONLY)
        try:  # the owner's lock is held: nobody takes it
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        pathlib.Path(a, "x").write_text("x")
    assert sorted(os.listdir(tmp_path)) == []
    with pytest.raises(KeyError), staging.private_dir(target, "new") as c:
        raise KeyError
    assert not os.path.exists(c)


def test_private_file_is_exclusive_and_removed_unless_published(tmp_path):
    with staging.private_file(tmp_path / "a.tar", "pack") as (path, fd):
        st = os.fstat(fd)
        assert stat.S_IMODE(st.st_mode) == 0o600 and stat.S_ISREG(st.st_mode)
        os.write(fd, b"payload")
    assert os.listdir(tmp_path) == []
    with staging.private_file(tmp_path / "a.tar", "pack") as (path, fd):
        os.write(fd, b"payload")
        staging.publish(path, tmp_path / "a.tar")
    assert os.listdir(tmp_path) == ["a.tar"] and (tmp_path / "a.tar").read_bytes() == b"payload"
    assert stat.S_IMODE(os.stat(tmp_path / "a.tar").st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_publish_never_replaces(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine").write_text("mine")
    (tmp_path / "file").write_text("file")
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    for dst in ("taken", "file", "link"):
        with staging.private_dir(tmp_path / dst, "new") as d:
            pathlib.Path(d, "x").write_text("x")
            with pytest.raises(DatasetError, match=str(tmp_path / dst)):
                staging.publish(d, tmp_path / dst)
    assert sorted(os.listdir(tmp_path)) == ["file", "link", "taken"]
    assert (tmp_path / "taken" / "mine").read_text() == "mine"
    assert not (tmp_path / "elsewhere").exists()
    # An empty directory may be replaced, as rename(2) allows.
    (tmp_path / "empty").mkdir()
    with staging.private_dir(tmp_path / "empty", "new") as d:
        pathlib.Path(d, "x").write_text("x")
        staging.publish(d, tmp_path / "empty")
    assert os.listdir(tmp_path / "empty") == ["x"]
    assert stat.S_IMODE(os.stat(tmp_path / "empty").st_mode) == 0o777 & ~_umask()


def test_relative_targets_and_a_parent_of_dot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with staging.private_dir("d", "new") as d:
        assert os.path.isabs(d) and os.path.dirname(d) == str(tmp_path)
        make_tree(pathlib.Path(d), "new")
        staging.publish(d, "d")
    with staging.private_dir("./d/", "new") as d:
        make_tree(pathlib.Path(d), "newer")
        staging.replace(d, "./d/")
    assert ident_of(tmp_path / "d") == "newer" and os.listdir(tmp_path) == ["d"]


def test_replace_swaps_and_removes_the_old(tmp_path, mode):
    make_tree(tmp_path / "d", "old")
    with staging.private_dir(tmp_path / "d", "new") as d:
        make_tree(pathlib.Path(d), "new")
        staging.replace(d, tmp_path / "d")
    assert ident_of(tmp_path / "d") == "new" and os.listdir(tmp_path) == ["d"]


def test_a_failed_replace_leaves_both_as_they_were(tmp_path, mode, monkeypatch):
    make_tree(tmp_path / "d", "old")
    real_rename = os.rename

    def busy(a, b, **kw):  # as renaming onto or away from a mount point answers
        raise OSError(errno.EBUSY, "busy", b)

    monkeypatch.setattr(_native, "rename_exchange", busy)
    monkeypatch.setattr(os, "rename", lambda a, b: busy(a, b) if b.endswith("/d") or
                        a.endswith("/d") else real_rename(a, b))
    with staging.private_dir(tmp_path / "d", "new") as d:
        make_tree(pathlib.Path(d), "new")
        with pytest.raises(OSError, match="busy"):
            staging.replace(d, tmp_path / "d")
        assert ident_of(pathlib.Path(d)) == "new"
    assert ident_of(tmp_path / "d") == "old" and os.listdir(tmp_path) == ["d"]


# -- recovery -------------------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import os, pathlib, sys
    from loaderx import _native, staging
    stop, mode, action, target = sys.argv[1:5]
    steps = []
    def hook(name):
        steps.append(name)
        if name == stop:
            os.kill(os.getpid(), 9)
    staging._hook = hook
    if mode == "two-renames":
        def refuse(a, b):
            raise OSError(22, "not supported here")
        _native.rename_exchange = refuse
    def tree(path, ident):
        for name in ("0.zr", "schema.msgpack", "meta.zr"):
            pathlib.Path(path, name).write_text(f"{ident}:{name}")
    if action == "replace":
        with staging.private_dir(target, "new") as d:
            tree(d, "new")
            staging.replace(d, target)
    elif action == "publish":
        with staging.private_dir(target, "new") as d:
            tree(d, "new")
            staging.publish(d, target)
    elif action == "move-in":
        with staging.private_dir(target, "new", within=True) as d:
            tree(d, "new")
            staging.move_in(d, target)
    print(" ".join(steps))
""")


def run_child(stop: str, mode: str, action: str, target: pathlib.Path) -> tuple[bool, str]:
    r = subprocess.run([sys.executable, "-c", CHILD, stop, mode, action,
                        str(target)], capture_output=True, text=True)
    if r.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(r.stderr)
    return r.returncode == -signal.SIGKILL, r.stdout.strip()


def steps_of(mode: str, action: str, tmp: pathlib.Path) -> list[str]:
    target = tmp / "probe"
    if action == "replace":
        make_tree(target, "old")
    elif action == "move-in":
        target.mkdir()
    killed, out = run_child("-", mode, action, target)
    assert not killed
    return out.split()


def state(target: pathlib.Path, *, strict: bool) -> str:
    """What ``target`` holds: "old"/"new" complete, "missing", "empty", or -- unless
    ``strict`` -- "partial" for files moved into a mount point without its ``meta.zr`` yet
    (not a store: nothing opens it). Staging entries inside are ignored unless ``strict``."""
    if not target.is_dir():
        return "missing"
    names = [p for p in os.listdir(target) if strict or not p.startswith(".")]
    if not names:
        return "empty"
    if not strict and "meta.zr" not in names:
        return "partial"
    return ident_of(target, hidden=strict)


@pytest.mark.parametrize("action", ["replace", "publish", "move-in"])
def test_a_kill_at_any_step_leaves_old_or_new_and_recovery_cleans_up(tmp_path, mode, action):
    steps = steps_of(mode, action, tmp_path)
    assert len(steps) >= (3 if action == "replace" else 2), steps
    if action == "replace" and mode == "two-renames":
        assert {"mark-ready", "move-old", "move-new"} <= set(steps)
    before = {"replace": "old", "publish": "missing", "move-in": "empty"}[action]
    seen = set()
    for i, stop in enumerate(steps):
        target = tmp_path / f"t{i}" / "d"
        target.parent.mkdir()
        if action == "replace":
            make_tree(target, "old")
        elif action == "move-in":
            target.mkdir()
        killed, _ = run_child(stop, mode, action, target)
        assert killed, stop
        # Whatever the kill left, `target` is never a half-made store (and is missing only
        # between the two renames of the fallback) ...
        gap = ["missing"] if (mode, action, stop) == ("two-renames", "replace", "move-new") \
            else []
        assert state(target, strict=False) in [before, "new", "partial", *gap], stop
        # ... and recovery leaves exactly the old or the new one, and nothing beside it.
        staging.remove_stale(target)
        after = state(target, strict=True)
        assert after in (before, "new"), (stop, after)
        assert os.listdir(target.parent) == ([] if after == "missing" else ["d"]), stop
        seen.add(after)
    assert seen == {before, "new"}, seen


def test_recovery_leaves_a_live_owner_alone(tmp_path, mode):
    make_tree(tmp_path / "d", "old")
    with staging.private_dir(tmp_path / "d", "new") as d:
        make_tree(pathlib.Path(d), "new")
        code = ("import sys; from loaderx import staging; staging.remove_stale(sys.argv[1])")
        subprocess.run([sys.executable, "-c", code, str(tmp_path / "d")], check=True)
        assert ident_of(pathlib.Path(d)) == "new"
        staging.replace(d, tmp_path / "d")
    assert ident_of(tmp_path / "d") == "new"


def test_planted_links_at_staging_names_are_never_followed(tmp_path):
    """A symbolic link (or a FIFO) at a staging name is neither written through nor removed
    through, and a stale-looking link is left for its owner."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("keep")
    os.symlink(victim, tmp_path / (".d.loaderx-new-" + "0" * 16))
    os.mkfifo(tmp_path / (".d.loaderx-copy-" + "1" * 16))
    os.symlink(victim, tmp_path / "d.loaderx-new-999999")  # a legacy name
    with staging.private_dir(tmp_path / "d", "new") as d:
        make_tree(pathlib.Path(d), "new")
        staging.publish(d, tmp_path / "d")
    staging.remove_stale(tmp_path / "d")
    assert os.listdir(victim) == ["keep"]
    assert ident_of(tmp_path / "d") == "new"


def test_stale_entries_of_dead_owners_are_removed(tmp_path):
    code = textwrap.dedent("""
        import os, sys
        from loaderx import staging
        held = [staging.private_dir(sys.argv[1], "copy"), staging.private_file(sys.argv[1], "pack")]
        d = held[0].__enter__()
        open(os.path.join(d, "x"), "w").close()
        held[1].__enter__()
        os._exit(0)  # no clean-up: as a kill would leave them
    """)
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "d")], check=True)
    assert len(os.listdir(tmp_path)) == 2
    with staging.private_dir(tmp_path / "d", "new"):
        staging.remove_stale(tmp_path / "d")
        assert len(os.listdir(tmp_path)) == 1  # only the live one
    assert os.listdir(tmp_path) == []


def test_legacy_leftovers_are_removed_and_an_interrupted_overwrite_rolled_back(tmp_path):
    dead = _dead_pid()
    make_tree(tmp_path / f"d.loaderx-new-{dead}", "new")
    make_tree(tmp_path / f"d.loaderx-new-{dead}.old", "old")
    make_tree(tmp_path / f"d.copying-{dead}", "new")
    make_tree(tmp_path / f"d.unpacking-{dead}", "new")          # unpack's, before staging.py
    (tmp_path / f"d.packing-{dead}").write_bytes(b"half a tar")  # pack's temporary archive
    staging.remove_stale(tmp_path / "d")
    assert os.listdir(tmp_path) == ["d"] and ident_of(tmp_path / "d") == "old"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_publish_never_replaces_where_rename_noreplace_is_unsupported(tmp_path, monkeypatch):
    def unsupported(src, dst):
        raise OSError(errno.EINVAL, "not supported here")

    monkeypatch.setattr(_native, "rename_noreplace", unsupported)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine").write_text("mine")
    (tmp_path / "file").write_text("file")
    with staging.private_dir(tmp_path / "taken", "new") as d:
        pathlib.Path(d, "x").write_text("x")
        with pytest.raises(DatasetError, match="taken"):
            staging.publish(d, tmp_path / "taken")
    with staging.private_file(tmp_path / "file", "pack") as (path, fd):
        with pytest.raises(DatasetError, match="file"):
            staging.publish(path, tmp_path / "file")
    with staging.private_file(tmp_path / "new", "pack") as (path, fd):
        os.write(fd, b"new")
        staging.publish(path, tmp_path / "new")
    assert (tmp_path / "file").read_text() == "file" and (tmp_path / "new").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["file", "new", "taken"]
