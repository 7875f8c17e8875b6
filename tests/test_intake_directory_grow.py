"""Growing and shrinking a dataset directory (loaderx.intake.growing): appends of image
folders, tables, WebDataset shards and whole datasets onto a dataset, every column at once,
with class names matched by name (checked against Pillow's decoding of the source files and
the labels' class names); deletes from every column, against a NumPy reference; mismatched
schemas refused before anything is written; SIGKILL at every step of an append and of a delete
leaving the old dataset or the new one, never a mix; one column's store refused to Zrecord's
append and delete (and a store changed alone named, and repaired); concatenations of datasets
whose class maps differ refused."""

from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest

import loaderx.intake as intake
from loaderx import (
    ConcatDataset,
    DataLoader,
    DenseDataset,
    Zrecord,
    from_image_folder,
    from_numpy,
)
from loaderx.errors import (
    CorruptStoreError,
    DatasetError,
    LoaderxIndexError,
    LoaderxValueError,
    StoreBusyError,
    StoreChangedError,
)
from loaderx.intake import DirectoryWriter, decode_strings, open_dataset, read_manifest

Image = pytest.importorskip("PIL.Image")
pa = pytest.importorskip("pyarrow")

HANG = 300  # seconds: a child past this is hung


# -- helpers -------------------------------------------------------------------------------------


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (6, 5, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def pillow(data: bytes | np.ndarray) -> np.ndarray:
    raw = data.tobytes() if isinstance(data, np.ndarray) else data
    with Image.open(io.BytesIO(raw)) as img:
        return np.asarray(img.convert("RGB"))


def folder(root: pathlib.Path, classes: dict[str, int], tag: str) -> pathlib.Path:
    """An image folder: ``count`` PNG files per class (0: an empty class folder)."""
    for c, count in classes.items():
        (root / c).mkdir(parents=True)
        for k in range(count):
            (root / c / f"{tag}-{k}.png").write_bytes(png(hash((tag, c, k)) % 2**32))
    return root


def check_images(dst: pathlib.Path, roots: list[pathlib.Path]) -> list[str]:
    """Every row of the image-folder dataset ``dst`` against the source files: Pillow decodes
    the stored bytes as it decodes the file at the row's path (in one of ``roots``), and the
    row's label names the class folder the file is in. Returns the rows' class names."""
    ds = open_dataset(dst)
    classes = read_manifest(dst).column("label").extra["classes"]
    names = []
    n = len(ds["label"])
    labels = ds["label"][np.arange(n)] if n else np.zeros(0, np.int64)
    images = ds["image"][np.arange(n)] if n else []
    paths = ds["path"][np.arange(n)] if n else []
    for label, image, rel in zip(labels, images, paths, strict=True):
        rel = os.fsdecode(bytes(rel))
        found = [r / rel for r in roots if (r / rel).is_file()]
        assert len(found) == 1, rel
        np.testing.assert_array_equal(pillow(image), pillow(found[0].read_bytes()))
        assert classes[int(label)] == rel.split("/")[0], (rel, int(label), classes)
        names.append(classes[int(label)])
    for col in ds.values():
        col.close()
    return names


def snapshot(path: pathlib.Path) -> dict[str, object]:
    """What a dataset directory holds: each column's records (bytes), and the manifest's row
    count and column extras. Opening it checks every column has the manifest's rows."""
    manifest = read_manifest(path)
    ds = open_dataset(path)
    out: dict[str, object] = {"rows": manifest.rows,
                              "extra": {c.name: c.extra for c in manifest.columns}}
    for name, col in ds.items():
        n = len(col)
        recs = col[np.arange(n)] if n else []
        out[name] = [np.asarray(r).tobytes() for r in recs]
        col.close()
    return out


def leftovers(parent: pathlib.Path) -> list[str]:
    return sorted(e for e in os.listdir(parent) if ".loaderx-" in e)


def tree_bytes(path: pathlib.Path) -> dict[str, bytes]:
    """Every file below ``path`` that is not sparse metadata, by relative path (to see that
    a refused operation changed nothing)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name not in ("meta.zr", "sums.zr")}


def labelled(path: pathlib.Path, labels: list[int], classes: list[str] | None,
             text: list[str] | None = None, **kw: object) -> None:
    """A dataset directory with an int64 ``label`` column (classes named if given) and a
    string column ``text``."""
    text = text if text is not None else [f"row {k}" for k in range(len(labels))]
    with DirectoryWriter(path, **kw) as w:  # type: ignore[arg-type]
        w.add_column("label", "dense", np.int64,
                     extra={} if classes is None else {"classes": classes})
        w.add_column("text", "ragged", np.uint8, extra={"string": True})
        w.append({"label": np.array(labels, np.int64), "text": [t.encode() for t in text]})


# -- appending image folders --------------------------------------------------------------------


def test_an_image_folder_appended_reads_as_its_files_with_labels_by_class_name(tmp_path):
    first = folder(tmp_path / "first", {"cat": 3, "dog": 2, "fox": 1}, "a")
    more = folder(tmp_path / "more", {"ant": 2, "dog": 2, "yak": 0, "zebra": 1}, "b")
    dst = tmp_path / "pets.lx"
    assert from_image_folder(dst, first)["classes"] == ["cat", "dog", "fox"]
    r = from_image_folder(dst, more, append=True)
    # Existing classes keep their numbers; new ones (the empty one too, as the folder has
    # it) come after them in sorted order.
    assert r["classes"] == ["cat", "dog", "fox", "ant", "yak", "zebra"]
    assert r["new_classes"] == ["ant", "yak", "zebra"]
    assert r["rows"] == 11 and r["appended"] == 5
    assert r["counts"] == [3, 4, 1, 2, 0, 1] and r["empty_classes"] == ["yak"]
    names = check_images(dst, [first, more])
    assert names == ["cat"] * 3 + ["dog"] * 2 + ["fox"] + ["ant"] * 2 + ["dog"] * 2 + ["zebra"]
    manifest = read_manifest(dst)
    assert manifest.rows == 11
    assert manifest.column("label").extra["counts"] == [3, 4, 1, 2, 0, 1]
    assert leftovers(tmp_path) == []
    # The files come back out, both folders' in one tree.
    intake.export_image_folder(dst, tmp_path / "back")
    for root in (first, more):
        for f in root.rglob("*.png"):
            assert (tmp_path / "back" / f.relative_to(root)).read_bytes() == f.read_bytes()
    assert (tmp_path / "back" / "yak").is_dir()


def test_appending_onto_nothing_converts_and_onto_another_source_is_refused(tmp_path):
    imgs = folder(tmp_path / "imgs", {"a": 2}, "x")
    r = from_image_folder(tmp_path / "new.lx", imgs, append=True)
    assert r["rows"] == 2 and r["appended"] == 2 and r["new_classes"] == ["a"]
    check_images(tmp_path / "new.lx", [imgs])
    intake.from_arrow(tmp_path / "table.lx", pa.table({"label": [1, 2]}))
    before = tree_bytes(tmp_path / "table.lx")
    with pytest.raises(DatasetError, match="made by from_arrow, not by from_image_folder"):
        from_image_folder(tmp_path / "table.lx", imgs, append=True)
    assert tree_bytes(tmp_path / "table.lx") == before and leftovers(tmp_path) == []
    with pytest.raises(LoaderxValueError, match="pass one of them"):
        from_image_folder(tmp_path / "new.lx", imgs, append=True, overwrite=True)
    with pytest.raises(LoaderxValueError, match="codecs"):
        from_image_folder(tmp_path / "new.lx", imgs, append=True, codec="zstd")


def test_an_image_path_the_dataset_holds_already_is_refused(tmp_path):
    one = folder(tmp_path / "one", {"cat": 2}, "same")
    two = folder(tmp_path / "two", {"cat": 1}, "same")  # cat/same-0.png again
    dst = tmp_path / "d"
    from_image_folder(dst, one)
    before = tree_bytes(dst)
    with pytest.raises(DatasetError, match=r"'cat/same-0\.png'.*rename the new file"):
        from_image_folder(dst, two, append=True)
    assert tree_bytes(dst) == before and leftovers(tmp_path) == []


def test_cli_convert_appends_an_image_folder(tmp_path, capsys):
    from loaderx.cli import main

    one = folder(tmp_path / "one", {"b": 1, "c": 1}, "p")
    two = folder(tmp_path / "two", {"a": 1, "c": 2}, "q")
    assert main(["convert", str(one), str(tmp_path / "d")]) == 0
    capsys.readouterr()
    assert main(["convert", str(two), str(tmp_path / "d"), "--append"]) == 0
    out = capsys.readouterr().out
    assert "5 images in 3 classes" in out and "3 appended, 1 new classes" in out
    assert check_images(tmp_path / "d", [one, two]) == ["b", "c", "a", "c", "c"]
    assert read_manifest(tmp_path / "d").column("label").extra["classes"] == ["b", "c", "a"]


# -- label numbering ----------------------------------------------------------------------------


def test_class_names_map_to_the_existing_numbering_and_new_ones_follow_sorted(tmp_path):
    labelled(tmp_path / "dst", [0, 1, 1], ["b", "d"])
    # src numbers its own classes: e=0, d=1, a=2, c=3; -1 is "no label" (Hugging Face).
    labelled(tmp_path / "src", [0, 1, 2, 3, -1, 2], ["e", "d", "a", "c"])
    assert intake.append_dataset(tmp_path / "dst", tmp_path / "src") == 9
    ds = open_dataset(tmp_path / "dst")
    classes = read_manifest(tmp_path / "dst").column("label").extra["classes"]
    assert classes == ["b", "d", "a", "c", "e"]
    got = ds["label"][:].tolist()
    assert got == [0, 1, 1, 4, 1, 2, 3, -1, 2]
    # By name, independently of the numbers: every row's class is the one it was written with.
    want = ["b", "d", "d", "e", "d", "a", "c", None, "a"]
    assert [classes[v] if v >= 0 else None for v in got] == want
    assert decode_strings(ds["text"][[3, 8]]) == ["row 0", "row 5"]
    # src is untouched, and shares no file with dst.
    assert open_dataset(tmp_path / "src")["label"][:].tolist() == [0, 1, 2, 3, -1, 2]
    src_inodes = {p.stat().st_ino for p in (tmp_path / "src").rglob("*.zr")}
    assert not src_inodes & {p.stat().st_ino for p in (tmp_path / "dst").rglob("*.zr")}


def test_the_same_classes_append_unchanged_and_counts_follow(tmp_path):
    labelled(tmp_path / "dst", [0, 2], ["x", "y", "z"])
    labelled(tmp_path / "src", [2, 2, 1], ["x", "y", "z"])
    intake.append_dataset(tmp_path / "dst", tmp_path / "src")
    assert open_dataset(tmp_path / "dst")["label"][:].tolist() == [0, 2, 2, 2, 1]
    assert read_manifest(tmp_path / "dst").column("label").extra["classes"] == ["x", "y", "z"]


def test_a_label_past_its_class_names_is_refused(tmp_path):
    labelled(tmp_path / "dst", [0], ["a"])
    labelled(tmp_path / "src", [0, 3], ["b"])
    before = tree_bytes(tmp_path / "dst")
    with pytest.raises(DatasetError, match="row 1 of column 'label' holds the label 3"):
        intake.append_dataset(tmp_path / "dst", tmp_path / "src")
    assert tree_bytes(tmp_path / "dst") == before and leftovers(tmp_path) == []


# -- schemas that do not fit --------------------------------------------------------------------


def test_rows_of_another_schema_are_refused_before_anything_is_written(tmp_path):
    dst = tmp_path / "dst"
    labelled(dst, [0, 1], ["a", "b"])
    before = tree_bytes(dst)

    def refused(build, match: str) -> None:  # type: ignore[no-untyped-def]
        src = tmp_path / f"src{len(list(tmp_path.iterdir()))}"
        build(src)
        with pytest.raises(DatasetError, match=match):
            intake.append_dataset(dst, src)
        assert tree_bytes(dst) == before, match
        assert leftovers(tmp_path) == []

    def other_columns(src):  # type: ignore[no-untyped-def]
        with DirectoryWriter(src) as w:
            w.add_column("label", "dense", np.int64, extra={"classes": ["a"]})
            w.add_column("score", "dense", np.float32)
            w.append({"label": np.zeros(1, np.int64), "score": np.zeros(1, np.float32)})

    def other_dtype(src):  # type: ignore[no-untyped-def]
        with DirectoryWriter(src) as w:
            w.add_column("label", "dense", np.int32, extra={"classes": ["a"]})
            w.add_column("text", "ragged", np.uint8, extra={"string": True})
            w.append({"label": np.zeros(1, np.int32), "text": [b"x"]})

    def other_shape(src):  # type: ignore[no-untyped-def]
        with DirectoryWriter(src) as w:
            w.add_column("label", "dense", np.int64, (2,), extra={"classes": ["a"]})
            w.add_column("text", "ragged", np.uint8, extra={"string": True})
            w.append({"label": np.zeros((1, 2), np.int64), "text": [b"x"]})

    def bytes_not_text(src):  # type: ignore[no-untyped-def]
        with DirectoryWriter(src) as w:
            w.add_column("label", "dense", np.int64, extra={"classes": ["a"]})
            w.add_column("text", "ragged", np.uint8)
            w.append({"label": np.zeros(1, np.int64), "text": [b"x"]})

    refused(other_columns, r"lacks the column\(s\) \['text'\].*has the column\(s\) \['score'\]")
    refused(other_dtype, "column 'label'.*<i8.*<i4")
    refused(other_shape, r"column 'label'.*\(2,\)")
    refused(bytes_not_text, "column 'text': 'string' is True")
    refused(lambda src: labelled(src, [0], None), "names its classes and .* does not")
    with pytest.raises(DatasetError, match="appended to itself"):
        intake.append_dataset(dst, dst)
    from_numpy(tmp_path / "store", np.arange(3))
    with pytest.raises(DatasetError, match="single loaderx store"):
        intake.append_dataset(tmp_path / "store", dst)
    with pytest.raises(FileNotFoundError):
        intake.append_dataset(tmp_path / "missing", dst)


def test_a_table_of_another_schema_is_refused_before_it_is_converted(tmp_path, monkeypatch):
    dst = tmp_path / "t.lx"
    intake.from_arrow(dst, pa.table({"id": [1, 2], "name": ["a", "b"]}))
    before = tree_bytes(dst)
    from loaderx.intake import directory

    def no_writer(*a, **kw):  # type: ignore[no-untyped-def]
        raise AssertionError("nothing is converted for a table that does not fit")

    with monkeypatch.context() as m:
        m.setattr(directory.DirectoryWriter, "__init__", no_writer)
        with pytest.raises(DatasetError, match="column 'id'"):
            intake.from_arrow(dst, pa.table({"id": pa.array([3], pa.int32()), "name": ["c"]}),
                              append=True)
        with pytest.raises(DatasetError, match="lacks the column"):
            intake.from_arrow(dst, pa.table({"id": [3]}), append=True)
    assert tree_bytes(dst) == before and leftovers(tmp_path) == []
    with pytest.raises(LoaderxValueError, match="pass one of them"):
        intake.from_arrow(dst, pa.table({"id": [3], "name": ["c"]}), append=True, resume=True)


# -- tables and WebDataset shards ---------------------------------------------------------------


def test_a_table_appended_keeps_the_datasets_codecs_and_checksums(tmp_path):
    dst = tmp_path / "t.lx"
    first = pa.table({"id": list(range(5)), "name": [f"n{k}" for k in range(5)],
                      "vec": pa.array([[k, -k] for k in range(5)], pa.list_(pa.float32(), 2)),
                      "blob": [bytes([k]) * 5000 for k in range(5)]})
    intake.from_arrow(dst, first, codec={"blob": "zstd"}, checksums=True)
    more = pa.table({"id": [5, 6], "name": ["n5", "n6"],
                     "vec": pa.array([[5, -5], [6, -6]], pa.list_(pa.float32(), 2)),
                     "blob": [b"\x05" * 5000, b"\x06" * 5000]})
    assert intake.from_arrow(dst, more, append=True) == 7
    ds = open_dataset(dst)
    assert ds["id"][:].tolist() == list(range(7))
    assert decode_strings(ds["name"][np.arange(7)]) == [f"n{k}" for k in range(7)]
    np.testing.assert_array_equal(ds["vec"][:], [[k, -k] for k in range(7)])
    assert [bytes(b) for b in ds["blob"][np.arange(7)]] == [bytes([k]) * 5000 for k in range(7)]
    assert read_manifest(dst).column("blob").codec == "zstd"
    with Zrecord(dst / "blob") as z:
        assert z.stats()["compressed_records"] == 7  # the new rows were compressed too
        report = z.verify()
        assert report["checked"] == 7 and report["failed"] == 0  # and summed


def write_shard(path: pathlib.Path, keys: list[str], start: int) -> None:
    with tarfile.open(path, "w") as tar:
        for i, key in enumerate(keys):
            for ext, data in (("jpg", png(start + i)), ("cls", b"%d" % ((start + i) % 3))):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_webdataset_shards_appended_continue_the_shard_list(tmp_path):
    for s in range(3):
        write_shard(tmp_path / f"s{s}.tar", [f"{s}-{k}" for k in range(3)], 10 * s)
    dst = tmp_path / "w.lx"
    intake.from_webdataset(dst, [tmp_path / "s0.tar", tmp_path / "s1.tar"], label="cls")
    r = intake.from_webdataset(dst, tmp_path / "s2.tar", label="cls", append=True)
    assert r["rows"] == 9 and r["appended"] == 3
    ds = open_dataset(dst)
    assert ds["__shard__"][:].tolist() == [0] * 3 + [1] * 3 + [2] * 3
    assert ds["label"][:].tolist() == [(10 * s + k) % 3 for s in range(3) for k in range(3)]
    manifest = read_manifest(dst)
    assert manifest.extra["shards"] == [str(tmp_path / f"s{s}.tar") for s in range(3)]
    out = intake.export_webdataset(dst, str(tmp_path / "out-%d.tar"))
    for s, path in enumerate(out):
        with tarfile.open(path) as a, tarfile.open(tmp_path / f"s{s}.tar") as b:
            assert [(m.name, a.extractfile(m).read()) for m in a.getmembers()] == \
                [(m.name, b.extractfile(m).read()) for m in b.getmembers()]
    with pytest.raises(DatasetError, match="lacks the column"):  # no label column this time
        intake.from_webdataset(dst, tmp_path / "s2.tar", append=True)
    assert read_manifest(dst).rows == 9 and leftovers(tmp_path) == []


# -- directories of parts, and groups past one store ----------------------------------------------


def test_appending_to_a_directory_of_parts_and_past_one_store(tmp_path, monkeypatch):
    from loaderx.intake import growing

    labelled(tmp_path / "dst", list(range(7)), [f"c{k}" for k in range(7)], rows_per_part=3)
    assert len(read_manifest(tmp_path / "dst").parts) == 3
    labelled(tmp_path / "src", [0, 1, 2], ["c6", "new", "c0"], text=["s0", "s1", "s2"])
    want = [*range(7), 6, 7, 0]
    assert intake.append_dataset(tmp_path / "dst", tmp_path / "src") == 10
    manifest = read_manifest(tmp_path / "dst")
    assert not manifest.parts  # 10 rows fit one store: joined into one per column
    assert open_dataset(tmp_path / "dst")["label"][:].tolist() == want
    # Stores of at most 4 rows: the rows go into parts, in order.
    monkeypatch.setattr(growing, "MAX_RECORDS", 4)
    labelled(tmp_path / "src2", [0], ["c3"], text=["t"])
    intake.append_dataset(tmp_path / "dst", tmp_path / "src2")
    manifest = read_manifest(tmp_path / "dst")
    assert [p.rows for p in manifest.parts] == [10, 1]  # the units: the dataset, then the rows
    ds = open_dataset(tmp_path / "dst")
    assert ds["label"][:].tolist() == [*want, 3]
    assert decode_strings(ds["text"][np.arange(11)])[-4:] == ["s0", "s1", "s2", "t"]
    assert read_manifest(tmp_path / "dst").column("label").extra["classes"][-1] == "new"
    rows = intake.delete_rows(tmp_path / "dst", [1, 10])
    assert rows == 9 and open_dataset(tmp_path / "dst")["label"][:].tolist() == \
        [0, *range(2, 7), 6, 7, 0]


# -- deleting -----------------------------------------------------------------------------------


def swap_tail(n: int, gone: list[int]) -> list[int]:
    """Zrecord.delete's order, by NumPy: the last row moves into each hole, descending."""
    rows = list(range(n))
    for hole in sorted(set(gone), reverse=True):
        rows[hole] = rows[-1]
        rows.pop()
    return rows


@pytest.mark.parametrize("keep_order", [True, False])
@pytest.mark.parametrize("layout", ["columns", "parts", "dictionary"])
def test_delete_round_trip_against_numpy(tmp_path, keep_order, layout):
    rng = np.random.default_rng(7)
    n = 40
    vec = rng.normal(size=(n, 3)).astype(np.float32)
    labels = rng.integers(0, 4, n)
    ragged = [rng.integers(0, 100, int(rng.integers(0, 5))).astype(np.int32) for _ in range(n)]
    names = [f"text {k} " * int(rng.integers(1, 4)) for k in range(n)]
    kw = {"rows_per_part": 16} if layout == "parts" else {}
    with DirectoryWriter(tmp_path / "d", **kw) as w:  # type: ignore[arg-type]
        w.add_column("vec", "dense", np.float32, (3,))
        w.add_column("label", "dense", np.int64, extra={"classes": list("abcd")})
        w.add_column("tokens", "ragged", np.int32)
        w.add_column("text", "ragged", np.uint8, extra={"string": True},
                     codec="zstd_dict" if layout == "dictionary" else None)
        for lo in range(0, n, 10):
            w.append({"vec": vec[lo:lo + 10], "label": labels[lo:lo + 10],
                      "tokens": ragged[lo:lo + 10],
                      "text": [t.encode() for t in names[lo:lo + 10]]})
        w.set_extra("label", {"classes": list("abcd"),
                              "counts": np.bincount(labels, minlength=4).tolist()})
    gone = [3, 0, 17, 17, 39, 25, 16]
    assert intake.delete_rows(tmp_path / "d", np.array(gone), keep_order=keep_order) == n - 6
    if keep_order or layout == "parts":
        keep = np.setdiff1d(np.arange(n), gone)
        if not keep_order:  # each part's own last rows move into its holes
            keep = np.concatenate([np.array(swap_tail(16, [g for g in gone if g < 16])),
                                   16 + np.array(swap_tail(16, [g - 16 for g in gone
                                                                if 16 <= g < 32])),
                                   32 + np.array(swap_tail(8, [g - 32 for g in gone
                                                                if g >= 32]))])
    else:
        keep = np.array(swap_tail(n, gone))
    ds = open_dataset(tmp_path / "d")
    np.testing.assert_array_equal(ds["vec"][:], vec[keep])
    np.testing.assert_array_equal(ds["label"][:], labels[keep])
    got = ds["tokens"][np.arange(len(keep))]
    assert all(np.array_equal(a, ragged[k]) for a, k in zip(got, keep, strict=True))
    assert decode_strings(ds["text"][np.arange(len(keep))]) == [names[k] for k in keep]
    manifest = read_manifest(tmp_path / "d")
    assert manifest.rows == n - 6
    assert manifest.column("label").extra["counts"] == \
        np.bincount(labels[keep], minlength=4).tolist()
    if layout == "parts":
        assert [p.rows for p in manifest.parts] == [14, 13, 7]
    assert leftovers(tmp_path) == []


def test_delete_by_mask_refuses_bad_indices_and_deleting_nothing_writes_nothing(tmp_path):
    labelled(tmp_path / "d", [0, 1, 2, 3], ["a", "b", "c", "d"])
    before = tree_bytes(tmp_path / "d")
    for bad, match in (([4], "out of range"), ([-1], "out of range"), ([0.5], "integers"),
                       (np.zeros(3, bool), "one entry per row")):
        with pytest.raises(LoaderxIndexError, match=match):
            intake.delete_rows(tmp_path / "d", bad)
    assert intake.delete_rows(tmp_path / "d", []) == 4
    assert tree_bytes(tmp_path / "d") == before
    mask = np.array([True, False, True, False])
    assert intake.delete_rows(tmp_path / "d", mask) == 2
    ds = open_dataset(tmp_path / "d")
    assert ds["label"][:].tolist() == [1, 3] and decode_strings(ds["text"][[0, 1]]) == \
        ["row 1", "row 3"]
    assert intake.delete_rows(tmp_path / "d", [0, 1]) == 0
    assert len(open_dataset(tmp_path / "d")["text"]) == 0


def test_an_append_or_delete_waits_for_nobody_and_retires_old_handles(tmp_path):
    labelled(tmp_path / "d", [0, 1], ["a", "b"])
    labelled(tmp_path / "s", [0], ["b"])
    reader = open_dataset(tmp_path / "d")
    writer = Zrecord(tmp_path / "d" / "text")
    writer.lock_for_writing()
    try:
        with pytest.raises(StoreBusyError):
            intake.append_dataset(tmp_path / "d", tmp_path / "s")
        with pytest.raises(StoreBusyError):
            intake.delete_rows(tmp_path / "d", [0])
    finally:
        writer.close()
    assert reader["label"][:].tolist() == [0, 1]
    intake.append_dataset(tmp_path / "d", tmp_path / "s")  # in place
    assert reader["label"][:].tolist() == [0, 1]  # the rows it was opened with
    assert open_dataset(tmp_path / "d")["label"][:].tolist() == [0, 1, 1]
    intake.delete_rows(tmp_path / "d", [0])
    with pytest.raises(StoreChangedError):
        reader["label"][:]  # the dataset was replaced: open it again
    assert open_dataset(tmp_path / "d")["label"][:].tolist() == [1, 1]


# -- one column's store alone ---------------------------------------------------------------------


def test_a_column_store_refuses_zrecord_appends_and_deletes(tmp_path):
    labelled(tmp_path / "d", [0, 1, 2], ["a", "b", "c"])
    labelled(tmp_path / "p", [0, 1, 2], ["a", "b", "c"], rows_per_part=2)
    for store, root in ((tmp_path / "d" / "label", tmp_path / "d"),
                        (tmp_path / "p" / "parts" / "00001" / "label", tmp_path / "p")):
        with Zrecord(store) as z:
            with pytest.raises(DatasetError, match=rf"column 'label' of the dataset directory "
                               rf"{root}.*append_dataset.*delete_rows"):
                z.append(np.zeros(8, np.uint8), [0])
            with pytest.raises(DatasetError, match="delete_rows"):
                z.delete([0])
            assert len(z) == (3 if root.name == "d" else 1)
        with pytest.raises(DatasetError, match="append_dataset"):
            from_numpy(store, np.arange(2), append=True)
    for name in ("d", "p"):
        assert open_dataset(tmp_path / name)["label"][:].tolist() == [0, 1, 2]
    # A store that is not a column is written as before.
    with Zrecord(tmp_path / "alone") as z:
        z.append(b"xy", [0, 1])
        z.delete([0])
        assert len(z) == 1


def test_a_column_changed_alone_is_named_on_open_and_repaired(tmp_path):
    labelled(tmp_path / "d", [0, 1, 2], ["a", "b", "c"])
    with Zrecord(tmp_path / "d" / "label") as z:  # what the engine or an old loaderx can do
        z._native.append(np.zeros(16, np.uint8).tobytes(), np.array([0, 8], np.uint64), None)
    with pytest.raises(CorruptStoreError, match=r"holds 5 .*appended to this column's store "
                       r"alone.*repair_dataset"):
        open_dataset(tmp_path / "d")
    assert intake.repair_dataset(tmp_path / "d") == {str(tmp_path / "d" / "label"): 2}
    assert open_dataset(tmp_path / "d")["label"][:].tolist() == [0, 1, 2]
    with Zrecord(tmp_path / "d" / "text") as z:
        z._native.delete(np.array([0], np.uint64))
    with pytest.raises(CorruptStoreError, match="deleted from this column's store alone"):
        open_dataset(tmp_path / "d")
    with pytest.raises(CorruptStoreError, match="cannot be repaired"):
        intake.repair_dataset(tmp_path / "d")


# -- concatenations -------------------------------------------------------------------------------


def test_a_concatenation_of_other_class_maps_is_refused(tmp_path):
    one = folder(tmp_path / "one", {"cat": 1, "dog": 1, "fox": 1}, "a")
    two = folder(tmp_path / "two", {"cat": 1, "dog": 1, "emu": 1}, "b")
    from_image_folder(tmp_path / "d1", one)
    from_image_folder(tmp_path / "d2", two)
    from_image_folder(tmp_path / "d3", folder(tmp_path / "three", {"cat": 2, "dog": 1,
                                                                   "fox": 1}, "c"))
    label = {k: open_dataset(tmp_path / k)["label"] for k in ("d1", "d2", "d3")}  # grouped
    with pytest.raises(DatasetError, match=r"label 2 is 'fox' there and 'emu' here.*"
                       r"append_dataset"):
        ConcatDataset([label["d1"], label["d2"]])
    # A store per column (the older layout): by path and as datasets.
    labelled(tmp_path / "s1", [0, 1, 2], ["cat", "dog", "fox"], group_columns=False)
    labelled(tmp_path / "s2", [0, 1, 2], ["cat", "dog", "emu"], group_columns=False)
    with pytest.raises(DatasetError, match="'emu'"):
        ConcatDataset([tmp_path / "s1" / "label", tmp_path / "s2" / "label"])
    with pytest.raises(DatasetError, match="'emu'"):
        ConcatDataset([DenseDataset(tmp_path / "s1" / "label"),
                       DenseDataset(tmp_path / "s2" / "label")])
    with pytest.raises(DatasetError, match="'emu'"):  # one of each
        ConcatDataset([DenseDataset(tmp_path / "s1" / "label"), label["d2"]])
    same = ConcatDataset([label["d1"], label["d3"]])
    assert same[:].tolist() == [0, 1, 2, 0, 0, 1, 2]
    assert same[np.array([6, 0, 3], np.int64)].tolist() == [2, 0, 0]
    assert same.gather([4, 2]).tolist() == [0, 2]
    mixed = ConcatDataset([label["d1"], tmp_path / "s1" / "label"])  # both layouts, one view
    assert mixed[:].tolist() == [0, 1, 2, 0, 1, 2]
    with pytest.raises(IndexError):
        mixed[np.array([6], np.int64)]
    again = pickle.loads(pickle.dumps(same))
    assert again[:].tolist() == same[:].tolist()
    with DataLoader({"label": same}, batch_size=7, seed=0, num_workers=1) as loader:
        assert sorted(next(iter(loader))["label"].tolist()) == [0, 0, 0, 1, 1, 2, 2]
    from_numpy(tmp_path / "plain", np.array([5, 6]))  # no class names: not compared
    assert len(ConcatDataset([label["d1"], tmp_path / "plain"])) == 5
    # A directory of parts whose parts name other classes is refused the same way.
    labelled(tmp_path / "p", [0, 1, 0, 1], ["a", "b"], rows_per_part=2)
    part = tmp_path / "p" / "parts" / "00001" / "manifest.json"
    body = json.loads(part.read_text())
    body["columns"][0]["extra"]["classes"] = ["b", "a"]
    part.write_text(json.dumps(body))
    with pytest.raises(DatasetError, match="numbers its classes"):
        open_dataset(tmp_path / "p")
    # The fix the error names: one dataset, one numbering.
    intake.append_dataset(tmp_path / "d1", tmp_path / "d2")
    assert check_images(tmp_path / "d1", [one, two]) == ["cat", "dog", "fox", "cat", "dog",
                                                         "emu"]


def test_assemble_refuses_parts_of_other_class_maps(tmp_path):
    from loaderx.intake.joining import assemble, part_path

    labelled(pathlib.Path(part_path(tmp_path / "d", 0)), [0, 1], ["a", "b"])
    labelled(pathlib.Path(part_path(tmp_path / "d", 1)), [0], ["b", "a"])
    with pytest.raises(DatasetError, match="numbers its classes"):
        assemble(tmp_path / "d", 2)
    assert not (tmp_path / "d").exists()


# -- killed at every step -------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import json, os, signal, sys
    from loaderx import _native, from_image_folder, staging
    import loaderx.intake as intake
    stop, mode, action, dst, src = sys.argv[1:6]
    steps = []

    def hook(name):
        steps.append(name)
        if name == stop:
            os.kill(os.getpid(), signal.SIGKILL)

    staging._hook = hook
    if mode == "two-renames":  # a file system without RENAME_EXCHANGE
        def refuse(a, b):
            raise OSError(22, "not supported here")
        _native.rename_exchange = refuse
    if mode.startswith("write:"):  # killed on the n-th record append of the operation
        from loaderx.zrecord import Zrecord
        real, calls = Zrecord.append, [0]

        def append(self, *a, **kw):
            calls[0] += 1
            if calls[0] == int(mode[6:]):
                os.kill(os.getpid(), signal.SIGKILL)
            return real(self, *a, **kw)
        Zrecord.append = append
        # In place (a directory with a commit point): killed with the rows in every store,
        # not yet committed.
        from loaderx.intake import appending
        in_place = appending.Appender.append

        def append_rows(self, *a, **kw):
            out = in_place(self, *a, **kw)
            calls[0] += 1
            if calls[0] == int(mode[6:]):
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        appending.Appender.append = append_rows
    if action == "images":
        from_image_folder(dst, src, append=True, progress=False)
    elif action == "dataset":
        intake.append_dataset(dst, src)
    elif action == "delete":
        intake.delete_rows(dst, [0, 2, 5])
    else:
        intake.delete_rows(dst, [0, 2, 5], keep_order=False)
    print(json.dumps(steps))
""")


def act(action: str, dst: pathlib.Path, src: pathlib.Path) -> None:
    """What the child does, in this process."""
    if action == "images":
        from_image_folder(dst, src, append=True, progress=False)
    elif action == "dataset":
        intake.append_dataset(dst, src)
    else:
        intake.delete_rows(dst, [0, 2, 5], keep_order=action == "delete")


def run_child(stop: str, mode: str, action: str, dst: pathlib.Path,
              src: pathlib.Path) -> tuple[bool, list[str]]:
    r = subprocess.run([sys.executable, "-c", CHILD, stop, mode, action, str(dst), str(src)],
                       capture_output=True, text=True, timeout=HANG)
    if r.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(r.stderr)
    return r.returncode == -signal.SIGKILL, json.loads(r.stdout) if r.returncode == 0 else []


@pytest.fixture(scope="module")
def kill_sources(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("kills")
    first = folder(root / "first", {"cat": 3, "dog": 3}, "a")
    more = folder(root / "more", {"ant": 2, "dog": 1}, "b")
    from_image_folder(root / "more.lx", more)
    return root, first, more


@pytest.mark.parametrize(("action", "mode"), [
    ("images", "exchange"), ("images", "two-renames"), ("images", "write:2"),
    ("dataset", "exchange"), ("dataset", "write:1"),
    ("delete", "exchange"), ("delete", "write:1"),
    ("delete-swap", "exchange"),
])
def test_a_kill_at_any_step_leaves_the_old_dataset_or_the_new_one(tmp_path, kill_sources,
                                                                   action, mode):
    root, first, more = kill_sources
    src = more if action == "images" else root / "more.lx"

    def prepare(path: pathlib.Path) -> dict[str, object]:
        path.parent.mkdir()
        from_image_folder(path, first, progress=False)
        return snapshot(path)

    probe = tmp_path / "probe" / "d"
    old = prepare(probe)
    killed, steps = run_child("-", "exchange" if mode.startswith("write:") else mode, action,
                              probe, src)
    assert not killed and steps
    new = snapshot(probe)
    assert new != old
    if mode.startswith("write:"):
        steps = ["-"]  # killed by the write, not at a step
    seen = set()
    for i, stop in enumerate(steps):
        path = tmp_path / f"k{i}" / "d"
        assert prepare(path) == old
        killed, _ = run_child(stop, mode, action, path, src)
        assert killed, stop
        now = snapshot(path)  # opens: every column of the manifest's length, or refused
        state = "old" if now == old else "new" if now == new else "a mix"
        assert state in ("old", "new"), (stop, now)
        seen.add(state)
        # The next write to the path cleans up what the kill left; done again, the operation
        # gives the new dataset.
        if state == "old":
            act(action, path, src)
        else:
            intake.delete_rows(path, [])
        assert snapshot(path) == new, stop
        assert sorted(os.listdir(path.parent)) == ["d"], (stop, os.listdir(path.parent))
        assert not [n for n in os.listdir(path) if "loaderx-" in n], stop
    if action.startswith("images") or action == "dataset":
        check_images(probe, [first, more])
    want = {"old", "new"} if mode in ("exchange", "two-renames") else {"old"}
    assert seen == want, seen
