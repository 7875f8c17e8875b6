#!/usr/bin/env python3
"""Packed sequences (``loaderx.pack``): rows of ``python scripts/bench.py loader``, or alone with
``python scripts/bench.py packing [--repeats N] [--micro]``.

Corpus: the Python standard library's own sources (every ``.py`` file outside ``test`` and
``site-packages``, one document per file), byte-level tokens as uint16 (byte + 1; end token 0),
so the tokens compress as text does. Rows of 513 tokens (a GPT-style 512-token row plus its
shifted target), batches of 32. Tables:

* throughput -- tokens per second a training loop receives, medians of several runs, the same
  corpus for all: the nanoGPT-style baseline (one ``np.memmap`` of every token, each row a
  random ``seq_len``-token slice, one fancy index per batch; no segment ids, no positions,
  documents cut anywhere) against the ``DataLoader`` over ``pack()`` (tokens, segment ids and
  positions), raw and zstd stores, documents whole (one file is over the 1 MiB record limit:
  1 MiB pieces) or written in 4 KiB / 16 KiB pieces (``max_record_bytes=``), ``num_workers``
  0 and 2; then the zstd decode ceiling: ``zstd -b`` on the same bytes in blocks of the piece
  size, and what a batch must decode at that speed (a row decodes each piece it touches);
  and Grain's packing (``ConcatThenSplitIterDataset`` and ``FirstFitPackIterDataset`` over the
  documents held in memory, batched by Grain) where ``grain`` imports; then the time a training
  loop waits per batch behind a 1 ms step that releases the GIL, and the ratio by batch size;
* plan -- the row plan of 10 M documents (synthetic lognormal lengths, seq_len 2048): seconds
  and peak memory (tracemalloc) to build it, and what it keeps;
* codec -- 1 KiB token rows (512 tokens, a dense store): one gather of 32 random rows, raw vs
  zstd;
* long documents -- 100 documents of 100 k tokens: a packed batch (gather and companion
  arrays) from raw and zstd stores, whole records and pieces.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import sysconfig
import time
import tracemalloc
from typing import Any

import numpy as np

import _bench_common as common

BATCH, SEQ = 32, 513
EOS = 0


def corpus_files() -> list[pathlib.Path]:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    return [f for f in sorted(root.rglob("*.py"))
            if not {"test", "tests", "site-packages", "idlelib"} & set(f.relative_to(root).parts)]


def documents(files: list[pathlib.Path]) -> list[np.ndarray]:
    """Byte-level tokens: byte b is token b + 1 (0 is the end token)."""
    docs = []
    for f in files:
        raw = np.frombuffer(f.read_bytes(), dtype=np.uint8)
        docs.append(raw.astype(np.uint16) + 1)
    return docs


# -- throughput ----------------------------------------------------------------------------------


def nanogpt(path: pathlib.Path, batches: int, batch_size: int = BATCH) -> float:
    data = np.memmap(path, dtype=np.uint16, mode="r")
    rng = np.random.default_rng(0)
    span = np.arange(SEQ)
    for _ in range(20):
        data[rng.integers(0, len(data) - SEQ, batch_size)[:, None] + span]
    t = time.perf_counter()
    for _ in range(batches):
        x = data[rng.integers(0, len(data) - SEQ, batch_size)[:, None] + span]
    del x
    return time.perf_counter() - t


def loaderx_run(path: pathlib.Path, batches: int, workers: int, method: str = "concat",
                batch_size: int = BATCH, pool_threads: int | None = None) -> float:
    from loaderx import DataLoader, RaggedDataset, pack, set_num_threads
    from loaderx._native import num_threads

    view = pack(RaggedDataset(path), SEQ, method=method, eos_id=EOS)
    threads = num_threads()
    if pool_threads is not None:
        set_num_threads(pool_threads)
    try:
        with DataLoader({"tokens": view}, batch_size=batch_size,
                        num_workers=workers) as loader:
            elapsed = common.time_next(loader, batches, 20)
            batch = next(loader)  # untimed: the shape check below
    finally:
        set_num_threads(threads)
    assert batch["tokens_positions"].shape == (batch_size, SEQ)
    view.close()
    return elapsed


def waiting(root: pathlib.Path, workers: int | None, steps: int = 400) -> float:
    """Median time ``next()`` (or the baseline's slicing) takes between 1 ms sleeps."""
    from loaderx import DataLoader, RaggedDataset, pack

    waits = []
    if workers is None:
        data = np.memmap(root / "all.bin", dtype=np.uint16, mode="r")
        rng, span = np.random.default_rng(0), np.arange(SEQ)
        for _ in range(steps):
            t = time.perf_counter()
            data[rng.integers(0, len(data) - SEQ, BATCH)[:, None] + span]
            waits.append(time.perf_counter() - t)
            time.sleep(0.001)
        return statistics.median(waits) * 1e6
    view = pack(RaggedDataset(root / "raw"), SEQ, eos_id=EOS)
    with DataLoader({"tokens": view}, batch_size=BATCH, num_workers=workers) as loader:
        for _ in range(20):
            next(loader)
        for _ in range(steps):
            t = time.perf_counter()
            next(loader)
            waits.append(time.perf_counter() - t)
            time.sleep(0.001)
    return statistics.median(waits) * 1e6


def zstd_ceiling(stream: pathlib.Path, base: float) -> None:
    """The most a zstd store of the corpus can give: a row of 513 tokens decodes every piece it
    touches whole -- about its own bytes plus one piece -- at ``zstd -b``'s decode speed on
    blocks of the piece size (the same corpus bytes), one core."""
    import re
    import subprocess

    exe = shutil.which("zstd")
    if exe is None:
        print("\nzstd CLI not installed: no decode ceiling (apt-get install zstd)")
        return
    print("\n" + common.head("zstd pieces", "`zstd -b3 -B<piece>` decode MB/s",
                             f"decode ceiling, µs per batch of {BATCH} rows (one core)",
                             "best ratio to the baseline"))
    for piece in (1 << 10, 4 << 10, 16 << 10):
        done = subprocess.run([exe, "-b3", f"-B{piece}", "-i2", str(stream)],
                              capture_output=True, text=True)
        out = done.stdout + done.stderr  # zstd -b reports on stdout when it is not a tty
        speeds = re.findall(r"([\d.]+) MB/s,\s+([\d.]+) MB/s", out)
        if not speeds:
            continue
        decode = float(speeds[-1][1]) * 1e6
        per = BATCH * (SEQ * 2 + piece) / decode
        print(common.row(f"{piece >> 10} KiB", f"{decode / 1e6:,.0f}", f"{per * 1e6:,.0f}",
                         f"{base / per:.2f}x"))


def grain_run(docs: list[np.ndarray], batches: int, method: str) -> float | None:
    try:
        import grain
        import grain.experimental as ge
    except ImportError:
        return None
    common.absl_parsed()
    with_eos = [np.append(d, np.uint16(EOS)) for d in docs]
    ds = grain.MapDataset.source(with_eos).shuffle(seed=0).repeat()
    ds = ds.map(lambda t: {"tokens": t}).to_iter_dataset()
    if method == "concat":
        ds = ge.ConcatThenSplitIterDataset(ds, length_struct={"tokens": SEQ})
    else:  # Grain's first fit needs documents truncated to a row first
        ds = ds.map(lambda f: {"tokens": f["tokens"][:SEQ]})
        ds = ge.FirstFitPackIterDataset(ds, length_struct={"tokens": SEQ}, num_packing_bins=64)
    it = iter(ds.batch(BATCH))
    for _ in range(5):
        batch = next(it)
    t = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
    elapsed = time.perf_counter() - t
    assert batch["tokens"].shape == (BATCH, SEQ) and "tokens_segment_ids" in batch
    return elapsed


def throughput(root: pathlib.Path, docs: list[np.ndarray], repeats: int) -> None:
    from loaderx import from_iterator

    stream = np.concatenate([np.append(d, np.uint16(EOS)) for d in docs])
    stream.tofile(root / "all.bin")
    layouts = {"raw": ("raw", 1 << 20), "raw-16k": ("raw", 16 << 10),
               "zstd": ("zstd", 1 << 20), "zstd-4k": ("zstd", 4 << 10),
               "zstd-16k": ("zstd", 16 << 10)}
    for store, (codec, piece) in layouts.items():
        # One file is over the 1 MiB record limit as uint16: 1 MiB pieces for it.
        from_iterator(root / store, docs, codec=codec, progress=False, max_record_bytes=piece)
    fast, slow = 2000, 60
    # Every row once per repeat, in turn (a change of the machine's load hits all rows alike),
    # then each row's median; the ratio to the baseline is also taken per repeat.
    runs: list[tuple[str, Any, int]] = [
        ("nanoGPT-style memmap slices (baseline)",
         lambda: nanogpt(root / "all.bin", fast), fast)]
    for store, label in (("raw", "raw"), ("raw-16k", "raw, 16 KiB pieces"),
                         ("zstd", "zstd, documents whole (1 MiB pieces)"),
                         ("zstd-4k", "zstd, 4 KiB pieces (from_token_stream's zstd layout)"),
                         ("zstd-16k", "zstd, 16 KiB pieces")):
        # Fewer batches where each costs more (zstd whole documents: milliseconds).
        n = fast if store.startswith("raw") else fast // 40 if store == "zstd" else fast // 8
        for workers in (0, 2):
            runs.append((f"loaderx pack concat, {label}, num_workers={workers}",
                         lambda s=store, n=n, w=workers: loaderx_run(root / s, n, w), n))
    runs.append(("loaderx pack concat, raw, num_workers=0, 1 pool thread",
                 lambda: loaderx_run(root / "raw", fast, 0, pool_threads=1), fast))
    runs.append(("loaderx pack first_fit, raw, num_workers=0",
                  lambda: loaderx_run(root / "raw", fast, 0, "first_fit"), fast))
    grain_note = "grain not installed (pip install grain)"
    for method, label in (("concat", "ConcatThenSplit"), ("first_fit", "FirstFitPack")):
        if grain_run(docs, 2, method) is not None:
            runs.append((f"grain {label} (documents in memory)",
                         lambda m=method: grain_run(docs, slow, m), slow))
            grain_note = ""
    seconds = common.interleaved({name: run for name, run, _ in runs}, repeats)
    rows = [(name, statistics.median(seconds[name]), n) for name, _, n in runs]
    base_name = runs[0][0]
    per_repeat = {name: [seconds[base_name][r] / runs[0][2] / (t / n)
                         for r, t in enumerate(seconds[name])] for name, _, n in runs}
    base = rows[0][1] / rows[0][2]
    tokens = sum(len(d) + 1 for d in docs)
    print(f"\n## Packed sequences -- {len(docs)} documents (the standard library's sources, "
          f"{tokens / 1e6:.1f} M byte-level tokens), batch {BATCH} x {SEQ}, medians of "
          f"{repeats}\n")
    print(common.head("loader", "µs/batch", "M tokens/s", "vs baseline", "per repeat (range)"))
    for name, t, n in rows:
        per = t / n
        r = per_repeat[name]
        print(common.row(name, f"{per * 1e6:,.0f}", f"{BATCH * SEQ / per / 1e6:,.1f}",
                         f"{base / per:.2f}x", f"{min(r):.2f}-{max(r):.2f}x"))
    if grain_note:
        print(f"\n{grain_note}")
    zstd_ceiling(root / "all.bin", base)
    grains = {name: t / n for name, t, n in rows if name.startswith("grain")}
    ours = {"concat": rows[1][1] / rows[1][2],
            "first_fit": next(t / n for name, t, n in rows if "first_fit" in name)}
    for name, per in grains.items():
        kind = "concat" if "Concat" in name else "first_fit"
        print(f"loaderx {kind} (raw, num_workers=0) / {name}: {per / ours[kind]:.1f}x")

    # What a training loop waits for per batch when its step releases the GIL (a GPU step):
    # the baseline's slicing runs in the loop; the loader's workers build batches meanwhile.
    print("\n" + common.head("behind a 1 ms GIL-free training step",
                             "median wait per batch, µs"))
    print(common.row("nanoGPT-style memmap slices", f"{waiting(root, None):,.0f}"))
    for workers in (0, 1, 2):
        print(common.row(f"loaderx pack concat, raw, num_workers={workers}",
                         f"{waiting(root, workers):,.0f}"))

    # A packed batch costs a fixed number of NumPy calls plus its bytes: larger batches
    # amortize the calls, where the baseline's cost grows with the tokens.
    print("\n" + common.head("batch size", "baseline M tokens/s",
                             "loaderx concat raw, num_workers=0", "ratio"))
    for size in (32, 128, 512):
        n = max(50, fast * BATCH // size)
        base_t = common.median_of(lambda n=n, size=size: nanogpt(root / "all.bin", n, size),
                                  repeats)
        ours_t = common.median_of(lambda n=n, size=size: loaderx_run(root / "raw", n, 0,
                                                           batch_size=size), repeats)
        rate = n * size * SEQ / 1e6
        print(common.row(size, f"{rate / base_t:,.0f}", f"{rate / ours_t:,.0f}",
                         f"{base_t / ours_t:.2f}x"))


# -- the plan ------------------------------------------------------------------------------------


def plan_cost(repeats: int) -> None:
    from loaderx._views.pack_plan import ConcatPlan, FirstFitPlan

    n, seq = 10_000_000, 2048
    lengths = np.minimum(np.random.default_rng(0).lognormal(np.log(500), 1.0, n),
                         4 * seq).astype(np.uint32)
    print(f"\n## Row plan -- {n // 1_000_000} M documents (lognormal lengths, median 500 "
          f"tokens, {lengths.sum() / 1e9:.1f} G tokens), seq_len {seq}\n")
    print(common.head("method", "seconds", "peak MB while planning", "MB kept", "rows"))
    for name, cls in (("concat", ConcatPlan), ("first_fit", FirstFitPlan)):
        def build(cls=cls):
            t = time.perf_counter()
            cls(lengths, seq, 0, True)
            return time.perf_counter() - t
        seconds = common.median_of(build, repeats)
        tracemalloc.start()
        plan = cls(lengths, seq, 0, True)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(common.row(name, f"{seconds:.2f}", f"{peak / 1e6:.0f}", f"{plan.nbytes / 1e6:.0f}",
                         f"{plan.rows:,}"))
    print("\n(the lengths themselves, 40 MB of uint32, come from the record table and are not "
          "counted)")


# -- codecs --------------------------------------------------------------------------------------


def codec_rows(root: pathlib.Path, docs: list[np.ndarray], repeats: int) -> None:
    from loaderx import DenseDataset, RaggedDataset, from_iterator, from_numpy, pack

    stream = np.concatenate(docs)
    rows = stream[: len(stream) // 512 * 512].reshape(-1, 512)
    rng = np.random.default_rng(0)
    print("\n## Codec -- 1 KiB token rows (512 byte-level tokens) in a dense store, one gather "
          f"of {BATCH} random rows\n")
    print(common.head("codec", "µs/batch", "bytes on disk / raw"))
    raw_bytes = None
    for codec in ("raw", "zstd"):
        from_numpy(root / f"rows-{codec}", rows, codec=codec, progress=False)
        ds = DenseDataset(root / f"rows-{codec}")
        picks = [rng.integers(0, len(ds), BATCH) for _ in range(2000)]
        out = np.empty((BATCH, 512), np.uint16)

        def run(ds=ds, picks=picks, out=out):
            t = time.perf_counter()
            for p in picks:
                ds.gather(p, out)
            return time.perf_counter() - t
        per = common.median_of(run, repeats) / len(picks)
        disk = ds.store.stats()["live_bytes"]
        raw_bytes = raw_bytes or disk
        print(common.row(codec, f"{per * 1e6:.0f}", f"{disk / raw_bytes:.2f}"))

    long_docs = [stream[i * 100_000:(i + 1) * 100_000] for i in range(min(100, len(stream)
                                                                          // 100_000))]
    print(f"\n## Long documents -- {len(long_docs)} documents of 100 k tokens, a packed batch "
          f"of {BATCH} x {SEQ} (gather and segment ids/positions)\n")
    print(common.head("store", "µs/batch", "records"))
    for codec in ("raw", "zstd"):
        for piece in (None, 64 << 10, 16 << 10, 4 << 10):
            name = f"long-{codec}-{piece}"
            kw = {} if piece is None else {"max_record_bytes": piece}
            from_iterator(root / name, long_docs, codec=codec, progress=False, **kw)
            view = pack(RaggedDataset(root / name), SEQ, eos_id=EOS)
            dst = np.empty(BATCH * view.record_bytes, np.uint8)
            picks = [rng.integers(0, len(view), BATCH).astype(np.uint64) for _ in range(200)]

            def run(view=view, picks=picks, dst=dst):
                t = time.perf_counter()
                for p in picks:
                    view.gather_rows(p, dst)
                    view.companions("tokens", p)
                return time.perf_counter() - t
            per = common.median_of(run, repeats) / len(picks)
            what = "whole documents" if piece is None else f"{piece >> 10} KiB pieces"
            print(common.row(f"{codec}, {what}", f"{per * 1e6:,.0f}", f"{len(view.docs):,}"))


def micro(repeats: int = 5) -> None:
    """Per-batch costs without the loader's threads: a packed batch of 32 x 513 through the
    native path and the NumPy reference, ``next()`` of an in-process loader, and the nanoGPT
    slicing, one pool thread, best of ``repeats`` runs of 1000 calls (the same documents)."""
    import loaderx

    with common.scratch("loaderx-bench-packing-micro-") as root:
        # Whole records (the native path): the few documents over 1 MiB are cut to it.
        docs = [d[:(1 << 20) // d.itemsize] for d in documents(corpus_files())]
        loaderx.from_iterator(root / "c", docs, codec="raw", progress=False)
        fast = loaderx.pack(loaderx.RaggedDataset(root / "c"), 513, eos_id=0)
        slow = loaderx.pack(loaderx.RaggedDataset(root / "c"), 513, eos_id=0)
        slow._native = None
        flat = np.concatenate(docs)
        rng = np.random.default_rng(0)
        rows = [rng.integers(0, len(fast), 32).astype(np.uint64) for _ in range(64)]
        starts = [rng.integers(0, len(flat) - 514, 32) for _ in range(64)]
        dst = np.zeros(32 * fast.record_bytes, np.uint8)
        loaderx.set_num_threads(1)

        def best(f: Any, n: int = 1000) -> float:
            runs = []
            for _ in range(repeats):
                t = time.perf_counter()
                for i in range(n):
                    f(i % 64)
                runs.append((time.perf_counter() - t) / n * 1e6)
            return min(runs)

        def packed(view: Any) -> Any:
            return lambda i: (view.gather_rows(rows[i], dst, 1), view.segments(rows[i]))

        base = best(lambda i: np.stack([flat[j:j + 513] for j in starts[i]]))
        with loaderx.DataLoader({"t": fast}, batch_size=32, num_workers=0) as loader:
            loop = best(lambda i: next(loader))
        print("\n## Packed batch costs (32 x 513, one pool thread, best of "
              f"{repeats} x 1000)\n")
        print(common.table(["what", "µs/batch"], [
            ("nanoGPT-style slices", f"{base:.0f}"),
            ("packed rows + segment ids/positions, native", f"{best(packed(fast)):.0f}"),
            ("packed rows + segment ids/positions, NumPy reference",
             f"{best(packed(slow), 300):.0f}"),
            ("next() of an in-process loader over the packed view",
             f"{loop:.0f} ({base / loop:.2f}x the slices)")]))


def main(repeats: int = 5) -> None:
    with common.scratch("loaderx-bench-packing-") as root:
        docs = documents(corpus_files())
        throughput(root, docs, repeats)
        plan_cost(min(repeats, 3))
        codec_rows(root, docs, repeats)


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--micro", action="store_true", help="the per-batch costs alone")
    args = parser.parse_args(argv)
    (micro if args.micro else main)(args.repeats)


if __name__ == "__main__":
    common.standalone(cli)
