"""pytest hooks for the whole checkout: the package's doctests that need an optional extra skip where it is not
installed, with the reason, as the tests that need it do (``tests/conftest.py`` holds the tests' own hooks)."""

import functools
import importlib
import os

import pytest

# JAX takes 75 % of the GPU when it is first imported (by a JAX test, or a doctest of tcgnn_py.jax): the CuPy work in
# that worker, and in the other workers on the same GPU, needs room.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

#: Doctests whose examples name these words need the module (its extra): the partitioners run METIS.
DOCTEST_EXTRAS = {"pymetis": ("the partition extra", ('"metis"', "'metis'", '"lp"', "'lp'"))}


@functools.cache
def _importable(module):
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _doctest_needs(item):
    """The reason a doctest cannot run here (a missing extra), or None."""
    test = getattr(item, "dtest", None)
    if test is None:
        return None
    source = "".join(example.source for example in test.examples)
    for module, (extra, words) in DOCTEST_EXTRAS.items():
        if any(w in source for w in words) and not _importable(module):
            return f"needs {module} ({extra})"
    return None


#: Package modules that import an optional extra at import time: not collected for doctests without it (the tests
#: of that extra skip with the reason).
collect_ignore_glob = [] if _importable("jax") else ["tcgnn_py/jax/*"]


def pytest_collection_modifyitems(config, items):
    for item in items:
        needs = _doctest_needs(item)
        if needs:
            item.add_marker(pytest.mark.skip(reason=needs))
