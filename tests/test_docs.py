"""The README's Python examples and the modules' doctests run as written."""

from __future__ import annotations

import doctest
import pathlib
import re

import pytest

import loaderx.concat
import loaderx.converter
import loaderx.dataloader
import loaderx.dataset
import loaderx.intake.growing
import loaderx.intake.tokens
import loaderx.mixture
import loaderx.sharding
import loaderx.subset
import loaderx.zrecord

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_examples_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has Python examples"
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, str(README), "exec"), {})


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings (lower case, punctuation but ``-``
    and ``_`` dropped, spaces as ``-``; a repeated heading gets ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    anchors = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_readme_links_resolve() -> None:
    """Every link of the README to one of its headings, or to a file of the repository (and a
    heading there), leads somewhere."""
    text = README.read_text()
    root = README.parent
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = root / path if path else README
        if not file.exists():
            broken.append(target)
        elif anchor and (file.suffix != ".md" or anchor not in _anchors(file.read_text())):
            broken.append(target)
    assert not broken, f"README links that lead nowhere: {broken}"


@pytest.mark.parametrize("module", [loaderx.zrecord, loaderx.converter, loaderx.dataset,
                                    loaderx.dataloader, loaderx.concat, loaderx.sharding,
                                    loaderx.subset, loaderx.intake.tokens,
                                    loaderx.intake.growing, loaderx.mixture])
def test_module_doctests(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
