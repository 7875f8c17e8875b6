"""``from_arrow(..., resume=True)``: a conversion of Parquet files, one part per file, that a
kill interrupts and a second run finishes -- keeping the parts already done, rewriting the one
in progress, and giving exactly the rows an uninterrupted run gives (pyarrow as reference)."""

from __future__ import annotations

import os
import pathlib
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
    appends = {"n": 0}
    real = directory.DirectoryWriter.append

    def append(self, columns):  # killed at the n-th append of the whole run
        appends["n"] += 1
        if kill_at == f"append:{appends['n']}":
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, columns)

    def assemble(*args, **kwargs):  # killed once every part is written, before the join
        os.kill(os.getpid(), signal.SIGKILL)

    directory.DirectoryWriter.append = append
    if kill_at == "assemble":
        tables.assemble = assemble
    if kill_at == "discard":  # killed once dst is published, before the parts are removed
        joining.discard_parts = assemble
    tables.from_arrow(dst, src, resume=True, chunk_bytes=4096)
    print("finished")
""")


def _convert_killed_at(src: str, dst: pathlib.Path, kill_at: str) -> int:
    r = subprocess.run([sys.executable, "-c", CHILD, src, str(dst), kill_at],
                       capture_output=True, text=True, timeout=300)
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
