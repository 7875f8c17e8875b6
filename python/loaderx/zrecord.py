"""Zrecord: the persistent record store, as raw byte records.

A store is a directory of byte records addressed by a dense index ``0..len``. Every operation
is a batch: append packs many records into one buffer, gather reads many records straight into
one destination array, with the GIL released and the work split across cores.

>>> import numpy as np, tempfile
>>> from loaderx.zrecord import Zrecord
>>> with Zrecord(tempfile.mkdtemp() + "/store") as z:
...     first = z.append(b"hello" + b"world!", offsets=[0, 5])
...     dst = np.zeros(11, dtype=np.uint8)
...     z.gather([1, 0], dst, offsets=[0, 6])
...     bytes(dst)
b'world!hello'

Appended records are visible to every thread using the handle as soon as ``append`` returns;
``sync()`` (or ``close()``) makes them durable and visible to every other handle and process.
See docs/guide/store.md, "Many handles and processes", for what several handles may do at once.
"""

from __future__ import annotations

import atexit
import json
import os
import re
from typing import Any, Literal

import numpy as np

from loaderx import _native
from loaderx._convert import as_indices, as_offsets, destination_bytes, source_bytes
from loaderx._store import schema as _schema
from loaderx.errors import DatasetError, LoaderxValueError
from loaderx.errors import ZrecordError as _ZrecordError

__all__ = ["Zrecord", "Codec", "CODECS", "MAX_RECORDS", "MAX_RECORD_BYTES", "CHUNK_CAPACITY",
           "MAX_CHUNKS", "chunk_number", "ZrecordError", "MAX_RECORD_LEN", "SCHEMA", "FORMAT"]

#: A codec name, for type checkers: ``codec="lz4"`` is an error before the program runs.
Codec = Literal["raw", "zstd", "zstd_dict"]

#: Codec names accepted by :class:`Zrecord` and :meth:`Zrecord.append` (the engine's list;
#: ``tests/test_errors.py`` checks that :data:`Codec` spells the same names).
CODECS: tuple[str, ...] = _native.CODECS
#: Most records one store holds.
MAX_RECORDS: int = _native.MAX_RECORDS
#: Largest record, in bytes.
MAX_RECORD_BYTES: int = _native.MAX_RECORD_BYTES
#: loaderx 0.9.11's names, for code written against it: its error class (every loaderx error:
#: ``e.code`` as it had it), the record limit, and the schema file's name and format tag.
ZrecordError = _ZrecordError
MAX_RECORD_LEN: int = MAX_RECORD_BYTES
SCHEMA: str = _schema.SCHEMA_FILE
FORMAT: str = _schema.FORMAT
#: Bytes one chunk file holds at most, and chunk files one store holds (docs/FORMAT.md).
CHUNK_CAPACITY = 1 << 32
MAX_CHUNKS = MAX_RECORDS * MAX_RECORD_BYTES // CHUNK_CAPACITY  # 4096

_CHUNK_NAME = re.compile(r"(0|[1-9][0-9]{0,3})\.zr")


def chunk_number(name: str) -> int | None:
    """The number of the chunk file called ``name`` in a store (``0.zr`` .. ``4095.zr``, as
    docs/FORMAT.md spells them), or None for any other name."""
    m = _CHUNK_NAME.fullmatch(name)
    if m is None or int(m.group(1)) >= MAX_CHUNKS:
        return None
    return int(m.group(1))


#: A dataset directory's manifest (see loaderx.intake.directory), and the most of it read here.
_MANIFEST, _MANIFEST_LIMIT = "manifest.json", 16 << 20


def dataset_column(path: str) -> tuple[str, str] | None:
    """``(dataset directory, column name)`` when the store ``path`` is the store of a column
    of a dataset directory (the manifest beside it names it; in a directory of parts, the
    dataset is the directory above ``parts/``), else None."""
    store = os.path.abspath(path)
    parent, base = os.path.split(store)
    manifest = os.path.join(parent, _MANIFEST)
    if not os.path.lexists(manifest):
        return None
    try:
        fd = os.open(manifest, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            body = json.loads(os.read(fd, _MANIFEST_LIMIT).decode("utf-8"))
        finally:
            os.close(fd)
    except (OSError, ValueError, RecursionError):
        return None  # not a manifest this layer can read: opening the dataset says what is wrong
    if not isinstance(body, dict) or body.get("format") != "loaderx-dataset" or \
            not isinstance(body.get("columns"), list):
        return None
    for c in body["columns"]:
        if isinstance(c, dict) and c.get("store") == base and isinstance(c.get("name"), str):
            root = parent
            up, folder = os.path.split(os.path.dirname(parent))
            if folder == "parts" and os.path.lexists(os.path.join(up, _MANIFEST)):
                root = up  # a part of a directory of parts
            return root, c["name"]
    return None


def _refuse_a_column(path: str, what: str) -> None:
    found = dataset_column(path)
    if found is None:
        return
    root, name = found
    raise DatasetError(
        f"{path} is the store of column {name!r} of the dataset directory {root}: to {what} "
        "one column alone would leave the columns with different row counts, and the "
        "directory would no longer open. Change every column at once: "
        "loaderx.intake.append_dataset(dataset, more) or a converter's append=True to add "
        "rows, loaderx.intake.delete_rows(dataset, indices) to delete them")


# At exit, wait for native calls other threads are making before the interpreter finalizes
# (a thread coming back from one into a finalizing interpreter would abort the process).
atexit.register(_native.begin_exit)


def _codec(codec: Any) -> Codec:
    """The canonical name of ``codec``; the engine decides (LoaderxValueError if unknown)."""
    name: Codec = _native.canonical_codec(codec)
    return name


class Zrecord:
    """A handle on the store in directory ``path``, created (with missing parent directories)
    if it does not exist.

    ``codec`` is the default for :meth:`append`: ``"raw"``, ``"zstd"`` (level 3) or
    ``"zstd_dict"`` (level 19 against the store's trained dictionary). A record that does not
    shrink is stored raw whatever the codec.

    Integrity: a store can keep a checksum per record (:meth:`enable_checksums`, kept in
    ``sums.zr``, which the reference ignores). :meth:`verify` checks every record;
    ``verify_reads=True`` also checks each record a gather reads, raising
    :class:`~loaderx.errors.CorruptStoreError` on a mismatch.

    Handles are safe to share between threads: ``gather`` and ``append`` may run concurrently;
    ``delete`` and ``compact`` need the store to themselves and raise
    :class:`~loaderx.errors.StoreBusyError` while other calls are in flight.

    Several handles and processes: one writer at a time (the first write takes the store's
    writer lock until :meth:`close`; another writer gets
    :class:`~loaderx.errors.StoreBusyError` at once), readers unlimited. Other handles see a
    writer's records once it syncs. After another handle deletes records, reads raise
    :class:`~loaderx.errors.StoreChangedError` until :meth:`refresh`; another handle's
    compaction needs nothing. A handle inherited across ``fork`` reads but does not write.
    """

    def __init__(self, path: str | os.PathLike[str], codec: Codec = "zstd", *,
                 verify_reads: bool = False, _chunk_capacity: int | None = None):
        self._path = os.fspath(path)
        self._native = _native.Zrecord(self._path, _codec(codec), _chunk_capacity)
        if verify_reads:
            self._native.verify_reads = True

    # -- introspection -------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The store directory."""
        return self._path

    @property
    def codec(self) -> str:
        """The default codec of :meth:`append`."""
        return self._native.codec

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._native.closed

    def __len__(self) -> int:
        return len(self._native)

    def __repr__(self) -> str:
        if self.closed:
            return f"Zrecord({self._path!r}, closed)"
        return f"Zrecord({self._path!r}, records={len(self)}, codec={self.codec!r})"

    # -- batch operations ----------------------------------------------------------------------
    def append(self, src: Any, offsets: Any, codec: Codec | None = None) -> int:
        """Appends the records packed in ``src`` and returns the index of the first one.

        Record ``i`` is ``src[offsets[i]:offsets[i+1]]``; the last runs to the end of ``src``.
        ``src`` is any C-contiguous bytes-like object or array (its bytes are used); offsets
        must be non-decreasing. ``codec`` overrides the handle's default for this call.

        The store of a column of a dataset directory is refused (DatasetError, see
        :meth:`delete`): append rows to every column at once with
        :func:`loaderx.intake.append_dataset` or a converter's ``append=True``.
        """
        _refuse_a_column(self._path, "append to")
        return self._native.append(
            source_bytes(src), as_offsets(offsets), None if codec is None else _codec(codec)
        )

    def gather(self, idxs: Any, dst: Any, offsets: Any) -> None:
        """Reads record ``idxs[i]`` into the bytes of ``dst`` starting at byte ``offsets[i]``.

        ``dst`` is any writable C-contiguous array (any dtype; its bytes are filled).
        Destination ranges must fit in ``dst`` and must not overlap. Compressed records are
        decompressed straight into ``dst``.
        """
        if not self._native.try_gather(idxs, dst, offsets):  # usual arrays need no conversion
            self._native.gather(
                as_indices(idxs), destination_bytes(dst), as_offsets(offsets, "destination offsets")
            )

    def gather_parts(self, idxs: Any, starts: Any, lens: Any, dst: Any, offsets: Any) -> None:
        """Reads windows of records: bytes ``starts[i] .. starts[i] + lens[i]`` of record
        ``idxs[i]`` into the bytes of ``dst`` starting at byte ``offsets[i]``.

        A raw record's window is copied alone; a compressed record is decoded once per call
        however many windows of it are asked for. Windows must lie inside their records and
        destination ranges inside ``dst``, without overlapping; a refused call writes nothing.
        """
        self._native.gather_parts(
            as_indices(idxs), as_offsets(starts, "starts"), as_offsets(lens, "lens"),
            destination_bytes(dst), as_offsets(offsets, "destination offsets"))

    def lengths(self, idxs: Any) -> np.ndarray:
        """The logical length in bytes of each record, as a uint32 array."""
        idx = as_indices(idxs)
        out = np.empty(len(idx), dtype=np.uint32)
        self._native.lengths_into(idx, out)
        return out

    def prefetch(self, idxs: Any) -> bool:
        """Starts reading records ``idxs`` into the page cache and returns without waiting, so
        that a later :meth:`gather` of them finds them in memory. A hint: indices past the end
        are ignored, and records a probe finds cached cost nothing. Returns whether any read
        was asked for."""
        return self._native.prefetch(as_indices(idxs))

    @property
    def recently_cold(self) -> bool:
        """Whether the last gather or prefetch of this handle found records that were not in
        memory (and so read them from the disk)."""
        return self._native.recently_cold

    def delete(self, idxs: Any) -> None:
        """Deletes records. The last record moves into each hole (swap-tail), so other indices
        can change; duplicates are deleted once. Durable on return.

        The store of a column of a dataset directory is refused (DatasetError): its columns
        must keep one row count; :func:`loaderx.intake.delete_rows` deletes from every column
        (and :func:`loaderx.intake.append_dataset` appends to every column) at once."""
        _refuse_a_column(self._path, "delete from")
        self._native.delete(as_indices(idxs))

    def compact(self) -> dict[str, int]:
        """Repacks the live records in place to reclaim the space of deleted ones. Safe to
        interrupt and re-run. Returns what it did (``moved``, ``skipped``, ``chunks_removed``,
        ``chunk_bytes_before``, ``chunk_bytes_after``)."""
        return self._native.compact()

    def stats(self) -> dict[str, int]:
        """Space accounting: ``records``, ``live_bytes`` (stored), ``chunk_bytes`` (chunk space
        below the append frontier), ``reclaimable`` (their difference, an upper bound of what
        :meth:`compact` frees), plus ``logical_bytes``, ``compressed_records``, ``chunks``,
        ``dict_bytes`` and ``checksums`` (whether the store keeps record checksums)."""
        return self._native.stats()

    def sync(self) -> None:
        """Makes everything appended so far durable and visible to other handles and
        processes."""
        self._native.sync()

    def lock_for_writing(self) -> None:
        """Takes the store's writer lock now instead of at the first write, so that a store
        another handle or process is writing is refused
        (:class:`~loaderx.errors.StoreBusyError`) before any work. Held until :meth:`close`."""
        self._native.lock_for_writing()

    @property
    def is_writer(self) -> bool:
        """Whether this handle holds the store's writer lock."""
        return self._native.is_writer

    def refresh(self) -> None:
        """Accepts the store as other handles and processes left it. After another handle
        deleted records, reads raise :class:`~loaderx.errors.StoreChangedError` until this is
        called: indices then mean what they mean on disk now."""
        self._native.refresh()

    def _retire(self) -> None:
        """Marks the store as replaced for every other handle (the converters call this
        under the writer lock before renaming a new dataset into its place)."""
        self._native.retire()

    def train_dict(self, samples: Any, sizes: Any, target: int) -> int:
        """Trains the store's zstd dictionary (at most ``target`` bytes) on ``samples``, the
        concatenation of samples of the given ``sizes``, and saves it as ``dict.zr``. Returns
        its size. A store's dictionary cannot be replaced once trained."""
        if not isinstance(target, (int, np.integer)) or target <= 0:
            raise LoaderxValueError(f"target must be a positive int, got {target!r}")
        return self._native.train_dict(
            source_bytes(samples, "samples"), as_offsets(sizes, "sizes"), int(target)
        )

    def has_dict(self) -> bool:
        """Whether the store has a trained dictionary."""
        return self._native.has_dict()

    # -- integrity -----------------------------------------------------------------------------
    def enable_checksums(self) -> int:
        """Starts keeping a checksum (XXH3-64) of every record: sums the records already in the
        store (decoding each) and every later append. Returns how many records were summed now
        (0 if the store already kept checksums). zstd frames written from then on also carry
        zstd's own content checksum. Needs the store to itself, like :meth:`compact`."""
        return self._native.enable_checksums()

    def has_checksums(self) -> bool:
        """Whether the store keeps record checksums."""
        return self._native.has_checksums()

    @property
    def verify_reads(self) -> bool:
        """Whether every gather checks the records it reads against their checksums."""
        return self._native.verify_reads

    @verify_reads.setter
    def verify_reads(self, on: bool) -> None:
        self._native.verify_reads = bool(on)

    def verify(self, max_listed: int = 1000) -> dict[str, Any]:
        """Decodes every record and checks it against its checksum when one is kept. Returns
        ``records``, ``checked`` (compared with a checksum), ``unchecked`` (decoded, no checksum
        to compare), ``failed`` (damaged records, all counted) and ``failures``: ``(index,
        message)`` of the damaged records of lowest index, at most ``max_listed`` of them (so
        memory stays bounded however much is damaged). Damage is reported, not raised."""
        if isinstance(max_listed, bool) or not isinstance(max_listed, int) or max_listed < 0:
            raise LoaderxValueError(f"max_listed must be an int >= 0, got {max_listed!r}")
        return self._native.verify(max_listed)

    def close(self) -> None:
        """Syncs, lets the writer lock go and closes the handle. Later calls raise
        :class:`~loaderx.errors.StoreClosedError`; closing twice is harmless."""
        self._native.close()

    def __enter__(self) -> Zrecord:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
