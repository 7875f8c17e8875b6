"""The documentation as a reader meets it: every ```python block of the README and of every page
under docs/ runs as pasted, every relative link leads somewhere, the README stays a front door,
and the modules' doctests pass."""

from __future__ import annotations

import doctest
import pathlib
import re
import subprocess
import sys

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

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
GUIDE = ROOT / "docs" / "guide"
# The front door and the guide: the pages a newcomer reads (docs/*.md are the design records).
FRONT = [README, *sorted(GUIDE.glob("*.md"))]
README_MAX_LINES = 250
# Plain ```python blocks run here, in this process; ```python torch / ```python jax ones run as
# scripts of their own in tests/test_frameworks.py.
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def _name(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def python_blocks(page: pathlib.Path) -> list[str]:
    return PYTHON_BLOCK.findall(page.read_text())


def test_readme_and_guide_have_examples():
    assert python_blocks(README), "the README has its quick start"
    assert GUIDE.is_dir() and all(python_blocks(GUIDE / p) for p in
                                  ("converting.md", "loading.md", "packing.md", "mixtures.md",
                                   "intake.md", "store.md")), "the guide's task pages have examples"


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=_name)
def test_examples_run(page, tmp_path, monkeypatch):
    """A page's blocks run in order, in one fresh directory (a block may read what an earlier
    block of its page wrote there), each in a namespace of its own, as a reader pastes them."""
    monkeypatch.chdir(tmp_path)
    for i, code in enumerate(python_blocks(page)):
        try:
            exec(compile(code, f"{_name(page)} (block {i + 1})", "exec"), {})
        except Exception as e:
            raise AssertionError(f"{_name(page)}, Python block {i + 1}:\n{code}") from e


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


def _prose(markdown: str) -> str:
    """The text outside code fences (a ``](x)`` inside code is not a link)."""
    return re.sub(r"^```.*?^```$", "", markdown, flags=re.S | re.M)


def broken_links(page: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """The relative links of a page (to one of its headings, or to a file of the repository
    ``root`` and a heading there) that lead nowhere."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or not file.is_relative_to(root):
            broken.append(target)
        elif anchor and (file.suffix != ".md" or anchor not in _anchors(file.read_text())):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_links_resolve(page):
    assert not broken_links(page), f"links in {_name(page)} that lead nowhere"


def test_a_broken_link_is_found(tmp_path):
    """The link check is not vacuous: a missing file, a missing heading and a heading of another
    page are each reported; a good link to a heading of another page is not."""
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[a](other.md#a-section) [b](nowhere.md) [c](#no-such)"
                    " [d](other.md#page) [e](https://example.org/x)\n```\n[f](inside-code.md)\n```\n")
    assert broken_links(page, tmp_path) == ["nowhere.md", "#no-such", "other.md#page"]


def test_every_guide_page_is_reachable():
    """Every page under docs/guide/ is linked from the guide's index, and the index from the
    README."""
    index = (GUIDE / "index.md").read_text()
    assert "(docs/guide/index.md)" in README.read_text()
    unlinked = [p.name for p in GUIDE.glob("*.md") if p.name != "index.md" and
                f"]({p.name})" not in index]
    assert not unlinked, f"guide pages the index does not link: {unlinked}"


def test_readme_is_a_front_door():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, more than {README_MAX_LINES}: move the detail into a page "
        "of docs/guide/ and link it")


def test_readme_keeps_the_setup_commands():
    """The two commands a fresh clone runs, as .ci/run and the main job use them."""
    text = README.read_text()
    assert "bash scripts/demo.sh" in text and "bash scripts/test.sh" in text
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_pages_speak_of_features_not_issue_numbers(page):
    hits = re.findall(r"\bissue \d+|\bissue #\d+|\(#\d+\)", _prose(page.read_text()), re.I)
    assert not hits, f"{_name(page)} cites {hits}: say what the feature does instead"


def _bench_help(*layer: str) -> str:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), *layer, "--help"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def _bench_layers() -> set[str]:
    """The layers ``python scripts/bench.py`` lists in its ``--help`` (under ``layers:``)."""
    listing = _bench_help().partition("\nlayers:\n")[2]
    layers = set(re.findall(r"^ {2}([a-z][\w-]*)(?: |$)", listing, re.M))
    assert layers, "bench.py --help lists no layers"
    return layers


def test_benchmarks_are_cited_through_the_one_entry_point():
    """The README and the guide name benchmarks as ``python scripts/bench.py LAYER [options]``
    only, and every layer and option they cite is one the script has."""
    cited: dict[str, set[str]] = {}
    for page in FRONT:
        text = page.read_text()
        old = re.findall(r"bench_\w+\.py|import bench_\w+", text)
        assert not old, f"{_name(page)} cites {old}: cite `python scripts/bench.py LAYER`"
        for layer, args in re.findall(r"scripts/bench\.py\s+([a-z][\w-]*)([^`]*)`", text):
            cited.setdefault(layer, set()).update(re.findall(r"--[\w-]+", args))
    assert cited
    layers = _bench_layers()
    assert not set(cited) - layers, f"layers scripts/bench.py does not have: {set(cited) - layers}"
    unknown = {layer: sorted(opt for opt in options if opt not in _bench_help(layer))
               for layer, options in cited.items() if options}
    assert not any(unknown.values()), f"options scripts/bench.py does not have: {unknown}"


@pytest.mark.parametrize("module", [loaderx.zrecord, loaderx.converter, loaderx.dataset,
                                    loaderx.dataloader, loaderx.concat, loaderx.sharding,
                                    loaderx.subset, loaderx.intake.tokens,
                                    loaderx.intake.growing, loaderx.mixture])
def test_module_doctests(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
