"""Image folders and WebDataset shards into dataset directories (loaderx.intake.files).

Round trips (bytes and names identical, labels and class names right, Pillow decodes every
stored image as it decodes the file, the webdataset library as the independent reference for
grouping), hostile inputs (links out of the root, non-images, a file over the record limit,
tars with path tricks, links, devices, lying sizes, cuts and damaged compression) refused or
skipped with clear errors and nothing written outside the destination, an interrupted
conversion (SIGKILL) re-run to the same result, and the DataLoader reading the result with a
Pillow decode transform."""

from __future__ import annotations

import dataclasses
import gc
import gzip
import hashlib
import io
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tarfile
import textwrap
import warnings

import numpy as np
import pytest

import tarcraft as tc
from loaderx import DataLoader, from_image_folder, from_webdataset, open_dataset
from loaderx.cli import main
from loaderx.errors import (
    CorruptStoreError,
    DatasetError,
    LimitExceededError,
    LoaderxTypeError,
    LoaderxValueError,
)
from loaderx.intake import export_image_folder, export_webdataset, read_manifest
from loaderx.intake import files as files_mod
from loaderx.intake._image_folder import Folder, image_format, read_image
from loaderx.intake._shard_names import expand_braces, shard_paths
from loaderx.intake.files import SkippedFilesWarning
from loaderx.zrecord import MAX_RECORD_BYTES

Image = pytest.importorskip("PIL.Image")

REPO = pathlib.Path(__file__).resolve().parents[1]


# -- helpers -------------------------------------------------------------------------------------


def encoded(seed: int, fmt: str = "JPEG", size: tuple[int, int] = (24, 16)) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def decoded(data: bytes | np.ndarray) -> np.ndarray:
    raw = data.tobytes() if isinstance(data, np.ndarray) else data
    with Image.open(io.BytesIO(raw)) as img:
        return np.asarray(img.convert("RGB"))


def tree(root: pathlib.Path) -> dict[bytes, bytes | None]:
    """Every entry below ``root`` (links not followed): relative path -> bytes (None: a
    folder; b'->target' for a link)."""
    out: dict[bytes, bytes | None] = {}
    base = os.fsencode(root)
    for here, dirs, files in os.walk(base):
        for name in dirs + files:
            path = os.path.join(here, name)
            rel = os.path.relpath(path, base)
            if os.path.islink(path):
                out[rel] = b"->" + os.readlink(path)
            elif os.path.isdir(path):
                out[rel] = None
            else:
                with open(path, "rb") as f:
                    out[rel] = f.read()
    return out


def digest(root: pathlib.Path) -> str:
    """A hash of everything below ``root`` (names, kinds, bytes, modes)."""
    h = hashlib.sha256()
    for rel, data in sorted(tree(root).items()):
        st = os.lstat(os.path.join(os.fsencode(root), rel))
        h.update(rel + b"\0" + (b"<dir>" if data is None else data) + str(st.st_mode).encode())
    return h.hexdigest()


def column(ds: dict, name: str) -> list:
    n = len(ds[name])
    return list(ds[name][np.arange(n)]) if n else []


def close_all(ds: dict) -> None:
    for d in ds.values():
        d.close()


FORMATS = ["JPEG", "PNG", "GIF", "BMP", "WEBP", "TIFF", "PPM"]


def make_folder(root: pathlib.Path) -> dict[bytes, bytes]:
    """An image folder with every format, nested folders, an empty class and odd names;
    returns relative path -> bytes of every image."""
    images: dict[bytes, bytes] = {}

    def put(rel: bytes, data: bytes) -> None:
        path = os.path.join(os.fsencode(root), rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        images[rel] = data

    for i, fmt in enumerate(FORMATS):
        put(f"cat/{i:02d}.{fmt.lower()}".encode(), encoded(i, fmt))
    put(b"dog/b.jpg", encoded(10))
    put(b"dog/a.png", encoded(11, "PNG"))
    put(b"dog/sub/deeper/z.jpg", encoded(12))
    put("dog/spaced name, ünïcode\nnewline-.jpg".encode(), encoded(13))
    put(b"dog/not-utf8-\xff\xfe.jpg", encoded(14))
    put(b"dog/-leading-dash.gif", encoded(15, "GIF"))
    put("Zebra/名前.png".encode(), encoded(16, "PNG"))
    put(b"dog/wrong-extension.txt", encoded(17, "PNG"))  # a PNG, whatever its name says
    os.makedirs(root / "empty")
    return images


# -- image folders: round trip -------------------------------------------------------------------


def test_image_folder_round_trip(tmp_path):
    """Every image's bytes kept, labels by sorted class name (empty classes counted), the
    path column, Pillow decoding the stored bytes as the file, and export_image_folder
    giving the same tree back."""
    root = tmp_path / "photos"
    images = make_folder(root)
    dst = tmp_path / "ds"
    report = from_image_folder(dst, root)
    classes = ["Zebra", "cat", "dog", "empty"]  # sorted by bytes: upper case first
    assert report["classes"] == classes
    assert report["rows"] == len(images) and report["empty_classes"] == ["empty"]
    assert report["skipped"] == {}
    assert report["counts"] == [1, len(FORMATS), len(images) - 1 - len(FORMATS), 0]

    ds = open_dataset(dst)
    try:
        assert list(ds) == ["image", "label", "path"]
        paths = [p.tobytes() for p in column(ds, "path")]
        labels = column(ds, "label")
        stored = column(ds, "image")
        # Class by class, each class's folder files sorted by bytes, then its sub-folders.
        expected_order = sorted(images, key=lambda p: (
            classes.index(os.fsdecode(p.split(b"/")[0])), p.count(b"/") > 1, p))
        assert paths == expected_order
        for rel, label, data in zip(paths, labels, stored, strict=True):
            assert classes[label] == os.fsdecode(rel.split(b"/")[0])
            assert data.tobytes() == images[rel]
            original = decoded(images[rel])
            assert np.array_equal(decoded(data), original)
        assert ds["label"].dtype == np.int64 and ds["image"].dtype == np.uint8
    finally:
        close_all(ds)

    manifest = read_manifest(dst)
    label = manifest.column("label")
    assert label.extra["classes"] == classes and label.extra["counts"] == report["counts"]
    assert manifest.extra["source"] == "image_folder"

    out = tmp_path / "back"
    assert export_image_folder(dst, out) == len(images)
    assert tree(out) == tree(root)
    with pytest.raises(DatasetError, match="exists"):
        export_image_folder(dst, out)


def test_image_formats_are_told_by_their_bytes():
    for i, fmt in enumerate(FORMATS):
        assert image_format(encoded(i, fmt)[:16]) is not None, fmt
    for junk in (b"", b"hello world", b"\xff\xd8", b"BM", b"RIFF1234WAVE", b"P9 1 1"):
        assert image_format(junk) is None


def test_an_image_folder_conversion_is_refused_over_an_existing_dataset(tmp_path):
    root = tmp_path / "photos"
    make_folder(root)
    from_image_folder(tmp_path / "ds", root)
    (root / "cat" / "new.png").write_bytes(encoded(99, "PNG"))
    with pytest.raises(DatasetError, match="overwrite=True"):
        from_image_folder(tmp_path / "ds", root)
    from_image_folder(tmp_path / "ds", root, overwrite=True)
    ds = open_dataset(tmp_path / "ds")
    try:
        assert b"cat/new.png" in [p.tobytes() for p in column(ds, "path")]
    finally:
        close_all(ds)


def test_workers_do_not_change_the_result(tmp_path):
    root = tmp_path / "photos"
    for i in range(300):  # several runs per folder and several folders
        d = root / f"c{i % 3}" / ("sub" if i % 7 == 0 else "")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:04d}.png").write_bytes(encoded(i, "PNG", (4, 4)))
    results = []
    for workers in (1, 2, 7):
        dst = tmp_path / f"ds{workers}"
        from_image_folder(dst, root, workers=workers)
        ds = open_dataset(dst)
        results.append([[x.tobytes() if isinstance(x, np.ndarray) and x.dtype == np.uint8
                         else int(x) for x in column(ds, c)] for c in ds])
        close_all(ds)
    assert results[0] == results[1] == results[2]


def test_memory_stays_bounded_whatever_the_folder_size(tmp_path, monkeypatch):
    """40 MB of images through 2 MiB batches and 2 threads: the Python heap's peak stays
    a fraction of the folder (the reads in flight and one batch), not the folder."""
    import tracemalloc

    root = tmp_path / "photos"
    head = encoded(1)
    for i in range(400):
        d = root / f"c{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:04d}.jpg").write_bytes(head + os.urandom(100_000))
    monkeypatch.setattr(files_mod, "_BATCH_BYTES", 2 << 20)
    tracemalloc.start()
    try:
        report = from_image_folder(tmp_path / "ds", root, workers=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report["bytes"] > 40_000_000
    assert peak < 20 << 20, peak


def test_the_loader_reads_an_image_folder_with_a_pillow_decode(tmp_path):
    root = tmp_path / "photos"
    for i in range(40):
        d = root / ("odd" if i % 2 else "even")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:02d}.jpg").write_bytes(encoded(i, "JPEG", (16, 12)))
    from_image_folder(tmp_path / "ds", root)

    def decode(batch):
        images = np.stack([decoded(r) for r in batch["image"]])
        return images, batch["label"], [p.tobytes() for p in batch["path"]]

    ds = open_dataset(tmp_path / "ds")
    seen = 0
    with DataLoader(ds, batch_size=6, num_workers=2, transform=decode) as loader:
        for images, labels, paths in loader.epoch():
            assert images.shape[1:] == (12, 16, 3) and images.dtype == np.uint8
            for img, label, rel in zip(images, labels, paths, strict=True):
                cls, name = rel.decode().split("/")
                assert label == ["even", "odd"].index(cls)
                assert np.array_equal(img, decoded((root / cls / name).read_bytes()))
                seen += 1
    close_all(ds)
    assert seen == 40


# -- image folders: hostile input ----------------------------------------------------------------


def hostile_folder(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A folder whose links point out of it, at a secret beside it; returns (root, secret
    folder)."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.png").write_bytes(encoded(500, "PNG"))  # an image: would be taken
    root = tmp_path / "photos"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "ok.jpg").write_bytes(encoded(1))
    os.symlink(secret / "key.png", root / "cat" / "link.png")
    os.symlink(secret, root / "cat" / "linked-dir")
    os.symlink(secret, root / "linked-class")
    os.symlink("/etc/passwd", root / "cat" / "passwd.jpg")
    os.symlink("missing", root / "cat" / "dangling.jpg")
    return root, secret


def test_links_out_of_the_root_are_never_followed(tmp_path):
    root, secret = hostile_folder(tmp_path)
    before = digest(tmp_path / "secret"), digest(root)
    with pytest.warns(SkippedFilesWarning, match="symbolic link"):
        report = from_image_folder(tmp_path / "ds", root)
    assert report["rows"] == 1 and report["classes"] == ["cat"]
    assert report["skipped"] == {"symlink": 5}
    assert sorted(report["skipped_examples"]["symlink"]) == sorted(
        ["cat/dangling.jpg", "cat/link.png", "cat/linked-dir", "cat/passwd.jpg",
         "linked-class"])
    ds = open_dataset(tmp_path / "ds")
    try:
        assert [x.tobytes() for x in column(ds, "image")] == [(root / "cat/ok.jpg").read_bytes()]
    finally:
        close_all(ds)
    assert (digest(tmp_path / "secret"), digest(root)) == before
    assert sorted(os.listdir(tmp_path)) == ["ds", "photos", "secret"]


def test_strict_refuses_the_first_entry_it_would_skip(tmp_path):
    root, _ = hostile_folder(tmp_path)
    with pytest.raises(DatasetError, match=r"photos/linked-class: a symbolic link"):
        from_image_folder(tmp_path / "ds", root, strict=True)
    assert sorted(os.listdir(tmp_path)) == ["photos", "secret"]


def test_a_link_swapped_in_after_the_listing_is_not_followed(tmp_path):
    root = tmp_path / "photos"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "a.png").write_bytes(encoded(1, "PNG"))
    (tmp_path / "secret.png").write_bytes(encoded(2, "PNG"))
    with Folder(str(root)) as folder:
        dirs = list(folder.dirs())
        assert [d.names for d in dirs] == [["a.png"]]
        os.unlink(root / "cat" / "a.png")  # between the listing and the read
        os.symlink(tmp_path / "secret.png", root / "cat" / "a.png")
        assert read_image(folder, dirs[0], "a.png") == "symlink"
        # A class folder swapped for a link is not entered either.
        os.rename(root / "cat", tmp_path / "moved")
        os.symlink(tmp_path / "moved", root / "cat")
        assert list(folder.dirs()) == []
        assert folder.report.counts == {"symlink": 1}
        for d in dirs:
            d.close()


def test_non_images_hidden_entries_and_special_files_are_skipped_and_counted(tmp_path):
    root = tmp_path / "photos"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "real.jpg").write_bytes(encoded(1))
    (root / "cat" / "fake.jpg").write_bytes(b"not an image at all")
    (root / "cat" / "empty.png").write_bytes(b"")
    (root / "cat" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / ".ipynb_checkpoints").mkdir()
    (root / ".ipynb_checkpoints" / "x.jpg").write_bytes(encoded(2))
    (root / "README.md").write_text("a dataset")
    os.mkfifo(root / "cat" / "pipe.jpg")  # must not hang the read
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "cat" / "sock.jpg"))
    try:
        with pytest.warns(SkippedFilesWarning) as caught:
            report = from_image_folder(tmp_path / "ds", root)
    finally:
        sock.close()
    assert report["rows"] == 1
    assert report["skipped"] == {"not_image": 2, "hidden": 2, "special": 2, "outside_class": 1}
    assert sorted(report["skipped_examples"]["not_image"]) == ["cat/empty.png", "cat/fake.jpg"]
    text = str(caught[0].message)
    assert "cat/fake.jpg" in text and "strict=True" in text


def test_a_file_over_the_record_limit_is_refused_naming_it(tmp_path):
    root = tmp_path / "photos"
    (root / "cat").mkdir(parents=True)
    jpeg = encoded(1)
    (root / "cat" / "at-limit.jpg").write_bytes(jpeg + bytes(MAX_RECORD_BYTES - len(jpeg)))
    (root / "cat" / "huge.jpg").write_bytes(jpeg + bytes(MAX_RECORD_BYTES + 1 - len(jpeg)))
    before = digest(root)
    with pytest.raises(LimitExceededError, match=r"cat/huge\.jpg is 1048577 bytes.*shrink it"):
        from_image_folder(tmp_path / "ds", root)
    assert sorted(os.listdir(tmp_path)) == ["photos"]
    assert digest(root) == before
    os.unlink(root / "cat" / "huge.jpg")
    assert from_image_folder(tmp_path / "ds", root)["bytes"] == MAX_RECORD_BYTES


def test_an_unreadable_file_is_refused_naming_it(tmp_path, monkeypatch):
    root = tmp_path / "photos"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "a.jpg").write_bytes(encoded(1))
    (root / "cat" / "locked.jpg").write_bytes(encoded(2))
    real_open = os.open

    def denying_open(path, flags, *args, **kw):  # the suite runs as root: chmod cannot deny
        if path == "locked.jpg":
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", denying_open)
    with pytest.raises(PermissionError, match="locked.jpg") as info:
        from_image_folder(tmp_path / "ds", root)
    assert info.value.filename == os.path.join(root, "cat", "locked.jpg")
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["photos"]


def test_folders_without_classes_or_images_are_refused(tmp_path):
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(encoded(1))
    with pytest.raises(DatasetError, match="no class folders"):
        from_image_folder(tmp_path / "ds", tmp_path / "flat")
    (tmp_path / "nothing" / "cat").mkdir(parents=True)
    (tmp_path / "nothing" / "cat" / "notes.txt").write_text("x")
    with pytest.raises(DatasetError, match="holds no images.*not an image"):
        from_image_folder(tmp_path / "ds", tmp_path / "nothing")
    with pytest.raises(DatasetError, match="not a folder"):
        from_image_folder(tmp_path / "ds", tmp_path / "flat" / "a.jpg")
    with pytest.raises(FileNotFoundError):
        from_image_folder(tmp_path / "ds", tmp_path / "missing")
    assert not (tmp_path / "ds").exists()


def test_a_destination_inside_the_folder_is_refused(tmp_path):
    root = tmp_path / "photos"
    make_folder(root)
    before = digest(root)
    for dst in (root / "ds", root / "cat" / "ds", root):
        with pytest.raises(DatasetError, match="inside the image folder"):
            from_image_folder(dst, root)
    assert digest(root) == before


def test_a_class_name_that_is_not_utf8_is_refused(tmp_path):
    root = tmp_path / "photos"
    os.makedirs(os.path.join(os.fsencode(root), b"caf\xe9"))
    with pytest.raises(DatasetError, match="not UTF-8; rename it"):
        from_image_folder(tmp_path / "ds", root)


def test_export_refuses_stored_paths_that_leave_the_folder(tmp_path):
    """A dataset directory altered to hold '../x' or '/etc/x' as a path writes nothing."""
    from loaderx.intake.directory import DirectoryWriter

    for bad in (b"../escape.jpg", b"/tmp/abs.jpg", b"cat/./x.jpg", b"cat//x.jpg"):
        dst = tmp_path / "ds"
        with DirectoryWriter(dst, overwrite=True, extra={"source": "image_folder"}) as w:
            w.add_column("image", "ragged", np.uint8)
            w.add_column("label", "dense", np.int64, extra={"classes": ["cat"]})
            w.add_column("path", "ragged", np.uint8)
            w.append({"image": [encoded(1)], "label": np.zeros(1, np.int64), "path": [bad]})
        with pytest.raises(CorruptStoreError, match="not a plain relative path"):
            export_image_folder(dst, tmp_path / "out")
        assert sorted(os.listdir(tmp_path)) == ["ds"]


# -- interrupted conversions ---------------------------------------------------------------------

KILLER = textwrap.dedent("""
    import os, signal, sys
    from loaderx.intake import directory, files
    files._BATCH_ROWS = 16          # many appends, so the kill lands mid-way
    files._SHARD_BATCH_BYTES = 1
    real = directory.DirectoryWriter.append
    calls = []
    def append(self, batch):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, batch)
    directory.DirectoryWriter.append = append
    kind, dst, src = sys.argv[1:]
    if kind == "folder":
        files.from_image_folder(dst, src)
    else:
        files.from_webdataset(dst, src)
""")


def dataset_contents(path: pathlib.Path) -> tuple:
    ds = open_dataset(path)
    try:
        # (the generation is drawn afresh by every commit)
        return (dataclasses.replace(read_manifest(path), generation="").to_bytes(),
                {name: [x.tobytes() if isinstance(x, np.ndarray) else x.item()
                        for x in column(ds, name)] for name in ds})
    finally:
        close_all(ds)


@pytest.mark.parametrize("kind", ["folder", "shards"])
def test_a_killed_conversion_reruns_to_the_same_result(tmp_path, kind):
    if kind == "folder":
        src = tmp_path / "photos"
        for i in range(100):
            (src / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
            (src / f"c{i % 4}" / f"{i:03d}.png").write_bytes(encoded(i, "PNG", (4, 4)))
        arg = str(src)
    else:
        src = tmp_path / "shards"
        src.mkdir()
        for s in range(4):
            write_shard(src / f"s-{s}.tar", [(f"k{s}_{i:03d}", {"png": encoded(i, "PNG", (4, 4)),
                                                                "cls": b"%d" % (i % 3)})
                                             for i in range(25)])
        arg = str(src / "s-{0..3}.tar")
    dst = tmp_path / "out" / "ds"
    (tmp_path / "out").mkdir()
    proc = subprocess.run([sys.executable, "-c", KILLER, kind, str(dst), arg],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not dst.exists()  # only a staging directory nobody owns is left
    assert len(os.listdir(tmp_path / "out")) == 1
    convert = from_image_folder if kind == "folder" else from_webdataset
    convert(dst, arg)
    assert os.listdir(tmp_path / "out") == ["ds"]  # the leftover was removed
    convert(tmp_path / "clean", arg)
    assert dataset_contents(dst) == dataset_contents(tmp_path / "clean")


# -- WebDataset: names of shards -----------------------------------------------------------------


def test_brace_expansion_matches_braceexpand():
    braceexpand = pytest.importorskip("braceexpand")
    patterns = ["s-{000..012}.tar", "a{b,c{d,e}}f", "x{a..e}", "{1..3}{a,b}", "x{y}z",
                r"\{a,b\}", "{10..8}", "{-2..2}", "{a,}", "{08..11}", "{8..011}", "a{}b",
                "{a..cc}", "{1..10..3}", "{10..1..4}", "{a..k..2}", "{00..10..5}", r"a\,b",
                "{,}", "{a,b}{c,d}{e,f}", "data/{train,val}-{0..2}.tar", "{{a,b},{c}}"]
    for p in patterns:
        assert expand_braces(p) == list(braceexpand.braceexpand(p)), p


def test_shard_names_from_lists_globs_and_braces(tmp_path):
    for name in ("b-1.tar", "a-2.tar", "a-10.tar", "{odd}.tar"):
        (tmp_path / name).write_bytes(b"")
    t = str(tmp_path)
    assert shard_paths(f"{t}/a-{{2,10}}.tar") == [f"{t}/a-2.tar", f"{t}/a-10.tar"]
    assert shard_paths(f"{t}/a-*.tar") == [f"{t}/a-10.tar", f"{t}/a-2.tar"]  # sorted bytes
    assert shard_paths([f"{t}/b-1.tar", tmp_path / "a-2.tar"]) == [f"{t}/b-1.tar",
                                                                   f"{t}/a-2.tar"]
    assert shard_paths(f"{t}/{{odd}}.tar") == [f"{t}/{{odd}}.tar"]  # an existing name as is
    with pytest.raises(DatasetError, match=r"a-3\.tar' does not exist \(from"):
        shard_paths(f"{t}/a-{{2..3}}.tar")
    with pytest.raises(DatasetError, match="matches no file"):
        shard_paths(f"{t}/zz-*.tar")
    with pytest.raises(DatasetError, match="named twice"):
        shard_paths([f"{t}/b-1.tar", f"{t}/./b-1.tar"])
    with pytest.raises(DatasetError, match="never closed"):
        shard_paths(f"{t}/a-{{1..2.tar")
    with pytest.raises(DatasetError, match="over the limit of 1048576"):
        shard_paths(f"{t}/a-{{0..99999999}}.tar")
    with pytest.raises(DatasetError, match="no shards"):
        shard_paths([])
    with pytest.raises(LoaderxTypeError):
        shard_paths(b"x.tar")
    with pytest.raises(LoaderxTypeError):
        shard_paths(3)


# -- WebDataset: round trip ----------------------------------------------------------------------


def write_shard(path: pathlib.Path, samples: list[tuple[str, dict[str, bytes]]],
                extra: list[tuple[str, bytes]] = ()) -> None:
    """A shard as WebDataset's TarWriter writes it: each sample's members in a row."""
    mode = {".gz": "w:gz", ".xz": "w:xz", ".bz2": "w:bz2"}.get(path.suffix, "w")
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))

        for name, data in extra:
            add(name, data)
        for key, members in samples:
            for ext, data in members.items():
                add(f"{key}.{ext}", data)


def shard_members(path: pathlib.Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def sample_set(n: int, seed: int) -> list[tuple[str, dict[str, bytes]]]:
    rng = np.random.default_rng(seed)
    return [(f"train/{seed:02d}_{i:04d}", {
        "jpg": encoded(seed * 1000 + i, "JPEG", (8 + i % 5, 8)),
        "cls": str(int(rng.integers(0, 10))).encode(),
        "seg.png": encoded(i, "PNG", (4, 4)),
        "json": b'{"i": %d, "text": "caf\xc3\xa9"}' % i,
        "txt": b"" if i % 4 == 0 else b"caption %d" % i,  # empty members are values too
    }) for i in range(n)]


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".tar.xz", ".tar.bz2"])
def test_webdataset_round_trip(tmp_path, suffix):
    shards = []
    for s in range(3):
        path = tmp_path / f"shard-{s:03d}{suffix}"
        write_shard(path, sample_set(7 + s, s))
        shards.append(path)
    report = from_webdataset(tmp_path / "ds", str(tmp_path / f"shard-{{000..002}}{suffix}"),
                             label="cls", workers=2)
    assert report["rows"] == 7 + 8 + 9 and report["shards"] == [str(p) for p in shards]
    assert report["columns"] == ["__key__", "jpg", "cls", "seg.png", "json", "txt",
                                 "__shard__", "label"]
    ds = open_dataset(tmp_path / "ds")
    try:
        expected = [(s, key, members) for s in range(3) for key, members in sample_set(7 + s, s)]
        keys = [k.tobytes().decode() for k in column(ds, "__key__")]
        assert keys == [key for _, key, _ in expected]
        assert column(ds, "__shard__") == [s for s, _, _ in expected]
        assert column(ds, "label") == [int(m["cls"]) for _, _, m in expected]
        for ext in ("jpg", "cls", "seg.png", "json", "txt"):
            assert [v.tobytes() for v in column(ds, ext)] == [m[ext] for _, _, m in expected]
        for (_, _, m), jpg in zip(expected, column(ds, "jpg"), strict=True):
            assert np.array_equal(decoded(jpg), decoded(m["jpg"]))
    finally:
        close_all(ds)
    assert read_manifest(tmp_path / "ds").extra["shards"] == [os.path.abspath(p) for p in shards]

    written = export_webdataset(tmp_path / "ds", str(tmp_path / f"back-%03d{suffix}"))
    assert written == [str(tmp_path / f"back-{s:03d}{suffix}") for s in range(3)]
    for s in range(3):
        assert shard_members(tmp_path / f"back-{s:03d}{suffix}") == shard_members(shards[s])
    with pytest.raises(DatasetError, match="exists"):
        export_webdataset(tmp_path / "ds", str(tmp_path / f"back-%03d{suffix}"))
    for bad in ("same.tar", "x-%s-%s.tar", "x-%d%%.tar%d"):
        with pytest.raises(LoaderxValueError, match="out_pattern"):
            export_webdataset(tmp_path / "ds", str(tmp_path / bad))


def test_samples_are_grouped_as_the_webdataset_library_groups_them(tmp_path):
    """The webdataset package itself is the reference: same samples, keys and bytes."""
    wds = pytest.importorskip("webdataset")
    samples = sample_set(12, 5)
    for _, members in samples:  # upper case: lower-cased, as wds does; exported as it was
        members["TXT"] = members.pop("txt")
    odd = [("dir.with.dots/x", {"a.b.c": b"1"}), ("dir.with.dots/x", {"d": b"2"})]
    path = tmp_path / "s.tar"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedFilesWarning)
        write_shard(path, samples + odd, extra=[("README", b"no extension"),
                                                ("__index__", b"meta"),
                                                (".hidden", b"no key")])
        with pytest.raises(DatasetError, match="'dir.with.dots/x'.*extension"):
            from_webdataset(tmp_path / "ds", path)
        report = from_webdataset(tmp_path / "ds", path, missing="empty",
                                 extensions=["jpg", "cls", "seg.png", "json", "txt", "a.b.c",
                                             "d"])
    assert report["skipped"] == {"meta": 1, "no_extension": 2, "not_selected": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset leaves its file open
        dataset = wds.WebDataset(str(path), shardshuffle=False)
        reference = [{k: v for k, v in s.items() if k not in ("__url__", "__local_path__")}
                     for s in dataset]
        del dataset
        gc.collect()
    ds = open_dataset(tmp_path / "ds")
    try:
        exts = ["jpg", "cls", "seg.png", "json", "txt", "a.b.c", "d"]
        present = column(ds, "__present__")
        ours = []
        for i, key in enumerate(column(ds, "__key__")):
            sample = {"__key__": key.tobytes().decode()}
            for j, ext in enumerate(exts):
                if present[i][j]:
                    sample[ext] = ds[ext][i].tobytes()
            ours.append(sample)
    finally:
        close_all(ds)
    assert ours == reference

    export_webdataset(tmp_path / "ds", str(tmp_path / "back-%d.tar"))
    want = {n: d for n, d in shard_members(path).items()
            if n not in ("README", "__index__", ".hidden")}
    assert shard_members(tmp_path / "back-0.tar") == want  # "JPG" spelled as it was


def test_missing_and_extra_extensions(tmp_path):
    path = tmp_path / "s.tar"
    write_shard(path, [("a", {"jpg": b"1", "cls": b"0"}), ("b", {"jpg": b"2"}),
                       ("c", {"jpg": b"3", "cls": b"1", "txt": b"t"})])
    with pytest.raises(DatasetError, match=r"sample 'b' lacks the extension\(s\) \['cls'\].*"
                                           "missing='empty'"):
        from_webdataset(tmp_path / "ds", path)
    with pytest.raises(DatasetError, match=r"sample 'c' has the extension\(s\) \['txt'\]"):
        from_webdataset(tmp_path / "ds", path, missing="empty")
    with pytest.warns(SkippedFilesWarning, match=r"1 members of extensions not in extensions=, "
                                                 r"e\.g\. \['c\.txt'\]"):
        r = from_webdataset(tmp_path / "ds", path, missing="empty", extensions=["jpg", "cls"])
    assert r["rows"] == 3 and r["skipped"]["not_selected"] == 1
    ds = open_dataset(tmp_path / "ds")
    try:
        assert [bool(x) for x in ds["__present__"][np.arange(3)][:, 1]] == [True, False, True]
        assert ds["cls"][1].tobytes() == b""
    finally:
        close_all(ds)
    with pytest.raises(DatasetError, match="lacks"), warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedFilesWarning)  # a label cannot be missing
        from_webdataset(tmp_path / "ds2", path, missing="empty", extensions=["jpg", "cls"],
                        label="cls")
    assert not (tmp_path / "ds2").exists()


def test_bad_labels_duplicates_and_spellings_are_refused(tmp_path):
    write_shard(tmp_path / "a.tar", [("a", {"jpg": b"1", "cls": b"x7"})])
    with pytest.raises(DatasetError, match="'x7' is not an ASCII integer"):
        from_webdataset(tmp_path / "ds", tmp_path / "a.tar", label="cls")
    write_shard(tmp_path / "b.tar", [("a", {"jpg": b"1", "JPG": b"2"})])
    with pytest.raises(DatasetError, match="extension 'jpg' twice"):
        from_webdataset(tmp_path / "ds", tmp_path / "b.tar")
    write_shard(tmp_path / "c.tar", [("a", {"jpg": b"1"}), ("b", {"JPG": b"2"})])
    with pytest.raises(DatasetError, match="spells the extension 'jpg' as 'JPG'"):
        from_webdataset(tmp_path / "ds", tmp_path / "c.tar")
    write_shard(tmp_path / "d.tar", [("a", {"__key__": b"1"})])
    with pytest.raises(DatasetError, match="name of a column the conversion adds"):
        from_webdataset(tmp_path / "ds", tmp_path / "d.tar")
    write_shard(tmp_path / "e.tar", [], extra=[("README", b"x")])
    with pytest.raises(DatasetError, match="no samples.*1 members without an extension"):
        from_webdataset(tmp_path / "ds", tmp_path / "e.tar")
    assert not (tmp_path / "ds").exists()


def test_a_failing_later_shard_fails_the_conversion_naming_it(tmp_path):
    for s in range(6):
        write_shard(tmp_path / f"s-{s}.tar", sample_set(5, s))
    data = (tmp_path / "s-4.tar").read_bytes()
    (tmp_path / "s-4.tar").write_bytes(data[:len(data) // 2])
    with pytest.raises(CorruptStoreError, match=r"s-4\.tar: cut short"):
        from_webdataset(tmp_path / "ds", str(tmp_path / "s-{0..5}.tar"), workers=3)
    assert not (tmp_path / "ds").exists()
    results = []
    (tmp_path / "s-4.tar").write_bytes(data)
    for workers in (1, 3, 8):
        from_webdataset(tmp_path / f"ds{workers}", str(tmp_path / "s-{0..5}.tar"),
                        workers=workers)
        results.append(dataset_contents(tmp_path / f"ds{workers}"))
    assert results[0] == results[1] == results[2]


# -- WebDataset: hostile shards ------------------------------------------------------------------


def refused(tmp_path: pathlib.Path, shard: bytes, error: type, match: str,
            name: str = "bad.tar") -> None:
    """Converting ``shard`` raises ``error`` and writes nothing anywhere."""
    folder = tmp_path / "in"
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(shard)
    (tmp_path / "out").mkdir(exist_ok=True)
    before = digest(tmp_path)
    with pytest.raises(error, match=match):
        from_webdataset(tmp_path / "out" / "ds", folder / name)
    assert digest(tmp_path) == before


GOOD = tc.member("a.jpg", b"jpeg bytes") + tc.member("a.cls", b"3")


@pytest.mark.parametrize("name", ["../escape.jpg", "a/../../x.jpg", "/etc/abs.jpg",
                                  "x/..", "/abs/../.."])
def test_path_tricks_in_a_shard_are_refused(tmp_path, name):
    refused(tmp_path, GOOD + tc.member(name, b"x") + tc.end(), CorruptStoreError,
            "absolute name or a '..' component")


def test_a_pax_path_trick_is_refused(tmp_path):
    shard = tc.pax([("path", "../../etc/x.jpg")]) + tc.member("ok.jpg", b"x") + tc.end()
    refused(tmp_path, shard, CorruptStoreError, r"'\.\./\.\./etc/x\.jpg'")


@pytest.mark.parametrize("typeflag,what", [(b"1", "a hard link"), (b"2", "a symbolic link"),
                                           (b"3", "a character device"),
                                           (b"4", "a block device"), (b"6", "a FIFO")])
def test_links_and_devices_in_a_shard_are_refused(tmp_path, typeflag, what):
    refused(tmp_path, GOOD + tc.header("b.jpg", 0, typeflag) + tc.end(), CorruptStoreError,
            f"'b.jpg' is {what}")


def test_a_member_over_the_limit_is_refused_before_it_is_read(tmp_path):
    """The header claims 2 MiB and the bytes are not even there: refused by its size."""
    shard = GOOD + tc.header("big.jpg", 2 << 20) + bytes(512)
    refused(tmp_path, shard, LimitExceededError, r"'big\.jpg' is 2097152 bytes, over")


def test_a_shard_that_lies_about_sizes_or_is_cut_is_refused(tmp_path):
    body = b"x" * 1000
    longer = tc.header("a.jpg", 5000) + tc.pad(body) + tc.end()  # claims more than it has
    refused(tmp_path, longer, CorruptStoreError, "cut short", "longer.tar")
    shorter = tc.header("a.jpg", 10) + tc.pad(body) + tc.end()  # its data reads as a header
    refused(tmp_path, shorter, CorruptStoreError, "checksum does not match", "shorter.tar")
    whole = GOOD + tc.member("b.jpg", body) + tc.end()
    for cut in (len(GOOD) + 700, len(GOOD), len(whole) - 1024, 100):
        refused(tmp_path, whole[:cut], CorruptStoreError, "cut short|not a tar", f"c{cut}.tar")
    refused(tmp_path, b"", CorruptStoreError, "empty", "empty.tar")
    damaged = bytearray(whole)
    damaged[len(GOOD) + 10] ^= 1  # a name byte of a header
    refused(tmp_path, bytes(damaged), CorruptStoreError, "checksum", "damaged.tar")


def test_damaged_compression_is_refused(tmp_path):
    whole = GOOD + tc.member("b.jpg", os.urandom(3000)) + tc.end()
    packed = gzip.compress(whole)
    refused(tmp_path, packed[:-20], CorruptStoreError, "cut short", "cut.tar.gz")
    bad_crc = bytearray(packed)
    bad_crc[-6] ^= 0xFF  # the CRC-32 in the gzip trailer
    refused(tmp_path, bytes(bad_crc), CorruptStoreError, "damaged", "crc.tar.gz")
    refused(tmp_path, packed + b"junk", CorruptStoreError, "after the end", "junk.tar.gz")
    refused(tmp_path, b"\x28\xb5\x2f\xfd" + bytes(100), DatasetError, "zstd-compressed",
            "z.tar.zst.tar")


def test_names_that_are_not_utf8_are_refused(tmp_path):
    h = bytearray(tc.header("x.jpg", 1))
    h[0:5] = b"\xff\xfe.jp"
    tc.set_checksum(h)
    refused(tmp_path, bytes(h) + tc.pad(b"1") + tc.end(), CorruptStoreError, "not UTF-8")


def test_old_tars_with_signed_header_checksums_are_read(tmp_path):
    """Some old tars sum header bytes as signed chars: a name with bytes over 127."""
    h = bytearray(tc.header("é.jpg", 3))
    signed = sum(b if b < 128 else b - 256 for b in h[:148]) + 8 * 32 + sum(
        b if b < 128 else b - 256 for b in h[156:])
    h[148:156] = f"{signed:06o}".encode() + b"\x00 "
    (tmp_path / "old.tar").write_bytes(bytes(h) + tc.pad(b"abc") + tc.end())
    from_webdataset(tmp_path / "ds", tmp_path / "old.tar")
    ds = open_dataset(tmp_path / "ds")
    try:
        assert ds["__key__"][0].tobytes().decode() == "é" and ds["jpg"][0].tobytes() == b"abc"
    finally:
        close_all(ds)


def test_a_fifo_named_as_a_shard_does_not_hang(tmp_path):
    os.mkfifo(tmp_path / "pipe.tar")
    with pytest.raises(CorruptStoreError, match="not a regular file"):
        from_webdataset(tmp_path / "ds", tmp_path / "pipe.tar")


# -- the CLI -------------------------------------------------------------------------------------


def test_cli_converts_image_folders_and_shards(tmp_path, capsys):
    root = tmp_path / "photos"
    make_folder(root)
    (root / "cat" / "notes.txt").write_text("x")
    assert main(["convert", str(root), str(tmp_path / "ds1")]) == 0
    out, err = capsys.readouterr()
    assert "images in 4 classes, 1 without images" in out
    assert "1 not_image (e.g. cat/notes.txt)" in err and "--strict" in err
    assert main(["convert", str(root), str(tmp_path / "ds1b"), "--strict"]) == 2
    assert "strict=True" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "ds1"), str(tmp_path / "ds1c")]) == 2
    assert "already a loaderx dataset" in capsys.readouterr().err

    for s in range(2):
        write_shard(tmp_path / f"s-{s:02d}.tar", sample_set(4, s))
    assert main(["convert", str(tmp_path / "s-{00..01}.tar"), str(tmp_path / "ds2"),
                 "--label", "cls", "--workers", "2"]) == 0
    out, _ = capsys.readouterr()
    assert "8 samples from 2 shard(s)" in out and "label" in out
    assert main(["convert", str(tmp_path / "s-*.tar"), str(tmp_path / "ds3"),
                 "--extensions", "jpg,cls"]) == 0
    assert "columns __key__, jpg, cls, __shard__" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "s-*.tar"), str(tmp_path / "ds3")]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "s-*.tar"), str(tmp_path / "ds3"), "--append"]) == 2
    bad = tmp_path / "bad.tar"
    bad.write_bytes(GOOD + tc.member("../x.jpg", b"1") + tc.end())
    assert main(["convert", str(bad), str(tmp_path / "ds4")]) == 3
    assert "CorruptStoreError" in capsys.readouterr().err


def test_the_package_names_its_converters():
    import loaderx

    assert loaderx.from_image_folder is files_mod.from_image_folder
    assert loaderx.from_webdataset is files_mod.from_webdataset
    assert {"from_image_folder", "from_webdataset"} <= set(loaderx.__all__)
