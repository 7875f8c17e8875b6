"""``from_arrow(..., resume=True)``: a conversion of Parquet files, in parts of consecutive
files, that a kill interrupts and a second run finishes -- keeping the parts already done,
rewriting the one in progress, and giving exactly the rows an uninterrupted run gives (pyarrow
as reference). Most tests here make every file a part of its own (``RESUME_PART_BYTES`` 1, the
``one_file_per_part`` fixture); those of batched parts set it themselves."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from loaderx import decode_strings, from_arrow, open_dataset  # noqa: E402
from loaderx.errors import DatasetError, LoaderxTypeError, LoaderxValueError  # noqa: E402
from loaderx.intake import read_manifest  # noqa: E402
from loaderx.intake.joining import parts_dir  # noqa: E402

FILES, ROWS = 5, 300


def _table(k: int, rows: int = ROWS):
    ids = np.arange(k * 1000, k * 1000 + rows)
    return pa.table({"id": ids, "text": [f"file{k}-row{i}" for i in range(rows)],
                     "vec": pa.FixedSizeListArray.from_arrays(
                         pa.array(np.repeat(ids, 3).astype(np.float32)), 3)})


def _files(root: pathlib.Path) -> list[pathlib.Path]:
    root.mkdir(exist_ok=True)
    paths = [root / f"part-{k}.parquet" for k in range(FILES)]
    for k, p in enumerate(paths):
        pq.write_table(_table(k), p, row_group_size=64)
    return paths


@pytest.fixture(autouse=True)
def one_file_per_part(monkeypatch):
    """Every file a part of its own, here and in the killed children (CHILD reads it)."""
    from loaderx.intake import tables

    monkeypatch.setattr(tables, "RESUME_PART_BYTES", 1)
    monkeypatch.setenv("TEST_PART_BYTES", "1")


def _same_rows(dst: pathlib.Path, files: list[pathlib.Path]) -> None:
    want = pa.concat_tables([pq.read_table(f) for f in files])
    ds = open_dataset(dst)
    n = want.num_rows
    assert len(ds["id"]) == n
    assert (ds["id"][:] == want["id"].to_numpy()).all()
    assert decode_strings(ds["text"][np.arange(n)]) == want["text"].to_pylist()
    assert ds["vec"][:].tolist() == want["vec"].to_pylist()


def _chunk_inodes(store: pathlib.Path | str) -> set[int]:
    """The inodes of a store's chunk files: a part joined into the result shares them (its
    chunk files are linked in), a part converted again does not."""
    return {os.stat(os.path.join(store, n)).st_ino for n in os.listdir(store)
            if n.endswith(".zr") and n[:-3].isdigit()}


def test_a_resumable_conversion_equals_reading_the_files(tmp_path):
    files = _files(tmp_path / "in")
    dst = tmp_path / "ds"
    assert from_arrow(dst, str(tmp_path / "in" / "*.parquet"), resume=True) == FILES * ROWS
    _same_rows(dst, files)
    m = read_manifest(dst)
    assert m.parts == () and m.rows == FILES * ROWS  # the parts joined: one store per column
    assert not os.path.exists(parts_dir(dst))
    # The same conversion, finished, run again: nothing rewritten, the same count.
    before = os.stat(dst / "manifest.json").st_ino, _chunk_inodes(dst / "id")
    assert from_arrow(dst, str(tmp_path / "in" / "*.parquet"), resume=True) == FILES * ROWS
    assert (os.stat(dst / "manifest.json").st_ino, _chunk_inodes(dst / "id")) == before
    # Another conversion into it is refused, as without resume.
    with pytest.raises(DatasetError, match="overwrite=True"):
        from_arrow(dst, [str(f) for f in files[:2]], resume=True)
    assert from_arrow(dst, [str(f) for f in files[:2]], resume=True, overwrite=True) == 2 * ROWS
    _same_rows(dst, files[:2])


CHILD = textwrap.dedent("""
    import os, signal, sys
    from loaderx.intake import directory, joining, tables

    src, dst, kill_at = sys.argv[1], sys.argv[2], sys.argv[3]
    if os.environ.get("TEST_MAX_RECORDS"):  # the rows one store holds, lowered
        directory.MAX_RECORDS = joining.MAX_RECORDS = int(os.environ["TEST_MAX_RECORDS"])
    if os.environ.get("TEST_PART_BYTES"):  # the bytes of files a part takes
        tables.RESUME_PART_BYTES = int(os.environ["TEST_PART_BYTES"])
    appends = {"n": 0}
    real = directory.DirectoryWriter.append

    def append(self, columns):  # killed (or paused) at the n-th append of the whole run
        appends["n"] += 1
        if kill_at == f"append:{appends['n']}":
            os.kill(os.getpid(), signal.SIGKILL)
        if kill_at == f"pause:{appends['n']}":  # says so, then waits for a line on stdin
            print("paused", flush=True)
            sys.stdin.readline()
        return real(self, columns)

    def assemble(*args, **kwargs):  # killed once every part is written, before the join
        os.kill(os.getpid(), signal.SIGKILL)

    real_join = joining._join_group

    def join_group(*args, **kwargs):  # killed in the join, its links to the parts made
        real_join(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    directory.DirectoryWriter.append = append
    if kill_at == "assemble":
        tables.assemble_named = assemble
    if kill_at == "join":
        joining._join_group = join_group
    if kill_at == "publish":  # killed with the join complete, before dst is published
        joining.put_in_place = assemble
    if kill_at == "discard":  # killed once dst is published, before the parts are removed
        joining.discard_parts = assemble
    tables.from_arrow(dst, src, resume=True, chunk_bytes=4096)
    print("finished")
""")


def _convert_killed_at(src: str, dst: pathlib.Path, kill_at: str,
                       max_records: int | None = None) -> int:
    env = {**os.environ, "TEST_MAX_RECORDS": str(max_records or "")}
    r = subprocess.run([sys.executable, "-c", CHILD, src, str(dst), kill_at],
                       capture_output=True, text=True, timeout=300, env=env)
    return r.returncode


# 3 appends per file at this chunk_bytes, 15 in all: in part 0, in part 2, in the last part,
# and after every part, before they are joined.
@pytest.mark.parametrize("kill_at", ["append:1", "append:8", "append:15", "assemble"])
def test_a_killed_conversion_resumes_where_it_stopped(tmp_path, kill_at):
    files = _files(tmp_path / "in")
    src = str(tmp_path / "in" / "*.parquet")
    dst = tmp_path / "ds"
    assert _convert_killed_at(src, dst, kill_at) == -signal.SIGKILL
    assert not os.path.exists(dst)  # nothing published before every part is done
    finished = [n for n in sorted(os.listdir(parts_dir(dst))) if n.isdigit()]
    assert len(finished) == {"append:1": 0, "append:8": 2, "append:15": 4,
                             "assemble": 5}[kill_at]
    kept = set().union(*(_chunk_inodes(os.path.join(parts_dir(dst), n, "vec"))
                         for n in finished))
    assert from_arrow(dst, src, resume=True, chunk_bytes=4096) == FILES * ROWS
    _same_rows(dst, files)
    # The parts finished before the kill were kept, not converted again: their chunk files
    # are the joined store's.
    assert kept <= _chunk_inodes(dst / "vec")
    assert len(kept) == len(finished)
    # Nothing left beside the result: no parts directory, no staging.
    assert sorted(os.listdir(tmp_path)) == ["ds", "in"]


def test_a_kill_after_publishing_leaves_parts_the_next_run_removes(tmp_path):
    files = _files(tmp_path / "in")
    src = str(tmp_path / "in" / "*.parquet")
    dst = tmp_path / "ds"
    assert _convert_killed_at(src, dst, "discard") == -signal.SIGKILL
    _same_rows(dst, files)  # published whole
    assert os.path.isdir(parts_dir(dst))
    assert from_arrow(dst, src, resume=True) == FILES * ROWS
    assert sorted(os.listdir(tmp_path)) == ["ds", "in"]
    _same_rows(dst, files)  # its chunk files were linked: removing the parts took nothing


def test_a_file_changed_since_the_interrupted_run_is_converted_again(tmp_path):
    files = _files(tmp_path / "in")
    src = str(tmp_path / "in" / "*.parquet")
    dst = tmp_path / "ds"
    assert _convert_killed_at(src, dst, "append:8") == -signal.SIGKILL
    assert os.path.isdir(os.path.join(parts_dir(dst), "00000"))
    pq.write_table(_table(7, rows=50), files[0])  # file 0 is now another table
    assert from_arrow(dst, src, resume=True) == (FILES - 1) * ROWS + 50
    _same_rows(dst, files)


def test_resume_needs_parquet_files_and_a_bool(tmp_path):
    with pytest.raises(LoaderxValueError, match="Parquet files"):
        from_arrow(tmp_path / "ds", _table(0), resume=True)
    files = _files(tmp_path / "in")
    with pytest.raises(LoaderxTypeError, match="resume"):
        from_arrow(tmp_path / "ds", [str(files[0])], resume="yes")  # type: ignore[arg-type]
    assert not os.path.exists(tmp_path / "ds")


def test_the_cli_resumes_parquet_conversions(tmp_path):
    files = _files(tmp_path / "in")
    dst = tmp_path / "ds"
    cli = [sys.executable, "-m", "loaderx", "convert"]
    glob = str(tmp_path / "in" / "*.parquet")
    for _ in range(2):  # the second run finds the conversion finished
        r = subprocess.run([*cli, glob, str(dst), "--resume"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert f"{FILES * ROWS} rows" in r.stdout
    _same_rows(dst, files)
    np.save(tmp_path / "a.npy", np.arange(3))
    r = subprocess.run([*cli, str(tmp_path / "a.npy"), str(tmp_path / "npy"), "--resume"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--resume is for Parquet" in r.stderr


def test_resume_with_overwrite_replaces_only_a_dataset(tmp_path):
    files = _files(tmp_path / "in")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("not a dataset")
    with pytest.raises(DatasetError, match="replaces only datasets"):
        from_arrow(mine, [str(f) for f in files], resume=True, overwrite=True)
    assert (mine / "thesis.txt").read_text() == "not a dataset"


def test_parts_already_joined_into_a_dataset_are_converted_again(tmp_path):
    """A kill between publishing and removing the parts leaves parts whose chunk files are
    the published dataset's too. Another conversion into dst (here: one more file) converts
    them again rather than joining bytes that now belong to that dataset."""
    from loaderx.intake.joining import shares_chunks

    files = _files(tmp_path / "in")
    src = str(tmp_path / "in" / "*.parquet")
    dst = tmp_path / "ds"
    assert _convert_killed_at(src, dst, "discard") == -signal.SIGKILL
    left = pathlib.Path(parts_dir(dst)) / "00000"
    assert shares_chunks(str(left))
    kept = _chunk_inodes(left / "vec")
    more = tmp_path / "in" / "part-9.parquet"
    pq.write_table(_table(9), more)
    assert from_arrow(dst, src, resume=True, overwrite=True) == (FILES + 1) * ROWS
    _same_rows(dst, [*files, more])
    assert not kept & _chunk_inodes(dst / "vec")


@pytest.mark.parametrize("kill_at", ["join", "publish"])
def test_a_kill_during_the_join_keeps_every_finished_part(tmp_path, kill_at):
    """The join a kill cut short left its staging beside dst, whose stores link the parts'
    chunk files: the next run removes it (its owner is dead) before judging the parts, so it
    joins them as they are instead of converting every one again."""
    files = _files(tmp_path / "in")
    src = str(tmp_path / "in" / "*.parquet")
    dst = tmp_path / "ds"
    assert _convert_killed_at(src, dst, kill_at) == -signal.SIGKILL
    assert not os.path.exists(dst)
    assert any(".ds.loaderx-assemble-" in e for e in os.listdir(tmp_path)), "no join staging"
    finished = [n for n in sorted(os.listdir(parts_dir(dst))) if n.isdigit()]
    assert len(finished) == FILES
    kept = set().union(*(_chunk_inodes(os.path.join(parts_dir(dst), n, "vec"))
                         for n in finished))
    assert from_arrow(dst, src, resume=True, chunk_bytes=4096) == FILES * ROWS
    _same_rows(dst, files)
    assert kept <= _chunk_inodes(dst / "vec"), "finished parts were converted again"
    assert sorted(os.listdir(tmp_path)) == ["ds", "in"]


def test_a_second_run_meanwhile_is_refused_naming_the_first(tmp_path):
    """Two resumable runs into one dst at once: the second is refused before it touches
    anything (StoreBusyError naming the first run's process); the first finishes alone, and
    afterwards only dst is there. Run again, the second finds the conversion finished."""
    from loaderx.errors import StoreBusyError

    files = _files(tmp_path / "in")
    src = str(tmp_path / "in" / "*.parquet")
    dst = tmp_path / "ds"
    first = subprocess.Popen([sys.executable, "-c", CHILD, src, str(dst), "pause:8"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None and first.stdin is not None
        assert first.stdout.readline().strip() == "paused"  # in part 2, holding the parts
        parts = sorted(os.listdir(parts_dir(dst)))
        with pytest.raises(StoreBusyError, match=f"process {first.pid} on"):
            from_arrow(dst, src, resume=True, chunk_bytes=4096)
        assert sorted(os.listdir(parts_dir(dst))) == parts  # the second run touched nothing
        assert not os.path.exists(dst)
        out, err = first.communicate("go\n", timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err[-3000:]
    assert out.split() == ["finished"]
    assert sorted(os.listdir(tmp_path)) == ["ds", "in"]
    _same_rows(dst, files)
    assert from_arrow(dst, src, resume=True) == FILES * ROWS


def test_a_run_killed_holding_the_parts_does_not_block_the_next(tmp_path):
    """The hold is an flock: a run killed while it holds the parts releases it with its
    death, and the next run resumes from what it left."""
    files = _files(tmp_path / "in")
    src = str(tmp_path / "in" / "*.parquet")
    dst = tmp_path / "ds"
    assert _convert_killed_at(src, dst, "append:8") == -signal.SIGKILL
    assert from_arrow(dst, src, resume=True, chunk_bytes=4096) == FILES * ROWS
    _same_rows(dst, files)
    assert sorted(os.listdir(tmp_path)) == ["ds", "in"]


def test_a_file_of_more_rows_than_one_store_holds_is_resumed(tmp_path, monkeypatch):
    """A file of more rows than one store holds (2^24; lowered to 200 here to keep the data
    small) is converted into a part with parts of its own, which the join takes in order --
    not converted in full and then refused. A kill after publishing leaves such parts linked
    into dst: another conversion converts them again rather than joining dst's bytes."""
    from loaderx.intake import directory, joining
    from loaderx.intake.joining import shares_chunks

    monkeypatch.setattr(directory, "MAX_RECORDS", 200)
    monkeypatch.setattr(joining, "MAX_RECORDS", 200)
    files = _files(tmp_path / "in")  # 300 rows each: parts of 200 and 100 rows
    src = str(tmp_path / "in" / "*.parquet")
    dst = tmp_path / "ds"
    assert _convert_killed_at(src, dst, "append:8", max_records=200) == -signal.SIGKILL
    assert from_arrow(dst, src, resume=True, chunk_bytes=4096) == FILES * ROWS
    _same_rows(dst, files)
    assert all(p.rows <= 200 for p in read_manifest(dst).parts)
    assert sorted(os.listdir(tmp_path)) == ["ds", "in"]
    # Killed after publishing: the parts of parts share their chunk files with dst.
    shutil.rmtree(dst)
    assert _convert_killed_at(src, dst, "discard", max_records=200) == -signal.SIGKILL
    left = pathlib.Path(parts_dir(dst)) / "00000"
    assert read_manifest(left).parts and shares_chunks(str(left))
    kept = _chunk_inodes(left / "parts" / "00000" / "vec")
    more = tmp_path / "in" / "part-9.parquet"
    pq.write_table(_table(9), more)
    assert from_arrow(dst, src, resume=True, overwrite=True) == (FILES + 1) * ROWS
    _same_rows(dst, [*files, more])
    assert not kept & set().union(*(_chunk_inodes(os.path.join(d, "vec")) for d, names, _ in
                                    os.walk(dst) if "vec" in names))


def test_parts_on_another_file_system_are_resumed_and_copied_in(tmp_path, monkeypatch):
    """``<dst>.parts`` a link to another file system: the parts a killed run finished there
    are kept (not converted again), then copied beside dst and joined."""
    from _other_fs import other_file_system
    from loaderx.intake import tables

    files = _files(tmp_path / "in")
    src = str(tmp_path / "in" / "*.parquet")
    dst = tmp_path / "ds"
    with other_file_system(tmp_path) as far:
        os.symlink(far, parts_dir(dst))
        assert _convert_killed_at(src, dst, "append:8") == -signal.SIGKILL
        assert sorted(n for n in os.listdir(far) if n.isdigit()) == ["00000", "00001"]
        written = []
        real = tables._write

        def write(part, *args, **kwargs):
            written.append(os.path.basename(part))
            return real(part, *args, **kwargs)

        monkeypatch.setattr(tables, "_write", write)
        assert from_arrow(dst, src, resume=True, chunk_bytes=4096) == FILES * ROWS
        assert written == ["00002", "00003", "00004"]
        _same_rows(dst, files)
        assert read_manifest(dst).parts == ()  # joined, from the copies
        assert os.listdir(far) == []
        assert sorted(os.listdir(tmp_path)) == ["ds", "ds.parts", "in"]


# -- parts of several files (RESUME_PART_BYTES) ---------------------------------------------------


def _two_files_a_part(monkeypatch, files: list[pathlib.Path]) -> int:
    """RESUME_PART_BYTES such that every part takes two files (the last one, file 4, alone):
    parts 00000 (files 0, 1), 00002 (2, 3) and 00004 (4), here and in the killed children."""
    from loaderx.intake import tables

    sizes = [f.stat().st_size for f in files]
    budget = max(a + b for a, b in zip(sizes, sizes[1:], strict=False))
    assert min(a + b + c for a, b, c in zip(sizes, sizes[1:], sizes[2:], strict=False)) > budget
    monkeypatch.setattr(tables, "RESUME_PART_BYTES", budget)
    monkeypatch.setenv("TEST_PART_BYTES", str(budget))
    return budget


def _record(part: str | os.PathLike[str]) -> tuple[int, list[str]]:
    """A part's record: the index of its first file, and the real paths of the files it
    covers (from their fingerprints)."""
    import json

    record = read_manifest(part).extra["resume"]
    return record["first"], [json.loads(fp)[0] for fp in record["files"]]


def _parts_written(monkeypatch) -> list[str]:
    """The names of the parts (or datasets) the conversions in this process write."""
    from loaderx.intake import tables

    written: list[str] = []
    real = tables._write

    def write(dst, *args, **kwargs):
        written.append(os.path.basename(dst))
        return real(dst, *args, **kwargs)

    monkeypatch.setattr(tables, "_write", write)
    return written


# 3 appends per file: part 00000 takes appends 1-6, 00002 7-12, 00004 13-15.
@pytest.mark.parametrize("kill_at, done", [("append:4", []), ("append:10", ["00000"]),
                                           ("append:14", ["00000", "00002"]),
                                           ("assemble", ["00000", "00002", "00004"])])
def test_parts_of_several_files_resume_exactly_after_a_kill(tmp_path, monkeypatch, kill_at,
                                                            done):
    """A part covers consecutive files (as many as RESUME_PART_BYTES takes), its record names
    them; a kill in a part loses that part alone: the next run keeps the finished ones, writes
    the others, and gives exactly the rows of the files."""
    files = _files(tmp_path / "in")
    _two_files_a_part(monkeypatch, files)
    src = str(tmp_path / "in" / "*.parquet")
    dst = tmp_path / "ds"
    assert _convert_killed_at(src, dst, kill_at) == -signal.SIGKILL
    assert not os.path.exists(dst)
    finished = [n for n in sorted(os.listdir(parts_dir(dst))) if n.isdigit()]
    assert finished == done
    for name in finished:
        first, covered = _record(os.path.join(parts_dir(dst), name))
        assert first == int(name)
        assert covered == [os.path.realpath(f) for f in files[first:first + 2]]
    kept = set().union(*(_chunk_inodes(os.path.join(parts_dir(dst), n, "vec"))
                         for n in finished))
    written = _parts_written(monkeypatch)
    assert from_arrow(dst, src, resume=True, chunk_bytes=4096) == FILES * ROWS
    assert written == [n for n in ["00000", "00002", "00004"] if n not in done]
    _same_rows(dst, files)
    assert kept <= _chunk_inodes(dst / "vec")
    assert sorted(os.listdir(tmp_path)) == ["ds", "in"]


def test_a_file_changed_between_runs_is_converted_again_with_its_batch(tmp_path, monkeypatch):
    """File 1 changes after a kill that left parts 00000 (files 0, 1) and 00002 (2, 3): the
    next run converts files 0 and 1 again, as one part, keeps 00002 and writes 00004. It does
    so with a larger RESUME_PART_BYTES too (one that would put every file into one part): a
    new part never reaches into a kept one."""
    from loaderx.intake import tables

    files = _files(tmp_path / "in")
    _two_files_a_part(monkeypatch, files)
    src = str(tmp_path / "in" / "*.parquet")
    dst = tmp_path / "ds"
    assert _convert_killed_at(src, dst, "append:14") == -signal.SIGKILL
    old = {n: _chunk_inodes(os.path.join(parts_dir(dst), n, "vec")) for n in ("00000", "00002")}
    pq.write_table(_table(7, rows=50), files[1])  # file 1 is now another table
    monkeypatch.setattr(tables, "RESUME_PART_BYTES", 1 << 30)
    written = _parts_written(monkeypatch)
    assert from_arrow(dst, src, resume=True, chunk_bytes=4096) == (FILES - 1) * ROWS + 50
    assert written == ["00000", "00004"]
    _same_rows(dst, files)
    joined = _chunk_inodes(dst / "vec")
    # Part 00002 was kept (its chunk files joined as they are). Part 00000 was written again
    # (`written` says so): its old inodes are not compared, since a freed inode number may be
    # given to a new file at once.
    assert old["00002"] <= joined
    assert sorted(os.listdir(tmp_path)) == ["ds", "in"]


def test_files_that_one_part_holds_are_converted_straight_into_dst(tmp_path, monkeypatch):
    """With the default RESUME_PART_BYTES (128 MiB) five small files are one part: they are
    converted straight into dst as one transaction (no part, no join), which a kill leaves
    absent, and which the next run writes whole."""
    from loaderx.intake import joining, tables

    monkeypatch.setattr(tables, "RESUME_PART_BYTES", 128 << 20)
    monkeypatch.delenv("TEST_PART_BYTES")
    files = _files(tmp_path / "in")
    src = str(tmp_path / "in" / "*.parquet")
    dst = tmp_path / "ds"
    assert _convert_killed_at(src, dst, "append:8") == -signal.SIGKILL
    assert not os.path.exists(dst)
    assert [n for n in os.listdir(parts_dir(dst)) if n.isdigit()] == []  # no part written
    written = _parts_written(monkeypatch)
    joins: list[object] = []
    monkeypatch.setattr(joining, "_join_group", lambda *a: joins.append(a))
    assert from_arrow(dst, src, resume=True, chunk_bytes=4096) == FILES * ROWS
    assert written == ["ds"] and joins == []
    _same_rows(dst, files)
    assert read_manifest(dst).parts == ()
    assert sorted(os.listdir(tmp_path)) == ["ds", "in"]
    before = os.stat(dst / "manifest.json").st_ino
    assert from_arrow(dst, src, resume=True) == FILES * ROWS  # finished: nothing written
    assert written == ["ds"] and os.stat(dst / "manifest.json").st_ino == before


def test_parts_an_earlier_run_left_unused_are_removed(tmp_path):
    """Parts of files no longer converted (the list shrank after a kill) are neither joined
    nor refused: the finished ones of the files still there are kept, the others removed
    once dst is published."""
    files = _files(tmp_path / "in")
    src = str(tmp_path / "in" / "*.parquet")
    dst = tmp_path / "ds"
    assert _convert_killed_at(src, dst, "assemble") == -signal.SIGKILL
    kept = _chunk_inodes(os.path.join(parts_dir(dst), "00001", "vec"))
    assert from_arrow(dst, [str(f) for f in files[:3]], resume=True) == 3 * ROWS
    _same_rows(dst, files[:3])
    assert kept <= _chunk_inodes(dst / "vec")
    assert sorted(os.listdir(tmp_path)) == ["ds", "in"]


def test_parts_of_one_file_by_an_earlier_loaderx_are_kept(tmp_path, monkeypatch):
    """A part whose record is one file's fingerprint (as loaderx wrote parts before it
    batched files) covers that file: a run after an upgrade keeps it."""
    from loaderx.intake import tables
    from loaderx.intake.joining import part_path

    files = _files(tmp_path / "in")
    dst = tmp_path / "ds"
    options = tables._Options(None, "zstd", 4096, False, False)
    for k in (0, 1):  # what the earlier loaderx left: parts 00000 and 00001
        part = tables._parquet_source(pa, [str(files[k])], 4096)
        os.makedirs(parts_dir(dst), exist_ok=True)
        tables._write(part_path(dst, k), part, tables._plan(pa, part.schema, None), options,
                      True, {"source": "parquet", "resume": tables._fingerprint(str(files[k]),
                                                                                options)})
    kept = _chunk_inodes(os.path.join(parts_dir(dst), "00001", "vec"))
    monkeypatch.setattr(tables, "RESUME_PART_BYTES", 128 << 20)
    written = _parts_written(monkeypatch)
    assert from_arrow(dst, [str(f) for f in files], resume=True, chunk_bytes=4096) \
        == FILES * ROWS
    assert written == ["00002"]  # files 2-4, one part
    _same_rows(dst, files)
    assert kept <= _chunk_inodes(dst / "vec")
