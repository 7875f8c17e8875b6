"""What a transform may know about the batch it is given, for random augmentation that resumes.

A :class:`~loaderx.dataloader.DataLoader` transform with a parameter named ``ctx`` is called as
``transform(batch, ctx=ctx)``, ``ctx`` a :class:`BatchContext`. Its random numbers are derived
from the loader's seed and the batch's step alone -- never from a thread, a worker count, a
shard count or how many batches came before -- so a run resumed from a checkpoint, or re-run on
another number of hosts or workers, augments every record exactly as the uninterrupted run did:

* ``ctx.rng`` -- one ``np.random.Generator`` per batch, seeded from ``(seed, step)``: the same
  on every shard, for decisions shared by the whole global batch (a mixup weight, a resolution);
* ``ctx.record_seeds`` / ``ctx.record_rngs()`` -- one seed (a uint64) or Generator per row,
  from ``(seed, step, the row's position in the global batch)``: a record is augmented alike
  whichever shard or worker builds it;
* ``ctx.torch_generator()`` -- a ``torch.Generator`` of the batch, for code that takes one
  (``torch.rand(..., generator=g)``): exact in every worker mode;
* ``ctx.seed_torch()`` -- seeds torch's *process-global* generator for the batch, which is what
  ``torchvision.transforms.v2``'s random transforms draw from: exact in process workers, where
  each worker has that generator to itself. In thread workers (and ``num_workers=0``) the
  generator is the training loop's and every worker's at once, so no seeding can make it exact;
  there ``seed_torch`` refuses, and the recipe is to draw the parameters from ``ctx`` and apply
  them with ``torchvision.transforms.v2.functional`` (docs/guide/loading.md, "Augmentation
  with torchvision").

>>> import numpy as np
>>> ctx = BatchContext(step=3, seed=7, pass_id=None, shard_index=1, shard_count=2,
...                    rows=np.arange(2, 4), indices=np.array([9, 4], dtype=np.uint64))
>>> whole = BatchContext(step=3, seed=7, pass_id=None, shard_index=0, shard_count=1,
...                      rows=np.arange(4), indices=np.array([5, 0, 9, 4], dtype=np.uint64))
>>> bool((ctx.record_seeds == whole.record_seeds[2:]).all())
True
>>> int(ctx.rng.integers(1 << 30)) == int(whole.rng.integers(1 << 30))
True

Derivation (frozen: changing it changes every augmented run). The step's key is
``np.random.SeedSequence([normalize_seed(seed), stream, pass_id, step])`` with ``stream`` 0 for
the endless loader (``pass_id`` 0) and 1 for a finite pass (``loader.epoch(pass_id=...)``), so a
pass never repeats the endless loader's numbers. ``rng`` is ``np.random.default_rng`` of that
SeedSequence. ``record_seeds[i]`` is output number ``rows[i] + 1`` of SplitMix64 started at
``key.generate_state(1, np.uint64)[0]`` (one vectorized NumPy expression, distinct for distinct
rows of a step), and ``record_rngs()[i]`` is ``np.random.default_rng(record_seeds[i])``.
The torch seed of ``torch_generator()`` and ``seed_torch()`` is ``SeedSequence(key.entropy,
spawn_key=(1,)).generate_state(1, np.uint64)[0]`` modulo 2**63.
"""

from loaderx._loader.context import BatchContext, mark_worker_process

__all__ = ["BatchContext", "mark_worker_process"]
