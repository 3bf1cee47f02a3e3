"""Sphinx configuration: Markdown pages (myst-parser), API pages from the numpydoc docstrings."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("TCGNN_PY_DEVICE", "cpu")  # importing for autodoc probes no GPU

project = "tcgnn_py"
author = "tcgnn_py developers"
copyright = "2026, tcgnn_py developers"

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
autosummary_generate = True
autodoc_default_options = {"members": True, "undoc-members": False}
numpydoc_show_class_members = False
numpydoc_validation_checks = set()
suppress_warnings = ["myst.header"]
html_theme = "alabaster"
html_title = "tcgnn_py"
