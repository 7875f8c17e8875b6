"""Which files a WebDataset shard argument names: a list of paths, a glob, or brace notation.

WebDataset names its shards with brace notation (``shards-{000..099}.tar``), expanded the way
the ``braceexpand`` package does: ``{a,b,c}`` gives each alternative, ``{000..099}`` each
number with the width of the wider end when either end is written with a leading zero,
``{a..e}`` each letter; braces nest and a backslash escapes a brace or comma. A name that holds
``*``, ``?`` or ``[`` after expansion is a glob, whose matches come sorted (by their bytes).
A string that names an existing file is taken as it is, braces or not.

The order is the order written: the list's order, then the expansion's (left to right, the
alternatives and ranges in the order written), a glob's matches sorted. That order is the
order of the samples in the dataset. Expansions are bounded (:data:`MAX_SHARDS`), a glob or
range that names no file and a name given twice are refused with a
:class:`~loaderx.errors.DatasetError` naming it.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

from loaderx.errors import DatasetError, LoaderxTypeError

__all__ = ["MAX_SHARDS", "expand_braces", "shard_paths"]

#: Most shard names one argument may expand to (a typo like ``{0..99999999}`` is refused,
#: not listed).
MAX_SHARDS = 1 << 20
_GLOB_CHARS = "*?["


def expand_braces(pattern: str) -> list[str]:
    """Every string ``pattern`` stands for, in order (see the module docstring)."""
    out = _expand(pattern, 0, len(pattern))
    return [_unescape(s) for s in out]


def _unescape(s: str) -> str:
    return s.replace("\\{", "{").replace("\\}", "}").replace("\\,", ",")


def _matching_brace(s: str, start: int, end: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``start``, or -1."""
    depth, i = 0, start
    while i < end:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _split_commas(s: str, start: int, end: int) -> list[tuple[int, int]]:
    """The top-level comma-separated pieces of ``s[start:end]``, as index pairs."""
    pieces, depth, at, i = [], 0, start, start
    while i < end:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            pieces.append((at, i))
            at = i + 1
        i += 1
    pieces.append((at, end))
    return pieces


def _range(body: str, pattern: str) -> list[str] | None:
    """The items of a ``{a..b}`` (or ``{a..b..step}``) body, or None when it is not a range."""
    parts = body.split("..")
    if len(parts) not in (2, 3) or (len(parts) == 3 and not _is_int(parts[2])):
        return None
    first, last = parts[0], parts[1]
    step = abs(int(parts[2])) if len(parts) == 3 else 1
    step = step or 1
    if _is_int(first) and _is_int(last):
        a, b = int(first), int(last)
        count = abs(b - a) // step + 1
        if count > MAX_SHARDS:
            raise DatasetError(f"{pattern!r}: the range {{{body}}} names {count} shards, over "
                               f"the limit of {MAX_SHARDS}")
        padded = any(_unsigned(x).startswith("0") and len(_unsigned(x)) > 1
                     for x in (first, last))
        width = max(len(first), len(last)) if padded else 0
        step = step if b >= a else -step
        return [f"{n:0{width}d}" for n in range(a, b + (1 if step > 0 else -1), step)]
    if len(first) == 1 and len(last) == 1 and first.isalpha() and last.isalpha():
        a, b = ord(first), ord(last)
        step = step if b >= a else -step
        return [chr(c) for c in range(a, b + (1 if step > 0 else -1), step)]
    return None


def _unsigned(text: str) -> str:
    return text[1:] if text[:1] in "+-" else text


def _is_int(text: str) -> bool:
    digits = _unsigned(text)
    return bool(digits) and digits.isascii() and digits.isdigit()


def _expand(s: str, start: int, end: int) -> list[str]:
    """The strings ``s[start:end]`` stands for, escapes kept (removed once, at the end)."""
    i = start
    while i < end:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            close = _matching_brace(s, i, end)
            if close < 0:
                raise DatasetError(f"{s!r}: the brace at position {i} is never closed (write "
                                   "\\{ for a literal brace)")
            head = s[start:i]
            pieces = _split_commas(s, i + 1, close)
            if len(pieces) == 1:
                ranged = _range(s[i + 1:close], s)
                # Neither an alternation nor a range: the braces are literal (as braceexpand).
                alternatives = ranged if ranged is not None else [
                    "{" + x + "}" for x in _expand(s, i + 1, close)]
            else:
                alternatives = [x for a, b in pieces for x in _expand(s, a, b)]
            tails = _expand(s, close + 1, end)
            if len(alternatives) * len(tails) > MAX_SHARDS:
                raise DatasetError(f"{s!r} names over {MAX_SHARDS} shards")
            return [head + alt + tail for alt in alternatives for tail in tails]
        if c == "}":
            raise DatasetError(f"{s!r}: the brace at position {i} closes nothing (write \\}} "
                               "for a literal brace)")
        i += 1
    return [s[start:end]]


def shard_paths(shards: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    """The shard files ``shards`` names, in order: each one an existing path."""
    if isinstance(shards, (str, os.PathLike)):
        given = [os.fspath(shards)]
    elif isinstance(shards, (bytes, bytearray)):
        raise LoaderxTypeError("shards must be a path, a pattern or a list of them, not bytes")
    else:
        try:
            given = [os.fspath(s) for s in shards]
        except TypeError:
            raise LoaderxTypeError("shards must be a path, a pattern (glob or braces) or a "
                                   f"list of paths, got {type(shards).__name__}") from None
    paths: list[str] = []
    for item in given:
        if not isinstance(item, str):
            raise LoaderxTypeError(f"shard {item!r} is not a str path")
        if os.path.lexists(item):
            paths.append(item)
            continue
        for name in expand_braces(item):
            if any(c in name for c in _GLOB_CHARS):
                found = sorted(glob.glob(name), key=os.fsencode)
                if not found:
                    raise DatasetError(f"{name!r} matches no file (from {item!r})")
                paths.extend(found)
            elif not os.path.lexists(name):
                where = "" if name == item else f" (from {item!r})"
                raise DatasetError(f"shard {name!r} does not exist{where}")
            else:
                paths.append(name)
        if len(paths) > MAX_SHARDS:
            raise DatasetError(f"over {MAX_SHARDS} shards named")
    if not paths:
        raise DatasetError("no shards given")
    seen: set[str] = set()
    for p in paths:
        key = os.path.realpath(p)
        if key in seen:
            raise DatasetError(f"shard {p!r} is named twice: its samples would be converted "
                               "twice")
        seen.add(key)
    return paths
