"""tcgnn_py.nn: every backward against central finite differences, in float64.

Graphs are small, random, directed and weighted (so A != Aᵀ and a wrong
transpose fails), with row counts that are not multiples of 16.  Without a GPU
this is the reference path; on a GPU machine the same checks run on the device
in float64 (CUDA cores).  ``test_nn_gpu.py`` adds TF32 and larger graphs.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from _env import host

import tcgnn_py as tg
from tcgnn_py._device import array_module
from tcgnn_py.nn._edges import CSREdges

nn = tg.nn
pytestmark = pytest.mark.filterwarnings("ignore::tcgnn_py.NoGPUWarning")
FD_EPS = 1e-6
FD_TOL = 1e-6  # central differences in float64: truncation ~eps^2, rounding ~1e-10/eps


def random_graph(rng, n=37, density=0.12, weighted=True):
    A = sp.random_array((n, n), density=density, rng=rng, format="csr")
    A.data = rng.uniform(0.5, 2.0, A.nnz) if weighted else np.ones(A.nnz)
    return A


def numeric_grad(f, x):
    """Central differences of the scalar ``f()`` with respect to the array ``x`` (perturbed in place)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + FD_EPS
        fp = f()
        x[i] = old - FD_EPS
        fm = f()
        x[i] = old
        g[i] = (fp - fm) / (2 * FD_EPS)
    return g


def assert_grad(analytic, f, x):
    want = numeric_grad(f, x)
    scale = max(1.0, np.abs(want).max())
    np.testing.assert_allclose(analytic, want, rtol=0, atol=FD_TOL * scale)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# --- gcn_norm / add_self_loops ----------------------------------------------------


def test_gcn_norm_matches_dense_formula(rng):
    A = random_graph(rng, 29)
    M = A.toarray() + np.eye(29)
    d = M.sum(axis=1)
    want = M / np.sqrt(d)[:, None] / np.sqrt(d)[None, :]
    T = nn.gcn_norm(A, dtype=np.float64)
    assert isinstance(T, tg.TiledMatrix) and T.dtype == np.float64
    np.testing.assert_allclose(T.toarray(), want, rtol=1e-14)
    assert nn.gcn_norm(A).dtype == np.float32



def test_gcn_norm_of_an_undirected_graph_is_its_own_transpose(rng):
    # Exactly symmetric values (one scale d_i d_j per pair): T.T is T, and its product is the transpose's.
    A = random_graph(rng, 29)
    A = sp.csr_array(A + A.T)
    T = nn.gcn_norm(A, device="cpu")
    assert T.T is T and (T.tocsr() != T.tocsr().T).nnz == 0
    X = rng.standard_normal((29, 3))
    np.testing.assert_allclose(T.T @ X, T.toarray().T @ X, rtol=1e-6)
    # A directed graph's is not: its transpose is translated as usual.
    D = sp.csr_array(sp.triu(A, k=1))
    S = nn.gcn_norm(D, device="cpu")
    assert S.T is not S
    np.testing.assert_array_equal(S.T.toarray(), S.toarray().T)
    # An explicit zero stored on one side only: equal values, not the same stored entries (a product by inf tells).
    Z = sp.csr_array((np.array([1.0, 1.0, 0.0]), np.array([1, 0, 2]), np.array([0, 1, 3, 3])), shape=(3, 3))
    Tz = nn.gcn_norm(Z, device="cpu", add_self_loops=False)
    assert Tz.T is not Tz and Tz.T.nnz == Tz.nnz
    np.testing.assert_array_equal(Tz.T.toarray(), Tz.toarray().T)

def test_gcn_norm_without_self_loops_and_isolated_rows(rng):
    A = random_graph(rng, 20).tolil()
    A[4, :] = 0  # a row that sums to zero gets a zero scale
    A = sp.csr_array(A)
    A.eliminate_zeros()
    T = nn.gcn_norm(A, add_self_loops=False, dtype=np.float64).toarray()
    d = A.toarray().sum(axis=1)
    dinv = np.where(d > 0, 1 / np.sqrt(np.where(d > 0, d, 1)), 0)
    np.testing.assert_allclose(T, dinv[:, None] * A.toarray() * dinv[None, :], rtol=1e-14)
    assert not T[4].any()


def test_gcn_norm_inputs_and_errors(rng):
    A = random_graph(rng, 10)
    want = nn.gcn_norm(A, dtype=np.float64).toarray()
    for B in (sp.csr_matrix(A), A.tocoo(), (A.data, A.indices, A.indptr), tg.TiledMatrix(A)):
        np.testing.assert_allclose(nn.gcn_norm(B, dtype=np.float64).toarray(), want, rtol=1e-6)
    with pytest.raises(ValueError, match="square"):
        nn.gcn_norm(sp.random_array((4, 5), density=0.5, rng=rng, format="csr"))
    neg = sp.csr_array(-np.ones((3, 3)))
    with pytest.raises(ValueError, match="negative"):
        nn.gcn_norm(neg)


@pytest.mark.parametrize("fill", [1.0, 0.5, 0.0, -2.0])
def test_a_canonical_graphs_diagonal_is_added_as_scipy_sums_duplicates(fill):
    # The host fast path (no sort) against scipy's COO sum of duplicates: indices, pointers and value bits, on
    # graphs with and without diagonal entries, explicit zeros, empty rows and no rows.
    from tcgnn_py.nn import _norm

    rng = np.random.default_rng(4)
    for trial in range(60):
        n = int(rng.integers(0, 30))
        A = sp.random_array((n, n), density=float(rng.uniform(0, 0.5)), rng=rng, format="csr")
        if n and trial % 2:
            A = sp.csr_array(A + sp.eye_array(n) * rng.integers(0, 2, n))
        if A.nnz and trial % 3 == 0:
            A.data[rng.integers(0, A.nnz, 3)] = 0.0
        A.sort_indices()
        d, i, p = A.data.astype(np.float32), A.indices.astype(np.int32), A.indptr.astype(np.int32)
        rows = np.repeat(np.arange(n), np.diff(p))
        want = sp.coo_matrix((np.r_[d.astype(np.float64), np.full(n, fill)], (np.r_[rows, np.arange(n)],
                              np.r_[i, np.arange(n)])), shape=(n, n)).tocsr()
        want.sum_duplicates()
        got = _norm._plus_identity(d, i, p, n, np, fill)
        assert got.has_canonical_format
        np.testing.assert_array_equal(got.indptr, want.indptr)
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.data.view(np.int64), want.data.view(np.int64))


def test_add_self_loops_keeps_weights_and_explicit_zeros():
    # (0,1)=2, (1,0)=0 stored, (1,1)=5 an existing self loop, (2,1)=3
    A = sp.csr_array(
        (np.array([2.0, 0.0, 5.0, 3.0]), np.array([1, 0, 1, 1]), np.array([0, 1, 3, 4])), shape=(3, 3)
    )
    T = nn.add_self_loops(A, fill_value=0.5, dtype=np.float64)
    np.testing.assert_array_equal(T.toarray(), A.toarray() + 0.5 * np.eye(3))
    C = T.tocsr()
    assert T.nnz == 6 and C[1, 1] == 5.5  # the explicit zero stays stored, the loop merges
    assert (1, 0) in set(zip(*(x.tolist() for x in C.tocoo().coords)))


# --- layers -------------------------------------------------------------------------


@pytest.mark.parametrize("d_in,d_out", [(5, 3), (3, 6)])  # both product orders
@pytest.mark.parametrize("bias", [True, False])
def test_gcn_conv_gradients(rng, d_in, d_out, bias):
    A = nn.gcn_norm(random_graph(rng), dtype=np.float64)
    n = A.shape[0]
    H = rng.standard_normal((n, d_in))
    W = rng.standard_normal((d_in, d_out))
    b = rng.standard_normal(d_out) if bias else None
    R = rng.standard_normal((n, d_out))

    def loss():
        return (host(nn.gcn_conv(A, H, W, b)[0]) * R).sum()

    out, vjp = nn.gcn_conv(A, H, W, b)
    np.testing.assert_allclose(host(out), A.toarray() @ H @ W + (0 if b is None else b), rtol=1e-12, atol=1e-12)
    dH, dW, db = (None if v is None else host(v) for v in vjp(R))
    assert_grad(dH, loss, H)
    assert_grad(dW, loss, W)
    if bias:
        assert_grad(db, loss, b)
    else:
        assert db is None
    assert vjp(R, input_grad=False)[0] is None


@pytest.mark.parametrize("d_in,d_out", [(5, 3), (3, 6)])  # the product reads H first, or A H runs first
def test_gcn_conv_dropout_is_dropout_then_gcn_conv(rng, d_in, d_out):
    """``dropout_p`` drops H as :func:`dropout` does with the same generator's draw: the output and every
    gradient are those of ``gcn_conv(dropout(H))``, ``dH`` through the dropout's vjp."""
    A = nn.gcn_norm(random_graph(rng), dtype=np.float64)
    n = A.shape[0]
    H, W, b, g = (rng.standard_normal(s) for s in ((n, d_in), (d_in, d_out), d_out, (n, d_out)))
    out, vjp = nn.gcn_conv(A, H, W, b, dropout_p=0.4, rng=nn.default_rng(5, like=A))
    xp = array_module(nn.default_rng(5, like=A).random(1))  # (the graph's device)
    Hd, d_vjp = nn.dropout(xp.asarray(H), 0.4, nn.default_rng(5, like=A))
    want, want_vjp = nn.gcn_conv(A, Hd, W, b)
    np.testing.assert_array_equal(host(out), host(want))
    got, exp = vjp(g), want_vjp(g)
    np.testing.assert_array_equal(host(got[0]), host(d_vjp(exp[0])))
    for x, y in zip(got[1:], exp[1:]):
        np.testing.assert_array_equal(host(x), host(y))
    assert vjp(g, input_grad=False)[0] is None
    assert bool((host(Hd) == 0).any()) and bool((host(Hd) != 0).any())  # (a mask that drops, and keeps)


def test_linear_dropout_is_dropout_then_linear(rng):
    """``linear(dropout_p=...)`` is ``linear(dropout(H))`` with the same generator's draw, ``dH`` through the
    dropout's vjp."""
    H, W, b, g = (rng.standard_normal(s) for s in ((20, 5), (5, 3), 3, (20, 3)))
    out, vjp = nn.linear(H, W, b, dropout_p=0.4, rng=np.random.default_rng(2))
    Hd, d_vjp = nn.dropout(H, 0.4, np.random.default_rng(2))
    want, want_vjp = nn.linear(Hd, W, b)
    np.testing.assert_array_equal(out, want)
    got, exp = vjp(g), want_vjp(g)
    np.testing.assert_array_equal(got[0], d_vjp(exp[0]))
    np.testing.assert_array_equal(got[1], exp[1])
    np.testing.assert_array_equal(got[2], exp[2])
    assert vjp(g, input_grad=False)[0] is None
    with pytest.raises(ValueError, match="dropout_p"):
        nn.linear(H, W, dropout_p=-0.1, rng=np.random.default_rng(2))


def test_gcn_apply_checks_dropout_p_in_evaluation_too(rng):
    A = nn.gcn_norm(random_graph(rng), dtype=np.float64)
    params = nn.gcn_init((4, 3), np.random.default_rng(0), dtype=np.float64)
    X = rng.standard_normal((A.shape[0], 4))
    with pytest.raises(ValueError, match="dropout_p must be in"):
        nn.gcn_apply(params, A, X, dropout_p=1.5, training=False)


def test_gcn_conv_dropout_errors(rng):
    A = nn.gcn_norm(random_graph(rng), dtype=np.float64)
    H, W = rng.standard_normal((A.shape[0], 4)), rng.standard_normal((4, 2))
    with pytest.raises(ValueError, match="dropout_p"):
        nn.gcn_conv(A, H, W, dropout_p=1.0, rng=nn.default_rng(0, like=A))
    with pytest.raises(ValueError, match="needs rng"):
        nn.gcn_conv(A, H, W, dropout_p=0.5)


def test_gcn_conv_uses_the_transpose_backward(rng):
    """On a directed graph Aᵀ g differs from A g: the gradient must use Aᵀ (TC-GNN used A)."""
    A = nn.gcn_norm(random_graph(rng), add_self_loops=False, dtype=np.float64)
    n = A.shape[0]
    H, W, g = rng.standard_normal((n, 4)), rng.standard_normal((4, 2)), rng.standard_normal((n, 2))
    dH = host(nn.gcn_conv(A, H, W)[1](g)[0])
    Ad = A.toarray()
    np.testing.assert_allclose(dH, Ad.T @ g @ W.T, rtol=1e-12, atol=1e-12)
    assert not np.allclose(dH, Ad @ g @ W.T)


@pytest.mark.parametrize("beta", [0.0, 0.8, -2.5])
def test_agnn_conv_gradients(rng, beta):
    A = nn.add_self_loops(random_graph(rng), dtype=np.float64)
    n = A.shape[0]
    H = rng.standard_normal((n, 4))
    beta = np.array([beta])
    R = rng.standard_normal((n, 4))

    def loss():
        return (host(nn.agnn_conv(A, H, beta)[0]) * R).sum()

    out, vjp = nn.agnn_conv(A, H, beta)
    dH, dbeta = (host(v) for v in vjp(R))
    assert dbeta.shape == (1,)
    assert_grad(dH, loss, H)
    assert_grad(dbeta, loss, beta)


def test_agnn_conv_matches_dense_attention(rng):
    A = nn.add_self_loops(random_graph(rng, 40), dtype=np.float64)
    H = rng.standard_normal((40, 6))
    H[7] = 0  # a zero row: cosine 0 with everything, no NaN
    out = host(nn.agnn_conv(A, H, 1.3)[0])
    D = A.toarray()
    Hn = H / np.maximum(np.linalg.norm(H, axis=1, keepdims=True), 1e-12)
    Z = np.where(D != 0, 1.3 * Hn @ Hn.T, -np.inf)
    P = D * np.exp(Z - Z.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out, P @ H, rtol=1e-12, atol=1e-12)
    assert np.isfinite(out).all()


def test_agnn_large_temperature_is_stable(rng):
    """The row maximum is subtracted before exp: no overflow at beta = 500."""
    A = nn.add_self_loops(random_graph(rng), dtype=np.float64)
    H = rng.standard_normal((A.shape[0], 3))
    out, vjp = nn.agnn_conv(A, H, np.array([500.0]))
    dH, dbeta = vjp(out * 0 + 1)
    assert all(np.isfinite(host(v)).all() for v in (out, dH, dbeta))


def test_linear_relu_dropout_cross_entropy_gradients(rng):
    n, d, k = 11, 4, 3
    H, W, b = rng.standard_normal((n, d)), rng.standard_normal((d, k)), rng.standard_normal(k)
    labels = rng.integers(0, k, n)
    idx = np.array([0, 3, 4, 9])

    def loss():
        z, _ = nn.linear(H, W, b)
        z, _ = nn.relu(z)
        return float(nn.cross_entropy(z, labels, idx)[0])

    z1, lin = nn.linear(H, W, b)
    z2, rel = nn.relu(z1)
    _, dz = nn.cross_entropy(z2, labels, idx)
    assert not dz[np.setdiff1d(np.arange(n), idx)].any()
    dH, dW, db = lin(rel(dz))
    for analytic, x in ((dH, H), (dW, W), (db, b)):
        assert_grad(analytic, loss, x)

    out, vjp = nn.dropout(H, 0.5, np.random.default_rng(1))
    mask = out / np.where(H != 0, H, 1)
    assert set(np.unique(mask.round(12))) <= {0.0, 2.0}
    np.testing.assert_array_equal(vjp(np.ones_like(H)), mask.round(12))
    assert nn.dropout(H, 0.5, None, training=False)[0] is H
    with pytest.raises(ValueError, match="dropout"):
        nn.dropout(H, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="needs rng"):
        nn.dropout(H, 0.5, None)


@pytest.mark.parametrize("act", [None, "relu", "elu"])
@pytest.mark.parametrize("with_b", [False, True])
def test_bias_act_dropout_gradients(rng, act, with_b):
    H, b = rng.standard_normal((9, 4)), rng.standard_normal(4) if with_b else None
    g = rng.standard_normal((9, 4))

    def loss():
        return float((nn.bias_act_dropout(H, b, act)[0] * g).sum())

    out, vjp = nn.bias_act_dropout(H, b, act)
    z = H + (0 if b is None else b)
    want = {None: z, "relu": np.maximum(z, 0), "elu": np.where(z > 0, z, np.expm1(np.minimum(z, 0)))}[act]
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-15)  # exp(z) - 1 on the host, expm1 on the GPU
    dH, db = vjp(g)
    assert_grad(dH, loss, H)
    if b is None:
        assert db is None
    else:
        assert_grad(db, loss, b)
    # with dropout: the same elements as dropout() with the same draws, scaled by 2
    out0, vjp0 = nn.bias_act_dropout(H, b, act)
    out, vjp = nn.bias_act_dropout(H, b, act, 0.5, np.random.default_rng(3))
    drop, drop_vjp = nn.dropout(out0, 0.5, np.random.default_rng(3))
    np.testing.assert_array_equal(out, drop)
    np.testing.assert_array_equal(vjp(g)[0], vjp0(drop_vjp(g))[0])


def test_bias_act_dropout_errors(rng):
    H = rng.standard_normal((5, 3))
    with pytest.raises(ValueError, match="act must be one of"):
        nn.bias_act_dropout(H, None, "gelu")
    with pytest.raises(ValueError, match=r"b must have shape \(3,\)"):
        nn.bias_act_dropout(H, np.ones(4))
    with pytest.raises(ValueError, match="dropout probability p"):
        nn.bias_act_dropout(H, None, "relu", 1.0)
    with pytest.raises(ValueError, match="needs rng"):
        nn.bias_act_dropout(H, None, "relu", 0.5)
    with pytest.raises(ValueError, match="H must be 2-D"):
        nn.bias_act_dropout(np.ones(3))
    with pytest.raises(TypeError, match="labels must be integers"):
        nn.cross_entropy(H, np.zeros(5))
    with pytest.raises(TypeError, match="index must be integers"):  # a mask is not a list of rows
        nn.cross_entropy(H, np.zeros(5, int), np.ones(5, bool))
    for bad in (np.array([], int), np.zeros((1, 2), int)):
        with pytest.raises(ValueError, match="non-empty 1-D"):
            nn.cross_entropy(H, np.zeros(5, int), bad)
    assert nn.bias_act_dropout(H, None, None, 0.5, None, training=False)[0] is H


@pytest.mark.parametrize("model", ["gcn", "agnn"])
def test_model_gradients(rng, model):
    """Whole models (layers, ReLU, dropout off, loss) against finite differences."""
    A0 = random_graph(rng, 33)
    n, f, k = 33, 6, 3
    if model == "gcn":
        A, apply, init = nn.gcn_norm(A0, dtype=np.float64), nn.gcn_apply, nn.gcn_init
    else:
        A, apply = nn.add_self_loops(A0, dtype=np.float64), nn.agnn_apply
        init = lambda dims, r, dtype: nn.agnn_init(dims, r, n_prop=3, dtype=dtype)  # noqa: E731
    params = init((f, 5, k), nn.default_rng(like=A), dtype=np.float64)  # on A's device
    xp = array_module(params["b_out" if model == "agnn" else "b0"])
    X = rng.standard_normal((n, f))
    labels, idx = xp.asarray(rng.integers(0, k, n)), xp.arange(0, n, 2)
    if model == "agnn":
        params["beta2"][:] = 0.6
    logits, vjp = apply(params, A, X, training=False)
    grads = vjp(nn.cross_entropy(logits, labels, idx)[1])
    assert sorted(grads) == sorted(params)
    for name, p in params.items():
        value = host(p).copy()  # perturbed on the host, uploaded for every evaluation

        def loss():
            params[name] = xp.asarray(value)
            return float(nn.cross_entropy(apply(params, A, X, training=False)[0], labels, idx)[0])

        assert_grad(host(grads[name]), loss, value)
        params[name] = p


def test_csr_edges_give_the_same_layers(rng):
    """The scipy/cupyx path (benchmark baseline) computes the same model as the tiled one."""
    A0 = random_graph(rng, 45)
    for A in (nn.gcn_norm(A0, dtype=np.float64), nn.add_self_loops(A0, dtype=np.float64)):
        C = CSREdges(A.tocsr())
        H, W, g = rng.standard_normal((45, 4)), rng.standard_normal((4, 3)), rng.standard_normal((45, 3))
        for f, args, gg in ((nn.gcn_conv, (H, W), g), (nn.agnn_conv, (H, 0.9), g[:, :1] * H)):
            o1, v1 = f(A, *args)
            o2, v2 = f(C, *args)
            np.testing.assert_allclose(host(o1), o2, rtol=1e-12, atol=1e-12)
            for a, b in zip(v1(gg), v2(gg)):
                if a is None:  # no bias: no bias gradient on either path
                    assert b is None
                else:
                    np.testing.assert_allclose(host(a), b, rtol=1e-12, atol=1e-12)


def test_row_edges_give_the_same_layers(rng):
    """``RowEdges`` (the library's CSR kernel; scipy's product on the host) computes the tiled model's layers: GCN
    on ``gcn_norm(format="csr")`` of a symmetric graph (its own transpose) and of a directed one (the transpose's
    CSR, made once), and the attention layers' unfused sequence (new values in both directions, row and column
    sums)."""
    A0 = random_graph(rng, 45)
    sym = (A0 + A0.T).tocsr()
    for G in (sym, A0):
        A = nn.gcn_norm(G, dtype=np.float64, device="cpu")
        E = nn.gcn_norm(G, dtype=np.float64, device="cpu", format="csr")
        assert isinstance(E, nn.RowEdges) and E.symmetric == (G is sym) and E.shape == A.shape
        np.testing.assert_allclose(E.matrix.toarray(), A.toarray(), rtol=1e-15, atol=0)
        H, W, g = rng.standard_normal((45, 4)), rng.standard_normal((4, 3)), rng.standard_normal((45, 3))
        b = rng.standard_normal(3)
        for f, args, gg in ((nn.gcn_conv, (H, W, b), g), (nn.agnn_conv, (H, 0.9), g[:, :1] * H)):
            o1, v1 = f(A, *args)
            o2, v2 = f(E, *args)
            np.testing.assert_allclose(host(o1), o2, rtol=1e-12, atol=1e-12)
            for x, y in zip(v1(gg), v2(gg)):
                assert (x is None) == (y is None)
                if x is not None:
                    np.testing.assert_allclose(host(x), y, rtol=1e-12, atol=1e-12)
        v = rng.standard_normal(E.values.shape[0])
        M = sp.csr_array((v, E.cols, E.matrix.indptr), shape=E.shape)
        np.testing.assert_allclose(E.spmm_t(H, v), M.T @ H, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(E.row_sums(v), M.sum(axis=1), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(E.col_sums(v), M.sum(axis=0), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="format must be 'tiled' or 'csr', got 'coo'"):
        nn.gcn_norm(A0, format="coo")
    with pytest.raises(TypeError, match="layout and tile_shape are a TiledMatrix's"):
        nn.gcn_norm(A0, format="csr", layout="vector")
    E = nn.gcn_norm(sym, device="cpu", format="csr")
    assert repr(E) == f"<RowEdges of dtype 'float32' with {E.cols.shape[0]} stored elements and shape (45, 45), " \
                      "symmetric, on cpu>"


def test_row_edges_check_their_arrays_and_operands(rng):
    """``RowEdges`` of raw arrays: scipy's messages for arrays that do not make a CSR matrix (an index out of range
    is found by the full check, which the kernel would read past), and X's rows named in a product."""
    A = random_graph(rng, 12)
    arrays = (A.data, A.indices, A.indptr)
    with pytest.raises(TypeError, match="needs their shape"):
        nn.RowEdges(arrays)
    with pytest.raises(ValueError, match="index pointer size 12 should be 13"):
        nn.RowEdges((A.data, A.indices, A.indptr[:-1]), (12, 12))
    bad = A.indices.copy()
    bad[0] = 12
    with pytest.raises(ValueError, match="indices must be < 12"):
        nn.RowEdges((A.data, bad, A.indptr), (12, 12))
    nn.RowEdges((A.data, bad, A.indptr), (12, 12), check=False)  # (sizes alone: the maker vouches for the rest)
    with pytest.raises(TypeError, match="RowEdges data dtype complex128 is not supported"):
        nn.RowEdges((A.data.astype(complex), A.indices, A.indptr), (12, 12))
    E = nn.RowEdges(A)
    for f in (E.spmm, E.spmm_t):
        with pytest.raises(ValueError, match=r"X must have 12 rows \(one per column of the matrix\), got shape"):
            f(np.ones((11, 3)))
    np.testing.assert_allclose(E.spmm(np.ones(12)), A @ np.ones(12))  # (a vector: scipy's product)


def test_layer_errors(rng):
    A = nn.gcn_norm(random_graph(rng, 10))
    with pytest.raises(TypeError, match="TiledMatrix"):
        nn.gcn_conv(random_graph(rng, 10), np.ones((10, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="10 nodes"):
        nn.gcn_conv(A, np.ones((9, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="W expects"):
        nn.gcn_conv(A, np.ones((10, 2)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="beta"):
        nn.agnn_conv(A, np.ones((10, 2)), np.ones(2))
    with pytest.raises(TypeError, match="Generator"):
        nn.gcn_init((3, 2), None)


# --- Adam ---------------------------------------------------------------------------


def test_adam_matches_the_formula(rng):
    p0 = rng.standard_normal((4, 3))
    params = {"w": p0.copy(), "b": np.zeros(3)}
    opt = nn.Adam(params, lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay={"w": 0.1})
    m = v = 0
    p = p0.copy()
    for t in range(1, 6):
        g = rng.standard_normal((4, 3))
        opt.step({"w": g, "b": None})
        g = g + 0.1 * p
        m = 0.8 * m + 0.2 * g
        v = 0.99 * v + 0.01 * g * g
        p = p - 0.05 * (m / (1 - 0.8**t)) / (np.sqrt(v / (1 - 0.99**t)) + 1e-6)
    np.testing.assert_allclose(params["w"], p, rtol=1e-12)
    assert not params["b"].any()
    with pytest.raises(KeyError, match="unknown"):
        nn.Adam(params, weight_decay={"nope": 1.0})
    with pytest.raises(ValueError, match="shape"):
        opt.step({"w": np.ones(3)})


def test_train_reaches_accuracy_on_cora_quickly():
    """Sixty epochs of GCN on Cora's reference path already classify most test nodes."""
    g = tg.load_cora()
    X = g.features.toarray().astype(np.float32)
    X /= np.maximum(X.sum(axis=1, keepdims=True), 1)
    A = nn.gcn_norm(g.adj)
    rng = nn.default_rng(0, like=A)
    params = nn.gcn_init((X.shape[1], 16, 7), rng)
    opt = nn.Adam(params, lr=0.01, weight_decay={"W0": 5e-4, "b0": 5e-4})
    r = nn.train(nn.gcn_apply, params, A, X, g.labels,
                 (g.train_idx, g.val_idx, g.test_idx), opt, epochs=60, rng=rng)
    assert r.test_acc > 0.75 and len(r.epoch_times) == 60 and 0 <= r.best_epoch < 60


def test_dense_kernel_takes_what_it_can_tile():
    """The layers' dense kernels take float32, rows of unit column stride, k and widths they tile; the product's
    kernel sums a head's scores in lanes of a power of two."""
    from tcgnn_py.products import dense

    a, b = np.zeros((10, 8), np.float32), np.zeros((8, 4), np.float32)
    assert dense.dense_takes(a, b) and dense.dense_takes(a[:, :4], b[:4]) and dense.dense_takes(a, b.T.copy().T)
    assert not dense.dense_takes(a.T, a) and not dense.dense_takes(a, b.astype(np.float64))
    assert not dense.dense_takes(a.astype(np.float64), b.astype(np.float64))
    assert not dense.dense_takes(a.astype(np.float16), b.astype(np.float16))
    assert not dense.dense_takes(a.astype(np.int64), b.astype(np.int64)) and not dense.dense_takes(a, np.zeros((9, 4)))
    assert not dense.dense_takes(np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32))
    k, n, short, m = dense.DENSE_MAX_K, dense.DENSE_MAX_N, dense.DENSE_SHORT_ROWS, dense.DENSE_SHORT_ROWS + 1
    assert dense.dense_takes(np.zeros((m, k), np.float32), np.zeros((k, n), np.float32))
    assert not dense.dense_takes(np.zeros((m, k + 1), np.float32), np.zeros((k + 1, 4), np.float32))
    # over a short A (a small graph's layer) k goes up to DENSE_SHORT_K
    sk = dense.DENSE_SHORT_K
    assert dense.dense_takes(np.zeros((short, sk), np.float32), np.zeros((sk, 4), np.float32))
    assert not dense.dense_takes(np.zeros((short, sk + 1), np.float32), np.zeros((sk + 1, 4), np.float32))
    assert not dense.dense_takes(a, np.zeros((8, n + 1), np.float32))
    # widths whose last 64-column tile is over a quarter idle go to cuBLAS (up to 32, narrower tiles serve)
    idle = [w for w in range(1, n + 1) if not dense.dense_takes(a, np.zeros((8, w), np.float32))]
    assert idle[:3 * 15 + 31 + 15] == [*range(33, 48), *range(65, 96), *range(129, 144)]
    assert all(4 * (-w % 64) > -(-w // 64) * 64 for w in idle) and n % 64 == 0 and n not in idle
    assert [D for D in range(1, 200) if dense.dense_scores_take(D)] == [4, 8, 16, 32, 64]
    # Aᵀ B over the rows: both (N, ·) float32 with unit column stride, at most DENSE_ATB_MAX columns each
    h, g = np.zeros((50, 8), np.float32), np.zeros((50, 6), np.float32)
    assert dense.dense_atb_takes(h, g) and dense.dense_atb_takes(None, g) and dense.dense_atb_takes(h[:, :3], g[:, 1:])
    assert not dense.dense_atb_takes(h.T, g) and not dense.dense_atb_takes(h, g[:49]) and not dense.dense_atb_takes(h, g[0])
    assert not dense.dense_atb_takes(h.astype(np.float64), g) and not dense.dense_atb_takes(None, g.astype(np.float16))
    assert not dense.dense_atb_takes(np.zeros((50, dense.DENSE_ATB_MAX + 1), np.float32), g)
    # B wider than a tile: up to DENSE_ATB_MAX_WIDE where A has at most DENSE_ATB_FEW columns or N is short
    wide, few = dense.DENSE_ATB_MAX_WIDE, dense.DENSE_ATB_FEW
    for N, p, q, takes in ((m, few + 1, dense.DENSE_ATB_MAX + 1, False), (m, 2, wide, True), (m, few, wide, True),
                           (m, few + 1, wide, False), (m, 1, wide, False), (short, 64, wide, True),
                           (short, 64, wide + 1, False), (m, 64, 64, True)):
        assert dense.dense_atb_takes(np.zeros((N, p), np.float32), np.zeros((N, q), np.float32)) == takes, (N, p, q)
    assert not dense.dense_atb_takes(None, np.zeros((m, dense.DENSE_ATB_MAX + 1), np.float32))
    assert dense.dense_atb_takes(None, np.zeros((short, wide), np.float32))
    long = np.zeros((dense.DENSE_ATB_MAX_ROWS + 1, 4), np.float32)
    assert not dense.dense_atb_takes(long, long) and dense.dense_atb_takes(long[1:], long[1:])
