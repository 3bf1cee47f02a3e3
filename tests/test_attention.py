"""Fused graph attention (``tcgnn_py.nn.graph_attention``, ``gat_conv``, ``agnn_conv``): against a dense
float64 computation, gradients against finite differences, edge cases; the GPU kernel against the reference."""

import numpy as np
import pytest
import scipy.sparse as sp
from _env import cupy_fixture, ints

import tcgnn_py as tg
from tcgnn_py import _reference as ref

nn = tg.nn
cp = cupy_fixture()


def _graph(rng, n, k=None, density=0.2, loops=True):
    k = n if k is None else k
    A = sp.random(n, k, density=density, format="csr", random_state=rng.integers(1 << 30))
    A.data[:] = rng.uniform(0.5, 2, A.nnz)
    if loops and n == k:
        A = A + sp.eye(n)
    return sp.csr_array(A)


def _dense_attention(A, V, heads, z_of, keep=None):
    """``out`` by dense float64 arithmetic: P = a exp(z) / sum, dropped entries then scaled."""
    Ad = A.toarray()
    n, D = A.shape[0], V.shape[1] // heads
    out = np.zeros((n, heads, D))
    for h in range(heads):
        z = z_of(h)
        with np.errstate(invalid="ignore", over="ignore"):  # empty rows: their max is -inf (masked below)
            zmax = np.where(Ad != 0, z, -np.inf).max(1, keepdims=True, initial=-np.inf)
            P = np.where(Ad != 0, Ad * np.exp(z - zmax), 0)
        s = P.sum(1, keepdims=True)
        P = np.where(s > 0, P / np.where(s > 0, s, 1), 0)
        if keep is not None:
            P = P * keep[h]
        out[:, h] = P @ V.reshape(-1, heads, D)[:, h]
    return out.reshape(n, heads * D)


def _additive(A, ss, sd, slope=0.2):
    def z_of(h):
        z = sd[:, h][:, None] + ss[:, h][None, :]
        return np.where(z > 0, z, slope * z)
    return z_of


@pytest.mark.parametrize("heads,D,rect", [(1, 5, False), (3, 7, False), (8, 8, False), (2, 4, True)])
def test_additive_matches_dense_float64(heads, D, rect):
    rng = np.random.default_rng(0)
    A = _graph(rng, 31, 23 if rect else None)
    n, k = A.shape
    T = tg.TiledMatrix(A, dtype=np.float64, device="cpu")
    V, ss, sd = rng.standard_normal((k, heads * D)), rng.standard_normal((k, heads)), rng.standard_normal((n, heads))
    out, _ = nn.graph_attention(T, V, heads=heads, s_src=ss, s_dst=sd)
    np.testing.assert_allclose(out, _dense_attention(A, V, heads, _additive(A, ss, sd)), rtol=1e-12, atol=1e-12)


def _numeric_grad(f, arrays, i, eps=1e-6):
    arr = arrays[i]
    num = np.zeros_like(arr)
    for idx in np.ndindex(arr.shape):
        x = [a.copy() for a in arrays]
        x[i][idx] += eps
        fp = f(*x)
        x[i][idx] -= 2 * eps
        num[idx] = (fp - f(*x)) / (2 * eps)
    return num


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_gat_conv_gradients(dropout):
    rng = np.random.default_rng(0)
    A = _graph(rng, 12)
    T = tg.TiledMatrix(A, dtype=np.float64, device="cpu")
    heads, D = 2, 3
    arrays = [rng.standard_normal(s) for s in ((12, 4), (4, heads * D), (heads, D), (heads, D), (heads * D,))]
    seed = 12345

    def run(*a):
        return nn.gat_conv(T, *a, heads=heads, dropout=dropout, rng=np.random.default_rng(seed))

    out, vjp = run(*arrays)
    g = rng.standard_normal(out.shape)
    grads = vjp(g)
    for i in range(len(arrays)):
        num = _numeric_grad(lambda *a: (run(*a)[0] * g).sum(), arrays, i)
        np.testing.assert_allclose(grads[i], num, rtol=1e-5, atol=1e-6, err_msg=str(i))


def test_agnn_fused_matches_unfused_with_gradients():
    rng = np.random.default_rng(0)
    A = _graph(rng, 20)
    T = tg.TiledMatrix(A, dtype=np.float64, device="cpu")
    H, beta = rng.standard_normal((20, 6)), np.array([0.8])
    (o1, v1), (o2, v2) = nn.agnn_conv(T, H, beta), nn.agnn_conv(T, H, beta, fused=False)
    np.testing.assert_allclose(o1, o2, rtol=1e-12, atol=1e-12)
    g = rng.standard_normal(o1.shape)
    for a, b in zip(v1(g), v2(g)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_dropout_mask_is_the_kernels_hash():
    """The reference's mask: about the asked fraction kept, scaled by 1 / (1 - p), fixed by the seed."""
    seed = np.array([7], np.uint32)
    m = ref.attention_keep(np.arange(100000), 2, seed, 0.6)
    kept = np.float32(1) / (np.float32(1) - np.float32(0.6))  # in float32, as the kernel
    assert set(np.unique(m).tolist()) == {0.0, float(kept)}
    assert abs((m > 0).mean() - 0.4) < 0.01
    np.testing.assert_array_equal(m, ref.attention_keep(np.arange(100000), 2, seed, 0.6))
    assert not np.array_equal(m, ref.attention_keep(np.arange(100000), 2, seed + 1, 0.6))


def test_empty_rows_zero_weights_and_nan():
    # rows 0 and 2 empty; row 1 holds (1, 0) of weight 1 and (1, 1) of weight 0
    A = sp.csr_array((np.array([1.0, 0.0]), np.array([0, 1]), np.array([0, 0, 2, 2])), shape=(3, 3))
    T = tg.TiledMatrix(A, dtype=np.float64, device="cpu")
    V = np.arange(6.0).reshape(3, 2)
    s = np.zeros((3, 1))
    out, vjp = nn.graph_attention(T, V, s_src=s, s_dst=s)
    np.testing.assert_array_equal(out, [[0, 0], [0, 1], [0, 0]])  # the weight-0 entry takes no part
    s_nan = s.copy()
    s_nan[0] = np.nan
    out, _ = nn.graph_attention(T, V, s_src=s_nan, s_dst=s)
    assert np.isnan(out[1]).all() and not np.isnan(out[[0, 2]]).any()
    very_negative = np.full((3, 1), -1e30)
    out, _ = nn.graph_attention(T, V, s_src=very_negative, s_dst=s)  # exp underflows everywhere: still finite
    np.testing.assert_array_equal(out[1], [0, 1])


def test_errors_name_the_argument():
    T = tg.TiledMatrix(sp.csr_array(np.eye(3)), device="cpu")
    V, s = np.ones((3, 4)), np.zeros((3, 2))
    with pytest.raises(ValueError, match="score"):
        nn.graph_attention(T, V, heads=2, score="dot", s_src=s, s_dst=s)
    with pytest.raises(ValueError, match="heads"):
        nn.graph_attention(T, V, heads=3, s_src=s, s_dst=s)
    with pytest.raises(ValueError, match="s_src"):
        nn.graph_attention(T, V, heads=2, s_src=np.zeros((3, 1)), s_dst=s)
    with pytest.raises(TypeError, match="seed"):
        nn.graph_attention(T, V, heads=2, s_src=s, s_dst=s, dropout=0.5)
    with pytest.raises(ValueError, match="dropout"):
        nn.graph_attention(T, V, heads=2, s_src=s, s_dst=s, dropout=1.0, seed=np.zeros(1, np.uint32))
    # the layers check what they hand the attention pass themselves
    W, a = np.ones((4, 4)), np.zeros((2, 2))
    R = tg.TiledMatrix(sp.csr_array(np.ones((3, 5))), device="cpu")
    with pytest.raises(ValueError, match="square graph"):
        nn.gat_conv(R, V, W, a, a, heads=2)
    for kw, match in ((dict(negative_slope=float("nan")), "negative_slope"), (dict(fused="yes"), "fused")):
        with pytest.raises((TypeError, ValueError), match=match):
            nn.gat_conv(T, V, W, a, a, heads=2, **kw)
    with pytest.raises(TypeError, match="fused"):
        nn.agnn_conv(T, V, 1.0, fused="yes")


def test_a_layers_fallback_warns_on_every_call():
    """``fused=True`` where the fused kernels cannot run: each call warns (not only the first), attributed to
    the caller of the public function."""
    from tcgnn_py.nn._edges import CSREdges

    rng = np.random.default_rng(6)
    E = CSREdges(sp.csr_matrix(_graph(rng, 20)))
    H, W, a = rng.standard_normal((20, 4)), rng.standard_normal((4, 4)), rng.standard_normal((1, 4))
    for _ in range(2):
        for call in (lambda: nn.gat_conv(E, H, W, a, a, fused=True),
                     lambda: nn.agnn_conv(E, H, np.array([1.0]), fused=True),
                     lambda: nn.graph_attention(E, H, s_src=H[:, :1], s_dst=H[:, :1], fused=True)):
            with pytest.warns(tg.FallbackWarning, match="CSREdges view") as record:
                call()
            assert record[0].filename == __file__  # attributed to the caller


@pytest.mark.parametrize("score", ["additive", "cosine"])
@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_unfused_sequence_matches_the_reference(score, dropout):
    """``fused=False`` (scores, edge softmax and SpMM in turn, the comparison the benchmarks make) against the
    reference, forward and backward."""
    rng = np.random.default_rng(5)
    A = _graph(rng, 60, density=0.1)
    A.data[::7] = 0.0  # weight-0 entries
    heads, D = (3, 5) if score == "additive" else (1, 6)
    T = tg.TiledMatrix(A, device="cpu", dtype=np.float64)
    V = rng.standard_normal((60, heads * D))
    if score == "additive":
        kw = dict(s_src=rng.standard_normal((60, heads)), s_dst=rng.standard_normal((60, heads)))
    else:
        kw = dict(Q=rng.standard_normal((60, D)), K=rng.standard_normal((60, D)), beta=np.array([0.7]))
    seed = np.array([11], np.uint32)
    g = rng.standard_normal((60, heads * D))
    (o1, v1), (o2, v2) = (nn.graph_attention(T, V, heads=heads, score=score, dropout=dropout, seed=seed,
                                             fused=f, **kw) for f in (True, False))
    np.testing.assert_allclose(o2, o1, rtol=1e-12, atol=1e-12)
    for a, b in zip(v1(g), v2(g)):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


# --- GPU: the fused kernel against the reference ------------------------------------------------------------

TOL = {"float32": 2e-6, "float16": 2e-3, "bfloat16": 1.5e-2}


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("heads,D", [(1, 16), (1, 3), (4, 17), (8, 8), (8, 32), (2, 128), (3, 100)])
@pytest.mark.parametrize("dropout", [0.0, 0.6])
def test_fused_additive_matches_reference(cp, dtype, heads, D, dropout):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes")
    rng = np.random.default_rng(0)
    A = _graph(rng, 1003, density=0.01)
    A = sp.csr_array(sp.vstack([A, sp.csr_array(np.ones((1, 1003)))]).tocsr()[:, :1003])  # a 1003-neighbour row
    n, k = A.shape
    T = tg.TiledMatrix(A)
    V = rng.standard_normal((k, heads * D)).astype(np.float32)
    ss, sd = rng.standard_normal((k, heads)).astype(np.float32), rng.standard_normal((n, heads)).astype(np.float32)
    Vd = cp.asarray(V).astype(dtype)
    seed = cp.asarray(np.array([99], np.uint32))
    out, _ = nn.graph_attention(T, Vd, heads=heads, s_src=cp.asarray(ss), s_dst=cp.asarray(sd), dropout=dropout,
                                seed=seed)
    assert out.dtype == Vd.dtype
    want, _ = ref.attention(A.indptr, A.indices, A.data.astype(np.float64), Vd.astype(cp.float32).get(), heads,
                            "additive", s_src=ss, s_dst=sd, dtype=np.float64, dropout=dropout, seed=np.array([99]))
    assert _rel(out.astype(cp.float32).get(), want) < TOL[dtype]


def test_fused_gradients_match_the_cpu(cp):
    rng = np.random.default_rng(0)  # (seeded: float32 on both sides sums in other orders, so the error is data's)
    A = _graph(rng, 500, density=0.02)
    heads, D = 4, 8
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((500, 12), (12, heads * D), (heads, D), (heads, D),
                                                                   (heads * D,))]
    g = rng.standard_normal((500, heads * D)).astype(np.float32)
    res = []
    for device, xp in (("cpu", np), ("cuda", cp)):
        T = tg.TiledMatrix(A, device=device)
        out, vjp = nn.gat_conv(T, *[xp.asarray(a) for a in arrays], heads=heads, precision="fp32")
        res.append([out] + list(vjp(xp.asarray(g))))
    for i, (a, b) in enumerate(zip(*res)):
        # (the attention vectors' gradients are sums that cancel: their float32 error reaches 1e-5 on some data)
        assert _rel(cp.asnumpy(b), a) < 5e-5, i


@pytest.mark.parametrize("D", [16, 64])
def test_fused_cosine_and_agnn(cp, D):
    """AGNN's fused passes against the unfused sequence, with a hub row and column (cut into parts, merged in the
    passes) and a row of zeros (norm 0)."""
    rng = np.random.default_rng(0)
    A = _graph(rng, 800, density=0.01).tolil()
    A[0, ::3] = 1.0
    A[::2, 1] = 1.5
    A = sp.csr_array(A)
    H = rng.standard_normal((800, D)).astype(np.float32)
    H[5] = 0
    beta = np.array([1.3], np.float32)
    T = tg.TiledMatrix(A)
    o1, v1 = nn.agnn_conv(T, cp.asarray(H), cp.asarray(beta), precision="fp32")
    o2, v2 = nn.agnn_conv(T, cp.asarray(H), cp.asarray(beta), precision="fp32", fused=False)
    assert _rel(o1.get(), o2.get()) < 1e-5
    g = cp.asarray(rng.standard_normal(o1.shape).astype(np.float32))
    for a, b in zip(v1(g), v2(g)):
        assert _rel(a.get(), b.get()) < 1e-4


def test_fused_nan_and_empty_rows(cp):
    A = sp.csr_array((np.ones(3, np.float32), np.array([0, 1, 2]), np.array([0, 0, 3, 3])), shape=(3, 3))
    T = tg.TiledMatrix(A)
    V = cp.arange(6, dtype=cp.float32).reshape(3, 2)
    s = cp.zeros((3, 1), cp.float32)
    out, _ = nn.graph_attention(T, V, s_src=s, s_dst=s)
    np.testing.assert_allclose(out.get(), [[0, 0], [2, 3], [0, 0]], rtol=1e-6)
    s_nan = s.copy()
    s_nan[1] = cp.nan
    out, _ = nn.graph_attention(T, V, s_src=s_nan, s_dst=s)
    assert np.isnan(out.get()[1]).all() and not np.isnan(out.get()[[0, 2]]).any()
    out, _ = nn.graph_attention(T, V, s_src=cp.full((3, 1), -1e30, cp.float32), s_dst=s)
    assert np.isfinite(out.get()).all()


@pytest.mark.parametrize("shape", [(0, 4), (4, 0), (3, 5)])
@pytest.mark.parametrize("score", ["additive", "cosine"])
def test_fused_passes_on_graphs_without_rows_columns_or_entries(cp, shape, score):
    """The fused passes where the graph has no rows (no forward or rows pass), no columns (no columns pass) or no
    entries: the host's shapes and values (zeros; the cosine temperature's gradient 0)."""
    n, k = shape
    A = sp.csr_array(shape, dtype=np.float32)
    rng = np.random.default_rng(5)
    V, g = ints(rng, k, 6), ints(rng, n, 6)
    if score == "additive":
        options, arrays = dict(heads=2), dict(s_src=ints(rng, k, 2), s_dst=ints(rng, n, 2))
    else:
        options, arrays = dict(score="cosine"), dict(Q=ints(rng, n, 6), K=ints(rng, k, 6), beta=np.ones(1, np.float32))
    res = []
    for device, xp in (("cpu", np), ("cuda", cp)):
        T = tg.TiledMatrix(A, device=device)
        out, vjp = nn.graph_attention(T, xp.asarray(V), fused=True if device == "cuda" else None, **options,
                                      **{key: xp.asarray(a) for key, a in arrays.items()})
        res.append([out, *vjp(xp.asarray(g))])
    for i, (want, got) in enumerate(zip(*res)):
        assert got.shape == want.shape, i
        np.testing.assert_array_equal(cp.asnumpy(got), want)


def _dbeta_scale(A, V, g, inputs, dropout, seed):
    """``sum_ij |dz_ij c_ij|`` of the cosine score's dbeta, in dense float64 (dropout as the kernels' hash)."""
    Ad = A.toarray()
    mask = Ad != 0
    C = inputs["Q"].astype(np.float64) @ inputs["K"].astype(np.float64).T
    Z = np.where(mask, float(inputs["beta"][0]) * C + np.log(np.where(mask, Ad, 1)), -np.inf)
    with np.errstate(invalid="ignore"):
        P = np.exp(Z - Z.max(axis=1, keepdims=True, initial=-np.inf))
    P = np.where(mask, P, 0)
    P /= np.maximum(P.sum(axis=1, keepdims=True), 1e-300)
    keep = np.ones_like(P)
    if dropout:
        rows, cols = np.nonzero(mask)  # CSR order: the hash's entry ids
        keep[rows, cols] = ref.attention_keep(np.arange(rows.shape[0]), 1, seed, dropout)[:, 0]
    Pm = P * keep
    dP = (g.astype(np.float64) @ V.astype(np.float64).T) * keep
    t = (g.astype(np.float64) * (Pm @ V.astype(np.float64))).sum(axis=1, keepdims=True)
    return float(np.abs(np.where(mask, P * (dP - t) * C, 0)).sum())


@pytest.mark.parametrize("dropout", [0.0, 0.5])
@pytest.mark.parametrize("rect", [False, True])
@pytest.mark.parametrize("score,dtype", [("additive", "float32"), ("cosine", "float32"), ("cosine", "float16")])
def test_fused_backward_matches_the_reference(cp, dropout, rect, score, dtype):
    """The fused backward (a pass over rows, one over columns) against the CPU's recomputation in float64,
    with a 600-entry row and column, weights, dropout, and a rectangular graph."""
    rng = np.random.default_rng(0)
    n, k = (700, 450) if rect else (700, 700)
    A = _graph(rng, n, k, density=0.01, loops=not rect).tolil()
    A[3, :600] = 1.5
    A[:600, 5] = 0.75
    A = sp.csr_array(A.tocsr())
    heads, D = (3, 20) if score == "additive" else (1, 37)
    # 16-bit inputs rounded first, so that the float64 reference sees the values the kernel reads
    rnd = lambda a: a.astype(dtype).astype(np.float32)  # noqa: E731
    V = rnd(rng.standard_normal((k, heads * D)))
    g = rnd(rng.standard_normal((n, heads * D)))
    if score == "additive":
        ss, sd = rng.standard_normal((k, heads)).astype(np.float32), rng.standard_normal((n, heads)).astype(np.float32)
        inputs = dict(s_src=ss, s_dst=sd)
    else:
        inputs = dict(Q=rnd(rng.standard_normal((n, D)) / 4), K=rnd(rng.standard_normal((k, D)) / 4),
                      beta=np.array([1.3], np.float32))
    seed = np.array([2024], np.uint32)
    res = []
    for device, xp, dt in (("cpu", np, np.float64), ("cuda", cp, np.float32)):
        T = tg.TiledMatrix(A, device=device, dtype=dt)
        vt = dt if device == "cpu" else dtype
        kw = {key: xp.asarray(a, vt if key in "QK" else dt) for key, a in inputs.items()}
        out, vjp = nn.graph_attention(T, xp.asarray(V, vt), heads=heads, score=score, dropout=dropout,
                                      seed=xp.asarray(seed), precision="fp32", **kw)
        res.append([out] + list(vjp(xp.asarray(g, vt))))
    # float32 sums over the 600-entry row and column: up to ~600 roundings of 6e-8 each
    tol = 5e-5 if dtype == "float32" else 5e-3
    for i, (a, b) in enumerate(zip(*res)):
        assert b.shape == a.shape, i
        if score == "cosine" and i == 4:  # dbeta: one sum over every entry, bounded below by its own scale
            continue
        err = _rel(cp.asnumpy(b.astype(cp.float32)), a)
        assert err < tol, (i, err)
    if score == "cosine":
        # dbeta = sum_ij dz_ij c_ij, and each row's dz sums to 0: the sum cancels, so its error is bounded by its
        # terms' magnitudes (each term carries float32 roundings of <= 64-long dot products and an exp, ~1e-6 in
        # all), not by |dbeta| -- the relative error against |dbeta| failed a 5e-5 bound by chance (5.4e-5).
        scale = _dbeta_scale(A, V, g, inputs, dropout, seed)
        got, want = float(res[1][4].get()[0]), float(res[0][4][0])
        assert abs(got - want) <= (1e-5 if dtype == "float32" else 1e-2) * scale, (got, want, scale)


#: Bounds of float32 GAT against float64, per output (out, dH, dW, da_src, da_dst): the forward sums ~10 entries
#: per row (measured <= 3.4e-7 on the host over 30 draws); the gradients sum over 900 rows terms whose per-row
#: sums cancel exactly (a softmax's gradient sums to 0), which lifts float32's relative error to ~1e-5 (measured
#: <= 1.1e-5), so two float32 summation orders differ by that much too: each path is held to 10x its measured error
#: against float64, not to the other path.
GAT_F32_BOUNDS = (1e-5, 1e-4, 1e-4, 1e-4, 1e-4)


@pytest.mark.parametrize("heads", [1, 4])
def test_gat_fused_matches_unfused_on_the_gpu(cp, heads):
    rng = np.random.default_rng(0)
    A = _graph(rng, 900, density=0.01)
    D = 16
    host_arrays = [rng.standard_normal(s) for s in ((900, 12), (12, heads * D), (heads, D), (heads, D))]
    g = rng.standard_normal((900, heads * D))
    o, v = nn.gat_conv(tg.TiledMatrix(A, dtype=np.float64, device="cpu"), *host_arrays, heads=heads)
    want = [o] + list(v(g))[:-1]
    T = tg.TiledMatrix(A)
    arrays = [cp.asarray(a, np.float32) for a in host_arrays]
    for fused in (True, False):
        out, vjp = nn.gat_conv(T, *arrays, heads=heads, precision="fp32", fused=fused)
        got = [out] + list(vjp(cp.asarray(g, np.float32)))
        assert got[-1] is None  # no bias
        for i, (b, a, bound) in enumerate(zip(got, want, GAT_F32_BOUNDS)):
            assert _rel(b.get(), a) < bound, (fused, i, _rel(b.get(), a))


@pytest.mark.parametrize("dropout", [0.0, 0.5])
@pytest.mark.parametrize("score", ["additive", "cosine"])
def test_bound_passes_follow_their_operands(cp, score, dropout):
    """A matrix's later calls run its bound passes, which write only the operands' addresses, and reuse the
    stream's scratch: each call gives the bits of a fresh matrix's first call -- for new operands, for other
    values on the same tiling (their own weights), on another stream -- with long rows and columns cut into parts
    and merged, in each pass, by the last part to finish, whose counter is back at zero for the next call."""
    rng = np.random.default_rng(0)
    A = _graph(rng, 700, density=0.01).tolil()
    A[3, :600] = 1.5
    A[:600, 5] = 0.75
    A = sp.csr_array(A.tocsr())
    heads, D = (3, 20) if score == "additive" else (1, 37)
    n = A.shape[0]

    def draw():
        V, g = (cp.asarray(rng.standard_normal((n, heads * D)), np.float32) for _ in range(2))
        if score == "additive":
            kw = {name: cp.asarray(rng.standard_normal((n, heads)), np.float32) for name in ("s_src", "s_dst")}
        else:
            kw = {name: cp.asarray(rng.standard_normal((n, D)) / 4, np.float32) for name in ("Q", "K")}
            kw["beta"] = cp.asarray([1.3], np.float32)
        return V, g, kw

    def run(T, inputs):
        V, g, kw = inputs
        out, vjp = nn.graph_attention(T, V, heads=heads, score=score, dropout=dropout,
                                      seed=cp.asarray([7], np.uint32), fused=True, **kw)
        return [x.get() for x in [out] + list(vjp(g))]

    def same(got, want):
        for i, (b, a) in enumerate(zip(got, want)):
            assert b.tobytes() == a.tobytes(), i

    first, second = draw(), draw()
    values = cp.asarray(rng.uniform(0.5, 2, A.nnz), np.float32)
    want = run(tg.TiledMatrix(A), first)
    want_values = run(tg.TiledMatrix(A).with_values(values), first)
    T = tg.TiledMatrix(A)
    run(T, second)  # binds T's passes and keeps their scratch (the parts, <g_i, out_i>) for this stream
    assert T.tiling.cached_items("attention") and T.tiling.peek("attention_scratch")
    same(run(T, first), want)
    same(run(T.with_values(values), first), want_values)
    with cp.cuda.Stream():
        same(run(T, first), want)
    counters = [buf for (key, _), buf in T.tiling.peek("attention_scratch").items() if key.kind.endswith("counters")]
    assert {key.kind for (key, _) in T.tiling.peek("attention_scratch")} >= {"fwd counters", "bwd rows counters",
                                                                              "bwd cols counters"}
    assert all(int(c.any()) == 0 for c in counters)  # synchronize!


@pytest.mark.parametrize("dropout", [0.0, 0.5])
@pytest.mark.parametrize("heads, D", [(1, 64), (3, 20)])
def test_bound_pass_adds_the_bias_as_it_stores(cp, dropout, heads, D):
    """The additive pass given a layer's bias stores out and out + b: out and lse the bits of the pass without
    it, out + b the float32 sum of the two -- on rows of every length, a long row's parts merged."""
    from tcgnn_py.products import attention as engine

    rng = np.random.default_rng(0)
    A = _graph(rng, 700, density=0.01).tolil()
    A[3, :600] = 1.5
    T = tg.TiledMatrix(sp.csr_array(A.tocsr()))
    n, f32 = A.shape[0], np.float32
    V = cp.asarray(rng.standard_normal((n, heads * D)), f32)
    s_src, s_dst = (cp.asarray(rng.standard_normal((n, heads)), f32) for _ in range(2))
    b = cp.asarray(rng.standard_normal(heads * D), f32)
    seed = (cp.asarray([7], np.uint32),) if dropout else ()
    plain = engine.fused_bound(T, V, heads, "additive", 0.2, dropout)
    biased = engine.fused_bound(T, V, heads, "additive", 0.2, dropout, with_bias=True)
    for _ in range(2):  # (the second call on the stream's scratch, its counters back at zero)
        out, lse = plain(V, s_src, s_dst, *seed)
        got, got_lse, got_b = biased(V, s_src, s_dst, b, *seed)
        assert got.get().tobytes() == out.get().tobytes() and got_lse.get().tobytes() == lse.get().tobytes()
        assert got_b.get().tobytes() == (out + b).get().tobytes()
        assert np.isfinite(out.get()).all() and out.get()[3].any()


@pytest.mark.parametrize("score", ["additive", "cosine"])
def test_fused_hub_of_200k_entries(cp, score):
    """A row and a column of about 200,000 entries each (thousands of parts, merged), 199,000 one-entry rows and
    1,000 empty ones, forward and backward against the float64 reference."""
    rng = np.random.default_rng(0)
    n = 200_001
    hub_rows = np.arange(1, 199_001)  # one entry each, in column 0; rows 199,001.. stay empty
    rows = np.concatenate([np.zeros(n - 1, np.int64), hub_rows])
    cols = np.concatenate([np.arange(1, n), np.zeros(hub_rows.size, np.int64)])
    A = sp.csr_array((rng.uniform(0.5, 2, rows.size), (rows, cols)), shape=(n, n))
    heads, D = (2, 8) if score == "additive" else (1, 16)
    V = rng.standard_normal((n, heads * D)).astype(np.float32)
    g = rng.standard_normal((n, heads * D)).astype(np.float32)
    if score == "additive":
        kw = dict(s_src=rng.standard_normal((n, heads)).astype(np.float32),
                  s_dst=rng.standard_normal((n, heads)).astype(np.float32))
    else:
        kw = dict(Q=(rng.standard_normal((n, D)) / 4).astype(np.float32),
                  K=(rng.standard_normal((n, D)) / 4).astype(np.float32), beta=np.array([1.1], np.float32))
    res = []
    for device, xp, dt in (("cpu", np, np.float64), ("cuda", cp, np.float32)):
        T = tg.TiledMatrix(A, device=device, dtype=dt)
        out, vjp = nn.graph_attention(T, xp.asarray(V, dt), heads=heads, score=score, precision="fp32",
                                      **{key: xp.asarray(a, dt) for key, a in kw.items()})
        res.append([out] + list(vjp(xp.asarray(g, dt))))
    assert not np.asarray(res[1][0][199_001:].get()).any()  # empty rows: 0
    for i, (a, b) in enumerate(zip(*res)):
        err = _rel(cp.asnumpy(b), a)
        assert err < 3e-4, (i, err)  # float32 sums of 200k entries


def _row_softmax(A):
    """Each row's softmax over its stored entries (CSR order), in float64."""
    A = sp.csr_array(A)
    out = np.zeros(A.nnz)
    for i in range(A.shape[0]):
        lo, hi = A.indptr[i], A.indptr[i + 1]
        if hi > lo:
            v = A.data[lo:hi].astype(np.float64)
            e = np.exp(v - v.max())
            out[lo:hi] = e / e.sum()
    return out


@pytest.mark.parametrize("layout", ["vector", "tcgnn"])
def test_edge_softmax_over_each_rows_stored_entries(layout):
    """``T.softmax()``: stored entries only (an explicit zero takes part, an implicit one does not), empty rows
    stay empty, a NaN row is NaN, an all -inf row is NaN; 16-bit values are computed in float32."""
    rng = np.random.default_rng(3)
    A = sp.random_array((203, 150), density=0.05, rng=rng, format="csr", dtype=np.float64)
    A.data[:] = rng.standard_normal(A.nnz) * 4
    A.data[:3] = 0.0  # explicit zeros: stored, so they take part
    T = tg.TiledMatrix(A, dtype=np.float32, layout=layout, device="cpu")
    got = T.softmax().tocsr()
    assert T.softmax().dtype == np.float32 and got.nnz == A.nnz
    np.testing.assert_allclose(got.data, _row_softmax(A.astype(np.float32)), rtol=1e-6, atol=1e-7)
    sums = np.add.reduceat(got.data, A.indptr[:-1][np.diff(A.indptr) > 0])
    np.testing.assert_allclose(sums, 1.0, rtol=1e-6)
    # rows: a NaN, empty, all -inf, two equal values (and a column never stored)
    B = sp.csr_array((np.array([1.0, np.nan, 2.0, -np.inf, -np.inf, 3.0, 3.0]), np.array([0, 1, 2, 0, 1, 0, 2]),
                      np.array([0, 3, 3, 5, 7])), shape=(4, 4))
    P = tg.TiledMatrix(B, layout=layout, device="cpu").softmax().tocsr()
    assert np.isnan(P.data[:5]).all()
    np.testing.assert_array_equal(P.data[5:], [0.5, 0.5])
    H = tg.TiledMatrix(A, dtype=np.float16, layout=layout, device="cpu").softmax()
    assert H.dtype == np.float16
    Ah = A.copy()
    Ah.data = A.data.astype(np.float16).astype(np.float64)  # the stored 16-bit values
    np.testing.assert_allclose(H.tocsr().data.astype(np.float64), _row_softmax(Ah), rtol=2e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_edge_softmax_on_the_gpu_is_the_hosts(cp, dtype):
    """The device computes the host's softmax, and attention as matrix operations -- scores on the entries, the
    edge softmax, a product -- is the fused graph attention's output."""
    rng = np.random.default_rng(4)
    A = sp.random_array((1003, 517), density=0.01, rng=rng, format="csr", dtype=np.float64)
    A.data[:] = rng.integers(-8, 9, A.nnz)
    Th = tg.TiledMatrix(A, dtype=dtype, device="cpu")
    Td = tg.TiledMatrix(A, dtype=dtype)
    want, got = Th.softmax().tocsr().data, Td.softmax().tocsr().data  # (tocsr: on the host)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               rtol={"float32": 1e-6, "float16": 1e-3, "float64": 1e-14}[dtype], atol=1e-7)
    # GAT's additive score as a matrix: z_ij = LeakyReLU(s_dst[i] + s_src[j]) on the stored entries of 1s.
    G = tg.TiledMatrix(sp.csr_array((np.ones(A.nnz), A.indices, A.indptr), shape=A.shape), dtype=np.float32)
    s_src = cp.asarray(rng.standard_normal((517, 1)).astype(np.float32))
    s_dst = cp.asarray(rng.standard_normal((1003, 1)).astype(np.float32))
    rows, cols = G.tiling.rows_cols()
    pre = s_dst[rows, 0] + s_src[cols, 0]
    z = cp.where(pre > 0, pre, 0.2 * pre)
    V = cp.asarray(rng.integers(-4, 5, (517, 32)).astype(np.float32))
    composed = G.with_values(z, order="tiled").softmax() @ V
    fused, _ = tg.nn.graph_attention(G, V, s_src=s_src, s_dst=s_dst, fused=True)
    np.testing.assert_allclose(composed.get(), fused.get(), rtol=2e-3, atol=2e-3)  # TF32 product vs fused


def test_the_kernels_block_is_the_launchs():
    """The kernels size their shared arrays and find their unit by TC_ATT_WARPS; the launches use ATTENTION_WARPS."""
    from tcgnn_py.kernels import attention as ka

    assert f"#define TC_ATT_WARPS {ka.ATTENTION_WARPS} " in ka.SOURCE
