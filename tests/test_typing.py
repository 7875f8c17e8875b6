"""The package's types, as a user's type checker sees them: ``mypy --strict`` accepts user-style
code and rejects an unknown codec or mode before anything runs."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent

pytest.importorskip("mypy")


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                           *args], capture_output=True, text=True, timeout=600, cwd=HERE)


def test_user_code_type_checks_strictly():
    r = mypy(str(HERE / "typing" / "user_code.py"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_unknown_codecs_and_modes_are_type_errors(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from loaderx import DataLoader, DenseDataset, Zrecord\n"
        "Zrecord('s', codec='lz4')\n"
        "DataLoader({'x': DenseDataset('d')}, mode='shuffle')\n")
    r = mypy(str(bad))
    assert r.returncode == 1
    assert "lz4" in r.stdout and "shuffle" in r.stdout, r.stdout


def test_dataset_reads_are_typed_arrays(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from loaderx import DenseDataset, RaggedDataset\n"
        "a: str = DenseDataset('d')[1:3]\n"
        "b: str = RaggedDataset('r')[[0, 1]]\n"
        "c: str = RaggedDataset('r')[0]\n")
    r = mypy(str(bad))
    assert r.returncode == 1
    lines = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert len(lines) == 3, r.stdout
    assert "ndarray" in lines[0] and "list[ndarray" in lines[1] and "ndarray" in lines[2], r.stdout
