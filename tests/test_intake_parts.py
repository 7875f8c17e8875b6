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
