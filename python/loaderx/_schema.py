"""``schema.msgpack``: the one piece of loaderx metadata beside a Zrecord store.

It is a msgpack map with the keys the reference 0.9.11 writes -- ``kind`` ("dense" or "ragged"),
``dtype`` (NumPy ``dtype.str``), ``item_shape`` (list of ints: a dense record's shape, or a
ragged record's trailing dimensions), ``format`` ("loaderx-zrecord"), ``version`` (1) and
``codec`` (the codec of the last conversion) -- plus any extra keys the user asked to keep.
Records themselves are plain Zrecord byte records; see docs/FORMAT.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from loaderx.errors import CorruptStoreError, DatasetError

SCHEMA_FILE = "schema.msgpack"
META_FILE = "meta.zr"
FORMAT = "loaderx-zrecord"
VERSION = 1
KINDS = ("dense", "ragged")
RESERVED = ("kind", "dtype", "item_shape", "format", "version", "codec")


def check_dtype(dtype: Any, where: str) -> np.dtype:
    """``dtype`` as a NumPy dtype a record can hold as plain bytes, or a DatasetError.

    Object dtypes hold pointers and structured or sub-array dtypes do not round-trip through
    ``dtype.str``, so all three are refused.
    """
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise DatasetError(f"{where}: {dtype!r} is not a NumPy dtype ({e})") from None
    if dt.hasobject:
        raise DatasetError(f"{where}: object dtype {dt} cannot be stored (records are raw bytes)")
    if dt.names is not None or dt.subdtype is not None:
        raise DatasetError(f"{where}: structured dtype {dt} is not supported; store each field "
                           "as its own dataset")
    if dt.itemsize == 0:
        raise DatasetError(f"{where}: dtype {dt} has no size")
    return dt


@dataclass(frozen=True)
class Schema:
    """What ``schema.msgpack`` says about a store."""

    kind: str
    dtype: np.dtype
    item_shape: tuple[int, ...]
    codec: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def item_bytes(self) -> int:
        """Bytes of one dense record, or of one row of a ragged record."""
        return int(np.prod(self.item_shape, dtype=np.int64)) * self.dtype.itemsize

    def describe(self) -> str:
        return f"{self.kind} {self.dtype.str}{tuple(self.item_shape)}"

    def to_dict(self) -> dict[str, Any]:
        """The map ``schema.msgpack`` holds: the reserved keys, then the extra ones."""
        body = {
            "kind": self.kind,
            "dtype": self.dtype.str,
            "item_shape": list(self.item_shape),
            "format": FORMAT,
            "version": VERSION,
            "codec": self.codec,
        }
        body.update({k: v for k, v in self.extra.items() if k not in RESERVED})
        return body

    def to_bytes(self) -> bytes:
        return msgpack.packb(self.to_dict())


def is_store(path: str) -> bool:
    return os.path.isfile(os.path.join(path, META_FILE))


def read(path: str) -> Schema:
    """The schema of the dataset at ``path``; FileNotFoundError when there is no directory,
    DatasetError when it is not a loaderx dataset, CorruptStoreError when the file is garbage."""
    if not os.path.isdir(path):
        raise FileNotFoundError(2, "no dataset at this path", path)
    file = os.path.join(path, SCHEMA_FILE)
    if not os.path.exists(file):
        what = "a raw Zrecord store (open it with loaderx.zrecord.Zrecord)" if is_store(path) \
            else "not a loaderx dataset"
        raise DatasetError(f"{path} has no {SCHEMA_FILE}: {what}")
    if not is_store(path):
        raise CorruptStoreError(f"{path} has a {SCHEMA_FILE} but no {META_FILE}")
    with open(file, "rb") as f:
        raw = f.read(1 << 20)
    try:
        body = msgpack.unpackb(raw, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise CorruptStoreError(f"{file} is not valid msgpack ({e})") from None
    return parse(body, file)


def parse(body: Any, file: str) -> Schema:
    """Validates a decoded schema map."""
    if not isinstance(body, dict):
        raise CorruptStoreError(f"{file} does not hold a map")
    if body.get("format", FORMAT) != FORMAT:
        raise DatasetError(f"{file}: format {body.get('format')!r} is not {FORMAT!r}")
    if body.get("version", VERSION) != VERSION:
        raise DatasetError(f"{file}: schema version {body.get('version')!r} is not supported "
                           f"(this loaderx reads version {VERSION})")
    kind = body.get("kind")
    if kind not in KINDS:
        raise DatasetError(f"{file}: kind {kind!r} is not one of {', '.join(KINDS)}")
    if not isinstance(body.get("dtype"), str):
        raise DatasetError(f"{file}: dtype {body.get('dtype')!r} is not a dtype string")
    dtype = check_dtype(body["dtype"], file)
    shape = body.get("item_shape")
    if not isinstance(shape, (list, tuple)) or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in shape
    ):
        raise DatasetError(f"{file}: item_shape {shape!r} is not a list of non-negative ints")
    codec = body.get("codec", "zstd")
    extra = {k: v for k, v in body.items() if k not in RESERVED}
    schema = Schema(kind, dtype, tuple(shape), str(codec), extra)
    if schema.item_bytes > 1 << 20 and kind == "dense":
        raise DatasetError(f"{file}: a {schema.describe()} record is over the 1 MiB limit")
    return schema


def write(path: str, schema: Schema) -> None:
    """Writes ``schema.msgpack`` durably and atomically (temporary file, fsync, rename)."""
    file = os.path.join(path, SCHEMA_FILE)
    tmp = file + ".tmp"
    with open(tmp, "wb") as f:
        f.write(schema.to_bytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, file)
    fsync_dir(path)


def fsync_dir(path: str) -> None:
    """Makes the entries of directory ``path`` (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
