"""The package's shape: every public name of today stays importable from where it is today; no
module imports another that imports it back, directly or through others; and the package reads
as floors, each module importing only from its own floor or below (lazy imports inside
functions included in both)."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "python" / "loaderx"

#: Each public module's ``__all__`` as released (names split on white space): a name may be
#: added, never taken away.
PUBLIC = {
    "loaderx": """
        BatchContext ConcatDataset DataLoader DenseDataset LoaderxError Mixture Mode
        PackedDataset Prefetcher RaggedDataset Sampler Subset Zip Zrecord ZrecordError
        __version__ append_dataset decode_strings delete_rows errors from_arrow
        from_image_folder from_iterator from_numpy from_token_stream from_webdataset
        jax_process_shard mix open_dataset pack pad pad_collate prefetch_to_device
        prefetch_to_torch set_num_threads single_process split to_torch torch_batches
        torch_process_shard
    """.split(),
    "loaderx.archive": "pack unpack".split(),
    "loaderx.concat": "ConcatDataset".split(),
    "loaderx.context": "BatchContext mark_worker_process".split(),
    "loaderx.converter": "AUTO_RAW_BELOW DEFAULT_CHUNK_BYTES from_iterator from_numpy".split(),
    "loaderx.copying": """
        DatasetFiles check_dataset claim_new copy copy_files data_regions dataset_files
        dataset_report held_still store_files verified verified_stores write_sparse
    """.split(),
    "loaderx.dataloader": "DataLoader LoaderStats Pass Period Stage Stream Verdict".split(),
    "loaderx.dataset": "DenseDataset RaggedDataset pad".split(),
    "loaderx.errors": """
        CorruptStoreError DatasetError InternalError LimitExceededError LoaderClosedError
        LoaderxError LoaderxIndexError LoaderxTypeError LoaderxValueError MissingDictionaryError
        RemoteTraceback StoreBusyError StoreChangedError StoreClosedError WorkerError
        ZrecordError ZrecordIndexError ZrecordValueError
    """.split(),
    "loaderx.frameworks": """
        Zip pad_collate prefetch_to_device prefetch_to_torch to_torch torch_batches
    """.split(),
    "loaderx.intake": """
        Column DirectoryWriter Manifest RaggedBatch append_dataset decode_strings delete_rows
        export_image_folder export_webdataset from_arrow from_image_folder from_token_stream
        from_webdataset is_dataset_directory open_dataset read_manifest repair_dataset
        split_documents
    """.split(),
    "loaderx.intake.directory": """
        Column ColumnStore DirectoryWriter FORMAT MANIFEST_FILE Manifest RaggedBatch VERSION
        column_stores decode_strings is_dataset_directory open_dataset read_manifest
    """.split(),
    "loaderx.intake.files": """
        SkippedFilesWarning export_image_folder export_webdataset from_image_folder
        from_webdataset
    """.split(),
    "loaderx.intake.growing": """
        Existing append_converted append_dataset delete_rows repair_dataset
    """.split(),
    "loaderx.intake.joining": """
        assemble assemble_named discard_parts hold_parts part_path parts_dir shares_chunks
    """.split(),
    "loaderx.intake.parts": "assemble from_dask parts_dir write_part".split(),
    "loaderx.intake.tables": "DEFAULT_CHUNK_BYTES from_arrow".split(),
    "loaderx.intake.tokens": "TOKEN_PIECE_BYTES from_token_stream split_documents".split(),
    "loaderx.mixture": "MIX_LENGTH Mixture mix ordered_streams".split(),
    "loaderx.packing": "MAX_BATCH_TOKENS PIECE_ROWS_KEY PackedDataset pack".split(),
    "loaderx.prefetch": "Prefetcher".split(),
    "loaderx.profiling": "Profile ProfileError Run load_transform profile".split(),
    "loaderx.sampler": "Mode ModeLike Sampler normalize_seed".split(),
    "loaderx.sharding": "jax_process_shard single_process torch_process_shard".split(),
    "loaderx.source": "DenseSource RaggedSource is_dense_source is_ragged_source".split(),
    "loaderx.staging": """
        STORE_LAST_FILE fsync_dir is_mount_point move_in private_dir private_file publish
        remove_stale replace same_file
    """.split(),
    "loaderx.subset": "Subset split".split(),
    "loaderx.verifying": "verify verify_dataset verify_store".split(),
    "loaderx.workers": "ProcessPipeline default_workers".split(),
    "loaderx.workers.arena": "Arena BatchMemory Segment".split(),
    "loaderx.workers.channel": "Closed Inbox Reader frame_bytes send".split(),
    "loaderx.workers.dtypes": "dtype_of dtype_spec".split(),
    "loaderx.workers.layout": "Flat Loan Opaque Ref decode decode_flat encode".split(),
    "loaderx.workers.mapping": "Mapping".split(),
    "loaderx.workers.pipeline": "ProcessPipeline".split(),
    "loaderx.workers.server_preload": "PRELOAD_VARIABLE describe".split(),
    "loaderx.workers.start": """
        METHODS choose default_workers gil_enabled likely_forkserver usable_cores
    """.split(),
    "loaderx.workers.worker": "main".split(),
    "loaderx.zrecord": """
        CHUNK_CAPACITY CODECS Codec MAX_CHUNKS MAX_RECORDS MAX_RECORD_BYTES Zrecord chunk_number
    """.split(),
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_stay_importable(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(mod, name)]
    assert not missing, f"{module} no longer has {missing}"
    assert set(PUBLIC[module]) <= set(mod.__all__), f"{module}.__all__ lost names"


def _module_names() -> dict[str, pathlib.Path]:
    names = {}
    for path in [*PACKAGE.rglob("*.py"), PACKAGE / "_native.pyi"]:  # the compiled one: its stub
        parts = ("loaderx", *path.relative_to(PACKAGE).with_suffix("").parts)
        names[".".join(parts).removesuffix(".__init__")] = path
    return names


def _imports(name: str, path: pathlib.Path, names: dict[str, pathlib.Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its source (``from a import b``
    counts as module ``a.b`` when that is a module, else as ``a``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: None if path.name == "__init__.py" else -1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in names else target
                      for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    resolved = set()
    for target in found:
        while target not in names and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in names and target != name:
            resolved.add(target)
    return resolved


def test_no_import_cycle() -> None:
    """Packages' ``__init__`` files are the public face, which re-exports from below: imports
    of a face, and a face's own imports, are left out; every other edge counts."""
    names = _module_names()
    faces = {n for n, p in names.items() if p.name == "__init__.py"}
    graph = {n: (set() if n in faces else _imports(n, p, names) - faces)
             for n, p in names.items()}
    cycles = []
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt):], nxt])
            elif nxt not in state:
                walk(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


#: Each module's floor, lowest first. A key names a module, or a sub-package and so every module
#: in it (the longest key that names the module or a package it is in wins; ``loaderx`` itself
#: is only the package's face). A public module that is a face of a private one stands on that
#: one's floor.
FLOORS = {
    # 0. the leaves: the exception tree, the compiled binding
    "loaderx.errors": 0, "loaderx._native": 0,
    # 1. the store's files beside the engine's (publishing, schema.msgpack, sparse copies), and
    #    tar reading, which uses nothing else
    "loaderx._store": 1, "loaderx.staging": 1, "loaderx._schema": 1, "loaderx._sparse": 1,
    "loaderx._archives.stream": 1, "loaderx._archives.tar_reader": 1,
    # 2. the engine's handle and the sampler
    "loaderx._convert": 2, "loaderx.zrecord": 2, "loaderx.sampler": 2,
    # 3. writing a store
    "loaderx.converter": 3, "loaderx._appends_behind": 3,
    # 4. datasets as views, and the views built on them
    "loaderx._views": 4, "loaderx.dataset": 4, "loaderx.subset": 4, "loaderx.concat": 4,
    "loaderx.source": 4, "loaderx.packing": 4, "loaderx.mixture": 4,
    # 5. bringing data in: tables, images, shards, dataset directories
    "loaderx.intake": 5,
    # 6. whole datasets as files: copies, verification, archives
    "loaderx._archives": 6, "loaderx.copying": 6, "loaderx.verifying": 6, "loaderx.archive": 6,
    # 7. the loader's parts; 8. its worker processes; 9. the loader
    "loaderx._loader": 7, "loaderx.context": 7, "loaderx.prefetch": 7,
    "loaderx.workers": 8,
    "loaderx.dataloader": 9,
    # 10. on top of the loader: frameworks, multi-host shards, profiling a pipeline
    "loaderx.frameworks": 10, "loaderx.sharding": 10, "loaderx.profiling": 10,
    # 11. the package's face and the command line
    "loaderx": 11, "loaderx.cli": 11, "loaderx.__main__": 11,
}


def _floor(name: str) -> int | None:
    parts = name.split(".")
    for end in range(len(parts), 1, -1):
        if (key := ".".join(parts[:end])) in FLOORS:
            return FLOORS[key]
    return FLOORS["loaderx"] if name == "loaderx" else None


def test_every_module_has_a_floor() -> None:
    missing = sorted(n for n in _module_names() if _floor(n) is None)
    assert not missing, f"give these modules a floor in FLOORS: {missing}"


def test_no_upward_import() -> None:
    """Every import, faces' included, goes to the importer's floor or below."""
    names = _module_names()
    upward = [f"{n} (floor {_floor(n)}) imports {t} (floor {_floor(t)})"
              for n, p in sorted(names.items()) for t in sorted(_imports(n, p, names))
              if (_floor(n) or 0) < (_floor(t) or 0)]
    assert not upward, "upward imports:\n" + "\n".join(upward)
