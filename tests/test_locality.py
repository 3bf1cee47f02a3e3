"""The locality reorder and report: reference semantics, kernel == reference (simulator / GPU), the Graph helper."""

import numpy as np
import pytest
import scipy.sparse as sp
from _env import graph_dir, host

import tcgnn_py as tg
from tcgnn_py.orders import _locality as L


def sym_graph(n, density, seed):
    A = sp.random_array((n, n), density=density, rng=np.random.default_rng(seed), format="csr")
    return sp.csr_array(A + A.T)


def clustered(n_clusters, size, seed, p_in=0.5, p_out=0.002):
    """Planted clusters, vertices shuffled: an order with far fewer window pairs exists."""
    rng = np.random.default_rng(seed)
    n = n_clusters * size
    c = np.arange(n) // size
    P = np.where(c[:, None] == c[None, :], p_in, p_out)
    M = np.triu(rng.random((n, n)) < P, 1)
    A = sp.csr_array((M | M.T).astype(np.float32))
    q = rng.permutation(n)
    return sp.csr_array(A[q][:, q])


def pairs(A, perm, window):
    """Distinct (window, column) pairs of P A P^T, the obvious way."""
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(perm))
    B = A.tocoo()
    return len({(int(inv[r]) // window, int(inv[c])) for r, c in zip(B.row, B.col)})


@pytest.mark.parametrize("layout,window", [("tcgnn", 16), ("vector", 8)])
def test_locality_is_a_lossless_bijection_never_worse(layout, window):
    A = clustered(12, 16, seed=1)
    p = tg.reorder(A, "locality", layout=layout, device="cpu")
    assert sorted(p.perm) == list(range(A.shape[0]))
    B = p.apply(A)
    assert B.nnz == A.nnz and (B != B.T).nnz == 0
    assert (p.apply_rows(np.arange(A.shape[0])) == p.perm).all()
    r = p.report
    assert r.chosen_for == layout and r.method in L.CANDIDATES
    assert r[layout].pairs == pairs(A, p.perm, window) == round(min(r.candidates.values()) * A.nnz)
    assert r.initial[layout].pairs == pairs(A, np.arange(A.shape[0]), window)
    # planted clusters of 16 shuffled: the hierarchy finds them
    assert r.method == "clusters" and r[layout].pairs_per_nnz < 0.5 * r.initial[layout].pairs_per_nnz


def test_locality_is_deterministic_and_input_order_wins_ties():
    A = sym_graph(150, 0.05, 2)
    a, b = (tg.reorder(A, "locality", device="cpu") for _ in range(2))
    assert (a.perm == b.perm).all() and a.report.candidates == b.report.candidates
    # a graph whose input order is already best: kept as is
    band = sp.csr_array(sp.diags([1, 1, 1], [-1, 0, 1], shape=(64, 64), dtype=np.float32))
    p = tg.reorder(band, "locality", device="cpu")
    assert p.report.method == "original" and (p.perm == np.arange(64)).all()


@pytest.mark.parametrize("n", [0, 1, 5, 17, 33])
def test_locality_tiny_and_edgeless(n):
    for A in (sp.csr_array((n, n), dtype=np.float32), sp.csr_array(sp.eye(n, dtype=np.float32))):
        p = tg.reorder(A, "locality", device="cpu")
        assert (p.perm == np.arange(n)).all() and p.report.levels == 0
    if n >= 2:
        p = tg.reorder(sym_graph(n, 0.4, n), "locality", device="cpu")
        assert sorted(p.perm) == list(range(n))


def test_locality_directed_and_weighted_are_ordered_by_their_pattern():
    A = sp.random_array((120, 120), density=0.04, rng=np.random.default_rng(3), format="csr")  # directed, weighted
    p = tg.reorder(A, "locality", device="cpu")
    ones = A.copy()
    ones.data[:] = 1
    assert (tg.reorder(ones, "locality", device="cpu").perm == p.perm).all()  # values do not matter
    # the hierarchy sees the undirected pattern: A and A^T give the same cluster order
    idx, ptr = A.indices.astype(np.int64), A.indptr.astype(np.int64)
    At = sp.csr_array(A.T)
    orders = [L.tree_order(np, *L.coarsen(np, *L.symmetric_pattern(np, i, q, 120), 120, L._best_partner_reference))
              for i, q in ((idx, ptr), (At.indices.astype(np.int64), At.indptr.astype(np.int64)))]
    np.testing.assert_array_equal(*orders)
    B = p.apply(A)
    np.testing.assert_array_equal(B.toarray(), A.toarray()[np.ix_(p.perm, p.perm)])


def test_locality_errors():
    with pytest.raises(ValueError, match="must be square"):
        tg.reorder(sp.csr_array((4, 5)), "locality", device="cpu")
    with pytest.raises(ValueError, match="orders for an N:M layout"):
        tg.reorder(sym_graph(20, 0.2, 0), "2:4", layout="vector", device="cpu")
    with pytest.raises(ValueError, match="layout must be one of"):
        tg.reorder(sym_graph(20, 0.2, 0), "2:4", layout="4:8", device="cpu")
    with pytest.raises(TypeError, match="applies to the 'locality' reorder"):
        tg.reorder(sym_graph(20, 0.2, 0), "2:4", max_levels=3, device="cpu")
    with pytest.raises(TypeError, match="apply to N:M patterns"):
        tg.reorder(sym_graph(20, 0.2, 0), "locality", patience=2, device="cpu")
    with pytest.raises(ValueError, match="layout must be one of"):
        tg.reorder(sym_graph(20, 0.2, 0), "locality", layout="csr", device="cpu")
    for bad in (-1, "1", float("nan")):
        with pytest.raises(ValueError, match="time_budget"):
            tg.reorder(sym_graph(20, 0.2, 0), "locality", time_budget=bad, device="cpu")
    with pytest.raises(ValueError, match="max_levels"):
        tg.reorder(sym_graph(20, 0.2, 0), "locality", max_levels=-1, device="cpu")


def test_locality_budgets_and_levels():
    A = clustered(8, 16, seed=4)
    for layout in ("tcgnn", "vector"):
        r = tg.reorder(A, "locality", layout=layout, max_levels=0, device="cpu").report
        assert r.candidates["clusters"] == pytest.approx(tg.locality_report(A, device="cpu")[layout].pairs_per_nnz)
    assert tg.reorder(A, "locality", device="cpu").report.chosen_for == "vector"  # TiledMatrix's default
    full = tg.reorder(A, "locality", device="cpu").report.levels
    assert tg.reorder(A, "locality", max_levels=2, device="cpu").report.levels == min(2, full)
    assert tg.reorder(A, "locality", time_budget=0, device="cpu").report.levels <= 1  # checked after each level
    p = tg.reorder(A, "2:4", time_budget=0, device="cpu")  # N:M: no iteration runs, the input order is returned
    assert p.report.iterations == 0 and (p.perm == np.arange(A.shape[0])).all()


def test_locality_verbose(capsys):
    tg.reorder(clustered(4, 8, 5), "locality", verbose=True, device="cpu")
    assert "reorder locality: level 1:" in capsys.readouterr().err
    tg.reorder(clustered(4, 8, 5), "locality", verbose=False, device="cpu")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("layout", ["tcgnn", "vector"])
@pytest.mark.parametrize("shape", [(100, 100), (37, 90), (90, 37)])
def test_locality_report_matches_tile_stats(layout, shape):
    A = sp.random_array(shape, density=0.08, rng=np.random.default_rng(7), format="csr", dtype=np.float32)
    r = tg.locality_report(A, device="cpu")[layout]
    s = tg.TiledMatrix(A, layout=layout, device="cpu").tile_stats()
    assert (r.blocks, r.blocks_per_window[-1], r.density) == (s.blocks, s.max_blocks_per_window, s.density)
    assert r.pairs == pairs(sp.csr_array(A), np.arange(shape[0]), r.layout.window) if shape[0] == shape[1] else True
    if shape[0] == shape[1]:
        p = tg.Permutation(np.random.default_rng(1).permutation(shape[0]))
        rp = tg.locality_report(A, p, device="cpu")
        s = tg.TiledMatrix(p.apply(A), layout=layout, device="cpu").tile_stats()
        assert (rp[layout].blocks, rp.initial[layout].blocks) == (s.blocks, r.blocks)
    else:
        with pytest.raises(ValueError, match="must be square"):
            tg.locality_report(A, np.arange(shape[0]), device="cpu")
    assert "U/nnz" in str(r) and "U/nnz" in str(tg.locality_report(A, device="cpu"))


def test_graph_permute_moves_everything_together():
    g = tg.load_cora()
    p = tg.reorder(g.adj, "locality", device="cpu")
    h = g.permute(p)
    inv = p.inverse_perm
    assert (h.adj != p.apply(g.adj)).nnz == 0 and h.permutation is p
    assert (h.features[inv] != g.features).nnz == 0
    np.testing.assert_array_equal(h.labels[inv], g.labels)
    for a, b in ((h.train_idx, g.train_idx), (h.val_idx, g.val_idx), (h.test_idx, g.test_idx)):
        np.testing.assert_array_equal(np.sort(p.perm[a]), np.sort(b))
        assert a.dtype == b.dtype and (np.diff(a) > 0).all()
    Y = np.arange(g.adj.shape[0] * 2.0).reshape(-1, 2)
    np.testing.assert_array_equal(p.undo_rows(h.adj @ p.apply_rows(Y)), g.adj @ Y)
    with pytest.raises(ValueError, match="already permuted"):
        h.permute(p)
    with pytest.raises(ValueError, match="entries for"):
        g.permute(tg.Permutation(np.arange(5)))


# ---- the Numba kernel: one warp, then whole orders, against the reference (simulator in CI, GPU on the device)


@pytest.mark.kernels
def test_best_partner_one_warp(xp):
    from tcgnn_py.kernels import locality as k

    # rows: empty, ties (smallest col wins), 40 entries (lanes wrap), best in the last lane, one entry
    rows = [[], [(3, 0.5), (5, 0.5), (9, 0.25)], [(c, 0.1 + (c == 37) * 0.3) for c in range(40)],
            [(c, 1.0 * (c == 31)) for c in range(32)], [(7, 2.0)]]  # fmt: skip
    ptr = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
    col = np.array([c for r in rows for c, _ in r], np.int64)
    score = np.array([s for r in rows for _, s in r], np.float64)
    row = np.repeat(np.arange(len(rows)), np.diff(ptr)).astype(np.int64)
    want = L._best_partner_reference(ptr, row, col, score)
    np.testing.assert_array_equal(want, [-1, 3, 37, 31, 7])
    got = np.full(len(rows), -2, np.int64)
    out = xp.asarray(got)
    k.best_partner[1, 32 * len(rows)](xp.asarray(ptr), xp.asarray(col), xp.asarray(score), out)
    np.testing.assert_array_equal(host(out), want)


def orders_agree(xp, A, layout="tcgnn"):
    A = sp.csr_array(A)
    idx, ptr = A.indices.astype(np.int32), A.indptr.astype(np.int32)
    want, wi = L.locality_order(np, idx, ptr, A.shape[0], layout, kernel=False)
    got, gi = L.locality_order(xp, xp.asarray(idx), xp.asarray(ptr), A.shape[0], layout, kernel=True)
    np.testing.assert_array_equal(host(got), want)
    assert gi == wi
    return wi


@pytest.mark.kernels
@pytest.mark.parametrize("case", range(3))
def test_locality_kernel_equals_reference(xp, case):
    A = [clustered(3, 8, 11), sym_graph(45, 0.1, 12), tg.power_law_graph(40, 160, seed=3, symmetric=True)][case]
    info = orders_agree(xp, A, "vector" if case == 1 else "tcgnn")
    assert info["levels"] >= 1


REAL = ["cora", "citeseer", "pubmed", "facebook", "ppi_homo_sapiens", "wiki_vote", "ss_bcsstk13"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", REAL + ["powerlaw"])
def test_locality_gpu_equals_reference(name):
    if name == "powerlaw":
        A = tg.power_law_graph(30001, 300000, seed=5, symmetric=True)
    else:
        A = sp.load_npz(graph_dir(name) / "adj_csr.npz")
    p_gpu = tg.reorder(A, "locality", device="cuda")
    p_ref = tg.reorder(A, "locality", device="cpu")
    np.testing.assert_array_equal(p_gpu.perm, p_ref.perm)
    r, q = p_gpu.report, p_ref.report
    assert (r.method, r.candidates, r.levels, r.layouts, r.initial) == (q.method, q.candidates, q.levels, q.layouts, q.initial)
    assert r["tcgnn"].pairs <= r.initial["tcgnn"].pairs
    assert tg.locality_report(A, p_gpu, device="cuda") == tg.locality_report(A, p_ref, device="cpu")


@pytest.mark.gpu
def test_locality_reordered_spmm_is_exact_on_gpu():
    import cupy

    g = tg.load_cora()
    A = sp.csr_array(g.adj)
    rng = np.random.default_rng(0)
    A.data = rng.integers(-8, 9, A.nnz).astype(np.float32)
    p = tg.reorder(A, "locality")
    X = rng.integers(-8, 9, (A.shape[0], 40)).astype(np.float32)
    for layout in ("tcgnn", "vector"):
        T = tg.TiledMatrix(p.apply(A), layout=layout)
        Y = p.undo_rows(T @ cupy.asarray(p.apply_rows(X)))
        np.testing.assert_array_equal(host(Y), A @ X)
