"""Prints the installed distributions whose top-level modules turn the GIL back on when imported
into a free-threaded interpreter (PYTHON_GIL unset), one name a line. Each module is imported in a
fresh interpreter, so one distribution's import cannot be blamed on another. Run by
scripts/freethreaded.sh with .venv-ft's interpreter."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys

PROBE = (
    "import importlib, sys, warnings; warnings.simplefilter('ignore'); "
    "importlib.import_module(sys.argv[1]); sys.exit(3 if sys._is_gil_enabled() else 0)"
)
SKIP = {"pip", "setuptools", "maturin", "_pytest", "py", "pytest"}


def top_levels(dist: md.Distribution) -> list[str]:
    text = dist.read_text("top_level.txt")
    if text:
        return text.split()
    names = set()
    for f in dist.files or ():
        head = f.parts[0] if f.parts else ""
        if head.endswith((".dist-info", ".data")) or head.startswith("_"):
            continue
        head = head.removesuffix(".py")
        if head.isidentifier():
            names.add(head)
    return sorted(names)


def main() -> None:
    seen: set[str] = set()
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name in seen:
            continue
        seen.add(name)
        for top in top_levels(dist):
            if top.startswith("_") or top in SKIP:
                continue
            r = subprocess.run([sys.executable, "-c", PROBE, top], capture_output=True)
            if r.returncode == 3:
                print(name)
                break


if __name__ == "__main__":
    main()
