"""Appends in place to a dataset directory with a commit point (``group_columns=True``): rows
against a NumPy reference model, readers in other processes never disturbed, a kill at every
step of the write path and at random moments leaving the old or the new table with every
acknowledged row, and what an interrupted append leaves trimmed by the next writer."""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from loaderx import DataLoader, from_arrow, open_dataset
from loaderx.errors import DatasetError, StoreBusyError
from loaderx.intake import DirectoryWriter, append_dataset, append_rows, read_manifest
from loaderx.intake.appending import Appender
from loaderx.verifying import verify


def nested(batch: dict[str, object]) -> dict[str, object]:
    """The identity, importable by a spawned worker (a lambda does not pickle)."""
    return batch

HANG = 120  # seconds: a child that takes longer is stuck, not slow


def rows_of(lo: int, hi: int) -> dict[str, object]:
    """Rows ``lo .. hi - 1`` of the reference table: every column a function of the row, so
    any row read shows whether its columns belong together."""
    i = np.arange(lo, hi)
    return {"id": i.astype(np.int64),
            "emb": (i[:, None] * np.array([1.0, -1.0, 0.5], np.float32)).astype(np.float32),
            "flag": (i % 3 == 0),
            "text": [f"row {k} " * (k % 5) for k in range(lo, hi)]}


def check_rows(path: pathlib.Path | str, n: int | None = None) -> int:
    """Asserts every row of the table at ``path`` is the reference's; returns the row count."""
    ds = open_dataset(path)
    count = len(ds["id"]) if n is None else n
    want = rows_of(0, count)
    np.testing.assert_array_equal(ds["id"][:count], want["id"])
    np.testing.assert_array_equal(ds["emb"][:count], want["emb"])
    np.testing.assert_array_equal(ds["flag"][:count], want["flag"])
    assert [bytes(r).decode() for r in ds["text"][:count]] == want["text"]
    return count


def make(path: pathlib.Path, n: int, grouped: bool = True) -> None:
    with DirectoryWriter(path, group_columns=grouped) as w:
        w.add_column("id", "dense", np.int64)
        w.add_column("emb", "dense", np.float32, (3,))
        w.add_column("flag", "dense", np.bool_)
        w.add_column("text", "ragged", np.uint8, extra={"string": True})
        w.append(rows_of(0, n))


def test_appends_of_every_size_match_the_reference(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "t"
    make(dst, 1000)
    block = read_manifest(dst).groups[0].block_rows
    at = 1000
    for n in (1, 2, block - 1, block, 3 * block + 5, 100):
        assert append_rows(dst, rows_of(at, at + n)) == at + n
        at += n
        m = read_manifest(dst)
        assert m.rows == at and len(m.groups[0].tail) == at % block * m.groups[0].row_bytes
        assert check_rows(dst) == at
    assert verify(dst)["ok"]
    with Appender(dst) as a:  # several batches, one commit
        a.append(rows_of(at, at + 10))
        a.append(rows_of(at + 10, at + 11))
    assert check_rows(dst) == at + 11


def test_a_refused_batch_writes_nothing(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "t"
    make(dst, 10)
    bad = rows_of(10, 12)
    bad["emb"] = np.zeros((2, 4), np.float32)
    with pytest.raises(DatasetError, match="emb"):
        append_rows(dst, bad)
    with pytest.raises(DatasetError, match="missing"):
        append_rows(dst, {"id": np.arange(2)})
    assert check_rows(dst) == 10
    assert append_rows(dst, rows_of(10, 12)) == 12


def test_one_writer_at_a_time(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "t"
    make(dst, 10)
    with Appender(dst) as a:
        with pytest.raises(StoreBusyError):
            Appender(dst)
        a.append(rows_of(10, 11))
    assert check_rows(dst) == 11


def test_a_version_1_directory_is_given_a_commit_point(tmp_path: pathlib.Path) -> None:
    """The older layout (a store per column) grows in place too: its first append replaces
    its manifest with the same columns under a generation, then appends as to any other."""
    dst = tmp_path / "v1"
    make(dst, 10, grouped=False)
    assert read_manifest(dst).version == 1
    stores = {p.name: p.stat().st_ino for p in dst.iterdir() if p.is_dir()}
    assert append_rows(dst, rows_of(10, 25)) == 25
    m = read_manifest(dst)
    assert m.version == 2 and m.generation and not m.groups
    assert {p.name: p.stat().st_ino for p in dst.iterdir() if p.is_dir()} == stores
    assert check_rows(dst) == 25
    assert append_rows(dst, rows_of(25, 26)) == 26 and read_manifest(dst).generation == \
        m.generation
    with DirectoryWriter(tmp_path / "parts", rows_per_part=4) as w:  # parts: not in place
        w.add_column("id", "dense", np.int64)
        w.append({"id": np.arange(9)})
    with pytest.raises(DatasetError, match="directory of parts"):
        append_rows(tmp_path / "parts", {"id": np.arange(2)})


@pytest.mark.parametrize("grouped", [True, False])
def test_an_open_dataset_keeps_its_rows_and_a_new_open_sees_more(tmp_path: pathlib.Path,
                                                                 grouped: bool) -> None:
    dst = tmp_path / "t"
    make(dst, 500, grouped)
    before = open_dataset(dst)
    loader = DataLoader(before, batch_size=64, seed=3, transform=lambda b: b)
    it = iter(loader)
    first = [next(it)["id"].copy() for _ in range(3)]
    append_rows(dst, rows_of(500, 900))
    assert len(before["id"]) == len(before["text"]) == 500
    assert before["text"][499] is not None
    with pytest.raises(IndexError):
        before["text"][500]
    with pytest.raises(IndexError):
        before["emb"][700]
    later = [next(it)["id"] for _ in range(20)]
    assert all(int(b.max()) < 500 for b in first + later)  # the loader's table, undisturbed
    loader.close()
    assert check_rows(dst) == 900


READER = textwrap.dedent("""
    import sys
    import numpy as np
    from loaderx import open_dataset
    dst, stop = sys.argv[1:3]
    import os
    seen, errors, opens = set(), [], 0
    print("ready", flush=True)
    while True:
        done = os.path.exists(stop)
        try:
            ds = open_dataset(dst)
            opens += 1
            n = len(ds["id"])
            idx = np.unique(np.r_[0, n - 1, np.random.default_rng(opens).integers(0, n, 64)])
            ids = ds["id"][idx]
            emb = ds["emb"][idx]
            text = [bytes(t).decode() for t in ds["text"][idx]]
            assert (ids == idx).all(), "ids"
            assert (emb[:, 0] == idx).all(), "emb"
            assert text == [f"row {k} " * (k % 5) for k in idx], "text"
            seen.add(n)
            for d in ds.values():
                d.close()
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
        if done:
            break
    print(len(seen), opens, errors[:3], flush=True)
""")


def test_a_reader_in_another_process_never_fails_during_appends(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "t"
    make(dst, 100)
    stop = tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(dst), str(stop)],
                              stdout=subprocess.PIPE, text=True)
    assert reader.stdout is not None
    assert reader.stdout.readline().strip() == "ready"
    at = 100
    for k in range(30):
        n = 1 + (k * 37) % 90
        append_rows(dst, rows_of(at, at + n))
        at += n
    stop.touch()
    out, _ = reader.communicate(timeout=HANG)
    seen, opens, errors = out.strip().split(" ", 2)
    assert errors == "[]", errors
    assert int(opens) >= 1
    assert check_rows(dst) == at


KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[3])
    from test_commit_point import rows_of
    from loaderx import staging
    from loaderx.intake import append_rows
    dst, stop = sys.argv[1:3]

    def hook(name):
        if name == stop:
            os.kill(os.getpid(), signal.SIGKILL)

    staging._hook = hook
    at = int(sys.argv[4])
    for n in map(int, sys.argv[5:]):
        append_rows(dst, rows_of(at, at + n))
        at += n
        print(at, flush=True)
""")


def run_writer(dst: pathlib.Path, stop: str, start: int, sizes: list[int],
               kill_after: float | None = None) -> tuple[int, list[int]]:
    """The writer child: its exit status and the row counts it acknowledged."""
    here = str(pathlib.Path(__file__).parent)
    p = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(dst), stop, here,
                          str(start), *map(str, sizes)], stdout=subprocess.PIPE, text=True)
    if kill_after is not None:
        try:
            p.wait(kill_after)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
    out, _ = p.communicate(timeout=HANG)
    return p.returncode, [int(x) for x in out.split()]


@pytest.mark.parametrize("stop", ["append:trimmed", "append:written", "append:synced",
                                  "append:committed"])
def test_a_kill_at_each_step_leaves_the_old_table_or_the_new(tmp_path: pathlib.Path,
                                                             stop: str) -> None:
    dst = tmp_path / "t"
    make(dst, 300)
    code, acked = run_writer(dst, stop, 300, [250])
    assert code == -signal.SIGKILL and not acked
    rows = check_rows(dst)
    assert rows == (550 if stop == "append:committed" else 300)
    report = verify(dst)  # records past the count are an uncommitted append, not damage
    assert report["ok"], report
    if stop == "append:synced":  # synced: the stores say so; written only: they do not
        assert any(s.get("uncommitted") for c in report["columns"] for s in c["stores"])
    # The next writer trims what the kill left past the count, then appends.
    assert append_rows(dst, rows_of(rows, rows + 40)) == rows + 40
    assert check_rows(dst) == rows + 40
    assert verify(dst)["ok"]


def test_random_kills_keep_every_acknowledged_row(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "t"
    make(dst, 50)
    rng = random.Random(7)
    at = 50
    for _ in range(20):
        sizes = [rng.randint(1, 400) for _ in range(30)]
        code, acked = run_writer(dst, "-", at, sizes, kill_after=rng.uniform(0.05, 0.6))
        rows = check_rows(dst)  # opens, every row's columns together
        if acked:
            assert rows >= acked[-1]  # every acknowledged row is there
        assert rows in [at, *acked] or rows == at + sum(sizes[:len(acked) + 1]), (rows, at)
        at = rows
    assert verify(dst)["ok"]


def test_append_dataset_and_from_arrow_append_in_place(tmp_path: pathlib.Path) -> None:
    pa = pytest.importorskip("pyarrow")
    dst = tmp_path / "t"
    make(dst, 20)
    more = tmp_path / "more"
    with DirectoryWriter(more) as w:  # a version-1 directory of the same columns
        w.add_column("id", "dense", np.int64)
        w.add_column("emb", "dense", np.float32, (3,))
        w.add_column("flag", "dense", np.bool_)
        w.add_column("text", "ragged", np.uint8, extra={"string": True})
        w.append(rows_of(20, 70))
    gen = read_manifest(dst).generation
    assert append_dataset(dst, more) == 70
    assert read_manifest(dst).generation == gen  # an append keeps the dataset's generation
    rows = rows_of(70, 75)
    table = pa.table({"id": rows["id"], "emb": pa.FixedSizeListArray.from_arrays(
        pa.array(np.asarray(rows["emb"]).reshape(-1)), 3), "flag": rows["flag"],
        "text": rows["text"]})
    assert from_arrow(dst, table, append=True) == 75
    assert check_rows(dst) == 75


@pytest.mark.parametrize("grouped", [True, False])
def test_a_worker_process_reads_the_rows_its_loader_was_given(tmp_path: pathlib.Path,
                                                              grouped: bool) -> None:
    """Opened at version 1 (not grouped), the first append gives the directory its
    generation: a worker still takes the rows it was given."""
    dst = tmp_path / "t"
    make(dst, 400, grouped)
    ds = open_dataset(dst)
    got = {}
    for mode in ("thread", "process"):
        with DataLoader(ds, batch_size=50, seed=5, num_workers=2, worker_mode=mode,
                        start_method="spawn" if mode == "process" else None,
                        transform=nested) as loader:
            it = iter(loader)
            batches = [next(it) for _ in range(2)]
            append_rows(dst, rows_of(400 + 100 * len(got), 500 + 100 * len(got)))
            batches += [next(it) for _ in range(8)]
            got[mode] = batches
    for a, b in zip(got["thread"], got["process"], strict=True):
        np.testing.assert_array_equal(a["id"], b["id"])
        np.testing.assert_array_equal(a["emb"], b["emb"])
        assert [bytes(t) for t in a["text"]] == [bytes(t) for t in b["text"]]
        assert int(a["id"].max()) < 400


def test_a_directory_written_again_is_refused_by_a_worker(tmp_path: pathlib.Path) -> None:
    import pickle

    dst = tmp_path / "t"
    make(dst, 30)
    blobs = [pickle.dumps(d) for d in open_dataset(dst).values()]
    make_again = tmp_path / "again"
    make(make_again, 30)
    os.rename(dst, tmp_path / "old")
    os.rename(make_again, dst)
    code = ("import pickle, sys\n"
            "for b in sys.argv[1:]:\n"
            "    try:\n        pickle.loads(bytes.fromhex(b)); print('opened')\n"
            "    except Exception as e:\n        print(type(e).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code, *(b.hex() for b in blobs)],
                         capture_output=True, text=True, check=True, timeout=HANG).stdout
    assert out.split() == ["StoreChangedError"] * 4, out


def test_a_manifest_whose_tail_disagrees_is_refused(tmp_path: pathlib.Path) -> None:
    dst = tmp_path / "t"
    make(dst, 10)
    m = json.loads((dst / "manifest.json").read_text())
    m["rows"] = 11
    (dst / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(Exception, match="tail"):
        open_dataset(dst)
