"""The documentation follows the code: links lead somewhere, the API page lists every public name, the
launch-options table is the options' own."""

import pathlib
import re

import pytest
from _env import ROOT

import tcgnn_py as tg
from tcgnn_py import _tuning
from tcgnn_py import distributed as dist
from tcgnn_py import nn

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINKS = [(page, target) for page in PAGES
         for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text())
         if not re.match(r"[a-z]+://", target) and not target.startswith("mailto:")]


def _anchors(page):
    """GitHub / MyST heading slugs of a Markdown page."""
    out = set()
    for title in re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).strip().replace(" ", "-")
        out.add(slug)
    return out


def test_the_pages_have_links():
    assert len(LINKS) >= 10


@pytest.mark.parametrize("page,target", LINKS, ids=[f"{p.relative_to(ROOT)}->{t}" for p, t in LINKS])
def test_every_link_leads_somewhere(page, target):
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    assert dest.exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
    if anchor:
        assert anchor in _anchors(dest), f"{page.relative_to(ROOT)} links to #{anchor}, not a heading of {dest.name}"


#: Public names that are modules or constants: documented where they are used, not as API pages.
NOT_PAGES = {"nn", "SPMM_TARGET", "SDDMM_TARGET", "ATTENTION_TARGET", "ATTENTION_BWD_TARGET", "DROP_MM_TARGET",
             "DROP_ATB_TARGET", "LAYOUTS", "DEFAULT_TIMEOUT", "BACKENDS", "HALO_DTYPES", "PARTITIONERS",
             "METIS_MAX_ENTRIES"}


def test_the_api_page_lists_every_public_name():
    listed = set(re.findall(r"^   (\w+)$", (ROOT / "docs" / "api.md").read_text(), flags=re.M))
    modules = [tg, nn, dist]
    try:
        from tcgnn_py import jax as tgj  # (an optional extra: its names are listed where it is installed)
    except ImportError:
        pass
    else:
        modules.append(tgj)
    missing = [f"{m.__name__}.{n}" for m in modules for n in m.__all__ if n not in listed and n not in NOT_PAGES]
    assert missing == []


def test_the_launch_options_table_is_the_code():
    text = (ROOT / "docs" / "guide" / "measuring.md").read_text()
    table = text.split("<!-- options-table -->")[1].split("<!-- /options-table -->")[0]
    rows = re.findall(r"^\| `(\w+)` \| (\w+) \| `([^`]*)` \| (.*?) \| .* \|$", table, flags=re.M)
    want = [(name, fam, repr(default), _tuning.allowed()[name])
            for fam, opts in _tuning.FAMILY_DEFAULTS.items() for name, default in opts.items()]
    assert rows == want


def test_no_page_points_at_an_issue_number():
    """Readers cannot follow the project's issue numbers: the pages and docstrings say what they mean instead (an
    upstream project's issue, named with its project, can be followed)."""
    own = r"(?<!numba )(?<!scipy )(?<!cupy )\bissues? #?\d+"
    found = [f"{page.relative_to(ROOT)}: {m.group(0)}" for page in PAGES
             for m in re.finditer(own, page.read_text(), flags=re.I)]
    docstrings = [f"{path.relative_to(ROOT)}: {m.group(0)}" for path in sorted((ROOT / "tcgnn_py").rglob("*.py"))
                  for m in re.finditer(own, path.read_text(), flags=re.I)]
    assert found + docstrings == []


def test_the_readme_speedups_are_the_results_pages():
    """The README's table is the results page's run: its geomeans for the vector layout, per dtype and clock."""
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    readme = (ROOT / "README.md").read_text()
    clocks = ("GPU-only (queued)", "back to back", "one call from idle")
    for label, impl in (("float32 (TF32 tensor cores)", "tf32"), ("float16", "float16"), ("bfloat16", "bfloat16")):
        row = re.search(rf"^\| {re.escape(label)} \| (.+) \|$", readme, flags=re.M)
        assert row, label
        cells = [c.strip() for c in row.group(1).split("|")]
        want = [re.search(rf"spmm tcgnn_vector_{impl}, {re.escape(c)}: geomean ([\d.]+)x", page).group(1) + "×"
                for c in clocks]
        assert cells == want, label
    gpu = re.search(r"One run of the harness on (NVIDIA \w+)", page).group(1)
    points = re.search(r"geomean [\d.]+x over the best baseline at (\d+) points", page).group(1)
    assert f"geomean over {points} points" in readme and f"{gpu}, the run of the results page" in readme
