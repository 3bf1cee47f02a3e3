"""The N:M grouping kernel against its NumPy reference: in the simulator (CI) and on the GPU."""

import numpy as np
import pytest
import scipy.sparse as sp
from _env import graph_dir, host

from _zoo import star
from tcgnn_py.tiles import _nm_group
from tcgnn_py.tiles import _nm_windows

pytestmark = pytest.mark.kernels

PATTERNS = [(2, 4), (1, 2)]


def check(xp, A, pattern, window=16):
    A = sp.csr_array(A)
    r, c = A.nonzero()
    want = _nm_windows.nm_groups(r, c, A.shape, window, pattern)
    slot_ptr, slot_cols = _nm_group.group_slots(r, c, A.shape, window, pattern, xp)
    np.testing.assert_array_equal(host(slot_ptr), want["slot_ptr"])
    np.testing.assert_array_equal(host(slot_cols), want["slot_cols"])


@pytest.mark.parametrize("pattern", PATTERNS)
def test_small_matrices(xp, pattern):
    # Tiny (the simulator runs one thread per lane): conflicts, padding, an empty window, a rectangular shape.
    rng = np.random.default_rng(7)
    A = sp.random_array((40, 30), density=0.3, rng=rng, format="lil")
    A[16:32, :] = 0
    check(xp, A.tocsr(), pattern)
    check(xp, np.ones((16, 8)), pattern)


def test_more_than_32_open_groups(xp):
    # Row 0 holds every column: each 1:2 group takes one of them, so 40 groups stay open until the oldest
    # are closed to make room (the reference's eviction order).
    A = np.zeros((16, 40))
    A[0] = 1
    A[1:, 5] = 1
    check(xp, A, (1, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("name", ["cora", "pubmed", "as_22july06", "wiki_vote"])
def test_real_graphs_on_gpu(xp, name, pattern):
    check(xp, sp.load_npz(graph_dir(name) / "adj_csr.npz"), pattern)


@pytest.mark.gpu
def test_hub_on_gpu(xp):
    for pattern in PATTERNS:
        check(xp, star(5000), pattern)
        check(xp, sp.random_array((16 * 301 + 7, 999), density=0.05, rng=np.random.default_rng(2)), pattern)


def test_bad_pattern():
    with pytest.raises(ValueError, match="1:M and 2:M"):
        _nm_group.group_slots(np.array([0]), np.array([0]), (1, 1), 16, (3, 4))
