"""tcgnn_py.nn on the GPU, against the float64 reference path on the host.

float64 runs on CUDA cores and must agree with the host to rounding; float32
runs the TF32 tensor-core kernels and must agree within the TF32 tolerance.
Inputs are fresh random data in every test.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from test_nn import random_graph

from _env import cupy_fixture
import tcgnn_py as tg
from tcgnn_py.nn._edges import CSREdges

nn = tg.nn
pytestmark = pytest.mark.gpu
#: Relative error allowed per dtype on the device (float32 products use TF32 tensor cores).
TOL = {"float64": 1e-11, "float32": 5e-3}


cp = cupy_fixture()


@pytest.fixture
def rng():
    return np.random.default_rng()


def rel(a, b):
    a = a.get() if hasattr(a, "get") else np.asarray(a)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


def host_twin(build, A0):
    """The same graph on the host: the float64 matrix through scipy (``CSREdges``, tested in test_nn)."""
    return CSREdges(build(A0, dtype=np.float64).tocsr())


def test_preprocessing_on_device(rng):
    A0 = random_graph(rng, 333, density=0.02)
    M = A0.toarray() + np.eye(333)
    d = M.sum(axis=1)
    T = nn.gcn_norm(A0, dtype=np.float64)
    assert T.device == "cuda"
    np.testing.assert_allclose(T.toarray(), M / np.sqrt(d)[:, None] / np.sqrt(d)[None, :], rtol=1e-13)
    np.testing.assert_array_equal(nn.add_self_loops(A0, dtype=np.float64).toarray(), M)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [37, 1000, 4099])
def test_gcn_conv_on_device(cp, rng, dtype, n):
    A0 = random_graph(rng, n, density=min(0.12, 12 / n))
    A = nn.gcn_norm(A0, dtype=dtype)
    assert A.device == "cuda"
    Ah = host_twin(nn.gcn_norm, A0)
    for d_in, d_out in ((20, 7), (7, 20)):
        H, W, b = rng.standard_normal((n, d_in)), rng.standard_normal((d_in, d_out)), rng.standard_normal(d_out)
        g = rng.standard_normal((n, d_out))
        out, vjp = nn.gcn_conv(A, cp.asarray(H, dtype), cp.asarray(W, dtype), cp.asarray(b, dtype))
        want, vjp_h = nn.gcn_conv(Ah, H, W, b)
        assert isinstance(out, cp.ndarray) and out.dtype == dtype
        assert rel(out, want) < TOL[np.dtype(dtype).name]
        for got, exp in zip(vjp(cp.asarray(g, dtype)), vjp_h(g)):
            assert rel(got, exp) < TOL[np.dtype(dtype).name]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [37, 2051])
def test_agnn_conv_on_device(cp, rng, dtype, n):
    A0 = random_graph(rng, n, density=min(0.12, 10 / n))
    A = nn.add_self_loops(A0, dtype=dtype)
    Ah = host_twin(nn.add_self_loops, A0)
    H = rng.standard_normal((n, 16))
    H[3] = 0
    g = rng.standard_normal((n, 16))
    out, vjp = nn.agnn_conv(A, cp.asarray(H, dtype), cp.asarray([0.7], dtype))
    want, vjp_h = nn.agnn_conv(Ah, H, np.array([0.7]))
    assert out.dtype == dtype and rel(out, want) < TOL[np.dtype(dtype).name]
    (dH, dbeta), (dH_h, dbeta_h) = vjp(cp.asarray(g, dtype)), vjp_h(g)
    assert rel(dH, dH_h) < TOL[np.dtype(dtype).name]
    # dbeta = sum_e dz_e c_e cancels: its error is relative to sum_e |dz_e c_e|, not to the sum itself.
    # TF32 rounds each term by ~5e-4 relative: 1e-3 of the absolute sum.
    scale_tol = {np.float64: 1e-11, np.float32: 1e-3}[dtype]
    assert abs(float(dbeta[0]) - float(dbeta_h[0])) < scale_tol * _agnn_dbeta_scale(Ah.matrix, H, g, 0.7)


def _agnn_dbeta_scale(S, H, g, beta):
    """``sum_e |dz_e * c_e|`` of AGNN's beta gradient (edge-weighted softmax), in float64; every row has an entry."""
    rows = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr))
    cols = S.indices
    norm = np.linalg.norm(H, axis=1)
    Hn = H / np.where(norm > 0, norm, 1.0)[:, None]
    c = np.einsum("ij,ij->i", Hn[rows], Hn[cols])
    z = beta * c
    w = S.data * np.exp(z - np.maximum.reduceat(z, S.indptr[:-1])[rows])
    P = w / np.add.reduceat(w, S.indptr[:-1])[rows]
    dP = np.einsum("ij,ij->i", g[rows], H[cols])
    dz = P * (dP - np.add.reduceat(P * dP, S.indptr[:-1])[rows])
    return float(np.abs(dz * c).sum())


def test_cupyx_edges_match_tiled(cp, rng):
    import cupyx.scipy.sparse as csp

    A0 = random_graph(rng, 300, density=0.03)
    for A in (nn.gcn_norm(A0, dtype=np.float64), nn.add_self_loops(A0, dtype=np.float64)):
        C = CSREdges(csp.csr_matrix(A.tocsr()))
        H, g = cp.asarray(rng.standard_normal((300, 8))), cp.asarray(rng.standard_normal((300, 8)))
        o1, v1 = nn.agnn_conv(A, H, 1.1)
        o2, v2 = nn.agnn_conv(C, H, 1.1)
        assert rel(o1, o2.get()) < 1e-12
        for a, b in zip(v1(g), v2(g)):
            assert rel(a, b.get()) < 1e-12


def test_shared_tiling_transpose_on_device(cp, rng):
    A0 = random_graph(rng, 500, density=0.02)
    T = tg.TiledMatrix(A0.astype(np.float32))
    v = rng.standard_normal(A0.nnz).astype(np.float32)
    S = T.with_values(cp.asarray(v))
    want = sp.csr_array((v, A0.indices, A0.indptr), shape=A0.shape).T.toarray()
    np.testing.assert_array_equal(S.T.toarray(), want)
    assert S.T.tiling is T.T.tiling and S.T.T is S and S.T.T.tocsr().nnz == A0.nnz


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_kernel_matches_host(cp, rng, dtype):
    p0 = rng.standard_normal((300, 7)).astype(dtype)
    ph, pd = {"w": p0.copy()}, {"w": cp.asarray(p0)}
    oh = nn.Adam(ph, lr=0.02, weight_decay=0.01)
    od = nn.Adam(pd, lr=0.02, weight_decay=0.01)
    for _ in range(4):
        g = rng.standard_normal((300, 7)).astype(dtype)
        oh.step({"w": g})
        od.step({"w": cp.asarray(g)})
    np.testing.assert_allclose(pd["w"].get(), ph["w"], rtol=1e-5 if dtype == np.float32 else 1e-13, atol=1e-6)


def test_dropout_on_device(cp):
    H = cp.ones((1000, 50), cp.float32)
    out, vjp = nn.dropout(H, 0.3, cp.random.default_rng())
    vals = cp.unique(out).get()
    assert vals.tolist() == [0.0, np.float32(1 / 0.7)] and abs(float(out.mean()) - 1) < 0.02
    assert (vjp(H) == out).all()
    with pytest.raises(TypeError, match="cupy.random.Generator"):
        nn.dropout(H, 0.3, np.random.default_rng())


@pytest.mark.parametrize("model", ["gcn", "agnn"])
def test_cora_training_reaches_paper_accuracy(cp, model):
    g = tg.load_cora()
    X = g.features.toarray().astype(np.float32)
    X = cp.asarray(X / np.maximum(X.sum(axis=1, keepdims=True), 1))
    rng = cp.random.default_rng(0)
    if model == "gcn":
        A, apply, params = nn.gcn_norm(g.adj), nn.gcn_apply, nn.gcn_init((X.shape[1], 16, 7), rng)
        opt = nn.Adam(params, lr=0.01, weight_decay={"W0": 5e-4, "b0": 5e-4})
    else:
        A, apply, params = nn.add_self_loops(g.adj), nn.agnn_apply, nn.agnn_init((X.shape[1], 16, 7), rng)
        opt = nn.Adam(params, lr=0.01, weight_decay=5e-4)
    r = nn.train(apply, params, A, X, g.labels, (g.train_idx, g.val_idx, g.test_idx), opt, epochs=200, rng=rng)
    assert r.test_acc >= 0.80, r
