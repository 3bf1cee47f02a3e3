"""Row partitions and halos on the reference path: several simulated parts, exact on integers."""

import pathlib

import numpy as np
import pytest
import scipy.sparse as sp

from _dist_cases import int_graph
from _zoo import star
import tcgnn_py as tg
from tcgnn_py.distributed import _partition as part


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("A", [int_graph(200, 0.05, 1), tg.power_law_graph(500, 4000, seed=3), star(300)],
                         ids=["uniform", "power-law", "star"])
def test_spmm_by_parts_equals_whole(A, parts):
    A = sp.csr_array(A)
    P = part.plan(A, parts)
    X = np.random.default_rng(0).integers(-8, 9, (A.shape[0], 5)).astype(np.float64)
    Xs = [X[P.bounds[p]:P.bounds[p + 1]] for p in range(P.parts)]
    Y = np.concatenate(part.spmm_reference(P, Xs), axis=0)
    np.testing.assert_array_equal(Y, A @ X)
    # The transpose (backward passes) through a plan of Aᵀ on the same bounds.
    Pt = part.plan(A.T, bounds=P.bounds)
    np.testing.assert_array_equal(np.concatenate(part.spmm_reference(Pt, Xs), axis=0), A.T @ X)


def test_halo_and_sends_are_consistent():
    A = int_graph(300, 0.03, 2)
    P = part.plan(A, 4)
    for p in range(4):
        lo, hi = P.bounds[p], P.bounds[p + 1]
        cols = A[lo:hi].indices
        want = np.unique(cols[(cols < lo) | (cols >= hi)])
        np.testing.assert_array_equal(P.halo[p], want)  # exactly the columns it reads and does not own
        assert P.local[p].shape == (hi - lo, (hi - lo) + want.shape[0])
        for q in range(4):
            got = P.sends[q][p]
            assert (got >= 0).all() and (got < P.bounds[q + 1] - P.bounds[q]).all()
            np.testing.assert_array_equal(got + P.bounds[q], want[(want >= P.bounds[q]) & (want < P.bounds[q + 1])])
    assert P.halo_rows().sum() == sum(h.shape[0] for h in P.halo)


def test_bounds_balance_nonzeros():
    A = tg.power_law_graph(2000, 40000, seed=1)
    for parts in (2, 4, 8):
        b = part.balanced_bounds(A.indptr, parts)
        assert b[0] == 0 and b[-1] == A.shape[0] and (np.diff(b) >= 0).all()
        per = np.diff(A.indptr[b])
        # Each part is within one row's entries of its share.
        assert per.max() - A.nnz / parts <= np.diff(A.indptr).max()
    # A hub row larger than a share leaves a part empty, and the plan still multiplies correctly.
    S = sp.csr_array(star(50))
    b = part.balanced_bounds(S.indptr, 8)
    assert (np.diff(b) == 0).any()
    P = part.plan(S, bounds=b)
    X = np.arange(51.0)[:, None]
    np.testing.assert_array_equal(np.concatenate(part.spmm_reference(P, [X[b[p]:b[p + 1]] for p in range(8)])), S @ X)


def test_bad_input():
    with pytest.raises(ValueError, match="square"):
        part.plan(sp.csr_array((3, 4)))
    with pytest.raises(ValueError, match="parts must be"):
        part.balanced_bounds(np.array([0, 1]), 0)
    with pytest.raises(ValueError, match="bounds must rise"):
        part.plan(sp.csr_array((4, 4)), bounds=[0, 3, 2, 4])


def test_doctests_that_need_pymetis_skip_without_it():
    """Where the partition extra is missing, the doctests that run METIS skip with the reason (as the tests do)."""
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    code = ("import sys; sys.modules['pymetis'] = None; import pytest; "  # an import of pymetis now fails
            "sys.exit(pytest.main(['-q', '-rs', '-p', 'no:xdist', "
            "'tcgnn_py/distributed/_partition.py::tcgnn_py.distributed._partition.partition', "
            "'tcgnn_py/distributed/_nn.py::tcgnn_py.distributed._nn.train']))")
    run = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "2 skipped" in run.stdout and "needs pymetis (the partition extra)" in run.stdout, run.stdout[-2000:]
