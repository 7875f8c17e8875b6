"""Worker processes for the DataLoader (``worker_mode="process"``).

A transform that runs Python per sample holds the GIL, so thread workers serialize on it.
Process workers do not: each worker process opens the streams itself, builds whole batches --
sample, gather, transform -- straight into anonymous shared memory (``memfd`` segments, no
named files that could outlive a crash), and hands the consumer a description of where each
array lies; the consumer maps the segments once and wraps the arrays in place, so a batch
arrives without a copy or a pickle of its arrays. A segment goes back to its worker only when
the consumer has dropped every array of the batches in it.

* :mod:`loaderx.workers.channel` -- framed messages with file descriptors over a socket pair;
* :mod:`loaderx.workers.arena` -- a worker's shared-memory segments and a batch's place in one;
* :mod:`loaderx.workers.layout` -- a transform's output as a skeleton of array references,
  and back;
* :mod:`loaderx.workers.start` -- the start method (fork, forkserver, spawn) and the count;
* :mod:`loaderx.workers.worker` -- the worker process's loop;
* :mod:`loaderx.workers.pipeline` -- the consumer's side: dispatch, order, errors, shutdown;
* :mod:`loaderx.workers.parking` -- idle workers kept from one finished pass for the next.
"""

from loaderx.workers.parking import Parking
from loaderx.workers.pipeline import ProcessPipeline, parking
from loaderx.workers.start import default_workers

__all__ = ["Parking", "ProcessPipeline", "default_workers", "parking"]
