"""The dataset directory (loaderx.intake.directory): DirectoryWriter's transaction, parts, column
names that are not directory names, open_dataset's checks of a hostile manifest, and rows kept
aligned through split, subsets and the DataLoader."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from loaderx import DataLoader, split
from loaderx.concat import ConcatDataset
from loaderx.errors import (
    CorruptStoreError,
    DatasetError,
    LimitExceededError,
    LoaderxTypeError,
    LoaderxValueError,
    StoreChangedError,
    StoreClosedError,
)
from loaderx.intake import DirectoryWriter, RaggedBatch, decode_strings, open_dataset, read_manifest
from loaderx.intake.directory import MANIFEST_FILE, MAX_MANIFEST_BYTES, store_name
from loaderx.zrecord import MAX_RECORD_BYTES


def write_sample(dst: pathlib.Path | str, n: int = 10, batches: int = 3, **kw: object) -> None:
    """Columns x (dense float32 (2,)), y (int64 labels), t (strings): x[i] = (i, -i), y = i % 3,
    t = "row i"."""
    with DirectoryWriter(dst, **kw) as w:  # type: ignore[arg-type]
        w.add_column("x", "dense", np.float32, (2,))
        w.add_column("y", "dense", np.int64, extra={"classes": ["a", "b", "c"]})
        w.add_column("t", "ragged", np.uint8, extra={"string": True})
        bounds = np.linspace(0, n, batches + 1).astype(int)
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            i = np.arange(lo, hi)
            w.append({"x": np.stack([i, -i], 1).astype(np.float32), "y": i % 3,
                      "t": [f"row {k}".encode() for k in i]})


def check_sample(ds: dict, n: int = 10) -> None:
    assert list(ds) == ["x", "y", "t"]
    assert all(len(d) == n for d in ds.values())
    idx = np.arange(n)
    assert ds["x"][idx].tolist() == [[k, -k] for k in range(n)]
    assert ds["y"][idx].tolist() == [k % 3 for k in range(n)]
    assert decode_strings(ds["t"][idx]) == [f"row {k}" for k in range(n)]


def leftovers(parent: pathlib.Path) -> list[str]:
    return sorted(e for e in os.listdir(parent) if ".loaderx-" in e)


def test_round_trip_and_manifest(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "ds"
    write_sample(dst)
    check_sample(open_dataset(dst))
    m = read_manifest(dst)
    assert m.rows == 10 and not m.parts
    assert [c.name for c in m.columns] == ["x", "y", "t"]
    assert m.column("y").extra == {"classes": ["a", "b", "c"]}
    assert m.column("t").is_string and m.column("t").kind == "ragged"
    # Small dense records are stored raw: zstd cannot shrink 8 bytes (nor these short strings).
    assert m.column("y").codec == "raw" and m.column("t").codec == "raw"
    body = json.loads((dst / MANIFEST_FILE).read_text())
    assert body["format"] == "loaderx-dataset" and body["version"] == 1
    assert sorted(os.listdir(dst)) == [MANIFEST_FILE, "t", "x", "y"]
    assert leftovers(tmp_path) == []
    # Each store stands alone as a loaderx dataset too.
    assert open_dataset(dst, columns=["t", "y"]).keys() == {"t", "y"}


def test_parts_past_rows_per_part(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "ds"
    write_sample(dst, n=10, batches=2, rows_per_part=4)
    m = read_manifest(dst)
    assert [(p.path, p.rows) for p in m.parts] == [("parts/00000", 4), ("parts/00001", 4),
                                                   ("parts/00002", 2)]
    ds = open_dataset(dst)
    assert all(isinstance(d, ConcatDataset) for d in ds.values())
    check_sample(ds)
    # Every part is a complete dataset directory of its own.
    part = open_dataset(dst / "parts" / "00001")
    assert part["y"][np.arange(4)].tolist() == [k % 3 for k in range(4, 8)]


def test_aligned_through_split_subset_loader_and_pickle(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "ds"
    write_sample(dst, n=40, batches=4, rows_per_part=16)
    ds = open_dataset(dst)
    train, val = split(ds, [0.75, 0.25], seed=3)
    for part in (train, val):
        idx = np.arange(len(part["x"]))
        x, y = part["x"][idx], part["y"][idx]
        assert (x[:, 0].astype(int) % 3 == y).all()
        assert decode_strings(part["t"][idx]) == [f"row {int(k)}" for k in x[:, 0]]
    sub = {k: d.subset([5, 17, 33]) for k, d in ds.items()}
    assert sub["y"][[0, 1, 2]].tolist() == [5 % 3, 17 % 3, 33 % 3]
    again = pickle.loads(pickle.dumps(ds))
    check_sample(again, 40)
    with DataLoader(ds, batch_size=8, num_workers=2, seed=1) as loader:
        for _ in range(6):
            b = next(loader)
            assert (b["x"][:, 0].astype(int) % 3 == b["y"]).all()
            assert decode_strings(b["t"]) == [f"row {int(k)}" for k in b["x"][:, 0]]


@pytest.mark.parametrize("names", [
    ["a/b", "..", ".", "", "名前", "parts", "manifest.json", "A", "a", "-x", ".hidden",
     "x" * 200, "../../escape", "with space", "tab\tnew\nline"],
])
def test_column_names_that_are_not_directory_names(tmp_path: pathlib.Path,
                                                   names: list[str]) -> None:
    dst = tmp_path / "ds"
    with DirectoryWriter(dst) as w:
        for name in names:
            w.add_column(name, "dense", np.int16)
        w.append({name: np.array([k, -k], np.int16) for k, name in enumerate(names)})
    ds = open_dataset(dst)
    assert list(ds) == names
    for k, name in enumerate(names):
        assert ds[name][[0, 1]].tolist() == [k, -k]
    stores = [c.store for c in read_manifest(dst).columns]
    assert len({s.lower() for s in stores}) == len(stores)
    for s in stores:  # one plain entry inside dst each
        assert "/" not in s and not s.startswith(".") and s not in ("parts", MANIFEST_FILE)
        assert (dst / s).resolve().parent == dst.resolve()
    assert sorted(os.listdir(tmp_path)) == ["ds"]  # nothing written beside or above dst
    assert store_name("label", 0, []) == "label" and store_name("a/b", 3, []) == "_3_a_b"


def test_codec_where_it_pays(tmp_path: pathlib.Path) -> None:
    """zstd where it pays: compressible records of 4 KiB and more; raw for records that do
    not shrink, and for small ones (a frame's decoding costs more than its bytes); a codec
    given for a column is used as it is."""
    rng = np.random.default_rng(0)
    text = [(b"the same few words again and " * 200)[k:] for k in range(200)]  # ~5.6 KiB
    short = [(b"the same few words again and " * 8)[k:] for k in range(200)]   # ~200 B
    noise = [rng.bytes(5000) for _ in range(200)]
    with DirectoryWriter(tmp_path / "ds") as w:
        w.add_column("text", "ragged", np.uint8)
        w.add_column("short", "ragged", np.uint8)
        w.add_column("noise", "ragged", np.uint8)
        w.add_column("forced", "ragged", np.uint8, codec="zstd")
        w.add_column("small", "dense", np.int32, (4,), codec="zstd")
        w.append({"text": text, "short": short, "noise": noise, "forced": short,
                  "small": np.zeros((200, 4), np.int32)})
    m = read_manifest(tmp_path / "ds")
    assert {c.name: c.codec for c in m.columns} == {
        "text": "zstd", "short": "raw", "noise": "raw", "forced": "zstd", "small": "zstd"}
    ds = open_dataset(tmp_path / "ds")
    assert [r.tobytes() for r in ds["noise"][np.arange(200)]] == noise
    assert [r.tobytes() for r in ds["text"][np.arange(200)]] == text
    assert [r.tobytes() for r in ds["short"][np.arange(200)]] == short
    assert [r.tobytes() for r in ds["forced"][np.arange(200)]] == short
    assert ds["text"].schema["codec"] == "zstd" and ds["noise"].schema["codec"] == "raw"
    assert sorted(os.listdir(tmp_path / "ds")) == sorted([MANIFEST_FILE, "forced", "noise",
                                                          "short", "small", "text"])  # no trial


def test_zero_rows_and_one_row(tmp_path: pathlib.Path) -> None:
    with DirectoryWriter(tmp_path / "empty") as w:
        w.add_column("x", "dense", np.float64, (3,))
        w.add_column("s", "ragged", np.uint8)
    ds = open_dataset(tmp_path / "empty")
    assert len(ds["x"]) == 0 and len(ds["s"]) == 0 and read_manifest(tmp_path / "empty").rows == 0
    with DirectoryWriter(tmp_path / "one") as w:
        w.add_column("s", "ragged", np.int32, (2,))
        w.append({"s": RaggedBatch(np.arange(8, dtype=np.int32).reshape(4, 2), np.array([1, 3]))})
    assert open_dataset(tmp_path / "one")["s"][0].tolist() == [[2, 3], [4, 5]]


def test_ragged_batch_bounds_and_empty_records(tmp_path: pathlib.Path) -> None:
    values = np.arange(10, dtype=np.int64)
    with DirectoryWriter(tmp_path / "ds") as w:
        w.add_column("v", "ragged", np.int64)
        w.append({"v": RaggedBatch(values, np.array([2, 2, 5, 5, 9]))})
        w.append({"v": [np.zeros(0, np.int64), np.array([7], np.int64)]})
    got = open_dataset(tmp_path / "ds")["v"][[0, 1, 2, 3, 4, 5]]
    assert [g.tolist() for g in got] == [[], [2, 3, 4], [], [5, 6, 7, 8], [], [7]]


def test_failure_inside_the_transaction_leaves_nothing(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ZeroDivisionError):
        with DirectoryWriter(tmp_path / "ds") as w:
            w.add_column("x", "dense", np.int64)
            w.append({"x": np.arange(5)})
            1 / 0  # noqa: B018
    assert os.listdir(tmp_path) == []
    # ... also when it replaces a dataset: the old one stays, whole.
    write_sample(tmp_path / "ds")
    with pytest.raises(ZeroDivisionError):
        with DirectoryWriter(tmp_path / "ds", overwrite=True) as w:
            w.add_column("x", "dense", np.int64)
            w.append({"x": np.arange(5)})
            1 / 0  # noqa: B018
    check_sample(open_dataset(tmp_path / "ds"))
    assert os.listdir(tmp_path) == ["ds"]


def test_refused_batches_write_nothing(tmp_path: pathlib.Path) -> None:
    w = DirectoryWriter(tmp_path / "ds")
    w.add_column("x", "dense", np.int64)
    w.add_column("s", "ragged", np.uint8)
    good = {"x": np.arange(2), "s": [b"a", b"bc"]}
    bad = [
        ({"x": np.arange(2)}, "missing"),
        ({**good, "z": np.arange(2)}, "unknown"),
        ({"x": np.arange(3), "s": [b"a", b"b"]}, "one row count"),
        ({"x": np.arange(2, dtype=np.int32), "s": [b"a", b"b"]}, "<i8"),
        ({"x": np.arange(2), "s": b"ab"}, "ragged"),
        ({"x": np.arange(2), "s": ["a", "b"]}, "bytes-like"),
        ({"x": np.arange(2), "s": [b"a", b"x" * (MAX_RECORD_BYTES + 1)]}, "record limit"),
        ({"x": np.arange(2), "s": RaggedBatch(np.zeros(3, np.uint8), np.array([0, 2, 1]))},
         "non-decreasing"),
    ]
    for batch, words in bad:
        with pytest.raises((DatasetError, LimitExceededError), match=words):
            w.append(batch)
    assert w.rows == 0
    w.append(good)
    with pytest.raises(DatasetError, match="before appending"):
        w.add_column("late", "dense", np.int8)
    assert w.commit() == 2
    with pytest.raises(StoreClosedError):
        w.append(good)
    ds = open_dataset(tmp_path / "ds")
    assert ds["x"][[0, 1]].tolist() == [0, 1] and decode_strings(ds["s"][[1]]) == ["bc"]


def test_bad_columns_refused(tmp_path: pathlib.Path) -> None:
    with DirectoryWriter(tmp_path / "ds") as w:
        with pytest.raises(DatasetError, match="twice"):
            w.add_column("x", "dense", np.int8)
            w.add_column("x", "dense", np.int8)
        with pytest.raises(LimitExceededError, match="record limit"):
            w.add_column("big", "dense", np.float32, (512, 1024))
        with pytest.raises(DatasetError, match="object"):
            w.add_column("o", "dense", object)
        with pytest.raises(LoaderxTypeError):
            w.add_column(3, "dense", np.int8)  # type: ignore[arg-type]
        with pytest.raises(DatasetError, match="JSON"):
            w.add_column("e", "dense", np.int8, extra={"k": object()})
        with pytest.raises(LoaderxValueError, match="surrogate"):
            w.add_column("\udcff", "dense", np.int8)


def test_destination_rules(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "ds"
    write_sample(dst)
    with pytest.raises(DatasetError, match="overwrite=True"):
        DirectoryWriter(dst)
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    for ow in (False, True):
        with pytest.raises(DatasetError, match="not a"):
            DirectoryWriter(other, overwrite=ow)
    assert (other / "keep.txt").read_text() == "mine"
    link = tmp_path / "link"
    link.symlink_to(dst)
    with pytest.raises(DatasetError, match="symbolic link"):
        DirectoryWriter(link, overwrite=True)
    (tmp_path / "empty").mkdir()
    write_sample(tmp_path / "empty")  # an empty directory is taken
    check_sample(open_dataset(tmp_path / "empty"))
    assert leftovers(tmp_path) == []


def test_overwrite_replaces_and_retires_readers(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "ds"
    write_sample(dst, n=10)
    old = open_dataset(dst)
    write_sample(dst, n=6, overwrite=True)
    check_sample(open_dataset(dst), 6)
    with pytest.raises(StoreChangedError):
        old["y"][[0]]
    assert leftovers(tmp_path) == []


CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    from loaderx.intake import DirectoryWriter
    dst, kill_at = sys.argv[1], int(sys.argv[2])
    with DirectoryWriter(dst, overwrite=True, rows_per_part=7) as w:
        w.add_column("v", "dense", np.int64)
        w.add_column("s", "ragged", np.uint8)
        for k in range(10):
            if k == kill_at:
                os.kill(os.getpid(), 9)
            w.append({"v": np.arange(k * 3, k * 3 + 3), "s": [b"%d" % i for i in range(3)]})
        if kill_at == 10:
            from loaderx import staging
            staging._hook = lambda step: os.kill(os.getpid(), 9)
""")


@pytest.mark.parametrize("kill_at", [0, 3, 10])
def test_killed_writer_leaves_nothing_and_a_rerun_is_exact(tmp_path: pathlib.Path,
                                                          kill_at: int) -> None:
    dst = tmp_path / "ds"
    run = subprocess.run([sys.executable, "-c", CHILD, str(dst), str(kill_at)])
    assert run.returncode == -signal.SIGKILL
    assert not dst.exists()
    assert leftovers(tmp_path)  # its staging directory, which nobody owns any more
    subprocess.run([sys.executable, "-c", CHILD, str(dst), "11"], check=True)
    assert leftovers(tmp_path) == []
    ds = open_dataset(dst)
    assert ds["v"][np.arange(30)].tolist() == list(range(30))
    assert decode_strings(ds["s"][np.arange(30)]) == ["0", "1", "2"] * 10


# -- hostile manifests ---------------------------------------------------------------------------


def rewrite(dst: pathlib.Path, change) -> None:  # type: ignore[no-untyped-def]
    body = json.loads((dst / MANIFEST_FILE).read_text())
    change(body)
    (dst / MANIFEST_FILE).write_text(json.dumps(body))


@pytest.mark.parametrize("store", ["../outside", "/etc", "a/b", "..", ".", "", "parts",
                                   ".hidden", "x" * 65, 3, None])
def test_manifest_cannot_name_a_store_outside(tmp_path: pathlib.Path, store: object) -> None:
    dst = tmp_path / "ds"
    write_sample(dst)
    write_sample(tmp_path / "outside")

    def change(body: dict) -> None:
        body["columns"][0]["store"] = store

    rewrite(dst, change)
    with pytest.raises(CorruptStoreError, match="store"):
        open_dataset(dst)


@pytest.mark.parametrize("change, words", [
    (lambda b: b.update(rows=11), "holds 10"),
    (lambda b: b.update(rows=-1), "row count"),
    (lambda b: b.update(rows=True), "row count"),
    (lambda b: b.update(columns={}), "columns"),
    (lambda b: b["columns"][0].update(kind="sparse"), "kind"),
    (lambda b: b["columns"][0].update(dtype="O"), "object"),
    (lambda b: b["columns"][0].update(dtype="<f8"), "holds 10"),
    (lambda b: b["columns"][0].update(item_shape=[3]), "holds 10"),
    (lambda b: b["columns"][0].update(item_shape=[-1]), "item_shape"),
    (lambda b: b["columns"][0].update(codec="lz4"), "codec"),
    (lambda b: b["columns"][1].update(name="x"), "twice"),
    (lambda b: b["columns"][1].update(store="x"), "twice"),
    (lambda b: b["columns"][0].update(extra=[]), "extra"),
    (lambda b: b.update(extra=3), "extra"),
    (lambda b: b["columns"][0].update(kind="ragged"), "column 'x'"),
])
def test_hostile_manifest_fields(tmp_path: pathlib.Path, change, words: str) -> None:  # type: ignore[no-untyped-def]
    dst = tmp_path / "ds"
    write_sample(dst)
    rewrite(dst, change)
    with pytest.raises((CorruptStoreError, DatasetError), match=words):
        open_dataset(dst)


@pytest.mark.parametrize("path", ["parts/../../x", "../parts/00000", "parts/0", "/parts/00000",
                                  "parts/00000/..", "parts/00000", "parts/00002"])
def test_hostile_part_paths(tmp_path: pathlib.Path, path: str) -> None:
    dst = tmp_path / "ds"
    write_sample(dst, rows_per_part=4)

    def change(body: dict) -> None:
        body["parts"][1]["path"] = path

    rewrite(dst, change)
    with pytest.raises(CorruptStoreError):
        open_dataset(dst)


def test_hostile_part_rows(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "ds"
    write_sample(dst, rows_per_part=4)

    def change(body: dict) -> None:
        body["parts"][0]["rows"] = 5
        body["parts"][2]["rows"] = 1

    rewrite(dst, change)
    with pytest.raises(CorruptStoreError, match="holds 4 rows"):
        open_dataset(dst)


def test_manifest_file_itself(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "ds"
    write_sample(dst)
    m = dst / MANIFEST_FILE
    good = m.read_bytes()
    for raw, words in [(b"{not json", "JSON"), (b"\xff\xfe", "JSON"), (b"[]", "object"),
                       (good.replace(b"loaderx-dataset", b"other"), "format"),
                       (good.replace(b'"version": 1', b'"version": 9'), "version")]:
        m.write_bytes(raw)
        with pytest.raises((CorruptStoreError, DatasetError), match=words):
            open_dataset(dst)
    m.unlink()
    (tmp_path / "elsewhere.json").write_bytes(good)
    m.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(CorruptStoreError, match="regular file"):
        open_dataset(dst)
    m.unlink()
    os.mkfifo(m)  # would block a plain open forever
    with pytest.raises(CorruptStoreError, match="regular file"):
        open_dataset(dst)
    m.unlink()
    with open(m, "wb") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)
    with pytest.raises(CorruptStoreError, match="limit"):
        open_dataset(dst)
    m.unlink()
    with pytest.raises(DatasetError, match="no manifest.json"):
        open_dataset(dst)
    with pytest.raises(DatasetError, match="single loaderx store"):
        open_dataset(dst / "x")
    with pytest.raises(FileNotFoundError):
        open_dataset(tmp_path / "missing")


def test_missing_or_linked_store(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "ds"
    write_sample(dst)
    write_sample(tmp_path / "other")
    os.rename(dst / "y", tmp_path / "moved")
    with pytest.raises(CorruptStoreError, match="missing"):
        open_dataset(dst)
    (dst / "y").symlink_to(tmp_path / "other" / "y")
    with pytest.raises(CorruptStoreError, match="link"):
        open_dataset(dst)


def test_decode_strings() -> None:
    assert decode_strings(np.frombuffer("é".encode(), np.uint8)) == "é"
    assert decode_strings([b"a", np.zeros(0, np.uint8)]) == ["a", ""]
    with pytest.raises(CorruptStoreError, match="UTF-8"):
        decode_strings([b"\xff"])


def test_columns_argument(tmp_path: pathlib.Path) -> None:
    write_sample(tmp_path / "ds")
    assert list(open_dataset(tmp_path / "ds", columns=["t", "x"])) == ["t", "x"]
    with pytest.raises(DatasetError, match="no column 'q'"):
        open_dataset(tmp_path / "ds", columns=["q"])
    with pytest.raises(LoaderxTypeError, match="list of names"):
        open_dataset(tmp_path / "ds", columns="x")  # type: ignore[arg-type]
