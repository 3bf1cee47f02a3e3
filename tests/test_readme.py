"""Every ``python`` code block of README.md and of the documentation's pages runs as written.

Each block runs on its own, in a fresh namespace, from the repository's root.
"""

import pathlib
import re
import warnings

import pytest
from _env import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCKS = [(page.relative_to(ROOT), block) for page in PAGES
          for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]


def test_readme_has_blocks():
    assert sum(page.name == "README.md" for page, _ in BLOCKS) >= 1 and len(BLOCKS) >= 10


@pytest.mark.parametrize("i", range(len(BLOCKS)), ids=[f"{page}-{i}" for i, (page, _) in enumerate(BLOCKS)])
def test_readme_block_runs(i, monkeypatch):
    monkeypatch.chdir(pathlib.Path(ROOT))
    page, block = BLOCKS[i]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(block, f"{page} block {i}", "exec"), {"__name__": "__readme__"})
