"""Ragged streams in the DataLoader (issue 20): a ragged dataset, subset or concatenation is a
stream whose batch value is a list of arrays, one per record, views into one leased buffer;
every loader promise (step order, workers, epoch(), seek, state_dict, shards, readahead, errors)
holds for them. Also the companion-arrays hook of loaderx.source."""

from __future__ import annotations

import gc
import io
import json
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

from loaderx import (
    ConcatDataset,
    DataLoader,
    DenseDataset,
    RaggedDataset,
    Zrecord,
    from_iterator,
    from_numpy,
)
from loaderx.errors import CorruptStoreError, LoaderxTypeError, LoaderxValueError

#: Seconds a subprocess may take: only a hang gets near it (2 loaded cores start Python slowly).
DEADLINE = 120

N = 61
RNG = np.random.default_rng(20)
#: Ragged records with trailing dims: record i is (n_i, 3) int16, some of them empty.
RECORDS = [RNG.integers(-999, 999, size=(int(RNG.integers(0, 12)), 3)).astype(np.int16)
           for _ in range(N)]
LABELS = np.arange(N, dtype=np.int64) * 10


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A ragged stream of (n_i, 3) records (zstd) and a dense label stream aligned with it."""
    root = tmp_path_factory.mktemp("ragged")
    from_iterator(root / "r", RECORDS, codec="zstd")
    from_numpy(root / "y", LABELS)
    return root


def streams_of(root) -> dict[str, Any]:
    return {"r": RaggedDataset(root / "r"), "y": DenseDataset(root / "y")}


def check_batch(batch: dict[str, Any], indices: np.ndarray) -> None:
    """The batch holds records ``indices``: the ragged rows as a list of (n_i, 3) arrays equal
    to the records, the dense rows aligned with them."""
    assert isinstance(batch["r"], list) and len(batch["r"]) == len(indices)
    np.testing.assert_array_equal(batch["y"], LABELS[indices.astype(np.int64)])
    for got, i in zip(batch["r"], indices.tolist(), strict=True):
        assert got.dtype == np.int16 and got.shape == RECORDS[i].shape
        np.testing.assert_array_equal(got, RECORDS[i])


def frozen(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch as bytes, shapes and dtypes: what "byte-identical" compares."""
    out = {}
    for key, value in batch.items():
        arrays = value if isinstance(value, list) else [value]
        out[key] = [(a.dtype.str, a.shape, a.tobytes()) for a in arrays]
    return out

# -- the companion-arrays hook ------------------------------------------------------------------


class CompanionSource:
    """A dense in-memory stream that adds two arrays of its own to every batch: each row's
    record index and its value doubled (what a packed stream does with segment ids)."""

    kind = "dense"
    view_digest = ""
    recently_cold = False

    def __init__(self, array: np.ndarray, declare: bool = True,
                 names: tuple[str, ...] = ("idx", "twice")) -> None:
        self.array = np.ascontiguousarray(array)
        self.dtype = self.array.dtype
        self.item_shape = self.array.shape[1:]
        self.record_bytes = self.array[0].nbytes
        self.names = names
        self.calls = 0
        if declare:
            self.companion_names = self._declared

    def _declared(self, name: str) -> tuple[str, ...]:
        return tuple(f"{name}_{n}" for n in self.names)

    def __len__(self) -> int:
        return len(self.array)

    def gather_rows(self, idxs: np.ndarray, dst: np.ndarray, shards: int | None = None,
                    rows: np.ndarray | None = None) -> None:
        dst.view(self.dtype).reshape(-1, *self.item_shape)[:len(idxs)] = self.array[idxs]

    def prefetch(self, idxs: Any) -> bool:
        return False

    def companions(self, name: str, idxs: np.ndarray) -> dict[str, np.ndarray]:
        self.calls += 1
        assert idxs.dtype == np.uint64
        values = [idxs.astype(np.int64), self.array[idxs] * 2]
        return {f"{name}_{n}": v for n, v in zip(self.names, values, strict=False)}


VALUES = np.arange(30, dtype=np.int64) * 7


def check_companions(batch: dict[str, Any]) -> None:
    np.testing.assert_array_equal(batch["v"], VALUES[batch["v_idx"]])
    np.testing.assert_array_equal(batch["v_twice"], 2 * batch["v"])


@pytest.mark.parametrize("workers", [0, 1, 4])
def test_companions_join_every_batch_in_every_worker_count(workers):
    with DataLoader({"v": CompanionSource(VALUES)}, batch_size=4, num_workers=workers,
                    seed=1) as loader:
        batches = [next(loader) for _ in range(12)]
        for step, batch in enumerate(batches):
            assert set(batch) == {"v", "v_idx", "v_twice"}
            np.testing.assert_array_equal(batch["v_idx"], loader.batch_indices(step))
            check_companions(batch)
        loader.seek(3)
        np.testing.assert_array_equal(next(loader)["v_idx"], batches[3]["v_idx"])
    with DataLoader({"v": CompanionSource(VALUES)}, batch_size=4, num_workers=workers,
                    seed=1) as resumed:
        resumed.load_state_dict({**resumed.state_dict(), "step": 5})
        np.testing.assert_array_equal(next(resumed)["v_twice"], batches[5]["v_twice"])


def test_companions_see_the_transform_and_padded_rows():
    seen = []

    def transform(batch):
        seen.append(sorted(batch))
        return batch

    with DataLoader({"v": CompanionSource(VALUES)}, batch_size=8, num_workers=2,
                    transform=transform) as loader:
        batches = list(loader.epoch(pad=True))
    assert seen[0] == ["mask", "v", "v_idx", "v_twice"]  # merged before the transform
    last = batches[-1]  # 30 records: the last batch has 6 real rows and 2 repeated records
    np.testing.assert_array_equal(last["mask"], [True] * 6 + [False] * 2)
    np.testing.assert_array_equal(last["v_idx"], [24, 25, 26, 27, 28, 29, 0, 1])
    check_companions(last)


def test_companions_of_shards_concatenate_to_the_global_batch():
    def first(loader):
        return [next(loader) for _ in range(5)]

    with DataLoader({"v": CompanionSource(VALUES)}, batch_size=6, seed=2) as whole:
        glob = first(whole)
    parts = []
    for i in range(3):
        with DataLoader({"v": CompanionSource(VALUES)}, batch_size=6, seed=2, shard_index=i,
                        shard_count=3) as shard:
            parts.append(first(shard))
    for step in range(5):
        for key in ("v", "v_idx", "v_twice"):
            np.testing.assert_array_equal(
                np.concatenate([p[step][key] for p in parts]), glob[step][key])


def test_colliding_companion_names_are_refused_at_construction():
    plain = CompanionSource(VALUES)
    with pytest.raises(LoaderxValueError, match="also a stream's name"):
        DataLoader({"v": CompanionSource(VALUES), "v_idx": plain})
    with pytest.raises(LoaderxValueError, match="both add"):
        DataLoader({"v": CompanionSource(VALUES, names=("a",)),
                    "w": _renamed(CompanionSource(VALUES), "v_a")})
    with DataLoader({"v": CompanionSource(VALUES)}, batch_size=4) as loader:
        with pytest.raises(LoaderxValueError, match="companion"):
            loader.epoch(pad=True, mask_key="v_idx")


def _renamed(source: CompanionSource, fixed: str) -> CompanionSource:
    """A source whose companion is called ``fixed`` whatever the stream's name."""
    source.companion_names = lambda name: (fixed,)
    source.companions = lambda name, idxs: {fixed: idxs}
    return source


def test_undeclared_collisions_reach_the_consumer_at_their_step():
    sneaky = CompanionSource(VALUES, declare=False, names=("x",))  # adds "v_x"
    for workers in (0, 2):
        loader = DataLoader({"v": sneaky, "v_x": CompanionSource(VALUES)}, batch_size=4,
                            num_workers=workers)
        with loader, pytest.raises(LoaderxValueError, match="already has"):
            next(loader)

    class Bad(CompanionSource):
        def companions(self, name, idxs):
            return [idxs]

    with DataLoader({"v": Bad(VALUES)}, batch_size=4, num_workers=0) as loader:
        with pytest.raises(LoaderxTypeError, match="not a dict"):
            next(loader)


# -- ragged streams -------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 1, 4])
def test_ragged_batches_in_step_order_for_any_worker_count(store, workers):
    with DataLoader(streams_of(store), batch_size=8, num_workers=workers, seed=4) as loader:
        got = [next(loader) for _ in range(20)]  # 2.6 cycles of 61 records
        for step, batch in enumerate(got):
            check_batch(batch, loader.batch_indices(step))
    with DataLoader(streams_of(store), batch_size=8, num_workers=1, seed=4) as reference:
        want = [frozen(next(reference)) for _ in range(20)]
    assert [frozen(b) for b in got] == want


def test_without_a_transform_a_ragged_stream_is_a_list_of_record_views(store):
    with DataLoader({"r": RaggedDataset(store / "r")}, batch_size=5, seed=0) as loader:
        batch = next(loader)
    assert list(batch) == ["r"] and len(batch["r"]) == 5
    records = batch["r"]
    nonempty = [a for a in records if a.size]
    # One buffer under the batch: the records are views of it, laid out back to back.
    base = records[0].base
    assert all(a.base is base for a in records)
    assert all(not a.flags.owndata for a in records)
    assert len(nonempty) >= 2 and not np.shares_memory(nonempty[0], nonempty[1])


def test_a_transform_gets_the_list_and_errors_reach_the_consumer_at_their_step(store):
    def transform(batch):
        if 7 in {len(a) for a in batch["r"]}:
            raise KeyError("a record of 7 rows")
        return sum(int(a.sum()) for a in batch["r"])

    steps = []
    with DataLoader(streams_of(store), batch_size=4, seed=1) as probe:
        for step in range(40):
            lengths = [len(RECORDS[i]) for i in probe.batch_indices(step).tolist()]
            steps.append(7 in lengths)
    bad = steps.index(True)
    for workers in (0, 3):
        with DataLoader(streams_of(store), batch_size=4, seed=1, num_workers=workers,
                        transform=transform) as loader:
            for step in range(bad):
                want = sum(int(RECORDS[i].sum()) for i in loader.batch_indices(step).tolist())
                assert next(loader) == want
            with pytest.raises(KeyError, match="7 rows"):
                next(loader)


def test_seek_and_a_state_dict_in_a_new_process_give_byte_identical_batches(store, tmp_path):
    with DataLoader(streams_of(store), batch_size=6, num_workers=2, seed=9) as loader:
        for _ in range(13):
            next(loader)
        state = loader.state_dict()
        want = [frozen(next(loader)) for _ in range(8)]
        loader.seek(13)
        assert [frozen(next(loader)) for _ in range(8)] == want
    code = textwrap.dedent(f"""
        import json, pickle, sys
        from loaderx import DataLoader, DenseDataset, RaggedDataset
        streams = {{"r": RaggedDataset({str(store / "r")!r}),
                   "y": DenseDataset({str(store / "y")!r})}}
        with DataLoader(streams, batch_size=6, num_workers=3, seed=9) as loader:
            loader.load_state_dict(json.loads(sys.argv[1]))
            out = []
            for _ in range(8):
                batch = next(loader)
                out.append({{k: [(a.dtype.str, a.shape, a.tobytes())
                               for a in (v if isinstance(v, list) else [v])]
                            for k, v in batch.items()}})
        sys.stdout.buffer.write(pickle.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", code, json.dumps(state)], capture_output=True,
                       timeout=DEADLINE)
    assert r.returncode == 0, r.stderr.decode()
    import pickle

    assert pickle.loads(r.stdout) == want


@pytest.mark.parametrize("workers", [0, 2])
def test_epoch_reads_every_ragged_record_once(store, workers):
    with DataLoader(streams_of(store), batch_size=8, num_workers=workers) as loader:
        whole = list(loader.epoch())
        dropped = list(loader.epoch(drop_last=True))
        padded = list(loader.epoch(pad=True))
    assert [len(b["r"]) for b in whole] == [8] * 7 + [5]
    check_batch({"r": [a for b in whole for a in b["r"]],
                 "y": np.concatenate([b["y"] for b in whole])}, np.arange(N, dtype=np.uint64))
    assert len(dropped) == 7
    for step, batch in enumerate(dropped):
        check_batch(batch, np.arange(step * 8, step * 8 + 8, dtype=np.uint64))
    assert [len(b["r"]) for b in padded] == [8] * 8
    last = padded[-1]
    np.testing.assert_array_equal(last["mask"], [True] * 5 + [False] * 3)
    check_batch({"r": last["r"], "y": last["y"]},  # the padding repeats records 0, 1, 2
                np.array([56, 57, 58, 59, 60, 0, 1, 2], dtype=np.uint64))


@pytest.mark.parametrize("count", [2, 3])
def test_shard_slices_concatenate_to_the_global_batch(store, count):
    def run(**shard):
        with DataLoader(streams_of(store), batch_size=6, seed=5, num_workers=2,
                        **shard) as loader:
            return [next(loader) for _ in range(12)], list(loader.epoch(pad=True))

    glob, glob_pass = run()
    parts = [run(shard_index=i, shard_count=count) for i in range(count)]
    for step in range(12):
        joined = {"r": [a for p in parts for a in p[0][step]["r"]],
                  "y": np.concatenate([p[0][step]["y"] for p in parts])}
        assert frozen(joined) == frozen(glob[step])
    for step, batch in enumerate(glob_pass):
        joined = {"r": [a for p in parts for a in p[1][step]["r"]],
                  "y": np.concatenate([p[1][step]["y"] for p in parts]),
                  "mask": np.concatenate([p[1][step]["mask"] for p in parts])}
        assert frozen(joined) == frozen(batch)


def test_a_ragged_buffer_is_reused_only_once_no_record_of_it_is_seen(store):
    with DataLoader(streams_of(store), batch_size=16, num_workers=2, prefetch_size=2,
                    seed=3) as loader:
        kept = next(loader)
        one = max(kept["r"], key=len)  # a single record keeps its whole batch's buffer
        one_copy = one.copy()
        del kept
        gc.collect()
        for step in range(1, 200):
            batch = next(loader)
            check_batch(batch, loader.batch_indices(step))
            assert not any(np.shares_memory(a, one) for a in batch["r"])
        np.testing.assert_array_equal(one, one_copy)
        pool = loader._pipe.pools[0]
        # 200 batches of varying size, a few buffers served them all.
        assert pool.allocated <= loader._pipe.window + 8, pool.allocated
        keep = [next(loader) for _ in range(30)]
        copies = [[a.copy() for a in b["r"]] for b in keep]
        for _ in range(40):
            next(loader)
        for b, c in zip(keep, copies, strict=True):
            for a, want in zip(b["r"], c, strict=True):
                np.testing.assert_array_equal(a, want)
        shared = [(i, j) for i in range(len(keep)) for j in range(i + 1, len(keep))
                  if any(np.shares_memory(a, z) for a in keep[i]["r"] if a.size
                         for z in keep[j]["r"] if z.size)]
        assert shared == [], f"kept batches sharing memory: {shared[:5]}"
        # Once nothing sees a batch any more its buffer goes back and is handed out again.
        before = pool.allocated
        del keep, copies, b, c, a, want, batch
        gc.collect()
        for _ in range(60):
            next(loader)
        assert pool.allocated == before


def test_a_corrupt_record_raises_at_its_step(tmp_path):
    from_iterator(tmp_path / "r", [np.arange(i % 5, dtype=np.int32) for i in range(20)],
                  codec="raw")
    with Zrecord(tmp_path / "r") as z:
        z.append(b"\0\0\0", [0])  # record 20: 3 bytes, not a whole int32
    ds = RaggedDataset(tmp_path / "r")
    for workers in (0, 2):
        with DataLoader({"r": ds}, batch_size=7, num_workers=workers, mode="sequential") \
                as loader:
            for step in range(2):  # records 0..13
                assert [len(a) for a in next(loader)["r"]] == [i % 5 for i in
                                                               range(7 * step, 7 * step + 7)]
            with pytest.raises(CorruptStoreError, match="record 20 .* not a whole number"):
                next(loader)  # records 14..20


def test_a_record_failing_its_checksum_raises_at_its_step(tmp_path):
    records = [bytes([i]) * (10 + i) for i in range(24)]
    from_iterator(tmp_path / "b", records, codec="raw", checksums=True)
    with Zrecord(tmp_path / "b") as z:
        at = int(z.lengths(np.arange(17, dtype=np.uint64)).sum()) + 3  # inside record 17
    with open(tmp_path / "b" / "0.zr", "r+b") as f:
        f.seek(at)
        f.write(b"\xff")
    ds = RaggedDataset(tmp_path / "b", verify_reads=True)
    with DataLoader({"b": ds}, batch_size=6, num_workers=2, mode="sequential") as loader:
        for step in range(2):
            got = next(loader)["b"]
            assert [a.tobytes() for a in got] == records[6 * step:6 * step + 6]
        with pytest.raises(CorruptStoreError, match="record 17"):
            next(loader)
    with DataLoader({"b": ds}, batch_size=6, num_workers=2) as loader:
        with pytest.raises(CorruptStoreError, match="record 17"):
            list(loader.epoch())


def test_a_ragged_subset_and_a_ragged_concatenation_are_streams(store, tmp_path):
    half = N // 2
    from_iterator(tmp_path / "a", RECORDS[:half])
    from_iterator(tmp_path / "b", RECORDS[half:])
    cat = ConcatDataset([tmp_path / "a", tmp_path / "b"])
    assert cat.kind == "ragged"
    picked = np.random.default_rng(2).permutation(N)[:40]
    sub = RaggedDataset(store / "r").subset(picked)
    labels = DenseDataset(store / "y")
    with DataLoader({"r": cat, "y": labels}, batch_size=9, num_workers=2, seed=8) as loader:
        for step in range(10):
            check_batch(next(loader), loader.batch_indices(step))
        check_batch({"r": [a for b in loader.epoch() for a in b["r"]], "y": LABELS},
                    np.arange(N, dtype=np.uint64))
    with DataLoader({"r": sub, "y": labels.subset(picked)}, batch_size=8, num_workers=2,
                    seed=8) as loader:
        for step in range(10):
            check_batch(next(loader), picked[loader.batch_indices(step).astype(np.int64)])
        state = loader.state_dict()
        assert state["view"] != 0
    with DataLoader({"r": sub.subset(np.arange(10)), "y": labels.subset(picked[:10])},
                    batch_size=5) as loader:
        check_batch(next(loader), picked[loader.batch_indices(0).astype(np.int64)])


def test_readahead_reaches_ragged_streams(store):
    """A ragged stream is asked to prefetch the records of the steps ahead, as dense ones are
    (when its reads go to the disk), and the batches stay those of the sampler."""

    class Cold(RaggedDataset):
        asked: list[np.ndarray] = []

        @property
        def recently_cold(self) -> bool:
            return True

        def prefetch(self, idxs):
            Cold.asked.append(np.asarray(idxs).copy())
            return super().prefetch(idxs)

    with DataLoader({"r": Cold(store / "r")}, batch_size=4, num_workers=0, readahead=3,
                    seed=6) as loader:
        first = next(loader)
        asked = [a.tolist() for a in Cold.asked]
        assert asked == [loader.batch_indices(s).tolist() for s in (1, 2, 3)]
        for a, i in zip(first["r"], loader.batch_indices(0).tolist(), strict=True):
            np.testing.assert_array_equal(a, RECORDS[i])


def test_mixed_streams_and_indexing_errors_are_the_datasets(store):
    ragged = RaggedDataset(store / "r")
    with pytest.raises(LoaderxValueError, match="same length"):
        DataLoader({"r": ragged, "short": ragged.subset([0, 1])})
    with pytest.raises(LoaderxTypeError, match="loaderx.source"):
        DataLoader({"r": [np.arange(3)] * 4})


# -- a JPEG-bytes stream through a Pillow decode transform --------------------------------------

def _pillow():
    try:
        from PIL import Image
    except ImportError:  # scripts/env.sh installs it: CI runs these tests
        pytest.fail("Pillow is not installed: .venv/bin/python -m pip install Pillow")
    return Image


JPEGS = 37


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """JPEG-encoded bytes of random images of varying sizes, one record per image."""
    image = _pillow()
    rng = np.random.default_rng(7)
    encoded = []
    for _ in range(JPEGS):
        h, w = (int(x) for x in rng.integers(8, 40, size=2))
        pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        out = io.BytesIO()
        image.fromarray(pixels).save(out, format="JPEG", quality=85)
        encoded.append(out.getvalue())
    root = tmp_path_factory.mktemp("jpeg")
    from_iterator(root / "jpeg", encoded, codec="raw")
    return root / "jpeg", encoded


def decode(record: np.ndarray) -> np.ndarray:
    image = _pillow()
    with image.open(io.BytesIO(record.tobytes())) as img:
        return np.asarray(img.convert("RGB"))


def decode_batch(batch: dict[str, Any]) -> list[np.ndarray]:
    return [decode(r) for r in batch["jpeg"]]


@pytest.mark.parametrize("workers", [0, 1, 4])
def test_a_jpeg_stream_decodes_like_each_record_by_hand(jpegs, workers):
    path, encoded = jpegs
    by_hand = [decode(np.frombuffer(b, np.uint8)) for b in encoded]
    ds = RaggedDataset(path)
    assert ds.dtype == np.uint8 and ds.item_shape == ()
    with DataLoader({"jpeg": ds}, batch_size=5, num_workers=workers, seed=11,
                    transform=decode_batch) as loader:
        for step in range(16):  # over two cycles
            images = next(loader)
            want = loader.batch_indices(step).tolist()
            assert len(images) == 5
            for got, i in zip(images, want, strict=True):
                assert got.dtype == np.uint8 and got.ndim == 3
                np.testing.assert_array_equal(got, by_hand[i])
        state = loader.state_dict()
        after = [next(loader) for _ in range(4)]
        passed = list(loader.epoch(pad=True))
    with DataLoader({"jpeg": RaggedDataset(path)}, batch_size=5, num_workers=2, seed=11,
                    transform=decode_batch) as resumed:
        resumed.load_state_dict(state)
        for want_images in after:
            for got, want in zip(next(resumed), want_images, strict=True):
                np.testing.assert_array_equal(got, want)
    # The pass: every image once in index order, the padded tail repeating images 0, 1, 2.
    flat = [img for images in passed for img in images]
    assert len(flat) == 40
    for got, want in zip(flat, by_hand + by_hand[:3], strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_jpeg_stream_resumes_in_a_new_process_with_the_same_pixels(jpegs):
    path, encoded = jpegs
    by_hand = [decode(np.frombuffer(b, np.uint8)) for b in encoded]
    with DataLoader({"jpeg": RaggedDataset(path)}, batch_size=4, num_workers=2, seed=3,
                    transform=decode_batch) as loader:
        for _ in range(11):
            next(loader)
        state = loader.state_dict()
        steps = [loader.batch_indices(s).tolist() for s in range(11, 17)]
    code = textwrap.dedent(f"""
        import io, json, pickle, sys
        import numpy as np
        from PIL import Image
        from loaderx import DataLoader, RaggedDataset

        def decode_batch(batch):
            out = []
            for r in batch["jpeg"]:
                with Image.open(io.BytesIO(r.tobytes())) as img:
                    out.append(np.asarray(img.convert("RGB")))
            return out

        with DataLoader({{"jpeg": RaggedDataset({str(path)!r})}}, batch_size=4,
                        num_workers=4, seed=3, transform=decode_batch) as loader:
            loader.load_state_dict(json.loads(sys.argv[1]))
            got = [next(loader) for _ in range(6)]
        sys.stdout.buffer.write(pickle.dumps(got))
    """)
    r = subprocess.run([sys.executable, "-c", code, json.dumps(state)], capture_output=True,
                       timeout=DEADLINE)
    assert r.returncode == 0, r.stderr.decode()
    import pickle

    got = pickle.loads(r.stdout)
    for images, want in zip(got, steps, strict=True):
        for image, i in zip(images, want, strict=True):
            np.testing.assert_array_equal(image, by_hand[i])


def test_a_subset_of_a_stream_with_companions_keeps_them(store):
    from loaderx import Subset

    picked = np.array([29, 3, 17, 8, 0, 11], dtype=np.uint64)
    sub = Subset(CompanionSource(VALUES), picked)
    assert sub.companion_names("v") == ("v_idx", "v_twice")
    with DataLoader({"v": sub}, batch_size=3, seed=0) as loader:
        for step in range(4):
            batch = next(loader)
            mapped = picked[loader.batch_indices(step).astype(np.int64)]
            np.testing.assert_array_equal(batch["v_idx"], mapped)  # the base's record indices
            check_companions(batch)
    with pytest.raises(LoaderxValueError, match="also a stream's name"):
        DataLoader({"v": sub, "v_twice": Subset(CompanionSource(VALUES), picked)})
    assert not hasattr(DenseDataset(store / "y").subset(picked), "companions")


def test_the_growing_pool_settles_and_never_hands_out_what_is_seen():
    from loaderx._views.recycle import GrowingPool

    pool = GrowingPool(keep=3)
    held = [pool.take(n) for n in (100, 5000, 20000)]  # growing requests, growing buffers
    assert pool.allocated == 3 and pool.capacity >= 20000 * 5 // 4
    for a in held:
        a[:] = 1
    views = [a[10:20] for a in held]
    del held
    gc.collect()  # the views keep every lease: nothing is free yet
    fresh = pool.take(50)
    assert pool.allocated == 4 and not any(np.shares_memory(fresh, v) for v in views)
    del views, fresh
    gc.collect()  # now 4 come back: the 2 below the capacity are dropped, 2 of it kept
    sizes = [len(pool.take(n)) for n in (30000, 10, 25000)]
    assert sizes == [30000, 10, 25000]
    assert pool.allocated == 5  # one bigger buffer, reused for the two requests after it
    for _ in range(50):  # steady state: a varying batch size allocates nothing more
        before = pool.allocated
        for n in (20000, 3000, 24000):
            pool.take(n)
        assert pool.allocated == before
