"""Packing a store or a dataset directory into one tar archive and unpacking it, holes kept
both ways.

``pack`` writes a POSIX (pax) tar whose members with holes are in GNU's sparse format 1.0:
only their data regions are stored, so the 256 MiB ``meta.zr`` of a small store takes a few
KiB, and GNU tar (``tar -xf``), bsdtar and Python's ``tarfile`` all restore the holes. The
archive is compressed when its name says so (``.tar.gz``/``.tgz``, ``.tar.xz``, ``.tar.bz2``).
The members sit in one folder named after the store, as ``tar`` users expect. Only the store's
own files go in (not ``gen.zr``, whose change counters belong to the handles of the original,
nor anything else found in the directory).

A dataset directory (:mod:`loaderx.intake.directory`) is packed the same way, whole, under one
folder named after it: its ``manifest.json``, then each column's store as a folder of its own
(``<dir>/<store>/meta.zr``, ...) -- or ``parts/``, then each part's folder, its
``manifest.json`` and its stores -- so ``tar -xf`` gives the dataset directory back as it was.
It is first checked as :func:`~loaderx.intake.directory.open_dataset` checks it, every store
is held still while it is read, and the manifests go in as they were read and checked. What
the manifests do not name (a stray file, an old column's directory) is left out, and so are a
store's stray files (``skipped``, relative paths).

The archive says what it holds, in pax ``comment`` records that tar programs ignore: every
folder's header lists the files directly in it with their sizes -- the manifest of the folder
(a store's files; a dataset directory's or a part's ``manifest.json``; none for ``parts/``) --
and each file's header gives the CRC-32 of its body as stored (computed by reading the file
once before it is written, then checked against what was written). So even an uncompressed
archive of a store without checksums cannot lose a file or change a byte unseen; a lost store
or part of a dataset directory is told by its manifest.

``unpack`` reads such an archive, or one made with ``tar --sparse`` or a plain ``tar`` (runs
of zero blocks are then left as holes; members in any order), into a new directory. An archive
is data from elsewhere, so it is read strictly and bounded before anything is trusted
(:mod:`loaderx._archives.tar_reader`, :mod:`loaderx._archives.stream`): every header's checksum, the
compression's own check (read to the end of the file, nothing after it), the end-of-archive
blocks; only regular files with a store file's name in one top folder, each once and within
the size docs/FORMAT.md gives it; then the manifest when there is one. Whether it holds a store
or a dataset directory is told by the top folder's manifest, or else by its first file
(``<top>/meta.zr``-like: a store; ``<top>/manifest.json`` or a path of the dataset layout: a
dataset directory). An archive of a dataset directory may hold only the layout's paths --
``manifest.json``, ``<store>/<store file>``, ``parts/NNNNN/manifest.json``,
``parts/NNNNN/<store>/<store file>``, with store and part names of the forms the layout allows
(never ``..``, an absolute path or a link) -- is read within bounds of its own
(:data:`_DATASET_LIMITS`, once it shows it is one), has each manifest checked as soon as it is
written (``read_manifest``: a manifest naming a path outside its directory, or over 16 MiB, is
refused there), and must in the end hold exactly the stores and parts its manifests name, each
store with its ``meta.zr``. Nothing is written outside a private staging directory, every
record is decoded and a dataset directory opened as ``open_dataset`` opens it before the
directory takes its name (:mod:`loaderx.staging`; ``overwrite=True`` swaps it for a store or
dataset directory at the destination). Every fault of the archive is a CorruptStoreError
naming it.
"""

from loaderx._archives.archive import pack, unpack

__all__ = ["pack", "unpack"]
