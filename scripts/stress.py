#!/usr/bin/env python3
"""The heavy versions of the reliability tests: ``python scripts/stress.py [--kills N]
[--fuzz-cases N] [--race-seconds S] [--mp-seconds S] [--mp-readers N] [--seed S]
[--edge-kills N] [--resume-rounds N] [--only kills|race|fuzz|mp|edges]``.

* SIGKILL loops through the store API and through the converters (``--kills`` each), and
  during compaction (``--kills / 5``);
* readers verifying every byte beside two appenders (``--race-seconds``);
* the mutation fuzzer (``scripts/fuzz_store.py``) for ``--fuzz-cases`` cases;
* issue 19's edges (``scripts/stress_edges.py``): ``--edge-kills`` SIGKILLs of repeated
  ``overwrite=True`` conversions, forks while a parent thread is inside a native call, resumes
  through prefetchers of every size, padded sharded passes, ``--resume-rounds`` rounds of
  resumable Parquet conversions SIGKILLed at random steps and resumed (exactly the files' rows,
  no finished part converted twice), and the archive fuzzer (``scripts/fuzz_archive.py``) for
  ``--fuzz-cases / 50`` cases;
* many processes on one store (``--mp-seconds``): ``--mp-readers`` reader processes verify
  every record they gather while one writer process appends, deletes and compacts, and another
  process keeps trying to write (and must be refused every time).

Prints what ran and the counts docs/RELIABILITY.md reports; exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import multiprocessing as mp
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import reliability as rel  # noqa: E402

# -- many processes on one store ---------------------------------------------------------------
#
# Deletes move records (swap-tail), so which record an index names is published by the writer:
# the model file holds the record id of every index, rewritten under an exclusive flock with
# each delete (and after each synced append). A reader refreshes its handle and reloads the
# model together under a shared flock, so the model it checks against is the state its handle
# accepted, and a delete after that makes its reads fail (StoreChangedError) instead of
# returning records the model does not name. Compactions take no part in this: they change no
# index, and readers must not notice them.

MP_HANG = 120.0  # seconds a process may take to stop once told: past this, it is hung


def _publish(model_path: str, ids: list[int]) -> None:
    tmp = f"{model_path}.{os.getpid()}.tmp"
    np.save(tmp, np.asarray(ids, dtype=np.uint64))
    os.replace(tmp + ".npy", model_path)


def _mp_writer(path: str, lock_path: str, model_path: str, seed: int, ready, stop,
               results) -> None:
    """Appends batches (synced), deletes random records and compacts, until ``stop``."""
    from loaderx.zrecord import Zrecord

    rng = random.Random(seed)
    counts = {"appends": 0, "appended": 0, "deletes": 0, "deleted": 0, "compactions": 0,
              "moved": 0}
    z = Zrecord(path)
    z.lock_for_writing()
    ids = np.load(model_path).tolist()
    next_id = max(ids) + 1
    ready.set()
    lock = open(lock_path, "w")
    step = 0
    while not stop.is_set():
        step += 1
        k = rng.randrange(1, 120)
        first = z.append(*rel.pack([rel.make_record(next_id + j) for j in range(k)]),
                         codec=rng.choice(["raw", "zstd"]))
        if first != len(ids):
            raise AssertionError(f"append returned {first}, the model has {len(ids)} records")
        z.sync()
        ids += range(next_id, next_id + k)
        next_id += k
        counts["appends"] += 1
        counts["appended"] += k
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if step % 3 == 0 and len(ids) > 1500:
                targets = rng.sample(range(len(ids)), rng.randrange(1, min(400, len(ids) // 4)))
                z.delete(targets)
                for t in sorted(targets, reverse=True):  # swap-tail, as the store does
                    ids[t] = ids[-1]
                    ids.pop()
                counts["deletes"] += 1
                counts["deleted"] += len(targets)
            _publish(model_path, ids)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        if step % 10 == 0:
            counts["moved"] += z.compact()["moved"]
            counts["compactions"] += 1
    z.close()
    results.put(("writer", counts))


def _mp_reader(path: str, lock_path: str, model_path: str, seed: int, stop, results) -> None:
    """Gathers random batches and checks every record against the model, until ``stop``."""
    from loaderx.errors import StoreChangedError
    from loaderx.zrecord import Zrecord

    rng = np.random.default_rng(seed)
    counts = {"gathers": 0, "verified": 0, "changed": 0, "mismatches": 0, "first": []}
    z = Zrecord(path)
    lock = open(lock_path)

    def accept() -> np.ndarray:
        fcntl.flock(lock, fcntl.LOCK_SH)  # no delete in progress: the model is the state
        try:
            z.refresh()
            return np.load(model_path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

    ids = accept()
    while not stop.is_set():
        if counts["gathers"] % 32 == 31:  # follow the writer's appends now and then
            ids = accept()
        idx = rng.integers(0, len(ids), size=int(rng.integers(1, 128)), dtype=np.uint64)
        try:
            recs = rel.read_records(z, idx)
        except StoreChangedError:
            counts["changed"] += 1
            ids = accept()
            continue
        for i, rec in zip(idx, recs, strict=True):
            problem = rel.check_record(int(ids[i]), rec)
            if problem:
                counts["mismatches"] += 1
                if len(counts["first"]) < 5:
                    counts["first"].append(f"index {i}: {problem}")
        counts["gathers"] += 1
        counts["verified"] += len(idx)
    z.close()
    results.put(("reader", counts))


def _mp_contender(path: str, ready, stop, results) -> None:
    """Keeps trying to write through fresh handles: every try must be refused."""
    from loaderx.errors import StoreBusyError
    from loaderx.zrecord import Zrecord

    ready.wait()
    counts = {"refused": 0, "accepted": 0}
    rec = rel.pack([rel.make_record(2**40)])  # an id no reader expects: caught if it lands
    attempts = [lambda z: z.append(*rec), lambda z: z.lock_for_writing(),
                lambda z: z.delete([0]), lambda z: z.compact()]
    k = 0
    while not stop.is_set():
        with Zrecord(path) as z:
            try:
                attempts[k % len(attempts)](z)
                counts["accepted"] += 1
            except StoreBusyError:
                counts["refused"] += 1
        k += 1
    results.put(("contender", counts))


def mp_stress(tmp: str, seconds: float, readers: int, seed: int) -> dict:
    """Runs one writer, ``readers`` readers and one contender process on one store for
    ``seconds``, then checks every record. Returns the figures; ``mismatches`` and
    ``abnormal`` must be 0."""
    from loaderx.zrecord import Zrecord

    path, lock_path, model_path = f"{tmp}/mp", f"{tmp}/mp.lock", f"{tmp}/mp-model.npy"
    with Zrecord(path, codec="zstd") as z:
        z.append(*rel.pack([rel.make_record(i) for i in range(3000)]))
    _publish(model_path, list(range(3000)))
    open(lock_path, "w").close()
    ctx = mp.get_context("fork")
    ready, stop_others, stop_writer = ctx.Event(), ctx.Event(), ctx.Event()
    results = ctx.Queue()
    writer = ctx.Process(target=_mp_writer, args=(path, lock_path, model_path, seed, ready,
                                                  stop_writer, results))
    writer.start()
    if not ready.wait(MP_HANG):
        writer.kill()
        raise AssertionError("the writer never took the writer lock")
    others = [ctx.Process(target=_mp_reader, args=(path, lock_path, model_path, seed + 1 + r,
                                                   stop_others, results))
              for r in range(readers)]
    others.append(ctx.Process(target=_mp_contender, args=(path, ready, stop_others, results)))
    for p in others:
        p.start()
    time.sleep(seconds)
    stop_others.set()  # the contender stops before the writer lets its lock go
    procs = others + [writer]
    figures = {"gathers": 0, "verified": 0, "changed": 0, "mismatches": 0, "appends": 0,
               "appended": 0, "deletes": 0, "deleted": 0, "compactions": 0, "moved": 0,
               "refused": 0, "accepted": 0, "abnormal": 0, "signals": 0}
    first: list[str] = []
    reported = []
    deadline = time.monotonic() + MP_HANG
    for p in others:
        p.join(max(0.0, deadline - time.monotonic()))
    stop_writer.set()
    writer.join(MP_HANG)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
            first.append(f"{p.name} hung")
        if p.exitcode != 0:
            figures["abnormal"] += 1
            figures["signals"] += p.exitcode < 0  # killed by a signal (SIGBUS, SIGSEGV, ...)
            first.append(f"{p.name}: exit code {p.exitcode}")
    while len(reported) < sum(p.exitcode == 0 for p in procs):
        reported.append(results.get(timeout=MP_HANG))
    for _, counts in reported:
        first += counts.pop("first", [])
        for k, v in counts.items():
            figures[k] += v
    # The store after it all: exactly the records of the last published model.
    ids = np.load(model_path)
    with Zrecord(path) as z:
        if len(z) != len(ids):
            first.append(f"the store holds {len(z)} records, the model {len(ids)}")
            figures["mismatches"] += 1
        for start in range(0, min(len(z), len(ids)), 4096):
            idx = np.arange(start, min(len(ids), start + 4096), dtype=np.uint64)
            for i, rec in zip(idx, rel.read_records(z, idx), strict=True):
                if rel.check_record(int(ids[i]), rec):
                    figures["mismatches"] += 1
        figures["final_records"] = len(z)
    figures["accepted_is_bug"] = figures.pop("accepted")
    figures["problems"] = first
    return figures


def edges(args: argparse.Namespace) -> None:
    """Issue 19's critical and high findings, looped (see scripts/stress_edges.py)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import stress_edges as se

    with tempfile.TemporaryDirectory() as tmp:
        for what, run in (
            ("SIGKILL during overwrite=True", lambda: se.overwrite_kill_loop(
                tmp, args.edge_kills, args.seed)),
            ("fork during a native call, normal exit", lambda: se.fork_exit_loop(
                tmp, max(3, args.edge_kills // 4), ROOT / "tests")),
            ("checkpoints through prefetchers", lambda: se.prefetch_resume_loop(
                tmp, args.edge_kills, args.seed)),
            ("padded sharded passes", lambda: se.sharded_pass_loop(
                tmp, max(1, args.edge_kills // 4), args.seed)),
            ("SIGKILL during resumable conversions", lambda: se.resume_kill_loop(
                tmp, args.resume_rounds, args.seed)),
        ):
            t = time.perf_counter()
            print(f"{what}: {run()} in {time.perf_counter() - t:.0f} s", flush=True)
    fuzz = ROOT / "scripts" / "fuzz_archive.py"
    if fuzz.exists():
        t = time.perf_counter()
        cases = str(max(100, args.fuzz_cases // 50))
        r = subprocess.run([sys.executable, str(fuzz), "--cases", cases, "--seed", str(args.seed)],
                           capture_output=True, text=True)
        print(f"archive fuzz: {r.stdout.strip()} in {time.perf_counter() - t:.0f} s")
        if r.returncode:
            print(r.stderr[-4000:], file=sys.stderr)
            sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=500)
    parser.add_argument("--fuzz-cases", type=int, default=100_000)
    parser.add_argument("--race-seconds", type=float, default=60.0)
    parser.add_argument("--mp-seconds", type=float, default=60.0)
    parser.add_argument("--mp-readers", type=int, default=4)
    parser.add_argument("--edge-kills", type=int, default=200)
    parser.add_argument("--resume-rounds", type=int, default=10,
                        help="rounds of killed and resumed Parquet conversions (~4 s each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=["kills", "race", "fuzz", "mp", "edges"],
                        help="run one part alone (default: all, in this order)")
    args = parser.parse_args()
    want = lambda part: args.only in (None, part)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        if want("kills"):
            for converter in (False, True):
                t = time.perf_counter()
                stats = rel.kill_loop(f"{tmp}/{'conv' if converter else 'store'}", args.kills,
                                      args.seed + converter, converter)
                what = "converters" if converter else "store API"
                print(f"SIGKILL through the {what}: {stats} in {time.perf_counter() - t:.0f} s")
            t = time.perf_counter()
            stats = rel.compact_kill_loop(f"{tmp}/compact", max(1, args.kills // 5), args.seed)
            print(f"SIGKILL during compaction: {stats} in {time.perf_counter() - t:.0f} s")
        if want("race"):
            counts = rel.race(f"{tmp}/race", args.race_seconds, readers=6, appenders=2)
            print(f"race for {args.race_seconds:.0f} s, 6 readers + 2 appenders: "
                  f"{ {k: v for k, v in counts.items() if k != 'problems'} }, "
                  f"mismatches {len(counts['problems'])}")
            if counts["problems"]:
                print(counts["problems"][:10], file=sys.stderr)
                sys.exit(1)
    if want("fuzz"):
        t = time.perf_counter()
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / "fuzz_store.py"), "--cases",
                            str(args.fuzz_cases), "--seed", str(args.seed)],
                           capture_output=True, text=True)
        print(f"fuzz: {r.stdout.strip()} in {time.perf_counter() - t:.0f} s")
        if r.returncode:
            print(r.stderr[-4000:], file=sys.stderr)
            sys.exit(1)
        json.loads(r.stdout.strip().splitlines()[-1])
    if want("edges"):
        edges(args)
    if want("mp"):
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            f = mp_stress(tmp, args.mp_seconds, args.mp_readers, args.seed)
        print(f"many processes for {args.mp_seconds:.0f} s ({time.perf_counter() - t:.0f} s "
              f"in all), {args.mp_readers} readers + 1 writer + 1 contender: "
              f"{f['gathers']} gathers, {f['verified']} records verified, {f['changed']} "
              f"changed-errors (refreshes); writer: {f['appends']} appends "
              f"({f['appended']} records), {f['deletes']} deletes ({f['deleted']} records), "
              f"{f['compactions']} compactions ({f['moved']} records moved); {f['refused']} "
              f"writes refused, {f['accepted_is_bug']} accepted; {f['final_records']} records "
              f"at the end; mismatches {f['mismatches']}, killed by signals {f['signals']}, "
              f"abnormal exits {f['abnormal']}")
        if f["mismatches"] or f["abnormal"] or f["accepted_is_bug"] or f["problems"]:
            print(f["problems"][:10], file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
