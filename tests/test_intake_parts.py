"""Converting on a real local Dask cluster (two worker processes): every partition written by
its own task as one part, the parts joined in partition order, and a worker killed half-way
through writing its part retried without duplicating a row.

Each cluster runs in its own subprocess (a hang guard, and worker processes that cannot
outlive the test)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from frameworks_required import need_installed
from loaderx import errors


@pytest.fixture(autouse=True)
def _engines() -> None:
    need_installed("pyarrow", "dask", "distributed")   # CI installs them (scripts/env.sh)

TIMEOUT = 300

CLUSTER = textwrap.dedent("""
    import os, sys
    import numpy as np
    import pyarrow as pa

    ROWS, PARTS = 12, 5   # rows per partition, partitions

    def table(k):
        ids = np.arange(k * ROWS, (k + 1) * ROWS, dtype=np.int64)
        return pa.table({"id": ids, "x": pa.array([[float(i)] * (i % 4) for i in ids],
                                                  pa.list_(pa.float64())),
                         "name": pa.array([f"row {i}" for i in ids])})

    class Source:
        '''Partition k as an Arrow stream, read batch by batch while the part is written; the
        first attempt at partition 3 kills its worker after two batches.'''

        def __init__(self, k, marker):
            self.k, self.marker = k, marker

        def __arrow_c_stream__(self, requested_schema=None):
            t = table(self.k)
            k, marker = self.k, self.marker

            def batches():
                for n, b in enumerate(t.to_batches(max_chunksize=3)):
                    if k == 3 and n == 2 and not os.path.exists(marker):
                        open(marker, "w").close()
                        os.kill(os.getpid(), 9)      # the worker dies inside write_part
                    yield b

            reader = pa.RecordBatchReader.from_batches(t.schema, batches())
            return reader.__arrow_c_stream__(requested_schema)

    class Collection:
        def __init__(self, marker):
            from dask.delayed import delayed
            self.parts = [delayed(Source, pure=False)(k, marker) for k in range(PARTS)]

        def to_delayed(self):
            return self.parts

    if __name__ == "__main__":
        from distributed import Client, LocalCluster
        from loaderx import open_dataset
        from loaderx.intake.parts import from_dask, parts_dir

        dst, marker = sys.argv[1], sys.argv[2]
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            rows = from_dask(dst, Collection(marker), client=client)
        assert os.path.exists(marker), "the worker was never killed"
        ds = open_dataset(dst)
        want = [table(k) for k in range(PARTS)]
        ids = np.concatenate([w["id"].to_numpy() for w in want])
        assert rows == len(ds["id"]) == len(ids), (rows, len(ds["id"]))
        assert (ds["id"][:] == ids).all()
        xs = [ds["x"][i] for i in range(len(ids))]
        assert all(list(x) == [float(i)] * (i % 4) for x, i in zip(xs, ids))
        assert not os.path.exists(parts_dir(dst))
        assert sorted(os.listdir(os.path.dirname(dst))) == sorted(
            [os.path.basename(dst), os.path.basename(marker)]), os.listdir(os.path.dirname(dst))
        print("ok", rows)
""")


def test_a_local_cluster_converts_parts_and_a_killed_worker_is_retried(tmp_path):
    r = subprocess.run([sys.executable, "-c", CLUSTER, str(tmp_path / "ds"),
                        str(tmp_path / "killed-once")], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
    assert r.stdout.split()[-2:] == ["ok", "60"], r.stdout


def test_assemble_refuses_missing_and_stray_parts(tmp_path):
    import pyarrow as pa

    from loaderx import open_dataset
    from loaderx.intake.parts import assemble, parts_dir, write_part

    dst = tmp_path / "ds"
    for k in (0, 2):
        write_part(dst, k, pa.table({"v": np.arange(k * 10, k * 10 + 10)}))
    with pytest.raises(errors.DatasetError, match="part 00001"):
        assemble(dst, 3)
    with pytest.raises(errors.DatasetError, match="past the 2 parts"):
        assemble(dst, 2)
    write_part(dst, 1, pa.table({"v": np.arange(10, 20)}))
    write_part(dst, 1, pa.table({"v": np.arange(10, 20)}))   # a retry replaces, never adds
    assert assemble(dst, 3) == 30
    assert (open_dataset(dst)["v"][:] == np.arange(30)).all()
    assert not os.path.exists(parts_dir(dst))


def test_parts_with_other_columns_are_refused(tmp_path):
    import pyarrow as pa

    from loaderx.intake.parts import assemble, write_part

    dst = tmp_path / "ds"
    write_part(dst, 0, pa.table({"v": np.arange(3)}))
    write_part(dst, 1, pa.table({"w": np.arange(3)}))
    with pytest.raises(errors.DatasetError, match="other columns"):
        assemble(dst, 2)
    assert not os.path.exists(dst)


def _chunk_inodes(store) -> set[int]:
    return {os.stat(os.path.join(store, n)).st_ino for n in os.listdir(store)
            if n.endswith(".zr") and n[:-3].isdigit()}


def _write_parts(dst, sizes, **options):
    import pyarrow as pa

    from loaderx.intake.parts import write_part

    start = 0
    for k, n in enumerate(sizes):
        ids = np.arange(start, start + n)
        names = pa.array([f"n{i}" for i in ids], pa.string())
        write_part(dst, k, pa.table({"id": ids, "name": names,
                                     "vec": pa.FixedSizeListArray.from_arrays(
                                         pa.array(np.repeat(ids, 4).astype(np.float32)), 4)}),
                   **options)
        start += n
    return start


def _check_rows(dst, n):
    from loaderx import decode_strings, open_dataset

    ds = open_dataset(dst)
    assert len(ds["id"]) == n and (ds["id"][:] == np.arange(n)).all()
    assert decode_strings(ds["name"][np.arange(n)]) == [f"n{i}" for i in range(n)]
    assert (ds["vec"][:] == np.repeat(np.arange(n), 4).reshape(n, 4)).all()


def test_assemble_joins_the_parts_into_one_store_per_column_without_copying(tmp_path):
    from loaderx.intake import read_manifest
    from loaderx.intake.parts import assemble, parts_dir

    dst = tmp_path / "ds"
    n = _write_parts(dst, [40, 0, 25, 300, 1])
    linked = set().union(*(_chunk_inodes(os.path.join(parts_dir(dst), f"{k:05d}", "vec"))
                           for k in range(5)))
    assert assemble(dst, 5) == n
    m = read_manifest(dst)
    assert m.parts == () and m.rows == n     # one store per column, as one conversion writes
    _check_rows(dst, n)
    assert _chunk_inodes(dst / "vec") == linked   # the parts' chunk files, linked in
    assert not os.path.exists(parts_dir(dst))
    from loaderx.verifying import verify
    assert verify(dst)["ok"]


def test_parts_that_cannot_be_joined_are_kept_as_parts(tmp_path, monkeypatch):
    from loaderx.intake import joining, read_manifest
    from loaderx.intake.parts import assemble, write_part

    # Asked not to join.
    n = _write_parts(tmp_path / "a", [10, 20])
    assert assemble(tmp_path / "a", 2, join=False) == n
    assert [p.rows for p in read_manifest(tmp_path / "a").parts] == [10, 20]
    _check_rows(tmp_path / "a", n)
    # A column whose parts chose other codecs.
    import pyarrow as pa
    write_part(tmp_path / "b", 0, pa.table({"v": np.arange(5)}), codec={"v": "raw"})
    write_part(tmp_path / "b", 1, pa.table({"v": np.arange(5, 9)}), codec={"v": "zstd"})
    assert assemble(tmp_path / "b", 2) == 9
    assert len(read_manifest(tmp_path / "b").parts) == 2
    # More rows than one store holds: groups of consecutive parts, each joined.
    monkeypatch.setattr(joining, "MAX_RECORDS", 25)
    n = _write_parts(tmp_path / "d", [10, 10, 10, 10, 3])
    assert assemble(tmp_path / "d", 5) == n
    assert [p.rows for p in read_manifest(tmp_path / "d").parts] == [20, 23]
    _check_rows(tmp_path / "d", n)



def test_parts_past_one_stores_chunks_are_joined_in_groups(tmp_path, monkeypatch):
    """A group of joined parts holds at most one store's chunks (4096; here 3): every part
    brings at least one chunk file."""
    from loaderx.intake import joining, read_manifest
    from loaderx.intake.parts import assemble

    monkeypatch.setattr(joining, "MAX_CHUNKS", 3)
    n = _write_parts(tmp_path / "ds", [5] * 7)
    assert assemble(tmp_path / "ds", 7) == n
    assert [p.rows for p in read_manifest(tmp_path / "ds").parts] == [15, 15, 5]
    _check_rows(tmp_path / "ds", n)


@pytest.mark.parametrize("join", [True, False])
def test_parts_on_another_file_system_are_copied_in(tmp_path, join):
    """``<dst>.parts`` a link to a directory on another file system (as a mount point would
    be): no hard link nor rename reaches the parts, so they are copied beside dst -- holes kept
    -- and joined (or kept as parts) from the copies; the originals go once dst is published."""
    from _other_fs import blocks_of, other_file_system
    from loaderx.intake import read_manifest
    from loaderx.intake.parts import assemble, parts_dir
    from loaderx.verifying import verify

    with other_file_system(tmp_path) as far:
        dst = tmp_path / "ds"
        os.symlink(far, parts_dir(dst))
        n = _write_parts(dst, [40, 0, 25, 300])
        assert assemble(dst, 4, join=join) == n
        _check_rows(dst, n)
        m = read_manifest(dst)
        if join:
            assert m.parts == ()  # one store per column, as on one file system
        else:
            assert [p.rows for p in m.parts] == [40, 0, 25, 300]
        meta = [os.path.join(d, "meta.zr") for d, _, names in os.walk(dst) if "meta.zr" in names]
        assert meta and all(os.path.getsize(f) >= 64 << 20 for f in meta)
        # The copies kept their holes: a store's meta.zr is a large file of a few pages.
        assert all(blocks_of(f) < os.path.getsize(f) // 16 for f in meta)
        # Copies, not links: every chunk file of dst has one name.
        assert all(os.stat(os.path.join(d, f)).st_nlink == 1
                   for d, _, names in os.walk(dst) for f in names)
        assert verify(dst)["ok"]
        assert os.listdir(far) == []  # the parts were removed once dst was published
        assert sorted(os.listdir(tmp_path)) == ["ds", "ds.parts"]  # the link stays, empty


@pytest.mark.parametrize("join", [True, False])
def test_a_part_of_more_rows_than_one_store_holds_counts_as_its_parts(tmp_path, monkeypatch,
                                                                       join):
    """A partition of more rows than one store holds is written as a part with parts of its
    own (as any conversion past 2^24 rows); assembling takes its parts in order. The limit is
    lowered to 30 rows here to keep the data small."""
    from loaderx.intake import directory, joining, read_manifest
    from loaderx.intake.parts import assemble, parts_dir

    monkeypatch.setattr(directory, "MAX_RECORDS", 30)
    monkeypatch.setattr(joining, "MAX_RECORDS", 30)
    n = _write_parts(tmp_path / "ds", [10, 70, 5])
    assert len(read_manifest(os.path.join(parts_dir(tmp_path / "ds"), "00001")).parts) == 3
    assert assemble(tmp_path / "ds", 3, join=join) == n
    _check_rows(tmp_path / "ds", n)
    rows = [p.rows for p in read_manifest(tmp_path / "ds").parts]
    assert rows == ([10, 30, 30, 15] if join else [10, 30, 30, 10, 5])
    assert sorted(os.listdir(tmp_path)) == ["ds"]
