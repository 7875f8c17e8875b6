"""The implementation behind :mod:`loaderx.prefetch`, the public module, whose documentation
says what this does and why."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import Any

from loaderx.errors import LoaderxTypeError, LoaderxValueError

__all__ = ["Prefetcher"]


class Prefetcher:
    """Yields ``put(batch)`` for each batch of ``batches``, calling ``put`` up to ``size``
    batches before the consumer asks for them (``put`` starts a copy to a device, which then
    overlaps the training step); ``deliver``, if given, is applied to an item as it is handed
    out (for example to make the consumer's stream wait for its copy). See the module
    documentation for the position it keeps."""

    def __init__(self, batches: Iterable[Any], put: Callable[[Any], Any], size: int = 2,
                 deliver: Callable[[Any], Any] | None = None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise LoaderxValueError(f"size must be an integer of at least 1, got {size!r}")
        self._source = batches
        self._iterator = iter(batches)
        self._put = put
        self._deliver = deliver
        self._size = size
        # (the source's step when the batch was taken, or None without one; put(batch))
        self._held: collections.deque[tuple[int | None, Any]] = collections.deque()
        self._taken_to: int | None = None  # the source's step after the last batch taken
        self._exhausted = False
        self._closed = False
        readers = getattr(batches, "_readers_ahead", None)
        if readers is not None:  # a DataLoader: it counts our batches in its state_dict()
            readers.add(self)

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        self._forget_if_moved()
        while len(self._held) < self._size and not self._exhausted:
            self._take()
        if not self._held:
            raise StopIteration
        _, item = self._held.popleft()
        return self._deliver(item) if self._deliver is not None else item

    def _take(self) -> None:
        step = self._source_step()
        try:
            batch = next(self._iterator)
        except StopIteration:
            self._exhausted = True
            return
        try:
            item = self._put(batch)
        except BaseException:
            # The batch left the loader but reaches nobody: rewind the loader to the first
            # batch the consumer has not had, so none is skipped.
            self._give_back(step)
            raise
        self._held.append((step, item))
        self._taken_to = self._source_step()

    # -- position and checkpoints --------------------------------------------------------------

    @property
    def held_ahead(self) -> int:
        """How many batches this prefetcher has taken from the source and not handed out yet
        (0 once the source moved without it: those batches will not be handed out)."""
        return len(self._held) if self._taken_to == self._source_step() else 0

    @property
    def step(self) -> int:
        """The step of the batch ``next()`` returns next (the source's ``step``, less the
        batches held here)."""
        source_step = self._source_step()
        if source_step is None:
            raise LoaderxTypeError(
                f"the batches come from a {type(self._source).__name__}, which has no step; "
                "prefetch a DataLoader (or loader.epoch()) to have one")
        return source_step - self.held_ahead

    def state_dict(self) -> dict[str, Any]:
        """The source's ``state_dict()`` (a :class:`~loaderx.dataloader.DataLoader`'s) with the
        step of the next batch the consumer gets: what a checkpoint of the training loop
        needs."""
        state_dict = getattr(self._source, "state_dict", None)
        if state_dict is None:
            raise LoaderxTypeError(
                f"the batches come from a {type(self._source).__name__}, which has no "
                "state_dict(); prefetch a DataLoader to checkpoint through the prefetcher")
        state = dict(state_dict())
        state["step"] = self.step
        return state

    def load_state_dict(self, state: Any) -> None:
        """Drops the batches held and resumes the source at ``state``
        (:meth:`DataLoader.load_state_dict <loaderx.dataloader.DataLoader.load_state_dict>`)."""
        self._held.clear()
        self._source_method("load_state_dict")(state)
        self._exhausted = False

    def seek(self, step: int) -> None:
        """Drops the batches held and makes ``step`` the next batch of the source."""
        self._held.clear()
        self._source_method("seek")(step)
        self._exhausted = False

    def _source_method(self, name: str) -> Callable[..., Any]:
        method = getattr(self._source, name, None)
        if method is None:
            raise LoaderxTypeError(f"the batches come from a {type(self._source).__name__}, "
                                   f"which has no {name}(); prefetch a DataLoader")
        return method

    def _source_step(self) -> int | None:
        step = getattr(self._source, "step", None)
        return step if isinstance(step, int) else None

    def _forget_if_moved(self) -> None:
        """Drops the held batches once the source was moved (a seek, a resume, or batches
        taken by someone else): the next batch comes from where the source is now."""
        if self._held and self._taken_to != self._source_step():
            self._held.clear()
            self._exhausted = False

    def source_moved(self) -> None:
        """Called by a DataLoader whose position is set (``seek``, ``load_state_dict``): the
        batches held are from before and are dropped."""
        self._held.clear()
        self._exhausted = False

    # -- lifecycle -----------------------------------------------------------------------------

    def _give_back(self, taking: int | None = None) -> None:
        """Rewinds the source to the first batch the consumer has not had -- the first one
        held, else ``taking``, the step of a batch being taken -- when the source can seek, is
        open and nobody else moved it; drops the batches held."""
        if taking is not None:  # our own take moved the source past `taking`
            unmoved = not self._held or self._taken_to == taking
        else:
            unmoved = bool(self._held) and self._taken_to == self._source_step()
        first = self._held[0][0] if self._held else taking
        self._held.clear()
        seek = getattr(self._source, "seek", None)
        if unmoved and first is not None and seek is not None \
                and not getattr(self._source, "closed", False):
            seek(first)

    def close(self) -> None:
        """Hands the batches held back to the source (its next batch is the first one the
        consumer did not get) and ends the iteration; the source stays open. Closing twice is
        harmless."""
        if self._closed:
            return
        self._closed = True
        self._give_back()
        readers = getattr(self._source, "_readers_ahead", None)
        if readers is not None:
            readers.discard(self)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Prefetcher(size={self._size}, held={len(self._held)}"
                f"{', closed' if self._closed else ''})")
