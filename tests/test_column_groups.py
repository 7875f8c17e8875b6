"""Column groups: fixed-width columns of a dataset directory stored row-major in blocks of one
store (``group_columns=True``). Every column is checked against pyarrow's or NumPy's own
values; loader batches against the same table stored a column per store; the directory
against hostile manifests; and what cannot grow a grouped directory yet refuses it clearly."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest

from loaderx import from_arrow, open_dataset
from loaderx._views.group import GroupColumn, plan_layout
from loaderx.archive import pack, unpack
from loaderx.copying import copy
from loaderx.dataloader import DataLoader
from loaderx.errors import CorruptStoreError, DatasetError, LoaderxValueError, StoreChangedError
from loaderx.intake import DirectoryWriter, append_dataset, delete_rows, repair_dataset
from loaderx.intake.directory import MANIFEST_FILE, read_manifest
from loaderx.verifying import verify

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _click_table(n: int, seed: int = 0) -> pa.Table:
    """A small click log: a 0/1 label, float features, int64 ids, a bool, a fixed-size list
    and a string column (which keeps a store of its own)."""
    rng = np.random.default_rng(seed)
    cols = {"label": pa.array(rng.integers(0, 2, n).astype(np.int8))}
    for i in range(3):
        cols[f"f{i}"] = pa.array(rng.standard_normal(n).astype(np.float32))
    for i in range(4):
        cols[f"c{i}"] = pa.array(rng.zipf(1.3, n).astype(np.int64) % (10 ** (i + 2)))
    cols["flag"] = pa.array(rng.integers(0, 2, n).astype(bool))
    emb = rng.standard_normal((n, 5)).astype(np.float32)
    cols["emb"] = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 5)
    cols["text"] = pa.array([f"row {i}" * (i % 4) for i in range(n)])
    return pa.table(cols)


def _expected(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name).combine_chunks()
    if isinstance(col.type, pa.FixedSizeListType):
        return col.flatten().to_numpy().reshape(len(col), col.type.list_size)
    return col.to_numpy(zero_copy_only=False)


@pytest.fixture
def click(tmp_path: pathlib.Path) -> tuple[pa.Table, pathlib.Path, pathlib.Path]:
    table = _click_table(20_011)
    files = tmp_path / "pq"
    files.mkdir()
    for k, lo in enumerate(range(0, table.num_rows, 7000)):
        pq.write_table(table.slice(lo, 7000), files / f"{k}.parquet")
    grouped, plain = tmp_path / "grouped", tmp_path / "plain"
    assert from_arrow(grouped, str(files / "*.parquet"), group_columns=True) == table.num_rows
    assert from_arrow(plain, str(files / "*.parquet"), group_columns=False) == table.num_rows
    return table, grouped, plain


def test_every_column_reads_back_as_pyarrow_has_it(click: tuple) -> None:
    table, grouped, _ = click
    m = read_manifest(grouped)
    assert len(m.groups) == 1 and m.generation
    fixed = [c.name for c in m.columns if c.group is not None]
    assert fixed == ["label", "f0", "f1", "f2", "c0", "c1", "c2", "c3", "flag", "emb"]
    assert sorted(os.listdir(grouped)) == ["_group_0", MANIFEST_FILE, "text"]
    ds = open_dataset(grouped)
    rng = np.random.default_rng(1)
    idx = rng.integers(0, table.num_rows, 3000)
    for name in fixed:
        want = _expected(table, name)
        assert isinstance(ds[name], GroupColumn)
        np.testing.assert_array_equal(ds[name][:], want, err_msg=name)
        np.testing.assert_array_equal(ds[name][idx], want[idx], err_msg=name)
        np.testing.assert_array_equal(ds[name][-1], want[-1], err_msg=name)
    assert bytes(ds["text"][7]).decode() == table.column("text")[7].as_py()


def test_loader_batches_equal_those_of_a_store_per_column(click: tuple) -> None:
    _, grouped, plain = click
    for workers, mode in ((0, "thread"), (2, "thread"), (2, "process")):
        got = []
        for path in (grouped, plain):
            with DataLoader(open_dataset(path), batch_size=512, seed=7, num_workers=workers,
                            worker_mode=mode, transform=lambda b: b) as loader:
                it = iter(loader)
                got.append([next(it) for _ in range(5)])
        for a, b in zip(*got, strict=True):
            assert a.keys() == b.keys()
            for k in a:
                if k == "text":
                    assert [bytes(x) for x in a[k]] == [bytes(x) for x in b[k]]
                else:
                    np.testing.assert_array_equal(a[k], b[k], err_msg=f"{k} {workers} {mode}")


def test_a_subset_of_columns_and_views_read_right(click: tuple) -> None:
    table, grouped, _ = click
    ds = open_dataset(grouped, columns=["c3", "emb"])
    np.testing.assert_array_equal(ds["c3"][5:9], _expected(table, "c3")[5:9])
    sub = ds["emb"].subset([3, 1, 4])
    np.testing.assert_array_equal(sub[:], _expected(table, "emb")[[3, 1, 4]])
    with DataLoader(ds, batch_size=64, seed=3, transform=lambda b: b) as loader:
        batch = next(iter(loader))
    assert set(batch) == {"c3", "emb"} and batch["emb"].shape == (64, 5)


def test_the_loader_reads_a_group_once_a_batch(click: tuple,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _, grouped, _ = click
    ds = open_dataset(grouped)
    group = ds["label"].column_group
    calls, takes = [], []
    real, take = group.read, GroupColumn.take_field
    monkeypatch.setattr(group, "read", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(GroupColumn, "take_field",
                        lambda self, *a: takes.append(1) or take(self, *a))
    with DataLoader(ds, batch_size=128, seed=3, num_workers=0, transform=lambda b: b) as loader:
        it = iter(loader)
        for _ in range(4):
            next(it)
    # One read a batch built (the loader builds ahead), each giving the group's 10 columns.
    assert len(calls) >= 4 and len(takes) == 10 * len(calls)


def test_many_rows_need_no_parts_and_take_their_raw_bytes(tmp_path: pathlib.Path) -> None:
    n = (1 << 24) + 4096
    values = (np.arange(n) % 251).astype(np.int8)
    dst = tmp_path / "big"
    with DirectoryWriter(dst, group_columns=True) as w:
        w.add_column("x", "dense", np.int8)
        for lo in range(0, n, 1 << 22):
            w.append({"x": values[lo:lo + (1 << 22)]})
    m = read_manifest(dst)
    assert m.rows == n and not m.parts
    x = open_dataset(dst)["x"]
    assert len(x) == n
    idx = np.array([0, 1, n - 4097, (1 << 24) - 1, 1 << 24, n - 1], dtype=np.uint64)
    np.testing.assert_array_equal(x[idx], values[idx])
    used = sum(os.stat(os.path.join(r, f)).st_blocks * 512
               for r, _, fs in os.walk(dst) for f in fs)
    assert used <= 1.3 * n, used / n


def test_rows_past_the_commit_point_are_refused(click: tuple) -> None:
    table, grouped, _ = click
    col = open_dataset(grouped)["label"]
    with pytest.raises(IndexError):
        col[table.num_rows]
    store = col.column_group._natives[0]
    layout = col.column_group.layout
    dst = np.zeros(layout.row_bytes, np.uint8)
    full = table.num_rows // layout.block_rows * layout.block_rows
    store.gather_block_rows(np.array([full - 1], np.uint64), dst, layout.block_rows,
                            layout.row_bytes, full, b"")
    with pytest.raises(IndexError):  # a count of full blocks only: the tail's rows are past it
        store.gather_block_rows(np.array([full], np.uint64), dst, layout.block_rows,
                                layout.row_bytes, full, b"")


def test_a_pickled_column_refuses_a_directory_written_again(click: tuple,
                                                            tmp_path: pathlib.Path) -> None:
    _, grouped, _ = click
    col = open_dataset(grouped)["c1"]
    blob = pickle.dumps(col)
    again = pickle.loads(blob)  # same generation: opens, and shares the reopened group
    np.testing.assert_array_equal(again[:10], col[:10])
    assert pickle.loads(pickle.dumps(open_dataset(grouped)["c2"])).column_group is \
        pickle.loads(pickle.dumps(open_dataset(grouped)["c0"])).column_group
    from_arrow(grouped, _click_table(300, seed=5), group_columns=True, overwrite=True)
    code = ("import pickle, sys\n"
            "try:\n    pickle.loads(sys.stdin.buffer.read())\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True,
                         check=True).stdout.decode()
    assert out.startswith(StoreChangedError.__name__) and "generation" in out, out


def test_what_cannot_change_a_grouped_directory_yet_is_refused_clearly(click: tuple) -> None:
    table, grouped, plain = click
    with pytest.raises(LoaderxValueError, match="resume"):
        from_arrow(grouped, table, group_columns=True, resume=True)
    assert open_dataset(grouped)["label"][:].sum() == _expected(table, "label").sum()


def test_deleting_rows_of_a_grouped_directory_rewrites_it(click: tuple) -> None:
    table, grouped, _ = click
    n = table.num_rows
    gone = [0, 5, n - 1, 7000]
    assert delete_rows(grouped, gone, keep_order=False) == n - 4
    keep = np.setdiff1d(np.arange(n), gone)
    ds = open_dataset(grouped)
    for name in ("label", "c0", "emb"):
        np.testing.assert_array_equal(ds[name][:], _expected(table, name)[keep])
    assert bytes(ds["text"][4]).decode() == table.column("text")[keep[4]].as_py()
    assert repair_dataset(grouped) == {}  # nothing past the commit point
    assert verify(grouped)["ok"]


def test_rows_appended_in_place_read_back(click: tuple) -> None:
    table, grouped, plain = click
    n = table.num_rows
    assert append_dataset(grouped, plain) == 2 * n
    assert from_arrow(grouped, table.slice(0, 77), append=True) == 2 * n + 77
    ds = open_dataset(grouped)
    for name in ("label", "f1", "c3", "emb"):
        want = _expected(table, name)
        np.testing.assert_array_equal(ds[name][:], np.concatenate([want, want, want[:77]]))
    assert bytes(ds["text"][n + 9]).decode() == table.column("text")[9].as_py()
    assert verify(grouped)["ok"]


def test_verify_copy_pack_unpack(click: tuple, tmp_path: pathlib.Path) -> None:
    table, grouped, _ = click
    report = verify(grouped)
    assert report["ok"], report
    names = [c["name"] for c in report["columns"]]
    assert "<column group 0>" in names
    copy(grouped, tmp_path / "copy")
    pack(grouped, tmp_path / "g.tar")
    unpack(tmp_path / "g.tar", tmp_path / "back")
    for where in (tmp_path / "copy", tmp_path / "back"):
        assert verify(where)["ok"]
        np.testing.assert_array_equal(open_dataset(where)["c3"][:], _expected(table, "c3"))


def test_a_damaged_group_store_is_named(click: tuple) -> None:
    _, grouped, _ = click
    chunk = grouped / "_group_0" / "0.zr"
    with open(chunk, "r+b") as f:
        f.truncate(os.path.getsize(chunk) // 2)
    report = verify(grouped)
    assert not report["ok"]
    entry = next(c for c in report["columns"] if c["name"] == "<column group 0>")
    assert entry["damaged"] or entry["problems"] or any(s["problems"] for s in entry["stores"])


def test_parts_with_a_group_read_across_parts(tmp_path: pathlib.Path) -> None:
    n = 5000
    rng = np.random.default_rng(2)
    a = rng.integers(-50, 50, n).astype(np.int16)
    b = rng.standard_normal((n, 3))
    dst = tmp_path / "parts"
    with DirectoryWriter(dst, group_columns=True, rows_per_part=1234) as w:
        w.add_column("a", "dense", np.int16)
        w.add_column("b", "dense", np.float64, (3,))
        w.add_column("t", "ragged", np.uint8)
        w.append({"a": a, "b": b, "t": [bytes([i % 256]) for i in range(n)]})
    m = read_manifest(dst)
    assert len(m.parts) == 5 and m.version == 2
    ds = open_dataset(dst)
    idx = rng.integers(0, n, 800)
    np.testing.assert_array_equal(ds["a"][idx], a[idx])
    np.testing.assert_array_equal(ds["b"][:], b)
    assert verify(dst)["ok"]


def _manifest(path: pathlib.Path) -> dict:
    return json.loads((path / MANIFEST_FILE).read_text())


@pytest.mark.parametrize("damage, needle", [
    (lambda m: m["columns"][1].update(offset=m["groups"][0]["row_bytes"]), "ends at byte"),
    (lambda m: m["columns"][1].update(offset=m["columns"][2]["offset"]), "overlap"),
    (lambda m: m["columns"][1].update(group=3), "names group"),
    (lambda m: m["groups"][0].update(store="../x"), "group"),
    (lambda m: m["groups"][0].update(block_rows=1 << 20), "block"),
    (lambda m: m.update(rows=m["rows"] + 1000), "blocks"),
    (lambda m: m.update(version=3), "version 3"),
])
def test_hostile_manifests_are_refused(click: tuple, damage, needle: str) -> None:
    _, grouped, _ = click
    m = _manifest(grouped)
    damage(m)
    (grouped / MANIFEST_FILE).write_text(json.dumps(m))
    with pytest.raises((CorruptStoreError, DatasetError), match=needle):
        open_dataset(grouped)


def test_the_layout_aligns_every_field() -> None:
    layout, fields = plan_layout([("a", np.dtype(np.int8), ()), ("b", np.dtype(np.int64), ()),
                                  ("c", np.dtype(np.float32), (3,))])
    assert [f.offset for f in fields] == [20, 0, 8]
    assert layout.row_bytes == 24 and layout.block_rows == (64 << 10) // 24


def test_upgrade_rewrites_an_old_directory_in_the_current_layout(
        click: tuple, tmp_path: pathlib.Path) -> None:
    from loaderx.intake.upgrading import upgrade

    table, _, plain = click
    assert read_manifest(plain).version == 1
    r = upgrade(plain)
    assert r["upgraded"] and r["rows"] == table.num_rows and "emb" in r["grouped"]
    m = read_manifest(plain)
    assert m.version == 2 and len(m.groups) == 1 and m.extra.get("source") == "parquet"
    ds = open_dataset(plain)
    for name in ("label", "c2", "emb", "flag"):
        np.testing.assert_array_equal(ds[name][:], _expected(table, name))
    assert [bytes(t).decode() for t in ds["text"][:50]] == table.column("text")[:50].to_pylist()
    assert upgrade(plain)["upgraded"] is False
    assert append_dataset(plain, plain.parent / "grouped") == 2 * table.num_rows  # in place now
    # Parts become one directory, and the command line says what it did.
    parts = tmp_path / "parts"
    with DirectoryWriter(parts, rows_per_part=300) as w:
        w.add_column("x", "dense", np.int32)
        w.append({"x": np.arange(1000, dtype=np.int32)})
    assert len(read_manifest(parts).parts) == 4
    out = subprocess.run([sys.executable, "-m", "loaderx", "upgrade", str(parts)],
                         capture_output=True, text=True, check=True).stdout
    assert "1000 rows rewritten" in out and "x" in out
    assert not read_manifest(parts).parts
    np.testing.assert_array_equal(open_dataset(parts)["x"][:], np.arange(1000))


def test_from_arrow_groups_by_default_and_resume_keeps_a_store_per_column(
        click: tuple, tmp_path: pathlib.Path) -> None:
    table, _, _ = click
    by_default = tmp_path / "default"
    from_arrow(by_default, table.slice(0, 500))
    m = read_manifest(by_default)
    assert m.generation and len(m.groups) == 1
    assert {c.name for c in m.columns if c.group is None} == {"text"}
    assert from_arrow(by_default, table.slice(500, 10), append=True) == 510  # in place
    with pytest.raises(LoaderxValueError, match="resume"):
        from_arrow(tmp_path / "r", table, group_columns=True, resume=True)


def _labelled(path: pathlib.Path, classes: list[str], labels: list[int],
              grouped: bool = True) -> None:
    with DirectoryWriter(path, group_columns=grouped, extra={"source": "parquet"}) as w:
        w.add_column("label", "dense", np.int64, extra={"classes": classes,
                                                         "counts": [labels.count(k) for k in
                                                                    range(len(classes))]})
        w.add_column("x", "dense", np.float32)
        w.append({"label": np.array(labels, np.int64),
                  "x": np.arange(len(labels), dtype=np.float32)})


def test_an_append_in_place_matches_class_names(tmp_path: pathlib.Path) -> None:
    """The rows appended number their classes otherwise ("dog" is 0 there, 1 here) and name
    one more: their labels are renumbered by name, the new class numbered after the others,
    and the manifest's class list and counts change in the same commit -- as the rebuilding
    append of a directory without a commit point does."""
    dst, src = tmp_path / "dst", tmp_path / "src"
    _labelled(dst, ["cat", "dog"], [0, 1, 1])
    _labelled(src, ["dog", "cat", "emu"], [0, 1, 2, 2, -1])
    assert append_dataset(dst, src) == 8
    label = read_manifest(dst).column("label")
    assert label.extra["classes"] == ["cat", "dog", "emu"]
    assert label.extra["counts"] == [2, 3, 2]
    assert open_dataset(dst)["label"][:].tolist() == [0, 1, 1, 1, 0, 2, 2, -1]
    assert open_dataset(dst)["x"][:].tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
    # The same rows appended to a directory without a commit point come out alike.
    old, plain = tmp_path / "old", tmp_path / "plain"
    _labelled(old, ["cat", "dog"], [0, 1, 1], grouped=False)
    _labelled(plain, ["dog", "cat", "emu"], [0, 1, 2, 2, -1], grouped=False)
    assert append_dataset(old, plain) == 8
    assert open_dataset(old)["label"][:].tolist() == [0, 1, 1, 1, 0, 2, 2, -1]
    assert read_manifest(old).column("label").extra == label.extra
    # A label past the appended rows' own class list has no name: refused, nothing written.
    bad = tmp_path / "bad"
    _labelled(bad, ["dog"], [0, 3])
    with pytest.raises(DatasetError, match="no class name"):
        append_dataset(dst, bad)
    assert len(open_dataset(dst)["label"]) == 8


def test_from_arrow_appends_to_a_directory_of_the_old_layout(click: tuple) -> None:
    """A directory of manifest version 1 (a store per column) takes rows converted by
    from_arrow's default (which groups), and a grouped directory's, in place: it keeps a
    store per column, is given a commit point (its manifest alone changes), and a handle
    opened before keeps its rows."""
    table, grouped, plain = click
    n = table.num_rows
    before = open_dataset(plain)
    stores = {p.name: p.stat().st_ino for p in pathlib.Path(plain).iterdir() if p.is_dir()}
    assert from_arrow(plain, table.slice(0, 33), append=True) == n + 33
    m = read_manifest(plain)
    assert not m.groups and m.generation and m.rows == n + 33
    # The same stores, grown (not replaced).
    assert {p.name: p.stat().st_ino for p in pathlib.Path(plain).iterdir() if p.is_dir()} == \
        stores
    np.testing.assert_array_equal(open_dataset(plain)["c3"][n:],
                                  _expected(table, "c3")[:33])
    assert len(before["c3"]) == n and before["c3"][n - 1] == _expected(table, "c3")[n - 1]
    assert from_arrow(plain, table.slice(33, 10), append=True) == n + 43  # in place again
    np.testing.assert_array_equal(open_dataset(plain)["c3"][n + 33:],
                                  _expected(table, "c3")[33:43])
    assert append_dataset(plain, grouped) == 2 * n + 43  # a grouped directory's rows too
    np.testing.assert_array_equal(open_dataset(plain)["emb"][n + 43:], _expected(table, "emb"))
