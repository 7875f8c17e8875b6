"""``verify()`` with a bounded list of failures, for the commands that decode a whole store.

The engine's ``Zrecord.verify(max_listed=N)`` lists at most ``N`` damaged records and counts
the rest (``failed``), so memory stays bounded however much of a store is damaged. A native
module built before that argument existed lists every failure; :func:`verify_bounded` gives
the same report from both (with the older one, memory is only bounded after the fact).
"""

from __future__ import annotations

from typing import Any

__all__ = ["verify_bounded"]


def verify_bounded(store: Any, max_listed: int) -> dict[str, Any]:
    """``store.verify(max_listed=max_listed)``: ``records``, ``checked``, ``unchecked``,
    ``failed`` (every damaged record, counted) and ``failures`` (at most ``max_listed`` of
    them, lowest indices first)."""
    try:
        return dict(store.verify(max_listed=max_listed))
    except TypeError:  # a native module from before max_listed: everything is listed
        native = getattr(store, "_native", store)
        report = dict(native.verify())
    failures = sorted(report["failures"])
    report["failed"] = len(failures)
    report["failures"] = failures[:max_listed]
    return report
