"""The reorder's Numba kernels against the NumPy reference: in the simulator (CI) and on the GPU.

The same code runs both ways (``xp`` is NumPy in the simulator, CuPy on a GPU):
every array of an evaluation, stage 1's order and stage 2's swaps must equal
the reference's, and on the GPU whole reorders must return the same permutation.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from _env import graph_dir, host

import tcgnn_py as tg
from tcgnn_py.orders import _reorder as R
from tcgnn_py._validation import Pattern

pytestmark = pytest.mark.kernels



def backends(xp, A, pattern):
    pattern, rb = R._prepare(A, pattern, "cpu")
    kb = R._KernelBackend(
        xp, xp.asarray(rb.indices.astype(np.int32)), xp.asarray(rb.edge_row.astype(np.int32)), rb.n, pattern
    )
    return rb, kb


def graph(n, density, seed):
    rng = np.random.default_rng(seed)
    A = sp.random_array((n, n), density=density, rng=rng, format="csr")
    return sp.csr_array(A + A.T)


SIM_CASES = [  # tiny: the simulator runs one Python thread per CUDA thread
    (graph(21, 0.2, 1), Pattern(1, 2, 4)),
    (graph(37, 0.12, 2), Pattern(1, 1, 8)),
    (graph(30, 0.25, 3), Pattern(4, 2, 8)),
]


def check_evaluate_and_stage1(xp, A, pattern, perm_seed=0):
    rb, kb = backends(xp, A, pattern)
    perm = np.random.default_rng(perm_seed).permutation(rb.n)
    want = rb.evaluate(perm)
    got = kb.evaluate(xp.asarray(perm.astype(np.int32)))
    for key in ("vrow", "vseg", "bits", "seg_pscore", "seg_nnz"):
        np.testing.assert_array_equal(host(getattr(got, key)), getattr(want, key), err_msg=key)
    for key in ("pscore", "mbscore", "n_vectors", "n_meta_blocks"):
        assert getattr(got, key) == getattr(want, key), key
    np.testing.assert_array_equal(host(kb.stage1(got)), rb.stage1(want))
    return rb, kb, want, got


@pytest.mark.parametrize("case", range(len(SIM_CASES)))
def test_evaluate_and_stage1(xp, case):
    check_evaluate_and_stage1(xp, *SIM_CASES[case])


@pytest.mark.parametrize("case", [0, 2])
def test_stage2_round(xp, case):
    A, pattern = SIM_CASES[case]
    rb, kb = backends(xp, A, pattern)
    want = rb.evaluate(rb.identity())
    got = kb.evaluate(kb.identity())
    perm_ref, n_ref = rb.stage2(want)
    perm_gpu, n_gpu = kb.stage2(got)
    assert n_gpu == n_ref > 0
    np.testing.assert_array_equal(host(perm_gpu), perm_ref)


def test_pack_bits_one_warp(xp):
    # ids in runs that straddle lanes, including a run across the warp boundary
    from tcgnn_py.kernels import reorder as k

    ids = np.array([0, 0, 0, 1, 2, 2, 3, 3, 3, 3] * 3 + [4, 4] + [5] * 6, np.int64)
    ids = np.sort(ids)
    bits = (1 << (np.arange(ids.size) % 7)).astype(np.uint32)
    want = np.zeros(ids.max() + 1, np.uint32)
    np.bitwise_or.at(want, ids, bits)
    out = xp.zeros(want.size, dtype=np.uint32)
    k.pack_bits[2, 32](xp.asarray(ids), xp.asarray(bits), 7, out)
    np.testing.assert_array_equal(host(out), want)


REAL = ["cora", "citeseer", "ppi_homo_sapiens", "lastfm_asia", "power_grid", "ss_dwt_2680", "polblogs"]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name,pattern",
    [(g, "2:4") for g in REAL + ["powerlaw"]]
    + [(g, (4, 2, 8)) for g in REAL[:6] + ["powerlaw"]]
    + [("cora", "1:8"), ("ss_dwt_2680", "1:8"), ("cora", (8, 2, 16)), ("citeseer", (2, 3, 32))],
    ids=str,
)
def test_reorder_gpu_equals_reference(name, pattern):
    if name == "powerlaw":
        A = tg.power_law_graph(3001, 12000, seed=5, symmetric=True)
    else:
        A = sp.load_npz(graph_dir(name) / "adj_csr.npz")
    p_gpu = tg.reorder(A, pattern, device="cuda")
    p_ref = tg.reorder(A, pattern, device="cpu")
    np.testing.assert_array_equal(p_gpu.perm, p_ref.perm)
    r, q = p_gpu.report, p_ref.report
    assert (r.pscore, r.mbscore, r.initial_pscore, r.iterations) == (q.pscore, q.mbscore, q.initial_pscore, q.iterations)


@pytest.mark.gpu
@pytest.mark.parametrize("name,layout", [("cora", "2:4"), ("ppi_homo_sapiens", "2:4"), ("polblogs", "1:2"),
                                         ("powerlaw", "2:4"), ("powerlaw", "1:2")], ids=str)
def test_window_stage_gpu_equals_reference(name, layout):
    # The window stage scores its candidates with the grouping kernel on the GPU, the reference on the host.
    if name == "powerlaw":
        A = tg.power_law_graph(3001, 12000, seed=5, symmetric=True)
    else:
        A = sp.load_npz(graph_dir(name) / "adj_csr.npz")
    p_gpu = tg.reorder(A, "2:4", layout=layout, device="cuda")
    p_ref = tg.reorder(A, "2:4", layout=layout, device="cpu")
    np.testing.assert_array_equal(p_gpu.perm, p_ref.perm)
    r, q = p_gpu.report, p_ref.report
    fields = ("pscore", "mbscore", "initial_padding", "reorder_padding", "padding", "renumbered")
    assert [getattr(r, f) for f in fields] == [getattr(q, f) for f in fields]
    assert r.padding <= r.reorder_padding


@pytest.mark.gpu
def test_evaluate_gpu_large(xp):
    A = tg.power_law_graph(20000, 200000, seed=2, symmetric=True)
    for pattern in (Pattern(1, 2, 4), Pattern(16, 2, 16), Pattern(1, 3, 32)):
        check_evaluate_and_stage1(xp, A, pattern, perm_seed=1)


@pytest.mark.gpu
def test_reordered_spmm_on_gpu_is_lossless():
    import cupy
    import cupyx.scipy.sparse as csp

    A = sp.load_npz(graph_dir("cora") / "adj_csr.npz")
    rng = np.random.default_rng(0)
    A = sp.csr_array(A)
    A.data = rng.integers(-8, 9, A.nnz).astype(np.float32)
    p = tg.reorder(A, "2:4")
    B = p.apply(A)
    Bd = p.apply(csp.csr_matrix(A))  # cupyx in, cupyx out
    assert isinstance(Bd, csp.csr_matrix)
    np.testing.assert_array_equal(Bd.get().toarray(), B.toarray())
    X = cupy.asarray(rng.integers(-8, 9, (A.shape[0], 33)).astype(np.float32))
    Y = p.undo_rows(tg.TiledMatrix(B) @ p.apply_rows(X))
    np.testing.assert_array_equal(Y.get(), A @ X.get())
    before, after = tg.TiledMatrix(A).tile_stats(), tg.TiledMatrix(B).tile_stats()
    assert after.nnz == before.nnz and after.blocks > 0 and before.blocks > 0
