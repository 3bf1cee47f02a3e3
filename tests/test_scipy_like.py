"""scipy.sparse users' habits on a TiledMatrix: scipy's operators with scipy on the left, elementwise arithmetic,
reductions, row slices, pickling.  Exact on small integers; on the host and, with a GPU, on the device.

Each test failed before its fix: ``B @ T`` raised, pickling after a transpose raised, and the methods were missing.
"""

import copy
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from _env import GPU

import tcgnn_py as tg

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
#: Every scipy format, as arrays and as matrices.
FORMATS = [sp.csr_array, sp.csc_array, sp.coo_array, sp.bsr_array, sp.dia_array, sp.dok_array, sp.lil_array,
           sp.csr_matrix, sp.csc_matrix, sp.coo_matrix, sp.bsr_matrix, sp.dia_matrix, sp.dok_matrix, sp.lil_matrix]


def _int_matrix(m, n, density=0.3, seed=0):
    rng = np.random.default_rng(seed)
    A = sp.random_array((m, n), density=density, format="csr", dtype=np.float32, rng=rng)
    A.data[:] = rng.integers(-8, 9, A.nnz)
    return A


def host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.__name__)
def test_scipy_on_the_left_reaches_rmatmul(fmt, device):
    A = _int_matrix(13, 9, seed=1)
    T = tg.TiledMatrix(A, device=device)
    B = fmt(_int_matrix(5, 13, seed=2).toarray())
    for P in (B @ T, T.__rmatmul__(B)):
        assert sp.issparse(P) and np.array_equal(P.toarray(), B.toarray() @ A.toarray())
    if isinstance(B, sp.spmatrix):  # scipy's matrices multiply matrices with *
        assert np.array_equal((B * T).toarray(), B.toarray() @ A.toarray())
    with pytest.raises(ValueError, match="dimension mismatch"):
        fmt(np.ones((2, 4), np.float32)) @ T


def test_only_scipys_product_gets_the_object_array():
    T = tg.TiledMatrix(_int_matrix(4, 4), device="cpu")
    for convert in (np.asarray, np.array, np.asanyarray, lambda t: np.asarray(t, dtype=np.float32)):
        with pytest.raises(TypeError, match=r"use T.toarray\(\)"):
            convert(T)
    with pytest.raises(ValueError, match="unrecognized csr_array constructor input"):
        sp.csr_array(T)


@pytest.mark.parametrize("device", DEVICES)
def test_pickle_round_trips_without_caches(device):
    A = _int_matrix(40, 30, seed=3)
    T = tg.TiledMatrix(A, device=device)
    xp = np if device == "cpu" else __import__("cupy")
    X = xp.asarray(np.random.default_rng(0).integers(-8, 9, (30, 4)).astype(np.float32))
    Y = xp.asarray(np.random.default_rng(1).integers(-8, 9, (5, 40)).astype(np.float32))
    Z = xp.asarray(np.ones((40, 4), np.float32))
    T @ X, T.T, Y @ T, tg.sddmm(T.T, X, Z)  # the transpose (and its weak reference back), plans and launches
    for fresh in (pickle.loads(pickle.dumps(T)), copy.deepcopy(T)):
        assert fresh.tiling._cache == {"bound": {}} and fresh._transpose is None  # caches rebuild where used
    for back in (pickle.loads(pickle.dumps(T)), copy.deepcopy(T), pickle.loads(pickle.dumps(T.T)).T):
        assert back.device == device and back.shape == T.shape and back.layout == T.layout
        assert (back.tocsr() != A).nnz == 0
        np.testing.assert_array_equal(host(back @ X), host(T @ X))
        np.testing.assert_array_equal(host(Y @ back), host(Y @ T))
    pair = pickle.loads(pickle.dumps([T, T.with_values(np.ones(T.nnz, np.float32))]))
    assert pair[0].tiling is pair[1].tiling  # matrices that shared a tiling still do


@pytest.mark.parametrize("device", DEVICES)
def test_elementwise_arithmetic_is_scipys(device):
    A, B = _int_matrix(12, 10, seed=4), _int_matrix(12, 10, seed=5)
    T, S = tg.TiledMatrix(A, device=device), tg.TiledMatrix(B, device=device)
    cases = [(T + S, A + B), (T - S, A - B), (T + B, A + B), (B + T, B + A), (B - T, B - A), (T - B, A - B),
             (T.multiply(S), A.multiply(B)), (T.multiply(B), A.multiply(B)), (T * S, A.multiply(B)),
             (abs(T), abs(A)), (T ** 2, A.power(2)), (T.power(3), A.power(3)), (T + 0, A), (0 - T, -A)]
    for got, want in cases:
        assert isinstance(got, tg.TiledMatrix) and got.device == device and got.layout == T.layout
        np.testing.assert_array_equal(got.toarray(), want.toarray())
    D = np.random.default_rng(6).integers(-8, 9, (12, 10)).astype(np.float32)
    xp = np if device == "cpu" else __import__("cupy")
    for d in (D, D[:1], D[:, :1], np.float32(3)):
        got = T.multiply(xp.asarray(d))
        assert got.tiling is T.tiling  # the same stored entries, as scipy's multiply keeps them
        np.testing.assert_array_equal(got.toarray(), A.multiply(d).toarray())
    assert (T.astype(np.float16) + S).dtype == np.float32 and (T.astype(np.float16) - T.astype(np.float16)).dtype == np.float16
    with pytest.raises(NotImplementedError, match="zero power"):
        T ** 0
    with pytest.raises(NotImplementedError, match="nonzero scalar"):
        T + 1
    with pytest.raises(TypeError, match=r"write it densely, e.g. T.toarray\(\) \+ X"):
        T + D
    with pytest.raises(ValueError, match="inconsistent shapes"):
        T + _int_matrix(3, 3)
    with pytest.raises(ValueError, match="does not broadcast"):
        T.multiply(np.ones((3, 3)))


@pytest.mark.parametrize("device", DEVICES)
def test_reductions_are_scipys(device):
    A = _int_matrix(12, 10, seed=7)
    A.data[:3] = 0  # stored zeros
    T = tg.TiledMatrix(A, device=device)
    assert T.count_nonzero() == A.count_nonzero() < T.nnz
    for axis in (None, 0, 1):
        np.testing.assert_array_equal(np.asarray(T.count_nonzero(axis=axis)), np.asarray(A.count_nonzero(axis=axis)))
        for name in ("max", "min", "mean", "sum"):
            got, want = getattr(T, name)(axis=axis), getattr(A, name)(axis=axis)
            got, want = (x.toarray() if sp.issparse(x) else np.asarray(x) for x in (got, want))
            np.testing.assert_array_equal(got, want, err_msg=f"{name}(axis={axis})")


@pytest.mark.parametrize("device", DEVICES)
def test_eliminate_zeros_in_place_keeps_the_others(device):
    A = _int_matrix(20, 20, seed=8)
    A.data[::3] = 0
    T = tg.TiledMatrix(A, device=device)
    V = T.with_values(np.arange(1, T.nnz + 1, dtype=np.float32))  # shares T's tiling
    T.eliminate_zeros()
    want = A.copy()
    want.eliminate_zeros()
    assert T.nnz == want.nnz and (T.tocsr() != want).nnz == 0 and T.tocsr().nnz == want.nnz
    assert V.nnz == A.nnz  # the matrix that shared the old tiling keeps it
    X = np.ones((20, 3), np.float32)
    np.testing.assert_array_equal(host(T @ X), want @ X)
    nnz = T.nnz
    T.eliminate_zeros()  # nothing to drop
    assert T.nnz == nnz


@pytest.mark.parametrize("device", DEVICES)
def test_row_slices_are_new_matrices(device):
    A = _int_matrix(37, 11, seed=9)
    T = tg.TiledMatrix(A, device=device, layout="tcgnn")
    rows = np.arange(37)
    for key in (slice(3, 20), slice(None, 5), slice(30, None), slice(5, 5), slice(20, 3), slice(None, None, -1),
                slice(2, 30, 4), slice(-4, None), (slice(1, 9), slice(None))):
        R = T[key]
        k = key[0] if isinstance(key, tuple) else key
        want = A[rows[k]]
        assert isinstance(R, tg.TiledMatrix) and R.layout == T.layout and R.device == device
        assert R.shape == want.shape and (R.tocsr() != want).nnz == 0, key
    for key in (0, [1, 2], (slice(0, 2), 1), (1, slice(None))):
        with pytest.raises(TypeError, match=r"row slices only, T\[i:j\].*T.tocsr\(\)\[\.\.\.\]"):
            T[key]


def test_issparse_knows_the_tiled_matrix():
    A = _int_matrix(3, 3)
    assert tg.issparse(tg.TiledMatrix(A)) and tg.issparse(A) and tg.issparse(sp.csr_matrix(A))
    assert not tg.issparse(A.toarray()) and not tg.issparse([[1]]) and not tg.issparse(None)
    if GPU:
        import cupyx.scipy.sparse as csp

        assert tg.issparse(csp.csr_matrix(A))


def test_permutations_compare_by_value():
    p, q = tg.Permutation([2, 0, 1]), tg.Permutation(np.array([2, 0, 1]))
    assert p == q and not p != q and p != tg.Permutation([0, 1, 2]) and p != tg.Permutation([1, 0])
    assert (p == [2, 0, 1]) is False  # an array-like is not a Permutation (no elementwise answer)
    assert hash(p) == hash(q)


def test_load_graph_finds_cora_and_upper_case_suffixes(tmp_path):
    assert tg.load_graph("cora").adj.nnz == tg.load_cora().adj.nnz
    A = _int_matrix(6, 6)
    with open(tmp_path / "G.NPZ", "wb") as f:  # (scipy would append ".npz" to the name)
        sp.save_npz(f, A)
    assert (tg.load_graph(tmp_path / "G.NPZ").adj != A).nnz == 0
    (tmp_path / "damaged.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="is not a graph archive") as e:
        tg.load_graph(tmp_path / "damaged.npz")
    assert "allow_pickle" not in str(e.value)
    folder = tmp_path / "g"
    folder.mkdir()
    (folder / "adj_csr.npz").write_bytes(b"\x80\x04K\x01.")  # a pickle, which np.load would refuse by name
    with pytest.raises(ValueError, match="g/adj_csr.npz is not a graph archive") as e:
        tg.load_graph(folder)
    assert "allow_pickle" not in str(e.value)
