"""Every ``python`` code block of README.md runs as written (each block on its own, in a fresh namespace)."""

import pathlib
import re
import warnings

import pytest
from _env import ROOT

BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_readme_has_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_block_runs(i, monkeypatch):
    monkeypatch.chdir(pathlib.Path(ROOT))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(BLOCKS[i], f"README.md block {i}", "exec"), {"__name__": "__readme__"})
