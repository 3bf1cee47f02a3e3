"""The N:M layouts ("2:4", "1:2") and their sparse tensor-core SpMM (issue 19).

Module-level tests run wherever the suite runs: the layout is lossless and
conforms on every matrix of the zoo, the compressed fragments and metadata read
back (as ``mma.sp`` reads them, :func:`tcgnn_py.tiles._nm_windows.sp_dense_blocks`)
to the blocks' entries, products match the reference.  The ``gpu`` tests sweep
the ``tcgnn_spmm_sp`` kernels against exact integer products through
NaN-poisoned outputs.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from _env import check_cached_launch, cupy_fixture, exact_product, host, int_graph, ints, poisoned, tuning_fixture
from _zoo import star, zoo

import tcgnn_py as tg
from tcgnn_py.tiles import _nm_windows as nw
from tcgnn_py import _reference as ref
from tcgnn_py.products.families import sparse as _sparse_tc

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 tests need ml_dtypes (the [bf16] extra)")
F16, BF16, F32 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)
HALVES = [F16, BF16]
NM = ["2:4", "1:2"]
TINY = zoo("tiny")


def dense_blocks(T):
    t = T.tiling
    H, W = t.tile_shape
    out = np.zeros((t.n_blocks, H * W))
    out[host(ref.entry_blocks(t.block_ptr, t.nnz)), host(t.tile_pos)] = np.asarray(host(T.values), np.float64)
    return out.reshape(t.n_blocks, H, W)


def test_named_layouts():
    assert tg.LAYOUTS["2:4"].tile_shape == (16, 16) and tg.LAYOUTS["2:4"].pattern == (2, 4)
    assert tg.LAYOUTS["1:2"].tile_shape == (16, 8) and tg.LAYOUTS["1:2"].name == "1:2"
    assert tg.Layout(16, 8).name == "tcgnn"  # the pattern tells 1:2 from TC-GNN's 16 x 8
    with pytest.raises(ValueError, match="named layouts '2:4' and '1:2'"):
        tg.TiledMatrix(TINY["n17"], layout=tg.Layout(16, 8, pattern=(2, 4)))


@pytest.mark.parametrize("layout", NM)
@pytest.mark.parametrize("name", sorted(TINY))
def test_lossless_and_conforming(layout, name):
    A = TINY[name]
    T = tg.TiledMatrix(A, layout=layout)
    T.check_format(full_check=True)  # every group of M slots holds <= N entries of each row
    assert T.layout == tg.LAYOUTS[layout]
    assert (host_csr(T) != A).nnz == 0
    Tt = T.T
    assert Tt.layout == T.layout
    Tt.check_format(full_check=True)
    assert (host_csr(Tt) != A.T).nnz == 0
    rng = np.random.default_rng(0)
    X = ints(rng, A.shape[1], 5, dtype=F32)
    np.testing.assert_array_equal(host(T @ X), exact_product(A, X, F32))


def host_csr(T):
    C = T.tocsr()
    return sp.csr_array((host(C.data), host(C.indices), host(C.indptr)), shape=C.shape)


def test_full_check_rejects_a_nonconforming_block():
    T = tg.TiledMatrix(sp.csr_array(np.ones((1, 4), np.float32)), layout="2:4", device="cpu")
    t = T.tiling
    assert t.n_blocks == 1 and t.stats().padding_slots == 12  # two groups of two slots each, one block
    bad = tg.Tiling(t.win_ptr, t.block_cols.copy(), t.block_ptr, t.tile_pos.copy(), t.perm, t.shape, t.layout)
    bad.block_cols[0, :4] = np.arange(4)
    bad.tile_pos[:] = np.arange(4)  # one row, four entries in the first group of four
    with pytest.raises(ValueError, match="more than 2 entries in a group of 4"):
        bad.check(full_check=True)


@pytest.mark.parametrize("layout", NM)
def test_packing_reads_back_as_mma_sp_reads_it(layout):
    rng = np.random.default_rng(0)
    A = tg.power_law_graph(400, 6000, seed=int(rng.integers(1 << 30)))
    A.data = rng.integers(1, 9, A.nnz).astype(np.float32)
    T = tg.TiledMatrix(A, layout=layout, device="cpu")
    t = T.tiling
    n = t.layout.pattern[0]
    meta, dest = _sparse_tc.pack_structure(np, t.block_ptr, t.tile_pos, t.n_blocks, t.layout)
    assert meta.dtype == np.uint32 and meta.shape == (t.n_blocks, 8)
    assert np.unique(dest).size == t.nnz  # one compressed place per entry
    comp = _sparse_tc.pack_values(np, dest, t.n_blocks, t.layout, T.values.astype(np.float32))
    got = nw.sp_dense_blocks(comp.reshape(t.n_blocks, 32, 2, n), meta, t.layout.pattern)
    np.testing.assert_array_equal(got, dense_blocks(T))
    if layout == "2:4":  # (hi, lo) pairs: hi registers then lo registers per lane
        bits = (np.arange(t.nnz, dtype=np.uint32) + 1) | ((np.arange(t.nnz, dtype=np.uint32) + 7) << 16)
        comp = _sparse_tc.pack_values(np, dest, t.n_blocks, t.layout, bits, split=True).reshape(t.n_blocks, 32, 2, 2, 2)
        for part, want in ((0, bits & 0xFFFF), (1, bits >> 16)):
            got = nw.sp_dense_blocks(comp[:, :, part].astype(np.float64), meta, t.layout.pattern)
            blocks = np.zeros((t.n_blocks, 256))
            blocks[ref.entry_blocks(t.block_ptr, t.nnz), t.tile_pos] = want
            np.testing.assert_array_equal(got.reshape(t.n_blocks, -1), blocks)


def test_emulator_rejects_unordered_metadata():
    comp = np.zeros((1, 32, 2, 2))
    with pytest.raises(ValueError, match="ascend"):
        nw.sp_dense_blocks(comp, np.full((1, 8), 0x1111_1111, np.uint32), (2, 4))  # positions (1, 0)
    with pytest.raises(ValueError, match="0x4 or 0xE"):
        nw.sp_dense_blocks(comp[..., :1], np.zeros((1, 8), np.uint32), (1, 2))


@pytest.mark.parametrize("layout", NM)
def test_tile_stats_count_padding(layout):
    rng = np.random.default_rng(0)
    A = int_graph(rng, 300, 300)
    T = tg.TiledMatrix(A, layout=layout, device="cpu")
    s = T.tile_stats()
    t = T.tiling
    H, W = t.tile_shape
    rows, cols = A.tocoo().coords
    distinct = np.unique((rows // H) * A.shape[1] + cols).size
    assert s.padding_slots == t.n_blocks * W - distinct
    # Padding inside groups, counted from the reference grouping (the layout's slot order is the grouping's).
    g = nw.nm_groups(rows, cols, A.shape, H, t.layout.pattern)
    assert s.group_padding_slots == g["padding"]
    assert s.group_padding_fraction == pytest.approx(g["padding"] / g["slots"])
    assert s.pattern == t.layout.pattern and 0 <= s.windows_unpadded <= s.nonempty_windows
    assert f"{s.pattern[0]}:{s.pattern[1]} padding" in str(s)
    D = tg.TiledMatrix(sp.eye_array(64, format="csr", dtype=np.float32), layout=layout, device="cpu").tile_stats()
    assert D.windows_unpadded == D.nonempty_windows  # one entry per row: nothing to pad


def test_reorder_feeds_the_2_4_layout():
    A = tg.power_law_graph(2000, 20000, seed=5)
    A = ((A + A.T) > 0).astype(np.float32)
    p = tg.reorder(A, "2:4")
    before = tg.TiledMatrix(A, layout="2:4").tile_stats()
    after = tg.TiledMatrix(p.apply(A), layout="2:4").tile_stats()
    assert after.padding_slots < before.padding_slots


def test_half_x_on_2_4_and_float32_x_on_1_2_match_the_reference():
    rng = np.random.default_rng(0)
    A = int_graph(rng, 200, 150)
    for xt in HALVES:
        X = ints(rng, 150, 24, dtype=xt)
        T = tg.TiledMatrix(A, dtype=np.float32, layout="2:4")
        np.testing.assert_array_equal(host(T @ X), exact_product(A, X, F32))
        np.testing.assert_array_equal(host(tg.spmm(T, X, precision={F16: "fp16", BF16: "bf16"}[xt])), exact_product(A, X, F32))
    T = tg.TiledMatrix(A, dtype=np.float32, layout="1:2")
    X = ints(rng, 150, 24, dtype=F32)
    for p in (None, "tf32", "fp32"):
        np.testing.assert_array_equal(host(tg.spmm(T, X, precision=p)), exact_product(A, X, F32))
    Xa = ints(rng, 200, 24, dtype=F32)
    mask = (A != 0).toarray().astype(np.float64)
    for t in (T, tg.TiledMatrix(A, dtype=np.float32, layout="2:4")):  # SDDMM runs on the N:M layouts too
        for xt in (F32, F16):
            E = host_csr(tg.sddmm(t, Xa.astype(xt), X.astype(xt)))
            np.testing.assert_array_equal(E.toarray(), mask * (Xa.astype(np.float64) @ X.T.astype(np.float64)))


# --- the mma.sp kernels on the GPU ----------------------------------------------------------------

DS = [1, 3, 8, 16, 17, 64, 130, 256]
NS = [1, 15, 17, 1000, 16005]
#: N:M SpMM variants (one compiled shape per types and alignment, kernels.products.SP_SPMM_CONFIGS): the default
#: units, and one block per unit (every multi-block window split, summed by the fixup launch); the split-values
#: kernels on float32 matrices of small integers.
SP_VARIANTS = {"default": {}, "fixup": dict(sp_blocks_per_unit=1),
               # a float32 matrix of small integers as (hi, lo) pairs, not as the 16-bit values it holds exactly
               "pairs": dict(half_exact_values=False), "pairs-fixup": dict(half_exact_values=False, sp_blocks_per_unit=1)}


sp_kernel = tuning_fixture(SP_VARIANTS)


cp = cupy_fixture()


def ran_sp(T):
    return bool(T.tiling.cached_items("sp_launch"))


def check_all(cp, A, D, rng, xts=(F16, BF16, F32)):
    """Every (X type, matrix type, out type) of both N:M layouts on A, exact."""
    for xt in xts:
        X = ints(rng, A.shape[1], D, dtype=xt)
        Xd = cp.asarray(X)
        if xt == F32:
            T = tg.TiledMatrix(A, dtype=F32, layout="1:2")
            got = poisoned(cp, T, Xd, F32)
            np.testing.assert_array_equal(got, exact_product(A, X, F32).astype(np.float64), err_msg="1:2 TF32")
            assert ran_sp(T), "mma.sp TF32 kernel ran"
            continue
        for mdt in (F32, xt):
            T = tg.TiledMatrix(A, dtype=mdt, layout="2:4")
            for ydt in (F32, xt):
                got = poisoned(cp, T, Xd, ydt, precision={F16: "fp16", BF16: "bf16"}[xt])
                np.testing.assert_array_equal(got, exact_product(A, X, ydt).astype(np.float64),
                                              err_msg=f"2:4 {xt} X, {mdt} matrix, {ydt} out")
            assert ran_sp(T), "mma.sp 16-bit kernel ran"


@pytest.mark.gpu
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("D", DS)
def test_sp_kernels_exact_integers(cp, sp_kernel, N, D):
    rng = np.random.default_rng(0)
    check_all(cp, int_graph(rng, N, N), D, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1000, 3000), (3000, 1000), (17, 40_000), (40_000, 17)])
def test_sp_kernels_rectangular(cp, sp_kernel, shape):
    rng = np.random.default_rng(0)
    A = int_graph(rng, *shape)
    for D in (64, 130):
        check_all(cp, A, D, rng)


@pytest.mark.gpu
def test_sp_kernels_star_hub_200k(cp, sp_kernel):
    A = star(200_000)
    rng = np.random.default_rng(0)
    for D in (17, 64, 128):
        check_all(cp, A, D, rng, xts=(F16, F32))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", NM)
def test_sp_kernels_bit_identical_repeats_and_random_error(cp, sp_kernel, layout):
    rng = np.random.default_rng(0)
    A = tg.power_law_graph(20_000, 300_000, seed=int(rng.integers(1 << 30)))
    A.data = rng.standard_normal(A.nnz).astype(np.float32)
    xt = F16 if layout == "2:4" else F32
    X = cp.asarray(rng.standard_normal((A.shape[1], 96)).astype(np.float32)).astype(xt)
    T = tg.TiledMatrix(A, layout=layout)
    first = poisoned(cp, T, X, F32)
    np.testing.assert_array_equal(first, poisoned(cp, T, X, F32))
    want = A.astype(np.float64) @ np.asarray(X.get(), np.float64)
    tol = 2e-5 if layout == "2:4" else 1e-3  # float32 values in (hi, lo) float16 pairs; TF32 rounds X and A
    assert np.linalg.norm(first - want) <= tol * np.linalg.norm(want)
    assert ran_sp(T)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", NM)
def test_sp_bound_plan_matches_the_first_call(cp, sp_kernel, layout):
    """The second call of a signature takes the cached launch: the same bits as the first (as the vector
    layout's bound plan; ``T @ X``, ``spmm(out=)``, explicit precision, split windows, ``with_values``)."""
    rng = np.random.default_rng(0)
    A = int_graph(rng, 1000, 1000)
    A = sp.csr_array(sp.vstack([sp.csr_array(np.ones((1, 1000))), A[1:]]))  # a hub row: split windows
    A.sum_duplicates()  # canonical: with_values takes values in this order
    for xt in ((F16, BF16) if layout == "2:4" else (F32,)):
        types = (F32,) if xt == F32 else (F32, xt)
        for mdt in types:
            T = tg.TiledMatrix(A, dtype=mdt, layout=layout)
            for D in (17, 64):
                X = cp.asarray(ints(rng, 1000, D, dtype=xt))
                check_cached_launch(cp, A, T, X, types, {F16: "fp16", BF16: "bf16", F32: "tf32"}[xt], rng)
            assert ran_sp(T)


@pytest.mark.parametrize("layout", NM)
def test_gcn_layer_takes_an_nm_matrix(layout):
    """The GNN layers take an N:M TiledMatrix unchanged: forward and backward (through Aᵀ) exact on integers."""
    rng = np.random.default_rng(0)
    A = int_graph(rng, 300, 300)
    H = ints(rng, 300, 16, dtype=F32)
    W = ints(rng, 16, 8, dtype=F32)
    T = tg.TiledMatrix(A, dtype=np.float32, layout=layout)
    xp = np if T.device == "cpu" else __import__("cupy")
    out, vjp = tg.nn.gcn_conv(T, xp.asarray(H), xp.asarray(W))
    np.testing.assert_array_equal(host(out), exact_product(A, H @ W, F32))
    g = ints(rng, 300, 8, dtype=F32)
    dH, dW, _ = vjp(xp.asarray(g))
    np.testing.assert_array_equal(host(dH), (A.T.astype(np.float64) @ g) @ W.T)
