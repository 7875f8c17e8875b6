"""verify, copy, pack and unpack of whole dataset directories (loaderx.verifying,
loaderx.copying, loaderx.archive and their commands): round trips of a directory of columns
(from_arrow: dense, ragged and string columns) and of a directory of parts (write_part +
assemble) compared row by row with the pyarrow table they came from; damage and disagreement
with the manifest named by column and path; copies and unpacks killed half-way leaving nothing
and re-run exactly; hostile archives refused without a byte outside the destination."""

from __future__ import annotations

import io
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest

import tarcraft as tc
from loaderx import Zrecord, decode_strings, from_arrow, open_dataset
from loaderx._store import schema as _schema
from loaderx.archive import pack, unpack
from loaderx.copying import copy
from loaderx.errors import CorruptStoreError, DatasetError, StoreChangedError
from loaderx.intake.directory import MANIFEST_FILE, MAX_MANIFEST_BYTES, read_manifest
from loaderx.intake.parts import assemble, write_part
from loaderx.verifying import verify, verify_dataset

pa = pytest.importorskip("pyarrow")

ROWS = 300
PART_ROWS = (120, 100, 80)
META_BYTES = 16 + 16 * 2**24
CLI = [sys.executable, "-m", "loaderx"]
HANG = 300  # seconds: a child past this is hung


def table() -> pa.Table:
    """Dense (int64, a fixed-size float32 list), ragged (int32 lists, empty ones among them)
    and string columns; the text is long enough that zstd is asked for and used."""
    rng = np.random.default_rng(7)
    return pa.table({
        "id": np.arange(ROWS, dtype=np.int64) * 3 - 50,
        "emb": pa.FixedSizeListArray.from_arrays(
            pa.array(rng.normal(size=ROWS * 4).astype(np.float32)), 4),
        "tokens": pa.array([list(range(i % 9)) for i in range(ROWS)], pa.list_(pa.int32())),
        "text": [f"row {i} " * (20 + i % 50) + "é名" for i in range(ROWS)],
    })


def columns_dir(path: pathlib.Path) -> pa.Table:
    """A store per column (manifest version 1): what the damage tests below reach into."""
    t = table()
    from_arrow(path, t, codec={"text": "zstd"}, progress=False, group_columns=False)
    return t


def grouped_dir(path: pathlib.Path) -> pa.Table:
    """from_arrow's default: 'id' and 'emb' in one column group."""
    t = table()
    from_arrow(path, t, codec={"text": "zstd"}, progress=False)
    assert read_manifest(path).groups
    return t


def parts_dir(path: pathlib.Path) -> pa.Table:
    t = table()
    start = 0
    for k, n in enumerate(PART_ROWS):
        write_part(path, k, t.slice(start, n), codec={"text": "zstd"})
        start += n
    assert assemble(path, len(PART_ROWS), join=False) == ROWS
    return t


MAKERS = {"columns": columns_dir, "parts": parts_dir, "grouped": grouped_dir}


def assert_rows(path: os.PathLike[str] | str, t: pa.Table) -> None:
    """Every row of every column of the dataset directory ``path`` against the table."""
    ds = open_dataset(path)
    try:
        assert list(ds) == t.column_names
        idx = np.arange(t.num_rows)
        assert all(len(d) == t.num_rows for d in ds.values())
        np.testing.assert_array_equal(ds["id"][idx], t["id"].to_numpy())
        np.testing.assert_array_equal(ds["emb"][idx], np.array(t["emb"].to_pylist(), np.float32))
        assert [r.tolist() for r in ds["tokens"][idx]] == t["tokens"].to_pylist()
        assert decode_strings(ds["text"][idx]) == t["text"].to_pylist()
    finally:
        for d in ds.values():
            d.close()


def leftovers(parent: pathlib.Path) -> list[str]:
    return sorted(e for e in os.listdir(parent) if ".loaderx-" in e)


def manifests(path: pathlib.Path) -> dict[str, bytes]:
    """Every manifest.json below ``path`` (relative path -> bytes)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob(MANIFEST_FILE))}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=HANG)


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["columns", "parts", "grouped"])
def test_verify_copy_pack_unpack_round_trip(tmp_path: pathlib.Path, kind: str) -> None:
    src = tmp_path / "src"
    t = MAKERS[kind](src)
    (src / "notes.txt").write_text("not the dataset's")  # neither copied nor packed
    report = verify(src)
    assert report["kind"] == "dataset" and report["ok"], report
    own = {c["name"]: c for c in report["columns"] if not c["name"].startswith("<")}
    assert list(own) == t.column_names
    assert all(c["rows"] == ROWS for c in own.values())
    # A grouped column's rows are the group's (300 rows: under one block, all in the tail the
    # manifest keeps); the other columns have a record a row.
    grouped = [n for n, c in own.items() if c.get("group")]
    assert grouped == (["id", "emb"] if kind == "grouped" else [])
    assert all(own[n]["records"] == ROWS for n in own if n not in grouped)
    stores = [s for c in report["columns"] for s in c["stores"]]
    assert len(stores) == (3 if kind == "grouped" else
                           4 * (len(PART_ROWS) if kind == "parts" else 1))
    if kind == "parts":
        assert [s["rows"] for s in report["columns"][0]["stores"]] == list(PART_ROWS)
        assert report["columns"][0]["stores"][1]["part"] == "parts/00001"
    records = (4 - len(grouped)) * ROWS
    assert report["records"] == records

    r = copy(src, tmp_path / "copy")
    assert r["kind"] == "dataset" and r["rows"] == ROWS and r["columns"] == 4
    assert r["verify"]["failed"] == 0 and r["verify"]["records"] == records
    assert_rows(tmp_path / "copy", t)
    assert manifests(tmp_path / "copy") == manifests(src)  # byte for byte
    assert not (tmp_path / "copy" / "notes.txt").exists()
    some_meta = next((tmp_path / "copy").rglob("meta.zr"))
    assert os.stat(some_meta).st_size == META_BYTES
    assert os.stat(some_meta).st_blocks * 512 < 1 << 20, "meta.zr stayed sparse"
    assert verify(tmp_path / "copy")["ok"]

    packed = pack(src, tmp_path / "src.tar.gz")
    assert packed["kind"] == "dataset" and packed["rows"] == ROWS
    assert packed["skipped"] == ["notes.txt"]
    assert packed["archive_bytes"] < 1 << 20  # the tables' holes are not in it
    back = unpack(tmp_path / "src.tar.gz", tmp_path / "back")
    assert back["kind"] == "dataset" and back["records"] == records
    assert back["verify"]["failed"] == 0
    assert_rows(tmp_path / "back", t)
    assert manifests(tmp_path / "back") == manifests(src)
    assert verify(tmp_path / "back")["ok"]
    assert read_manifest(tmp_path / "back") == read_manifest(src)
    assert leftovers(tmp_path) == []


def test_the_archive_layout_is_the_one_format_gives(tmp_path: pathlib.Path) -> None:
    """docs/FORMAT.md: the top folder's table lists manifest.json, the manifest comes next,
    each part's folder and manifest before its stores, each store's folder lists its files."""
    parts_dir(tmp_path / "ds")
    pack(tmp_path / "ds", tmp_path / "ds.tar")
    with tarfile.open(tmp_path / "ds.tar") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names[:5] == ["ds", "ds/manifest.json", "ds/parts", "ds/parts/00000",
                         "ds/parts/00000/manifest.json"]
    tables = {m.name: json.loads(m.pax_headers["comment"]) for m in members if m.isdir()}
    assert tables["ds"] == {"files": {MANIFEST_FILE: os.path.getsize(tmp_path / "ds" /
                                                                     MANIFEST_FILE)},
                            "loaderx-pack": 1}
    assert tables["ds/parts"]["files"] == {}
    assert set(tables["ds/parts/00001/text"]["files"]) == {"meta.zr", "0.zr", "schema.msgpack"}
    assert names.index("ds/parts/00001/manifest.json") < names.index("ds/parts/00001/id")
    assert not any(n.endswith("gen.zr") for n in names)
    assert all("loaderx-pack-crc32" in m.pax_headers["comment"] for m in members if m.isfile())


def test_cli_round_trip_and_json(tmp_path: pathlib.Path) -> None:
    t = parts_dir(tmp_path / "ds")
    v = run("verify", str(tmp_path / "ds"))
    assert v.returncode == 0, v.stderr
    assert "column 'text' (3 of 3 parts): 300 records decoded" in v.stdout
    assert "consistent" not in v.stderr and "every store as the manifest says" in v.stdout
    j = run("verify", str(tmp_path / "ds"), "--json")
    assert j.returncode == 0, j.stderr
    body = json.loads(j.stdout)
    assert body["ok"] and [p["rows"] for p in body["parts"]] == list(PART_ROWS)
    assert body["columns"][2]["stores"][2]["path"] == str(tmp_path / "ds" / "parts" / "00002" /
                                                          "tokens")
    c = run("copy", str(tmp_path / "ds"), str(tmp_path / "copy"))
    assert c.returncode == 0, c.stderr
    assert "a dataset directory of 300 rows in 3 parts" in c.stdout and "holes kept" in c.stdout
    p = run("pack", str(tmp_path / "copy"), str(tmp_path / "ds.tar.xz"))
    assert p.returncode == 0, p.stderr
    u = run("unpack", str(tmp_path / "ds.tar.xz"), str(tmp_path / "back"))
    assert u.returncode == 0, u.stderr
    assert_rows(tmp_path / "back", t)
    again = run("unpack", str(tmp_path / "ds.tar.xz"), str(tmp_path / "back"))
    assert again.returncode == 2 and "exists" in again.stderr, again.stderr
    over = run("unpack", str(tmp_path / "ds.tar.xz"), str(tmp_path / "back"), "--overwrite")
    assert over.returncode == 0, over.stderr
    assert_rows(tmp_path / "back", t)


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar program")
def test_a_tar_sparse_archive_of_a_dataset_directory_unpacks(tmp_path: pathlib.Path) -> None:
    """Made without pack: no tables, no checksums, members in the directory's own order."""
    t = parts_dir(tmp_path / "ds")
    subprocess.run(["tar", "--sparse", "-czf", str(tmp_path / "ds.tgz"), "-C", str(tmp_path),
                    "ds"], check=True, timeout=HANG)
    r = unpack(tmp_path / "ds.tgz", tmp_path / "back")
    assert r["kind"] == "dataset" and r["parts"] == 3
    assert_rows(tmp_path / "back", t)


# -- verify: damage and disagreement, named ------------------------------------------------------


def flip(path: pathlib.Path, at: int, n: int = 16) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        data = f.read(n)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.parametrize("kind", ["columns", "parts"])
def test_damage_in_a_zstd_column_is_named(tmp_path: pathlib.Path, kind: str) -> None:
    ds = tmp_path / "ds"
    MAKERS[kind](ds)
    store = ds / "text" if kind == "columns" else ds / "parts" / "00001" / "text"
    assert read_manifest(store.parent).column("text").codec == "zstd"
    flip(store / "0.zr", os.path.getsize(store / "0.zr") // 2)
    report = verify_dataset(ds)
    damaged = {c["name"]: c["damaged"] for c in report["columns"]}
    assert damaged["text"] > 0 and damaged["id"] == damaged["emb"] == damaged["tokens"] == 0
    assert report["problem_count"] == 0 and not report["ok"]
    bad = [s for c in report["columns"] for s in c["stores"] if s["damaged"]]
    assert [s["path"] for s in bad] == [str(store)]
    assert bad[0]["failures"] and str(store / "0.zr") in bad[0]["failures"][0][1]

    v = run("verify", str(ds))
    assert v.returncode == 1, (v.stdout, v.stderr)  # damaged records: as for a store
    assert "column 'text'" in v.stdout and str(store) in v.stdout
    assert f"damaged in column 'text' ({store})" in v.stderr and "Traceback" not in v.stderr
    if kind == "parts":
        assert "part parts/00001" in v.stdout

    # copy and pack-unpack refuse to carry the damage, naming the column; nothing appears.
    with pytest.raises(CorruptStoreError, match="column 'text'"):
        copy(ds, tmp_path / "copy")
    pack(ds, tmp_path / "ds.tar")  # pack stores bytes as they are: unpack decodes them
    with pytest.raises(CorruptStoreError, match="column 'text'"):
        unpack(tmp_path / "ds.tar", tmp_path / "back")
    assert not (tmp_path / "copy").exists() and not (tmp_path / "back").exists()
    assert leftovers(tmp_path) == []


def test_a_truncated_chunk_file_is_named(tmp_path: pathlib.Path) -> None:
    columns_dir(tmp_path / "ds")
    chunk = tmp_path / "ds" / "tokens" / "0.zr"
    os.truncate(chunk, os.path.getsize(chunk) // 3)
    report = verify_dataset(tmp_path / "ds")
    tokens = report["columns"][2]
    assert tokens["name"] == "tokens" and tokens["damaged"] > 0
    assert sum(c["damaged"] for c in report["columns"]) == tokens["damaged"]
    assert "runs past the end of the file" in tokens["stores"][0]["failures"][0][1]
    v = run("verify", str(tmp_path / "ds"), "--max-listed", "3")
    assert v.returncode == 1
    assert v.stdout.count("  record ") == 3
    assert f"and {tokens['damaged'] - 3} more damaged records" in v.stdout


def rewrite(path: pathlib.Path, change) -> None:  # type: ignore[no-untyped-def]
    body = json.loads((path / MANIFEST_FILE).read_text())
    change(body)
    (path / MANIFEST_FILE).write_text(json.dumps(body))


def test_a_store_with_other_rows_than_the_manifest_is_named(tmp_path: pathlib.Path) -> None:
    ds = tmp_path / "ds"
    columns_dir(ds)
    with Zrecord(ds / "emb") as z:  # one record more in one column (Zrecord.append refuses:
        z._native.append(np.zeros(16, np.uint8), np.zeros(1, np.uint64), None)  # the engine)
    report = verify_dataset(ds)
    problems = {c["name"]: [p for s in c["stores"] for p in s["problems"]]
                for c in report["columns"]}
    assert problems == {"id": [], "emb": ["it holds 301 records; the manifest says 300"],
                        "tokens": [], "text": []}
    v = run("verify", str(ds))
    assert v.returncode == 3, v.stderr  # the directory cannot be used as it is
    assert f"column 'emb' ({ds / 'emb'})" in v.stdout and "the manifest says 300" in v.stdout
    assert "problem(s) with column 'emb'" in v.stderr
    with pytest.raises(CorruptStoreError, match="column 'emb' holds 301"):
        copy(ds, tmp_path / "copy")
    with pytest.raises(CorruptStoreError, match="column 'emb'"):
        pack(ds, tmp_path / "ds.tar")
    assert not (tmp_path / "copy").exists() and not (tmp_path / "ds.tar").exists()


def test_a_manifest_row_count_that_disagrees_is_reported(tmp_path: pathlib.Path) -> None:
    ds = tmp_path / "ds"
    columns_dir(ds)
    rewrite(ds, lambda b: b.update(rows=299))
    report = verify_dataset(ds)
    assert all(s["problems"] == ["it holds 300 records; the manifest says 299"]
               for c in report["columns"] for s in c["stores"])
    assert report["problem_count"] == 4 and report["damaged"] == 0
    assert run("verify", str(ds)).returncode == 3


def test_parts_that_disagree_with_the_manifest_are_reported(tmp_path: pathlib.Path) -> None:
    ds = tmp_path / "ds"
    parts_dir(ds)

    def shift(body: dict) -> None:  # the totals still add up; part 1 and 2 are wrong
        body["parts"][1]["rows"] += 1
        body["parts"][2]["rows"] -= 1

    rewrite(ds, shift)
    report = verify_dataset(ds)
    assert report["problems"] == [
        "parts/00001: the part holds 100 rows; the directory's manifest says 101",
        "parts/00002: the part holds 80 rows; the directory's manifest says 79"]
    ids = report["columns"][0]["stores"]
    assert [s["problems"] for s in ids] == [
        [], ["it holds 100 records; the manifest says 101"],
        ["it holds 80 records; the manifest says 79"]]
    os.unlink(ds / "parts" / "00002" / MANIFEST_FILE)
    report = verify_dataset(ds)
    assert "parts/00002: its manifest cannot be read" in report["problems"][-1]
    assert all(len(c["stores"]) == 2 for c in report["columns"])  # part 2 not checked
    v = run("verify", str(ds))
    assert v.returncode == 3 and "parts/00002: its manifest cannot be read" in v.stdout


def test_a_missing_store_and_a_wrong_dtype_are_named(tmp_path: pathlib.Path) -> None:
    ds = tmp_path / "ds"
    columns_dir(ds)
    shutil.rmtree(ds / "tokens")
    rewrite(ds, lambda b: b["columns"][0].update(dtype="<i4"))
    report = verify_dataset(ds)
    by_name = {c["name"]: c["stores"][0] for c in report["columns"]}
    assert by_name["tokens"]["records"] is None
    assert "the store of column 'tokens' is missing" in by_name["tokens"]["problems"][0]
    assert by_name["id"]["problems"] == ["it holds dense <i8() records; the manifest says "
                                         "dense <i4()"]
    assert by_name["emb"]["problems"] == by_name["text"]["problems"] == []
    v = run("verify", str(ds))
    assert v.returncode == 3
    assert f"column 'tokens' ({ds / 'tokens'}): not checked: the store" in v.stdout


def test_a_manifest_that_cannot_be_read_is_one_line_and_status_3(tmp_path: pathlib.Path) -> None:
    ds = tmp_path / "ds"
    columns_dir(ds)
    rewrite(ds, lambda b: b["columns"][1].update(store="../elsewhere"))
    v = run("verify", str(ds))
    assert v.returncode == 3 and v.stderr.count("\n") == 1 and "CorruptStoreError" in v.stderr
    with pytest.raises(CorruptStoreError, match="not a directory name"):
        copy(ds, tmp_path / "copy")


# -- copy: destinations --------------------------------------------------------------------------


def test_copy_refuses_an_existing_destination_unless_overwrite(tmp_path: pathlib.Path) -> None:
    t = columns_dir(tmp_path / "ds")
    from_arrow(tmp_path / "other", pa.table({"x": [1, 2, 3]}), progress=False)
    with pytest.raises(DatasetError, match="exists"):
        copy(tmp_path / "ds", tmp_path / "other")
    assert list(open_dataset(tmp_path / "other")) == ["x"]
    reader = open_dataset(tmp_path / "other")["x"]
    copy(tmp_path / "ds", tmp_path / "other", overwrite=True)
    assert_rows(tmp_path / "other", t)
    with pytest.raises(StoreChangedError):  # the replaced dataset's readers are told
        reader[np.arange(3)]
    reader.close()
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "mine.txt").write_text("mine")
    with pytest.raises(DatasetError, match="replaces only datasets"):
        copy(tmp_path / "ds", tmp_path / "plain", overwrite=True)
    assert (tmp_path / "plain" / "mine.txt").read_text() == "mine"
    with pytest.raises(DatasetError, match="itself"):
        copy(tmp_path / "ds", tmp_path / "ds", overwrite=True)
    assert leftovers(tmp_path) == []


def test_overwrite_replaces_a_single_store_too(tmp_path: pathlib.Path) -> None:
    """copy and unpack of a store take overwrite=True the same way: the store at dst, or a
    dataset directory there, is swapped for the new one; without it, dst is left alone."""
    from loaderx import DenseDataset, from_numpy

    data = np.arange(40, dtype=np.int32).reshape(10, 4)
    from_numpy(tmp_path / "store", data)
    from_numpy(tmp_path / "dst", np.zeros((3, 2), np.float64))
    with pytest.raises(DatasetError, match="exists"):
        copy(tmp_path / "store", tmp_path / "dst")
    assert copy(tmp_path / "store", tmp_path / "dst", overwrite=True)["kind"] == "store"
    np.testing.assert_array_equal(DenseDataset(tmp_path / "dst")[:], data)
    pack(tmp_path / "store", tmp_path / "store.tar")
    columns_dir(tmp_path / "ds")
    with pytest.raises(DatasetError, match="exists"):
        unpack(tmp_path / "store.tar", tmp_path / "ds")
    assert unpack(tmp_path / "store.tar", tmp_path / "ds", overwrite=True)["kind"] == "store"
    np.testing.assert_array_equal(DenseDataset(tmp_path / "ds")[:], data)
    assert leftovers(tmp_path) == []


def test_copy_refuses_a_store_another_process_writes(tmp_path: pathlib.Path) -> None:
    columns_dir(tmp_path / "ds")
    writer = Zrecord(tmp_path / "ds" / "tokens")
    writer.lock_for_writing()
    try:
        c = run("copy", str(tmp_path / "ds"), str(tmp_path / "copy"))
    finally:
        writer.close()
    assert c.returncode == 4 and "StoreBusyError" in c.stderr, c.stderr
    assert not (tmp_path / "copy").exists() and leftovers(tmp_path) == []


# -- killed half-way: nothing at dst, and a re-run gives the whole ------------------------------

KILLED = textwrap.dedent("""
    import os, signal, sys
    from loaderx import staging
    from loaderx._archives import archive, copying  # where the patched names are looked up
    what, src, dst, kill_at = sys.argv[1:5]
    calls = [0]

    def die_on_the(n, real):
        def wrapped(*args, **kwargs):
            calls[0] += 1
            if calls[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        return wrapped

    if kill_at.startswith("step:"):  # a step of the publication (loaderx.staging)
        step = kill_at[5:]
        staging._hook = lambda name: name == step and os.kill(os.getpid(), signal.SIGKILL)
    elif what == "copy":  # the n-th store copied
        copying.copy_files = die_on_the(int(kill_at), copying.copy_files)
    else:  # the n-th file unpacked
        archive._write_member = die_on_the(int(kill_at), archive._write_member)
    if what == "copy":
        copying.copy(src, dst, overwrite=os.path.exists(dst))
    else:
        archive.unpack(src, dst, overwrite=os.path.exists(dst))
    print("not killed")
""")


def killed(*args: object) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLED, *map(str, args)], capture_output=True,
                          text=True, timeout=HANG)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)


@pytest.mark.parametrize("kill_at", ["5", "step:publish"])
def test_a_killed_copy_leaves_nothing_and_runs_again(tmp_path: pathlib.Path,
                                                     kill_at: str) -> None:
    t = parts_dir(tmp_path / "ds")
    killed("copy", tmp_path / "ds", tmp_path / "copy", kill_at)
    assert not os.path.lexists(tmp_path / "copy")
    assert leftovers(tmp_path), "the kill left its private staging directory"
    copy(tmp_path / "ds", tmp_path / "copy")  # clears what the kill left, then copies
    assert leftovers(tmp_path) == []
    assert_rows(tmp_path / "copy", t)


@pytest.mark.parametrize("kill_at", ["7", "step:publish"])
def test_a_killed_unpack_leaves_nothing_and_runs_again(tmp_path: pathlib.Path,
                                                       kill_at: str) -> None:
    t = columns_dir(tmp_path / "ds")
    pack(tmp_path / "ds", tmp_path / "ds.tar.gz")
    killed("unpack", tmp_path / "ds.tar.gz", tmp_path / "back", kill_at)
    assert not os.path.lexists(tmp_path / "back")
    assert leftovers(tmp_path)
    unpack(tmp_path / "ds.tar.gz", tmp_path / "back")
    assert leftovers(tmp_path) == []
    assert_rows(tmp_path / "back", t)


def test_a_killed_overwrite_leaves_the_old_dataset_whole(tmp_path: pathlib.Path) -> None:
    t = columns_dir(tmp_path / "ds")
    old = pa.table({"x": np.arange(5)})
    from_arrow(tmp_path / "dst", old, progress=False)
    killed("copy", tmp_path / "ds", tmp_path / "dst", "step:exchange")
    assert open_dataset(tmp_path / "dst")["x"][np.arange(5)].tolist() == list(range(5))
    copy(tmp_path / "ds", tmp_path / "dst", overwrite=True)
    assert_rows(tmp_path / "dst", t)
    assert leftovers(tmp_path) == []


# -- hostile archives ------------------------------------------------------------------------


def manifest_bytes(columns: list[dict], rows: int = 0, parts: list[dict] | None = None) -> bytes:
    body: dict = {"format": "loaderx-dataset", "version": 1, "rows": rows, "columns": columns}
    if parts is not None:
        body["parts"] = parts
    return json.dumps(body).encode()


COLUMN = {"name": "x", "store": "x", "kind": "dense", "dtype": "<i8", "item_shape": [],
          "codec": "raw"}
GOOD_MANIFEST = manifest_bytes([COLUMN])


def empty_store(folder: str) -> bytes:
    """The members of an empty dense int64 store in ``folder``, as another program writes
    them (no tables, no checksums)."""
    schema = _schema.Schema("dense", np.dtype("<i8"), (), "raw").to_bytes()
    return tc.meta_member(folder) + tc.member(f"{folder}/schema.msgpack", schema)


def refused(tmp_path: pathlib.Path, blob: bytes, needle: str) -> CorruptStoreError:
    """``blob`` as an archive is refused as corrupt, naming it, and leaves nothing anywhere:
    not in the destination's directory, not beside it, not outside it."""
    archive = tmp_path / "hostile.tar"
    archive.write_bytes(blob)
    (tmp_path / "work").mkdir(exist_ok=True)
    (tmp_path / "victim").mkdir(exist_ok=True)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(CorruptStoreError) as e:
        unpack(archive, tmp_path / "work" / "dst")
    assert needle in str(e.value), str(e.value)
    assert str(archive) in str(e.value)
    assert os.listdir(tmp_path / "work") == [] and os.listdir(tmp_path / "victim") == []
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    return e.value


def test_a_crafted_archive_of_a_valid_dataset_directory_unpacks(tmp_path: pathlib.Path) -> None:
    """The hostile cases below are refused for what they change, not for being hand-made."""
    blob = (tc.folder("ds") + tc.member("ds/manifest.json", GOOD_MANIFEST)
            + empty_store("ds/x") + tc.end())
    (tmp_path / "ok.tar").write_bytes(blob)
    r = unpack(tmp_path / "ok.tar", tmp_path / "dst")
    assert r["kind"] == "dataset" and r["rows"] == 0
    assert list(open_dataset(tmp_path / "dst")) == ["x"]


@pytest.mark.parametrize("member, needle", [
    ("ds/../victim/meta.zr", "not a store file"),
    ("ds/x/../../victim/meta.zr", "not a store file"),
    ("ds/parts/00000/../../../victim/meta.zr", "not a store file"),
    ("/victim/manifest.json", "not a store file"),
    ("ds/.hidden/meta.zr", "not a store file"),
    ("ds/parts/0/x/meta.zr", "not a store file"),
    ("ds/parts/00000/parts/00001/manifest.json", "not a store file"),
    ("ds/x/sub/meta.zr", "not a store file"),
    ("ds/x/manifest.json", "not a store file"),
    ("ds/run.sh", "not a store file"),
    ("other/x/meta.zr", "not a store file"),
])
def test_path_tricks_are_refused(tmp_path: pathlib.Path, member: str, needle: str) -> None:
    blob = tc.member("ds/manifest.json", GOOD_MANIFEST) + tc.member(member, b"x") + tc.end()
    refused(tmp_path, blob, needle)


@pytest.mark.parametrize("typeflag", [b"1", b"2", b"3", b"6"])
def test_links_and_devices_are_refused(tmp_path: pathlib.Path, typeflag: bytes) -> None:
    blob = (tc.member("ds/manifest.json", GOOD_MANIFEST)
            + tc.header("ds/x/meta.zr", 0, typeflag) + tc.end())
    refused(tmp_path, blob, "not a store file")


def test_a_link_folder_is_refused(tmp_path: pathlib.Path) -> None:
    with tarfile.open(tmp_path / "link.tar", "w") as tar:
        info = tarfile.TarInfo("ds/manifest.json")
        info.size = len(GOOD_MANIFEST)
        tar.addfile(info, io.BytesIO(GOOD_MANIFEST))
        link = tarfile.TarInfo("ds/x")
        link.type, link.linkname = tarfile.SYMTYPE, str(tmp_path / "victim")
        tar.addfile(link)
    refused(tmp_path, (tmp_path / "link.tar").read_bytes(), "not a store file")


@pytest.mark.parametrize("store, needle", [
    ("../victim", "not a directory name"),
    ("/abs", "not a directory name"),
    ("parts", "not a directory name"),
    ("x/../../victim", "not a directory name"),
])
def test_a_manifest_naming_paths_outside_is_refused(tmp_path: pathlib.Path, store: str,
                                                    needle: str) -> None:
    bad = manifest_bytes([{**COLUMN, "store": store}])
    blob = tc.member("ds/manifest.json", bad) + empty_store("ds/x") + tc.end()
    refused(tmp_path, blob, needle)


def test_a_manifest_naming_parts_outside_is_refused(tmp_path: pathlib.Path) -> None:
    bad = manifest_bytes([{k: v for k, v in COLUMN.items() if k != "store"}], 0,
                         [{"path": "../../victim", "rows": 0}])
    blob = tc.member("ds/manifest.json", bad) + tc.end()
    refused(tmp_path, blob, "is not {'path': 'parts/NNNNN'")


def test_an_oversize_manifest_is_refused_before_it_is_read(tmp_path: pathlib.Path) -> None:
    # The header claims 17 MiB and nothing follows: refused at the header, no body read.
    blob = tc.folder("ds") + tc.header("ds/manifest.json", MAX_MANIFEST_BYTES + 1)
    refused(tmp_path, blob, f"at most {MAX_MANIFEST_BYTES} bytes")


def test_a_manifest_that_is_not_json_is_refused(tmp_path: pathlib.Path) -> None:
    blob = tc.member("ds/manifest.json", b"{not json") + empty_store("ds/x") + tc.end()
    refused(tmp_path, blob, "not valid JSON")


@pytest.mark.parametrize("case, needle", [
    ("a store the manifest does not name", "do not name"),
    ("the store the manifest names is lost", "lacks ds/x"),
    ("a store folder without meta.zr", "holds no meta.zr"),
    ("parts in a directory of columns", "do not name"),
    ("no manifest in the top folder", "holds no manifest.json"),
    ("a part its manifest names is lost", "not whole or not valid"),
])
def test_an_archive_that_is_not_what_its_manifests_say_is_refused(
        tmp_path: pathlib.Path, case: str, needle: str) -> None:
    schema = tc.member("ds/x/schema.msgpack", b"\x80")
    cases = {
        "a store the manifest does not name":
            tc.member("ds/manifest.json", GOOD_MANIFEST) + empty_store("ds/x")
            + empty_store("ds/y"),
        "the store the manifest names is lost": tc.member("ds/manifest.json", GOOD_MANIFEST),
        "a store folder without meta.zr":
            tc.member("ds/manifest.json", GOOD_MANIFEST) + schema,
        "parts in a directory of columns":
            tc.member("ds/manifest.json", GOOD_MANIFEST) + empty_store("ds/x")
            + tc.member("ds/parts/00000/manifest.json", GOOD_MANIFEST)
            + empty_store("ds/parts/00000/x"),
        "no manifest in the top folder":
            empty_store("ds/x") + tc.member("ds/parts/00000/manifest.json", GOOD_MANIFEST),
        "a part its manifest names is lost":
            tc.member("ds/manifest.json", manifest_bytes(
                [{k: v for k, v in COLUMN.items() if k != "store"}], 0,
                [{"path": "parts/00000", "rows": 0}])),
    }
    refused(tmp_path, cases[case] + tc.end(), needle)


def test_what_a_packed_archive_lost_is_seen(tmp_path: pathlib.Path) -> None:
    """pack's tables: a store's file cut out, or a whole store, is refused by name."""
    columns_dir(tmp_path / "ds")
    pack(tmp_path / "ds", tmp_path / "ds.tar")
    with tarfile.open(tmp_path / "ds.tar") as tar:
        members = tar.getmembers()
        spans = {m.name: (m.offset, m.offset_data + -(-m.size // 512) * 512) for m in members}
    whole = (tmp_path / "ds.tar").read_bytes()

    def without(*names: str) -> bytes:
        out, at = b"", 0
        for start, end in sorted(spans[n] for n in names):
            out += whole[at:start]
            at = end
        return out + whole[at:]

    refused(tmp_path, without("ds/tokens/schema.msgpack"), "lacks tokens/schema.msgpack")
    store = [n for n in spans if n.startswith("ds/emb")]
    refused(tmp_path, without(*store), "lacks ds/emb")
    refused(tmp_path, without("ds"), "not their manifest")


def folder_with_table(name: str, files: dict[str, int]) -> bytes:
    """A folder member whose pax comment is pack's table of its files."""
    table = json.dumps({"files": files, "loaderx-pack": 1}, separators=(",", ":"))
    return tc.pax([("comment", table)]) + tc.folder(name)


def test_an_archive_cannot_say_one_kind_and_hold_the_other(tmp_path: pathlib.Path) -> None:
    says_store = folder_with_table("ds", {"meta.zr": tc.TABLE_BYTES})
    refused(tmp_path, says_store + tc.member("ds/manifest.json", GOOD_MANIFEST)
            + empty_store("ds/x") + tc.end(), "not a store file")
    says_dataset = folder_with_table("ds", {MANIFEST_FILE: len(GOOD_MANIFEST)})
    refused(tmp_path, says_dataset + tc.meta_member("ds") + tc.end(), "not a store file")
    says_both = folder_with_table("ds", {"meta.zr": tc.TABLE_BYTES, MANIFEST_FILE: 10})
    refused(tmp_path, says_both + tc.meta_member("ds") + tc.end(),
            "lists manifest.json, which cannot be in that folder")


def test_a_dataset_archive_is_read_within_bounds_of_its_own(tmp_path: pathlib.Path) -> None:
    """More headers than one store's archive may have (4 x 4104) are a dataset directory's
    due once it shows it is one; before that, the store's bound holds."""
    many = b"".join(tc.pax([("comment", "x")], b"g") for _ in range(17_000))
    dataset = tc.member("ds/manifest.json", GOOD_MANIFEST) + many + empty_store("ds/x")
    (tmp_path / "many.tar").write_bytes(dataset + tc.end())
    assert unpack(tmp_path / "many.tar", tmp_path / "dst")["kind"] == "dataset"
    refused(tmp_path, many + tc.member("ds/manifest.json", GOOD_MANIFEST) + empty_store("ds/x")
            + tc.end(), "headers")


def test_a_damaged_store_copied_over_another_leaves_that_one_whole(
        tmp_path: pathlib.Path) -> None:
    """copy(..., overwrite=True) checks the copy before it takes dst's place."""
    from loaderx.converter import from_numpy

    good = np.arange(64, dtype=np.int64).reshape(16, 4)
    from_numpy(tmp_path / "good", good, codec="raw")
    from_numpy(tmp_path / "bad", good + 1, codec="raw", checksums=True)
    chunk = tmp_path / "bad" / "0.zr"
    data = bytearray(chunk.read_bytes())
    data[10] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="does not verify"):
        copy(tmp_path / "bad", tmp_path / "good", overwrite=True)
    with Zrecord(tmp_path / "good") as z:
        assert len(z) == 16
    from loaderx.dataset import DenseDataset
    with DenseDataset(tmp_path / "good") as ds:
        assert (ds[:] == good).all()


def test_a_part_that_is_a_link_is_refused(tmp_path: pathlib.Path) -> None:
    """A directory of parts whose parts/00000 links elsewhere is not read, copied or packed."""
    import pyarrow as pa

    from loaderx.verifying import verify

    dst = tmp_path / "ds"
    for k in range(2):
        write_part(dst, k, pa.table({"v": np.arange(k * 4, k * 4 + 4)}))
    assemble(dst, 2, join=False)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(dst / "parts" / "00000"), elsewhere)
    os.symlink(elsewhere, dst / "parts" / "00000")
    for action in (lambda: open_dataset(dst), lambda: copy(dst, tmp_path / "copy"),
                   lambda: pack(dst, tmp_path / "ds.tar")):
        with pytest.raises(CorruptStoreError, match="symbolic link"):
            action()
    assert not verify(dst)["ok"]
    assert not os.path.exists(tmp_path / "copy") and not os.path.exists(tmp_path / "ds.tar")


def test_folder_tables_listing_more_files_than_an_archive_holds_are_refused(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every folder's table is kept until the end of unpack: together they are bounded (here
    at 5 files) by what an archive may hold, so small folders cannot claim unbounded memory."""
    import loaderx._archives.archive as archive  # where _MAX_LISTED is looked up

    src = tmp_path / "src"
    from_arrow(src, table())
    pack(src, tmp_path / "ds.tar")
    monkeypatch.setattr(archive, "_MAX_LISTED", 5)
    with pytest.raises(CorruptStoreError, match="list more than 5 files"):
        unpack(tmp_path / "ds.tar", tmp_path / "out")
    assert not os.path.exists(tmp_path / "out")
