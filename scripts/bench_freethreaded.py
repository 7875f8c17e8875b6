#!/usr/bin/env python3
"""The GIL build and the free-threaded build side by side (issue 32), same run, same data:
``python scripts/bench.py freethreaded [--repeats N] [--quick]`` (run it with the project's
interpreter, ``.venv/bin/python``; the free-threaded one is ``.venv-ft/bin/python``, made by
``scripts/freethreaded.sh``).

Every figure is measured in a fresh process of its interpreter; each repeat runs every row once
on each interpreter in turn (interleaved, so a change of load hits all of them alike), and the
table shows medians. Data: 8000 records of 12 KiB (``bench_store.make_data``: a zstd and a raw
store) plus int64 labels, batch 256. Rows:

* sampler -- ``Sampler.next()`` of a cyclic 1M-index sampler, batch 256 (one native call per
  batch: what a Python call costs on each interpreter);
* gather raw / zstd -- ``DenseDataset.gather`` of the loader's batches into fresh arrays, on the
  caller's thread (native, the GIL released);
* loader identity raw / zstd -- ``DataLoader`` over data + label, 2 worker threads, no
  transform;
* per-sample transform -- ``augment`` (a Python loop over the batch's samples doing small NumPy
  work each: it holds the GIL on the GIL build), the same code defined in this script
  (``script``) and imported from a module (``_bench_ft_transform``, ``module``): the loader with
  1 and 2 worker threads and with 2 worker processes; the bare-threads ceiling (the same calls on
  1 and 2 plain Python threads, each on its own batches, gathered beforehand: no loader); torch's
  ``DataLoader`` (2 worker processes, a map-style dataset whose ``__getitems__`` gathers the batch
  and applies the transform, as ``bench_loader.torch_run`` does) where torch imports; SPDL's
  thread pipeline (``spdl.pipeline.PipelineBuilder``: a source of the batches' indices, a
  2-thread stage that gathers and transforms, ``spdl-core`` from PyPI) where spdl imports.
  ``--install-contenders`` pip-installs ``spdl-core`` for each interpreter into
  ``$LOADERX_FT_CACHE/bench-site-<gil|3.13t>`` (default ``~/.cache/loaderx-ft``), outside both
  environments; the children find it there.

After the table, the figures the issue's targets name: 2 threads / 1 thread per definition,
against the bare threads' scaling; 2 threads / 2 processes; loaderx / SPDL; and the 3.13t / GIL
ratios of the sampler, gather and identity rows.

Where a transform is defined matters on 3.13t only through the objects it touches: 3.13t makes
the functions, code objects, module dicts and constants of a program immortal once a second
thread starts (``sys.getrefcount`` then reads 2**32 - 1), so neither the function object nor
its globals are contended either way; what is contended is every *mortal* object two threads
take references to at once (a bound method such as NumPy's ``umr_sum`` in
``numpy/_core/_methods.py``, which ``ndarray.sum`` calls per sample, a module-level array or
float, a closure, a callable instance). See docs/guide/workers.md, "Free-threaded Python", for
what was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

SCRIPTS = pathlib.Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
sys.path.insert(0, str(SCRIPTS))
import _bench_common as common  # noqa: E402

N, SIZE, BATCH = 8000, 12 * 1024, 256


def augment(batch: dict[str, Any]) -> dict[str, Any]:
    """A Python-bound per-sample loop: the kind of transform the GIL serializes (the same code
    as ``_bench_ft_transform.augment``)."""
    out = []
    for img in batch["data"]:
        v = img[::16]
        out.append(float(v.sum()) / (1 + len(v)))
    return {"data": batch["data"], "label": batch["label"], "score": out}


def pure(batch: dict[str, Any]) -> dict[str, Any]:
    """A pure-Python per-sample transform (the same code as ``_bench_ft_transform.pure``)."""
    total = 0
    for img in batch["data"]:
        for x in img[::64].tolist():
            total = (total * 31 + x) % 1_000_003
    return {"data": batch["data"], "label": batch["label"], "score": total}


def transform_of(where: str) -> Any:
    import _bench_ft_transform as module

    if where == "script":
        return augment
    if where == "script-pure":
        return pure
    return module.pure if where == "module-pure" else module.augment


# -- the child: one figure ------------------------------------------------------------------------


def streams(root: pathlib.Path, kind: str) -> dict[str, Any]:
    from loaderx.dataset import DenseDataset

    return {"data": DenseDataset(root / f"data-{kind}"), "label": DenseDataset(root / "label")}


def steps(count: int) -> list[np.ndarray]:
    from loaderx.sampler import Sampler

    sampler = Sampler(N, BATCH, "cyclic", 42)
    return [sampler.batch(s) for s in range(count)]


class Clock:
    """Wall and CPU time (this process, all its threads) of the timed part."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu

    def figure(self, items: float, unit: str, scale: float = 1.0) -> dict[str, Any]:
        """``items / wall`` (times ``scale``), and the CPU milliseconds each item took."""
        return {"value": items / self.wall * scale, "unit": unit,
                "cpu_ms": self.cpu / items * 1e3}


def timed_next(it: Any, batches: int, warm: int) -> dict[str, Any]:
    for _ in range(warm):
        next(it)
    with Clock() as clock:
        for _ in range(batches):
            next(it)
    return clock.figure(batches, "batches/s")


def child(row: str, root: pathlib.Path, scale: float) -> dict[str, Any]:
    """Measures ``row``: {"value": figure, "unit": ...}."""
    n = max(4, int(100 * scale))  # batches per timed run
    if row == "sampler":
        from loaderx.sampler import Sampler

        sampler = Sampler(1_000_000, BATCH, "cyclic", 0)
        for _ in range(1000):
            sampler.next()
        calls = int(200_000 * scale)
        with Clock() as clock:
            for _ in range(calls):
                sampler.next()
        return clock.figure(calls, "M idx/s", BATCH * 1e-6)  # CPU: per batch of indices
    if row.startswith("gather"):
        s = streams(root, row.split()[1])
        idx = steps(n + 10)
        data = s["data"]
        for i in idx[:10]:
            data.gather(i)
        with Clock() as clock:
            for i in idx[10:]:
                data.gather(i)
        return {**clock.figure(n, "GB/s", BATCH * SIZE / 1e9)}
    if row.startswith("identity"):
        from loaderx.dataloader import DataLoader

        with DataLoader(streams(root, row.split()[1]), batch_size=BATCH, num_workers=2) as dl:
            return timed_next(dl, 4 * n, 20)
    kind, where = row.split()[:2]
    fn = transform_of(where)
    if kind in ("threads", "processes"):
        from loaderx.dataloader import DataLoader

        workers = int(row.split()[2])
        mode = "thread" if kind == "threads" else "process"
        with DataLoader(streams(root, "raw"), batch_size=BATCH, num_workers=workers,
                        transform=fn, worker_mode=mode) as dl:
            figure = timed_next(dl, n, 8)
        if mode == "process":
            figure["cpu_ms"] = None  # the workers' CPU is not this process's
        return figure
    if kind == "bare":
        return bare_threads(root, fn, int(row.split()[2]), n)
    if kind == "torch":
        return {**torch_rate(root, fn, n), "cpu_ms": None}
    if kind == "spdl":
        return spdl_rate(root, fn, int(row.split()[2]), n)
    raise SystemExit(f"unknown row {row!r}")


def bare_threads(root: pathlib.Path, fn: Any, count: int, n: int) -> dict[str, Any]:
    """``count`` plain threads, each calling ``fn`` on batches of its own (gathered before the
    timing), together ``n`` calls."""
    s = streams(root, "raw")
    idx = steps(count)
    batches = [{"data": s["data"].gather(i), "label": s["label"].gather(i)} for i in idx]
    for b in batches:
        fn(b)
    start = threading.Barrier(count + 1)

    def work(batch: dict[str, Any]) -> None:
        start.wait()
        for _ in range(n // count):
            fn(batch)

    threads = [threading.Thread(target=work, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    start.wait()
    with Clock() as clock:
        for t in threads:
            t.join()
    return clock.figure((n // count) * count, "batches/s")


class _Items:
    """torch's map-style dataset: a batch fetched with one gather (``__getitems__``) and
    transformed in the worker."""

    def __init__(self, root: str, fn: Any) -> None:
        self.root, self.fn, self.s = root, fn, None

    def __len__(self) -> int:
        return N

    def __getitems__(self, idxs: list[int]) -> list[Any]:
        if self.s is None:
            self.s = streams(pathlib.Path(self.root), "raw")
        idx = np.sort(np.asarray(idxs, dtype=np.uint64))
        return [self.fn({"data": self.s["data"].gather(idx),
                         "label": self.s["label"].gather(idx)})]


def _first(items: list[Any]) -> Any:
    return items[0]


def torch_rate(root: pathlib.Path, fn: Any, n: int) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    loader = DataLoader(_Items(str(root), fn), batch_size=BATCH, shuffle=True, num_workers=2,
                        persistent_workers=True, collate_fn=_first)

    return timed_next(common.endless(loader), n, 8)


def spdl_rate(root: pathlib.Path, fn: Any, threads: int, n: int) -> dict[str, Any]:
    from spdl.pipeline import PipelineBuilder

    s = streams(root, "raw")

    def build(idx: np.ndarray) -> Any:
        return fn({"data": s["data"].gather(idx), "label": s["label"].gather(idx)})

    def source() -> Any:
        step = 0
        from loaderx.sampler import Sampler

        sampler = Sampler(N, BATCH, "cyclic", 42)
        while True:
            yield sampler.batch(step)
            step += 1

    pipeline = (PipelineBuilder().add_source(source())
                .pipe(build, concurrency=threads, output_order="input")
                .add_sink(4).build(num_threads=threads))
    with pipeline.auto_stop():
        return timed_next(iter(pipeline.get_iterator(timeout=600)), n, 8)


# -- the driver ------------------------------------------------------------------------------------


def make_stores(root: pathlib.Path) -> None:
    from bench_store import make_data
    from loaderx.converter import from_numpy

    data = make_data(N, SIZE)
    from_numpy(root / "data-zstd", data, codec="zstd")
    from_numpy(root / "data-raw", data, codec="raw")
    from_numpy(root / "label", np.arange(N, dtype=np.int64) % 1000, codec="raw")


ROWS = ["sampler", "gather raw", "gather zstd", "identity raw", "identity zstd"]
for _where in ("script", "module"):
    ROWS += [f"threads {_where} 1", f"threads {_where} 2", f"processes {_where} 2",
             f"bare {_where} 1", f"bare {_where} 2"]
ROWS += ["torch module 2", "spdl module 1", "spdl module 2"]
# A pure-Python transform (issue "free-threaded Python: imported transforms"): defined here and
# imported; on 3.13t each worker thread runs the imported one from its own copy of the module.
for _where in ("script-pure", "module-pure"):
    ROWS += [f"threads {_where} 1", f"threads {_where} 2", f"processes {_where} 2"]


def probe(py: str, name: str) -> dict[str, Any]:
    code = ("import json, sys, sysconfig, importlib.util as u; print(json.dumps({"
            "'version': sys.version.split()[0], "
            "'ft': bool(sysconfig.get_config_var('Py_GIL_DISABLED')), "
            "'torch': u.find_spec('torch') is not None, "
            "'spdl': u.find_spec('spdl') is not None}))")
    env = {**os.environ, "PYTHONPATH": str(contenders_site(name))}
    return json.loads(subprocess.run([py, "-c", code], check=True, capture_output=True,
                                     text=True, env=env).stdout)


CACHE = pathlib.Path(os.environ.get("LOADERX_FT_CACHE", pathlib.Path.home() / ".cache" /
                                    "loaderx-ft"))


def contenders_site(name: str) -> pathlib.Path:
    """Where ``--install-contenders`` puts spdl-core for interpreter ``name``."""
    return CACHE / f"bench-site-{'gil' if name == 'GIL' else name}"


def run_child(py: str, name: str, row: str, root: pathlib.Path,
              scale: float) -> dict[str, Any] | None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(SCRIPTS), str(contenders_site(name)),
                                                    env.get("PYTHONPATH", "")] if p)
    r = subprocess.run([py, __file__, "--child", row, str(root), "--scale", str(scale)],
                       capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        print(f"  {row} on {py}: failed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    figure: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return figure


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one short repeat: a smoke check")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="timed batches per figure, as a multiple of the default")
    parser.add_argument("--gil", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--ft", default=str(ROOT / ".venv-ft" / "bin" / "python"))
    parser.add_argument("--also", action="append", default=[], metavar="NAME=PYTHON",
                        help="another GIL interpreter as a column of its own (loaderx and NumPy "
                             "importable there), e.g. a 3.13 GIL build beside 3.13t")
    parser.add_argument("--rows", default="", help="comma-separated substrings of row names")
    parser.add_argument("--install-contenders", action="store_true",
                        help="pip-install spdl-core for each interpreter (see the docstring)")
    parser.add_argument("--child", nargs=2, metavar=("ROW", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], pathlib.Path(args.child[1]), args.scale)))
        return
    repeats, scale = (1, 0.1) if args.quick else (args.repeats, args.scale)
    pythons = {"GIL": args.gil}
    for extra in args.also:
        name, _, py = extra.partition("=")
        pythons[name] = py
    pythons["3.13t"] = args.ft
    if args.install_contenders:
        for name, py in pythons.items():
            subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            "--target", str(contenders_site(name)), "spdl-core"], check=True)
    info = {name: probe(py, name) for name, py in pythons.items()}
    if not info["3.13t"]["ft"] or any(i["ft"] for n, i in info.items() if n != "3.13t"):
        raise SystemExit(f"--gil/--also must be GIL builds and --ft a free-threaded one: {info}")
    rows = [r for r in ROWS if not args.rows or any(p in r for p in args.rows.split(","))]
    figures: Figures = {}
    cpu: Figures = {}
    with common.scratch("loaderx-bench-ft-") as tmp:
        make_stores(tmp)
        for rep in range(repeats):
            for row in rows:
                for name, py in pythons.items():
                    needs = row.split()[0]
                    if needs in ("torch", "spdl") and not info[name][needs]:
                        continue
                    got = run_child(py, name, row, tmp, scale)
                    if got is not None:
                        figures.setdefault((row, name), {})[rep] = got["value"]
                        if got.get("cpu_ms") is not None:
                            cpu.setdefault((row, name), {})[rep] = got["cpu_ms"]
            print(f"repeat {rep + 1}/{repeats} done", file=sys.stderr)
    report(rows, figures, cpu, info, repeats)


#: (row, interpreter) -> {repeat: figure}
Figures = dict[tuple[str, str], dict[int, float]]


def report(rows: list[str], figures: Figures, cpu: Figures, info: dict[str, dict[str, Any]],
           repeats: int) -> None:
    names = list(info)
    gils = [n for n in names if n != "3.13t"]

    def med(table: Figures, row: str, name: str) -> float | None:
        v = table.get((row, name))
        return statistics.median(v.values()) if v else None

    def cell(row: str, name: str) -> str:
        v = figures.get((row, name))
        if not v:
            return "n/a"
        return f"{statistics.median(v.values()):.3g} ({min(v.values()):.3g}-{max(v.values()):.3g})"

    def ms(row: str, name: str) -> str:
        v = med(cpu, row, name)
        return "n/a" if v is None else f"{v:.3g}"

    def paired(num: tuple[str, str], den: tuple[str, str], table: Figures = figures) -> str:
        """The median (range) of the per-repeat ratio of two figures measured back to back."""
        a, b = table.get(num, {}), table.get(den, {})
        ratios = [a[k] / b[k] for k in a if k in b and b[k]]
        if not ratios:
            return "n/a"
        return (f"{statistics.median(ratios):.2f}x "
                f"({min(ratios):.2f}-{max(ratios):.2f})")

    units = {"sampler": "M idx/s", "gather": "GB/s"}
    versions = ", ".join(f"{n} = {info[n]['version']}" for n in names)
    print(f"\nmedians of {repeats} interleaved runs (range in brackets; ratios: median and "
          f"range of the per-repeat ratios); {versions} (free-threaded)\n")
    print(common.head("row", "unit", *names, *(f"3.13t / {g}" for g in gils),
                      f"CPU ms per batch, {' / '.join(names)}"))
    for row in rows:
        unit = next((u for p, u in units.items() if row.startswith(p)), "batches/s")
        print(common.row(row, unit, *(cell(row, n) for n in names),
                         *(paired((row, "3.13t"), (row, g)) for g in gils),
                         " / ".join(ms(row, n) for n in names)))

    def scale(num: str, den: str, name: str = "3.13t") -> str:
        return paired((num, name), (den, name))

    print("\nscaling on 3.13t (targets: 2 threads >= 1.8x 1 thread, or >= 0.95x of the bare "
          "threads' scaling; 2 threads >= 1.0x 2 processes; loaderx ahead of SPDL):")
    for where in ("script", "module"):
        print(f"  {where}: loader 2/1 threads {scale(f'threads {where} 2', f'threads {where} 1')}"
              f"; bare threads 2/1 {scale(f'bare {where} 2', f'bare {where} 1')}"
              f"; 2 threads / 2 processes "
              f"{scale(f'threads {where} 2', f'processes {where} 2')}"
              f"; GIL build 2/1 threads "
              f"{scale(f'threads {where} 2', f'threads {where} 1', 'GIL')}")
    for where in ("script-pure", "module-pure"):
        print(f"  {where}: loader 2/1 threads "
              f"{scale(f'threads {where} 2', f'threads {where} 1')}; 2 threads / 2 processes "
              f"{scale(f'threads {where} 2', f'processes {where} 2')}; GIL build 2/1 threads "
              f"{scale(f'threads {where} 2', f'threads {where} 1', 'GIL')}")
    print(f"  loaderx 2 threads / SPDL 2 threads (module): "
          f"{scale('threads module 2', 'spdl module 2')}; SPDL 2/1 threads "
          f"{scale('spdl module 2', 'spdl module 1')}")
    print("CPU per batch, 1 thread / 2 threads on 3.13t (1.00x: the threads do not slow each "
          "other down -- no contention -- whatever cores the machine had free; the wall-clock "
          "scaling above needs 2 idle cores, which the bare threads' 2/1 shows):")
    for where in ("script", "module"):
        loader = paired((f"threads {where} 1", "3.13t"), (f"threads {where} 2", "3.13t"), cpu)
        bare = paired((f"bare {where} 1", "3.13t"), (f"bare {where} 2", "3.13t"), cpu)
        print(f"  {where}: loader {loader}; bare threads {bare}")


if __name__ == "__main__":
    if "--child" in sys.argv:  # one figure, in a fresh process: nothing printed before it
        cli()
    else:
        common.standalone(cli)
