"""Packed sequences: token documents as fixed-length rows, for language models.

``pack(docs, seq_len)`` turns a ragged dataset of 1-D token records (a
:class:`~loaderx.dataset.RaggedDataset`, a ragged :class:`~loaderx.subset.Subset` or
:class:`~loaderx.concat.ConcatDataset`) into a dense view of ``seq_len``-token rows, usable
anywhere a dense stream is: a :class:`~loaderx.dataloader.DataLoader` stream, ``subset()``,
:func:`~loaderx.subset.split`, ``epoch()``. In a loader batch a packed stream named ``name``
gives ``name`` (rows of tokens), ``name_segment_ids`` (int32: 1, 2, ... for the documents of a
row in row order, 0 for padding) and ``name_positions`` (int32: each token's position inside
its document, continuing when a document continues from the previous row).

>>> import numpy as np, tempfile, os
>>> from loaderx.converter import from_iterator
>>> from loaderx.dataset import RaggedDataset
>>> path = os.path.join(tempfile.mkdtemp(), "docs")
>>> _ = from_iterator(path, [np.arange(1, n + 1, dtype=np.uint16) for n in (3, 5, 2)])
>>> rows = pack(RaggedDataset(path), 4, eos_id=0)
>>> len(rows), rows.dropped_tokens
(3, 1)
>>> rows[:]       # the documents in the seeded order 2, 0, 1, each followed by eos_id 0
array([[1, 2, 0, 1],
       [2, 3, 0, 1],
       [2, 3, 4, 5]], dtype=uint16)
>>> segment_ids, positions = rows.segments([1, 2])
>>> segment_ids, positions
(array([[1, 1, 1, 2],
       [1, 1, 1, 1]], dtype=int32), array([[1, 2, 3, 0],
       [1, 2, 3, 4]], dtype=int32))

Limits: a batch of rows holds at most :data:`MAX_BATCH_TOKENS` tokens (2**31 - 1: its segment
ids and positions are int32), so ``seq_len`` is at most that (a row is a batch of one); a
batch is also refused, before anything is allocated, when its tokens, segment ids and positions
(``itemsize + 8`` bytes a token) need more than the process can have (the smallest of the
physical memory, the cgroup's ``memory.max``, ``RLIMIT_AS`` and ``RLIMIT_DATA``). concat refuses
a document of more than 2**31 tokens (its end token counted), whose positions would not fit
int32. The plans are sized by the documents, never by ``seq_len``.

Methods: ``"concat"`` (pretraining) concatenates the documents in a seeded order, each followed
by ``eos_id`` when given, and cuts the stream into rows: every token lands in exactly one row,
only the tail shorter than a row is dropped. ``"first_fit"`` (fine-tuning) packs whole
documents into rows without splitting any (best-fit decreasing, see
:mod:`loaderx._views.pack_plan`), the rest of a row ``pad_id`` with segment id 0; a document longer
than a row is truncated to its first ``seq_len`` tokens (with ``eos_id``: its first
``seq_len - 1`` and the end token) and counted in :attr:`PackedDataset.truncated` -- with a
:class:`~loaderx.errors.TruncationWarning` saying the share of the tokens the rows keep, once
per view, unless ``truncate=True`` asked for it -- or refused with ``truncate=False``.

Which method: ``concat`` for pretraining (every token kept, documents split across rows, no
padding); ``first_fit`` when a document must stay whole in its row (fine-tuning examples, a
prompt with its answer) and documents are mostly shorter than ``seq_len`` -- long documents
lose their tails, which the warning counts (at ``seq_len=257`` on the standard library's
sources, first_fit keeps 1.6% of the tokens: concat is the method there).

Re-packing per pass: ``pack(..., repack=True)`` gives each pass over the rows its own packing
-- pass ``p`` packs the documents in its own seeded order (concat: other row boundaries;
first_fit: other documents sharing a row), still every token once per pass (concat's
dropped tail changes with the order). :meth:`PackedDataset.pass_view` is pass ``p``'s view
(pass 0's is the view itself, the same rows as without ``repack``); the rows per pass are the
same in every pass. A loader needs the order to know which pass a row is in, so it reads such
a view through a mixture, ``loaderx.mix([rows])``: pass after pass, each packed and shuffled
anew (see :mod:`loaderx.mixture`).

The row plan is computed once, from the record table's lengths alone (no record is read), and
is a pure function of the documents' lengths and the arguments: the loader's sampler shuffles
rows as for any dense stream, so resume, worker-count independence and shards hold unchanged,
and a checkpoint stays a few integers. A view pickles as its documents and arguments (a worker
process plans again, getting the same rows).

Reading a row copies only the tokens it holds: each part is a byte range of one record
(``Zrecord.gather_parts`` where the engine has it: a compressed record is decoded once per batch
however many parts of it the batch holds). Documents written with
``from_iterator(..., max_record_bytes=N)`` are stored as pieces of at most ``N`` bytes (schema
key ``piece_rows``: a record of exactly that many rows is continued by the next record; a
document ends at its first shorter record, an empty one when its length is a multiple), so a
long document in a compressed store is decoded a piece, not a document, per row it touches.
"""

from loaderx._views.packing import MAX_BATCH_TOKENS, PIECE_ROWS_KEY, PackedDataset, pack

__all__ = ["pack", "PackedDataset", "PIECE_ROWS_KEY", "MAX_BATCH_TOKENS"]
