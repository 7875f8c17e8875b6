"""Whole datasets as files: copied (:mod:`~loaderx._archives.copying`), checked end to end
(:mod:`~loaderx._archives.verifying`), packed into and unpacked from one tar archive
(:mod:`~loaderx._archives.archive`), and the tar reading those need
(:mod:`~loaderx._archives.stream`: an archive's bytes decompressed with their integrity checks;
:mod:`~loaderx._archives.tar_reader`: members out of a tar, with limits). The public modules are
:mod:`loaderx.copying`, :mod:`loaderx.verifying` and :mod:`loaderx.archive`.

May use: ``copying``, ``verifying`` and ``archive`` work on a dataset directory as
:mod:`loaderx.intake.directory` defines it, so they sit above :mod:`loaderx.intake` and may use
it and everything below (the store's files, :mod:`loaderx.zrecord`). ``stream`` and
``tar_reader`` use only :mod:`loaderx.errors`: they sit on the store's floor, so that
:mod:`loaderx.intake` (which reads WebDataset shards with them) may use them.
"""
