"""The store's Python side: the files beside a store's records that the engine does not write.

* :mod:`~loaderx._store.staging` -- how everything loaderx writes is built under a private name
  and published atomically and durably, and what a crash leaves is cleaned up (public as
  :mod:`loaderx.staging`, which is this very module);
* :mod:`~loaderx._store.schema` -- ``schema.msgpack``: what a store's records are (dtype, shape,
  codec, extra keys), read and written;
* :mod:`~loaderx._store.sparse` -- copies of a store's files that keep their holes.

May use: :mod:`loaderx.errors` and the compiled :mod:`loaderx._native`; nothing else of loaderx
(the engine's handle, :mod:`loaderx.zrecord`, sits above).
"""
