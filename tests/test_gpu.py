"""GPU-only checks: SGT on real and large graphs, and TiledMatrix with device operands."""

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import DATA_DIRS

import tcgnn_py as tg
from tcgnn_py import _reference as ref
from tcgnn_py import _sgt

pytestmark = pytest.mark.gpu


def _all_graphs():
    names = set()
    for d in DATA_DIRS:
        if d.is_dir():
            names |= {p.name for p in d.iterdir() if (p / "adj_csr.npz").exists()}
    return sorted(names)


def assert_same_translation(A, tile_shape=(16, 8)):
    import cupy as cp

    A = sp.csr_array(A, dtype=np.float32)
    args = (A.data, A.indices.astype(np.int32), A.indptr.astype(np.int32))
    got = _sgt.translate_kernels(cp, *(cp.asarray(a) for a in args), A.shape, *tile_shape)
    want = ref.translate(*args, A.shape, *tile_shape)
    for key in want:
        np.testing.assert_array_equal(got[key].get(), want[key], err_msg=key)


@pytest.mark.parametrize("name", _all_graphs() or ["<no graphs found>"])
def test_sgt_real_graph_identical(name):
    if name.startswith("<"):
        pytest.skip(f"no graphs in {DATA_DIRS}")
    A = tg.load_graph(next(d / name for d in DATA_DIRS if (d / name).is_dir())).adj
    assert_same_translation(A)


@pytest.fixture(scope="module")
def power_law_1m():
    return tg.power_law_graph(1_000_000, 16_000_000, seed=0)


def test_sgt_power_law_1m_identical(power_law_1m):
    assert power_law_1m.nnz == 16_000_000
    assert_same_translation(power_law_1m)


def test_sgt_power_law_tile_shapes():
    A = tg.power_law_graph(20_000, 200_000, seed=3)
    for tile_shape in [(16, 16), (8, 8), (32, 4)]:
        assert_same_translation(A, tile_shape)


def test_device_operands_and_types():
    import cupy as cp
    import cupyx.scipy.sparse as csp

    g = tg.load_cora()
    T = tg.TiledMatrix(g.adj)
    assert T.device == "cuda"
    rng = np.random.default_rng(0)
    X = rng.integers(-8, 9, (2708, 33)).astype(np.float32)
    want = g.adj @ X
    Yd = T @ cp.asarray(X)
    assert isinstance(Yd, cp.ndarray) and Yd.shape == want.shape
    np.testing.assert_array_equal(Yd.get(), want)
    Yh = T @ X
    assert isinstance(Yh, np.ndarray)
    np.testing.assert_array_equal(Yh, want)
    L = cp.asarray(X.T)
    R = L @ T  # CuPy must defer to TiledMatrix.__rmatmul__
    assert isinstance(R, cp.ndarray)
    np.testing.assert_array_equal(R.get(), X.T @ g.adj)
    from numba import cuda

    Yn = T @ cuda.to_device(X)  # any __cuda_array_interface__ producer
    assert isinstance(Yn, cp.ndarray)
    np.testing.assert_array_equal(Yn.get(), want)
    out = cp.full((2708, 33), cp.nan, cp.float32)
    assert tg.spmm(T, cp.asarray(X), out=out) is out
    np.testing.assert_array_equal(out.get(), want)
    Tc = tg.TiledMatrix(csp.csr_matrix(cp.asarray(g.adj.toarray())))
    np.testing.assert_array_equal(Tc.block_cols.get(), T.block_cols.get())


def test_end_to_end_unsorted_duplicates_on_gpu():
    import cupy as cp

    rng = np.random.default_rng(5)
    n, m, k = 3001, 2000, 40_000
    rows = np.sort(rng.integers(0, n, k))
    cols = rng.integers(0, m, k).astype(np.int32)  # unsorted within rows, with repeats
    vals = rng.integers(-4, 5, k).astype(np.float32)  # explicit zeros included
    indptr = np.searchsorted(rows, np.arange(n + 1)).astype(np.int32)
    C = sp.csr_array((vals, cols, indptr), shape=(n, m))
    C.sum_duplicates()
    for arrays in [(vals, cols, indptr), tuple(cp.asarray(a) for a in (vals, cols, indptr))]:
        T = tg.TiledMatrix(arrays, shape=(n, m))
        T.check_format(full_check=True)
        R = T.tocsr()
        np.testing.assert_array_equal(R.indptr, C.indptr)
        np.testing.assert_array_equal(R.indices, C.indices)
        np.testing.assert_array_equal(R.data, C.data)
        np.testing.assert_array_equal(T.T.toarray(), C.toarray().T)
