"""The stream protocols: what a :class:`~loaderx.dataloader.DataLoader` stream provides.

A stream is anything whose records are arrays of one dtype, addressed ``0..len``, that can write
a batch of them straight into a caller's buffer. The loader uses nothing else of a stream, so a
new kind of view needs only these members. Two kinds exist.

**Dense** (:class:`DenseSource`): every record has one fixed shape; a batch is one
``(rows, *item_shape)`` array. :class:`DenseDataset`, a dense
:class:`~loaderx.concat.ConcatDataset` and a dense :class:`~loaderx.subset.Subset` implement it:

* ``kind`` -- ``"dense"``;
* ``dtype``, ``item_shape``, ``record_bytes`` -- what one record is (``record_bytes`` is
  ``dtype.itemsize * prod(item_shape)``);
* ``len(source)`` -- the number of records;
* ``gather_rows(idxs, dst, shards=None, rows=None)`` -- writes record ``idxs[i]`` (a uint64
  array, each below ``len``) into row ``i`` of ``dst`` (a writable, C-contiguous uint8 array of
  ``record_bytes``-byte rows), or into row ``rows[i]`` when ``rows`` (strictly increasing) is
  given; splits the work into at most ``shards`` parallel blocks; raises ``LoaderxIndexError``
  for an index out of range and ``CorruptStoreError`` for a record of another size, before
  writing anything;
* ``prefetch(idxs)`` and ``recently_cold`` -- start reading records into the page cache without
  waiting, and say whether the last read found records that were not cached (the loader reads
  ahead only then);
* ``view_digest`` -- ``""`` for a whole dataset, else a short digest of which records the view
  holds, so that a checkpoint taken on one view is refused on another.

**Ragged** (:class:`RaggedSource`): record ``i`` is an ``(n_i, *item_shape)`` array (encoded
bytes are ``(n_i,)`` uint8 records); a batch is a list of such arrays, one per row, views into
one buffer the loader leases from its pool. :class:`RaggedDataset`, a ragged
:class:`~loaderx.concat.ConcatDataset` and a ragged :class:`~loaderx.subset.Subset` implement it:

* ``kind`` -- ``"ragged"``;
* ``dtype``, ``item_shape`` -- the element type and the trailing dimensions of every record;
* ``len(source)``, ``prefetch``, ``recently_cold``, ``view_digest`` -- as for dense streams;
* ``record_nbytes(idxs)`` -- the byte length of each record ``idxs[i]`` (a uint64 array), read
  from the record table without reading a record; ``LoaderxIndexError`` for an index out of
  range, ``CorruptStoreError`` for a record that is not a whole number of
  ``dtype.itemsize * prod(item_shape)``-byte rows;
* ``gather_at(idxs, dst, offsets)`` -- writes record ``idxs[i]`` into the bytes of ``dst`` (a
  writable, C-contiguous uint8 array) starting at byte ``offsets[i]`` (uint64; the loader lays
  the records out back to back at the running sum of their lengths), checking every index and
  range before writing.

Companion arrays (optional, any stream): a stream may add arrays of its own to every batch, as a
packed token stream adds segment ids and positions next to its tokens:

* ``companions(name, idxs) -> dict[str, array]`` -- called by the loader right after it
  gathered the stream's part of a batch into ``batch[name]`` (``idxs``: the uint64 record
  indices of this shard's rows, in row order; in a padded pass the padding rows' repeated
  records too), before the transform; the returned arrays are merged into the batch dict. It
  runs on the worker thread that builds the batch, in every path (threads, ``num_workers=0``,
  ``epoch()``, shards, after ``seek`` or ``load_state_dict``), so a pure function of ``idxs``
  keeps every loader promise. A name already in the batch (a stream, another companion, the
  mask) raises ``LoaderxValueError`` at that batch;
* ``companion_names(name) -> tuple[str, ...]`` -- the names ``companions`` will return for a
  stream called ``name``; when given, the loader refuses colliding names at construction (and
  ``epoch(pad=True)`` a ``mask_key`` among them).

Streams that set the order (optional): a stream with ``defines_order = True`` -- a mixture,
:func:`loaderx.mix` -- is endless, and the loader reads its records ``0, 1, 2, ...`` in turn
(batch ``k`` is records ``k * batch_size`` on, whatever the mode: the stream has shuffled them
already; ``mode="iid"`` is refused) and refuses ``epoch()``; every stream of such a loader must
set the order. Its ``batch_size`` attribute, when not None, must be the loader's.
"""

from loaderx._views.source import DenseSource, RaggedSource, is_dense_source, is_ragged_source

__all__ = ["DenseSource", "RaggedSource", "is_dense_source", "is_ragged_source"]
