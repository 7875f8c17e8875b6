"""kill -9 at every step of a conversion's and a copy's publication (a child process killed by
:data:`loaderx.staging._hook`, and once right after it renamed the old dataset away, where the
two-rename ``overwrite=True`` of earlier versions left nothing at the path): the path always
holds the old or the new dataset, complete, and the next conversion or copy to the path cleans
up whatever the kill left."""

from __future__ import annotations

import errno
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from loaderx import copying, staging
from loaderx.converter import from_numpy
from loaderx.dataset import DenseDataset

OLD = np.arange(60, dtype=np.int32).reshape(20, 3)
NEW = -np.arange(90, dtype=np.int32).reshape(30, 3)
EXTRA = np.full((2, 3), 7, dtype=np.int32)

CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    from loaderx import _native, copying, staging
    from loaderx.converter import from_numpy
    stop, mode, action, path = sys.argv[1:5]
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
    real_rename = os.rename

    def rename(a, b, *args, **kw):  # where the overwrite of loaderx <= this fix was killed
        real_rename(a, b, *args, **kw)
        if os.path.abspath(a) == path:
            hook("renamed-away")
    os.rename = rename
    if action == "mount":
        staging.is_mount_point = lambda p: os.path.abspath(p) == path
    new = -np.arange(90, dtype=np.int32).reshape(30, 3)
    if action == "copy":
        copying.copy(path + "-src", path)
    else:
        from_numpy(path, new, overwrite=action == "overwrite", chunk_bytes=120, progress=False)
    print(" ".join(steps))
""")


def run_child(stop: str, mode: str, action: str, path: pathlib.Path) -> tuple[bool, list[str]]:
    r = subprocess.run([sys.executable, "-c", CHILD, stop, mode, action, str(path)],
                       capture_output=True, text=True)
    if r.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(r.stderr)
    return r.returncode == -signal.SIGKILL, r.stdout.split()


def prepare(action: str, path: pathlib.Path) -> None:
    path.parent.mkdir()
    if action == "overwrite":
        from_numpy(path, OLD)
    elif action == "mount":
        path.mkdir()
    elif action == "copy":
        from_numpy(f"{path}-src", NEW)


def contents(path: pathlib.Path) -> str:
    """Which dataset ``path`` holds: "old", "new", "none" (missing, or an empty directory, or
    files without meta.zr: nothing opens it as a store) -- or what is wrong with it."""
    if not path.is_dir():
        try:  # opening rolls forward a replacement killed between the fallback's two renames
            DenseDataset(path).close()
        except FileNotFoundError:
            return "none"
    if not path.is_dir() or not (path / "meta.zr").exists():
        return "none"
    with DenseDataset(path) as ds:
        got = ds[:]
    for name, arr in (("old", OLD), ("new", NEW)):
        if got.shape == arr.shape and (got == arr).all():
            return name
    return f"wrong: {got.shape}"


@pytest.mark.parametrize(("action", "mode"), [
    ("overwrite", "exchange"), ("overwrite", "two-renames"),  # without RENAME_EXCHANGE
    ("create", "exchange"), ("mount", "exchange"), ("copy", "exchange"),
])
def test_a_kill_at_any_step_leaves_a_whole_dataset_and_is_cleaned_up(tmp_path, mode, action):
    probe = tmp_path / "probe" / "d"
    prepare(action, probe)
    killed, steps = run_child("-", mode, action, probe)
    assert not killed and steps, steps
    before = "old" if action == "overwrite" else "none"
    seen = set()
    for i, stop in enumerate(steps):
        path = tmp_path / f"k{i}" / "d"
        prepare(action, path)
        killed, _ = run_child(stop, mode, action, path)
        assert killed, stop
        now = contents(path)
        # Never missing: a kill between the fallback's two renames is rolled forward by the
        # next open.
        assert now in [before, "new"], (stop, now)
        # The next conversion (or copy) finds the old or the new dataset, whole, and leaves
        # nothing else behind.
        if action == "copy":
            if not path.exists():
                copying.copy(f"{path}-src", path)
            assert contents(path) == "new"
            assert sorted(os.listdir(path.parent)) == ["d", "d-src"], stop
            seen.add("new")
            continue
        n = from_numpy(path, EXTRA, append=True, progress=False)
        assert staging_free(path), (stop, os.listdir(path.parent), os.listdir(path))
        with DenseDataset(path) as ds:
            got = ds[:]
        np.testing.assert_array_equal(got[len(got) - 2:], EXTRA, err_msg=stop)
        priors = {"old": OLD, "new": NEW, "none": np.empty((0, 3), np.int32)}
        had = [name for name, arr in priors.items() if got[:-2].shape == arr.shape
               and (got[:-2] == arr).all() and name in (before, "new")]
        assert had and n == len(got), (stop, got.shape)
        seen.add(had[0])
    assert seen == {before, "new"} if action != "copy" else seen == {"new"}, seen


def staging_free(path: pathlib.Path) -> bool:
    """Only ``path`` is left in its parent, and no staging entry inside it."""
    return (os.listdir(path.parent) == ["d"]
            and not [n for n in os.listdir(path) if "loaderx-" in n])


def test_a_copy_killed_midway_leaves_nothing_after_the_next_one(tmp_path):
    """copy's staging (``<dst>.copying-<pid>`` before) stayed forever after kill -9, and a
    directory already at that pid's name made copy fail with a bare FileExistsError."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    from_numpy(src, NEW)
    code = textwrap.dedent("""
        import os, sys
        from loaderx import copying
        real = os.open
        def open_(path, flags, *a, **kw):  # killed once the first file of the copy exists
            if os.path.basename(str(path)) == "meta.zr" and flags & os.O_CREAT:
                os.kill(os.getpid(), 9)
            return real(path, flags, *a, **kw)
        os.open = open_
        copying.copy(sys.argv[1], sys.argv[2])
    """)
    r = subprocess.run([sys.executable, "-c", code, str(src), str(dst)])
    assert r.returncode == -signal.SIGKILL
    assert not dst.exists() and len(os.listdir(tmp_path)) == 2  # src and the staging
    (tmp_path / f"dst.copying-{os.getpid()}").mkdir()  # a name the old copy would have used
    report = copying.copy(src, dst)
    assert report["records"] == 30 and contents(dst) == "new"
    assert sorted(os.listdir(tmp_path)) == ["dst", f"dst.copying-{os.getpid()}", "src"]


def test_an_unsupported_exchange_is_told_apart_from_a_failed_one(tmp_path, monkeypatch):
    """EINVAL from RENAME_EXCHANGE means the file system cannot: the two-rename protocol runs;
    any other error (here EBUSY) is the replacement failing and leaves the old in place."""
    from loaderx import _native

    from_numpy(tmp_path / "d", OLD)
    calls = []

    def refuse(a, b):
        calls.append(a)
        raise OSError(errno.EINVAL, "not supported here")

    monkeypatch.setattr(_native, "rename_exchange", refuse, raising=False)
    assert from_numpy(tmp_path / "d", NEW, overwrite=True) == 30
    assert calls and contents(tmp_path / "d") == "new" and os.listdir(tmp_path) == ["d"]
    assert staging.is_mount_point(tmp_path / "d") is False
