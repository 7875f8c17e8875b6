"""from_arrow (loaderx.intake.tables): nulls that a row's validity does not show -- in a
dictionary's values, a tensor's or a list's elements, a list view's values -- are refused
naming the column and the first such row, or converted where no row takes them; extension
types stored as structs are flattened; permuted tensors are refused. pyarrow's own values are
the reference."""

from __future__ import annotations

import os
import pathlib
import tempfile
from typing import Any

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pc = pytest.importorskip("pyarrow.compute")

from loaderx import decode_strings, from_arrow, open_dataset  # noqa: E402
from loaderx.errors import DatasetError  # noqa: E402
from loaderx.intake import read_manifest  # noqa: E402


def refused(tmp_path: pathlib.Path, table: Any, **kw: Any) -> str:
    """The message of the DatasetError converting ``table`` raises; nothing is left behind."""
    parent = tempfile.mkdtemp(dir=tmp_path)
    with pytest.raises(DatasetError) as e:
        from_arrow(os.path.join(parent, "ds"), table, **kw)
    assert os.listdir(parent) == []
    return str(e.value)


def records(ds: Any, n: int) -> list[Any]:
    return [r.tolist() for r in ds[np.arange(n)]]


ExtensionType: Any = pa.ExtensionType


class Pair(ExtensionType):
    """An extension type stored as a struct."""

    def __init__(self) -> None:
        super().__init__(pa.struct([("a", pa.int32()), ("b", pa.string())]), "test.pair")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: Any, serialized: bytes) -> Pair:
        return cls()


class Coded(ExtensionType):
    """An extension type stored as a dictionary."""

    def __init__(self) -> None:
        super().__init__(pa.dictionary(pa.int32(), pa.string()), "test.coded")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: Any, serialized: bytes) -> Coded:
        return cls()


# -- a dictionary's values -----------------------------------------------------------------------


DICTS = [
    ("string", ["a", None, "b", "a"]),
    ("int", [5, None, 7, 5]),
    ("float", [0.5, None, 1.5, 0.5]),
]


@pytest.mark.parametrize("kind, items", DICTS, ids=[d[0] for d in DICTS])
def test_null_in_a_dictionarys_values_refused(tmp_path: pathlib.Path, kind: str,
                                              items: list[Any]) -> None:
    arr = pc.dictionary_encode(pa.array(items), null_encoding="encode")
    assert arr.null_count == 0 and arr.dictionary.null_count == 1  # the indices are all valid
    message = refused(tmp_path, pa.table({"ok": [1, 2, 3, 4], "d": arr}))
    assert "column 'd' has a null in its dictionary's values at row 1" in message
    assert "fill_null" in message and "columns=" in message
    assert "ArrowInvalid" not in message and "zero_copy" not in message
    assert from_arrow(tmp_path / "ds", pa.table({"ok": [1, 2, 3, 4], "d": arr}),
                      columns=["ok"]) == 4


def test_dictionary_null_found_in_a_later_chunk_and_a_struct_field(
        tmp_path: pathlib.Path) -> None:
    clean = pa.array(["x", "y", "x"]).dictionary_encode()
    holed = pc.dictionary_encode(pa.array(["y", "z", None]), null_encoding="encode")
    table = pa.table({"d": pa.chunked_array([clean, holed])})
    assert "column 'd' has a null in its dictionary's values at row 5" in refused(tmp_path,
                                                                                  table)
    field = pa.StructArray.from_arrays([pa.array([1, 2, 3]), holed], names=["n", "d"])
    assert "column 's.d' has a null in its dictionary's values at row 2" in refused(
        tmp_path, pa.table({"s": field}))
    # Stored as an extension type's storage: the same.
    coded = pa.ExtensionArray.from_storage(Coded(), holed)
    assert "column 'c' has a null in its dictionary's values at row 2" in refused(
        tmp_path, pa.table({"c": coded}))


def test_dictionary_null_no_row_takes_converts(tmp_path: pathlib.Path) -> None:
    dictionary = pa.array(["a", None, "b"])
    arr = pa.DictionaryArray.from_arrays(pa.array([0, 2, 2, 0], pa.int8()), dictionary)
    from_arrow(tmp_path / "ds", pa.table({"d": arr}))
    assert decode_strings(open_dataset(tmp_path / "ds")["d"][np.arange(4)]) == \
        arr.dictionary_decode().to_pylist()


def test_dictionary_of_extension_values(tmp_path: pathlib.Path) -> None:
    uuids = pa.ExtensionArray.from_storage(
        pa.uuid(), pa.array([bytes([1]) * 16, bytes([2]) * 16], pa.binary(16)))
    arr = pa.DictionaryArray.from_arrays(pa.array([1, 0, 1], pa.int8()), uuids)
    from_arrow(tmp_path / "ds", pa.table({"d": arr}))
    got = open_dataset(tmp_path / "ds")["d"][np.arange(3)]
    assert [bytes(v) for v in got] == arr.dictionary_decode().storage.to_pylist()
    assert read_manifest(tmp_path / "ds").column("d").extra["extension"] == "arrow.uuid"


# -- tensors and lists ---------------------------------------------------------------------------


def test_null_in_a_tensor_refused_as_in_a_fixed_size_list(tmp_path: pathlib.Path) -> None:
    storage = pa.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, None, 11, 12]], pa.list_(pa.float32(), 4))
    tensor = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), [2, 2]), storage)
    assert tensor.null_count == 0  # only the values hold the null
    message = refused(tmp_path, pa.table({"t": tensor}))
    assert "column 't' has a null tensor element at row 2" in message and "fill_null" in message
    assert "column 'f' has a null list element (at depth 1) at row 2" in refused(
        tmp_path, pa.table({"f": storage}))
    # In a later chunk (counted from the table's first row), and in a slice.
    clean = pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((3, 2, 2), np.float32))
    table = pa.table({"t": pa.chunked_array([clean, tensor])})
    assert "column 't' has a null tensor element at row 5" in refused(tmp_path, table)
    assert "column 't' has a null tensor element at row 3" in refused(tmp_path, table.slice(2))
    # Nulls at two depths, no row null: the first row holding either is named, with its depth.
    inner = pa.array([[[1, 2], [3, 4]], [[5, 6], None], [[7, None], [8, 9]]],
                     pa.list_(pa.list_(pa.int64(), 2), 2))
    assert "column 'f' has a null list element (at depth 1) at row 1" in refused(
        tmp_path, pa.table({"f": inner}))


def test_tensors_round_trip_against_to_numpy_ndarray(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(3)
    cube = pa.FixedShapeTensorArray.from_numpy_ndarray(
        rng.standard_normal((9, 2, 3, 4)).astype(np.float32))
    square = pa.FixedShapeTensorArray.from_numpy_ndarray(np.arange(36).reshape(9, 2, 2))
    ident = pa.ExtensionArray.from_storage(
        pa.fixed_shape_tensor(pa.int16(), [3, 2], permutation=[0, 1]),
        pa.array([list(range(i, i + 6)) for i in range(9)], pa.list_(pa.int16(), 6)))
    table = pa.table({"cube": cube, "square": square, "ident": ident})
    for part in (table, table.slice(3, 4), pa.concat_tables([table.slice(5), table.slice(0, 2)])):
        dst = tmp_path / f"ds{part.num_rows}"
        from_arrow(dst, part, chunk_bytes=64)
        ds = open_dataset(dst)
        for name in part.column_names:
            expected = part.column(name).combine_chunks().to_numpy_ndarray()
            got = np.asarray(ds[name][np.arange(part.num_rows)])
            assert got.dtype == expected.dtype and got.shape == expected.shape, name
            assert np.array_equal(got, expected), name


def test_permuted_tensor_refused_naming_the_permutation(tmp_path: pathlib.Path) -> None:
    for shape, perm in [([2, 3], [1, 0]), ([2, 3, 4], [2, 0, 1])]:
        size = int(np.prod(shape))
        typ = pa.fixed_shape_tensor(pa.int32(), shape, permutation=perm)
        arr = pa.ExtensionArray.from_storage(
            typ, pa.array([list(range(size)), list(range(size))], pa.list_(pa.int32(), size)))
        message = refused(tmp_path, pa.table({"ok": [1, 2], "t": arr}))
        assert "column 't'" in message and f"permutation {perm}" in message
        assert "from_numpy_ndarray" in message and "columns=" in message
        assert from_arrow(tmp_path / f"ok{len(shape)}", pa.table({"ok": [1, 2], "t": arr}),
                          columns=["ok"]) == 2


def test_list_element_null_names_its_row_and_comes_first(tmp_path: pathlib.Path) -> None:
    rows = [[1], [], [2, 3], [], [4, None], [5]]
    for typ in (pa.list_(pa.int64()), pa.large_list(pa.int64()), pa.list_view(pa.int64())):
        message = refused(tmp_path, pa.table({"l": pa.array(rows, typ)}))
        assert "column 'l' has a null list element (at depth 1) at row 4" in message, typ
    # A null inside row 2 is found before the null row 5.
    message = refused(tmp_path, pa.table({"l": pa.array([[1], [2], [None], [3], [4], None])}))
    assert "null list element (at depth 1) at row 2" in message
    d = pc.dictionary_encode(pa.array(["a", "b", None, "a", "b", "a"]), null_encoding="encode")
    d = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, 0, None, 1], pa.int32()), d.dictionary)
    message = refused(tmp_path, pa.table({"d": d}))  # row 4's index is null, row 2's value
    assert "column 'd' has a null" in message and "at row 2" in message
    # list of fixed-size lists: a null inner list, its row named.
    nested = pa.array([[[1, 2]], [], [[3, 4], None]], pa.list_(pa.list_(pa.int64(), 2)))
    assert "null list element (at depth 1) at row 2" in refused(tmp_path,
                                                                pa.table({"n": nested}))
    nested = pa.array([[[1, 2]], [], [[3, 4], [None, 5]]], pa.list_(pa.list_(pa.int64(), 2)))
    assert "null list element (at depth 2) at row 2" in refused(tmp_path,
                                                                pa.table({"n": nested}))


def test_list_view_values_no_list_takes_may_be_null(tmp_path: pathlib.Path) -> None:
    values = pa.array([1, None, 3, 4], pa.int32())
    views = pa.ListViewArray.from_arrays(pa.array([0, 2, 3], pa.int32()),
                                         pa.array([1, 2, 0], pa.int32()), values)
    sliced = pa.array([[1], [None], [3, 4]], pa.list_view(pa.int32())).slice(2)
    for name, arr in [("views", views), ("sliced", sliced)]:
        dst = tmp_path / name
        from_arrow(dst, pa.table({"l": arr}))
        ds = open_dataset(dst)["l"]
        assert records(ds, len(arr)) == arr.to_pylist(), name
        assert ds[np.arange(len(arr))][0].dtype == np.int32
    taken = pa.ListViewArray.from_arrays(pa.array([2, 0], pa.int32()),
                                         pa.array([1, 2], pa.int32()), values)
    assert "at row 1" in refused(tmp_path / "views", pa.table({"l": taken}))


# -- extension types stored as structs -----------------------------------------------------------


def test_extension_stored_as_a_struct_is_flattened(tmp_path: pathlib.Path) -> None:
    storage = pa.array([{"a": i, "b": f"s{i}"} for i in range(5)], Pair().storage_type)
    pair = pa.ExtensionArray.from_storage(Pair(), storage)
    inside = pa.StructArray.from_arrays([pair, pa.array(range(5))], names=["p", "n"])
    table = pa.table({"e": pair, "x": inside})
    from_arrow(tmp_path / "ds", table.slice(1), chunk_bytes=16)
    ds = open_dataset(tmp_path / "ds")
    assert list(ds) == ["e.a", "e.b", "x.p.a", "x.p.b", "x.n"]
    for name in ("e", "x.p"):
        assert np.asarray(ds[f"{name}.a"][np.arange(4)]).tolist() == \
            storage.field("a").to_pylist()[1:]
        assert decode_strings(ds[f"{name}.b"][np.arange(4)]) == \
            storage.field("b").to_pylist()[1:]
    column = read_manifest(tmp_path / "ds").column("e.a")
    assert column.extra["extension"] == "test.pair" and column.extra["arrow_type"] == "int32"
    from_arrow(tmp_path / "one", table, columns=["e.b"])
    assert list(open_dataset(tmp_path / "one")) == ["e.b"]


def test_extension_stored_as_a_struct_refuses_its_nulls(tmp_path: pathlib.Path) -> None:
    storage = pa.array([{"a": 1, "b": "x"}, None, {"a": 3, "b": "z"}], Pair().storage_type)
    message = refused(tmp_path, pa.table({"e": pa.ExtensionArray.from_storage(Pair(), storage)}))
    assert "column 'e.a' has a null at row 1" in message
    storage = pa.array([{"a": 1, "b": "x"}, {"a": 2, "b": None}], Pair().storage_type)
    message = refused(tmp_path, pa.table({"e": pa.ExtensionArray.from_storage(Pair(), storage)}))
    assert "column 'e.b' has a null at row 1" in message
