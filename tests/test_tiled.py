"""TiledMatrix semantics against scipy: on the reference path, and on the GPU where one is usable."""

import numpy as np
import pytest
import scipy.sparse as sp
from _env import GPU, graph_dir
from _zoo import raw_with_duplicates, star, zoo

import tcgnn_py as tg

ZOO = zoo("full")


TILES = [(16, 8), (16, 16), (8, 8), (32, 4), (1, 1)]


def canonical(A):
    A = sp.csr_array(A, copy=True)
    A.sum_duplicates()
    return A


@pytest.fixture(params=sorted(ZOO))
def named(request):
    return request.param, ZOO[request.param]


def brute_force_blocks(A, H, W):
    """Non-empty H x W tiles of A (TC-GNN's count without condensing)."""
    coo = A.tocoo()
    return len(set(zip((coo.row // H).tolist(), (coo.col // W).tolist())))


def test_roundtrip_and_product(named):
    name, A = named
    T = tg.TiledMatrix(A, dtype=np.float64)
    T.check_format(full_check=True)
    C = canonical(A)
    R = T.tocsr()
    assert isinstance(R, sp.csr_array) and R.shape == A.shape
    np.testing.assert_array_equal(R.indptr, C.indptr)
    np.testing.assert_array_equal(R.indices, C.indices)
    np.testing.assert_array_equal(R.data, C.data)
    rng = np.random.default_rng(0)
    for X in (rng.standard_normal((A.shape[1], 3)), rng.standard_normal(A.shape[1]),
              rng.standard_normal((A.shape[1], 1))):
        Y = T @ X
        assert isinstance(Y, np.ndarray) and Y.shape == (A @ X).shape and Y.dtype == np.float64
        np.testing.assert_allclose(Y, A @ X, rtol=1e-12, atol=1e-12)
    Xl = rng.standard_normal((2, A.shape[0]))
    np.testing.assert_allclose(Xl @ T, Xl @ A, rtol=1e-12, atol=1e-12)
    assert (Xl @ T).shape == (2, A.shape[1])


@pytest.mark.parametrize("tile_shape", TILES)
def test_tile_shapes_and_stats(tile_shape):
    A = ZOO["n16k1"]
    H, W = tile_shape
    T = tg.TiledMatrix(A, tile_shape=tile_shape)
    T.check_format(full_check=True)
    assert T.block_cols.shape[1] == W and T.win_ptr.shape[0] == -(-A.shape[0] // H) + 1
    s = T.tile_stats()
    assert s.blocks_before == brute_force_blocks(A, H, W)
    assert s.blocks == T.block_cols.shape[0] <= s.blocks_before
    assert s.nnz == A.nnz and 0 < s.density <= 1
    np.testing.assert_array_equal(T.toarray(), A.toarray().astype(np.float32))


def test_star_hub_translates_without_rescans():
    A = star(100_000)
    T = tg.TiledMatrix(A, layout="tcgnn")
    s = T.tile_stats()
    # The hub's window holds columns 0..100000: 12,501 blocks of 8.
    assert s.max_blocks_per_window == -(-100_001 // 8)
    x = np.arange(A.shape[1], dtype=np.float64) % 7 - 3
    np.testing.assert_array_equal(T.astype(np.float64) @ x, A @ x)


def test_raw_arrays_duplicates_unsorted_explicit_zeros():
    rng = np.random.default_rng(3)
    arrays, shape = raw_with_duplicates(rng)
    A = sp.csr_array(arrays, shape=shape)
    T = tg.TiledMatrix(arrays, shape=shape)
    C = canonical(A)
    assert T.nnz == C.nnz  # explicit zeros are kept
    np.testing.assert_array_equal(T.tocsr().data, C.data.astype(np.float32))
    np.testing.assert_array_equal(T.tocsr().indices, C.indices)
    X = rng.integers(-8, 9, (shape[1], 4)).astype(np.float32)
    np.testing.assert_array_equal(T @ X, (A @ X).astype(np.float32))


@pytest.mark.parametrize("name", ["cora", "citeseer", "email_eu_core", "ss_1138_bus", "polblogs"])
def test_shared_graphs(name):
    g = tg.load_graph(graph_dir(name))
    A = g.adj
    T = tg.TiledMatrix(A, layout="tcgnn")  # the paper's format (Fig. 7a counts 16 x 8 tiles)
    T.check_format(full_check=True)
    assert (T.tocsr() != A).nnz == 0
    X = np.random.default_rng(1).integers(-8, 9, (A.shape[1], 16)).astype(np.float32)
    np.testing.assert_array_equal(T @ X, A @ X)
    np.testing.assert_array_equal(T.T @ X, A.T @ X)  # directed graphs: Aᵀ != A
    assert T.tile_stats().blocks_before == brute_force_blocks(A, 16, 8)


def test_protocol():
    A = ZOO["n17"]
    T = tg.TiledMatrix(A)
    assert (T.shape, T.nnz, T.ndim, T.format, T.dtype) == (A.shape, A.nnz, 2, "tiled", A.dtype)
    assert "TiledMatrix" in repr(T) and "17, 17" in repr(T)
    assert T.T.T is T
    np.testing.assert_array_equal(T.T.toarray(), A.toarray().T.astype(np.float32))
    C = T.copy()
    assert C is not T and np.array_equal(C.toarray(), T.toarray())
    assert T.astype(np.float64).dtype == np.float64
    assert tg.TiledMatrix(A, dtype=np.int8).dtype == np.float32  # exact promotion
    assert tg.TiledMatrix(A.astype(np.int64)).dtype == np.float64
    assert tg.TiledMatrix(T, tile_shape=(8, 8)).tile_shape == (8, 8)
    assert tg.TiledMatrix(sp.coo_matrix(A)).nnz == A.nnz


def test_what_a_tiling_caches_holds_device_data_or_not():
    """Cached values that may hold device data wait for their stream when cached: host values (numbers, NumPy arrays,
    and tuples, named tuples, lists, dicts and dataclasses of them) do not; any other object counts as device data."""
    import dataclasses
    from typing import NamedTuple

    from tcgnn_py.tiles._tiling import _holds_device

    class Counts(NamedTuple):
        units: int
        sizes: tuple

    @dataclasses.dataclass
    class Plan:
        rows: np.ndarray
        n: int

    device = object()
    host = [None, True, 3, 2.5, "name", b"x", np.arange(3), np.int32(1), (1, np.zeros(2)), [1, 2], {"a": (1, 2)},
            Counts(4, (16, 32)), Plan(np.arange(2), 1), {"units": 3, "n_slots": 0, "rows": np.zeros((2, 4))}]
    held = [device, (1, device), [device], {"units": device}, Counts(1, (device,)), Plan(device, 1), {"a": {"b": device}}]
    assert [_holds_device(v) for v in host] == [False] * len(host)
    assert [_holds_device(v) for v in held] == [True] * len(held)


def test_with_values_keeps_tiling():
    A = ZOO["n16k1"]
    T = tg.TiledMatrix(A)
    v = np.arange(1, T.nnz + 1, dtype=np.float32)
    V = T.with_values(v)
    assert V.block_cols is T.block_cols and V.tile_pos is T.tile_pos
    np.testing.assert_array_equal(V.tocsr().data, v)
    B = sp.csr_array((v, A.indices, A.indptr), shape=A.shape)
    np.testing.assert_array_equal(V.toarray(), B.toarray())
    with pytest.raises(ValueError, match="values must have shape"):
        T.with_values(v[:-1])


def test_pickle_round_trip():
    # The tiling keeps its array module, which does not pickle: the copy decides it again.
    import pickle

    A = sp.random(40, 30, density=0.2, format="csr", dtype=np.float32, random_state=3)
    T = tg.TiledMatrix(A, device="cpu")
    X = np.arange(60, dtype=np.float32).reshape(30, 2) % 7
    U = pickle.loads(pickle.dumps(T))
    assert U.tiling.xp is np and U.tiling.device == "cpu"
    np.testing.assert_array_equal(U @ X, T @ X)


def test_spmm_out():
    A = ZOO["n17"].astype(np.float32)
    T = tg.TiledMatrix(A)
    X = np.ones((17, 4), np.float32)
    out = np.full((17, 4), np.nan, np.float32)
    assert tg.spmm(T, X, out=out) is out
    np.testing.assert_array_equal(out, (A @ X).astype(np.float32))
    with pytest.raises(ValueError, match="out has shape"):
        tg.spmm(T, X, out=np.empty((17, 3), np.float32))
    with pytest.raises(ValueError, match="out has dtype"):
        tg.spmm(T, X, out=np.empty((17, 4), np.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        tg.spmm(T, X, out=np.empty((4, 17), np.float32).T)
    with pytest.raises(TypeError):
        tg.spmm(A, X)


def _scipy_error(fn):
    with pytest.raises(Exception) as info:
        fn()
    return info.type, str(info.value)


@pytest.mark.parametrize(
    "operand",
    [np.ones((4, 2)), np.ones(4), np.ones((4, 1)), 3, np.float32(2.0)],
    ids=["2d", "1d", "col", "int", "npscalar"],
)
def test_matmul_errors_match_scipy(operand):
    A = sp.csr_array(np.eye(3))
    T = tg.TiledMatrix(A)
    assert _scipy_error(lambda: T @ operand) == _scipy_error(lambda: A @ operand)


@pytest.mark.parametrize("operand", [np.ones((2, 4)), np.ones(4), 3], ids=["2d", "1d", "scalar"])
def test_rmatmul_errors_match_scipy(operand):
    A = sp.csr_array(np.ones((3, 5)))
    T = tg.TiledMatrix(A)
    assert _scipy_error(lambda: operand @ T) == _scipy_error(lambda: operand @ A)


BAD = {
    "indices_high": ((np.ones(2), np.array([0, 5]), np.array([0, 1, 2])), (2, 3)),
    "indices_negative": ((np.ones(2), np.array([0, -1]), np.array([0, 1, 2])), (2, 3)),
    "indptr_start": ((np.ones(2), np.array([0, 1]), np.array([1, 1, 2])), (2, 3)),
    "indptr_decreasing": ((np.ones(2), np.array([0, 1]), np.array([0, 2, 1])), (2, 3)),
    "indptr_size": ((np.ones(2), np.array([0, 1]), np.array([0, 1])), (2, 3)),
    "data_size": ((np.ones(3), np.array([0, 1]), np.array([0, 1, 2])), (2, 3)),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_arrays_match_scipy(case):
    arrays, shape = BAD[case]
    want = _scipy_error(lambda: sp.csr_array(arrays, shape=shape).check_format(full_check=True))
    assert _scipy_error(lambda: tg.TiledMatrix(arrays, shape=shape)) == want


#: Index pointers whose ends are wrong, which a build from int32 device arrays leaves to the translation's check
#: kernel (nothing read back before it): scipy's error all the same, and a last pointer below the entries' count
#: keeps the entries before it, as scipy's ``check_format`` prunes them.
ENDS = {
    "indptr_end_high": ((np.ones(2), np.array([0, 1]), np.array([0, 1, 3])), (2, 3)),
    "indptr_end_high_empty": ((np.ones(0), np.array([], int), np.array([0, 0, 1])), (2, 3)),
    "indptr_start_empty": ((np.ones(0), np.array([], int), np.array([1, 0, 0])), (2, 3)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(set(BAD) - {"indptr_size", "data_size"}) + sorted(ENDS))
def test_malformed_device_arrays_match_scipy(case):
    import cupy as cp

    arrays, shape = BAD.get(case) or ENDS[case]
    want = _scipy_error(lambda: sp.csr_array(arrays, shape=shape).check_format(full_check=True))
    dev = tuple(cp.asarray(a, t) for a, t in zip(arrays, (np.float32, np.int32, np.int32)))
    assert _scipy_error(lambda: tg.TiledMatrix(dev, shape=shape)) == want


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_device_arrays_past_the_last_pointer_are_left_out(dtype):
    # (an int64 value past the last pointer that no float type holds: cut before the values' range is checked)
    import cupy as cp

    data, indices, indptr = np.array([1, 2, 3, 2**60, 5], dtype), np.array([0, 2, 1, 7, 9]), np.array([0, 2, 3, 3])
    want = sp.csr_array((data, indices, indptr), shape=(3, 4))
    want.check_format(full_check=True)  # (scipy prunes the two entries past indptr[-1])
    dev = tuple(cp.asarray(a, t) for a, t in zip((data, indices, indptr), (dtype, np.int32, np.int32)))
    T = tg.TiledMatrix(dev, shape=(3, 4))
    assert T.nnz == 3
    np.testing.assert_array_equal(T.toarray(), want.toarray())


def test_type_errors():
    with pytest.raises(TypeError, match="for a dense array use scipy.sparse.csr_array"):
        tg.TiledMatrix(np.eye(3))
    with pytest.raises(TypeError, match="A must be a sparse matrix"):
        tg.TiledMatrix("A")
    with pytest.raises(TypeError, match="real numbers only"):
        tg.TiledMatrix(sp.csr_array(np.eye(3, dtype=np.complex64)))
    with pytest.raises(ValueError, match="power of two"):
        tg.TiledMatrix(sp.csr_array(np.eye(3)), tile_shape=(12, 8))
    with pytest.raises(ValueError, match="int32"):
        tg.TiledMatrix((np.ones(0), np.zeros(0, np.int32), np.zeros(1, np.int32)), shape=(0, 2**31))


def test_check_format_catches_corruption():
    T = tg.TiledMatrix(ZOO["n17"]).copy()
    if T.device == "cuda":
        pytest.skip("corrupts host arrays")
    T.tile_pos[1] = T.tile_pos[0]
    T.check_format()  # O(1) checks pass
    with pytest.raises(ValueError):
        T.check_format(full_check=True)


@pytest.mark.skipif(GPU, reason="checks the no-GPU fallback")
def test_no_gpu_warning_once():
    import subprocess
    import sys

    code = (
        "import warnings, numpy as np, scipy.sparse as sp, tcgnn_py as tg\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    tg.TiledMatrix(sp.eye(3)); tg.TiledMatrix(sp.eye(4))\n"
        "print(sum(issubclass(x.category, tg.NoGPUWarning) for x in w))"
    )
    env = dict(__import__("os").environ, TCGNN_PY_DEVICE="cpu")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "1"


def test_looking_for_numba_cuda_imports_no_numba():
    """The GPU probe finds Numba's CUDA target without importing Numba (~0.3 s), which a process whose graphs are
    translated on the host may never need."""
    import importlib.util
    import subprocess
    import sys

    code = "import sys, tcgnn_py._device as d\nprint(d._numba_cuda_found(), 'numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    installed = importlib.util.find_spec("numba") is not None
    assert out.stdout.split() == [str(installed), "False"], out.stdout + out.stderr


@pytest.mark.gpu
def test_a_small_graph_on_the_gpu_imports_no_numba():
    """A graph translated on the host and its products launch no Numba kernel, so they import no Numba."""
    import subprocess
    import sys

    code = ("import sys, numpy as np, scipy.sparse as sp, cupy as cp, tcgnn_py as tg\n"
            "A = sp.random(300, 300, density=0.02, format='csr', dtype=np.float32, random_state=0)\n"
            "T = tg.TiledMatrix(A, device='cuda')\n"
            "Y = T @ cp.ones((300, 64), np.float32); tg.sddmm(T, cp.ones((300, 8), np.float32), cp.ones((300, 8), "
            "np.float32))\n"
            "cp.cuda.Device().synchronize(); print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


@pytest.mark.gpu
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


@pytest.mark.gpu
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


# --- bad input and dtype rules (issue 14) -------------------------------------------------------


def test_duplicates_are_summed_in_the_value_dtype_for_every_format():
    rows, cols = np.array([0, 0]), np.array([1, 1])
    for vals, want in ((np.array([100, 100], np.int8), 200.0), (np.array([True, True]), 2.0)):
        forms = [
            sp.coo_array((vals, (rows, cols)), shape=(2, 2)),
            sp.coo_matrix((vals, (rows, cols)), shape=(2, 2)),
            sp.csr_array((vals, cols, np.array([0, 2, 2])), shape=(2, 2)),
            (vals, cols, np.array([0, 2, 2])),
        ]
        for A in forms:
            T = tg.TiledMatrix(A, shape=(2, 2)) if isinstance(A, tuple) else tg.TiledMatrix(A)
            assert T.toarray()[0, 1] == want, (type(A).__name__, vals.dtype)


def test_tile_shape_must_be_a_pair():
    with pytest.raises(TypeError, match="tile_shape must be a pair of ints"):
        tg.TiledMatrix(sp.eye_array(3, format="csr"), tile_shape=(16,))


def test_layout_argument():
    A = sp.random_array((37, 29), density=0.2, format="csr", dtype=np.float64, rng=np.random.default_rng(0))
    A.data[:] = np.random.default_rng(0).integers(1, 5, A.nnz)
    V = tg.TiledMatrix(A, layout="vector", device="cpu")
    assert V.layout == tg.Layout(8, 4) and V.layout.name == "vector" and V.tile_shape == (8, 4)
    assert tg.TiledMatrix(A, device="cpu").layout.name == "vector"  # the default
    assert tg.TiledMatrix(A, layout="tcgnn", device="cpu").tile_shape == (16, 8)
    assert tg.TiledMatrix(A, layout=tg.Layout(8, 4), tile_shape=(8, 4), device="cpu").tile_shape == (8, 4)
    assert tg.TiledMatrix(A, tile_shape=(32, 4), device="cpu").layout.name is None
    X = np.random.default_rng(0).integers(-8, 9, (29, 5)).astype(np.float64)
    np.testing.assert_array_equal(V @ X, A @ X)
    assert (V.tocsr() != A).nnz == 0
    V.check_format(full_check=True)
    with pytest.raises(ValueError, match="layout must be one of"):
        tg.TiledMatrix(A, layout="flash", device="cpu")
    with pytest.raises(TypeError, match="layout must be a str"):
        tg.TiledMatrix(A, layout=(8, 4), device="cpu")
    with pytest.raises(ValueError, match="contradicts layout"):
        tg.TiledMatrix(A, layout="vector", tile_shape=(16, 8), device="cpu")


def test_device_argument():
    A = sp.eye_array(3, format="csr")
    assert tg.TiledMatrix(A, device="cpu").device == "cpu"
    with pytest.raises(ValueError, match="device must be None, 'cuda' or 'cpu'"):
        tg.TiledMatrix(A, device="gpu")
    if not GPU:
        with pytest.raises(RuntimeError, match="device='cuda'"):
            tg.TiledMatrix(A, device="cuda")


def test_len_points_to_real_attributes():
    with pytest.raises(TypeError, match=r"use \.nnz or \.shape\[0\]"):
        len(tg.TiledMatrix(sp.eye_array(3, format="csr")))


@pytest.mark.skipif(GPU, reason="checks the no-GPU warning")
def test_no_gpu_warning_points_at_the_callers_line(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "user.py"
    script.write_text(
        "import warnings, scipy.sparse as sp, tcgnn_py as tg\n"
        "warnings.simplefilter('always')\n"
        "A = tg.nn.gcn_norm(sp.eye_array(3, format='csr'))\n"
    )
    env = dict(__import__("os").environ, TCGNN_PY_DEVICE="cpu")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True, env=env)
    assert f"{script}:3: NoGPUWarning" in out.stderr, out.stderr


def test_the_transpose_keeps_no_map_back_until_asked():
    """``A.T`` keeps where its entries come from (``src``) on A's tiling; the inverse map on the transpose's
    side is made only when ``A.T.T`` is asked with A gone (4 bytes per entry a training step never reads)."""
    import gc

    rng = np.random.default_rng(3)
    A = sp.random_array((300, 200), density=0.05, rng=rng, format="csr")
    A.data[:] = rng.integers(-8, 9, A.nnz)
    T = tg.TiledMatrix(A, device="cpu")
    Tt = T.T
    assert Tt.tiling._cache["transpose"][1] is None and Tt.tiling.cache_nbytes() == 0
    before = Tt.tiling.cache_nbytes()
    del T
    gc.collect()
    back = Tt.T  # A, from its transpose: the map back is made now
    assert Tt.tiling.cache_nbytes() == before + 4 * A.nnz
    assert (back.tocsr() != sp.csr_array(A.astype(np.float32))).nnz == 0
    assert (Tt.tocsr() != sp.csr_array(A.T.astype(np.float32))).nnz == 0
    X = rng.integers(-8, 9, (200, 3)).astype(np.float32)
    np.testing.assert_array_equal(back @ X, A @ X)


@pytest.mark.parametrize("tile_shape", [(8, 4), (16, 8)])
def test_block_meta_is_what_planning_computes(tile_shape):
    # The translation's block metadata (the reference's, which the kernel's matches) stands in for what the products'
    # planning computes from the entries: the vector layout's (mask, first entry) pairs and the TF32 tiles' 4-word
    # masks, the same numbers.
    from tcgnn_py import _reference as ref
    from tcgnn_py.products import _plans

    T = tg.TiledMatrix(sp.csr_array(zoo("tiny")["n17"], dtype=np.float32), tile_shape=tile_shape, device="cpu")
    planned = _plans.vec_meta(T.tiling) if tile_shape == (8, 4) else _plans.tile_mask(T.tiling)
    assert T.tiling.peek("block_meta") is None  # (a host tiling: planning computed it)
    meta = ref.block_meta(T.tiling.block_ptr, T.tiling.tile_pos, *tg.tiles.block_meta_layout(*tile_shape))
    np.testing.assert_array_equal(planned, meta)


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["host", "kernels"])
def test_a_small_tiling_plans_from_what_its_translation_handed_over(where):
    # Translated on the host and uploaded, or by the kernels: the tiling holds its blocks' metadata and its window
    # pointers on the host, so planning its first product reads nothing back; the product is exact.
    import cupy as cp
    from tcgnn_py import _reference as ref

    A = ZOO["n16k1"].astype(np.float32)
    A.data[:] = np.arange(A.nnz) % 7 - 3
    with tg.tuning(sgt_host_max=A.nnz if where == "host" else -1):
        T = tg.TiledMatrix(A)
    t = T.tiling
    host = {k: cp.asnumpy(getattr(t, k)) for k in ("win_ptr", "block_ptr", "tile_pos")}
    np.testing.assert_array_equal(t.peek(("host", "win_ptr")), host["win_ptr"])
    assert isinstance(t.peek(("host", "win_ptr")), np.ndarray)
    meta = ref.block_meta(host["block_ptr"], host["tile_pos"], *tg.tiles.block_meta_layout(*t.tile_shape))
    np.testing.assert_array_equal(cp.asnumpy(t.peek("block_meta")), meta)
    X = np.arange(A.shape[1] * 8, dtype=np.float32).reshape(-1, 8) % 5 - 2
    np.testing.assert_array_equal(cp.asnumpy(T @ cp.asarray(X)), A @ X)


def test_a_cold_device_tilings_transpose_is_worked_out_on_the_host(monkeypatch):
    """While the SGT kernels have not run, a device tiling's transpose is made on the host, from one read of the
    structure, and uploaded with the derived data a host build hands over: the host transpose's arrays and map,
    counted as a cold build.  (NumPy stands in for CuPy here, so the branch runs without a GPU; the GPU suite runs
    it on a device.)"""
    import sys
    import types

    from tcgnn_py import _reference as ref
    from tcgnn_py.tiles import _sgt, _tiling

    fake = types.SimpleNamespace(asarray=np.asarray, ndarray=type("ndarray", (), {}))  # the upload
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(_sgt, "_RAN", [False])
    monkeypatch.setattr(_sgt, "_WARMING", {})
    monkeypatch.setattr(_tiling, "publish", lambda: None)
    rng = np.random.default_rng(5)
    A = sp.random_array((300, 200), density=0.05, rng=rng, format="csr", dtype=np.float32)
    T = tg.TiledMatrix(A, device="cpu")
    want_t, want_src = tg.tiles.Tiling.from_arrays(T.tiling.arrays(), T.shape, T.tiling.tile_shape)[0].transpose()
    device, _ = tg.tiles.Tiling.from_arrays(T.tiling.arrays(), T.shape, T.tiling.tile_shape)
    object.__setattr__(device, "xp", types.SimpleNamespace(asarray=lambda a: ("uploaded", a)))  # a device tiling
    got_t, got_src = device.transpose()
    assert got_src[0] == "uploaded" and np.array_equal(got_src[1], want_src)
    for k in ("win_ptr", "block_cols", "block_ptr", "tile_pos", "perm"):
        assert np.array_equal(getattr(got_t, k), getattr(want_t, k)), k
        assert getattr(got_t, k).dtype == getattr(want_t, k).dtype, k
    meta = ref.block_meta(want_t.block_ptr, want_t.tile_pos, *tg.tiles.block_meta_layout(*T.tiling.tile_shape))
    np.testing.assert_array_equal(got_t.peek("block_meta"), meta)
    assert np.array_equal(got_t.peek(("host", "win_ptr")), want_t.win_ptr)
    assert _sgt._WARMING["cold"] == 1 and device.transpose()[0] is got_t  # counted once, kept
