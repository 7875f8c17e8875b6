"""Copying a store or a dataset directory without filling its holes.

``meta.zr`` is a fixed 256 MiB file of which a store uses only the pages its records' entries
are on (``sums.zr`` likewise), and compaction leaves holes in chunk files: a plain ``cp``,
``shutil.copytree`` or ``tar`` without ``--sparse`` writes every hole out as zeros. ``copy``
copies only the data regions of each file (``SEEK_DATA``/``SEEK_HOLE``), keeps each file's
size, holds the source's writer lock meanwhile (when it may take it) so that no writer changes
it half-way, syncs the copy, and then opens it and decodes every record to check it.
``cp --sparse=always`` and ``tar --sparse`` are the shell's sparse-aware equivalents (without
the lock and the check).

A dataset directory (:mod:`loaderx.intake.directory`: a ``manifest.json`` and a store per
column, or a ``manifest.json`` and ``parts/NNNNN/``, each a dataset directory) is copied as a
whole: the source is first checked as :func:`~loaderx.intake.directory.open_dataset` checks it
(every column's store there, of the manifest's kind, shape and row count), every store is held
still and copied as a store is, each manifest is written exactly as it was read (and checked),
the directory's own last, and the copy is checked before it takes its name -- every record of
every store decoded, and the copy opened as a dataset. Files that are not the dataset's (a
store's stray files, directories the manifest does not name) are not copied.

Either way the copy is built in a private directory beside ``dst`` and published in one atomic
rename (:mod:`loaderx.staging`): a failure, Ctrl-C or a kill leaves ``dst`` as it was, and what
a kill left is removed by the next copy to ``dst``. ``dst`` must not exist, unless
``overwrite=True``, which replaces a loaderx store or dataset directory there (nothing else) in
one atomic swap, with the rules of :class:`~loaderx.intake.directory.DirectoryWriter`.
"""

from loaderx._archives.copying import (
    DatasetFiles,
    check_dataset,
    claim_new,
    copy,
    copy_files,
    data_regions,
    dataset_files,
    dataset_report,
    held_still,
    store_files,
    verified,
    verified_stores,
    write_sparse,
)

__all__ = [
    "copy", "copy_files", "data_regions", "held_still", "store_files", "verified",
    "write_sparse", "claim_new", "check_dataset", "dataset_files", "DatasetFiles",
    "verified_stores", "dataset_report",
]
