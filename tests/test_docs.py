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
import loaderx.intake.tokens
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


@pytest.mark.parametrize("module", [loaderx.zrecord, loaderx.converter, loaderx.dataset,
                                    loaderx.dataloader, loaderx.concat, loaderx.sharding,
                                    loaderx.subset, loaderx.intake.tokens])
def test_module_doctests(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
