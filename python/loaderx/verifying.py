"""Verifying a store or a dataset directory: every record decoded, checksums compared, record
lengths checked against the schema, and a dataset directory's own consistency.

:func:`verify_store` is what ``loaderx verify STORE`` runs. The engine decodes every record
(comparing it with its checksum where ``sums.zr`` keeps one; zstd frames carry their own
checks) and each record's length is checked against ``schema.msgpack`` (a dense record is
exactly one row, a ragged one whole rows). Memory stays bounded however much is damaged: the
first ``max_listed`` damaged records are kept, the rest only counted.

:func:`verify_dataset` (``loaderx verify DIRECTORY``) does the same for the store of every
column of every part of a dataset directory (:mod:`loaderx.intake.directory`), and checks what
only the directory can tell, which :func:`~loaderx.intake.directory.open_dataset` would
refuse:

* the manifest, and every part's, is valid (:func:`~loaderx.intake.directory.read_manifest`
  bounds it and refuses a path outside the directory); a part holds the rows the directory's
  manifest says, has no parts of its own and has every column;
* every column's store is there (a directory, not a link), is a loaderx store with a
  ``schema.msgpack`` of the manifest's kind, dtype and item shape, and holds exactly the rows
  the manifest says -- per part, and so in total, since the parts' row counts add up to the
  directory's (the manifest is refused otherwise).

It goes on past the first fault. The report has an entry per column, in manifest order, and in
each one entry per store (one per part in a directory of parts) naming the part and the
store's path, with two kinds of fault, kept apart because they mean different things:

* ``damaged`` records: the store opened, its records did not all verify (``loaderx verify``
  exits 1, as for a store);
* ``problems``: the directory cannot be used as it is -- a store missing, unopenable, or of
  another kind, shape or length than the manifest says; a part's manifest unreadable or
  disagreeing (``loaderx verify`` exits 3, as for a store that cannot be opened). A part's
  manifest that cannot be read, or gives the part other rows than the directory's does, is a
  problem of the directory (``problems`` of the report; the stores of a part whose manifest
  cannot be read are not checked, the others are checked against the directory's count); a
  part that lacks a column, or describes it otherwise, is a problem of that column.

A directory whose own manifest cannot be read raises, as opening it would (CorruptStoreError,
or DatasetError when it is not a dataset directory). ``max_listed`` bounds the damaged
records listed in the whole report, not per store.
"""

from loaderx._archives.verifying import verify, verify_dataset, verify_store

__all__ = ["verify", "verify_store", "verify_dataset"]
