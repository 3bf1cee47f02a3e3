"""The Numba SGT kernels against the reference: in the simulator (CI) and on the GPU.

The same test runs both ways: ``xp`` is NumPy in the simulator (it takes host
arrays) and CuPy on a GPU.  Arrays must be identical, dtype included.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from _zoo import raw_with_duplicates, zoo
from _env import DATA_DIRS, SIM, host

import tcgnn_py as tg
from tcgnn_py import _reference as ref
from tcgnn_py.tiles import _sgt

pytestmark = pytest.mark.kernels

TINY = zoo("tiny")



#: The translation's two forms: its kernels one launch each, and one CTA's launch of them all (small matrices).
SMALL = pytest.mark.parametrize("small", [False, True], ids=["steps", "one_cta"])


def kernel_vs_reference(xp, A, tile_shape, small=None):
    A = sp.csr_array(A, dtype=np.float32)
    A.sum_duplicates()
    args = (A.data, A.indices.astype(np.int32), A.indptr.astype(np.int32))
    want = ref.translate(*args, A.shape, *tile_shape)
    got = _sgt.translate_kernels(xp, *(xp.asarray(a) for a in args), A.shape, *tile_shape, small=small)
    for key in want:
        g = host(got[key])
        assert g.dtype == want[key].dtype, key
        np.testing.assert_array_equal(g, want[key], err_msg=key)
    # A small tiling's derived data: its blocks' metadata, and its window pointers already on the host.
    meta = ref.block_meta(want["block_ptr"], want["tile_pos"], *_sgt.block_meta_layout(*tile_shape))
    np.testing.assert_array_equal(host(got["block_meta"]), meta)
    assert isinstance(got["host_win_ptr"], np.ndarray)
    np.testing.assert_array_equal(got["host_win_ptr"], want["win_ptr"])
    # The windows' statistics for planning products, read with the translation's one host read.
    stats = got["window_stats"]
    from tcgnn_py.kernels import sgt as k

    assert stats.sizes == (16, 32, 64, 128, 256) and stats.max_units == k.STAT_MAX_UNITS
    np.testing.assert_array_equal([stats.longest, stats.empty, *stats.units, *stats.capped, *stats.cut],
                                  ref.window_stats(want["win_ptr"], stats.sizes, stats.max_units))



@SMALL
@pytest.mark.parametrize("name", sorted(TINY))
def test_translate_tiny(xp, name, small):
    kernel_vs_reference(xp, TINY[name], (16, 8), small)


@SMALL
@pytest.mark.parametrize("tile_shape", [(16, 16), (8, 8), (8, 4), (32, 4), (4, 32), (1, 2)])
def test_translate_tile_shapes(xp, tile_shape, small):
    kernel_vs_reference(xp, TINY["n17"], tile_shape, small)


@SMALL
def test_translate_scans_of_several_tiles(xp, small):
    # More entries than one tile of the one-CTA scan holds (SCAN_ITEMS x its threads): its tiles in turn.
    A = sp.random_array((97, 113), density=0.08, rng=np.random.default_rng(3), format="csr")
    kernel_vs_reference(xp, A, (8, 4), small)


def test_small_matrices_take_one_launch(xp, monkeypatch):
    """A translation of at most ``sgt_one_launch_max`` entries is one CTA's launch; larger ones launch each kernel."""
    from tcgnn_py.kernels import sgt as k

    launched, launch = [], _sgt._launch
    monkeypatch.setattr(_sgt, "_launch", lambda kernel, *args: launched.append(kernel) or launch(kernel, *args))
    A = sp.csr_array(TINY["n17"], dtype=np.float32)
    args = [xp.asarray(a) for a in (A.data, A.indices.astype(np.int32), A.indptr.astype(np.int32))]
    _sgt.translate_kernels(xp, *args, A.shape, 8, 4)
    assert launched == [k.translate_small]
    launched.clear()
    with tg.tuning(sgt_one_launch_max=A.nnz - 1):
        _sgt.translate_kernels(xp, *args, A.shape, 8, 4)
    assert k.translate_small not in launched and launched[0] is k.check_csr and len(launched) >= 8


def _hub(n):
    """A window whose first row holds many columns and whose other rows repeat some; many empty windows."""
    rows = np.r_[np.zeros(n - 1, int), np.arange(1, 16)]
    cols = np.r_[np.arange(1, n), np.arange(1, 16) * 3]
    return sp.csr_array((np.ones(rows.size), (rows, cols)), shape=(n, n))


@SMALL
@pytest.mark.parametrize("tile_shape", [(16, 8), (1, 2)])
def test_translate_hub_window(xp, small, tile_shape):
    # (1 x 2 tiles: a window of 75 blocks in the simulator, which every unit size of the statistics but 128 and 256
    # cuts; on the GPU one of 20,000, which the smallest size cuts into more units than a window may take)
    kernel_vs_reference(xp, _hub(150 if SIM else 40000), tile_shape, small)


@pytest.mark.skipif(not SIM, reason="the GPU kernels compile the bound in; the simulator reads it when it runs")
@SMALL
def test_window_stats_count_units_beyond_the_bound(xp, small, monkeypatch):
    """A window cut into more units than a window may take counts the bound's units: a hub window of 75 blocks
    against a bound of 2 units."""
    from tcgnn_py.kernels import sgt as k

    monkeypatch.setattr(k, "STAT_MAX_UNITS", 2)
    kernel_vs_reference(xp, _hub(150), (1, 2), small)


@SMALL
def test_planning_reads_the_translations_window_stats(xp, small):
    """A tiling translated by the kernels plans its products from the statistics they counted: the same counts as
    passes over its windows on the host."""
    from tcgnn_py.products import _plans, _vec_layout
    from tcgnn_py.tiles import Tiling

    A = sp.csr_array(_hub(400 if SIM else 20000), dtype=np.float32)
    args = [xp.asarray(a) for a in (A.data, A.indices.astype(np.int32), A.indptr.astype(np.int32))]
    arrays = _sgt.translate_kernels(xp, *args, A.shape, 8, 4, small=small)
    counted, _ = Tiling.from_arrays(arrays, A.shape, (8, 4))
    passes, _ = Tiling.from_arrays({k: v for k, v in arrays.items() if k != "window_stats"}, A.shape, (8, 4))
    assert counted.peek("window_stats") is not None and passes.peek("window_stats") is None
    assert _plans.vec_longest(counted) == _plans.vec_longest(passes) > 64
    assert _vec_layout._size_stats(counted) == _vec_layout._size_stats(passes)
    for bpu in _vec_layout.VEC_UNIT_SIZES:
        assert _plans.plan_counts(counted, bpu, _plans.VEC_UNITS_PER_WINDOW_MAX) == \
            _plans.plan_counts(passes, bpu, _plans.VEC_UNITS_PER_WINDOW_MAX)


def test_canonicalize_kernels(xp):
    arrays, shape = raw_with_duplicates(np.random.default_rng(7))
    data, indices, indptr = (a.astype(t) for a, t in zip(arrays, (np.float32, np.int32, np.int32)))
    want = ref.canonicalize_csr(data, indices, indptr, shape)
    got = _sgt.canonicalize_kernels(xp, *(xp.asarray(a) for a in (data, indices, indptr)), shape)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(host(g), w)
        assert host(g).dtype == w.dtype


#: Invalid CSR arrays (shape 3 x 4) and scipy's message for each: the check kernel finds them.
BAD_CSR = {
    "decreasing indptr": ([0, 2, 1, 3], [0, 1, 2], "indptr must be a non-decreasing sequence"),
    "index too large": ([0, 1, 2, 3], [0, 4, 1], "indices must be < 4"),
    "negative index": ([0, 1, 2, 3], [0, -1, 1], "indices must be >= 0"),
}


@SMALL
@pytest.mark.parametrize("case", sorted(BAD_CSR))
def test_check_kernel_rejects(xp, case, small):
    indptr, indices, message = BAD_CSR[case]
    arrays = (np.ones(3, np.float32), np.array(indices, np.int32), np.array(indptr, np.int32))
    with pytest.raises(ValueError, match=message):
        _sgt.translate_kernels(xp, *(xp.asarray(a) for a in arrays), (3, 4), check=True, small=small)


@SMALL
@pytest.mark.parametrize("indptr", [[1, 1, 2, 3], [0, 1, 2, 4], [0, 1, 2, 2]], ids=["start", "end_high", "end_low"])
def test_check_kernel_finds_wrong_ends(xp, indptr, small):
    # indptr[0] != 0 or indptr[-1] != nnz: the check kernel says so (its caller reads them), nothing translated.
    arrays = (np.ones(3, np.float32), np.array([0, 1, 2], np.int32), np.array(indptr, np.int32))
    with pytest.raises(_sgt._SizesUnread):
        _sgt.translate_kernels(xp, *(xp.asarray(a) for a in arrays), (3, 4), check=True, small=small)


@SMALL
def test_check_kernel_non_canonical(xp, small):
    # Unsorted (row 0) and duplicate (row 1) columns: None with check=True, an error without.
    arrays = (np.ones(4, np.float32), np.array([2, 1, 3, 3], np.int32), np.array([0, 2, 4, 4], np.int32))
    dev = [xp.asarray(a) for a in arrays]
    assert _sgt.translate_kernels(xp, *dev, (3, 4), check=True, small=small) is None
    with pytest.raises(ValueError, match="canonical"):
        _sgt.translate_kernels(xp, *dev, (3, 4), small=small)


@pytest.mark.parametrize("n, threads", [(0, None), (1, None), (31, None), (300, 32), (2000, 64), (5000, None)])
def test_scan_kernels(xp, n, threads):
    # One tile (one launch) and several (tile totals first); 64 threads x 4 entries make 8 tiles of 2000.
    from tcgnn_py.kernels import sgt as k

    if SIM and threads is None and n > 300:
        pytest.skip("a 1024-thread CTA is too slow in the simulator")
    src = np.random.default_rng(n).integers(0, 9, n).astype(np.int32)
    dst = xp.full(n + 1, -1, np.int32)
    _sgt._scan(xp, k, xp.asarray(src), dst, xp.zeros(2, np.int32), threads)
    np.testing.assert_array_equal(host(dst), np.r_[0, np.cumsum(src)])


def test_check_kernel_rows(xp):
    # Rows found by the check kernel's search, empty rows included, are those of the reference.
    from tcgnn_py.kernels import sgt as k
    from tcgnn_py.kernels.launch import grid, launch_numba, THREADS_PER_BLOCK

    indptr = np.array([0, 0, 3, 3, 3, 5, 6, 6], np.int32)
    indices = np.array([0, 2, 5, 1, 4, 3], np.int32)
    rows = xp.zeros(6, np.int32)
    status = xp.zeros(2, np.int32)
    launch_numba(k.check_csr, grid(7), THREADS_PER_BLOCK, xp.asarray(indptr), xp.asarray(indices), 6, rows, status)
    np.testing.assert_array_equal(host(rows), [1, 1, 1, 4, 4, 5])
    assert host(status)[0] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["n16k1", "rect_1000x37", "rect_37x1000", "star_100k"])
def test_translate_gpu_zoo(xp, name):
    kernel_vs_reference(xp, zoo("full")[name], (16, 8))


def _all_graphs():
    names = set()
    for d in DATA_DIRS:
        if d.is_dir():
            names |= {p.name for p in d.iterdir() if (p / "adj_csr.npz").exists()}
    return sorted(names)


def assert_same_translation(A, tile_shape=(16, 8)):
    import cupy as cp

    A = sp.csr_array(A, dtype=np.float32)
    args = (A.data, A.indices.astype(np.int32), A.indptr.astype(np.int32))
    got = _sgt.translate_kernels(cp, *(cp.asarray(a) for a in args), A.shape, *tile_shape)
    want = ref.translate(*args, A.shape, *tile_shape)
    for key in want:
        np.testing.assert_array_equal(got[key].get(), want[key], err_msg=key)


@pytest.mark.gpu
@pytest.mark.parametrize("name", _all_graphs() or ["<no graphs found>"])
def test_sgt_real_graph_identical(name):
    if name.startswith("<"):
        pytest.skip(f"no graphs in {DATA_DIRS}")
    A = tg.load_graph(next(d / name for d in DATA_DIRS if (d / name).is_dir())).adj
    assert_same_translation(A)


@pytest.fixture(scope="module")
def power_law_1m():
    return tg.power_law_graph(1_000_000, 16_000_000, seed=0)


@pytest.mark.gpu
def test_sgt_power_law_1m_identical(power_law_1m):
    assert power_law_1m.nnz == 16_000_000
    assert_same_translation(power_law_1m)


@pytest.mark.gpu
def test_sgt_power_law_tile_shapes():
    A = tg.power_law_graph(20_000, 200_000, seed=3)
    for tile_shape in [(16, 16), (8, 8), (32, 4)]:
        assert_same_translation(A, tile_shape)


@pytest.mark.parametrize("cols_sorted", [False, True], ids=["pairs", "transposed"])
@pytest.mark.parametrize("shape", [(7, 5), (40, 3), (1, 9), (6, 0), (300, 2)])
def test_csr_of_order_kernel_is_the_sort_and_gathers(xp, shape, cols_sorted):
    """The CSR of COO pairs through one sort and one launch: the host's order, indices, row pointers and values,
    empty rows first, between and last included; a transposed CSR's pairs come column-sorted, sorted by row alone."""
    rng = np.random.default_rng(5)
    dense = (rng.random(shape) < 0.3) * rng.integers(1, 9, shape)
    dense[:1] = 0  # (an empty first row)
    dense[2:-2] *= shape[0] < 100  # (a long run of empty rows, more rows than entries)
    if cols_sorted:  # the entries of the transpose's CSR: ascending columns, each column's rows ascending
        cols, rows = np.nonzero(dense.T)
    else:
        rows, cols = np.nonzero(dense)
        perm = rng.permutation(rows.shape[0])
        rows, cols = rows[perm], cols[perm]
    rows, cols = rows.astype(np.int32), cols.astype(np.int32)
    data = dense[rows, cols].astype(np.float32)
    want = _sgt._csr_of_order(rows, cols, shape, cols_sorted, data)
    got = _sgt.csr_of_order_kernels(xp, xp.asarray(rows), xp.asarray(cols), shape, cols_sorted, xp.asarray(data))
    for w, g in zip(want, got):
        np.testing.assert_array_equal(host(g), w)
    order, indices, indptr = _sgt.csr_of_order_kernels(xp, xp.asarray(rows), xp.asarray(cols), shape, cols_sorted)[:3]
    np.testing.assert_array_equal(host(order), want[0])
    np.testing.assert_array_equal(host(indptr), want[2])
    A = sp.csr_array((want[3], want[1], want[2]), shape=shape)
    np.testing.assert_array_equal(A.toarray(), dense)
    assert A.has_canonical_format


@pytest.mark.parametrize("dtype", [np.float32, np.float64, None])
@pytest.mark.parametrize("shape", [(7, 5), (40, 3), (1, 9), (6, 0), (0, 4), (300, 2), (90, 700)])
def test_a_transpose_by_the_kernels_is_the_stable_sorts(xp, shape, dtype):
    """A canonical CSR's transpose by three launches and a scan, no sort: the stable sort's order, indices, row
    pointer and values bit for bit, with empty rows and columns, a column every row has and no entries."""
    rng = np.random.default_rng(6)
    dense = (rng.random(shape) < 0.3) * rng.integers(1, 9, shape)
    if shape[0] > 2 and shape[1] > 2:
        dense[:, 1] = 5  # (a column every row has)
        dense[:, 2] = 0  # (an empty column)
        dense[1] = 0  # (an empty row)
    rows, cols = (a.astype(np.int32) for a in np.nonzero(dense))
    data = None if dtype is None else dense[rows, cols].astype(dtype)
    want = _sgt._csr_of_order(cols, rows, shape[::-1], True, data)
    got = _sgt.transpose_kernels(xp, xp.asarray(rows), xp.asarray(cols), shape,
                                 None if data is None else xp.asarray(data))
    for w, g in zip(want, got):
        if w is None:
            assert g is None
            continue
        assert host(g).dtype == w.dtype
        np.testing.assert_array_equal(host(g), w)
    np.testing.assert_array_equal(sp.csr_array((dense[rows, cols][want[0]], want[1], want[2]),
                                               shape=shape[::-1]).toarray(), dense.T)


@pytest.mark.parametrize("trial", range(10))
def test_a_plan_made_by_one_cta_is_the_hosts(xp, trial):
    """The products' work plan by one CTA where the window pointers are: the host's units, split rows, slots and
    counts, on histograms with empty windows, hubs capped at the most units a window takes, and none cut."""
    from tcgnn_py.products import _plans

    rng = np.random.default_rng(trial)
    n = 1 if trial == 0 else int(rng.integers(2, 300 if SIM else 20000))
    nb = [rng.integers(0, 4, n), rng.integers(0, 300, n), (rng.pareto(1.1, n) * 40).astype(np.int64),
          np.zeros(n, np.int64)][trial % 4]
    win_ptr = np.concatenate(([0], np.cumsum(nb))).astype(np.int32)
    bpu, max_units = [(16, 1024), (4, 8), (1, 64), (128, 1 << 30)][trial % 4]
    want = _plans.build_plan(np, win_ptr, bpu, max_units)
    got = _plans.device_plan(xp, xp.asarray(win_ptr), np.diff(win_ptr), bpu, max_units)
    for key in ("units", "unit_k0", "splits"):
        assert host(got[key]).dtype == np.int32, key
        np.testing.assert_array_equal(host(got[key]), want[key], err_msg=key)
    assert (got["n_slots"], got["max_parts"]) == (want["n_slots"], want["max_parts"])


@pytest.mark.parametrize("trial", range(8))
def test_units_sorted_longest_first_by_one_cta_are_the_hosts(xp, trial):
    """A plan made and sorted longest first by one CTA in one launch (a counting sort, each warp a run of units): the
    host's plan in its stable longest-first order, on plans with many units of one length, empty windows' units,
    lengths up to the bound, and fewer units than warps; each array a view of one buffer, aligned as the kernels
    read plans."""
    from tcgnn_py.products import _plans

    rng = np.random.default_rng(trial)
    n = [0, 1, 3, 40][trial] if trial < 4 else int(rng.integers(100, 400 if SIM else 30000))
    nb = [rng.integers(0, 4, n), (rng.pareto(1.1, n) * 40).astype(np.int64)][trial % 2]
    win_ptr = np.concatenate(([0], np.cumsum(nb))).astype(np.int32)
    bpu, max_units = [(16, 1024), (4, 8)][trial // 2 % 2]
    plan = _plans.build_plan(np, win_ptr, bpu, max_units)
    longest = int((plan["units"][:, 2] - plan["units"][:, 1]).max(initial=0))
    want = _plans._longest_first(np, plan["units"], plan["unit_k0"]) + (plan["splits"],)
    for threads in ([32, 64] if SIM else [32, 1024]):
        got = _plans.device_plan(xp, xp.asarray(win_ptr), nb, bpu, max_units, threads, longest=max(longest, bpu))
        for w, key in zip(want, ("units", "unit_k0", "splits")):
            g = host(got[key])
            assert g.dtype == np.int32 and g.flags.c_contiguous, key
            np.testing.assert_array_equal(g, w, err_msg=key)
            if got[key].size:  # (at a multiple of 256 bytes from the buffer's start, the first array's)
                assert (_address(got[key]) - _address(got["units"])) % 256 == 0, key
        assert (got["n_slots"], got["max_parts"]) == (plan["n_slots"], plan["max_parts"])


def _address(a):
    """A host or device array's address."""
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr
