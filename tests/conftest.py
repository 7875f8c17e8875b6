"""Shared pytest fixtures: the reference stores, unpacked once per session."""

from __future__ import annotations

import json
import pathlib
import subprocess
import tarfile

import pytest

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "loaderx-0.9.11"


@pytest.fixture(scope="session")
def reference_stores(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Directory holding the stores written by loaderx 0.9.11 (sparse files kept sparse)."""
    out = tmp_path_factory.mktemp("reference")
    with tarfile.open(FIXTURES / "stores.tar.gz") as tar:
        # Extraction filters came in 3.11.4 (Debian 12's 3.11.2 has none); the archive is ours.
        tar.extractall(out, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
    return out / "stores"


@pytest.fixture(scope="session")
def manifest() -> dict:
    return json.loads((FIXTURES / "manifest.json").read_text())


def copy_store(src: pathlib.Path, dst: pathlib.Path) -> None:
    """Copies a store directory keeping its sparse files sparse (a plain copy would write out
    the reference's 4 GiB preallocated chunk files)."""
    subprocess.run(["cp", "-r", "--sparse=always", str(src), str(dst)], check=True)
