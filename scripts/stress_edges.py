"""Heavy loops over issue 19's critical and high findings, for ``scripts/stress.py --only
edges``: the suite runs each scenario a few times, this runs it many.

* ``overwrite_kill_loop``: a child replaces one dataset with ``from_numpy(...,
  overwrite=True)`` over and over (half the rounds through the two-rename fallback, as on a file
  system without ``RENAME_EXCHANGE``) and is killed at a random moment; the path must hold one
  generation whole, and the next conversion must leave nothing else beside it.
* ``fork_exit_loop``: children forked while a parent thread is inside a native append exit
  normally (their exit hook must not wait for the parent's call).
* ``prefetch_resume_loop``: checkpoints taken through a prefetcher of every size resume at the
  first batch the loop never trained.
* ``sharded_pass_loop``: padded passes over random lengths, batch sizes and shard counts give
  every shard the same shapes, and the shards' real rows are the whole pass once.
* ``resume_kill_loop``: resumable Parquet conversions (``from_arrow(..., resume=True)``,
  parts joined) SIGKILLed at a random step -- an append, a staging step (a part or ``dst``
  published), the join, a copy of a part from another file system, the removal of the parts --
  once or several times in a row; the next run must give exactly the files' rows, convert again
  no part an earlier run finished, and leave nothing but ``dst``. Rounds vary the files, the
  files a part takes (``RESUME_PART_BYTES``: one, a few, or all of them, converted straight
  into ``dst``), the rows one store holds (lowered, for parts of parts) and where the parts are
  (``<dst>.parts`` a link to another file system, when there is one).
  ``python scripts/stress_edges.py [--rounds N] [--seconds S] [--seed S]`` runs it alone
  (default: 4 rounds, about 20 s).
"""

from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np

OVERWRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from loaderx import _native
    from loaderx.converter import from_numpy
    path, first, fallback = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    if fallback:
        def refuse(a, b):
            raise OSError(22, "not supported on this file system")
        _native.rename_exchange = refuse
    print("ready", flush=True)
    g = first
    while True:
        n = 50 + g % 97
        from_numpy(path, np.full((n, 3), g, np.int64), overwrite=True, chunk_bytes=400,
                   progress=False)
        g += 1
""")


def _generation(path: pathlib.Path) -> int:
    """The one generation the dataset at ``path`` holds, whole (else an AssertionError)."""
    from loaderx.dataset import DenseDataset
    with DenseDataset(path) as ds:
        data = ds[:]
    g = int(data[0, 0])
    assert data.shape == (50 + g % 97, 3) and (data == g).all(), f"generation {g} is not whole"
    return g


def _leftovers(path: pathlib.Path) -> list[str]:
    return [e for e in os.listdir(path.parent) if e != path.name and path.name in e]


def overwrite_kill_loop(tmp: str, kills: int, seed: int) -> dict[str, int]:
    from loaderx.converter import from_numpy
    rng = random.Random(seed)
    path = pathlib.Path(tmp) / "ds"
    from_numpy(path, np.full((50, 3), 0, np.int64), progress=False)
    seen: set[int] = set()
    first = 1
    for i in range(kills):
        child = subprocess.Popen([sys.executable, "-c", OVERWRITER, str(path), str(first),
                                  str(i % 2)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.4))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        g = _generation(path)
        seen.add(g)
        first = g + 1000  # the next child's generations are new ones
        from_numpy(path, np.full((50 + first % 97, 3), first, np.int64), overwrite=True,
                   progress=False)
        assert _generation(path) == first
        assert _leftovers(path) == [], _leftovers(path)
        first += 1
    return {"kills": kills, "distinct_generations_found": len(seen)}


def fork_exit_loop(tmp: str, caught: int, tests_dir: pathlib.Path) -> dict[str, int]:
    """The suite's scenario (tests/test_engine_edges.py), catching ``caught`` forks."""
    sys.path.insert(0, str(tests_dir))
    from test_engine_edges import FORK_AT_EXIT
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(tests_dir), os.environ.get("PYTHONPATH", "")) if p)}
    r = subprocess.run([sys.executable, "-c", FORK_AT_EXIT, f"{tmp}/fork", str(caught)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    _, got, _, forks = r.stdout.split()  # "caught N of M"
    return {"forks": int(forks), "inside_a_native_call": int(got), "hung": 0}


def prefetch_resume_loop(tmp: str, rounds: int, seed: int) -> dict[str, int]:
    from loaderx import DataLoader, DenseDataset, from_numpy
    from loaderx.prefetch import Prefetcher
    rng = random.Random(seed)
    from_numpy(f"{tmp}/pf", np.arange(997, dtype=np.int64), progress=False)
    streams = {"x": DenseDataset(f"{tmp}/pf")}
    for _ in range(rounds):
        size, trained, bs = rng.randint(1, 6), rng.randint(0, 40), rng.randint(1, 64)
        with DataLoader(streams, batch_size=bs, seed=seed, num_workers=rng.randint(0, 3)) as ld:
            expected = [next(ld)["x"].copy() for _ in range(trained + 1)][trained]
        with DataLoader(streams, batch_size=bs, seed=seed, num_workers=2) as ld:
            batches = Prefetcher(ld, lambda b: b, size)
            for _ in range(trained):
                next(batches)
            state = ld.state_dict()
            assert state == batches.state_dict()
        with DataLoader(streams, batch_size=bs, seed=seed, num_workers=1) as resumed:
            resumed.load_state_dict(state)
            assert (next(resumed)["x"] == expected).all(), (size, trained, bs)
    return {"rounds": rounds}


def sharded_pass_loop(tmp: str, rounds: int, seed: int) -> dict[str, int]:
    from loaderx import DataLoader, DenseDataset, from_numpy
    rng = random.Random(seed)
    checked = 0
    for r in range(rounds):
        n = rng.randint(1, 500)
        from_numpy(f"{tmp}/sp{r}", np.arange(n, dtype=np.int64), progress=False)
        streams = {"x": DenseDataset(f"{tmp}/sp{r}")}
        count = rng.randint(1, 5)
        bs = count * rng.randint(1, 40)
        rows: list[np.ndarray] = []
        shapes = set()
        for i in range(count):
            with DataLoader(streams, batch_size=bs, shard_index=i, shard_count=count,
                            num_workers=rng.randint(0, 2)) as ld:
                for b in ld.epoch(pad=True):
                    shapes.add(b["x"].shape)
                    rows.append(b["x"][b["mask"]])
        assert shapes == {(bs // count,)}, shapes
        assert sorted(np.concatenate(rows).tolist()) == list(range(n))
        checked += 1
    return {"passes": checked}


# -- resumable conversions killed anywhere -------------------------------------------------------

RESUMER = textwrap.dedent("""
    import os, signal, sys
    from loaderx import staging
    from loaderx.intake import directory, joining, tables

    src, dst, kill_at, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if limit:
        directory.MAX_RECORDS = joining.MAX_RECORDS = limit
    tables.RESUME_PART_BYTES = int(sys.argv[6])  # the bytes of files one part takes
    steps = {"n": 0}

    def step(what):  # the kill_at-th step of the run is its last
        steps["n"] += 1
        if steps["n"] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def counted(real, what):
        def run(*args, **kwargs):
            step(what)
            out = real(*args, **kwargs)
            step(what + " done")
            return out
        return run

    staging._hook = step
    directory.DirectoryWriter.append = counted(directory.DirectoryWriter.append, "append")
    joining._join_group = counted(joining._join_group, "join")
    if hasattr(joining, "_copy_part"):  # parts copied from another file system
        joining._copy_part = counted(joining._copy_part, "copy")
    joining.discard_parts = counted(joining.discard_parts, "discard")
    tables.discard_parts = joining.discard_parts
    rows = tables.from_arrow(dst, src, resume=True, chunk_bytes=int(sys.argv[5]))
    print("finished", rows, steps["n"], flush=True)
""")


def _other_file_system(near: str) -> str | None:
    here = os.stat(near).st_dev
    for place in ("/dev/shm", "/run/shm", "/var/tmp", "/tmp"):
        try:
            if os.stat(place).st_dev != here and os.access(place, os.W_OK):
                return place
        except OSError:
            continue
    return None


def _vec_inodes(root: str) -> set[int]:
    """The inodes of the chunk files of every ``vec`` store below ``root``."""
    found = set()
    for d, names, _ in os.walk(root):
        if "vec" in names:
            store = os.path.join(d, "vec")
            found |= {os.stat(os.path.join(store, n)).st_ino for n in os.listdir(store)
                      if n.endswith(".zr") and n[:-3].isdigit()}
    return found


def resume_kill_loop(tmp: str, rounds: int, seed: int,
                     seconds: float | None = None) -> dict[str, int]:
    import shutil
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from loaderx import decode_strings, open_dataset
    from loaderx.intake import directory, joining, tables
    from loaderx.intake.joining import parts_dir

    rng = random.Random(seed)
    elsewhere = _other_file_system(tmp)
    figures = {"rounds": 0, "kills": 0, "runs_that_finished": 0, "parts_kept": 0,
               "parts_converted_on_resume": 0, "published_before_the_last_run": 0,
               "rounds_on_another_file_system": 0, "rounds_with_parts_of_parts": 0}
    start = time.monotonic()
    for r in range(rounds):
        if seconds is not None and time.monotonic() - start > seconds:
            break
        root = pathlib.Path(tmp) / f"resume{r}"
        (root / "in").mkdir(parents=True)
        tables_in = []
        base = 0
        for k in range(rng.randint(1, 6)):
            n = rng.randint(0, 400) if k else rng.randint(1, 400)
            ids = np.arange(base, base + n)
            base += n
            t = pa.table({"id": ids, "text": [f"row {i}" for i in ids],
                          "vec": pa.FixedSizeListArray.from_arrays(
                              pa.array(np.repeat(ids, 3).astype(np.float32)), 3)})
            pq.write_table(t, root / "in" / f"f{k}.parquet", row_group_size=64)
            tables_in.append(t)
        src = str(root / "in" / "*.parquet")
        dst = root / "ds"
        far = None
        if elsewhere is not None and rng.random() < 0.3:
            far = tempfile.mkdtemp(prefix="loaderx-stress-", dir=elsewhere)
            os.symlink(far, parts_dir(dst))
            figures["rounds_on_another_file_system"] += 1
        limit = rng.choice([0, 0, 150])  # 150: files of more rows become parts of parts
        figures["rounds_with_parts_of_parts"] += bool(limit)
        chunk = rng.choice([2048, 8192, 1 << 20])
        # A part a file, parts of a few files, or every file straight into dst (one part).
        part_bytes = rng.choice([1, 1, 12_000, 30_000, tables.RESUME_PART_BYTES])

        def run(into: pathlib.Path, kill_at: int, src: str = src, limit: int = limit,
                chunk: int = chunk, part_bytes: int = part_bytes
                ) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-c", RESUMER, src, str(into), str(kill_at),
                                   str(limit), str(chunk), str(part_bytes)],
                                  capture_output=True, text=True, timeout=600)

        try:
            # The steps a whole run takes (counted by a run elsewhere, never killed); a part
            # copied from another file system takes two more.
            calibration = run(root / "whole", 0)
            assert calibration.returncode == 0, calibration.stderr[-3000:]
            steps = int(calibration.stdout.split()[-1]) + (2 * len(tables_in) if far else 0)
            shutil.rmtree(root / "whole")
            left = steps
            for _ in range(rng.randint(1, 3)):
                kill_at = rng.randint(1, max(1, left))
                out = run(dst, kill_at)
                if out.returncode == -signal.SIGKILL:
                    figures["kills"] += 1
                    # Left for the next run: about what this one did not do, plus the part it
                    # was writing.
                    left = left - kill_at + steps // len(tables_in) + 4
                    continue
                assert out.returncode == 0, out.stderr[-3000:]
                figures["runs_that_finished"] += 1
            # What the next run must keep: with dst not published, every finished part (the
            # same files, the same options; no published dataset can share its chunk files).
            published = os.path.isdir(dst)
            figures["published_before_the_last_run"] += published
            kept: dict[str, set[int]] = {}
            if os.path.isdir(parts_dir(dst)) and not published:
                for name in sorted(os.listdir(parts_dir(dst))):
                    part = os.path.join(parts_dir(dst), name)
                    if name.isdigit() and directory.is_dataset_directory(part):
                        kept[name] = _vec_inodes(part)
            written: list[str] = []
            real_write = tables._write

            def write(part: str, *args: Any, written: list[str] = written,
                      real_write: Any = real_write, **kwargs: Any) -> int:
                written.append(os.path.basename(part))
                return int(real_write(part, *args, **kwargs))

            saved = directory.MAX_RECORDS, joining.MAX_RECORDS, tables.RESUME_PART_BYTES
            tables._write = write  # type: ignore[assignment]
            tables.RESUME_PART_BYTES = part_bytes
            if limit:
                directory.MAX_RECORDS = joining.MAX_RECORDS = limit
            try:
                rows = tables.from_arrow(dst, src, resume=True, chunk_bytes=chunk)
            finally:
                tables._write = real_write
                directory.MAX_RECORDS, joining.MAX_RECORDS, tables.RESUME_PART_BYTES = saved
            want = pa.concat_tables(tables_in)
            assert rows == want.num_rows, (rows, want.num_rows)
            ds = open_dataset(dst)
            try:
                n = want.num_rows
                assert (ds["id"][:] == want["id"].to_numpy()).all()
                assert decode_strings(ds["text"][np.arange(n)]) == want["text"].to_pylist()
                assert np.asarray(ds["vec"][:]).tolist() == want["vec"].to_pylist()
            finally:
                for d in ds.values():
                    d.close()
            again = sorted(set(written) & set(kept))
            assert not again, f"round {r}: finished parts {again} were converted again"
            if far is None:  # joined from the parts themselves: their chunk files are dst's
                for name, inodes in kept.items():
                    assert inodes <= _vec_inodes(str(dst)), f"round {r}: part {name} not kept"
            figures["parts_kept"] += len(kept)
            figures["parts_converted_on_resume"] += len(written)
            beside = sorted(os.listdir(root))
            assert beside == sorted(["ds", "in"] + (["ds.parts"] if far else [])), beside
            assert far is None or os.listdir(far) == [], os.listdir(far)
        finally:
            if far is not None:
                shutil.rmtree(far, ignore_errors=True)
        shutil.rmtree(root)
        figures["rounds"] += 1
    return figures


def main() -> None:
    import argparse
    import json
    import tempfile

    parser = argparse.ArgumentParser(description="resumable conversions killed at random "
                                     "steps (resume_kill_loop)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=None,
                        help="stop starting rounds after this long")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        figures = resume_kill_loop(tmp, args.rounds, args.seed, args.seconds)
    print(json.dumps({**figures, "seconds": round(time.perf_counter() - t, 1)}))


if __name__ == "__main__":
    main()
