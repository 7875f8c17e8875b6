"""Every store written by the reference loaderx 0.9.11 reads back exactly, at the byte level,
and stays writable: we can append to it, delete from it and compact it."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from conftest import FIXTURES, copy_store
from loaderx.zrecord import Zrecord

NAMES = [
    "f32_raw", "u8_zstd", "u8_zstd_dict", "i64_labels_zstd", "f16_zstd", "bool_raw",
    "i32_ragged_zstd", "bytes_deleted_compacted",
]


def expected_records(name: str, kind: str) -> list[bytes]:
    if kind == "dense":
        arr = np.load(FIXTURES / f"{name}.expected.npy")
        return [row.tobytes() for row in arr]
    with np.load(FIXTURES / f"{name}.expected.npz") as z:
        return [z[f"arr_{i}"].tobytes() for i in range(len(z.files))]


def read_all(z: Zrecord) -> list[bytes]:
    idx = np.arange(len(z), dtype=np.uint64)
    lens = z.lengths(idx).astype(np.uint64)
    offsets = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.uint64)
    dst = np.zeros(int(lens.sum()), dtype=np.uint8)
    z.gather(idx, dst, offsets)
    return [dst[o : o + n].tobytes() for o, n in zip(offsets, lens, strict=True)]


def test_manifest_names_every_fixture(manifest):
    assert sorted(manifest) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_reference_store_reads_back_exactly(reference_stores, manifest, name):
    info = manifest[name]
    path = reference_stores / name
    with Zrecord(path) as z:
        got = read_all(z)
        assert z.has_dict() == (info["codec"] == "zstd_dict")
    want = expected_records(name, info["kind"])
    assert len(got) == len(want)
    assert got == want
    if info["kind"] != "bytes":
        schema = msgpack.unpackb((path / "schema.msgpack").read_bytes())
        assert schema["kind"] == info["kind"]
        assert schema["dtype"] == info["dtype"]
        assert schema["codec"] == info["codec"]
        assert schema["format"] == "loaderx-zrecord" and schema["version"] == 1
        if info["kind"] == "dense":
            assert schema["item_shape"] == info["shape"][1:]


@pytest.mark.parametrize("name", ["u8_zstd_dict", "bytes_deleted_compacted", "f32_raw"])
def test_reference_store_stays_writable(reference_stores, manifest, tmp_path, name):
    path = tmp_path / name
    copy_store(reference_stores / name, path)
    want = expected_records(name, manifest[name]["kind"])
    rng = np.random.default_rng(0)
    extra = [rng.integers(0, 4, size=int(n), dtype=np.uint8).tobytes() for n in (10, 500, 3000)]
    codec = "zstd_dict" if name == "u8_zstd_dict" else "zstd"
    with Zrecord(path) as z:
        first = z.append(b"".join(extra), np.cumsum([0, 10, 500])[:3], codec=codec)
        assert first == len(want)
        z.delete([0, 1])
        model = want + extra
        for i in (1, 0):
            model[i] = model[-1]
            model.pop()
        z.compact()
        assert read_all(z) == model
    with Zrecord(path) as z:
        assert read_all(z) == model
