"""A directory on another file system than the tests' temporary directory, for parts that a
link or a rename cannot reach (``<dst>.parts`` a link to elsewhere, as a mount point would be)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import pytest

#: Where another file system is looked for, in order (a tmpfs on most Linux machines first).
CANDIDATES = ("/dev/shm", "/run/shm", "/run/user", "/var/tmp", "/tmp")


@contextlib.contextmanager
def other_file_system(near: pathlib.Path) -> Iterator[pathlib.Path]:
    """A new, empty directory on a file system other than ``near``'s (``st_dev`` differs),
    removed afterwards; the test is skipped, saying so, when there is none here."""
    here = os.stat(near).st_dev
    for place in CANDIDATES:
        try:
            if os.stat(place).st_dev == here or not os.access(place, os.W_OK):
                continue
            far = pathlib.Path(tempfile.mkdtemp(prefix="loaderx-other-fs-", dir=place))
        except OSError:
            continue
        try:
            yield far
        finally:
            shutil.rmtree(far, ignore_errors=True)
        return
    pytest.skip(f"no writable file system other than {near}'s among {CANDIDATES}: parts on "
                "another file system cannot be tested here")


def blocks_of(path: pathlib.Path | str) -> int:
    """Bytes the file at ``path`` takes on disk (holes take none)."""
    return os.stat(path).st_blocks * 512
