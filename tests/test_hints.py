"""Error messages that say what went wrong and what to do, for the mistakes users make."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from loaderx import DataLoader, DenseDataset, from_iterator, from_numpy
from loaderx.errors import DatasetError, LimitExceededError
from loaderx.sampler import Sampler


def test_a_path_as_a_stream_says_to_open_it(tmp_path):
    with pytest.raises(TypeError, match=r"is a path; open it first: DenseDataset\("):
        DataLoader({"x": str(tmp_path)})


def test_text_records_suggest_encoding(tmp_path):
    with pytest.raises(DatasetError, match=r"is a str.*'hello'\.encode\(\)"):
        from_iterator(tmp_path / "t", ["hello"])


def test_a_npy_file_is_not_a_dataset_and_says_how_to_convert(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros(3))
    with pytest.raises(DatasetError, match="is a file.*from_numpy"):
        DenseDataset(tmp_path / "x.npy")


def test_mode_mismatches_name_the_modes():
    state = Sampler(100, 10, "cyclic", 1).state_dict()
    with pytest.raises(ValueError, match="mode: 'cyclic' in the state, 'iid' here"):
        Sampler(100, 10, "iid", 1).load_state_dict(state)


def test_an_oversized_record_from_an_iterator_names_its_position(tmp_path):
    records = [np.zeros(10, np.uint8), np.zeros((2 << 20), np.uint8)]
    with pytest.raises(LimitExceededError, match="record 1 .*order the iterator gave"):
        from_iterator(tmp_path / "big", records)


def test_the_cli_names_its_flag_not_the_keyword(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((3, 2), np.float32))
    np.save(tmp_path / "b.npy", np.zeros((3, 4), np.float32))
    from_numpy(tmp_path / "ds", np.load(tmp_path / "a.npy"))
    proc = subprocess.run([sys.executable, "-m", "loaderx", "convert", str(tmp_path / "b.npy"),
                           str(tmp_path / "ds"), "--append"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "--overwrite" in proc.stderr and "overwrite=True" not in proc.stderr
