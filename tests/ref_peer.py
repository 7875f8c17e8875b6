"""Runs inside a separate virtual environment holding the reference loaderx==0.9.11, driven by
``test_compat_reference.py`` through a subprocess. It only uses the reference's public API.

    python ref_peer.py read STORE OUT.npz    # dump every record of STORE
    python ref_peer.py write STORE OUT.npz   # write a store, dump what it should hold
    python ref_peer.py dsread DIR OUT.npz    # read DIR/dense and DIR/ragged through the datasets
    python ref_peer.py dswrite DIR OUT.npz   # convert dense_arrays() and ragged_arrays() into DIR

``make_batches`` is imported by the test as well, so both sides agree on the data.
"""

from __future__ import annotations

import sys

import numpy as np


def make_batches(seed: int) -> list[tuple[str, list[bytes]]]:
    """Batches of mildly compressible records, each with the codec to append it with."""
    rng = np.random.default_rng(seed)
    batches = []
    for codec in ("raw", "zstd", "zstd_dict", "zstd", "raw", "zstd_dict"):
        recs = []
        for _ in range(int(rng.integers(20, 60))):
            n = int(rng.integers(0, 6000))
            base = (np.arange(n) // 5 % 64).astype(np.uint8)
            recs.append((base + rng.integers(0, 4, size=n, dtype=np.uint8)).tobytes())
        batches.append((codec, recs))
    return batches


def dict_samples(seed: int) -> tuple[np.ndarray, np.ndarray]:
    recs = [r for _, batch in make_batches(seed + 1) for r in batch if r]
    sizes = np.array([len(r) for r in recs], dtype=np.uint64)
    return np.frombuffer(b"".join(recs), dtype=np.uint8), sizes


def pack(recs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    sizes = np.array([len(r) for r in recs], dtype=np.uint64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.uint64)
    return np.frombuffer(b"".join(recs) or b"\0", dtype=np.uint8)[: int(sizes.sum())], offsets


def apply_deletes(model: list[bytes], targets: list[int]) -> None:
    for i in sorted(set(targets), reverse=True):
        model[i] = model[-1]
        model.pop()


DELETES = [0, 7, 7, 30, 55]


def read_store(z) -> list[bytes]:
    n = len(z)
    idx = np.arange(n, dtype=np.uint64)
    lens = np.asarray(z.lengths(idx)).astype(np.uint64)
    offsets = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.uint64)
    dst = np.zeros(max(int(lens.sum()), 1), dtype=np.uint8)
    if n:
        z.gather(idx, dst, offsets)
    return [dst[o : o + k].tobytes() for o, k in zip(offsets, lens, strict=True)]


def dense_arrays() -> list[tuple[str, np.ndarray]]:
    """Arrays converted one after the other (appending) into one dense dataset, with codecs."""
    rng = np.random.default_rng(21)
    base = rng.integers(0, 200, size=(6, 10), dtype=np.uint8).astype(np.float32)
    first = np.stack([np.roll(base, int(k), axis=1) for k in rng.integers(0, 9, 700)])
    second = rng.normal(size=(40, 6, 10)).astype(np.float32)
    return [("zstd_dict", first), ("raw", second)]


def ragged_arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(22)
    # No empty records: the reference's from_iterator refuses some of them ("record exceeds the
    # 1048576 byte limit"); ours stores them (tests/test_converter.py).
    return [rng.integers(-50, 50, size=(int(k), 2)).astype(np.int16)
            for k in rng.integers(1, 30, 150)]


def read_datasets(root: str) -> dict[str, np.ndarray]:
    from loaderx.dataset import DenseDataset, RaggedDataset

    out = {}
    dense = DenseDataset(f"{root}/dense")
    out["dense"] = np.asarray(dense[np.arange(len(dense))])
    ragged = RaggedDataset(f"{root}/ragged")
    for i, rec in enumerate(ragged[list(range(len(ragged)))]):
        out[f"ragged_{i}"] = np.asarray(rec)
    return out


def save(out: str, recs: list[bytes]) -> None:
    np.savez(out, *[np.frombuffer(r, dtype=np.uint8) for r in recs])


def main() -> None:
    from loaderx.zrecord import Zrecord

    cmd, store, out = sys.argv[1:4]
    if cmd == "read":
        z = Zrecord(store)
        save(out, read_store(z))
        z.close()
    elif cmd == "write":
        z = Zrecord(store, codec="zstd")
        z.train_dict(*dict_samples(11), 4096)
        model: list[bytes] = []
        for codec, recs in make_batches(11):
            z.append(*pack(recs), codec=codec)
            model += recs
        z.delete(DELETES)
        apply_deletes(model, DELETES)
        z.compact()
        z.sync()
        assert read_store(z) == model
        z.close()
        save(out, model)
    elif cmd == "extend":
        # A writer that knows nothing of sums.zr: delete (swap-tail), append, compact.
        z = Zrecord(store)
        z.delete([1, 5])
        z.append(*pack([b"from the reference " * 20, bytes(range(256)) * 3]), codec="zstd")
        z.compact()
        z.sync()
        save(out, read_store(z))
        z.close()
    elif cmd == "dsread":
        np.savez(out, **read_datasets(store))
    elif cmd == "dswrite":
        from loaderx.converter import from_iterator, from_numpy

        for codec, arr in dense_arrays():
            from_numpy(f"{store}/dense", arr, codec=codec)
        from_iterator(f"{store}/ragged", ragged_arrays())
        np.savez(out, **read_datasets(store))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
