"""The N:M window grouping's reference (issue 19): lossless, every group conforms, padding counted, deterministic."""

import numpy as np
import pytest
import scipy.sparse as sp

from _zoo import star
from tcgnn_py.tiles import _nm_windows as nw

PATTERNS = [(2, 4), (1, 2)]


def groups_of(A, pattern, window=16, max_open=nw.MAX_OPEN):
    A = sp.csr_array(A)
    r, c = A.nonzero()
    g = nw.nm_groups(r, c, A.shape, window, pattern, max_open)
    nw.check_groups(g, r, c, A.shape)
    return g


def test_hand_examples():
    # 2:4, three columns that each hold rows 0-2: two fit one group (rows at 2), the third opens another.
    assert nw.group_columns(np.array([0b111, 0b111, 0b111], np.uint32), 2, 4).tolist() == [0, 1, -1, -1,
                                                                                           2, -1, -1, -1]
    # 1:2: column 1 conflicts with column 0 (row 0) and opens a group; column 2 (row 1) completes the first.
    assert nw.group_columns(np.array([1, 1, 2], np.uint32), 1, 2).tolist() == [0, 2, 1, -1]
    # Disjoint rows fill groups in order, no padding.
    assert nw.group_columns(np.array([1, 2, 4, 8, 16, 32, 64, 128], np.uint32), 1, 2).tolist() == list(range(8))
    # One open group: first fit degenerates to closing the group at the first conflict.
    assert nw.group_columns(np.array([1, 1, 2], np.uint32), 1, 2, max_open=1).tolist() == [0, -1, 1, 2]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("shape", [(100, 90), (16 * 7 + 5, 300), (33, 2000)])
def test_random_matrices_group_losslessly(pattern, shape):
    rng = np.random.default_rng(sum(shape))
    A = sp.random_array(shape, density=0.15, rng=rng, format="csr")
    g = groups_of(A, pattern)
    m = pattern[1]
    assert g["slots"] == g["columns"] + g["padding"] and g["slots"] % m == 0
    assert 0 <= g["rounding"] <= g["padding"] and g["windows"] == -(-shape[0] // 16)
    assert g["columns"] + g["rounding"] <= g["bound"] <= g["slots"]
    assert g["windows_unpadded"] <= g["windows"]
    again = groups_of(A, pattern)
    assert all(np.array_equal(g[k], again[k]) for k in ("slot_ptr", "slot_cols", "slot_masks"))


@pytest.mark.parametrize("pattern", PATTERNS)
def test_hub_and_empty_windows(pattern):
    A = sp.lil_array(star(3000))
    A[40:80, :] = 0  # empty windows in the middle
    g = groups_of(A.tocsr(), pattern)
    assert g["slot_ptr"][3] == g["slot_ptr"][5]  # windows 3 and 4 (rows 48-79) hold no slot
    # The hub row 0 holds 3000 entries of its window's 3001 columns: any conforming grouping needs
    # 3000 / N groups there, half of their slots padding, and the greedy one meets that bound.
    n, m = pattern
    assert g["slot_ptr"][1] == m * 3000 // n
    assert g["slots"] == g["bound"] >= g["columns"] + g["rounding"]


def test_dense_window_pads_to_the_bound():
    # A dense 16 x 8 block: every column holds all 16 rows, so a 2:4 group takes two columns and 1:2 one.
    A = np.ones((16, 8))
    for pattern in PATTERNS:
        g = groups_of(A, pattern)
        assert g["padding"] == 8 and g["slots"] == g["bound"] == 16


def test_check_groups_catches_errors():
    A = sp.random_array((40, 60), density=0.3, rng=np.random.default_rng(1), format="csr")
    r, c = A.nonzero()
    g = nw.nm_groups(r, c, A.shape, 16, (2, 4))
    bad = dict(g, slot_cols=g["slot_cols"].copy())
    real = np.flatnonzero(bad["slot_cols"] >= 0)
    bad["slot_cols"][real[1]] = bad["slot_cols"][real[0]]  # a column repeated, another lost
    with pytest.raises(AssertionError, match="lost or repeated"):
        nw.check_groups(bad, r, c, A.shape)
    # Three columns sharing row 0 in one 2:4 group do not conform.
    B = sp.csr_array(np.array([[1, 1, 1, 0]] + [[0] * 4] * 15))
    rb, cb = B.nonzero()
    g = {"pattern": (2, 4), "window": 16, "slot_ptr": np.array([0, 4]), "slot_cols": np.array([0, 1, 2, -1]),
         "slot_masks": np.array([1, 1, 1, 0], np.uint32)}
    with pytest.raises(AssertionError, match="more than 2 entries"):
        nw.check_groups(g, rb, cb, B.shape)


def test_bad_arguments():
    with pytest.raises(ValueError, match="1 <= N < M"):
        nw.group_columns(np.array([1], np.uint32), 2, 2)
    with pytest.raises(ValueError, match="window must be 1..32"):
        nw.window_columns(np.array([0]), np.array([0]), 1, 64)
