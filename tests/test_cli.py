"""The ``loaderx`` command, run as a subprocess the way a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from loaderx.converter import from_iterator
from loaderx.dataset import DenseDataset
from loaderx.zrecord import Zrecord

DATA = (np.arange(300 * 12, dtype=np.float32) % 17).reshape(300, 4, 3)


def run(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loaderx", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def assert_clean_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in proc.stderr, proc.stderr


@pytest.fixture
def npy(tmp_path):
    path = tmp_path / "data.npy"
    np.save(path, DATA)
    return path


def test_convert_info_verify_compact(tmp_path, npy):
    out = tmp_path / "ds"
    p = run("convert", str(npy), str(out), "--codec", "zstd", "--checksums", "--progress", "off")
    assert p.returncode == 0, p.stderr
    assert "300 records" in p.stdout
    with DenseDataset(out) as ds:
        np.testing.assert_array_equal(ds[:], DATA)

    info = run("info", str(out), "--json")
    assert info.returncode == 0, info.stderr
    got = json.loads(info.stdout)
    assert got["kind"] == "dense" and got["dtype"] == "<f4" and got["item_shape"] == [4, 3]
    assert got["codec"] == "zstd" and got["records"] == 300 and got["checksums"] is True
    assert got["reclaimable"] == 0 and got["dict_bytes"] == 0
    text = run("info", str(out)).stdout
    assert "records      300" in text and "checksums    yes" in text

    v = run("verify", str(out))
    assert v.returncode == 0, v.stderr
    assert "300 records decoded, 300 checked" in v.stdout

    with Zrecord(out) as z:
        z.delete(np.arange(0, 300, 2, dtype=np.uint64))
    assert json.loads(run("info", str(out), "--json").stdout)["reclaimable"] > 0
    c = run("compact", str(out))
    assert c.returncode == 0 and "moved" in c.stdout, c.stderr
    assert json.loads(run("info", str(out), "--json").stdout)["reclaimable"] == 0
    assert run("verify", str(out)).returncode == 0


def test_convert_shows_progress_when_asked(tmp_path, npy):
    p = run("convert", str(npy), str(tmp_path / "ds"), "--progress", "on")
    assert p.returncode == 0, p.stderr
    assert "300/300" in p.stderr and "rec" in p.stderr, p.stderr  # tqdm's bar or our own
    quiet = run("convert", str(npy), str(tmp_path / "ds2"), "--progress", "off")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_verify_reports_each_damaged_record_and_fails(tmp_path, npy):
    out = tmp_path / "ds"
    assert run("convert", str(npy), str(out), "--codec", "raw", "--checksums").returncode == 0
    record = DATA[0].nbytes
    with open(out / "0.zr", "r+b") as f:
        for i in (4, 250):
            f.seek(i * record + 5)
            b = f.read(1)
            f.seek(i * record + 5)
            f.write(bytes([b[0] ^ 1]))
    v = run("verify", str(out))
    assert v.returncode == 1
    assert "record 4:" in v.stdout and "record 250:" in v.stdout
    assert "2 damaged" in v.stderr and "Traceback" not in v.stderr


def test_verify_checks_records_against_the_schema(tmp_path):
    from_iterator(tmp_path / "r", [np.ones((2, 3), np.int16), np.ones((1, 3), np.int16)])
    with Zrecord(tmp_path / "r") as z:
        z.append(b"\x01\x02\x03", [0])  # 3 bytes: not whole 6-byte rows
    v = run("verify", str(tmp_path / "r"))
    assert v.returncode == 1 and "record 2:" in v.stdout and "rows" in v.stdout


def test_raw_store_info(tmp_path):
    with Zrecord(tmp_path / "raw") as z:
        z.append(b"abcdef", [0, 3])
    info = json.loads(run("info", str(tmp_path / "raw"), "--json").stdout)
    assert info["kind"] == "raw" and info["records"] == 2 and info["checksums"] is False


def test_bad_paths_and_inputs_are_one_line_errors(tmp_path, npy):
    assert_clean_error(run("info", str(tmp_path / "nope")), 2, "no such file or directory")
    (tmp_path / "empty").mkdir()
    assert_clean_error(run("verify", str(tmp_path / "empty")), 2, "not a loaderx store")
    assert_clean_error(run("compact", str(npy)), 2, "not a loaderx store")
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    assert_clean_error(run("convert", str(tmp_path / "junk.npy"), str(tmp_path / "o")), 2,
                       "not a readable .npy")
    assert_clean_error(run("convert", str(tmp_path / "missing.npy"), str(tmp_path / "o")), 2,
                       "no such file")
    assert not (tmp_path / "o").exists()
    # A dataset of another shape at OUT: the converter's own error, as one line.
    assert run("convert", str(npy), str(tmp_path / "d")).returncode == 0
    np.save(tmp_path / "other.npy", np.zeros((3, 2), np.int8))
    assert_clean_error(run("convert", str(tmp_path / "other.npy"), str(tmp_path / "d"),
                           "--append"), 2, "DatasetError", "cannot append")
    # A damaged meta.zr.
    with open(tmp_path / "d" / "meta.zr", "r+b") as f:
        f.write(b"XXXX")
    assert_clean_error(run("info", str(tmp_path / "d")), 3, "CorruptStoreError", "magic")
    # Usage errors are argparse's (exit 2).
    assert run("frobnicate").returncode == 2
    assert run().returncode == 2


def test_console_script(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "loaderx")
    p = subprocess.run([exe, "info", str(tmp_path / "nope")], capture_output=True, text=True)
    assert_clean_error(p, 2, "no such file or directory")


def test_bench_runs_the_harness_of_the_checkout(monkeypatch, capsys):
    from loaderx import cli

    harness = os.path.join(os.path.dirname(cli.__file__), "..", "..", "scripts", "bench.py")
    if not os.path.isfile(harness):  # an installed wheel: no harness, a one-line error
        assert cli.main(["bench"]) == 2
        assert "source tree" in capsys.readouterr().err
        return
    calls = []
    monkeypatch.setattr(cli.subprocess, "run",
                        lambda cmd: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    assert cli.main(["bench", "store", "--repeats", "3"]) == 0
    assert cli.main(["bench", "workers", "--tables", "startup", "--repeats", "5"]) == 0
    store, workers = calls
    assert store[0] == sys.executable and store[1].endswith(os.path.join("scripts", "bench.py"))
    assert os.path.isfile(store[1]) and store[2:] == ["store", "--repeats", "3"]
    assert workers[2:] == ["workers", "--tables", "startup", "--repeats", "5"]


def test_compact_needs_the_writer_lock(tmp_path, npy):
    out = tmp_path / "ds"
    assert run("convert", str(npy), str(out)).returncode == 0
    with Zrecord(out) as z:
        z.delete([0])  # this process now holds the store's writer lock
        assert_clean_error(run("compact", str(out)), 4, "StoreBusyError", "writer lock")
    assert run("compact", str(out)).returncode == 0


def test_a_dangling_schema_link_is_a_hostile_store_not_a_raw_one(tmp_path, npy):
    out = tmp_path / "ds"
    assert run("convert", str(npy), str(out)).returncode == 0
    os.remove(out / "schema.msgpack")
    os.symlink(tmp_path / "nowhere", out / "schema.msgpack")
    proc = run("info", str(out))
    assert_clean_error(proc, 3, "CorruptStoreError", "symbolic link")
    assert not (tmp_path / "nowhere").exists()


def test_version():
    import loaderx

    proc = run("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"loaderx {loaderx.__version__}"


def test_convert_into_an_existing_dataset_needs_append_or_overwrite(tmp_path, npy):
    out = tmp_path / "ds"
    assert run("convert", str(npy), str(out)).returncode == 0
    assert_clean_error(run("convert", str(npy), str(out)), 2, "--append", "--overwrite")
    assert len(DenseDataset(out)) == len(DATA), "a refused conversion writes nothing"
    appended = run("convert", str(npy), str(out), "--append")
    assert appended.returncode == 0
    assert "AppendWarning" not in appended.stderr, "--append asked for it: no warning"
    assert len(DenseDataset(out)) == 2 * len(DATA)
    assert run("convert", str(npy), str(out), "--overwrite").returncode == 0
    assert len(DenseDataset(out)) == len(DATA)
    assert run("convert", str(npy), str(out), "--append", "--overwrite").returncode == 2


def test_verify_says_what_it_could_not_check_and_summarizes_many_failures(tmp_path, npy):
    out = tmp_path / "raw"
    assert run("convert", str(npy), str(out), "--codec", "raw").returncode == 0
    with open(out / "0.zr", "r+b") as f:  # flip a byte of a raw record: nothing can see it
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    proc = run("verify", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "no checksums kept" in proc.stdout and "cannot be seen" in proc.stdout
    # Many damaged records: listed up to the limit, then summarized.
    z = Zrecord(str(tmp_path / "many"), codec="raw")
    z.enable_checksums()
    z.append(np.zeros(500 * 8, np.uint8), np.arange(500, dtype=np.uint64) * 8)
    z.close()
    with open(tmp_path / "many" / "0.zr", "r+b") as f:
        f.write(b"\xff" * 4000)
    proc = run("verify", str(tmp_path / "many"), "--max-listed", "5")
    assert proc.returncode == 1
    assert proc.stdout.count("\n") == 6 and "and 495 more damaged records" in proc.stdout


def test_copy_keeps_holes_and_verifies(tmp_path, npy):
    src, dst = tmp_path / "ds", tmp_path / "copy"
    assert run("convert", str(npy), str(src), "--checksums").returncode == 0
    proc = run("copy", str(src), str(dst))
    assert proc.returncode == 0, proc.stderr
    assert "holes kept" in proc.stdout
    np.testing.assert_array_equal(DenseDataset(dst)[:], DATA)
    meta = os.stat(dst / "meta.zr")
    assert meta.st_size == os.stat(src / "meta.zr").st_size == 16 + 16 * 2**24
    assert meta.st_blocks * 512 < 1 << 20, "meta.zr stayed sparse"
    assert_clean_error(run("copy", str(src), str(dst)), 2, "exists")
    # A store another process writes is refused.
    writer = Zrecord(str(src))
    writer.lock_for_writing()
    assert_clean_error(run("copy", str(src), str(tmp_path / "c2")), 4, "StoreBusyError")
    writer.close()
    assert not (tmp_path / "c2").exists()


def test_info_names_the_dtype_and_summarizes_ragged_rows(tmp_path):
    rng = np.random.default_rng(4)
    records = [rng.normal(size=(int(n), 3)).astype(np.float16)
               for n in rng.integers(0, 40, size=301)]
    from_iterator(tmp_path / "r", records)
    rows = np.array([len(r) for r in records])
    info = json.loads(run("info", str(tmp_path / "r"), "--json").stdout)
    assert info["dtype_name"] == "float16" and info["dtype"] == "<f2"
    assert info["rows"] == {"min": int(rows.min()), "median": float(np.median(rows)),
                            "max": int(rows.max()), "mean": float(rows.mean())}
    text = run("info", str(tmp_path / "r")).stdout
    assert "dtype float16 (<f2)" in text
    assert f"rows/record  min {rows.min()}  median {np.median(rows)}  max {rows.max()}" in text


def test_each_error_class_has_its_own_exit_status(monkeypatch, capsys):
    from loaderx import cli, errors

    expected = {
        errors.CorruptStoreError("x"): cli.EXIT_CORRUPT,
        errors.MissingDictionaryError("x"): cli.EXIT_CORRUPT,
        errors.StoreBusyError("x"): cli.EXIT_BUSY,
        errors.StoreChangedError("x"): cli.EXIT_BUSY,
        errors.InternalError("x"): cli.EXIT_INTERNAL,
        errors.DatasetError("x"): cli.EXIT_USAGE,
        errors.LimitExceededError("x"): cli.EXIT_USAGE,
        errors.LoaderxTypeError("x"): cli.EXIT_USAGE,
        FileNotFoundError(2, "No such file or directory", "/x"): cli.EXIT_USAGE,
        PermissionError(13, "Permission denied", "/x"): cli.EXIT_SYSTEM,
        OSError(28, "No space left on device"): cli.EXIT_SYSTEM,
        OverflowError("x"): cli.EXIT_INTERNAL,
        EOFError("x"): cli.EXIT_INTERNAL,
    }
    assert len({cli.EXIT_OK, cli.EXIT_DAMAGED, cli.EXIT_USAGE, cli.EXIT_CORRUPT, cli.EXIT_BUSY,
                cli.EXIT_SYSTEM, cli.EXIT_INTERNAL}) == 7
    for error, status in expected.items():
        assert cli.exit_status(error) == status, error
        # And main() turns it into one line on stderr, never a traceback.
        monkeypatch.setattr(cli, "cmd_info", lambda args, e=error: (_ for _ in ()).throw(e))
        assert cli.main(["info", "anything"]) == status
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("loaderx info: "), err
        assert type(error).__name__ in err
        if status == cli.EXIT_INTERNAL:
            assert "a bug in loaderx" in err


def _peak_rss_of_verify(path) -> int:
    code = ("import resource, sys\nfrom loaderx.cli import main\nr = main(sys.argv[1:])\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, r)")
    proc = subprocess.run([sys.executable, "-c", code, "verify", str(path), "--max-listed",
                           "5"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-2]) * 1024


def test_verify_memory_does_not_grow_with_the_damage(tmp_path):
    """The finding: every failure message was kept (2.5 GB from a 10 KB archive). A million
    damaged records now cost what none do."""
    n = 1 << 20
    for name in ("intact", "damaged"):
        z = Zrecord(str(tmp_path / name), codec="raw")
        z.enable_checksums()
        z.append(np.zeros(n * 8, np.uint8), np.arange(n, dtype=np.uint64) * 8)
        z.close()
    with open(tmp_path / "damaged" / "0.zr", "r+b") as f:
        f.write(b"\xff" * (n * 8))
    intact, damaged = (_peak_rss_of_verify(tmp_path / n) for n in ("intact", "damaged"))
    assert damaged < intact + (32 << 20), (intact, damaged)


def test_verify_lists_schema_misfits_up_to_the_limit(tmp_path):
    from_iterator(tmp_path / "r", [np.ones((2, 3), np.int16)] * 3)
    with Zrecord(tmp_path / "r") as z:
        z.append(np.ones(300 * 3, np.uint8), np.arange(300, dtype=np.uint64) * 3)
    v = run("verify", str(tmp_path / "r"), "--max-listed", "4")
    assert v.returncode == 1
    assert v.stdout.count("record ") == 4 and "and 296 more damaged records" in v.stdout
    assert "300 damaged" in v.stderr
