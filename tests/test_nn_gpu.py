"""tcgnn_py.nn on the GPU, against the float64 reference path on the host.

float64 runs on CUDA cores and must agree with the host to rounding; float32
runs the TF32 tensor-core kernels and must agree within the TF32 tolerance.
Inputs are fresh random data in every test.
"""

import functools

import numpy as np
import pytest
import scipy.sparse as sp
from test_nn import random_graph

from _env import cupy_fixture, int_graph, ints
import tcgnn_py as tg
from tcgnn_py import _reference as ref
from tcgnn_py.nn._edges import CSREdges

nn = tg.nn
pytestmark = pytest.mark.gpu
#: Relative error allowed per dtype on the device (float32 products use TF32 tensor cores).
TOL = {"float64": 1e-11, "float32": 5e-3}


cp = cupy_fixture()


@pytest.fixture
def rng():
    return np.random.default_rng(0)


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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_edges_multiply_by_the_csr_kernel_both_ways(cp, rng, dtype):
    """``RowEdges`` on the device: both products exact on small integers (the CSR kernel sums in the compute type),
    through the transpose's CSR (new values gathered into its order) or, symmetric, the matrix itself; and
    ``gcn_norm(format="csr")`` of a host batch on the device is the tiled matrix's model to float32's rounding."""
    A = int_graph(rng, 300, 200, degree=9)
    E = nn.RowEdges(tuple(cp.asarray(a) for a in (A.data.astype(dtype), A.indices, A.indptr)), A.shape)
    X, Y = ints(rng, 200, 33, dtype=dtype), ints(rng, 300, 70, dtype=dtype)
    np.testing.assert_array_equal(E.spmm(cp.asarray(X)).get(), A @ X)
    np.testing.assert_array_equal(E.spmm_t(cp.asarray(Y)).get(), A.T @ Y)
    v = rng.integers(-3, 4, A.nnz).astype(dtype)
    M = sp.csr_array((v, A.indices, A.indptr), shape=A.shape)
    np.testing.assert_array_equal(E.spmm_t(cp.asarray(Y), cp.asarray(v)).get(), M.T @ Y)
    np.testing.assert_array_equal(E.col_sums(cp.asarray(v)).get(), M.sum(axis=0))
    G = random_graph(rng, 400, density=0.02)
    G = (G + G.T).tocsr()
    F = nn.gcn_norm(G, device="cuda", format="csr", dtype=dtype)
    assert F.symmetric and F.xp is cp and F.values.dtype == dtype
    H = rng.standard_normal((400, 16)).astype(dtype)
    want = nn.gcn_norm(G, device="cpu", dtype=np.float64).toarray() @ H
    assert rel(F.spmm(cp.asarray(H)), want) < (1e-6 if dtype == np.float32 else 1e-13)
    assert rel(F.spmm_t(cp.asarray(H)), want) < (1e-6 if dtype == np.float32 else 1e-13)
    W, b = cp.asarray(rng.standard_normal((16, 8)).astype(dtype)), cp.zeros(8, dtype)
    o1, v1 = nn.gcn_conv(F, cp.asarray(H), W, b)
    o2, v2 = nn.gcn_conv(nn.gcn_norm(G, device="cpu", dtype=np.float64), H.astype(np.float64), W.get(), b.get())
    assert rel(o1, o2) < (1e-5 if dtype == np.float32 else 1e-12)
    g = rng.standard_normal(o2.shape)
    for x, y in zip(v1(cp.asarray(g.astype(dtype))), v2(g)):
        assert rel(x, y) < (1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_row_edges_transpose_on_the_gpu_is_the_hosts_csr(cp, rng, dtype):
    """The transpose's CSR and order on the device (the kernels' values for float32 and float64, gathered for
    others) are the host's bit for bit: rectangular, with empty rows and columns, a column every row has, and no
    entries."""
    hub = sp.random_array((700, 90), density=0.03, rng=rng, format="lil")
    hub[:, 7] = 1
    hub[:, 3] = 0
    hub[::5] = 0
    mats = [int_graph(rng, 300, 200, degree=9), hub.tocsr(), sp.csr_array((40, 30))]
    for A in mats:
        A = sp.csr_array(A)
        A.sort_indices()
        data = rng.integers(-8, 9, A.nnz).astype(dtype)
        arrays = (data, A.indices.astype(np.int32), A.indptr.astype(np.int32))
        host = nn.RowEdges(arrays, A.shape)
        dev = nn.RowEdges(tuple(cp.asarray(a) for a in arrays), A.shape)
        for h, d in zip(host.transpose() + host._transpose_order(), dev.transpose() + dev._transpose_order()):
            assert d.dtype == h.dtype
            np.testing.assert_array_equal(d.get(), h)
        v = rng.integers(-8, 9, A.nnz).astype(dtype)
        np.testing.assert_array_equal(dev.transpose()[0].get(), sp.csr_array((data, A.indices, A.indptr),
                                                                             shape=A.shape).T.tocsr().data)
        Y = ints(rng, A.shape[0], 5, dtype=np.float32)
        got = nn.RowEdges(tuple(cp.asarray(a) for a in arrays), A.shape).spmm_t(cp.asarray(Y), cp.asarray(v))
        np.testing.assert_array_equal(got.get(), (sp.csr_array((v, A.indices, A.indptr), shape=A.shape).T @ Y)
                                      .astype(got.dtype))


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
    out, vjp = nn.dropout(H, 0.3, cp.random.default_rng(0))
    vals = cp.unique(out).get()
    assert vals.tolist() == [0.0, np.float32(1 / 0.7)] and abs(float(out.mean()) - 1) < 0.02
    assert (vjp(H) == out).all()
    with pytest.raises(TypeError, match="cupy.random.Generator"):
        nn.dropout(H, 0.3, np.random.default_rng(0))


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


# --- the training family's kernels: tails, cross-entropy, multi-tensor Adam ------------------------------------


def _dtype(name):
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes").bfloat16)
    return np.dtype(name)


def _first_seed(rng_seed, words=2):
    """The first seed a fresh ``cupy.random.default_rng(rng_seed)`` gives the layers: its seed stream keyed by the
    bits of one float64 draw (``pointwise.draw``; the reference ``seed_stream``)."""
    import cupy

    key = np.float64(cupy.random.default_rng(rng_seed).random(1).get()[0]).view(np.uint64)
    return ref.seed_stream(key, 1, words)[0]


def _keep(size, w, p):
    """The feature dropout's mask in NumPy (``nn_keep`` of tcgnn_py.kernels.nn): a hash of each element's index and
    the seed's two words ``w``."""
    i = np.arange(size, dtype=np.uint64)
    x = (i & np.uint64(0xFFFFFFFF)).astype(np.uint32) ^ ((i >> np.uint64(32)).astype(np.uint32) * np.uint32(0x27D4EB2F))
    x ^= np.full(size, w[0] ^ w[1], np.uint32) * np.uint32(0x9E3779B9)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x85EBCA6B)
    x ^= x >> np.uint32(13)
    x *= np.uint32(0xC2B2AE35)
    x ^= x >> np.uint32(16)
    return (x >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24) >= np.float32(p)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("act", [None, "relu", "elu"])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_bias_act_dropout_on_device_is_the_formula(cp, dtype, act, p):
    """Forward and backward against NumPy with the same hash: exact (quarters are exact in every dtype) but for
    ELU's exp, within two units in the last place."""
    rng = np.random.default_rng(0)
    dt = _dtype(dtype)
    acc = np.float64 if dtype == "float64" else np.float32
    n, d = 1003, 37
    H, b, g = ints(rng, n, d) / 4, ints(rng, d) / 4, ints(rng, n, d)
    out, vjp = nn.bias_act_dropout(cp.asarray(H).astype(dt), cp.asarray(b).astype(dt), act, p,
                                   cp.random.default_rng(7))
    draw = _first_seed(7)
    z = (H + b).astype(acc)
    a = {None: z, "relu": np.maximum(z, 0), "elu": np.where(z > 0, z, np.expm1(np.minimum(z, 0)))}[act]
    mask = np.where(_keep(n * d, draw, p).reshape(n, d), acc(1 / (1 - p)), acc(0)) if p else np.ones((n, d), acc)
    want = (a * mask).astype(dt)
    dH, db = vjp(cp.asarray(g).astype(dt))
    slope = {None: 1, "relu": (z > 0).astype(acc), "elu": np.where(z > 0, 1, np.exp(np.minimum(z, 0)))}[act]
    dwant = (g.astype(acc) * mask * slope).astype(dt)
    assert out.dtype == dt and dH.dtype == dt and db.dtype == dt
    if act == "elu":
        ulp = {"float64": 1e-15, "float32": 2.4e-7, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
        np.testing.assert_allclose(out.get().astype(np.float64), want.astype(np.float64), rtol=ulp, atol=ulp)
        np.testing.assert_allclose(dH.get().astype(np.float64), dwant.astype(np.float64), rtol=ulp, atol=ulp)
    else:
        np.testing.assert_array_equal(out.get(), want)
        np.testing.assert_array_equal(dH.get(), dwant)
    # db sums dH's columns through cuBLAS (TF32 for float32): its error is relative to the sum of |terms|
    terms = dH.get().astype(np.float64)
    tol = {"float64": 1e-12, "float32": 1e-3, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    np.testing.assert_allclose(db.get().astype(np.float64), terms.sum(axis=0), rtol=0,
                               atol=tol * np.abs(terms).sum(axis=0).max())
    if p:
        assert 0.25 < 1 - _keep(n * d, draw, p).mean() < 0.35


def test_relu_elu_dropout_on_device_keep_g_dtype_and_check_g(cp):
    H = cp.asarray(np.linspace(-2, 2, 60, dtype=np.float32).reshape(6, 10)).astype(cp.float16)
    for f in (nn.relu, nn.elu):
        out, vjp = f(H)
        g = cp.ones((6, 10), cp.float32)
        assert vjp(g).dtype == cp.float32  # as g * mask would be
        np.testing.assert_allclose(vjp(g).get(), f(H.astype(cp.float32))[1](g).get(), rtol=1e-3)
        with pytest.raises(ValueError, match="g must have the output's shape"):
            vjp(cp.ones((6, 1), cp.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("indexed", [False, True])
def test_cross_entropy_on_device_matches_host(cp, rng, dtype, indexed):
    n, k = 1001, 7
    logits = (rng.standard_normal((n, k)) * 3).astype(dtype)
    labels = rng.integers(0, k, n).astype(np.int32)
    # (negative and repeated rows count once, as NumPy's w[idx] = 1 / len(idx) counts them)
    idx = np.concatenate([rng.choice(n, 300, replace=False), [-1, -1, 5, 5]]) if indexed else None
    on = (lambda x: None) if idx is None else cp.asarray  # noqa: E731
    loss, g = nn.cross_entropy(cp.asarray(logits), cp.asarray(labels), on(idx))
    want, g_want = nn.cross_entropy(logits, labels, idx)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    assert loss.dtype == dtype and g.dtype == dtype
    np.testing.assert_allclose(g.get(), g_want, rtol=tol, atol=tol)
    assert abs(float(loss) - float(want)) < tol * abs(float(want))
    # a label out of range matches no class on the device (no host read checks it): its row's gradient is the
    # weighted softmax alone
    row = 0 if idx is None else int(idx[0]) % n
    labels[row] = k
    _, g2 = nn.cross_entropy(cp.asarray(logits), cp.asarray(labels), on(idx))
    z = logits[row].astype(np.float64) - logits[row].max()
    w = 1 / (n if idx is None else len(idx))
    np.testing.assert_allclose(g2.get()[row], w * np.exp(z) / np.exp(z).sum(), rtol=tol * 10)


@pytest.mark.parametrize("n, k", [(1, 1), (257, 3), (1_100_003, 2)])
def test_cross_entropy_sums_its_loss_in_one_launch_in_one_order(cp, n, k):
    """The loss is summed by the launch that computes it (its last block adds the blocks' partials): log k for
    equal logits, float64's sum within float32 roundings, the same bits on every call (its count of finished
    blocks reset each time), past the most blocks of a grid-stride launch, and in a replayed capture."""
    rng = np.random.default_rng(n)
    labels = cp.asarray(rng.integers(0, k, n))
    loss, g = nn.cross_entropy(cp.zeros((n, k), cp.float32), labels)
    np.testing.assert_allclose(float(loss), np.log(k), rtol=1e-5)  # synchronize!
    logits = cp.asarray(rng.standard_normal((n, k), dtype=np.float32) * 3)
    idx = cp.asarray(rng.choice(n, max(1, n // 3), replace=False))
    first, g1 = nn.cross_entropy(logits, labels, idx)
    for _ in range(3):
        again, g2 = nn.cross_entropy(logits, labels, idx)
        assert again.tobytes() == first.tobytes() and bool((g2 == g1).all())
    want, _ = nn.cross_entropy(logits.get().astype(np.float64), labels.get(), idx.get())
    np.testing.assert_allclose(float(first), float(want), rtol=2e-5)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out, _ = nn.cross_entropy(logits, labels, idx)
        graph = stream.end_capture()
        for _ in range(2):
            out.fill(7)
            graph.launch()
            stream.synchronize()
            assert out.tobytes() == first.tobytes()


def test_adam_ticks_in_its_update(cp, rng):
    """A device step's first update launch advances the step count (no launch of its own), later launches of the
    step (a second dtype, a ninth tensor) read the corrections it wrote; a step without gradients still counts;
    a captured step advances the count on every replay, as the host optimizer's steps would."""
    shapes = [(5,)] * 9 + [(3, 2)]
    host_p = {f"p{i}": rng.standard_normal(s).astype(np.float64 if i == 9 else np.float32)
              for i, s in enumerate(shapes)}
    dev_p = {k: cp.asarray(v) for k, v in host_p.items()}
    oh, od = nn.Adam(host_p, lr=0.05), nn.Adam(dev_p, lr=0.05)
    grads = [{k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in host_p.items()} for _ in range(4)]
    for g in grads[:2]:
        oh.step(g)
        od.step({k: cp.asarray(v) for k, v in g.items()})
    oh.step({})
    od.step({})
    assert od.t == oh.t == 3
    dg = {k: cp.asarray(v) for k, v in grads[2].items()}
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        od.step(dg)
        graph = stream.end_capture()
        for _ in range(2):
            graph.launch()
        stream.synchronize()
    oh.step(grads[2])
    oh.step(grads[2])
    assert od.t == oh.t == 5
    for k, v in host_p.items():  # (float32 steps round apart on the host and the device)
        np.testing.assert_allclose(dev_p[k].get(), v, rtol=1e-4 if v.dtype == np.float32 else 1e-13, atol=1e-5)


def test_adam_multi_tensor_matches_host(cp, rng):
    """Eleven parameters (two launches of eight and three), two dtypes, a skipped gradient and a replaced array."""
    shapes = [(3, 5), (7,), (1,), (40, 3), (2, 2), (9,), (1, 1), (5, 6), (13,), (4,), (8, 8)]
    host_p = {f"p{i}": rng.standard_normal(s).astype(np.float64 if i % 4 == 0 else np.float32)
              for i, s in enumerate(shapes)}
    dev_p = {k: cp.asarray(v) for k, v in host_p.items()}
    wd = {k: 0.01 * i for i, k in enumerate(host_p)}
    oh, od = nn.Adam(host_p, lr=0.03, weight_decay=wd), nn.Adam(dev_p, lr=0.03, weight_decay=wd)
    for step in range(5):
        grads = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in host_p.items()}
        if step == 2:
            grads["p3"] = None
        if step == 3:  # a parameter array replaced between steps: the table follows it
            dev_p["p5"] = cp.asarray(host_p["p5"])
        oh.step(grads)
        od.step({k: None if g is None else cp.asarray(g) for k, g in grads.items()})
    for k, v in host_p.items():
        np.testing.assert_allclose(dev_p[k].get(), v, rtol=1e-5 if v.dtype == np.float32 else 1e-13, atol=1e-6)
    assert od.t == 5


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (129, 7, 3), (1001, 64, 64), (257, 33, 17), (3000, 64, 16),
                                     (77, 128, 64), (300, 100, 48), (65, 32, 60), (40000, 16, 64), (5000, 128, 32),
                                     (70001, 124, 50), (5000, 64, 256), (1000, 36, 100), (300, 256, 512),
                                     (4096, 200, 64), (9000, 128, 144)])
@pytest.mark.parametrize("layout", ["c", "b_transposed", "a_strided_bias"])
def test_dense_mm_is_the_product(cp, m, k, n, layout):
    """The layers' dense product against NumPy, every tile and partial tile of rows, columns and k (k % 4 != 0
    reads A by values, else by float4s), B as a transposed view, A as a slice of wider rows, with a bias: exact on
    small integers (every sum is)."""
    from tcgnn_py.products import dense

    rng = np.random.default_rng(0)
    dt = np.dtype(np.float32)
    A, B, b = ints(rng, m, k + 5), ints(rng, k, n), ints(rng, n)
    a = cp.asarray(A).astype(dt)[:, :k] if layout == "a_strided_bias" else cp.asarray(A[:, :k]).astype(dt)
    bd = cp.asarray(B.T).astype(dt).T if layout == "b_transposed" else cp.asarray(B).astype(dt)
    bias = cp.asarray(b).astype(dt) if layout == "a_strided_bias" else None
    assert dense.dense_takes(a, bd)
    want = A[:, :k].astype(np.float64) @ B + (b if bias is not None else 0)
    for _ in range(2):  # planned, then bound
        c = dense.dense_mm(a, bd, bias)
        assert c.dtype == dt and c.shape == (m, n) and c.flags.c_contiguous
        np.testing.assert_array_equal(c.get(), want.astype(dt))


@pytest.mark.parametrize("heads, D", [(1, 64), (8, 8), (4, 16), (2, 32), (3, 4), (1, 32), (5, 4), (1, 16),
                                      (4, 64), (3, 32), (8, 64), (17, 8)])
def test_dense_mm_scores_are_head_dots(cp, heads, D):
    """GAT's scores from the product's kernel equal :func:`head_dots` of its result: exact on small integers."""
    from tcgnn_py.products import dense

    rng = np.random.default_rng(0)
    dt = acc = np.float32
    n, k = 1001, 24
    H, W, a1, a2 = ints(rng, n, k), ints(rng, k, heads * D), ints(rng, heads, D), ints(rng, heads, D)
    assert dense.dense_scores_take(D)
    X, s1, s2 = dense.dense_mm(cp.asarray(H).astype(dt), cp.asarray(W).astype(dt), None, cp.asarray(a1, acc),
                           cp.asarray(a2, acc), heads)
    X3 = (H.astype(np.float64) @ W).reshape(n, heads, D)  # |.| <= 1536 and the dots <= 2^24: exact in float32
    np.testing.assert_array_equal(X.get(), X3.reshape(n, heads * D))
    assert s1.dtype == acc and s1.shape == (n, heads)
    np.testing.assert_array_equal(s1.get(), (X3 * a1).sum(axis=2))
    np.testing.assert_array_equal(s2.get(), (X3 * a2).sum(axis=2))
    if heads * D > 1:  # W as a transposed view: the same (its lanes need adjacent columns, so W is copied first)
        Xt, t1, t2 = dense.dense_mm(cp.asarray(H).astype(dt), cp.asarray(W.T).astype(dt).T, None, cp.asarray(a1, acc),
                                cp.asarray(a2, acc), heads)
        for got, want in ((Xt, X), (t1, s1), (t2, s2)):
            np.testing.assert_array_equal(got.get(), want.get())


@pytest.mark.parametrize("N, p, q", [(1, 1, 1), (31, 3, 7), (64, 8, 64), (1000, 9, 60), (22470, 64, 64),
                                     (5000, 16, 13), (100001, 64, 16), (300001, 5, 64), (3000, 64, 256),
                                     (50000, 4, 256), (1000, 8, 512), (4096, 33, 130)])
@pytest.mark.parametrize("layout", ["c", "strided"])
@pytest.mark.parametrize("launches", [1, 2])
def test_dense_atb_is_the_product(cp, monkeypatch, N, p, q, layout, launches):
    """Aᵀ B summed over the long dimension in slices, and B's column sums (A None), against NumPy: exact on small
    integers (every partial sum is below 2^24), the same bits on a second run, rows of any stride.  The slices are
    added by the blocks of one cooperative launch, or (a GPU that cannot hold them all at once) by a second one."""
    from tcgnn_py._cache import BOUND_KEEP, Store
    from tcgnn_py.products import dense

    monkeypatch.setattr(dense, "BOUND", Store(BOUND_KEEP))  # (launches bound here only)
    monkeypatch.setattr(dense, "_atb_tile", functools.lru_cache(dense._atb_tile.__wrapped__))  # (its own choices)
    if launches == 2:
        monkeypatch.setattr(dense, "_resident", lambda function, threads: 0)
    rng = np.random.default_rng(0)
    lim = 8 if N < 200000 else 2
    A = rng.integers(-lim, lim + 1, (N, p + 3)).astype(np.float32)
    B = rng.integers(-lim, lim + 1, (N, q + 2)).astype(np.float32)
    if layout == "strided":
        a, b = cp.asarray(A)[:, :p], cp.asarray(B)[:, 1:q + 1]
        A, B = A[:, :p], B[:, 1:q + 1]
    else:
        A, B = A[:, :p].copy(), B[:, :q].copy()
        a, b = cp.asarray(A), cp.asarray(B)
    # (longer, or wider where A is neither short nor of a few columns: cuBLAS's; the kernel is still right)
    fits = N <= dense.DENSE_ATB_MAX_ROWS and (q <= dense.DENSE_ATB_MAX or N <= dense.DENSE_SHORT_ROWS)
    assert dense.dense_atb_takes(a, b) == (fits or N <= dense.DENSE_ATB_MAX_ROWS and 1 < p <= dense.DENSE_ATB_FEW)
    assert dense.dense_atb_takes(None, b) == fits
    want = A.T.astype(np.float64) @ B
    for _ in range(2):  # planned, then bound
        c = dense.dense_atb(a, b)
        assert c.dtype == np.float32 and c.shape == (p, q)
        np.testing.assert_array_equal(c.get(), want)
        s = dense.dense_atb(None, b)
        assert s.shape == (q,)
        np.testing.assert_array_equal(s.get(), B.sum(axis=0, dtype=np.float64))
    x, y = cp.asarray(rng.standard_normal((N, p), dtype=np.float32)), cp.asarray(rng.standard_normal((N, q),
                                                                                                      dtype=np.float32))
    np.testing.assert_array_equal(dense.dense_atb(x, y).get(), dense.dense_atb(x, y).get())
    np.testing.assert_allclose(dense.dense_atb(x, y).get(), x.get().T.astype(np.float64) @ y.get(), rtol=1e-4,
                               atol=1e-3 * np.sqrt(N))


@pytest.mark.parametrize("N", [2708, 65536])
def test_dense_atb_adds_its_slices_in_one_order(cp, monkeypatch, N):
    """The slices are added in one order whoever adds them (the blocks of the cooperative launch, or a second
    launch), for both tiles: random floats give the same bits both ways."""
    from tcgnn_py._cache import BOUND_KEEP, Store
    from tcgnn_py.products import dense

    results = []
    for launches in (1, 2):
        monkeypatch.setattr(dense, "BOUND", Store(BOUND_KEEP))
        monkeypatch.setattr(dense, "_atb_tile", functools.lru_cache(dense._atb_tile.__wrapped__))
        if launches == 2:
            monkeypatch.setattr(dense, "_resident", lambda function, threads: 0)
        run = []
        for p, q in ((64, 64), (1, 64), (5, 13)):
            r = np.random.default_rng(p * q)
            a = cp.asarray(r.standard_normal((N, p), dtype=np.float32))
            b = cp.asarray(r.standard_normal((N, q), dtype=np.float32))
            run += [dense.dense_atb(a, b).get(), dense.dense_atb(None, b).get()]
        results.append(run)
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("N", [0, 1, 255, 19717, 300001])
@pytest.mark.parametrize("p, q", [(None, 1), (None, 3), (None, 33), (None, 64), (16, 3), (8, 8), (64, 1), (3, 21)])
def test_narrow_products_are_one_launch_in_one_order(cp, monkeypatch, N, p, q):
    """``Aᵀ B`` of at most 64 outputs and a narrow array's column sums (a bias's gradient) in one launch for every
    N, its last block adding the blocks' partials: exact on small integers, rows of any stride, the same bits on
    every call for random floats (its count of finished blocks reset each time), in a replayed capture too."""
    from tcgnn_py._cache import BOUND_KEEP, Store
    from tcgnn_py.products import dense

    store = Store(BOUND_KEEP)
    monkeypatch.setattr(dense, "BOUND", store)
    rng = np.random.default_rng(q)
    B = rng.integers(-8, 9, (N, q + 3)).astype(np.float32)
    A = rng.integers(-8, 9, (N, (p or 1) + 2)).astype(np.float32)
    cases = ((B[:, :q].copy(), A[:, :p or 1].copy(), cp.asarray(B[:, :q].copy()), cp.asarray(A[:, :p or 1].copy())),
             (B[:, 2:q + 2], A[:, 1:(p or 1) + 1], cp.asarray(B)[:, 2:q + 2], cp.asarray(A)[:, 1:(p or 1) + 1]))
    for hb, ha, b, a in cases:
        got = dense.dense_atb(None if p is None else a, b)
        want = hb.sum(axis=0, dtype=np.float64) if p is None else ha.T.astype(np.float64) @ hb
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_array_equal(got.get(), want)
    x = cp.asarray(rng.standard_normal((N, q), dtype=np.float32))
    y = None if p is None else cp.asarray(rng.standard_normal((N, p), dtype=np.float32))
    first = dense.dense_atb(y, x).get()
    for _ in range(3):
        np.testing.assert_array_equal(dense.dense_atb(y, x).get(), first)
    if N:
        want = x.get().sum(axis=0, dtype=np.float64) if p is None else y.get().T.astype(np.float64) @ x.get()
        np.testing.assert_allclose(first, want, rtol=1e-4, atol=1e-3 * np.sqrt(N))
    assert {k[0] for k in store} == {"atb"} and len(store) <= 2  # (one launch per signature, for every N)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out = dense.dense_atb(y, x)
        graph = stream.end_capture()
        for _ in range(2):
            out.fill(7)
            graph.launch()
            stream.synchronize()
            np.testing.assert_array_equal(out.get(), first)


def test_dense_products_bind_once_for_every_row_count(cp, monkeypatch):
    """``dense_mm`` and the cooperative ``dense_atb`` bind one launch per signature whatever the row count (a new
    batch's nodes each step): rows 1 to past the most slices, each product exact on small integers, and the
    store holds one launch of each."""
    from tcgnn_py._cache import BOUND_KEEP, Store
    from tcgnn_py.products import dense

    store = Store(BOUND_KEEP)
    monkeypatch.setattr(dense, "BOUND", store)
    rng = np.random.default_rng(3)
    W = rng.integers(-8, 9, (24, 40)).astype(np.float32)
    most = dense._atb_tile(24, 40, cp.cuda.runtime.getDevice())[3]
    for N in (1, 7, 64, 65, 1000, 4097, dense.DENSE_ATB_MIN_ROWS * most + 33):
        A = rng.integers(-8, 9, (N, 24)).astype(np.float32)
        B = rng.integers(-8, 9, (N, 40)).astype(np.float32)
        np.testing.assert_array_equal(dense.dense_mm(cp.asarray(A), cp.asarray(W)).get(), A @ W)
        np.testing.assert_array_equal(dense.dense_atb(cp.asarray(A), cp.asarray(B)).get(),
                                      A.T.astype(np.float64) @ B)
        np.testing.assert_array_equal(dense.dense_atb(None, cp.asarray(B)).get(), B.sum(axis=0, dtype=np.float64))
    kinds = sorted(k[0] for k in store)
    rowless = dense._atb_tile(24, 40, cp.cuda.runtime.getDevice())[4]
    assert kinds.count("dense") == 1 and (kinds.count("atb") == 2 or not rowless), kinds


def test_seed_streams_draw_the_reference_seeds_and_a_replayed_capture_draws_anew(cp):
    """A generator's seed stream: keyed by one draw, each call the next splitmix64 output (one or two words, as
    the reference), the count advanced on the device, so a captured draw gives a new seed on every replay; a
    second generator has its own stream."""
    from tcgnn_py.products import pointwise

    rng = cp.random.default_rng(11)
    key = np.float64(cp.random.default_rng(11).random(1).get()[0]).view(np.uint64)
    want = ref.seed_stream(key, 4, 2)
    got = [pointwise.draw(rng).get(), pointwise.draw(rng, 1).get()]
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1][:1])
    other = pointwise.draw(cp.random.default_rng(12))
    assert not np.array_equal(other.get(), want[0])
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        np.testing.assert_array_equal(pointwise.draw(rng).get(), want[2])  # (bound before the capture)
        stream.begin_capture()
        seed = pointwise.draw(rng)
        graph = stream.end_capture()
        graph.launch()
        first = seed.get()
        graph.launch()
        second = seed.get()
    np.testing.assert_array_equal(np.stack([first, second]), ref.seed_stream(key, 5, 2)[3:])


def test_seed_bits_are_the_cast_of_the_draw(cp):
    """An attention dropout seed from a float64 draw in one launch: the bits of (draw * 2**32).astype(uint32),
    at the ends of [0, 1) too."""
    from tcgnn_py.products import pointwise

    draws = cp.asarray([0.0, 2.0**-32, 0.5, 0.123456789, 1 - 2.0**-33, 1 - 2.0**-53])
    for i in range(draws.size):
        draw = draws[i:i + 1]
        got = pointwise.seed_bits(draw)
        assert got.dtype == np.uint32 and got.shape == (1,)
        np.testing.assert_array_equal(got.get(), (draw * 2.0**32).astype(np.uint32).get())


@pytest.mark.parametrize("n, shares", [(1, 1), (7, 300), (5000, 257), (5000, 20000)])
def test_row_normalize_grad_sums_the_shares_in_its_launch(cp, n, shares):
    """The normalisation's vjp given AGNN's temperature-gradient shares: dh the bits of the vjp alone, and the
    shares' sum those of ``total`` (its last block sums them in the same order), whatever the grid."""
    from tcgnn_py.products import pointwise

    rng = np.random.default_rng(0)
    f32 = np.float32
    dv, dq, dk, x = (cp.asarray(rng.standard_normal((n, 24), dtype=f32)) for _ in range(4))
    xn, norm = pointwise.row_normalize(x, 1e-12)
    s = cp.asarray(rng.standard_normal(shares, dtype=f32))
    f = pointwise.row_normalize_grad_bound(xn, 1e-12, s)
    for _ in range(2):
        dh, total = f(dv, dq, dk, xn, norm, s)
        assert total.shape == (1,) and total.dtype == f32
        np.testing.assert_array_equal(dh.get(), pointwise.row_normalize_grad(dv, dq, dk, xn, norm, 1e-12).get())
        np.testing.assert_array_equal(total.get(), pointwise.total(s, (1,)).get())
        s = cp.asarray(rng.standard_normal(shares, dtype=f32))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_add_bias_in_place(cp, dtype):
    """A layer's bias after its sparse product, in place, bound per signature: exact on small integers."""
    from tcgnn_py.nn._layers import add_bias

    rng = np.random.default_rng(0)
    dt = _dtype(dtype)
    X, b = ints(rng, 1001, 37), ints(rng, 37)
    for _ in range(2):
        x = cp.asarray(X).astype(dt)
        assert add_bias(x, cp.asarray(b).astype(dt)) is x
        np.testing.assert_array_equal(x.get().astype(np.float64), X.astype(np.float64) + b)


def test_dense_mm_routes_the_others_to_cublas(cp):
    """``mm`` runs its own kernel only for what it takes: wide k or outputs, other dtypes, mixed dtypes and rows of
    non-unit stride go to cuBLAS or CuPy, with the same results; a bias of another dtype is added after."""
    from tcgnn_py.nn._layers import mm
    from tcgnn_py.products import dense

    rng = np.random.default_rng(0)
    cases = [(ints(rng, dense.DENSE_SHORT_ROWS + 1, dense.DENSE_MAX_K + 1), ints(rng, dense.DENSE_MAX_K + 1, 8)),
             (ints(rng, 50, dense.DENSE_SHORT_K + 1), ints(rng, dense.DENSE_SHORT_K + 1, 8)),
             (ints(rng, 50, 8), ints(rng, 8, dense.DENSE_MAX_N + 1)), (ints(rng, 50, 8), ints(rng, 8, 40)),
             (ints(rng, 50, 8, dtype=np.float64), ints(rng, 8, 8)),
             (ints(rng, 50, 8, dtype=np.float64), ints(rng, 8, 8, dtype=np.float64)),
             (ints(rng, 50, 8, dtype=np.float16), ints(rng, 8, 8, dtype=np.float16))]
    for A, B in cases:
        a, b = cp.asarray(A), cp.asarray(B)
        assert not dense.dense_takes(a, b)
        np.testing.assert_array_equal(mm(a, b).get(), A.astype(np.float64) @ B)
    a, b = cp.asarray(ints(rng, 40, 8)), cp.asarray(ints(rng, 8, 6))
    assert not dense.dense_takes(a.T, a) and not dense.dense_takes(a.astype(np.int32), b.astype(np.int32))
    assert dense.dense_atb_takes(a, a) and not dense.dense_atb_takes(a.T, b)  # Hᵀ G: a sum over rows, its own kernel
    np.testing.assert_array_equal(mm(a.T, a).get(), a.get().T.astype(np.float64) @ a.get())
    wide = cp.asarray(ints(rng, 40, dense.DENSE_ATB_MAX + 1))
    assert not dense.dense_atb_takes(wide, a) and dense.dense_atb_takes(None, wide)  # (40 rows: short)
    np.testing.assert_array_equal(mm(wide.T, a).get(), wide.get().T.astype(np.float64) @ a.get())
    tall = cp.asarray(ints(rng, dense.DENSE_SHORT_ROWS + 1, dense.DENSE_ATB_MAX + 1))
    assert not dense.dense_atb_takes(None, tall) and not dense.dense_atb_takes(tall[:, :dense.DENSE_ATB_FEW + 1], tall)
    np.testing.assert_array_equal(mm(tall[:, :9].T, tall).get(), tall[:, :9].get().T.astype(np.float64) @ tall.get())
    bias = ints(rng, 6, dtype=np.float64)
    c = mm(a, b, cp.asarray(bias))
    assert c.dtype == np.float32
    np.testing.assert_array_equal(c.get(), a.get().astype(np.float64) @ b.get() + bias)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("heads, D", [(1, 64), (8, 8), (3, 5)])
def test_head_dots_on_device_are_the_formula(cp, dtype, heads, D):
    """GAT's per-head scores and their vjp against NumPy: exact on small integers (every product and sum is)."""
    from tcgnn_py.products import pointwise

    rng = np.random.default_rng(0)
    dt = _dtype(dtype)
    acc = np.float64 if dtype == "float64" else np.float32
    n = 1001
    X, g = ints(rng, n, heads * D), ints(rng, n, heads * D)
    a1, a2, d1, d2 = ints(rng, heads, D), ints(rng, heads, D), ints(rng, n, heads), ints(rng, n, heads)
    s1, s2 = pointwise.head_dots(cp.asarray(X).astype(dt), cp.asarray(a1, acc), cp.asarray(a2, acc), heads)
    X3 = X.reshape(n, heads, D).astype(np.float64)
    assert s1.dtype == acc and s1.shape == (n, heads)
    np.testing.assert_array_equal(s1.get(), (X3 * a1).sum(axis=2))
    np.testing.assert_array_equal(s2.get(), (X3 * a2).sum(axis=2))
    dx = pointwise.head_dots_grad(cp.asarray(g).astype(dt), cp.asarray(d1, acc), cp.asarray(d2, acc), cp.asarray(a1, acc),
                          cp.asarray(a2, acc), heads)
    want = g.reshape(n, heads, D) + d1[:, :, None] * a1 + d2[:, :, None] * a2  # |.| <= 136: exact in bfloat16
    assert dx.dtype == dt
    np.testing.assert_array_equal(dx.get().astype(np.float64), want.reshape(n, heads * D))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("heads, D", [(1, 64), (2, 3), (8, 8), (4, 33)])
def test_head_blocks_gather_the_diagonal_blocks(cp, dtype, heads, D):
    """GAT's attention-vector gradients: row h's h-th block of D columns of each of two arrays, exactly."""
    from tcgnn_py.products import pointwise

    rng = np.random.default_rng(0)
    dt = _dtype(dtype)
    R1, R2 = ints(rng, heads, heads * D), ints(rng, heads, heads * D)
    a1, a2 = pointwise.head_blocks(cp.asarray(R1).astype(dt), cp.asarray(R2).astype(dt), heads)
    for got, R in ((a1, R1), (a2, R2)):
        assert got.dtype == dt and got.shape == (heads, D) and got.flags.c_contiguous
        want = np.stack([R[h, h * D:(h + 1) * D] for h in range(heads)])
        np.testing.assert_array_equal(got.get().astype(np.float64), want)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 100_003])
def test_total_is_one_fixed_order_sum(cp, dtype, n):
    """The one-launch sum: exact on small integers (every partial sum is, in the compute type) and rounded once into
    x's type, 0 for no elements, the requested shape, and the same bits on every call for random floats (one
    fixed order)."""
    from tcgnn_py.products import pointwise

    rng = np.random.default_rng(0)
    dt = _dtype(dtype)
    x = ints(rng, n, dtype=np.float64)
    got = pointwise.total(cp.asarray(x).astype(dt))
    assert got.shape == () and got.dtype == dt
    assert float(got) == float(np.array(x.sum()).astype(dt))  # exact, then rounded once  # synchronize!
    assert pointwise.total(cp.asarray(x).astype(dt), (1,)).shape == (1,)
    r = cp.asarray(rng.standard_normal(n)).astype(dt)
    first = pointwise.total(r)
    assert all(pointwise.total(r).tobytes() == first.tobytes() for _ in range(3))
    if n and dtype in ("float32", "float64"):
        np.testing.assert_allclose(float(first), float(r.astype(np.float64).sum()), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("d", [1, 16, 45, 300])
def test_row_normalize_on_device_is_the_formula(cp, dtype, d):
    """AGNN's row normalisation and its vjp against NumPy in float64, zero rows included (norm below eps: no
    radial part, a 1 / eps scale), within the rounding of the stored type."""
    from tcgnn_py.products import pointwise

    rng = np.random.default_rng(0)
    dt = _dtype(dtype)
    acc = np.float64 if dtype == "float64" else np.float32
    n, eps = 517, 1e-12
    H = ints(rng, n, d).astype(np.float64)
    H[[0, 7, 300]] = 0
    xn, norm = pointwise.row_normalize(cp.asarray(H).astype(dt), eps)
    want_norm = np.sqrt((H * H).sum(axis=1))
    inv = 1 / np.maximum(want_norm, eps)
    tol = {"float64": 1e-15, "float32": 3e-7, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
    assert xn.dtype == dt and norm.dtype == acc
    np.testing.assert_allclose(norm.get(), want_norm, rtol=3e-7 if acc == np.float32 else 1e-15)
    np.testing.assert_allclose(xn.get().astype(np.float64), H * inv[:, None], rtol=tol, atol=tol)
    dv, dq, dk = ints(rng, n, d), ints(rng, n, d), ints(rng, n, d)
    dh = pointwise.row_normalize_grad(cp.asarray(dv).astype(dt), cp.asarray(dq, acc), cp.asarray(dk, acc), xn, norm, eps)
    xn64, dn = xn.get().astype(np.float64), (dq + dk).astype(np.float64)
    radial = np.where(want_norm > eps, (xn64 * dn).sum(axis=1), 0)
    want = dv.astype(np.float64) + (dn - xn64 * radial[:, None]) * inv[:, None]
    assert dh.dtype == acc
    scale = np.abs(dv).max() + (np.abs(dn) + np.abs(xn64 * radial[:, None])).max(axis=1, keepdims=True) * inv[:, None]
    bound = np.broadcast_to(4 * np.finfo(acc).eps * scale * max(d, 8), want.shape)
    np.testing.assert_array_less(np.abs(dh.get() - want), bound)


def _general(monkeypatch, f, *args, **kwargs):
    """``f(*args)`` on the layers' general code: no call of it is bound, and none binds."""
    from tcgnn_py.nn import _bound

    with monkeypatch.context() as m:
        m.setattr(_bound, "lookup", lambda *a: (None, None))
        return f(*args, **kwargs)


def _bound_calls(A):
    """The layers' bound calls on A's graph (in its tiling's store of bound calls, beside its products' plans)."""
    return {k: v for k, v in A.tiling.bound().items() if k[0] == "layer"}


@pytest.mark.parametrize("n, d_in, d_out", [(37, 20, 7), (1000, 7, 20), (1000, 64, 64), (4099, 200, 16),
                                            (300, 16, 80)])
@pytest.mark.parametrize("bias", [True, False])
def test_bound_gcn_conv_is_the_general_call(cp, monkeypatch, n, d_in, d_out, bias):
    """From its second call a signature's gcn_conv runs bound (and from its second vjp, its vjp): every result is
    the general code's, bit for bit, over new operands each step, and the vjp without the input's gradient too.
    Exact on small integers, so the general results are checked against NumPy as well."""
    rng = np.random.default_rng(0)
    A = tg.TiledMatrix(int_graph(rng, n, n, degree=min(12, n // 3)).astype(np.float32))
    M = A.toarray().astype(np.float64)
    for step in range(8):  # forward bound from step 2, the vjps from steps 6 and 7
        H, W, g = ints(rng, n, d_in), ints(rng, d_in, d_out), ints(rng, n, d_out)
        b = ints(rng, d_out) if bias else None
        dev = [None if x is None else cp.asarray(x) for x in (H, W, b, g)]
        want, want_vjp = _general(monkeypatch, nn.gcn_conv, A, *dev[:3])
        want_grads = _general(monkeypatch, want_vjp, dev[3], input_grad=step % 2 == 0)
        out, vjp = nn.gcn_conv(A, *dev[:3])
        np.testing.assert_array_equal(out.get(), want.get())
        grads = vjp(dev[3], input_grad=step % 2 == 0)
        assert (grads[0] is None) == (step % 2 == 1) and (grads[2] is None) == (not bias)
        for got, exp in zip(grads, want_grads):
            assert (got is None) == (exp is None)
            if got is not None:
                np.testing.assert_array_equal(got.get(), exp.get())
        if step == 0 and d_in <= 32:  # the general results are the formula (exact: H W's sums within 2^11)
            Z = M @ H @ W + (b if bias else 0)
            np.testing.assert_array_equal(want.get(), Z.astype(np.float32))
            np.testing.assert_array_equal(want_grads[1].get(), (H.T @ M.T @ g).astype(np.float32))
    calls = list(_bound_calls(A).values())
    assert len(calls) == 1 and len(calls[0].backward.bound) == 2  # the forward and both vjps bound


@pytest.mark.parametrize("m, k, n", [(1, 129, 1), (5, 131, 2), (77, 1433, 24), (1001, 333, 7), (3000, 500, 16),
                                     (600, 130, 32), (70000, 132, 16)])
def test_dropped_products_are_dropout_then_product(cp, m, k, n):
    """drop_mm and drop_atb read a dropped input as the dropout kernel drops it: exact on small integers against the
    dropout's array times W (and its transpose times G), over row-strided inputs and transposed weights too, wide
    inputs cut into slices of k, long ones into slices of rows."""
    from tcgnn_py.products import dense, pointwise

    rng = np.random.default_rng(m + k)
    X, W, G = ints(rng, m, k), ints(rng, k, n), ints(rng, m, n)
    seed = pointwise.draw(cp.random.default_rng(0))
    Xd = pointwise.tail(cp.asarray(X), None, None, 0.5, seed).get().astype(np.float64)
    Xv = cp.zeros((m, k + 3), np.float32)[:, :k]
    Xv[...] = cp.asarray(X)
    for a in (cp.asarray(X), Xv):
        assert dense.drop_takes(a, cp.asarray(W)) and dense.drop_atb_takes(a, cp.asarray(G))
        for w in (cp.asarray(W), cp.asarray(np.ascontiguousarray(W.T)).T):
            np.testing.assert_array_equal(dense.drop_mm(a, w, seed, 0.5).get(), (Xd @ W).astype(np.float32))
        np.testing.assert_array_equal(dense.drop_atb(a, cp.asarray(G), seed, 0.5).get(),
                                      (Xd.T @ G).astype(np.float32))


def test_dropped_products_keep_one_partial_buffer_per_stream(cp):
    """New row counts each step (a batch of graphs, a sampled block) bind new launches but share one buffer of
    partial sums per stream, replaced by a larger one where too small: what the products hold stays bounded."""
    from tcgnn_py.products import dense, pointwise

    r = cp.random.default_rng(2)
    seed = pointwise.draw(r)
    W = r.standard_normal((600, 16), dtype=np.float32)
    dense._drop_scratch.clear()
    sizes = []
    for m in (500, 3000, 700, 9000, 1200):
        X = r.standard_normal((m, 600), dtype=np.float32)
        dense.drop_mm(X, W, seed, 0.5)
        dense.drop_atb(X, X[:, :16].copy(), seed, 0.5)
        cp.cuda.Device().synchronize()
        assert len(dense._drop_scratch) == 1
        sizes.append(next(iter(dense._drop_scratch.values())).size)
    assert sizes == sorted(sizes) and len(set(sizes)) < len(sizes)  # (grown where too small, else kept)


def test_dropped_products_keep_float32_accuracy(cp):
    """3xTF32 on random floats: within a few float32 roundings of float64 (a TF32 product errs ~100x more), the
    same bits on every run, and the mask of another rate (a scale other than 2) as the dropout kernel's."""
    from tcgnn_py.products import dense, pointwise

    r = cp.random.default_rng(1)
    X, W, G = (r.standard_normal(s, dtype=np.float32) for s in ((3000, 700), (700, 16), (3000, 16)))
    seed = pointwise.draw(r)
    Xd = pointwise.tail(X, None, None, 0.3, seed).get().astype(np.float64)
    pairs = ((dense.drop_mm(X, W, seed, 0.3), Xd @ W.get()), (dense.drop_atb(X, G, seed, 0.3), Xd.T @ G.get()))
    for got, want in pairs:
        assert np.abs(got.get() - want).max() <= 4e-6 * np.abs(want).max()
    assert bool((dense.drop_mm(X, W, seed, 0.3) == dense.drop_mm(X, W, seed, 0.3)).all())
    assert bool((dense.drop_atb(X, G, seed, 0.3) == dense.drop_atb(X, G, seed, 0.3)).all())


@pytest.mark.parametrize("n, d_in, d_out", [(300, 500, 16), (257, 140, 7), (257, 40, 7), (1000, 7, 20)])
def test_gcn_conv_dropout_on_device_is_dropout_then_gcn_conv(cp, n, d_in, d_out):
    """``gcn_conv(dropout_p=...)`` (the dropout read by the product where it reads a wide H first, else run first
    inside the layer; bound from the second call) gives gcn_conv of the dropout's array, bit for bit on small
    integers, every gradient too."""
    rng = np.random.default_rng(0)
    A = tg.TiledMatrix(int_graph(rng, n, n, degree=8).astype(np.float32))
    for step in range(5):
        H, W, b, g = ints(rng, n, d_in), ints(rng, d_in, d_out), ints(rng, d_out), ints(rng, n, d_out)
        dev = [cp.asarray(x) for x in (H, W, b, g)]
        Hd, d_vjp = nn.dropout(dev[0], 0.5, cp.random.default_rng(step))
        want, want_vjp = nn.gcn_conv(A, Hd, *dev[1:3])
        exp = want_vjp(dev[3])
        out, vjp = nn.gcn_conv(A, *dev[:3], dropout_p=0.5, rng=cp.random.default_rng(step))
        got = vjp(dev[3], input_grad=step % 2 == 0)
        np.testing.assert_array_equal(out.get(), want.get())
        if step % 2 == 0:
            np.testing.assert_array_equal(got[0].get(), d_vjp(exp[0]).get())
        else:
            assert got[0] is None
        for x, y in zip(got[1:], exp[1:]):
            np.testing.assert_array_equal(x.get(), y.get())
    # every dropped call bound under its own key, its dropout inside it (read by the product or run first), beside
    # the plain calls that computed what it must equal
    assert {k[1][2] for k in _bound_calls(A)} == {0.0, 0.5}


@pytest.mark.parametrize("m, k, n", [(300, 500, 16), (257, 40, 7)])
def test_linear_dropout_on_device_is_dropout_then_linear(cp, m, k, n):
    """``linear(dropout_p=...)`` (a wide input read dropped by its product, a narrow one dropped first) gives
    ``linear(dropout(H))``, bit for bit on small integers, every gradient too."""
    rng = np.random.default_rng(m)
    X, W, b, g = (cp.asarray(x) for x in (ints(rng, m, k), ints(rng, k, n), ints(rng, n), ints(rng, m, n)))
    Hd, d_vjp = nn.dropout(X, 0.5, cp.random.default_rng(3))
    want, want_vjp = nn.linear(Hd, W, b)
    out, vjp = nn.linear(X, W, b, dropout_p=0.5, rng=cp.random.default_rng(3))
    np.testing.assert_array_equal(out.get(), want.get())
    got, exp = vjp(g), want_vjp(g)
    np.testing.assert_array_equal(got[0].get(), d_vjp(exp[0]).get())
    for x, y in zip(got[1:], exp[1:]):
        np.testing.assert_array_equal(x.get(), y.get())
    assert vjp(g, input_grad=False)[0] is None


def test_bound_gcn_conv_serves_its_signature_only(cp, monkeypatch):
    """A bound call takes only its own signature: rows of another stride, another width, no bias, other dtypes,
    another stream run the general code (and bind there in turn), and every check still speaks."""
    rng = np.random.default_rng(0)
    n = 500
    A = nn.gcn_norm(random_graph(rng, n, density=0.02), dtype=np.float32)
    H, W, b, g = (cp.asarray(x) for x in (ints(rng, n, 24), ints(rng, 24, 8), ints(rng, 8), ints(rng, n, 8)))
    for _ in range(3):
        nn.gcn_conv(A, H, W, b)[1](g)
    assert len(_bound_calls(A)) == 1
    wide = cp.asarray(ints(rng, n, 30))
    others = [(wide[:, :24], W, b), (H, W[:, :6].copy(), b[:6].copy()), (H, W, None),
              (H.astype(np.float64), W.astype(np.float64), b.astype(np.float64))]
    for args in others:
        for _ in range(3):
            out, _ = nn.gcn_conv(A, *args)
            want, _ = _general(monkeypatch, nn.gcn_conv, A, *args)
            np.testing.assert_array_equal(out.get(), want.get())
    with cp.cuda.Stream():
        for _ in range(3):
            out, vjp = nn.gcn_conv(A, H, W, b)
            want = _general(monkeypatch, nn.gcn_conv, A, H, W, b)[1](g)[1]
            np.testing.assert_array_equal(vjp(g)[1].get(), want.get())
    assert len(_bound_calls(A)) == 5  # float32 signatures bind; float64 runs the general code
    with pytest.raises(ValueError, match="rows"):
        nn.gcn_conv(A, H[:-1], W, b)
    with pytest.raises(ValueError, match="output's shape"):
        nn.gcn_conv(A, H, W, b)[1](g[:-1])
    with pytest.raises(ValueError, match="features"):
        nn.gcn_conv(A, H, W[:-1], b)


def test_bound_spmm_runs_the_plan_once_it_binds(cp, monkeypatch):
    """A bound layer call's product, bound before its plan has (the plan waits for the timed choice's compiles,
    which outlast a layer's second call), runs the general product only until the plan binds, then its launch."""
    from tcgnn_py import _tiled
    from tcgnn_py.kernels.registry import wait_for_compiles

    rng = np.random.default_rng(0)
    n = 600
    A = tg.TiledMatrix(int_graph(rng, n, n, degree=8).astype(np.float32))
    X = cp.asarray(ints(rng, n, 24))
    want = A.toarray().astype(np.float64) @ X.get()
    f = _tiled.bound_spmm(A, X)  # no plan yet: the general product
    general = []
    real = _tiled.spmm
    monkeypatch.setattr(_tiled, "spmm", lambda *a, **k: general.append(1) or real(*a, **k))
    np.testing.assert_array_equal(f(X).get(), want)
    assert general
    wait_for_compiles()
    f(X)  # (a general call binds the plan where the first could not)
    general.clear()
    for _ in range(3):
        np.testing.assert_array_equal(f(X).get(), want)
    assert not general


@pytest.mark.parametrize("heads, D, bias, drop", [(1, 16, True, 0.0), (4, 8, False, 0.0), (2, 16, True, 0.3)])
def test_bound_gat_and_agnn_conv_are_the_general_calls(cp, monkeypatch, heads, D, bias, drop):
    """gat_conv and agnn_conv bind from a signature's second call on the fused path, and their vjps from a bound
    call's second vjp of a gradient signature: forward and vjp are the general code's, bit for bit, over new
    operands each step (attention dropout: the same seeds drawn)."""
    rng = np.random.default_rng(0)
    n = 700
    A = nn.add_self_loops(random_graph(rng, n, density=0.02), dtype=np.float32)
    f32 = np.float32
    for step in range(8):  # forward bound from step 2, the vjps from steps 6 and 7
        H = cp.asarray(rng.standard_normal((n, 24), dtype=f32))
        W = cp.asarray(rng.standard_normal((24, heads * D), dtype=f32) / 4)
        a1, a2 = (cp.asarray(rng.standard_normal((heads, D), dtype=f32)) for _ in range(2))
        b = cp.asarray(rng.standard_normal(heads * D, dtype=f32)) if bias else None
        g = cp.asarray(rng.standard_normal((n, heads * D), dtype=f32))
        beta = cp.asarray([0.5 + step], f32)
        runs = []
        for general in (True, False):
            r = cp.random.default_rng(step)  # the same dropout seeds on both runs
            def call(f, *a, general=general, **k):
                return _general(monkeypatch, f, *a, **k) if general else f(*a, **k)

            out, vjp = call(nn.gat_conv, A, H, W, a1, a2, b, heads=heads, dropout=drop, rng=r)
            grads = call(vjp, g, input_grad=step % 2 == 0)
            aout, avjp = call(nn.agnn_conv, A, H, beta)
            runs.append((out, *grads, aout, *call(avjp, H)))
        for got, want in zip(runs[1], runs[0]):
            assert (got is None) == (want is None)
            if got is not None:
                np.testing.assert_array_equal(got.get(), want.get())
    calls = _bound_calls(A)
    assert len(calls) == 2  # one gat_conv signature, one agnn_conv
    assert sorted(len(c.backward.bound) for c in calls.values()) == [1, 2]  # agnn's vjp, gat's with and without dH


@pytest.mark.parametrize("d_in, d_out", [(24, 16), (16, 24)])
@pytest.mark.parametrize("heads", [1, 4])
def test_bound_calls_results_outlive_later_calls(cp, monkeypatch, d_in, d_out, heads):
    """A bound call's intermediates are its own, written anew by every call; its results are new arrays: three
    bound forward calls, then their vjps in reverse order, leave every result the general code's, bit for bit,
    read after all of them ran."""
    rng = np.random.default_rng(0)
    n, f32 = 500, np.float32
    G = random_graph(rng, n, density=0.02)
    A, S = nn.gcn_norm(G, dtype=f32), nn.add_self_loops(G, dtype=f32)
    D = d_out // heads
    W = cp.asarray(rng.standard_normal((d_in, d_out), dtype=f32) / 4)
    b = cp.asarray(rng.standard_normal(d_out, dtype=f32))
    a1, a2 = (cp.asarray(rng.standard_normal((heads, D), dtype=f32)) for _ in range(2))
    beta = cp.asarray([0.5], f32)
    layers = {"gcn": lambda H: nn.gcn_conv(A, H, W, b), "gat": lambda H: nn.gat_conv(S, H, W, a1, a2, b, heads=heads),
              "agnn": lambda H: nn.agnn_conv(S, H, beta)}
    for name, layer in layers.items():
        Hs = [cp.asarray(rng.standard_normal((n, d_in), dtype=f32)) for _ in range(3)]
        gs = [cp.asarray(rng.standard_normal((n, d_in if name == "agnn" else d_out), dtype=f32)) for _ in range(3)]
        for _ in range(5):  # the forward call and its vjp bound
            layer(Hs[0])[1](gs[0])
        calls = [layer(H) for H in Hs]
        grads = [calls[i][1](gs[i]) for i in (2, 1, 0)][::-1]
        for H, g, (out, _), got in zip(Hs, gs, calls, grads):
            want, vjp = _general(monkeypatch, layer, H)
            np.testing.assert_array_equal(out.get(), want.get(), err_msg=name)
            for x, y in zip(got, _general(monkeypatch, vjp, g)):
                np.testing.assert_array_equal(x.get(), y.get(), err_msg=name)
    assert len(_bound_calls(A)) == 1 and len(_bound_calls(S)) == 2


@pytest.mark.parametrize("name", ["gcn", "gcn wide first", "gat", "gat 4 heads", "agnn"])
def test_bound_calls_reuse_only_the_results_nobody_holds(cp, monkeypatch, name):
    """A bound call's results come back in a later call once nothing holds them (their memory, as the pool would
    hand it out again), never while anything does: in a training loop's steady state a call allocates nothing,
    while results held, directly or through a view, keep their values; every result the general code's."""
    rng = np.random.default_rng(0)
    n, f32 = 400, np.float32
    G = random_graph(rng, n, density=0.02)
    A = nn.gcn_norm(G, dtype=f32) if name.startswith("gcn") else nn.add_self_loops(G, dtype=f32)
    d_in, d_out = (8, 16) if name == "gcn wide first" else (16, 16)
    heads = 4 if name == "gat 4 heads" else 1
    W = cp.asarray(rng.standard_normal((d_in, d_out), dtype=f32) / 4)
    b = cp.asarray(rng.standard_normal(d_out, dtype=f32))
    a1, a2 = (cp.asarray(rng.standard_normal((heads, d_out // heads), dtype=f32)) for _ in range(2))
    beta = cp.asarray([0.5], f32)
    layer = {"gcn": lambda H: nn.gcn_conv(A, H, W, b), "gat": lambda H: nn.gat_conv(A, H, W, a1, a2, b, heads=heads),
             "agnn": lambda H: nn.agnn_conv(A, H, beta)}[name.split()[0]]
    H = cp.asarray(rng.standard_normal((n, d_in), dtype=f32))
    g = cp.asarray(rng.standard_normal((n, d_in if name == "agnn" else d_out), dtype=f32))
    want, vjp = _general(monkeypatch, layer, H)
    want_grads = _general(monkeypatch, vjp, g)

    def check(out, grads, rows=slice(None)):
        np.testing.assert_array_equal(out.get(), want[rows].get())
        for x, y in zip(grads, want_grads):
            assert (x is None) == (y is None)
            if x is not None:
                np.testing.assert_array_equal(x.get(), y.get())

    from tcgnn_py.kernels.registry import wait_for_compiles

    wait_for_compiles()  # (the sparse products' plans bind once their timed choice has compiled)
    for _ in range(8):  # the call and its vjp bound (the vjp's binding follows the call's), their results made
        out, vjp = layer(H)
        grads = vjp(g)
    allocations = []
    pool = cp.cuda.get_allocator()

    def counting(size):
        allocations.append(size)
        return pool(size)

    cp.cuda.set_allocator(counting)
    try:
        for _ in range(4):  # a training loop: a step's results are dropped once the next step has returned
            out, vjp = layer(H)
            grads = vjp(g)
    finally:
        cp.cuda.set_allocator(pool)
    assert allocations == []
    check(out, grads)
    held, held_grads = out[2:], grads  # this step's results, held (the output through a view)
    del out, vjp, grads
    for _ in range(3):
        out, vjp = layer(H)
        grads = vjp(g)
        check(out, grads)
    check(held, held_grads, slice(2, None))


@pytest.mark.parametrize("model", ["gcn", "gat", "agnn"])
def test_bound_models_are_the_general_models(cp, monkeypatch, model):
    """The models reach bound calls through their edge views (dropout drawn from one seed on both runs): a
    training step's logits and gradients are the general code's, bit for bit, once bound."""
    g = tg.load_cora()
    A = (nn.gcn_norm if model == "gcn" else nn.add_self_loops)(g.adj)
    X = cp.asarray(g.features.toarray().astype(np.float32))
    init, apply = getattr(nn, f"{model}_init"), getattr(nn, f"{model}_apply")
    params = init((X.shape[1], 16, 7), nn.default_rng(0, like=A))
    dlogits = cp.asarray(np.random.default_rng(1).standard_normal((X.shape[0], 7), dtype=np.float32))
    for step in range(8):
        runs = []
        for general in (True, False):
            def step_of(rng=nn.default_rng(step, like=A)):
                logits, vjp = apply(params, A, X, rng=rng)
                return logits, vjp(dlogits)

            runs.append(_general(monkeypatch, step_of) if general else step_of())
        (want, want_grads), (got, grads) = runs
        np.testing.assert_array_equal(got.get(), want.get())
        assert sorted(grads) == sorted(want_grads)
        for k in grads:
            np.testing.assert_array_equal(grads[k].get(), want_grads[k].get())
    assert _bound_calls(A)  # (GAT: both layers, the first's product on cuBLAS)
