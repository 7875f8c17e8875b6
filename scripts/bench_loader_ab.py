"""The thread loader of another revision against this one, on the same engine build.

``python scripts/bench.py loader-ab REV [--repeats N]`` exports ``python/loaderx`` of git
revision ``REV`` into a temporary directory, gives it this checkout's native module, and times
the same loader (20,000 records of 12 KiB, zstd and raw, plus int64 labels; batch 256; 4
threads; 600 batches after 20) in fresh processes, alternating the two packages, so that a
change of the Python layer is measured apart from the engine's.

``--engine`` builds ``REV``'s engine too (``maturin build --release`` of the revision's tree,
cargo's build directory kept in ``~/.cache/loaderx-ab-target``), so that the whole package of
``REV`` is measured against this checkout's: whether the code or the machine moved.

``python scripts/bench.py loader-ab 0.9.11`` runs the same loader of loaderx 0.9.11 instead,
engine and all, in its own virtual environment (``.cache/loaderx-0.9.11-venv``, made by the
compatibility test), on the same stores: the whole loader against the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
from functools import partial

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import _bench_common as common  # noqa: E402

#: The reference's virtual environment (made by tests/test_compat_reference.py).
REFERENCE = REPO / ".cache" / "loaderx-0.9.11-venv"


def child(package: str, root: str) -> None:
    if package:  # (none: the interpreter's own loaderx, the reference's)
        sys.path.insert(0, package)
    from loaderx.dataloader import DataLoader
    from loaderx.dataset import DenseDataset

    out = {}
    for kind in ("zstd", "raw"):
        streams = {"data": DenseDataset(f"{root}/data-{kind}"),
                   "label": DenseDataset(f"{root}/label")}
        with DataLoader(streams, batch_size=256, num_workers=4) as loader:
            out[kind] = 600 / common.time_next(loader, 600, 20)
    print(json.dumps(out))


def build_package(rev: str, work: pathlib.Path) -> pathlib.Path:
    """``rev``'s whole package (engine built), unpacked under ``work``; its import path."""
    src, wheels, out = work / "src", work / "wheels", work / "package"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    env = {**os.environ, "CARGO_TARGET_DIR": str(pathlib.Path.home() / ".cache" /
                                                 "loaderx-ab-target")}
    maturin = pathlib.Path(sys.executable).parent / "maturin"
    subprocess.run([str(maturin), "build", "--release", "-q", "-o", str(wheels)], cwd=src,
                   env=env, check=True)
    wheel = next(wheels.glob("*.whl"))
    shutil.unpack_archive(str(wheel), str(out), "zip")
    return out


def main(rev: str, repeats: int, engine: bool = False) -> None:
    import numpy as np

    from bench_store import make_data
    from loaderx.converter import from_numpy

    reference = rev == "0.9.11"
    if reference and not (REFERENCE / "bin" / "python").exists():
        raise SystemExit(f"no {REFERENCE}: run tests/test_compat_reference.py once to make it")
    with common.scratch("loaderx-ab-") as work:
        if engine and not reference:
            old_package = str(build_package(rev, work))
        elif not reference:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", rev,
                                      "python/loaderx"], check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
            native = next((REPO / "python" / "loaderx").glob("_native*.so"))
            shutil.copy(native, work / "python" / "loaderx" / native.name)
        data = make_data(20000, 12 * 1024)
        for codec in ("zstd", "raw"):
            from_numpy(work / f"data-{codec}", data, codec=codec, progress=False)
        from_numpy(work / "label", np.arange(20000) % 1000, codec="raw", progress=False)
        packages = {rev: "" if reference else old_package if engine else str(work / "python"),
                    "this checkout": str(REPO / "python")}

        def one(package: str) -> dict[str, float]:
            python = str(REFERENCE / "bin" / "python") if not package else sys.executable
            r = subprocess.run([python, __file__, "--child", package, str(work)],
                               check=True, capture_output=True, text=True, cwd=work)
            return json.loads(r.stdout.strip().splitlines()[-1])

        runs = common.interleaved({name: partial(one, package)
                                   for name, package in packages.items()}, repeats)
        print(f"thread loader, 12 KiB x 256, 4 threads, medians of {repeats} (batches/s)")
        for name, rows in runs.items():
            print(f"  {name}: " + ", ".join(
                f"{k} {statistics.median(r[k] for r in rows):,.0f}" for k in ("zstd", "raw")))
        for kind in ("zstd", "raw"):
            ratios = common.paired([n[kind] for n in runs["this checkout"]],
                                   [o[kind] for o in runs[rev]])
            print(f"  this / {rev}, {kind}: {statistics.median(ratios):.2f}x "
                  f"(per run {min(ratios):.2f}..{max(ratios):.2f})")


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    options = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    options.add_argument("rev", help="the git revision whose python/loaderx to compare, or "
                         "0.9.11 for the reference's whole loader")
    options.add_argument("--repeats", type=int, default=5)
    options.add_argument("--engine", action="store_true",
                         help="build REV's engine too and compare the whole packages")
    args = options.parse_args(argv)
    main(args.rev, args.repeats, args.engine)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # one run of one package, in a fresh process
        child(sys.argv[2], sys.argv[3])
    else:
        common.standalone(cli)
