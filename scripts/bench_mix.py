#!/usr/bin/env python3
"""Data mixtures (``loaderx.mix``, issue 34): ``python scripts/bench.py mix [--repeats N]
[--samples 100000000] [--check 10000000] [--only throughput|megatron]``.

Sections (each row once per repeat, in turn, then the median and the per-repeat ratio's range):

* throughput -- the standard library's sources as byte-level uint16 tokens (as
  ``bench_packing.py``), one store of every file against two stores of alternate files mixed
  in the proportion of their rows (the same rows, in expectation), packed (concat, ``eos_id``
  0) at 32 x 513, 64 x 2049, 256 x 2049 and 512 x 2049 tokens, and dense 1 KiB rows at 256 a
  batch: the loader's time per batch with ``num_workers=0`` over one store and over the mixture
  (target >= 0.95x), and
  the mixture's bookkeeping per batch -- which rows of which source, from scratch for each
  batch -- against the packed batch's time (target < 1%): the loader reads these mixtures'
  batches in one native call, so it is timed in the engine, beside what a shuffled store of the
  same rows spends on its order there (the mixture's draws replace it).
* megatron -- 100 M samples of 10 sources (random weights): the setup of ``mix`` (time, peak
  memory, memory kept) against building Megatron's blending index -- its greedy rule (each
  sample goes to the source furthest behind ``weight * n``) in a C++ loop like Megatron's
  ``build_blending_indices`` (compiled here with ``g++ -O2`` when there is one) and as a
  NumPy-per-sample Python loop (timed on 1 M samples, scaled) -- and the realized proportions
  of both checked over every prefix of the first 10 M positions.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import pathlib
import shutil
import statistics
import subprocess
import time
import tracemalloc
from typing import Any

import numpy as np

import _bench_common as common
from bench_packing import corpus_files, documents
from loaderx import DataLoader, DenseDataset, RaggedDataset, _native, mix, pack
from loaderx.converter import from_iterator, from_numpy


def corpus() -> list[np.ndarray]:
    """The packing benchmark's corpus: the standard library's sources as byte-level tokens."""
    return documents(corpus_files())


def loader_time(streams: dict[str, Any], batch: int, steps: int) -> float:
    """Microseconds per batch of a ``num_workers=0`` loop (after a warm-up)."""
    with DataLoader(streams, batch_size=batch, num_workers=0, stats=False) as loader:
        return common.time_next(loader, steps, 10) / steps * 1e6


def bookkeeping(m: Any, batch: int, steps: int) -> tuple[float, float | None]:
    """Microseconds per batch to resolve a batch's rows (which rows of which source), from
    scratch for each batch, and what a shuffled store of the same rows spends on its order
    (None where not measured). A mixture read in one native call (dense datasets, packed views
    without a schedule) resolves in the engine: timed there (``mixed_run_seconds``), beside the
    engine's shuffled sampler batch; else the Python resolution, with the mixture's caches as a
    run leaves them."""
    core = m._core
    start = 10_000 * batch
    if getattr(m, "_one_call", None) is not None and hasattr(_native, "mixed_run_seconds"):
        run = _native.mixed_run_seconds(core._mixed_run, start, batch, steps * 20)
        order = _native.shuffled_batch_seconds(int(core.lengths.sum()), batch, steps * 20)
        return run * 1e6, order * 1e6
    t = time.perf_counter()
    for k in range(steps):
        core._local.key = b""
        core.resolve(np.arange(start + k * batch, start + (k + 1) * batch, dtype=np.uint64))
    return (time.perf_counter() - t) / steps * 1e6, None


def throughput(root: pathlib.Path, repeats: int) -> None:
    docs = corpus()
    for name, part in (("all", docs), ("a", docs[0::2]), ("b", docs[1::2])):
        from_iterator(root / name, part, codec="raw", max_record_bytes=1 << 20, overwrite=True)
    rng = np.random.default_rng(0)
    dense = rng.integers(0, 255, (60_000, 1024), dtype=np.uint8)
    for name, part in (("dall", dense), ("da", dense[0::2]), ("db", dense[1::2])):
        from_numpy(root / name, part, codec="raw", overwrite=True)
    cases: list[tuple[str, int, Any, Any]] = []
    for batch, seq in ((32, 513), (64, 2049), (256, 2049), (512, 2049)):
        one = pack(RaggedDataset(root / "all"), seq, eos_id=0)
        a = pack(RaggedDataset(root / "a"), seq, eos_id=0)
        b = pack(RaggedDataset(root / "b"), seq, eos_id=0)
        cases.append((f"packed {batch} x {seq}", batch, one, mix([a, b], [len(a), len(b)])))
    da, db = DenseDataset(root / "da"), DenseDataset(root / "db")
    cases.append(("dense 256 x 1 KiB", 256, DenseDataset(root / "dall"),
                  mix([da, db], [len(da), len(db)])))
    results: dict[str, dict[str, list[float]]] = {
        c[0]: {"one": [], "mix": [], "book": [], "order": []} for c in cases}
    for _ in range(repeats):
        for label, batch, one, mixed in cases:
            steps = 400 if batch <= 64 else 150
            r = results[label]
            r["one"].append(loader_time({"t": one}, batch, steps))
            r["mix"].append(loader_time({"t": mixed}, batch, steps))
            fresh = mix(mixed.sources, mixed.weights)
            book, order = bookkeeping(fresh, batch, steps)
            r["book"].append(book)
            if order is not None:
                r["order"].append(order)
    print("\n" + common.head("loader, num_workers=0", "one store µs/batch",
                             "mixture of two µs/batch", "mixture / one, throughput (range)",
                             "bookkeeping µs/batch", "of the batch",
                             "a shuffled store's order µs/batch"))
    for label, *_ in cases:
        r = results[label]
        one_t, mix_t = statistics.median(r["one"]), statistics.median(r["mix"])
        ratios = common.paired(r["one"], r["mix"])
        book = statistics.median(r["book"])
        order = f"{statistics.median(r['order']):.2f}" if r["order"] else "-"
        print(common.row(label, f"{one_t:,.0f}", f"{mix_t:,.0f}",
                         f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)",
                         f"{book:.2f}", f"{book / one_t:.2%}", order))


# -- Megatron-style blending index -------------------------------------------------------------

_CPP = r"""
#include <cstdint>
// Megatron's greedy blending rule (megatron/core/datasets/helpers.cpp,
// build_blending_indices): each sample goes to the dataset furthest behind weight * n.
extern "C" void blend(const double* weights, int32_t k, int64_t size, uint8_t* dataset_index,
                      int64_t* dataset_sample_index) {
  int64_t current[256] = {0};
  for (int64_t i = 0; i < size; ++i) {
    double n = i > 1 ? (double)i : 1.0;
    int32_t best = 0;
    double best_error = weights[0] * n - (double)current[0];
    for (int32_t d = 1; d < k; ++d) {
      double error = weights[d] * n - (double)current[d];
      if (error > best_error) { best_error = error; best = d; }
    }
    dataset_index[i] = (uint8_t)best;
    dataset_sample_index[i] = current[best];
    current[best] += 1;
  }
}
"""


def compiled_blend(tmp: pathlib.Path) -> Any:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return None
    src, lib = tmp / "blend.cpp", tmp / "blend.so"
    src.write_text(_CPP)
    subprocess.run([cxx, "-O2", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    fn = ctypes.CDLL(str(lib)).blend
    fn.restype = None
    return fn


def python_blend(weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    index = np.empty(size, dtype=np.uint8)
    sample = np.empty(size, dtype=np.int64)
    current = np.zeros(len(weights), dtype=np.int64)
    for i in range(size):
        d = int(np.argmax(weights * max(i, 1) - current))
        index[i] = d
        sample[i] = current[d]
        current[d] += 1
    return index, sample


def prefix_deviation(src_chunks: Any, a: np.ndarray, q: int, w: np.ndarray,
                     k: int) -> tuple[bool, float, float]:
    """Over every prefix: whether each count is floor or ceil of ``a_i n / q`` (exact
    integers), the largest ``|count - a_i n / q|``, and the largest ``|count - w_i n|``."""
    counts = np.zeros(k, dtype=np.int64)
    start = 0
    ok, worst_eff, worst_req = True, 0.0, 0.0
    for src in src_chunks:
        c = np.cumsum(np.eye(k, dtype=np.int64)[src], axis=0) + counts
        n = np.arange(start + 1, start + len(src) + 1, dtype=np.int64)[:, None]
        ok &= bool(((c + 1) * q > a[None, :] * n).all() and ((c - 1) * q < a[None, :] * n).all())
        worst_eff = max(worst_eff, float(np.abs(c - n * (a / q)[None, :]).max()))
        worst_req = max(worst_req, float(np.abs(c - n * w[None, :]).max()))
        counts = c[-1]
        start += len(src)
    return ok, worst_eff, worst_req


def megatron(root: pathlib.Path, samples: int, check: int, repeats: int) -> None:
    k = 10
    rng = np.random.default_rng(34)
    weights = rng.random(k) + 0.05
    weights /= weights.sum()
    for s in range(k):
        from_numpy(root / f"src{s}", np.arange(1000 + 997 * s, dtype=np.int32), overwrite=True)
    sources = [DenseDataset(root / f"src{s}") for s in range(k)]
    ours_t, ours_peak = [], []
    for _ in range(repeats):  # the time alone, then the memory (tracemalloc slows Python down)
        gc.collect()
        t = time.perf_counter()
        m = mix(sources, weights.tolist(), seed=1)
        ours_t.append(time.perf_counter() - t)
        tracemalloc.start()
        mix(sources, weights.tolist(), seed=1)
        ours_peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    kept = m.plan_bytes
    blend = compiled_blend(root)
    cpp_t: list[float] = []
    index = sample = None
    if blend is not None:
        for _ in range(repeats):
            index = np.empty(samples, dtype=np.uint8)
            sample = np.empty(samples, dtype=np.int64)
            t = time.perf_counter()
            blend(weights.ctypes.data_as(ctypes.c_void_p), ctypes.c_int32(k),
                  ctypes.c_int64(samples), index.ctypes.data_as(ctypes.c_void_p),
                  sample.ctypes.data_as(ctypes.c_void_p))
            cpp_t.append(time.perf_counter() - t)
    probe = 1_000_000
    t = time.perf_counter()
    py_index, _ = python_blend(weights, probe)
    py_t = (time.perf_counter() - t) * samples / probe
    if index is not None:
        assert np.array_equal(index[:probe], py_index)  # the same rule, the same index
    index_bytes = samples * (1 + 8)
    print(f"\n{samples:,} samples of {k} sources (weights {np.round(weights, 3).tolist()}):")
    print("\n" + common.head("", "setup", "memory"))
    peak = statistics.median(ours_peak) / 1e6
    print(f"| loaderx.mix (period {m.period}, the table built and checked) | "
          f"{statistics.median(ours_t) * 1e3:.0f} ms | peak {peak:.2f} MB, kept "
          f"{kept / 1e3:.0f} KB, whatever the run's length |")
    if cpp_t:
        print(f"| Megatron's greedy index, C++ (g++ -O2) | {statistics.median(cpp_t):.2f} s | "
              f"{index_bytes / 1e6:,.0f} MB (uint8 + int64 a sample) |")
    print(f"| Megatron's greedy index, NumPy per sample (1 M timed, scaled) | {py_t:,.0f} s | "
          f"{index_bytes / 1e6:,.0f} MB |")

    a = np.array([round(x * m.period) for x in m.weights], dtype=np.int64)
    chunk = 1_000_000
    plan = m._core.plan

    def ours() -> Any:
        for lo in range(0, check, chunk):
            yield plan.locate(np.arange(lo, min(check, lo + chunk), dtype=np.int64))[0]

    t = time.perf_counter()
    ok, eff, req = prefix_deviation(ours(), a, m.period, weights, k)
    ours_check = time.perf_counter() - t
    print(f"\nEvery prefix of the first {check:,} positions (computed directly, "
          f"{ours_check:.1f} s with the check):")
    print("\n" + common.head("", "max over prefixes of |count - weight x n|, weights as kept",
                             "... weights as asked",
                             "every count floor or ceil of its share (weights as kept)"))
    print(f"| loaderx.mix (kept to 1/{m.period}) | {eff:.3f} | {req:.3f} | {ok} |")
    # The same weights to 3 decimals: ratios of a period of 1000 at most, kept exactly.
    w3 = np.round(weights, 3)
    m3 = mix(sources, w3.tolist(), seed=1)
    a3 = np.array([round(x * m3.period) for x in m3.weights], dtype=np.int64)
    plan3 = m3._core.plan
    ok3, eff3, req3 = prefix_deviation(
        (plan3.locate(np.arange(lo, min(check, lo + chunk), dtype=np.int64))[0]
         for lo in range(0, check, chunk)), a3, m3.period, w3 / w3.sum(), k)
    print(f"| loaderx.mix, the weights to 3 decimals (period {m3.period}, kept exactly) | "
          f"{eff3:.3f} | {req3:.3f} | {ok3} |")
    if index is not None:
        mega = (index[lo:min(check, lo + chunk)].astype(np.int64) for lo in range(0, check, chunk))
        q = m.period
        _, _, req_m = prefix_deviation(mega, a, q, weights, k)
        print(f"| Megatron's greedy (float weights) | - | {req_m:.3f} | "
              f"{'yes' if req_m < 1 else 'no'} (within one of the asked weights) |")


def main(repeats: int = 5, samples: int = 100_000_000, check: int = 10_000_000,
         only: str | None = None) -> None:
    with common.scratch("loaderx-bench-mix-") as root:
        if only in (None, "throughput"):
            throughput(root, repeats)
        if only in (None, "megatron"):
            megatron(root, samples, check, min(repeats, 3))


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=100_000_000)
    parser.add_argument("--check", type=int, default=10_000_000)
    parser.add_argument("--only", choices=["throughput", "megatron"])
    args = parser.parse_args(argv)
    main(args.repeats, args.samples, args.check, args.only)


if __name__ == "__main__":
    common.standalone(cli)
