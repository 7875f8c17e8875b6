"""from_arrow (loaderx.intake.tables): every Arrow type of the mapping round-trips against
pyarrow as the reference (nulls refused, empty lists kept, empty tables, one row, unicode
names, sliced and chunked tables); Parquet files, globs and directories; the refusals; a
Parquet file that lies about its row count; memory bounded on a file larger than it; a killed
conversion re-run to the same result; polars / pandas / DuckDB inputs."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import struct
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pads = pytest.importorskip("pyarrow.dataset")

from frameworks_required import need  # noqa: E402
from loaderx import DataLoader, decode_strings, from_arrow, open_dataset  # noqa: E402
from loaderx.errors import (  # noqa: E402
    CorruptStoreError,
    DatasetError,
    LimitExceededError,
    LoaderxTypeError,
)
from loaderx.intake import read_manifest  # noqa: E402

N = 7


def columns() -> dict[str, Any]:
    """One array of N rows per type of the mapping (empty lists, strings and bytes included)."""
    rng = np.random.default_rng(0)
    ints = [3, -1, 0, 2**40, 7, 5, -9]
    return {
        "i8": pa.array([1, -2, 3, 4, 5, 6, -7], pa.int8()),
        "u16": pa.array([1, 2, 3, 4, 5, 6, 65535], pa.uint16()),
        "i64": pa.array(ints, pa.int64()),
        "u64": pa.array([0, 1, 2, 3, 4, 5, 2**64 - 1], pa.uint64()),
        "f16": pa.array(np.array([0.5, 1, 2, 3, -4, 5, 6], np.float16)),
        "f32": pa.array(rng.standard_normal(N).astype(np.float32)),
        "f64": pa.array(rng.standard_normal(N)),
        "bool": pa.array([True, False, False, True, True, False, True]),
        "fsl": pa.array([[i, i + 1, i + 2] for i in range(N)], pa.list_(pa.float32(), 3)),
        "fsl2": pa.array([[[i, 1], [2, i]] for i in range(N)],
                         pa.list_(pa.list_(pa.int32(), 2), 2)),
        "tensor": pa.FixedShapeTensorArray.from_numpy_ndarray(
            np.arange(N * 6, dtype=np.float64).reshape(N, 2, 3)),
        "fsb": pa.array([bytes([i, 255 - i]) for i in range(N)], pa.binary(2)),
        "list": pa.array([[1, 2], [], [3], [], [4, 5, 6], [7], []], pa.list_(pa.int64())),
        "large_list": pa.array([[1.5], [], [2.5, 3.5], [], [], [9.0], [1.0]],
                               pa.large_list(pa.float32())),
        "list_view": pa.array([[1], [2, 3], [], [4], [], [5, 6], [7]],
                              pa.list_view(pa.int16())),
        "list_fsl": pa.array([[[1, 2]], [], [[3, 4], [5, 6]], [], [[7, 8]], [], [[9, 0]]],
                             pa.list_(pa.list_(pa.uint8(), 2))),
        "string": pa.array(["a", "", "héllo", "名前", "", "x" * 300, "\x00z"]),
        "large_string": pa.array(["b", "", "c", "", "ü", "", "d"], pa.large_string()),
        "string_view": pa.array(["view", "", "a much longer string than twelve", "", "q", "", "r"],
                                pa.string_view()),
        "binary": pa.array([b"\x00\x01", b"", b"\xff", b"", b"abc", b"", b"z"]),
        "large_binary": pa.array([b"1", b"", b"22", b"", b"", b"333", b"4"], pa.large_binary()),
        "binary_view": pa.array([b"v", b"", b"w" * 40, b"", b"x", b"", b"y"], pa.binary_view()),
        "ts": pa.array([0, 1, 2, 3, 10**15, 5, 6], pa.timestamp("us", tz="Europe/Paris")),
        "ts_s": pa.array([0, 1, 2, 3, 4, 5, 6], pa.timestamp("s")),
        "date32": pa.array([0, 1, 19000, -5, 4, 5, 6], pa.date32()),
        "date64": pa.array([0, 86400000, 2, 3, 4, 5, 6], pa.date64()),
        "duration": pa.array([1, -2, 3, 4, 5, 6, 7], pa.duration("ns")),
        "time32": pa.array([0, 1, 2, 3, 86399, 5, 6], pa.time32("s")),
        "time64": pa.array([0, 1, 2, 3, 4, 5, 6], pa.time64("us")),
        "dict": pa.array(["cat", "dog", "cat", "", "dog", "cat", "eel"]).dictionary_encode(),
        "dict_int": pa.array([5, 6, 5, 5, 6, 7, 7]).dictionary_encode(),
        "struct": pa.array([{"a": i, "b": f"s{i}", "c": {"d": [i] * (i % 3)}} for i in range(N)]),
        "uuid": pa.ExtensionArray.from_storage(
            pa.uuid(), pa.array([bytes([i]) * 16 for i in range(N)], pa.binary(16))),
    }


def reference(arr: Any) -> list[Any]:
    """What pyarrow says the values are, in the form loaderx gives them back (temporal values
    as their integers, dictionaries decoded, extension types as their storage)."""
    t = pa.types
    if isinstance(arr.type, pa.BaseExtensionType) and not isinstance(arr.type,
                                                                 pa.FixedShapeTensorType):
        arr = arr.storage
    if t.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if t.is_date32(arr.type) or t.is_time32(arr.type):
        return arr.view(pa.int32()).to_pylist()
    if t.is_temporal(arr.type):
        return arr.view(pa.int64()).to_pylist()
    if isinstance(arr.type, pa.FixedShapeTensorType):
        return arr.to_numpy_ndarray().tolist()
    return arr.to_pylist()


def loaded(ds: Any, col: Any, n: int) -> list[Any]:
    """The values of a converted column as Python objects comparable with :func:`reference`."""
    idx = np.arange(n)
    if col.kind == "dense":
        values = ds[idx]
        if values.dtype.kind in "mM":
            return values.view(np.int64).tolist()
        if col.extra.get("arrow_type", "").startswith("fixed_size_binary") or \
                col.extra.get("extension") == "arrow.uuid":
            return [bytes(v) for v in values]
        return values.tolist()
    records = ds[idx]
    if col.is_string:
        return decode_strings(records)
    if col.dtype == np.uint8 and not col.item_shape and "list" not in col.extra["arrow_type"]:
        return [r.tobytes() for r in records]
    return [r.tolist() for r in records]


def check_against(dst: pathlib.Path, table: Any) -> None:
    ds = open_dataset(dst)
    manifest = read_manifest(dst)
    assert manifest.rows == table.num_rows
    for field, chunked in zip(table.schema, table.columns, strict=True):
        arr = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
        if pa.types.is_struct(arr.type):
            for name, sub in flatten(field.name, arr):
                assert loaded(ds[name], manifest.column(name), len(arr)) == reference(sub), name
        else:
            col = manifest.column(field.name)
            assert loaded(ds[field.name], col, len(arr)) == reference(arr), field.name


def flatten(name: str, arr: Any) -> list[tuple[str, Any]]:
    out = []
    for f, child in zip(arr.type, arr.flatten(), strict=True):
        if pa.types.is_struct(f.type):
            out.extend(flatten(f"{name}.{f.name}", child))
        else:
            out.append((f"{name}.{f.name}", child))
    return out


def leftovers(parent: pathlib.Path) -> list[str]:
    return sorted(e for e in os.listdir(parent) if ".loaderx-" in e)


# -- the type mapping ----------------------------------------------------------------------------


def test_every_type_round_trips(tmp_path: pathlib.Path) -> None:
    table = pa.table(columns())
    assert from_arrow(tmp_path / "ds", table) == N
    check_against(tmp_path / "ds", table)
    m = read_manifest(tmp_path / "ds")
    kinds = {c.name: (c.kind, c.dtype.str, c.item_shape) for c in m.columns}
    assert kinds["fsl2"] == ("dense", "<i4", (2, 2))
    assert kinds["tensor"] == ("dense", "<f8", (2, 3))
    assert kinds["fsb"] == ("dense", "|u1", (2,))
    assert kinds["list_fsl"] == ("ragged", "|u1", (2,))
    assert kinds["ts"] == ("dense", "<M8[us]", ())
    assert kinds["date32"] == ("dense", "<M8[D]", ())
    assert kinds["time32"] == ("dense", "<m8[s]", ())
    assert kinds["struct.c.d"] == ("ragged", "<i8", ())
    assert m.column("ts").extra["tz"] == "Europe/Paris"
    assert m.column("time64").extra["time_of_day"] is True
    assert m.column("string").extra == {"arrow_type": "string", "string": True}
    assert m.column("dict").is_string and m.column("dict").extra["decoded_from"] == "dictionary"
    assert m.column("uuid").extra["extension"] == "arrow.uuid"
    assert m.column("binary").extra == {"arrow_type": "binary"}
    assert [c.name for c in m.columns][-4:] == ["struct.a", "struct.b", "struct.c.d", "uuid"]
    assert leftovers(tmp_path) == []


def test_sliced_and_chunked_tables(tmp_path: pathlib.Path) -> None:
    whole = pa.table(columns())
    # Arrays with offsets into their buffers, and columns of several chunks.
    table = pa.concat_tables([whole.slice(2, 4), whole.slice(1), whole.slice(0, 3)])
    assert table.column("string").num_chunks == 3
    assert from_arrow(tmp_path / "ds", table, chunk_bytes=64) == table.num_rows
    check_against(tmp_path / "ds", table)


def test_empty_table_and_one_row(tmp_path: pathlib.Path) -> None:
    whole = pa.table(columns())
    assert from_arrow(tmp_path / "empty", whole.slice(0, 0)) == 0
    ds = open_dataset(tmp_path / "empty")
    assert len(ds) == len(read_manifest(tmp_path / "empty").columns)
    assert all(len(d) == 0 for d in ds.values())
    assert from_arrow(tmp_path / "one", whole.slice(3, 1)) == 1
    check_against(tmp_path / "one", whole.slice(3, 1))


def test_unicode_and_odd_column_names(tmp_path: pathlib.Path) -> None:
    table = pa.table({"名前": [1, 2], "a/b": ["x", "y"], "..": [b"1", b"2"], "": [3.0, 4.0]})
    from_arrow(tmp_path / "ds", table)
    check_against(tmp_path / "ds", table)
    assert list(open_dataset(tmp_path / "ds")) == ["名前", "a/b", "..", ""]
    assert sorted(os.listdir(tmp_path)) == ["ds"]


def test_columns_picks_and_orders(tmp_path: pathlib.Path) -> None:
    table = pa.table(columns())
    from_arrow(tmp_path / "ds", table, columns=["string", "struct.c", "i8", "struct.a"])
    assert list(open_dataset(tmp_path / "ds")) == ["string", "struct.c.d", "i8", "struct.a"]
    with pytest.raises(DatasetError, match="'nope'.*does not have"):
        from_arrow(tmp_path / "x", table, columns=["nope"])
    with pytest.raises(LoaderxTypeError, match="list of names"):
        from_arrow(tmp_path / "x", table, columns="i8")  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()


def test_struct_field_colliding_with_a_column(tmp_path: pathlib.Path) -> None:
    table = pa.table({"a.b": [1], "a": pa.array([{"b": 2}])})
    with pytest.raises(DatasetError, match="'a.b'"):
        from_arrow(tmp_path / "ds", table)
    assert os.listdir(tmp_path) == []


# -- refusals ------------------------------------------------------------------------------------


REFUSED = [
    ("dec", pa.array([1, 2], pa.decimal128(5, 2)), "float64"),
    ("strs", pa.array([["a"], ["b", "c"]]), "join each list"),
    ("bins", pa.array([[b"a"], []]), "join each list"),
    ("nested", pa.array([[[1]], [[2, 3], []]]), "lists of variable-length lists"),
    ("bools", pa.array([[True], [False]]), "uint8"),
    ("map", pa.array([[("k", 1)], []], pa.map_(pa.string(), pa.int64())), "map"),
    ("union", pa.UnionArray.from_sparse(pa.array([0, 1], pa.int8()),
                                        [pa.array([1, 2]), pa.array(["a", "b"])]), "union"),
    ("null", pa.nulls(2), "only nulls"),
    ("interval", pa.array([pa.scalar((1, 2, 3), pa.month_day_nano_interval())] * 2), "int64"),
    ("fsl_str", pa.array([["a"], ["b"]], pa.list_(pa.string(), 1)), "numbers"),
]


@pytest.mark.parametrize("name, arr, fix", REFUSED, ids=[r[0] for r in REFUSED])
def test_types_refused_naming_column_type_and_fix(tmp_path: pathlib.Path, name: str, arr: Any,
                                                  fix: str) -> None:
    table = pa.table({"ok": [1, 2], name: arr})
    with pytest.raises(DatasetError, match=f"column {name!r}") as e:
        from_arrow(tmp_path / "ds", table)
    assert fix in str(e.value) and str(arr.type).split("<")[0] in str(e.value)
    assert os.listdir(tmp_path) == []
    # Leaving the column out converts the rest.
    assert from_arrow(tmp_path / "ds", table, columns=["ok"]) == 2


NULLS = [
    ("int", pa.array([1, None, 3])),
    ("string", pa.array(["a", "b", None])),
    ("list", pa.array([[1], None, [2]])),
    ("element", pa.array([[1], [None], [2]])),
    ("fixed", pa.array([[1, 2], [3, None], [5, 6]], pa.list_(pa.int64(), 2))),
    ("struct", pa.array([{"a": 1}, None, {"a": 3}])),
    ("field", pa.array([{"a": 1}, {"a": None}, {"a": 3}])),
    ("ts", pa.array([1, None, 3], pa.timestamp("ms"))),
    ("dict", pa.array(["a", None, "b"]).dictionary_encode()),
]


@pytest.mark.parametrize("name, arr", NULLS, ids=[n[0] for n in NULLS])
def test_nulls_refused_naming_column_and_fix(tmp_path: pathlib.Path, name: str, arr: Any) -> None:
    table = pa.table({name: arr})
    with pytest.raises(DatasetError, match=f"column '{name}.*null.*fill") as e:
        from_arrow(tmp_path / "ds", table)
    assert "fill_null" in str(e.value)
    assert os.listdir(tmp_path) == []


def test_null_row_counted_across_batches(tmp_path: pathlib.Path) -> None:
    values = list(range(1000))
    values[777] = None
    table = pa.table({"v": values})
    with pytest.raises(DatasetError, match="null at row 777"):
        from_arrow(tmp_path / "ds", table, chunk_bytes=800)  # about 100 rows a batch
    assert os.listdir(tmp_path) == []


def test_record_over_the_limit(tmp_path: pathlib.Path) -> None:
    table = pa.table({"s": ["a", "b" * (1 << 20 | 1)]})
    with pytest.raises(LimitExceededError, match="'s', row 1.*split"):
        from_arrow(tmp_path / "ds", table)
    assert os.listdir(tmp_path) == []


def test_bad_sources(tmp_path: pathlib.Path) -> None:
    with pytest.raises(LoaderxTypeError, match="cannot read a builtins.dict"):
        from_arrow(tmp_path / "ds", {"a": [1]})
    with pytest.raises(FileNotFoundError):
        from_arrow(tmp_path / "ds", tmp_path / "missing.parquet")
    with pytest.raises(DatasetError, match="no file matches"):
        from_arrow(tmp_path / "ds", str(tmp_path / "*.parquet"))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all" * 10)
    with pytest.raises(CorruptStoreError, match="junk.parquet"):
        from_arrow(tmp_path / "ds", tmp_path / "junk.parquet")
    with pytest.raises(DatasetError, match="chunk_bytes"):
        from_arrow(tmp_path / "ds", pa.table({"a": [1]}), chunk_bytes=0)
    assert not (tmp_path / "ds").exists() and leftovers(tmp_path) == []


def test_codecs(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(3)
    # text: 4.8 KiB strings that compress; short: 480 B ones (raw: below 4 KiB, a frame's
    # decoding costs more than its bytes); noise: 5 KiB that does not compress.
    table = pa.table({"text": ["a few words said again, " * 200] * 300,
                      "short": ["a few words said again, " * 20] * 300,
                      "noise": [rng.bytes(5000) for _ in range(300)], "n": np.arange(300)})
    from_arrow(tmp_path / "auto", table)
    assert {c.name: c.codec for c in read_manifest(tmp_path / "auto").columns} == {
        "text": "zstd", "short": "raw", "noise": "raw", "n": "raw"}
    from_arrow(tmp_path / "exact", table, codec={"short": "zstd", "noise": "zstd", "n": "zstd"})
    assert {c.name: c.codec for c in read_manifest(tmp_path / "exact").columns} == {
        "text": "zstd", "short": "zstd", "noise": "zstd", "n": "zstd"}
    from_arrow(tmp_path / "raw", table, codec="raw")
    assert {c.codec for c in read_manifest(tmp_path / "raw").columns} == {"raw"}
    for name in ("auto", "exact", "raw"):
        check_against(tmp_path / name, table)
    with pytest.raises(DatasetError, match="'nope'"):
        from_arrow(tmp_path / "x", table, codec={"nope": "raw"})
    assert not (tmp_path / "x").exists()


def test_existing_destination(tmp_path: pathlib.Path) -> None:
    from_arrow(tmp_path / "ds", pa.table({"a": [1, 2]}))
    with pytest.raises(DatasetError, match="overwrite=True"):
        from_arrow(tmp_path / "ds", pa.table({"a": [3]}))
    assert from_arrow(tmp_path / "ds", pa.table({"b": ["z"]}), overwrite=True) == 1
    assert list(open_dataset(tmp_path / "ds")) == ["b"]


# -- sources -------------------------------------------------------------------------------------


def parquet_table(n: int = 5000) -> Any:
    rng = np.random.default_rng(1)
    return pa.table({
        "label": rng.integers(0, 10, n),
        "text": [f"row {i} " * (i % 7) for i in range(n)],
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 4)), 4),
        "tokens": pa.array([list(range(i % 5)) for i in range(n)], pa.list_(pa.int32())),
    })


def test_parquet_file_glob_directory_and_list(tmp_path: pathlib.Path) -> None:
    table = parquet_table()
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    pq.write_table(table.slice(0, 2000), data / "a.parquet", row_group_size=300,
                   compression="zstd")
    pq.write_table(table.slice(2000, 2000), data / "b.parquet", row_group_size=700)
    pq.write_table(table.slice(4000), data / "sub" / "c.parquet")
    (data / "notes.txt").write_text("ignored by the directory walk")
    for k, source in enumerate([str(data / "**" / "*.parquet"), data,
                                [data / "a.parquet", str(data / "b.parquet"),
                                 data / "sub" / "c.parquet", data / "a.parquet"]]):
        dst = tmp_path / f"out{k}"
        assert from_arrow(dst, source, chunk_bytes=20_000) == 5000
        check_against(dst, table)
        assert read_manifest(dst).extra == {"source": "parquet"}
    assert from_arrow(tmp_path / "one", data / "b.parquet") == 2000
    check_against(tmp_path / "one", table.slice(2000, 2000))


def test_parquet_projection_reads_only_the_columns(tmp_path: pathlib.Path) -> None:
    table = parquet_table(100)
    pq.write_table(table, tmp_path / "t.parquet")
    from_arrow(tmp_path / "ds", tmp_path / "t.parquet", columns=["tokens", "label"])
    assert list(open_dataset(tmp_path / "ds")) == ["tokens", "label"]
    check_against(tmp_path / "ds", table.select(["tokens", "label"]))


def test_parquet_files_of_different_types(tmp_path: pathlib.Path) -> None:
    pq.write_table(pa.table({"a": pa.array([1], pa.int64())}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"a": pa.array([1], pa.int32())}), tmp_path / "2.parquet")
    with pytest.raises(DatasetError, match="2.parquet.*'a' is int32, not int64"):
        from_arrow(tmp_path / "ds", str(tmp_path / "*.parquet"))
    assert not (tmp_path / "ds").exists()


def test_arrow_objects(tmp_path: pathlib.Path) -> None:
    table = parquet_table(300)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=50)
    sources = {
        "reader": table.to_reader(max_chunksize=64),
        "batch": table.to_batches()[0],
        "dataset": pads.dataset(tmp_path / "t.parquet"),
        "capsule": _Capsule(table),
    }
    for name, source in sources.items():
        from_arrow(tmp_path / name, source)
        check_against(tmp_path / name, table)


class _Capsule:
    """Only the Arrow PyCapsule stream protocol, as a third-party library would offer it."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.table.__arrow_c_stream__(requested_schema)


def test_hugging_face_class_names_and_pandas_index(tmp_path: pathlib.Path) -> None:
    hf = {"info": {"features": {"label": {"names": ["cat", "dog"], "_type": "ClassLabel"},
                                "text": {"dtype": "string", "_type": "Value"}}}}
    table = pa.table({"label": [0, 1, 1], "text": ["a", "b", "c"],
                      "__index_level_0__": [7, 8, 9]})
    table = table.replace_schema_metadata({
        b"huggingface": json.dumps(hf).encode(),
        b"pandas": json.dumps({"index_columns": ["__index_level_0__"]}).encode()})
    pq.write_table(table, tmp_path / "hub.parquet")
    from_arrow(tmp_path / "ds", tmp_path / "hub.parquet")
    m = read_manifest(tmp_path / "ds")
    assert [c.name for c in m.columns] == ["label", "text"]  # pandas' index left out
    assert m.column("label").extra["classes"] == ["cat", "dog"]
    from_arrow(tmp_path / "ds2", table, columns=["__index_level_0__"])  # unless asked for
    assert open_dataset(tmp_path / "ds2")["__index_level_0__"][[0, 2]].tolist() == [7, 9]


def test_polars_input(tmp_path: pathlib.Path) -> None:
    pl = pytest.importorskip("polars")
    df = pl.DataFrame({"x": [1.5, 2.5, 3.5], "s": ["a", "", "ü"], "l": [[1, 2], [], [3]],
                       "c": pl.Series(["u", "v", "u"], dtype=pl.Categorical)})
    assert from_arrow(tmp_path / "ds", df) == 3
    ds = open_dataset(tmp_path / "ds")
    assert ds["x"][[0, 1, 2]].tolist() == [1.5, 2.5, 3.5]
    assert decode_strings(ds["s"][[0, 1, 2]]) == ["a", "", "ü"]
    assert [r.tolist() for r in ds["l"][[0, 1, 2]]] == [[1, 2], [], [3]]
    assert decode_strings(ds["c"][[0, 1, 2]]) == ["u", "v", "u"]


def test_pandas_input(tmp_path: pathlib.Path) -> None:
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": [1, 2, 3], "when": pd.to_datetime(["2024-01-01", "2024-01-02",
                                                                "2024-01-03"]),
                       "kind": pd.Categorical(["x", "y", "x"]), "name": ["p", "q", "r"]},
                      index=[10, 20, 30])
    assert from_arrow(tmp_path / "ds", df) == 3
    ds = open_dataset(tmp_path / "ds")
    assert list(ds) == ["a", "when", "kind", "name"]  # the index is not a column
    assert ds["when"][[1]].astype("datetime64[D]").astype(str).tolist() == ["2024-01-02"]
    assert decode_strings(ds["kind"][[0, 1]]) == ["x", "y"]
    with pytest.raises(DatasetError, match="column 'a'.*null"):
        from_arrow(tmp_path / "nan", pd.DataFrame({"a": [1.0, None]}).astype("Float64"))


def test_duckdb_input(tmp_path: pathlib.Path) -> None:
    duckdb = need("duckdb")  # CI installs it (scripts/frameworks.txt): a skip there is a failure
    rel = duckdb.sql("SELECT i AS id, 'n' || i::VARCHAR AS name FROM range(1000) t(i)")
    assert from_arrow(tmp_path / "ds", rel) == 1000
    ds = open_dataset(tmp_path / "ds")
    assert ds["id"][[0, 999]].tolist() == [0, 999]
    assert decode_strings(ds["name"][[5]]) == ["n5"]


def test_hugging_face_dataset_input(tmp_path: pathlib.Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    datasets = need("datasets")
    features = datasets.Features({"label": datasets.ClassLabel(names=["neg", "pos"]),
                                  "text": datasets.Value("string"),
                                  "emb": datasets.Sequence(datasets.Value("float32"), length=2)})
    ds = datasets.Dataset.from_dict({"label": [i % 2 for i in range(100)],
                                     "text": [f"t{i}" for i in range(100)],
                                     "emb": [[i, -i] for i in range(100)]}, features=features)
    view = ds.shuffle(seed=5).select(range(10, 60))  # an indices mapping: not the table's order
    assert from_arrow(tmp_path / "ds", view) == 50
    got = open_dataset(tmp_path / "ds")
    assert decode_strings(got["text"][np.arange(50)]) == view["text"]
    assert got["label"][np.arange(50)].tolist() == view["label"]
    assert got["emb"][np.arange(50)].tolist() == view["emb"]
    m = read_manifest(tmp_path / "ds")
    assert m.column("label").extra["classes"] == ["neg", "pos"]
    assert m.extra == {"source": "huggingface"}


def test_loader_over_a_converted_table(tmp_path: pathlib.Path) -> None:
    n = 500
    table = pa.table({"id": np.arange(n), "text": [str(i) for i in range(n)],
                      "pair": pa.FixedSizeListArray.from_arrays(pa.array(
                          np.repeat(np.arange(n), 2).astype(np.float32)), 2)})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=64)
    from_arrow(tmp_path / "ds", tmp_path / "t.parquet", chunk_bytes=1000)
    with DataLoader(open_dataset(tmp_path / "ds"), batch_size=32, seed=4) as loader:
        for _ in range(5):
            b = next(loader)
            assert decode_strings(b["text"]) == [str(i) for i in b["id"]]
            assert (b["pair"][:, 1] == b["id"]).all()


def test_progress_is_shown(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    from_arrow(tmp_path / "ds", pa.table({"a": np.arange(100)}), progress=True)
    assert "100" in capfd.readouterr().err


# -- hostile Parquet, memory, kills (each in a process of its own) -------------------------------


def _varint(n: int) -> bytes:
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([low])
        out += bytes([low | 0x80])


def lying_parquet(path: pathlib.Path, rows: int, told: int, fields: tuple[int, ...]) -> None:
    """A valid Parquet file whose footer is patched to say ``told`` instead of ``rows`` in the
    i64 fields ``fields`` of the pattern (thrift compact: field delta 1, type i64, zigzag varint):
    0 is the file's num_rows, 1 and 2 the two columns' num_values, 3 the row group's num_rows."""
    table = pa.table({"x": np.arange(rows), "s": [str(i) for i in range(rows)]})
    pq.write_table(table, path, compression="zstd")
    raw = path.read_bytes()
    size = struct.unpack("<I", raw[-8:-4])[0]
    start = len(raw) - 8 - size
    footer = bytearray(raw[start:-8])
    pattern, patch = b"\x16" + _varint(rows * 2), b"\x16" + _varint(told * 2)
    assert len(pattern) == len(patch)
    hits = [i for i in range(len(footer)) if footer.startswith(pattern, i)]
    assert len(hits) == 4, hits
    for k in fields:
        footer[hits[k]:hits[k] + len(patch)] = patch
    path.write_bytes(raw[:start] + bytes(footer) + raw[-8:])


HOSTILE = textwrap.dedent("""
    import os, resource, sys
    resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))  # a bomb fails, fast
    from loaderx import from_arrow
    from loaderx.errors import LoaderxError
    try:
        from_arrow(sys.argv[2], sys.argv[1], progress=False)
    except LoaderxError as e:
        print(type(e).__name__, e)
    else:
        print("converted")
""")


@pytest.mark.parametrize("told, fields, words", [
    (2000, (0,), "its row groups declare 1237"),  # the file says more than its row groups
    (1000, (0,), "its row groups declare 1237"),
    (1000, (3,), "declares 1237 rows, but its row groups declare 1000"),
    (1000, (0, 3), "row group 0 declares 1000 rows, its column 'x' 1237 values"),
    (2000, (0, 3), "row group 0 declares 2000 rows"),
    (2000, (0, 1, 2, 3), "holds 1237 rows, its footer declares 2000"),
], ids=["file-more", "file-fewer", "group-fewer", "both-fewer", "both-more", "all-more"])
def test_parquet_that_lies_about_its_row_count(tmp_path: pathlib.Path, told: int,
                                                fields: tuple[int, ...], words: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    lying_parquet(src / "liar.parquet", 1237, told, fields)
    out = tmp_path / "out"
    out.mkdir()
    # (MIMALLOC_ARENA_RESERVE: free-threaded CPython reserves 1 GiB of address space at start
    # in steps of this size instead, so the child's RLIMIT_DATA limits what it uses.)
    run = subprocess.run([sys.executable, "-c", HOSTILE, str(src / "liar.parquet"),
                          str(out / "ds")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "MIMALLOC_ARENA_RESERVE": "64M"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("CorruptStoreError") and words in run.stdout, run.stdout
    assert os.listdir(out) == []  # nothing at dst, nothing beside it
    assert os.listdir(src) == ["liar.parquet"]


BOUNDED = textwrap.dedent("""
    import sys
    import pyarrow.parquet
    from loaderx import from_arrow

    def peak_kib():  # this process's own high-water mark (ru_maxrss keeps the parent's)
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

    before = peak_kib()
    n = from_arrow(sys.argv[2], sys.argv[1], chunk_bytes=2 << 20, progress=False)
    print(n, before, peak_kib())
""")


def test_memory_bounded_on_a_file_larger_than_it(tmp_path: pathlib.Path) -> None:
    """1.1 GiB of decoded rows (64 KiB each, compressible, so the files stay small) convert
    with a peak RSS of a fraction of that: batches are streamed, never the whole table."""
    rows, width = 18_000, 64 << 10
    pattern = np.random.default_rng(2).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    schema = pa.schema([("id", pa.int64()), ("blob", pa.binary())])
    path = tmp_path / "big.parquet"
    with pq.ParquetWriter(path, schema, compression="zstd") as w:
        for start in range(0, rows, 500):  # row groups of 32 MiB decoded
            ids = np.arange(start, start + 500)
            blobs = [pattern[i % 4096:] + pattern * 16 for i in ids]
            w.write_table(pa.table({"id": ids, "blob": [b[:width] for b in blobs]},
                                   schema=schema))
    decoded = rows * (width + 8)
    assert decoded > 1 << 30
    run = subprocess.run([sys.executable, "-c", BOUNDED, str(path), str(tmp_path / "ds")],
                         capture_output=True, text=True, timeout=600, check=True)
    n, before_kib, peak_kib = map(int, run.stdout.split())
    assert n == rows
    grown = (peak_kib - before_kib) << 10
    assert grown < decoded // 4, (grown, decoded)
    ds = open_dataset(tmp_path / "ds")
    assert ds["blob"][[17_999]][0].tobytes() == (pattern[17_999 % 4096:] + pattern * 16)[:width]
    assert ds["id"][[0, 17_999]].tolist() == [0, 17_999]


KILLED = textwrap.dedent("""
    import os, sys
    from loaderx import from_arrow, staging
    from loaderx.intake import directory
    src, dst, where = sys.argv[1:4]
    if where.startswith("append"):
        real, calls = directory.DirectoryWriter.append, []

        def append(self, batch):
            calls.append(1)
            if len(calls) == int(where[6:]):
                os.kill(os.getpid(), 9)
            return real(self, batch)
        directory.DirectoryWriter.append = append
    elif where != "none":
        def hook(step):
            if step == where:
                os.kill(os.getpid(), 9)
        staging._hook = hook
    print(from_arrow(dst, src, chunk_bytes=4000, progress=False, overwrite=True))
""")


@pytest.mark.parametrize("where", ["append1", "append5", "publish", "exchange"])
def test_killed_conversion_rerun_gives_the_same_result(tmp_path: pathlib.Path,
                                                        where: str) -> None:
    table = parquet_table(3000)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=400)
    out = tmp_path / "out"
    out.mkdir()
    dst = out / "ds"
    if where == "exchange":  # an overwrite killed at its swap: the old dataset stays
        from_arrow(dst, pa.table({"old": [1]}))
    run = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "t.parquet"), str(dst),
                          where], capture_output=True, text=True, timeout=300)
    assert run.returncode == -signal.SIGKILL, run.stderr
    if where == "exchange":
        assert list(open_dataset(dst)) == ["old"]
    else:
        assert not dst.exists()
    assert leftovers(out)  # the killed run's staging, with no owner
    run = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "t.parquet"), str(dst),
                          "none"], capture_output=True, text=True, timeout=300, check=True)
    assert run.stdout.split() == ["3000"]
    assert os.listdir(out) == ["ds"]
    check_against(dst, table)
    from_arrow(tmp_path / "reference", tmp_path / "t.parquet")
    # The same dataset; each conversion's commit point has a generation of its own.
    assert dataclasses.replace(read_manifest(dst), generation="") == \
        dataclasses.replace(read_manifest(tmp_path / "reference"), generation="")
    assert read_manifest(dst).generation


# -- the command line ----------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loaderx", *args], capture_output=True,
                          text=True, timeout=300)


def test_cli_convert_and_info(tmp_path: pathlib.Path) -> None:
    table = parquet_table(1000)
    for k in range(3):
        pq.write_table(table.slice(k * 400, 400), tmp_path / f"part-{k}.parquet")
    run = cli("convert", str(tmp_path / "part-*.parquet"), str(tmp_path / "ds"),
              "--columns", "text,label", "--checksums")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"{tmp_path / 'ds'}: 1000 rows; columns text, label"
    check_against(tmp_path / "ds", table.select(["text", "label"]))
    info = cli("info", str(tmp_path / "ds"))
    assert info.returncode == 0, info.stderr
    assert "rows         1000" in info.stdout and "'text'" in info.stdout
    assert "UTF-8 text" in info.stdout
    body = json.loads(cli("info", str(tmp_path / "ds"), "--json").stdout)
    assert body["rows"] == 1000 and [c["name"] for c in body["columns"]] == ["text", "label"]
    assert all(c["checksums"] for c in body["columns"])
    again = cli("convert", str(tmp_path / "part-*.parquet"), str(tmp_path / "ds"))
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert cli("convert", str(tmp_path / "part-*.parquet"), str(tmp_path / "ds"),
               "--overwrite").returncode == 0
    assert list(open_dataset(tmp_path / "ds")) == ["label", "text", "vec", "tokens"]


def test_cli_errors_are_one_line_with_the_exit_status(tmp_path: pathlib.Path) -> None:
    pq.write_table(pa.table({"a": [1, None]}), tmp_path / "nulls.parquet")
    lying_parquet(tmp_path / "liar.parquet", 1237, 2000, (0,))
    for source, status, words in [("nulls.parquet", 2, "null at row 1"),
                                  ("liar.parquet", 3, "the file is damaged"),
                                  ("none-*.parquet", 2, "no file matches")]:
        run = cli("convert", str(tmp_path / source), str(tmp_path / "out"))
        assert run.returncode == status, run.stderr
        assert words in run.stderr and "Traceback" not in run.stderr
        assert len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_module_doctest() -> None:
    import doctest

    import loaderx.intake.tables

    result = doctest.testmod(loaderx.intake.tables)
    assert result.attempted > 0 and result.failed == 0
