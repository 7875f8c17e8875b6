"""Arrow IPC files and Hugging Face ``save_to_disk`` directories, read as untrusted input for
:func:`loaderx.intake.tables.from_arrow`.

* An Arrow IPC *file* (``ARROW1`` magic: Feather v2, ``pyarrow.ipc.new_file``) or *stream*
  (a continuation marker ``0xFFFFFFFF`` first: ``pyarrow.ipc.new_stream``, and every ``.arrow``
  file Hugging Face ``datasets`` writes) is recognised by its first bytes, not its name. Both
  are read as the stream of messages they hold (a file's footer is not consulted beyond its
  length: the stream before it is what is checked and read). Each file is memory-mapped;
  before pyarrow decodes anything, every message's metadata is parsed here (:class:`_Flat`)
  and checked: its size (:data:`MAX_METADATA_BYTES`), each record batch's row count and
  buffers (inside its body; a compressed buffer's declared decoded size, whose sum over a
  batch is bounded by :data:`MAX_BATCH_BYTES`, so a small file cannot make the reader allocate
  gigabytes), and the total row count. Every record batch pyarrow then decodes is validated
  in full (offsets, UTF-8) before its values are used.
* A Hugging Face dataset directory (``Dataset.save_to_disk``): ``state.json`` names its data
  files (``_data_files``), ``dataset_info.json`` its features. Both are read as regular files
  of at most :data:`MAX_JSON_BYTES`; the data files must be plain names of regular files in
  the directory (no ``/``, ``..``, absolute paths, duplicates, and at most :data:`MAX_FILES`);
  a symbolic link whose target is outside the directory is refused. A ``DatasetDict``
  (``dataset_dict.json`` and a folder per split) is refused, naming the splits: convert each
  split's folder on its own.
"""

from __future__ import annotations

import errno
import importlib
import json
import mmap
import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from loaderx._store import schema as _schema
from loaderx.errors import CorruptStoreError, DatasetError, LimitExceededError
from loaderx.zrecord import MAX_RECORDS

#: Largest state.json, dataset_info.json or dataset_dict.json read.
MAX_JSON_BYTES = 16 << 20
#: Largest metadata of one IPC message (a schema with its metadata, a batch's buffer list).
MAX_METADATA_BYTES = 64 << 20
#: Most bytes the buffers of one compressed record batch may declare once decoded.
MAX_BATCH_BYTES = 4 << 30
#: Most data files of one Hugging Face dataset directory.
MAX_FILES = 100_000
#: Most rows of one conversion (the most a dataset directory holds: 2**24 rows per part).
MAX_ROWS = MAX_RECORDS * 100_000

STATE_FILE = "state.json"
INFO_FILE = "dataset_info.json"
DICT_FILE = "dataset_dict.json"
IPC_SUFFIXES = (".arrow", ".arrows", ".feather", ".ipc")
_FILE_MAGIC = b"ARROW1"
_CONTINUATION = b"\xff\xff\xff\xff"


def sniff(path: str) -> str | None:
    """``"parquet"``, ``"ipc_file"``, ``"ipc_stream"`` by the first bytes of ``path``, or None
    (not a regular file, unreadable, or neither)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # never opened: a FIFO would block
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            head = os.pread(fd, 8, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        finally:
            os.close(fd)
    except OSError:
        return None
    if head[:4] == b"PAR1":
        return "parquet"
    if head[:6] == _FILE_MAGIC:
        return "ipc_file"
    if head[:4] == _CONTINUATION and len(head) == 8 and struct.unpack("<i", head[4:])[0] > 0:
        return "ipc_stream"
    return None


# -- Hugging Face dataset directories --------------------------------------------------------


def is_hf_directory(path: str) -> bool:
    """Whether ``path`` is a directory ``Dataset.save_to_disk`` wrote (it has ``state.json``)."""
    return os.path.isdir(path) and os.path.lexists(os.path.join(path, STATE_FILE))


def is_hf_dataset_dict(path: str) -> bool:
    """Whether ``path`` is a directory ``DatasetDict.save_to_disk`` wrote."""
    return os.path.isdir(path) and os.path.lexists(os.path.join(path, DICT_FILE))


def _inside(root: str, name: str, what: str) -> str:
    """The real path of ``root/name``, which must be inside ``root`` (a link may point
    elsewhere in it, never out of it)."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name
            or "\\" in name or "\0" in name or os.path.isabs(name)):
        raise CorruptStoreError(f"{os.path.join(root, STATE_FILE)} names {what} {name!r}: "
                                "only a plain file name inside the directory is read")
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(root, name))
    if real == real_root or os.path.commonpath([real, real_root]) != real_root:
        raise CorruptStoreError(f"{os.path.join(root, name)} is a link to {real}, outside "
                                f"{root}: a Hugging Face dataset directory is read only "
                                "inside itself")
    return real


def _read_json(root: str, name: str) -> Any:
    path = os.path.join(root, name)
    raw = _schema.read_regular(_inside(root, name, "the file"), MAX_JSON_BYTES,
                               f"a Hugging Face dataset directory's {name}")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptStoreError(f"{path} is not valid JSON ({type(e).__name__})") from None


def dataset_dict_error(root: str) -> DatasetError:
    """The refusal of a ``DatasetDict`` directory, naming its splits."""
    body = _read_json(root, DICT_FILE)
    splits = body.get("splits") if isinstance(body, dict) else None
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        raise CorruptStoreError(f"{os.path.join(root, DICT_FILE)} does not list the splits "
                                "(\"splits\": [names])")
    shown = ", ".join(repr(s) for s in splits[:20]) + (", ..." if len(splits) > 20 else "")
    example = os.path.join(root, splits[0]) if splits else os.path.join(root, "SPLIT")
    return DatasetError(
        f"{root} is a Hugging Face DatasetDict of {len(splits)} split(s) ({shown}): convert "
        f"one split at a time, each into its own dataset directory -- from_arrow(dst, "
        f"{example!r}), or `loaderx convert {example} DST`")


def hf_data_files(root: str) -> tuple[list[str], dict[str, Any] | None]:
    """The data files ``state.json`` names, checked (see the module docstring), and the
    features of ``dataset_info.json`` (None where it has none)."""
    state = _read_json(root, STATE_FILE)
    entries = state.get("_data_files") if isinstance(state, dict) else None
    where = os.path.join(root, STATE_FILE)
    if not isinstance(entries, list) or not entries:
        raise CorruptStoreError(f"{where} names no data files (\"_data_files\"): not a "
                                "Hugging Face dataset directory, or a damaged one")
    if len(entries) > MAX_FILES:
        raise LimitExceededError(f"{where} names {len(entries)} data files, over the "
                                 f"{MAX_FILES} read")
    files: list[str] = []
    seen: set[str] = set()
    for entry in entries:
        name = entry.get("filename") if isinstance(entry, dict) else None
        real = _inside(root, name, "the data file")  # type: ignore[arg-type]
        if real in seen:
            raise CorruptStoreError(f"{where} names the data file {name!r} twice")
        seen.add(real)
        files.append(real)
    features = None
    if os.path.lexists(os.path.join(root, INFO_FILE)):
        info = _read_json(root, INFO_FILE)
        if isinstance(info, dict) and isinstance(info.get("features"), dict):
            features = info["features"]
    return files, features


# -- IPC files ---------------------------------------------------------------------------------


class _Flat:
    """Just enough of a FlatBuffers reader for Arrow's ``Message`` metadata, every read
    bounds-checked (a CorruptStoreError naming ``where`` otherwise)."""

    def __init__(self, data: bytes, where: str) -> None:
        self.data = data
        self.where = where

    def bad(self, what: str = "malformed") -> CorruptStoreError:
        return CorruptStoreError(f"{self.where}: an IPC message's metadata is {what}: the "
                                 "file is damaged or not an Arrow file")

    def read(self, fmt: str, pos: int) -> Any:
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > len(self.data):
            raise self.bad()
        return struct.unpack_from(fmt, self.data, pos)[0]

    def root(self) -> int:
        return int(self.read("<I", 0))

    def field(self, table: int, i: int) -> int | None:
        vtable = table - self.read("<i", table)
        size = self.read("<H", vtable)
        if 4 + 2 * i + 2 > size:
            return None
        off = self.read("<H", vtable + 4 + 2 * i)
        return table + off if off else None

    def scalar(self, table: int, i: int, fmt: str, default: int) -> int:
        pos = self.field(table, i)
        return default if pos is None else int(self.read(fmt, pos))

    def ref(self, table: int, i: int) -> int | None:
        pos = self.field(table, i)
        return None if pos is None else pos + self.read("<I", pos)

    def structs(self, table: int, i: int, size: int) -> list[tuple[int, int]]:
        """A vector of structs of two int64s (FieldNode, Buffer)."""
        pos = self.ref(table, i)
        if pos is None:
            return []
        n = self.read("<I", pos)
        if pos + 4 + n * size > len(self.data):
            raise self.bad()
        return [struct.unpack_from("<qq", self.data, pos + 4 + k * size) for k in range(n)]


_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3


@dataclass
class IpcFile:
    """One IPC file, mapped and checked: its stream of messages as a buffer, its rows."""

    path: str
    stream: Any  # pyarrow.Buffer: the messages (a file's, after its magic)
    rows: int
    compressed: bool
    schema: Any


def open_ipc(pa: Any, path: str, kind: str, follow: bool = True) -> IpcFile:
    """Maps ``path`` (``kind`` "ipc_file" or "ipc_stream") and checks every message;
    ``follow=False``: ``path`` must not be a symbolic link (it was resolved and checked)."""
    ipc = importlib.import_module("pyarrow.ipc")
    if not stat.S_ISREG(os.stat(path).st_mode):  # never opened: a FIFO would block
        raise CorruptStoreError(f"{path} is not a regular file: not an Arrow IPC file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
                     | (0 if follow else os.O_NOFOLLOW))
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link put in its place since it was checked
            raise CorruptStoreError(f"{path} became a symbolic link while read") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CorruptStoreError(f"{path} is not a regular file")
        try:
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            raise CorruptStoreError(f"{path} is empty: not an Arrow IPC file") from None
    finally:
        os.close(fd)
    buf = pa.py_buffer(mapped)
    if kind == "ipc_file":
        # magic, padding, the stream, the footer, its int32 length, the magic again: the
        # stream ends where the footer begins, whether or not its writer marked the end.
        if buf.size < 18 or buf.slice(0, 6).to_pybytes() != _FILE_MAGIC or \
                buf.slice(buf.size - 6).to_pybytes() != _FILE_MAGIC:
            raise CorruptStoreError(f"{path} is not an Arrow IPC file (no ARROW1 magic at "
                                    "both ends: cut short?)")
        footer = struct.unpack("<i", buf.slice(buf.size - 10, 4).to_pybytes())[0]
        if not 0 < footer <= buf.size - 18:
            raise CorruptStoreError(f"{path}: an IPC file footer of {footer} bytes, in a "
                                    f"file of {buf.size}: the file is damaged")
        stream = buf.slice(8, buf.size - 18 - footer)
    else:
        stream = buf
    rows, compressed = _check_messages(pa, stream, path)
    try:
        schema = ipc.open_stream(pa.BufferReader(stream)).schema
    except Exception as e:  # ArrowInvalid, ...: a schema message pyarrow cannot read
        raise CorruptStoreError(f"{path} is not a readable Arrow IPC file: "
                                f"{type(e).__name__}: {e}") from None
    return IpcFile(path, stream, rows, compressed, schema)


def _check_messages(pa: Any, stream: Any, where: str) -> tuple[int, bool]:
    """Rows of the record batches of ``stream``, and whether any is compressed, after
    checking every message's metadata (see the module docstring)."""
    reader = importlib.import_module("pyarrow.ipc").MessageReader.open_stream(
        pa.BufferReader(stream))
    rows = 0
    compressed = False
    first = True
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            break
        except Exception as e:  # ArrowInvalid, OSError: a length past the end, ...
            raise CorruptStoreError(f"{where}: an IPC message cannot be read: "
                                    f"{type(e).__name__}: {e}") from None
        if message is None:
            break
        meta = message.metadata
        if meta.size > MAX_METADATA_BYTES:
            raise LimitExceededError(f"{where}: an IPC message's metadata is {meta.size} "
                                     f"bytes, over the {MAX_METADATA_BYTES} read")
        flat = _Flat(meta.to_pybytes(), where)
        msg = flat.root()
        header_type = flat.scalar(msg, 1, "<B", 0)
        if first and header_type != _SCHEMA:
            raise flat.bad("not a schema (the first message must be)")
        first = False
        if header_type not in (_DICTIONARY_BATCH, _RECORD_BATCH):
            continue
        header = flat.ref(msg, 2)
        if header is None:
            raise flat.bad()
        batch = header if header_type == _RECORD_BATCH else flat.ref(header, 1)
        if batch is None:
            raise flat.bad()
        body = message.body
        length, packed = _check_batch(flat, batch, body.size if body is not None else 0,
                                      body)
        compressed = compressed or packed
        if header_type == _RECORD_BATCH:
            rows += length
            if rows > MAX_ROWS:
                raise LimitExceededError(f"{where} holds more than {MAX_ROWS} rows, the most "
                                         "one dataset directory holds")
    if first:
        raise CorruptStoreError(f"{where} holds no IPC messages: not an Arrow IPC file")
    return rows, compressed


def _check_batch(flat: _Flat, batch: int, body_size: int, body: Any) -> tuple[int, bool]:
    length = flat.scalar(batch, 0, "<q", 0)
    if length < 0:
        raise flat.bad(f"a record batch of {length} rows")
    packed = flat.ref(batch, 3) is not None  # BodyCompression
    decoded = 0
    for offset, size in flat.structs(batch, 2, 16):
        if offset < 0 or size < 0 or offset + size > body_size:
            raise flat.bad("a buffer outside its message's body")
        if not packed or size == 0:
            decoded += size
            continue
        if size < 8:
            raise flat.bad("a compressed buffer without its length")
        declared = struct.unpack("<q", body.slice(offset, 8).to_pybytes())[0]
        if declared < -1:
            raise flat.bad(f"a compressed buffer of {declared} bytes")
        decoded += size - 8 if declared == -1 else declared
    if packed and decoded > MAX_BATCH_BYTES:
        raise LimitExceededError(
            f"{flat.where}: a compressed record batch of {length} rows declares {decoded} "
            f"bytes decoded, over the {MAX_BATCH_BYTES} read at once; write the file with "
            "smaller batches (pyarrow.ipc.new_file(...).write_table(t, max_chunksize=...)) "
            "or uncompressed")
    return length, packed


def ipc_batches(pa: Any, f: IpcFile, full: bool = True) -> Iterator[Any]:
    """The record batches of ``f``, each validated in full (CorruptStoreError otherwise;
    ``full=False``: only that the buffers are as large as the lengths need, enough to count
    nulls)."""
    try:
        reader = importlib.import_module("pyarrow.ipc").open_stream(pa.BufferReader(f.stream))
    except Exception as e:  # checked by open_ipc already: a bug or a changed file
        raise CorruptStoreError(f"{f.path} is not a readable Arrow IPC file: "
                                f"{type(e).__name__}: {e}") from None
    it = iter(reader)
    got = 0
    while True:
        try:
            batch = next(it)
            batch.validate(full=full)
        except StopIteration:
            break
        except Exception as e:  # ArrowInvalid: offsets out of range, bad UTF-8, ...
            raise CorruptStoreError(f"{f.path} cannot be read: {type(e).__name__}: "
                                    f"{e}") from None
        got += batch.num_rows
        if got > f.rows:
            break
        yield batch
    if got != f.rows:
        raise CorruptStoreError(f"{f.path}: read {got} rows where its messages declare "
                                f"{f.rows}: the file is damaged or changed while read")
