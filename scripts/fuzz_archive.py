#!/usr/bin/env python3
"""Seeded mutation fuzzing of ``unpack``: ``python scripts/fuzz_archive.py [--seconds N]
[--cases N] [--seed S] [--memory-mib M] [--case-timeout S]`` (60 seconds when neither
``--seconds`` nor ``--cases`` is given; with both, whichever ends first).

Packs a few small stores (raw without checksums, zstd with checksums, one with holes left by
compaction, a ragged zstd_dict one) as ``.tar`` and ``.tar.gz`` (and the raw one as ``.tar.xz``
and ``.tar.bz2``), then, until ``--seconds`` have passed (or ``--cases`` were tried), mutates
one archive -- bit flips, byte sets, truncation, duplicated or removed 512-byte blocks, edited
header fields with their checksum fixed, edited pax records, a hostile member inserted -- and
unpacks it in a worker process that runs under an address-space-style limit (RLIMIT_DATA,
``--memory-mib``) and a per-case timeout. A compressed archive is mutated either as it is or,
half the time, inside (the tar mutated, then compressed again), so the tar reader is tried
behind a valid gzip too.

Each outcome is one of:

* ``refused``: a CorruptStoreError (good);
* ``intact``: unpacked, and every record and the schema equal the original's (good);
* a bug: ``changed`` (unpacked with other data), ``exception`` (any other error), ``crash``
  (the worker died), ``timeout``, ``memory`` (MemoryError), ``disk`` (more bytes written than
  the archive's store could need).

Prints one JSON line with the counts (per outcome and per mutation); the first bugs go to
stderr with the case's seed so they can be replayed; exits 1 if there was any.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import random
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import tarcraft as tc  # noqa: E402

BLOCK = 512
GOOD = ("refused", "intact")

# -- the worker: unpacks one archive per request, under the limits -------------------------------

WORKER = r"""
import hashlib, json, os, resource, shutil, sys
import numpy as np
from loaderx.archive import unpack
from loaderx.errors import CorruptStoreError
from loaderx.zrecord import Zrecord

limit = int(sys.argv[1])
written = [0]
real_pwrite = os.pwrite
def counting_pwrite(fd, data, offset):
    written[0] += len(data)
    return real_pwrite(fd, data, offset)
os.pwrite = counting_pwrite

def digest(path):
    h = hashlib.sha256()
    with Zrecord(path) as z:
        n = len(z)
        h.update(n.to_bytes(8, "little"))
        for start in range(0, n, 4096):
            idx = np.arange(start, min(n, start + 4096), dtype=np.uint64)
            lens = z.lengths(idx).astype(np.uint64)
            offsets = np.zeros(len(idx), dtype=np.uint64)
            np.cumsum(lens[:-1], out=offsets[1:])
            dst = np.empty(int(lens.sum()), dtype=np.uint8)
            z.gather(idx, dst, offsets)
            for o, k in zip(offsets, lens):
                h.update(int(k).to_bytes(8, "little"))
                h.update(dst[int(o):int(o) + int(k)].tobytes())
    schema = os.path.join(path, "schema.msgpack")
    h.update(open(schema, "rb").read() if os.path.exists(schema) else b"(no schema)")
    return h.hexdigest()

if sys.argv[2] == "--digest":
    print(digest(sys.argv[3]))
    sys.exit(0)
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    written[0] = 0
    out = {}
    try:
        unpack(req["archive"], req["dst"])
        out["outcome"] = "unpacked"
        out["digest"] = digest(req["dst"])
    except CorruptStoreError as e:
        out["outcome"] = "refused"
        out["message"] = str(e)[:300]
    except MemoryError as e:
        out["outcome"] = "memory"
        out["message"] = repr(e)[:300]
    except Exception as e:
        out["outcome"] = "exception"
        out["message"] = f"{type(e).__name__}: {e}"[:500]
    shutil.rmtree(req["dst"], ignore_errors=True)
    out["written"] = written[0]
    print(json.dumps(out), flush=True)
"""
# Free-threaded CPython's allocator (mimalloc) reserves 1 GiB of address space as it starts;
# reserving in steps of 64 MiB keeps the worker's RLIMIT_DATA a limit on what it uses. (Other
# interpreters ignore the variable.)
WORKER_ENV = {**os.environ, "MIMALLOC_ARENA_RESERVE": "64M"}


class Worker:
    """A long-lived unpacking process; replaced after a crash, a timeout or a MemoryError."""

    def __init__(self, memory: int) -> None:
        self.memory = memory
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", WORKER, str(self.memory), "--serve"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=WORKER_ENV)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the unpacking worker did not start")
        return proc

    def run(self, archive: str, dst: str, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self.start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps({"archive": archive, "dst": dst}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.stop()
            return {"outcome": "crash", "message": "the worker was gone"}
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.stop()
            return {"outcome": "timeout", "message": f"no answer within {timeout} s"}
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.proc = None
            return {"outcome": "crash", "message": f"the worker died (exit status {code})"}
        out = json.loads(line)
        if out["outcome"] == "memory":
            self.stop()
        return out

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


# -- the stores and their archives ---------------------------------------------------------------


def build_stores(root: str) -> dict[str, str]:
    import numpy as np

    from loaderx import Zrecord, from_iterator, from_numpy

    rng = np.random.default_rng(0)
    paths = {}
    paths["raw"] = f"{root}/raw"
    from_numpy(paths["raw"], rng.integers(0, 1000, (64, 16), dtype=np.int32), codec="raw")
    paths["zstd"] = f"{root}/zstd"
    from_numpy(paths["zstd"], (np.arange(4000, dtype=np.float32) % 7).reshape(250, 16),
               codec="zstd", checksums=True)
    paths["holes"] = f"{root}/holes"
    from_numpy(paths["holes"], rng.normal(size=(600, 64)).astype(np.float32), codec="raw")
    with Zrecord(paths["holes"]) as z:
        z.delete(np.arange(0, 300, dtype=np.uint64))
        z.compact()
    paths["ragged"] = f"{root}/ragged"
    base = rng.integers(0, 255, size=300, dtype=np.uint8)
    from_iterator(paths["ragged"], [np.roll(base, int(k))[: int(n)] for k, n in
                                    zip(rng.integers(0, 50, 120), rng.integers(1, 300, 120),
                                        strict=True)],
                  codec="zstd_dict", dict_size=2048, progress=False)
    return paths


def build_archives(root: str, stores: dict[str, str]) -> dict[str, tuple[str, bytes, int]]:
    """name -> (suffix, archive bytes, data bytes of its store)."""
    from loaderx.archive import pack

    out = {}
    for store, path in stores.items():
        suffixes = [".tar", ".tar.gz"] + ([".tar.xz", ".tar.bz2"] if store == "raw" else [])
        for suffix in suffixes:
            archive = f"{root}/{store}{suffix}"
            r = pack(path, archive)
            out[f"{store}{suffix}"] = (suffix, pathlib.Path(archive).read_bytes(),
                                       r["bytes_packed"])
    return out


def digest_of(store: str, memory: int) -> str:
    proc = subprocess.run([sys.executable, "-c", WORKER, str(memory), "--digest", store],
                          capture_output=True, text=True, check=True, env=WORKER_ENV)
    return proc.stdout.strip()


# -- mutations -----------------------------------------------------------------------------------


def header_offsets(tar: bytes) -> list[int]:
    at, out = 0, []
    while at + BLOCK <= len(tar) and tar[at:at + BLOCK].count(0) != BLOCK:
        out.append(at)
        try:
            size = int(tar[at + 124:at + 136].split(b"\0")[0].strip() or b"0", 8)
        except ValueError:
            break
        at += BLOCK + -(-size // BLOCK) * BLOCK
    return out


FIELDS = {"name": (0, 100), "mode": (100, 8), "uid": (108, 8), "size": (124, 12),
          "mtime": (136, 12), "typeflag": (156, 1), "linkname": (157, 100), "magic": (257, 8),
          "prefix": (345, 155), "checksum": (148, 8)}
NAMES = [b"ds/4096.zr", b"ds/../escape.zr", b"/abs/meta.zr", b"ds/meta.zr", b"ds/0.zr",
         b"ds/sub/0.zr", b"other/0.zr", b"ds/dict.zr", b"ds/gen.zr", b"ds", b"ds/"]


def field_value(rng: random.Random, width: int) -> bytes:
    choice = rng.randrange(6)
    if choice == 0:
        return bytes(width)
    if choice == 1:
        return b"\xff" * width
    if choice == 2:
        return b"\x80" + bytes([rng.randrange(256) for _ in range(width - 1)])
    if choice == 3:
        digits = "".join(rng.choice("01234567") for _ in range(width - 1))
        return digits.encode() + b"\0"
    if choice == 4:
        return rng.choice(NAMES)[:width].ljust(width, b"\0")
    return bytes([rng.randrange(256) for _ in range(width)])


def edit_header(tar: bytes, rng: random.Random) -> tuple[bytes, str]:
    offsets = header_offsets(tar)
    if not offsets:
        return tar, "edit-header (none)"
    at = rng.choice(offsets)
    name = rng.choice(list(FIELDS))
    start, width = FIELDS[name]
    h = bytearray(tar[at:at + BLOCK])
    if name == "typeflag":
        h[156:157] = rng.choice([b"0", b"1", b"2", b"3", b"5", b"7", b"g", b"x", b"L", b"K",
                                 b"S", b"V", b"\0", bytes([rng.randrange(256)])])
    else:
        h[start:start + width] = field_value(rng, width)
    fixed = name != "checksum" and rng.random() < 0.85
    if fixed:
        tc.set_checksum(h)
    return tar[:at] + bytes(h) + tar[at + BLOCK:], f"edit-header {name}{' +sum' if fixed else ''}"


PAX_VALUES: dict[str, Callable[[random.Random, str], str]] = {
    "number": lambda rng, v: rng.choice(["0", "1", "-1", str(2**63), str(2**64), "12x", "",
                                         str(int(v) + rng.choice([-1, 1, 512, 1 << 32]))
                                         if v.isdigit() else "7"]),
    "name": lambda rng, v: rng.choice(NAMES).decode(),
    "comment": lambda rng, v: v.replace(rng.choice("0123456789"), rng.choice("0123456789"), 1)
    if rng.random() < 0.7 else rng.choice(["{}", "[]", '{"loaderx-pack":2}', "x" * 100]),
}


def edit_pax(tar: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Rebuilds one pax header with one record changed (its length and checksum right)."""
    paxes = [at for at in header_offsets(tar) if tar[at + 156:at + 157] in (b"x", b"g")]
    if not paxes:
        return tar, "edit-pax (none)"
    at = rng.choice(paxes)
    size = int(tar[at + 124:at + 136].split(b"\0")[0], 8)
    body = tar[at + BLOCK:at + BLOCK + size].decode("utf-8", "replace")
    records = []
    for line in body.splitlines():
        key, _, value = line.partition(" ")[2].partition("=")
        records.append([key, value])
    if not records:
        return tar, "edit-pax (empty)"
    record = rng.choice(records)
    kind = ("comment" if record[0] == "comment" else
            "name" if record[0] in ("path", "GNU.sparse.name") else "number")
    if rng.random() < 0.15:  # a record added instead
        record = [rng.choice(["size", "path", "GNU.sparse.realsize", "GNU.sparse.major",
                              "GNU.sparse.map", "linkpath"]), "0"]
        records.append(record)
        kind = "number"
    record[1] = PAX_VALUES[kind](rng, record[1])
    new = tc.pax([(k, v) for k, v in records], tar[at + 156:at + 157])
    end = at + BLOCK + -(-size // BLOCK) * BLOCK
    return tar[:at] + new + tar[end:], f"edit-pax {record[0]}"


def hostile_member(rng: random.Random) -> tuple[bytes, str]:
    meta = tc.meta_member()
    options = [
        (tc.header("ds/meta.zr", 0, b"2"), "symlink"),
        (tc.member("ds/../escape.zr", b"x"), "escape"),
        (tc.member("ds/4096.zr", b"x" * 100), "chunk-past-limit"),
        (meta, "second-meta"),
        (tc.member("ds/notes.txt", b"hello"), "stray"),
        (tc.header("././@PaxHeader", 1 << 30, b"x"), "huge-pax"),
        (tc.header("././@LongLink", 1 << 30, b"L", gnu=True), "huge-longname"),
        (tc.sparse10("ds/0.zr", 1 << 30, [], b"",
                     map_bytes=tc.pad(b"9000000\n" + b"0\n" * 2000)), "sparse-map-bomb"),
        (tc.member("ds/schema.msgpack", b"\x80"), "second-schema"),
        (tc.member("ds/gen.zr", bytes(64)), "gen"),
        (bytes(BLOCK), "zero-block"),
    ]
    return rng.choice(options)


def insert_member(tar: bytes, rng: random.Random) -> tuple[bytes, str]:
    offsets = header_offsets(tar) + [len(tar) - 2 * BLOCK]
    at = rng.choice(offsets)
    blob, what = hostile_member(rng)
    return tar[:at] + blob + tar[at:], f"insert {what}"


def mutate_bytes(data: bytes, rng: random.Random, blocks: bool) -> tuple[bytes, str]:
    """A mutation of the archive's bytes (block-wise ones only where ``blocks``: a tar)."""
    ops = ["flip", "flip", "set", "truncate"] + (["dup-block", "drop-block"] if blocks else [])
    op = rng.choice(ops)
    b = bytearray(data)
    if op in ("flip", "set"):
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(b))
            b[at] = (b[at] ^ (1 << rng.randrange(8)) if op == "flip"
                     else rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)]))
        return bytes(b), op
    if op == "truncate":
        cut = (rng.randrange(len(b) // BLOCK + 1) * BLOCK if blocks and rng.random() < 0.5
               else rng.randrange(len(b)))
        return bytes(b[:cut]), "truncate"
    n = len(b) // BLOCK
    i, k = rng.randrange(n), rng.randint(1, 3)
    chunk = bytes(b[i * BLOCK:(i + k) * BLOCK])
    if op == "dup-block":
        return bytes(b[:i * BLOCK]) + chunk + bytes(b[i * BLOCK:]), op
    return bytes(b[:i * BLOCK]) + bytes(b[(i + k) * BLOCK:]), op


def decompress(suffix: str, data: bytes) -> bytes:
    import bz2
    import lzma

    return {".tar": lambda d: d, ".tar.gz": gzip.decompress, ".tar.xz": lzma.decompress,
            ".tar.bz2": bz2.decompress}[suffix](data)


def compress(suffix: str, data: bytes) -> bytes:
    import bz2
    import lzma

    return {".tar": lambda d: d, ".tar.gz": lambda d: gzip.compress(d, mtime=0),
            ".tar.xz": lzma.compress, ".tar.bz2": bz2.compress}[suffix](data)


def mutate(suffix: str, archive: bytes, rng: random.Random) -> tuple[bytes, str]:
    inside = suffix == ".tar" or rng.random() < 0.5
    if not inside:
        data, what = mutate_bytes(archive, rng, blocks=False)
        return data, f"{what} (compressed)"
    tar = decompress(suffix, archive)
    op = rng.choice(["bytes", "bytes", "header", "pax", "insert"])
    if op == "bytes":
        tar, what = mutate_bytes(tar, rng, blocks=True)
    elif op == "header":
        tar, what = edit_header(tar, rng)
    elif op == "pax":
        tar, what = edit_pax(tar, rng)
    else:
        tar, what = insert_member(tar, rng)
    return compress(suffix, tar), what


# -- the loop ------------------------------------------------------------------------------------


def classify(out: dict, original: str, budget: int) -> str:
    if out["outcome"] == "unpacked":
        kind = "intact" if out["digest"] == original else "changed"
    else:
        kind = out["outcome"]
    if kind in GOOD and out.get("written", 0) > budget:
        return "disk"
    return kind


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long")
    parser.add_argument("--cases", type=int, default=None, help="stop after this many")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-mib", type=int, default=1024)
    parser.add_argument("--case-timeout", type=float, default=120.0)
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = 60.0 if args.cases is None else float("inf")
    memory = args.memory_mib << 20
    root = tempfile.mkdtemp(prefix="loaderx-fuzz-archive-")
    worker = Worker(memory)
    bugs: list[str] = []
    try:
        stores = build_stores(root)
        digests = {name: digest_of(path, memory) for name, path in stores.items()}
        archives = build_archives(root, stores)
        rng = random.Random(args.seed)
        outcomes: Counter[str] = Counter()
        by_mutation: dict[str, Counter[str]] = {}
        started = time.monotonic()
        deadline = started + args.seconds
        case = 0
        while time.monotonic() < deadline and (args.cases is None or case < args.cases):
            name = rng.choice(sorted(archives))
            suffix, original, data_bytes = archives[name]
            case_seed = rng.randrange(2**32)
            blob, what = mutate(suffix, original, random.Random(case_seed))
            path = f"{root}/case{suffix}"
            pathlib.Path(path).write_bytes(blob)
            out = worker.run(path, f"{root}/dst", args.case_timeout)
            kind = classify(out, digests[name.split(".")[0]], 4 * data_bytes + (1 << 20))
            outcomes[kind] += 1
            by_mutation.setdefault(what.split(" ")[0], Counter())[kind] += 1
            if kind not in GOOD:
                bugs.append(f"case {case} ({name}, seed {case_seed}, {what}): {kind}: "
                            f"{out.get('message', '')}")
                shutil.copy(path, f"{root}/bug-{case}{suffix}")
            shutil.rmtree(f"{root}/dst", ignore_errors=True)
            case += 1
        summary = {"cases": case, "seed": args.seed,
                   "seconds": round(time.monotonic() - started, 1),
                   "refused": outcomes["refused"], "intact": outcomes["intact"],
                   "bugs": len(bugs), "outcomes": dict(outcomes),
                   "by_mutation": {k: dict(v) for k, v in sorted(by_mutation.items())}}
        print(json.dumps(summary))
        for b in bugs[:20]:
            print(b, file=sys.stderr)
        if bugs:
            print(f"(the bug archives are kept in {root})", file=sys.stderr)
    finally:
        worker.stop()
        if not bugs:
            shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if bugs else 0)


if __name__ == "__main__":
    main()
