"""Hugging Face datasets and Arrow IPC files into loaderx (loaderx.intake.tables and
loaderx.intake._arrow_files): Image and Audio features stored as their encoded bytes (the
column ``image``) with their paths beside them (``image.path``, left out when null in every
row), ClassLabel names kept, checked against what ``datasets`` itself holds and decodes; a
``save_to_disk`` directory, its ``.arrow`` files (the IPC stream format) and IPC files
(the file format, compressed or not) from Python and from ``loaderx convert``; a DatasetDict
refused naming its splits; hostile directories and files refused (names outside the
directory, links out of it, oversized JSON, lying IPC messages); all-null struct fields
refused naming the columns to keep."""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import os
import pathlib
import struct
from typing import Any

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
ipc = pytest.importorskip("pyarrow.ipc")
pq = pytest.importorskip("pyarrow.parquet")

from frameworks_required import need  # noqa: E402
from loaderx import cli, decode_strings, from_arrow, open_dataset  # noqa: E402
from loaderx.errors import CorruptStoreError, DatasetError, LimitExceededError  # noqa: E402
from loaderx.intake import _arrow_files, read_manifest  # noqa: E402

N = 12
CLASSES = ["cat", "dog", "fox"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    if importlib.util.find_spec("datasets") is not None:
        importlib.import_module("datasets").disable_progress_bars()


def photo(i: int, fmt: str = "PNG") -> bytes:
    """An image of its own size and colours, encoded."""
    image = need("PIL.Image")
    rng = np.random.default_rng(i)
    out = io.BytesIO()
    image.fromarray(rng.integers(0, 256, (5 + i % 4, 7 + i % 3, 3), dtype=np.uint8)).save(
        out, fmt)
    return out.getvalue()


def image_dataset(paths: list[str | None] | None = None) -> Any:
    datasets = need("datasets")
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=CLASSES)})
    paths = paths if paths is not None else [None] * N
    return datasets.Dataset.from_dict(
        {"image": [{"bytes": photo(i, "PNG" if i % 2 else "JPEG"), "path": p}
                   for i, p in enumerate(paths)],
         "label": [i % 3 for i in range(N)]}, features=features)


def check_images(dst: pathlib.Path, ds: Any, paths: bool = False) -> None:
    """``dst`` against ``ds``: the bytes datasets holds, decoded as datasets decodes them, the
    labels, the class names; ``image.path`` there exactly when ``paths``."""
    image = need("PIL.Image")
    got = open_dataset(dst)
    reference = ds.with_format("arrow")[:]  # what datasets holds, in the dataset's order
    assert list(got) == (["image", "image.path", "label"] if paths else ["image", "label"])
    for i in range(len(ds)):
        held = reference.column("image")[i].as_py()
        assert bytes(got["image"][i]) == held["bytes"]
        decoded = np.asarray(image.open(io.BytesIO(bytes(got["image"][i]))))
        assert np.array_equal(decoded, np.asarray(ds[i]["image"]))
        if paths:
            assert decode_strings(got["image.path"][i]) == (held["path"] or "")
    assert got["label"][np.arange(len(ds))].tolist() == ds["label"]
    m = read_manifest(dst)
    assert m.column("label").extra["classes"] == CLASSES
    assert m.column("image").extra["encoded"] == "image"
    assert m.column("image").extra["huggingface"]["_type"] == "Image"
    assert m.column("image").kind == "ragged" and m.column("image").dtype == np.uint8


# -- item 4: Image / Audio features, ClassLabel ----------------------------------------------


def test_image_dataset_from_bytes_every_way_it_comes(tmp_path: pathlib.Path) -> None:
    ds = image_dataset()
    ds.save_to_disk(str(tmp_path / "saved"))
    ds.to_parquet(str(tmp_path / "hub.parquet"))
    datasets = need("datasets")
    mapped = datasets.load_from_disk(str(tmp_path / "saved"))
    arrow_file = next((tmp_path / "saved").glob("data-*.arrow"))
    for k, source in enumerate([ds, ds.with_format("arrow"), mapped, ds.data.table,
                                str(tmp_path / "hub.parquet"), str(tmp_path / "saved"),
                                str(arrow_file)]):
        assert from_arrow(tmp_path / f"out{k}", source) == N, source
        check_images(tmp_path / f"out{k}", ds)  # path null in every row: left out


def test_paths_kept_when_present_and_empty_where_missing(tmp_path: pathlib.Path) -> None:
    paths: list[str | None] = [f"photos/{i:03d}.png" for i in range(N)]
    paths[3] = None
    ds = image_dataset(paths)
    from_arrow(tmp_path / "live", ds)
    check_images(tmp_path / "live", ds, paths=True)
    ds.to_parquet(str(tmp_path / "p.parquet"))
    from_arrow(tmp_path / "pq", tmp_path / "p.parquet")
    check_images(tmp_path / "pq", ds, paths=True)
    # Named, a path null in every row is kept (as empty strings); columns= picks as for structs.
    none = image_dataset()
    from_arrow(tmp_path / "named", none, columns=["image", "image.path"])
    assert decode_strings(open_dataset(tmp_path / "named")["image.path"][[0, 1]]) == ["", ""]
    from_arrow(tmp_path / "only", ds, columns=["image"])
    assert list(open_dataset(tmp_path / "only")) == ["image", "image.path"]
    with pytest.raises(DatasetError, match="'image.bytes'.*Hugging Face Image.*'image'"):
        from_arrow(tmp_path / "old", ds, columns=["image.bytes"])


def test_a_stream_keeps_the_paths_it_cannot_know_are_null(tmp_path: pathlib.Path) -> None:
    ds = image_dataset()
    table = ds.data.table
    from_arrow(tmp_path / "s", pa.RecordBatchReader.from_batches(table.schema,
                                                                   table.to_batches()))
    check_images(tmp_path / "s", ds, paths=True)  # a stream read once: "" in every row


def test_images_only_as_paths_name_the_fix(tmp_path: pathlib.Path) -> None:
    datasets = need("datasets")
    files = []
    for i in range(3):
        (tmp_path / f"{i}.png").write_bytes(photo(i))
        files.append(str(tmp_path / f"{i}.png"))
    ds = datasets.Dataset.from_dict({"image": files}).cast_column("image", datasets.Image())
    assert ds.data.table.column("image")[0].as_py()["bytes"] is None  # a file outside
    with pytest.raises(DatasetError, match=r"'image' \(a Hugging Face Image\) has no bytes at "
                       r"row 0.*save_to_disk"):
        from_arrow(tmp_path / "out", ds)
    assert not (tmp_path / "out").exists()
    ds.save_to_disk(str(tmp_path / "saved"))  # the fix the message names: the files embedded
    assert from_arrow(tmp_path / "out", tmp_path / "saved") == 3
    got = open_dataset(tmp_path / "out")
    assert bytes(got["image"][2]) == (tmp_path / "2.png").read_bytes()
    assert decode_strings(got["image.path"][2]) == "2.png"  # datasets keeps the name


def test_audio_bytes_as_datasets_holds_them(tmp_path: pathlib.Path) -> None:
    datasets = need("datasets")
    blobs = [b"RIFF" + bytes([i]) * (40 + i) for i in range(5)]
    features = datasets.Features({"audio": datasets.Audio(sampling_rate=16000)})
    # Encoding audio needs torchcodec; a table of the feature's storage does not.
    storage = features.arrow_schema.field("audio").type
    table = pa.table({"audio": pa.array([{"bytes": b, "path": f"clip{i}.wav"}
                                         for i, b in enumerate(blobs)], storage)})
    ds = datasets.Dataset(table.replace_schema_metadata(features.arrow_schema.metadata))
    assert ds.features == features
    ds.save_to_disk(str(tmp_path / "saved"))
    from_arrow(tmp_path / "out", tmp_path / "saved")
    got = open_dataset(tmp_path / "out")
    held = ds.data.table.column("audio").to_pylist()
    assert [bytes(got["audio"][i]) for i in range(5)] == [h["bytes"] for h in held]
    assert decode_strings(got["audio.path"][[0, 4]]) == ["clip0.wav", "clip4.wav"]
    extra = read_manifest(tmp_path / "out").column("audio").extra
    assert extra["encoded"] == "audio" and extra["huggingface"]["sampling_rate"] == 16000


def test_resumed_parquet_shards_decide_the_paths_as_one(tmp_path: pathlib.Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A part per file, and every part has the columns the whole conversion has: file 0's
    paths are all null, file 1's are not, so both parts keep image.path."""
    from loaderx.intake import tables

    monkeypatch.setattr(tables, "RESUME_PART_BYTES", 1, raising=False)  # a part per file
    paths: list[str | None] = [None] * 6 + [f"{i}.png" for i in range(6, N)]
    ds = image_dataset(paths)
    ds.select(range(6)).to_parquet(str(tmp_path / "train-0.parquet"))
    ds.select(range(6, N)).to_parquet(str(tmp_path / "train-1.parquet"))
    files = [str(tmp_path / "train-0.parquet"), str(tmp_path / "train-1.parquet")]
    assert from_arrow(tmp_path / "out", files, resume=True) == N
    check_images(tmp_path / "out", ds, paths=True)
    none = image_dataset()
    none.select(range(6)).to_parquet(str(tmp_path / "n-0.parquet"))
    none.select(range(6, N)).to_parquet(str(tmp_path / "n-1.parquet"))
    assert from_arrow(tmp_path / "none", str(tmp_path / "n-*.parquet"), resume=True) == N
    check_images(tmp_path / "none", none)


# -- item 5: save_to_disk directories, IPC files, the command line ---------------------------


def test_ipc_file_and_stream_formats_compressed_or_not(tmp_path: pathlib.Path) -> None:
    table = pa.table({"id": np.arange(1000), "text": [f"row {i}" for i in range(1000)],
                      "vec": pa.array([[i, -i] for i in range(1000)], pa.list_(pa.int32(), 2))})
    written = []
    for k, (maker, compression) in enumerate([(ipc.new_file, None), (ipc.new_stream, None),
                                              (ipc.new_file, "lz4"), (ipc.new_stream, "zstd")]):
        path = tmp_path / f"t{k}.data"  # no telling suffix: known by the first bytes
        options = ipc.IpcWriteOptions(compression=compression)
        with maker(str(path), table.schema, options=options) as w:
            w.write_table(table, max_chunksize=300)
        written.append(path)
        assert from_arrow(tmp_path / f"o{k}", path, chunk_bytes=4000) == 1000
        got = open_dataset(tmp_path / f"o{k}")
        assert got["id"][np.arange(1000)].tolist() == list(range(1000))
        assert decode_strings(got["text"][[0, 999]]) == ["row 0", "row 999"]
        assert got["vec"][7].tolist() == [7, -7]
        assert read_manifest(tmp_path / f"o{k}").extra == {"source": "arrow_ipc"}
    assert from_arrow(tmp_path / "all", written) == 4000  # several files, in the order given
    # A file whose writer did not mark the end of its stream before the footer (the format
    # asks for it; not every writer does): the stream ends where the footer begins.
    data = written[0].read_bytes()
    footer = struct.unpack("<i", data[-10:-6])[0]
    start = len(data) - 10 - footer
    assert data[start - 8:start] == b"\xff\xff\xff\xff\0\0\0\0"
    (tmp_path / "no-eos.arrow").write_bytes(data[:start - 8] + data[start:])
    assert ipc.open_file(str(tmp_path / "no-eos.arrow")).num_record_batches == 4
    assert from_arrow(tmp_path / "no-eos", tmp_path / "no-eos.arrow") == 1000
    with pytest.raises(DatasetError, match="Parquet and .* an Arrow IPC file"):
        pq.write_table(table, tmp_path / "t.parquet")
        from_arrow(tmp_path / "mixed", [tmp_path / "t.parquet", written[0]])
    with pytest.raises(ValueError, match="resume=True.*Arrow IPC"):
        from_arrow(tmp_path / "r", written[0], resume=True)


def test_dataset_dict_is_refused_naming_its_splits(tmp_path: pathlib.Path) -> None:
    datasets = need("datasets")
    ds = image_dataset()
    datasets.DatasetDict({"train": ds, "test": ds.select(range(4))}).save_to_disk(
        str(tmp_path / "dict"))
    with pytest.raises(DatasetError, match=r"DatasetDict of 2 split\(s\) \('train', 'test'\)"
                       r".*convert one split"):
        from_arrow(tmp_path / "out", tmp_path / "dict")
    assert from_arrow(tmp_path / "out", tmp_path / "dict" / "test") == 4


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_converts_a_saved_dataset_and_its_arrow_files(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    datasets = need("datasets")
    ds = image_dataset()
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    for k, given in enumerate([str(tmp_path / "saved"), str(tmp_path / "saved" / "*.arrow")]):
        status, out, err = run_cli(capsys, "convert", given, str(tmp_path / f"o{k}"))
        assert status == 0, err
        assert out.strip() == f"{tmp_path / f'o{k}'}: {N} rows; columns image, label"
        check_images(tmp_path / f"o{k}", ds)
    one = sorted((tmp_path / "saved").glob("*.arrow"))[0]
    (tmp_path / "renamed").write_bytes(one.read_bytes())  # no suffix: the NumPy path before
    status, out, err = run_cli(capsys, "convert", str(tmp_path / "renamed"), str(tmp_path / "r"))
    assert status == 0, err
    assert open_dataset(tmp_path / "r")["label"][0] == 0
    datasets.DatasetDict({"train": ds, "validation": ds}).save_to_disk(str(tmp_path / "dict"))
    capsys.readouterr()
    status, out, err = run_cli(capsys, "convert", str(tmp_path / "dict"), str(tmp_path / "d"))
    assert status == 2 and "'train', 'validation'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()


# -- hostile directories and files -----------------------------------------------------------


def saved(tmp_path: pathlib.Path) -> pathlib.Path:
    image_dataset().save_to_disk(str(tmp_path / "saved"))
    return tmp_path / "saved"


def set_files(root: pathlib.Path, names: list[Any]) -> None:
    state = json.loads((root / "state.json").read_text())
    state["_data_files"] = [{"filename": n} for n in names]
    (root / "state.json").write_text(json.dumps(state))


@pytest.mark.parametrize("name", ["../outside.arrow", "/etc/passwd", "sub/x.arrow", "..", "",
                                  7])
def test_state_json_naming_files_outside_is_refused(tmp_path: pathlib.Path, name: Any) -> None:
    root = saved(tmp_path)
    (tmp_path / "outside.arrow").write_bytes(next(root.glob("*.arrow")).read_bytes())
    set_files(root, [name])
    with pytest.raises(CorruptStoreError, match="plain file name"):
        from_arrow(tmp_path / "out", root)
    assert not (tmp_path / "out").exists()


def test_links_out_of_the_directory_are_refused_links_inside_followed(
        tmp_path: pathlib.Path) -> None:
    root = saved(tmp_path)
    data = next(root.glob("*.arrow"))
    os.rename(data, tmp_path / "elsewhere.arrow")
    os.symlink(tmp_path / "elsewhere.arrow", data)
    with pytest.raises(CorruptStoreError, match="outside"):
        from_arrow(tmp_path / "out", root)
    os.unlink(data)
    os.rename(tmp_path / "elsewhere.arrow", root / "real.arrow")
    os.symlink("real.arrow", data)  # a link inside the directory: read
    assert from_arrow(tmp_path / "out", root) == N
    os.rename(root / "state.json", tmp_path / "state.json")
    os.symlink(tmp_path / "state.json", root / "state.json")
    with pytest.raises(CorruptStoreError, match="outside"):
        from_arrow(tmp_path / "out2", root)


def test_oversized_and_broken_state_files_are_refused(tmp_path: pathlib.Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root = saved(tmp_path)
    data = next(root.glob("*.arrow")).name
    monkeypatch.setattr(_arrow_files, "MAX_FILES", 2)
    set_files(root, [data] * 3)
    with pytest.raises(LimitExceededError, match="3 data files"):
        from_arrow(tmp_path / "out", root)
    set_files(root, [data, data])
    with pytest.raises(CorruptStoreError, match="twice"):
        from_arrow(tmp_path / "out", root)
    (root / "state.json").write_text("[" * 100_000)  # nested past the recursion limit
    with pytest.raises(CorruptStoreError, match="not valid JSON"):
        from_arrow(tmp_path / "out", root)
    monkeypatch.setattr(_arrow_files, "MAX_JSON_BYTES", 1000)
    (root / "state.json").write_text(json.dumps({"_data_files": [{"filename": data}],
                                                 "pad": "x" * 2000}))
    with pytest.raises(CorruptStoreError, match="over the 1000-byte limit"):
        from_arrow(tmp_path / "out", root)
    (root / "state.json").write_text(json.dumps({"_data_files": []}))
    with pytest.raises(CorruptStoreError, match="names no data files"):
        from_arrow(tmp_path / "out", root)
    (root / "state.json").write_text(json.dumps({"_data_files": [{"filename": data}]}))
    os.unlink(root / data)
    os.mkfifo(root / data)  # never opened: it would block
    with pytest.raises(CorruptStoreError, match="not a regular file"):
        from_arrow(tmp_path / "out", root)
    assert not (tmp_path / "out").exists()


def compressed_file(path: pathlib.Path) -> tuple[bytes, int]:
    """A compressed IPC file, and the file offset of its first compressed buffer's declared
    decoded length (found with the module's own metadata reader)."""
    table = pa.table({"x": np.arange(10_000, dtype=np.int64)})
    with ipc.new_file(str(path), table.schema,
                      options=ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(table)
    data = path.read_bytes()
    reader = ipc.MessageReader.open_stream(pa.BufferReader(pa.py_buffer(data[8:])))
    pos = 8
    while True:
        head = data[pos:pos + 8]
        meta_len = struct.unpack("<i", head[4:])[0]
        message = reader.read_next_message()
        if message.type == "record batch":
            flat = _arrow_files._Flat(message.metadata.to_pybytes(), "test")
            batch = flat.ref(flat.root(), 2)
            assert batch is not None
            buffers = [b for b in flat.structs(batch, 2, 16) if b[1] >= 8]
            return data, pos + 8 + meta_len + buffers[-1][0]
        pos += 8 + meta_len + (message.body.size if message.body is not None else 0)


def test_a_compressed_batch_declaring_gigabytes_is_refused_before_decoding(
        tmp_path: pathlib.Path) -> None:
    data, at = compressed_file(tmp_path / "c.arrow")
    assert struct.unpack("<q", data[at:at + 8])[0] == 80_000
    assert from_arrow(tmp_path / "ok", tmp_path / "c.arrow") == 10_000
    bomb = data[:at] + struct.pack("<q", 1 << 40) + data[at + 8:]
    (tmp_path / "bomb.arrow").write_bytes(bomb)
    with pytest.raises(LimitExceededError, match="declares 1099511627776 bytes decoded"):
        from_arrow(tmp_path / "out", tmp_path / "bomb.arrow")
    (tmp_path / "neg.arrow").write_bytes(data[:at] + struct.pack("<q", -5) + data[at + 8:])
    with pytest.raises(CorruptStoreError, match="compressed buffer of -5 bytes"):
        from_arrow(tmp_path / "out", tmp_path / "neg.arrow")
    assert not (tmp_path / "out").exists()


def test_damaged_ipc_files_are_corrupt(tmp_path: pathlib.Path) -> None:
    table = pa.table({"s": ["a", "bb", "ccc"] * 100})
    with ipc.new_stream(str(tmp_path / "s.arrow"), table.schema) as w:
        w.write_table(table)
    assert from_arrow(tmp_path / "good", tmp_path / "s.arrow") == 300
    data = (tmp_path / "s.arrow").read_bytes()
    cases = {"cut": data[: len(data) // 2], "empty": b"",
             "garbage": b"\xff\xff\xff\xff" + struct.pack("<i", 64) + os.urandom(64),
             "long": b"\xff\xff\xff\xff" + struct.pack("<i", 1 << 30) + b"\0" * 64}
    for name, body in cases.items():
        (tmp_path / f"{name}.arrow").write_bytes(body)
        with pytest.raises(CorruptStoreError):
            from_arrow(tmp_path / "out", tmp_path / f"{name}.arrow")
    # Offsets that go backwards, text that is not UTF-8 (arrays pyarrow writes without a full
    # check): refused, not read.
    data = pa.py_buffer(b"abcdef")
    backwards = pa.py_buffer(np.array([0, 5, 2, 6], np.int32).tobytes())
    not_utf8 = pa.array([b"ok", b"\xff\xfe"]).buffers()
    for name, arr in [("backwards", pa.Array.from_buffers(pa.string(), 3,
                                                          [None, backwards, data])),
                      ("utf8", pa.Array.from_buffers(pa.string(), 2, not_utf8))]:
        with ipc.new_stream(str(tmp_path / f"{name}.arrow"),
                            pa.schema([("s", pa.string())])) as w:
            w.write_batch(pa.record_batch([arr], names=["s"]))
        with pytest.raises(CorruptStoreError, match=f"{name}.arrow"):
            from_arrow(tmp_path / "out", tmp_path / f"{name}.arrow")
    assert not (tmp_path / "out").exists()


# -- struct fields null in every row ---------------------------------------------------------


def test_a_struct_field_null_in_every_row_names_the_columns_to_keep(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    typed = pa.table({"label": [1, 2, 3],
                      "meta": pa.array([{"w": 1, "note": None}] * 3,
                                       pa.struct([("w", pa.int64()), ("note", pa.string())]))})
    inferred = pa.table({"label": [1, 2, 3], "meta": pa.array([{"w": 1, "note": None}] * 3)})
    pq.write_table(typed, tmp_path / "t.parquet")
    for source in [typed, inferred, tmp_path / "t.parquet"]:
        with pytest.raises(DatasetError, match=r"column 'meta.note' is null in every row; "
                           r"leave it out with columns=\['label', 'meta.w'\]"):
            from_arrow(tmp_path / "out", source)
        assert from_arrow(tmp_path / "out", source, columns=["label", "meta.w"]) == 3
        assert open_dataset(tmp_path / "out")["meta.w"][2] == 1
        os.rename(tmp_path / "out", tmp_path / f"done-{id(source)}")
    # A stream cannot be read twice to know: the first null is refused, the columns named.
    reader = pa.RecordBatchReader.from_batches(typed.schema, typed.to_batches())
    with pytest.raises(DatasetError, match=r"'meta.note' has a null at row 0.*"
                       r"columns=\['label', 'meta.w'\]"):
        from_arrow(tmp_path / "out", reader)
    status, _, err = run_cli(capsys, "convert", str(tmp_path / "t.parquet"),
                             str(tmp_path / "cli"))
    assert status == 2 and "leave it out with --columns label,meta.w" in err
