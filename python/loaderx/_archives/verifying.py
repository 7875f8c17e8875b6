"""The implementation behind :mod:`loaderx.verifying`, the public module, whose documentation
says what this does and why."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from loaderx._store import schema as _schema
from loaderx.errors import CorruptStoreError, DatasetError, MissingDictionaryError
from loaderx.intake.directory import (
    Column,
    Part,
    group_store_column,
    is_dataset_directory,
    part_directory,
    read_manifest,
)
from loaderx.zrecord import Zrecord

__all__ = ["verify", "verify_store", "verify_dataset"]

#: What a store's fault raises when it is opened or read; anything else (a busy store, the
#: system's refusal) is not the store's fault and propagates.
_STORE_FAULTS = (CorruptStoreError, MissingDictionaryError, DatasetError)


def verify(path: str | os.PathLike[str], *, max_listed: int = 100) -> dict[str, Any]:
    """:func:`verify_dataset` for a dataset directory (it has a ``manifest.json``),
    :func:`verify_store` for anything else."""
    if is_dataset_directory(path):
        return verify_dataset(path, max_listed=max_listed)
    return verify_store(path, max_listed=max_listed)


def verify_store(path: str | os.PathLike[str], *, max_listed: int = 100) -> dict[str, Any]:
    """Decodes every record of the store ``path`` and checks it (see the module docstring).
    Returns ``kind`` (``"store"``), ``path``, ``records``, ``checked`` (compared with a
    checksum), ``unchecked`` (decoded, no checksum to compare), ``damaged`` (all counted) and
    ``failures``: ``[index, message]`` of the damaged records of lowest index, at most
    ``max_listed``. A store that cannot be opened raises (CorruptStoreError)."""
    path = os.path.abspath(os.fspath(path))
    if not _schema.is_store(path):
        raise DatasetError(f"{path}: not a loaderx store (no {_schema.META_FILE})")
    schema = _store_schema(path)
    return _verify_records(path, schema, max_listed)


def _store_schema(path: str) -> _schema.Schema | None:
    """The schema of a store, or None for a raw store (no schema.msgpack)."""
    # lexists: a dangling symlink in its place is a hostile store for _schema.read to refuse,
    # not a raw store.
    if not os.path.lexists(os.path.join(path, _schema.SCHEMA_FILE)):
        return None
    return _schema.read(path)


def _verify_records(path: str, schema: _schema.Schema | None,
                    max_listed: int) -> dict[str, Any]:
    with Zrecord(path) as z:
        # Only the first failures are kept (the engine counts the rest): memory stays bounded
        # however much of the store is damaged.
        report = z.verify(max_listed=max_listed)
        failures = list(report["failures"])
        damaged = report["failed"]
        if schema is not None and len(z):
            # A record the engine listed is not counted twice; one it only counted may be.
            listed, misfits = _schema_failures(z, schema, {i for i, _ in failures}, max_listed)
            failures += listed
            damaged += misfits
    failures.sort()
    return {"kind": "store", "path": path, "records": report["records"],
            "checked": report["checked"], "unchecked": report["unchecked"],
            "damaged": damaged, "failures": [[i, m] for i, m in failures[:max_listed]]}


def _schema_failures(z: Zrecord, s: _schema.Schema, known: set[int],
                     max_listed: int) -> tuple[list[tuple[int, str]], int]:
    """Records whose length does not fit the dataset's schema, not in ``known``: the first
    ``max_listed`` of them (index, message) and how many there are. Lengths are read a
    million at a time, so memory stays bounded."""
    unit = s.item_bytes
    if s.kind == "dense":
        why = f"holds {{}} bytes, a {s.describe()} record is {unit}"
    elif unit:
        why = f"holds {{}} bytes, not a whole number of {unit}-byte rows"
    else:
        return [], 0
    listed: list[tuple[int, str]] = []
    count = 0
    step = 1 << 20
    for start in range(0, len(z), step):
        idx = np.arange(start, min(len(z), start + step), dtype=np.uint64)
        lengths = z.lengths(idx).astype(np.int64)
        bad = np.flatnonzero(lengths != unit if s.kind == "dense" else lengths % unit)
        for i in bad:
            if start + int(i) in known:
                continue
            count += 1
            if len(listed) < max_listed:
                listed.append((start + int(i), why.format(int(lengths[i]))))
    return listed, count


# -- dataset directories -------------------------------------------------------------------------


def verify_dataset(path: str | os.PathLike[str], *, max_listed: int = 100) -> dict[str, Any]:
    """Verifies every store of the dataset directory ``path`` and the directory's consistency
    (see the module docstring). Returns ``kind`` (``"dataset"``), ``path``, ``rows``,
    ``parts`` (``[{"path", "rows"}]``, empty for a directory of columns), ``columns`` (per
    column: ``name``, ``kind``, ``dtype``, ``item_shape``, ``rows`` the manifest says,
    ``records`` found, ``checked``, ``unchecked``, ``damaged``, ``problems`` and ``stores``:
    per store ``part`` (None or ``parts/NNNNN``), ``store`` (its path inside the directory),
    ``path``, ``rows`` (the manifest's), ``records`` (None when it could not be opened),
    ``checked``, ``unchecked``, ``damaged``, ``failures`` and ``problems``), the directory's
    own ``problems``, the totals ``records``, ``checked``, ``unchecked``, ``damaged`` and
    ``problem_count``, and ``ok`` (nothing damaged, no problem)."""
    path = os.path.abspath(os.fspath(path))
    manifest = read_manifest(path)
    columns = {c.name: _column_entry(c, manifest.rows) for c in manifest.columns}
    problems: list[str] = []
    budget = [max_listed]  # damaged records still to list, in the whole report
    committed = bool(manifest.generation) and not manifest.parts
    if not manifest.parts:
        for col in manifest.columns:
            if col.group is None:
                columns[col.name]["stores"].append(_check_store(
                    path, col.store, None, col, manifest.rows, budget, committed))
            else:
                columns[col.name]["group"] = group_store_column(
                    manifest.groups[col.group], col.group).name
        for k, g in enumerate(manifest.groups):
            gc = group_store_column(g, k)
            columns[gc.name] = _column_entry(gc, g.blocks(manifest.rows))
            columns[gc.name]["stores"].append(_check_store(
                path, g.store, None, gc, g.blocks(manifest.rows), budget, committed))
    for part in manifest.parts:
        try:
            sub = read_manifest(part_directory(path, part))
        except (*_STORE_FAULTS, OSError) as e:
            problems.append(f"{part.path}: its manifest cannot be read ({e}); the stores of "
                            "this part were not checked")
            continue
        if sub.rows != part.rows or sub.parts:
            problems.append(f"{part.path}: the part holds {sub.rows} rows"
                            f"{' in parts of its own' if sub.parts else ''}; the directory's "
                            f"manifest says {part.rows}")
        own_columns = {c.name: c for c in sub.columns}
        for col in manifest.columns:
            own = own_columns.get(col.name)
            if own is None or (own.kind, own.dtype, own.item_shape) != (
                    col.kind, col.dtype, col.item_shape):
                columns[col.name]["problems"].append(
                    f"{part.path} has no column {col.name!r} of {col.kind} "
                    f"{col.dtype.str}{col.item_shape} (its manifest lacks it or says otherwise)")
                continue
            if own.group is not None:
                gc = group_store_column(sub.groups[own.group], own.group)
                columns[col.name]["group"] = gc.name
                continue
            columns[col.name]["stores"].append(_check_store(
                path, f"{part.path}/{own.store}", part, col, part.rows, budget))
        for k, g in enumerate(sub.groups):
            gc = group_store_column(g, k)
            entry = columns.setdefault(gc.name, _column_entry(gc, 0))
            entry["rows"] += g.blocks(part.rows)
            entry["stores"].append(_check_store(path, f"{part.path}/{g.store}", part, gc,
                                                g.blocks(part.rows), budget))
    for entry in columns.values():
        for store in entry["stores"]:
            for key in ("checked", "unchecked", "damaged"):
                entry[key] += store[key]
            entry["records"] += store["records"] or 0
    report: dict[str, Any] = {
        "kind": "dataset", "path": path, "rows": manifest.rows,
        "parts": [{"path": p.path, "rows": p.rows} for p in manifest.parts],
        "columns": list(columns.values()), "problems": problems}
    for key in ("records", "checked", "unchecked", "damaged"):
        report[key] = sum(c[key] for c in report["columns"])
    report["problem_count"] = len(problems) + sum(
        len(c["problems"]) + sum(len(s["problems"]) for s in c["stores"])
        for c in report["columns"])
    report["ok"] = not report["damaged"] and not report["problem_count"]
    return report


def _column_entry(col: Column, rows: int) -> dict[str, Any]:
    return {"name": col.name, "kind": col.kind, "dtype": col.dtype.str,
            "item_shape": list(col.item_shape), "rows": rows, "records": 0, "checked": 0,
            "unchecked": 0, "damaged": 0, "problems": [], "stores": []}


def _check_store(root: str, rel: str, part: Part | None, col: Column, rows: int,
                 budget: list[int], committed: bool = False) -> dict[str, Any]:
    """The entry of column ``col``'s store ``rel`` (inside the dataset directory ``root``),
    which must hold ``rows`` records; ``budget[0]``: damaged records still to list. With
    ``committed`` (a directory with a commit point), records past ``rows`` are an append that
    was not committed: counted as ``uncommitted``, not judged (the next writer trims them)."""
    path = os.path.join(root, *rel.split("/"))
    entry: dict[str, Any] = {"part": None if part is None else part.path, "store": rel,
                             "path": path, "rows": rows, "records": None, "checked": 0,
                             "unchecked": 0, "damaged": 0, "failures": [], "problems": []}
    problems = entry["problems"]
    if os.path.islink(path) or not os.path.isdir(path):
        problems.append(f"the store of column {col.name!r} is missing (or is a link): the "
                        "dataset directory is incomplete")
        return entry
    if not _schema.is_store(path):
        problems.append(f"not a loaderx store (no {_schema.META_FILE}): the store of column "
                        f"{col.name!r} is incomplete")
        return entry
    try:
        schema = _store_schema(path)
    except _STORE_FAULTS as e:
        problems.append(f"its {_schema.SCHEMA_FILE} cannot be read: {e}")
        schema = None
    else:
        want = f"{col.kind} {col.dtype.str}{col.item_shape}"
        if schema is None:
            problems.append(f"it has no {_schema.SCHEMA_FILE} (a raw store); the manifest says "
                            f"{want}")
        elif (schema.kind, schema.dtype, schema.item_shape) != (
                col.kind, col.dtype, col.item_shape):
            problems.append(f"it holds {schema.kind} {schema.dtype.str}{schema.item_shape} "
                            f"records; the manifest says {want}")
            schema = None  # its records are not judged by a schema that is not the column's
    try:
        found = _verify_records(path, schema, budget[0])
    except _STORE_FAULTS as e:
        problems.append(f"it cannot be opened: {e}")
        return entry
    if committed and found["records"] > rows:
        past = [f for f in found["failures"] if f[0] >= rows]
        found["failures"] = [f for f in found["failures"] if f[0] < rows]
        found["damaged"] -= len(past)
        entry["uncommitted"] = found["records"] - rows
        found["records"] = rows
    budget[0] -= len(found["failures"])
    entry.update(records=found["records"], checked=found["checked"],
                 unchecked=found["unchecked"], damaged=found["damaged"],
                 failures=found["failures"])
    if found["records"] != rows:
        problems.append(f"it holds {found['records']} records; the manifest says {rows}")
    return entry
