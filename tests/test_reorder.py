"""The N:M reorder's reference against brute-force dense definitions, and its API.

Every metric, the stage-1 sort key and the stage-2 gains are checked against a
dense re-implementation of the paper's definitions (no shared code with the
reference); the public API for losslessness and determinism.
"""

import math

import numpy as np
import pytest
import scipy.sparse as sp
from _zoo import star, stars

import tcgnn_py as tg
from tcgnn_py.orders import _nm_reference as ref
from tcgnn_py._validation import Pattern, check_pattern

K = ref.K_VERTICAL


def rand_graph(n, density, seed, symmetric=True):
    rng = np.random.default_rng(seed)
    A = sp.random_array((n, n), density=density, rng=rng, format="csr")
    if symmetric:
        A = A + A.T
    A = sp.csr_array(A)
    A.data[:] = rng.integers(1, 9, A.nnz)
    return A


def vectors_of(A, perm, M):
    A = sp.csr_array(A)
    n = A.shape[0]
    inv = np.empty(n, np.int64)
    inv[perm] = np.arange(n)
    rows = np.repeat(np.arange(n), np.diff(A.indptr))
    return ref.segment_vectors(A.indices, rows, inv, n, M)


# -- dense brute force of the paper's definitions ---------------------------------


def dense_segments(A, M):
    """Boolean ``n x n_seg x M`` array (padded with empty columns)."""
    D = sp.csr_array(A).toarray() != 0
    n = D.shape[0]
    S = -(-n // M)
    P = np.zeros((n, S * M), bool)
    P[:, :n] = D
    return P.reshape(n, S, M)


def brute_scores(A, pattern):
    V, N, M = pattern
    seg = dense_segments(A, M)
    pop = seg.sum(2)
    viol = pop > N
    n, S = pop.shape
    mbscore = n_mb = 0
    for b0 in range(0, n, V):
        for s in range(S):
            block = seg[b0 : b0 + V, s]
            if block.any():
                n_mb += 1
                mbscore += int(block.any(0).sum() > K or (block.sum(1) > N).any())
    return {
        "pscore": int(viol.sum()),
        "mbscore": mbscore,
        "seg_pscore": viol.sum(0),
        "seg_nnz": pop.sum(0),
        "n_vectors": int((pop > 0).sum()),
        "n_meta_blocks": n_mb,
    }


def brute_codes(A, pattern):
    """The paper's per-row vectors of Hamming position codes (negated when violating)."""
    _, N, M = pattern
    seg = dense_segments(A, M)
    if M <= 8:  # rank = position in the enumerated Hamming-distance order
        gray_order = [r ^ (r >> 1) for r in range(1 << M)]
        rank = {g: r for r, g in enumerate(gray_order)}
        weights = 1 << np.arange(M - 1, -1, -1)  # column s*M is the most significant bit
        codes = np.vectorize(rank.__getitem__)((seg * weights).sum(2))
    else:  # too many strings to enumerate: decode bit by bit, b_i = b_(i-1) xor g_i
        bits = np.logical_xor.accumulate(seg, axis=2).astype(np.int64)
        codes = (bits * (1 << np.arange(M - 1, -1, -1, dtype=np.int64))).sum(2)
    return np.where(seg.sum(2) > N, -codes, codes)


PATTERNS = [Pattern(1, 2, 4), Pattern(1, 1, 4), Pattern(1, 2, 8), Pattern(4, 2, 8), Pattern(3, 1, 5), Pattern(2, 3, 32)]


@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
@pytest.mark.parametrize("n,density,seed", [(1, 1.0, 0), (13, 0.3, 1), (37, 0.15, 2), (64, 0.08, 3), (50, 0.5, 4)])
def test_scores_match_definitions(pattern, n, density, seed):
    A = rand_graph(n, density, seed, symmetric=seed % 2 == 0)
    perm = np.random.default_rng(seed).permutation(n)
    B = A[perm][:, perm]
    got = ref.scores(*vectors_of(A, perm, pattern.M), n, pattern)
    want = brute_scores(B, pattern)
    for key, w in want.items():
        np.testing.assert_array_equal(got[key], w, err_msg=key)


@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8])
def test_gray_rank_is_the_hamming_distance_order(M):
    # rank r <-> Gray code r ^ (r >> 1): consecutive strings differ in one bit
    r = np.arange(1 << M, dtype=np.uint32)
    g = r ^ (r >> 1)
    np.testing.assert_array_equal(ref.gray_rank(g), r)
    assert all(bin(int(a) ^ int(b)).count("1") == 1 for a, b in zip(g[:-1], g[1:]))
    assert ref.gray_rank(np.uint32(0b11)) == 2  # the paper's example


@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
@pytest.mark.parametrize("n,density,seed", [(13, 0.3, 1), (40, 0.1, 2), (40, 0.4, 5), (70, 0.05, 3)])
def test_stage1_order_is_the_sort_of_code_vectors(pattern, n, density, seed):
    A = rand_graph(n, density, seed)
    A = sp.csr_array(A + sp.eye_array(n) * (seed % 2))
    if seed == 5:
        A = sp.csr_array(sp.vstack([A[:10]] * 4)[:n])  # repeated rows: ties keep the order
        A = sp.csr_array((A + A.T) > 0, dtype=np.float64)
    vrow, vseg, bits = vectors_of(A, np.arange(n), pattern.M)
    toks = ref.vector_tokens(vseg, bits, -(-n // pattern.M), pattern)
    got = ref.stage1_order(vrow, toks, n)
    codes = brute_codes(A, pattern)
    want = np.lexsort(codes.T[::-1])  # stable: ties keep row order
    np.testing.assert_array_equal(got, want)


def brute_gains(A, a, b, u, v, pattern):
    """PScore of segments a and b, and their excess, before minus after swapping."""
    _, N, M = pattern
    n = A.shape[0]
    p, q = a * M + u, b * M + v
    perm = np.arange(n)
    perm[p], perm[q] = q, p
    B = A[perm][:, perm]

    def counts(X):
        pop = dense_segments(X, M).sum(2)[:, [a, b]]
        return (pop > N).sum(0), np.maximum(pop - N, 0).sum()

    (pa0, pb0), x0 = counts(A)
    (pa1, pb1), x1 = counts(B)
    return pa0 - pa1, pb0 - pb1, x0 - x1


@pytest.mark.parametrize("pattern", [Pattern(1, 2, 4), Pattern(1, 1, 4), Pattern(1, 3, 8)], ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_pair_gains_match_swapping(pattern, seed):
    M = pattern.M
    n = 6 * M - 1 if seed else 4 * M
    A = rand_graph(n, 0.35, seed)
    vrow, vseg, bits = vectors_of(A, np.arange(n), M)
    for a, b in [(0, 1), (2, 1), (0, -(-n // M) - 1)]:
        prim, targ, excess = ref.pair_gains(vrow, vseg, bits, a, b, pattern)
        for u in range(M):
            for v in range(M):
                if b * M + v >= n:
                    continue
                assert (prim[u, v], targ[u, v], excess[u, v]) == brute_gains(A, a, b, u, v, pattern)


def test_freshtop_order():
    total = np.array([[1, 3], [3, 0]])
    excess = np.array([[0, 0], [1, 0]])
    no = np.zeros(2, bool)
    assert ref.freshtop(total, excess, no, no) == (1, 0)  # ties on gain: larger excess
    assert ref.freshtop(total, np.zeros((2, 2), int), no, no) == (0, 1)  # then smaller u*M+v
    assert ref.freshtop(total, excess, np.array([False, True]), no) == (0, 1)
    assert ref.freshtop(total, excess, np.ones(2, bool), no) is None


def test_stage2_swaps_are_disjoint_and_lower_pscore():
    A = rand_graph(96, 0.05, 7)
    pattern = Pattern(1, 2, 4)
    vrow, vseg, bits = vectors_of(A, np.arange(96), 4)
    st = ref.scores(vrow, vseg, bits, 96, pattern)
    swaps = ref.stage2_swaps(vrow, vseg, bits, st, 96, pattern)
    flat = np.ravel(swaps)
    assert len(swaps) > 0 and np.unique(flat).size == flat.size and flat.max() < 96
    perm = ref.apply_swaps(np.arange(96), swaps)
    assert ref.scores(*vectors_of(A, perm, 4), 96, pattern)["pscore"] < st["pscore"]


# -- patterns -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "given,want",
    [("2:4", (1, 2, 4)), ("16:2:16", (16, 2, 16)), ((2, 4), (1, 2, 4)), ((4, 2, 8), (4, 2, 8)), ([1, 8], (1, 1, 8))],
)
def test_pattern_forms(given, want):
    p = check_pattern(given)
    assert p == want and (p.V, p.N, p.M) == want
    assert check_pattern(str(p)) == p


@pytest.mark.parametrize(
    "bad,err,match",
    [
        ("2:4:8:1", ValueError, "2 .N:M. or 3"),
        ("4:4", ValueError, "N must be"),
        ("0:4", ValueError, "N must be"),
        ("2:33", ValueError, "M must be"),
        ("2:1", ValueError, "M must be"),
        ((0, 2, 4), ValueError, "V must be"),
        ("a:b", TypeError, "pattern must be"),
        (2.5, TypeError, "pattern must be"),
    ],
)
def test_pattern_errors(bad, err, match):
    with pytest.raises(err, match=match):
        check_pattern(bad)


# -- the public API: lossless, deterministic ----------------------------------------


@pytest.fixture(scope="module")
def cora():
    return tg.load_cora().adj


@pytest.fixture(scope="module")
def cora_24(cora):
    return tg.reorder(cora, "2:4", device="cpu")


def test_reorder_cora_conforms(cora, cora_24):
    rep = cora_24.report
    assert rep.initial_pscore == tg.nm_report(cora, "2:4", device="cpu").pscore > 0
    assert rep.pscore == 0 and rep.mbscore == 0 and rep.conforming
    assert rep.improvement_rate == 1.0 and rep.iterations >= 1
    again = tg.nm_report(cora, "2:4", cora_24, device="cpu")
    assert (again.pscore, again.initial_pscore) == (0, rep.initial_pscore)
    assert "conforming" in str(rep) and "100.00% of PScore removed" in str(rep)


def test_reorder_is_deterministic(cora, cora_24):
    np.testing.assert_array_equal(tg.reorder(cora, "2:4", device="cpu").perm, cora_24.perm)


def test_apply_is_lossless(cora, cora_24):
    B = cora_24.apply(cora)
    assert type(B) is type(cora) and B.nnz == cora.nnz and B.has_canonical_format
    assert (B != B.T).nnz == 0  # symmetric stays symmetric
    np.testing.assert_array_equal(np.sort(B.data), np.sort(cora.data))
    back = cora_24.inverse().apply(B)
    for name in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(getattr(back, name), getattr(cora, name))


def test_product_on_reordered_graph_equals_original(cora_24, cora):
    rng = np.random.default_rng(0)
    A = cora.copy()
    A.data = rng.integers(-8, 9, A.nnz).astype(np.float32)  # small integers: exact
    X = rng.integers(-8, 9, (A.shape[0], 5)).astype(np.float32)
    Y = cora_24.undo_rows(cora_24.apply(A) @ cora_24.apply_rows(X))
    np.testing.assert_array_equal(Y, A @ X)


def test_apply_keeps_format_values_and_explicit_zeros():
    A = sp.coo_matrix(([0.0, 2.5, -1.0], ([0, 1, 2], [1, 2, 0])), shape=(3, 3))
    p = tg.Permutation(np.array([2, 0, 1]))
    B = p.apply(A)
    assert isinstance(B, sp.coo_matrix) and B.nnz == 3
    np.testing.assert_array_equal(B.toarray(), A.toarray()[p.perm][:, p.perm])
    data, indices, indptr = p.apply((np.array([1.0, 2.0]), np.array([1, 0]), np.array([0, 1, 2, 2])))
    assert indptr.tolist() == [0, 0, 1, 2]


@pytest.mark.parametrize(
    "perm,match", [([0, 0, 1], "occurs twice"), ([0, 3, 1], r"in \[0, 3\)"), ([[0, 1]], "1-D"), ([0.0, 1.0], "integers")]
)
def test_permutation_errors(perm, match):
    with pytest.raises(ValueError, match=match):
        tg.Permutation(np.array(perm))


def test_permutation_shape_errors():
    p = tg.Permutation([1, 0])
    with pytest.raises(ValueError, match="expected a 2x2 matrix"):
        p.apply(sp.eye_array(3, format="csr"))
    with pytest.raises(ValueError, match="expected 2 rows"):
        p.apply_rows(np.zeros((3, 1)))
    with pytest.raises(ValueError, match="must be square"):
        tg.reorder(sp.random_array((3, 4), density=0.5, format="csr"), device="cpu")
    with pytest.raises(ValueError, match="device must be"):
        tg.reorder(sp.eye_array(4, format="csr"), device="tpu")


def test_reorder_edge_cases():
    for A in (sp.csr_array((0, 0)), sp.csr_array((5, 5)), sp.eye_array(7, format="csr")):
        p = tg.reorder(A, device="cpu")
        assert len(p) == A.shape[0] and p.report.conforming and p.report.iterations == 0
        assert math.isnan(p.report.improvement_rate)
    S = star(40)  # the hub's row cannot be 2:4 unless its 40 neighbours spread over 20 segments
    p = tg.reorder(S, "2:4", device="cpu")
    assert p.report.pscore <= p.report.initial_pscore


def test_reorder_vnm_and_verbose(capsys):
    A = rand_graph(64, 0.06, 11)
    p = tg.reorder(A, (4, 2, 8), device="cpu", verbose=True)
    rep = p.report
    assert rep.pattern == (4, 2, 8) and rep.mbscore <= rep.initial_mbscore
    assert rep.mbscore == brute_scores(p.apply(A), rep.pattern)["mbscore"]
    assert "reorder: iteration 1:" in capsys.readouterr().err


def test_best_pattern_search():
    A = sp.csr_array(sp.diags_array([1.0, 1.0, 1.0], offsets=[-1, 0, 1], shape=(40, 40)))
    p = tg.best_pattern(A, max_M=16, max_V=4, device="cpu")
    tried = [str(pat) for pat, _ in p.search]
    assert tried[:3] == ["2:4", "2:8", "2:16"]
    assert all(r.conforming for _, r in p.search[:-1]) or p.report.conforming
    assert p.report.conforming and p.pattern.M == 16


# --- bad input (issue 14): validated like TiledMatrix, errors name the argument ------------------


@pytest.mark.parametrize(
    "arrays, message",
    [
        ((np.ones(1), np.array([-1]), np.array([0, 1, 1])), "indices must be >= 0"),
        ((np.ones(1), np.array([2]), np.array([0, 1, 1])), "indices must be < 2"),
        ((np.ones(1), np.array([0]), np.array([0, 2, 1])), "indptr must be a non-decreasing sequence"),
    ],
)
def test_permutation_apply_validates_indices(arrays, message):
    p = tg.Permutation([0, 1])
    with pytest.raises(ValueError, match=message):
        p.apply(arrays)
    with pytest.raises(ValueError, match=message):
        tg.TiledMatrix(arrays, shape=(2, 2))  # the same wording


def test_permutation_apply_csr_array_with_negative_index():
    A = sp.csr_array((np.ones(1), np.array([0]), np.array([0, 1, 1])), shape=(2, 2))
    A.indices[0] = -1  # scipy does not check until asked
    with pytest.raises(ValueError, match="indices must be >= 0"):
        tg.Permutation([0, 1]).apply(A)


def test_permutation_rows_accept_array_likes():
    p = tg.Permutation([1, 0])
    np.testing.assert_array_equal(p.apply_rows([1, 2]), [2, 1])
    np.testing.assert_array_equal(p.undo_rows([[1], [2]]), [[2], [1]])
    with pytest.raises(ValueError, match="expected 2 rows"):
        p.apply_rows([1, 2, 3])


@pytest.mark.parametrize("fn", [tg.reorder, tg.nm_report, tg.best_pattern])
def test_tuple_graphs_are_square_from_indptr(fn):
    # (2, 1) by the largest column index; an edgeless graph has no index at all
    for arrays in [(np.ones(1), np.array([0]), np.array([0, 1, 1])), (np.ones(0), np.zeros(0, int), np.zeros(3, int))]:
        r = fn(arrays, device="cpu")
        assert (r.report if isinstance(r, tg.Permutation) else r).n == len(arrays[2]) - 1
    with pytest.raises(ValueError, match="indices must be >= 0"):
        fn((np.ones(1), np.array([-1]), np.array([0, 1, 1])), device="cpu")


@pytest.mark.parametrize(
    "kw, error, message",
    [
        ({"max_iter": "x"}, TypeError, "max_iter must be an int"),
        ({"max_iter": -1}, ValueError, "max_iter must be >= 1"),
        ({"patience": 0}, ValueError, "patience must be >= 1"),
        ({"stage_iter": 2.5}, TypeError, "stage_iter must be an int"),
    ],
)
def test_reorder_arguments(kw, error, message):
    with pytest.raises(error, match=message):
        tg.reorder(sp.eye_array(8, format="csr"), device="cpu", **kw)


def test_improvement_rate_follows_the_objective():
    A = sp.random_array((16, 16), density=0.2, rng=11, format="csr")
    rep = tg.reorder(A, "4:2:8", device="cpu").report
    assert rep.objective == "mbscore" and rep.improvement_rate >= 0
    assert rep.improvement_rate == (rep.initial_mbscore - rep.mbscore) / rep.initial_mbscore
    assert "of MBScore removed" in str(rep)
    assert tg.reorder(A, "2:4", device="cpu").report.objective == "pscore"


def test_reorder_device_vocabulary():
    with pytest.raises(ValueError, match="device must be None, 'cuda' or 'cpu'"):
        tg.reorder(sp.eye_array(8, format="csr"), device="gpu")


# -- the window stage (reorder(..., layout=)) ----------------------------------


def grouping_padding(A, perm, layout):
    """Padding share of ``layout``'s N:M grouping of ``perm.apply(A)``, from the reference grouping."""
    from tcgnn_py.tiles import _nm_windows as nw

    B = sp.csr_array(A if perm is None else perm.apply(A))
    B.sum_duplicates()
    r, c = B.nonzero()
    lay = tg.LAYOUTS[layout]
    g = nw.nm_groups(r, c, B.shape, lay.window, lay.pattern)
    nw.check_groups(g, r, c, B.shape)
    return g["padding"] / max(g["slots"], 1)


@pytest.mark.parametrize("layout", ["2:4", "1:2"])
def test_window_stage_stacks_hubs(layout):
    # Hubs whose leaves bring no other column: each forces padding in its window whatever its columns' order
    # (300 leaves: each hub's window is longer than one SpMM unit already, so pairing hubs lengthens no unit).
    A = stars(6, 300)
    p = tg.reorder(A, "2:4", layout=layout, device="cpu")
    rep = p.report
    np.testing.assert_array_equal(np.sort(p.perm), np.arange(A.shape[0]))
    assert rep.layout == layout and rep.renumbered > 0
    assert rep.initial_padding == grouping_padding(A, None, layout)
    assert rep.reorder_padding == grouping_padding(A, tg.reorder(A, "2:4", device="cpu"), layout)
    assert rep.padding == grouping_padding(A, p, layout) < 0.5 * rep.reorder_padding
    again = tg.nm_report(A, "2:4", p, device="cpu")  # the scores are those of the final order
    assert (again.pscore, again.mbscore) == (rep.pscore, rep.mbscore)
    assert f"{layout} windows: padding" in str(rep) and "vertices renumbered" in str(rep)


def test_window_stage_keeps_an_order_it_cannot_improve(cora, cora_24):
    # A ring: no row forces padding, so the two stages' order stands.
    n = 50
    ring = sp.csr_array((np.ones(2 * n), (np.r_[np.arange(n), (np.arange(n) + 1) % n],
                                          np.r_[(np.arange(n) + 1) % n, np.arange(n)])), shape=(n, n))
    p = tg.reorder(ring, "2:4", layout="2:4", device="cpu")
    np.testing.assert_array_equal(p.perm, tg.reorder(ring, "2:4", device="cpu").perm)
    assert p.report.renumbered == 0 and p.report.padding == p.report.reorder_padding
    q = tg.reorder(cora, "2:4", layout="2:4", device="cpu")
    assert q.report.padding == grouping_padding(cora, q, "2:4") <= q.report.reorder_padding
    assert q.report.reorder_padding == grouping_padding(cora, cora_24, "2:4")
    assert cora_24.report.layout is None and cora_24.report.padding is None


@pytest.mark.parametrize("n,dense", [(0, False), (5, False), (1, True), (20, True)])
def test_window_stage_edge_cases(n, dense):
    A = sp.csr_array(np.ones((n, n), np.float32) if dense else (n, n), dtype=np.float32)
    for layout in ("2:4", "1:2"):
        p = tg.reorder(A, "2:4", layout=layout, device="cpu")
        assert len(p.perm) == n and p.report.renumbered == 0 and p.report.layout == layout
        assert p.report.padding == grouping_padding(A, p, layout)


def test_stacked_order_puts_k_hubs_in_each_window():
    from tcgnn_py.orders import _reorder as R

    n, W = 40, 16
    deg = np.arange(n, dtype=np.int64) % 7
    hub = np.zeros(n, bool)
    hub[[3, 10, 11, 20, 33]] = True
    deg[[3, 10, 11, 20, 33]] = [50, 90, 70, 90, 60]
    for k in (2, 4, 16):
        order = R._stacked_order(np, hub, deg, n, W, k)
        np.testing.assert_array_equal(np.sort(order), np.arange(n))
        hubs = [10, 20, 11, 33, 3]  # densest first, ties by position
        rest = [i for i in range(n) if not hub[i]]
        want, ri = [], 0
        for hi in range(0, len(hubs), k):  # k hubs, then W - k other rows, per window
            want += hubs[hi:hi + k] + rest[ri:ri + W - k]
            ri += W - k
        np.testing.assert_array_equal(order, want + rest[ri:], err_msg=f"k={k}")


def test_window_stage_splits_no_more_windows():
    """Candidates that split more windows into SpMM units, or lengthen the longest unit by more than 1/8, lose."""
    from tcgnn_py.orders import _reorder as R

    unit = R.NM_BLOCKS_PER_UNIT

    def long_windows(A, perm):
        n = A.shape[0]
        rows, cols = (a.astype(np.int64) for a in sp.csr_array(A).nonzero())
        inv = np.empty(n, np.int64)
        inv[perm] = np.arange(n)
        _, _, n_long, longest = R.window_grouping(np, rows, cols, inv, n, tg.LAYOUTS["2:4"], unit)
        return n_long, min(longest, unit)

    # 40 leaves: hubs stacked 2-16 to a window make its longest unit 1.2-8x the two stages' (5 blocks), so the
    # two stages' order stays; 300 leaves: every hub window is past one unit already, and pairing them pays.
    for leaves in (40, 300):
        A = stars(16, leaves)
        p, base = (tg.reorder(A, "2:4", layout=lay, device="cpu") for lay in ("2:4", None))
        (long_p, longest_p), (long_b, longest_b) = long_windows(A, p.perm), long_windows(A, base.perm)
        assert long_p <= long_b and longest_p <= longest_b + longest_b // 8
        if leaves == 40:
            assert p.report.renumbered == 0 and p.report.padding == p.report.reorder_padding
        else:
            assert p.report.padding < 0.5 * p.report.reorder_padding
