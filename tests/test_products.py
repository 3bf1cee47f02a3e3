"""SpMM / SDDMM semantics that hold on every path (host reference here, the kernels on a GPU)."""

import dataclasses

import numpy as np
import scipy.sparse as sp
import pytest
from _env import host
from _zoo import sddmm_expected, star, zoo

import tcgnn_py as tg
from tcgnn_py.products import _vec_layout
from tcgnn_py.products._modes import resolve_precision
from tcgnn_py.products.families import half as half_family, vec as vec_family

ZOO = zoo("full")



def test_precision_choice():
    assert resolve_precision(None, np.float32, (16, 8)) == "tf32"
    assert resolve_precision("tf32", np.float32, (16, 8)) == "tf32"
    assert resolve_precision("fp32", np.float32, (16, 8)) == "exact"
    assert resolve_precision(None, np.float64, (16, 8)) == "exact"
    assert resolve_precision(None, np.float32, (8, 8)) == "exact"
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("half", np.float32, (16, 8))
    with pytest.raises(TypeError, match="needs a float32 product"):
        resolve_precision("tf32", np.float64, (16, 8))
    with pytest.raises(ValueError, match="tile_shape=\\(16, 8\\)"):
        resolve_precision("tf32", np.float32, (32, 4))


def test_precision_errors_through_the_api():
    T = tg.TiledMatrix(ZOO["n17"], dtype=np.float64)
    X = np.ones((17, 4))
    with pytest.raises(TypeError, match="float32"):
        tg.spmm(T, X, precision="tf32")
    with pytest.raises(TypeError, match="float32"):
        tg.sddmm(T, X, precision="tf32")
    with pytest.raises(ValueError, match="precision must be"):
        tg.spmm(T.astype(np.float32), X.astype(np.float32), precision="half")
    np.testing.assert_allclose(host(tg.spmm(T, X, precision="fp32")), ZOO["n17"] @ X, rtol=1e-12)


@pytest.mark.parametrize("name", ["n17", "rect_5x40", "rect_40x5", "n16k1", "empty_5x3", "dense_window"])
@pytest.mark.parametrize("precision", [None, "fp32"])
def test_spmm_small_integers_exact(name, precision):
    A = ZOO[name]
    rng = np.random.default_rng(0)
    X = rng.integers(-8, 9, (A.shape[1], 19)).astype(np.float32)
    T = tg.TiledMatrix(A, dtype=np.float32)
    want = (A @ X.astype(np.float64)).astype(np.float32)
    Y = tg.spmm(T, X, precision=precision)
    assert isinstance(Y, np.ndarray) and Y.dtype == np.float32
    np.testing.assert_array_equal(Y, want)


def test_spmm_out_may_alias_the_operand():
    A = ZOO["n17"]
    T = tg.TiledMatrix(A, dtype=np.float32)
    X = np.random.default_rng(0).integers(-8, 9, (17, 5)).astype(np.float32)
    want = (A @ X.astype(np.float64)).astype(np.float32)
    assert tg.spmm(T, X, out=X) is X
    np.testing.assert_array_equal(X, want)


def test_spmm_mixed_dtypes_promote():
    T = tg.TiledMatrix(ZOO["n17"], dtype=np.float32)
    Y = T @ np.ones((17, 2), np.float64)
    assert Y.dtype == np.float64
    assert (T @ np.ones((17, 2), np.int8)).dtype == np.float32


@pytest.mark.parametrize("name", ["n17", "rect_5x40", "rect_40x5", "n16k1", "empty_5x3", "star_100k"])
@pytest.mark.parametrize("multiply", [False, True])
def test_sddmm_matches_dense(name, multiply):
    A = ZOO[name]
    rng = np.random.default_rng(0)
    Xa = rng.integers(-8, 9, (A.shape[0], 7)).astype(np.float32)
    Xb = rng.integers(-8, 9, (A.shape[1], 7)).astype(np.float32)
    T = tg.TiledMatrix(A, dtype=np.float32)
    S = tg.sddmm(T, Xa, Xb, multiply_values=multiply)
    assert isinstance(S, tg.TiledMatrix) and S.shape == T.shape and S.dtype == np.float32
    assert S.tile_shape == T.tile_shape and S.nnz == T.nnz
    np.testing.assert_array_equal(host(S.block_cols), host(T.block_cols))  # same tiling, no re-translation
    np.testing.assert_array_equal(S.tocsr().data, sddmm_expected(A, Xa, Xb, multiply).astype(np.float32))


def test_sddmm_defaults_and_shapes():
    A = ZOO["n17"]
    T = tg.TiledMatrix(A, dtype=np.float32)
    X = np.random.default_rng(0).integers(-4, 5, (17, 3)).astype(np.float32)
    np.testing.assert_array_equal(tg.sddmm(T, X).tocsr().data, sddmm_expected(A, X, X).astype(np.float32))
    x = X[:, 0]
    np.testing.assert_array_equal(
        tg.sddmm(T, x, x).tocsr().data, sddmm_expected(A, x[:, None], x[:, None]).astype(np.float32)
    )
    assert tg.sddmm(T, X, X.astype(np.float64)).dtype == np.float64
    with pytest.raises(ValueError, match=r"sddmm: dimension mismatch with signature \(n=17,k=17\),\(n=16,d=3\)"):
        tg.sddmm(T, X[:16], X)
    with pytest.raises(ValueError, match="dimension mismatch"):
        tg.sddmm(T, X, X[:, :2])
    R = tg.TiledMatrix(ZOO["rect_5x40"], dtype=np.float32)
    with pytest.raises(ValueError, match="dimension mismatch"):
        tg.sddmm(R, np.ones((5, 2), np.float32))  # Xb defaults to Xa: needs a square matrix
    with pytest.raises(TypeError, match="expects a TiledMatrix"):
        tg.sddmm(A, X)


def test_sddmm_zero_width():
    T = tg.TiledMatrix(ZOO["n17"], dtype=np.float32)
    S = tg.sddmm(T, np.ones((17, 0), np.float32))
    assert S.nnz == T.nnz and not np.any(host(S.tocsr().data))


def test_fixed_size_parts_are_the_attention_passes_units():
    """``even=False``: every owner cut into parts of ``unit`` items but the last, as the fused attention passes
    take them (a row of 0 entries keeps one empty unit); an owner's parts own consecutive slots, which its k0 row
    names with the number of its parts."""
    from tcgnn_py.products._plans import build_plan

    rng = np.random.default_rng(3)
    deg = rng.integers(0, 40, 200)
    deg[[5, 17]] = [0, 1000]
    ptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int32)
    unit = 7
    plan = build_plan(np, ptr, unit, np.iinfo(np.int32).max, even=False)
    want, k0, slot = [], [], 0
    for r, d in enumerate(deg):
        parts = max(-(-int(d) // unit), 1)
        first = slot if parts > 1 else -1
        for j in range(parts):
            lo = ptr[r] + j * unit
            want.append([r, lo, min(lo + unit, ptr[r + 1]), slot + j if parts > 1 else -1])
            k0.append([first, parts])
        slot += parts if parts > 1 else 0
    np.testing.assert_array_equal(plan["units"], want)
    np.testing.assert_array_equal(plan["unit_k0"], k0)
    assert plan["n_slots"] == slot


def test_work_plan_covers_every_block_once():
    """The SpMM units partition each window's blocks; split windows own consecutive slots."""
    from tcgnn_py.products._plans import UNITS_PER_WINDOW_MAX, build_plan

    win_ptr = np.array([0, 0, 3, 3, 100, 101, 101 + 40 * UNITS_PER_WINDOW_MAX], np.int32)
    plan = build_plan(np, win_ptr, 16)
    units, splits = plan["units"], plan["splits"]
    assert units.dtype == np.int32 and units.flags.c_contiguous
    for w in range(len(win_ptr) - 1):
        mine = units[units[:, 0] == w]
        assert len(mine) >= 1  # empty windows keep a unit: it writes their zero rows
        assert mine[0, 1] == win_ptr[w] and mine[-1, 2] == win_ptr[w + 1]
        np.testing.assert_array_equal(mine[1:, 1], mine[:-1, 2])
        if len(mine) > 1:
            assert np.all(mine[:, 3] == mine[0, 3] + np.arange(len(mine)))
            assert [w, mine[0, 3], len(mine), 0] in splits.tolist()
        else:
            assert mine[0, 3] == -1
    assert units[:, 0].max() == len(win_ptr) - 2
    assert len(units[units[:, 0] == 5]) == UNITS_PER_WINDOW_MAX  # hub: capped, bigger units
    assert plan["n_slots"] == int((units[:, 3] >= 0).sum())



def test_the_host_plan_is_the_device_plans():
    """build_plan and the longest-first order on the host (NumPy's own passes: repeat, int32 columns, radix-sorted
    narrow keys) give the arrays of the device path's (the same functions run through an array module that is not
    NumPy itself, as CuPy is), on histograms with empty windows, hubs and none cut, both kinds of cut."""
    import types

    from tcgnn_py.products._plans import _longest_first, build_plan

    device_like = types.SimpleNamespace(**{name: getattr(np, name) for name in dir(np) if not name.startswith("__")})
    rng = np.random.default_rng(5)
    for trial in range(300):
        nb = [rng.integers(0, 4, 50), rng.integers(0, 300, 200), (rng.pareto(1.1, 400) * 40).astype(np.int64),
              np.zeros(30, np.int64), np.zeros(0, np.int64)][trial % 5]
        win_ptr = np.concatenate(([0], np.cumsum(nb))).astype(np.int32)
        bpu, max_units, even = (int(rng.choice([1, 4, 16, 128])), int(rng.choice([1, 8, 64, 1 << 30])),
                                bool(trial % 2))
        host, device = build_plan(np, win_ptr, bpu, max_units, even), build_plan(device_like, win_ptr, bpu,
                                                                                 max_units, even)
        for key in ("units", "unit_k0", "splits"):
            assert host[key].dtype == np.int32 and host[key].flags.c_contiguous
            np.testing.assert_array_equal(host[key], device[key])
        assert (host["n_slots"], host["max_parts"]) == (device["n_slots"], device["max_parts"])
        for mine, theirs in zip(_longest_first(np, host["units"], host["unit_k0"]),
                                _longest_first(device_like, device["units"], device["unit_k0"])):
            np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("bpu", [1, 16, 64])
@pytest.mark.parametrize("hub", [True, False], ids=["hub", "short"])
def test_vec_counts_are_the_plans(bpu, hub):
    """What choosing a launch reads of a plan -- its units, slots and most parts -- counted from the histogram alone
    (empty windows, split ones and a hub capped at the most units a window takes; or, where no window is longer than
    a unit, without a pass over them), and the plan of such short windows is a unit each."""
    from tcgnn_py.products._plans import VEC_UNITS_PER_WINDOW_MAX, build_plan, vec_counts

    ends = [101 + 3 * VEC_UNITS_PER_WINDOW_MAX * 64] if hub else [101]
    win_ptr = np.array([0, 0, 3, 3, 100, 101] + ends, np.int32)
    plan = build_plan(np, win_ptr, bpu, VEC_UNITS_PER_WINDOW_MAX)
    counts = vec_counts(_Histogram(np.diff(win_ptr)), bpu)
    assert counts == {"units": plan["units"].shape[0], "n_slots": plan["n_slots"], "max_parts": plan["max_parts"]}
    if bpu == 64 and not hub:  # (windows of 0, 3, 0, 97, 1, 0 blocks: only the 97 is cut)
        assert counts == {"units": 7, "n_slots": 2, "max_parts": 2}
    short = np.array([0, 0, 3, 3, 16, 17], np.int32)
    plan = build_plan(np, short, 16, VEC_UNITS_PER_WINDOW_MAX)
    np.testing.assert_array_equal(plan["units"], [[0, 0, 0, -1], [1, 0, 3, -1], [2, 3, 3, -1], [3, 3, 16, -1],
                                                  [4, 16, 17, -1]])
    assert vec_counts(_Histogram(np.diff(short)), 16) == {"units": 5, "n_slots": 0, "max_parts": 1}
    assert vec_counts(_Histogram(np.zeros(0, np.int64)), bpu) == {"units": 0, "n_slots": 0, "max_parts": 0}


@pytest.mark.parametrize("seed", range(6))
def test_counts_from_the_lengths_table_are_the_windows(seed, monkeypatch):
    """A plan's counts and the rule's units per size, read from the table of windows longer than each length, are
    those of a pass over the windows: empty windows, none cut, hubs capped at the most units a window takes, one
    unit at most per window, and no window at all."""
    from tcgnn_py.products import _plans
    from tcgnn_py.products._plans import build_plan

    rng = np.random.default_rng(seed)
    n = [0, 1, 50, 400, 3000, 20][seed]
    nb = [np.zeros(n, np.int64), np.array([5]), rng.integers(0, 4, n), (rng.pareto(1.1, n) * 40).astype(np.int64),
          rng.integers(0, 300, n) * rng.integers(0, 2, n), np.full(n, 70000)][seed]
    got, want = {}, {}
    for table_max, out in ((_plans.LENGTH_TABLE_MAX, got), (-1, want)):
        monkeypatch.setattr(_plans, "LENGTH_TABLE_MAX", table_max)
        monkeypatch.setattr(_vec_layout, "LENGTH_TABLE_MAX", table_max)
        for bpu in (1, 3, 16, 64, 256):
            for max_units in (1, 2, 8, 1024):
                out[bpu, max_units] = _plans.plan_counts(_Histogram(nb), bpu, max_units)
        out["sizes"] = _vec_layout._size_stats(_Histogram(nb))
    assert got == want
    for bpu, max_units in [(1, 2), (16, 1024), (3, 8)]:  # (the plan itself, where it is small enough to build)
        plan = build_plan(np, np.concatenate(([0], np.cumsum(nb))).astype(np.int32), bpu, max_units)
        units, slots, parts, cut = got[bpu, max_units]
        assert (units, slots, parts, cut) == (plan["units"].shape[0], plan["n_slots"], plan["max_parts"],
                                              plan["splits"].shape[0])


class _Histogram:
    """A tiling as the unit-size rule sees it: its blocks-per-window histogram and an SM count."""

    def __init__(self, blocks_per_window, sms=132):
        self.store = {"vec_hist": np.asarray(blocks_per_window, np.int64), "sm_count": sms}
        self.n_windows, self.n_blocks = len(blocks_per_window), int(np.sum(blocks_per_window))

    def cached(self, key, build):
        if key not in self.store:
            self.store[key] = build()
        return self.store[key]

    def peek(self, key, default=None):
        return self.store.get(key, default)

    def put(self, key, value):
        self.store[key] = value
        return value

    def drop(self, key):
        self.store.pop(key, None)


@pytest.mark.parametrize("seed", range(8))
def test_the_small_grid_shortcut_is_the_rule(seed, monkeypatch):
    """Grids too small for any unit size to give the target's warps take the smallest size without a pass over
    the windows (and one warp's features where two could not fill the GPU): the full rule's answer at every
    width (hubs, empty windows, grids on either side of the bound)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 2000))
    blocks = rng.zipf(2.0, n).clip(0, 1500) * rng.integers(0, 2, n)
    real = _vec_layout._units_bound
    taken = _vec_layout._units_bound(_Histogram(blocks), 16) < 16 * 132  # (the shortcut serves D <= 32 at least)
    assert taken or seed % 2
    for sms in (8, 132):
        for D in (32, 64, 256, 1024):
            got = _vec_layout.partition(_Histogram(blocks, sms), D)
            sizes = [_vec_layout.vec_unit_size(_Histogram(blocks, sms), k) for k in (1, 2, 4, 8)]
            monkeypatch.setattr(_vec_layout, "_units_bound", lambda tiling, bpu: 10**12)  # (the full rule)
            assert got == _vec_layout.partition(_Histogram(blocks, sms), D)
            assert sizes == [_vec_layout.vec_unit_size(_Histogram(blocks, sms), k) for k in (1, 2, 4, 8)]
            monkeypatch.setattr(_vec_layout, "_units_bound", real)


@pytest.mark.parametrize("floor, want", [(None, 256), (128, 128)])
def test_unit_size_caps_long_windows_on_large_grids(floor, want):
    """Windows of 200 blocks, 114 per resident warp: one unit each (the factor's cap, 454) or two (the floor's, 128)."""

    with tg.tuning(vec_tail_floor=floor):
        assert _vec_layout.vec_unit_size(_Histogram(np.full(600, 200)), n_slices=4) == want


def test_unit_size_of_the_16bit_kernel_takes_its_own_floor():
    """The 600 windows of 200 blocks above, 114 per resident warp: the 16-bit kernel's floor (64) cuts them in 4."""

    hist = _Histogram(np.full(600, 200))
    with tg.tuning(vec_tail_floor=128, half_tail_floor=64):
        assert _vec_layout.vec_unit_size(hist, n_slices=4) == 128
        assert _vec_layout.vec_unit_size(hist, n_slices=4, half=True) == 64
        with tg.tuning(half_tail_floor=None):  # the factor's cap alone
            assert _vec_layout.vec_unit_size(hist, n_slices=4, half=True) == 256


@pytest.mark.filterwarnings("ignore::tcgnn_py.NoGPUWarning")
def test_a_grid_of_one_wave_keeps_the_plans_order():
    """The usual launch's units go longest first where the grid is more than the SMs hold at once (its tail is made
    of short ones), and in the plan's own order where it is not (no tail: the sort would cost a new matrix's first
    product for nothing)."""
    from tcgnn_py.products._plans import vec_plan

    A = tg.power_law_graph(3000, 30000, seed=2)
    T = tg.TiledMatrix(A, layout="vector", device="cpu")
    plan = vec_plan(T.tiling, 16)
    n_units = plan["units"].shape[0]
    T.tiling.put("sm_count", 1)  # many waves
    _, units, unit_k0, _ = _vec_layout.partition_units(T.tiling, 16, 1)
    length = units[:, 2] - units[:, 1]
    assert (np.diff(length) <= 0).all() and sorted(map(tuple, units)) == sorted(map(tuple, plan["units"]))
    T.tiling.put("sm_count", -(-n_units // 32))  # 32 warps per SM: more than the least residency, so sorted
    _, units, _, _ = _vec_layout.partition_units(T.tiling, 16, 1)
    assert (np.diff(units[:, 2] - units[:, 1]) <= 0).all()
    T.tiling.put("sm_count", -(-n_units // _vec_layout.VEC_ONE_WAVE_WARPS))  # every unit resident at once
    _, units, unit_k0, _ = _vec_layout.partition_units(T.tiling, 16, 1)
    np.testing.assert_array_equal(units, plan["units"])
    np.testing.assert_array_equal(unit_k0, plan["unit_k0"])
    _, units, _, _ = _vec_layout.partition_units(T.tiling, 16, 2)  # (two slices a unit: two waves, sorted)
    assert (np.diff(units[:, 2] - units[:, 1]) <= 0).all()


@pytest.mark.filterwarnings("ignore::tcgnn_py.NoGPUWarning")
def test_a_plan_that_cuts_no_window_is_not_built():
    """Where no window is cut and the grid keeps the plan's order, the kernels read each unit (a window, whole) from
    the window pointers: no plan is built; a cut window, or a grid of several waves (sorted), takes the plan."""
    from tcgnn_py.products._plans import vec_plan

    rng = np.random.default_rng(0)
    A = sp.random_array((2000, 700), density=4 / 700, rng=rng, format="csr")  # 8-row windows of at most 8 blocks
    T = tg.TiledMatrix(A, layout="vector", device="cpu")
    T.tiling.put("sm_count", 132)  # (an H100's; no device here)
    assert _vec_layout.vec_longest(T.tiling) <= 16
    plan, units, unit_k0, _ = _vec_layout.partition_units(T.tiling, 16, 1)
    assert (plan, units, unit_k0) == (_vec_layout.NO_PLAN, None, None)
    assert not T.tiling.cached_items("plan")
    # the plan the kernels stand in for: a unit per window, whole, in window order, no slot
    full = vec_plan(T.tiling, 16)["units"]
    np.testing.assert_array_equal(full, np.stack([np.arange(T.tiling.n_windows), T.tiling.win_ptr[:-1],
                                                  T.tiling.win_ptr[1:], np.full(T.tiling.n_windows, -1)], axis=1))
    T.tiling.put("sm_count", 1)  # many waves, sorted longest first
    assert _vec_layout.partition_units(T.tiling, 16, 1)[1] is not None
    assert _vec_layout.partition_units(T.tiling, 4, 1)[1] is not None  # (windows cut in units of 4 blocks)


@pytest.mark.parametrize("blocks, bpu, want", [
    ([12] * 3000, 16, 2),  # short windows, one unit each: 12 blocks a unit
    ([16] * 3000, 16, 2),  # 16 blocks a unit: still short
    ([17] * 3000, 256, 4),  # 17 a unit
    ([200] * 600, 64, 4),  # long windows cut in 4 parts of 50
    ([200] * 600, 16, 2),  # ... or in 13 of at most 16
])
def test_cp_async_steps_of_2_blocks_where_units_are_short(blocks, bpu, want):
    """2 blocks a cp.async step where units average 16 blocks or fewer (4-block steps would leave a unit too few of
    them), 4 otherwise; a one-CTA-per-window launch takes 2 whatever its windows."""
    hist = _Histogram(blocks)
    assert _vec_layout.async_unroll(hist, bpu, coop=False) == want
    assert _vec_layout.async_unroll(hist, bpu, coop=True) == 2


@pytest.mark.parametrize("blocks, want", [([10] * 3000, False), ([10] * 3000 + [40], True)])
def test_sums_in_the_launch_only_where_a_window_is_split(blocks, want):
    """16 blocks a unit: no window cut means no sums to make, and the kernel is the one without them; one window of
    40 blocks cut in 3 parts: its parts are summed in the launch."""
    with tg.tuning(vec_blocks_per_unit=16):
        assert _vec_layout.partition(_Histogram(blocks), 64) == (1, 16, want)


@pytest.mark.filterwarnings("ignore::tcgnn_py.NoGPUWarning")
def test_the_one_cta_per_window_launch_takes_64_features_and_2_block_steps():
    """On a grid small enough for one CTA per window, the statistics' float32 launch takes 2 blocks a step, and 64
    features per warp where D is wider than 32 (a compiled config: the timed choice's first candidate)."""
    from tcgnn_py.kernels import products as kp

    T = tg.TiledMatrix(sp.random(300, 300, density=0.05, format="csr", random_state=0), layout="vector")
    T.tiling.put("sm_count", 132)
    with tg.tuning(vec_coop=True):
        for D, fs in ((32, 1), (64, 2), (256, 2)):
            k = vec_family.default(T.tiling, D, True).kernel
            assert (k.COOP, k.FS, k.U) == (True, fs, 2) and k in kp.VEC_SPMM_CONFIGS
            assert vec_family.candidates(T.tiling, D, True)[0].kernel == k
        with tg.tuning(vec_max_slices=1):  # (the cap on features per warp holds here too)
            assert vec_family.default(T.tiling, 64, True).kernel.FS == 1


@pytest.mark.parametrize("blocks, D, want", [
    ([10] * 99 + [90], 64, True),  # a hub window of 8.3 times the mean (10.8 blocks): through L1
    ([10] * 99 + [90], 32, True),
    ([10] * 99 + [90], 128, False),  # wider rows: through L2 whatever the skew
    ([10] * 99 + [80], 64, False),  # 80 < 8 x 10.7
    ([10] * 100, 64, False),  # an even tiling
    ([0] * 4, 64, False),  # no block at all
])
def test_l1_gathers_on_skewed_tilings_of_narrow_rows(blocks, D, want):
    """The statistics' L1 choice: at most 64 features, and a longest window of at least 8 times the mean."""
    assert _vec_layout.async_l1(_Histogram(blocks), D) is want


@pytest.mark.filterwarnings("ignore::tcgnn_py.NoGPUWarning")
def test_the_statistics_launch_takes_l1_gathers_by_the_rule():
    """A hub-heavy tiling's float32 launch at 64 features copies X's rows through L1 (a compiled config, the timed
    choice's first candidate, its L2 twin among the others); at 128 features it does not."""
    from tcgnn_py.kernels import products as kp

    rows = np.r_[np.zeros(900, np.int64), np.arange(300) % 8]
    cols = np.r_[np.arange(900), (np.arange(300) * 7) % 1000]
    A = sp.csr_array((np.ones(1200, np.float32), (rows, cols)), shape=(1000, 1000))
    T = tg.TiledMatrix(A, layout="vector")
    T.tiling.put("sm_count", 132)
    with tg.tuning(vec_coop=False):
        first = vec_family.default(T.tiling, 64, True)
        assert first.kernel.L1 and first.kernel in kp.VEC_SPMM_CONFIGS
        cands = vec_family.candidates(T.tiling, 64, True)
        assert cands[0] == first and dataclasses.replace(first.kernel, L1=False) in {c.kernel for c in cands}
        assert not vec_family.default(T.tiling, 128, True).kernel.L1


@pytest.mark.parametrize("floor", [None, 128])
def test_unit_size_floor_leaves_small_grids_to_the_factor(floor):
    """5 blocks per resident warp: the tail factor (4x) caps units at 16 blocks whatever the floor."""

    with tg.tuning(vec_tail_floor=floor):
        assert _vec_layout.vec_unit_size(_Histogram(np.full(100, 200)), n_slices=1) == 16
        # One hub window among short ones: its units stay within 4x the 10 blocks of a resident warp.
        assert _vec_layout.vec_unit_size(_Histogram([20000] + [10] * 2000), n_slices=1) == 32


class _Windows(_Histogram):
    """A host tiling as the one-CTA-per-window rule and plan see it."""

    xp = np

    def __init__(self, win_ptr, sms=132):
        self.win_ptr = np.asarray(win_ptr, np.int32)
        super().__init__(np.diff(self.win_ptr), sms)

    def cached(self, key, build):
        if key not in self.store:
            self.store[key] = build()
        return self.store[key]

    def bound(self):
        from tcgnn_py._cache import Store

        return self.cached("bound", lambda: Store(4))


def test_coop_units_split_each_window_in_four_balanced_parts():
    from _zoo import coop_units

    units = coop_units([0, 0, 3, 10])
    assert units.dtype == np.int32 and units.shape == (12, 4)
    np.testing.assert_array_equal(units[:, 0], np.repeat([0, 1, 2], 4))
    np.testing.assert_array_equal(units[:, 1:3], [[0, 0]] * 4 + [[0, 0], [0, 1], [1, 2], [2, 3]]
                                  + [[3, 4], [4, 6], [6, 8], [8, 10]])
    assert np.all(units[:, 3] == -1)


@pytest.mark.parametrize("blocks, D, want", [
    ([25] * 200 + [51] * 51, 32, True),  # a small grid whose usual units (16 blocks) split windows: ss_bcsstk13-like
    ([25] * 200 + [51] * 51, 256, True),  # 251 x 8 CTAs of a window x 32 features: still <= 16 per SM
    ([8] * 1393, 32, False),  # no window split by the usual units (fe_4elt2-like)
    ([8] * 250 + [1145], 32, False),  # a hub window: a quarter of it is far more than 1 usual unit
    ([25] * 200 + [100], 32, False),  # a quarter of the longest window (25 blocks) exceeds 1 unit (16)
    ([25] * 3000 + [51], 32, False),  # a larger grid: 3001 CTAs > 16 per SM
])
def test_coop_rule(blocks, D, want):

    with tg.tuning(vec_coop=None):
        assert _vec_layout.vec_coop(_Windows(np.concatenate([[0], np.cumsum(blocks)])), D) is want


@pytest.mark.filterwarnings("ignore::tcgnn_py.NoGPUWarning")
def test_coop_choice_of_the_16bit_kernel():
    """The 16-bit kernel takes the one-CTA launch by the same rule, on aligned rows only, and its timed
    choice compares the compiled COOP shapes (4 parts a window whatever the shape: the same sums)."""
    from tcgnn_py.kernels import products as kp

    T = tg.TiledMatrix(sp.random(300, 300, density=0.05, format="csr", random_state=0), layout="vector")
    T.tiling.put("sm_count", 132)
    half = ("float16", True, "float32")
    with tg.tuning(vec_coop=True):
        default = half_family.default(T.tiling, 64, True, half).kernel
        assert default.COOP and (default.FS, default.KS, default.NS) == kp.VEC_HALF_COOP[0]
        assert not half_family.default(T.tiling, 64, False, half).kernel.COOP  # unaligned rows: the usual launch
        wide = [c.kernel for c in half_family.candidates(T.tiling, 64, True, half)]
        assert wide[0] == default and {(k.FS, k.KS, k.NS) for k in wide} == set(kp.VEC_HALF_COOP)
        assert all(k.COOP and not k.COMBINE for k in wide)
        assert half_family.candidates(T.tiling, 17, True, half) == [half_family.default(T.tiling, 17, True, half)]
    with tg.tuning(vec_coop=False):
        assert not any(c.kernel.COOP for c in half_family.candidates(T.tiling, 64, True, half))


@pytest.mark.filterwarnings("ignore::tcgnn_py.NoGPUWarning")
def test_the_timed_candidates_are_the_compiled_configs():
    """On aligned rows the TF32 candidates are cp.async configs (through L2 and, beside each, through L1; dense
    values), all with the default's partition; each maps to a compiled config, and together with the register
    kernel of unaligned rows and the coop shapes they are every compiled SpMM config (compiled means supported)."""
    from tcgnn_py.kernels import products as kp

    T = tg.TiledMatrix(sp.random(300, 300, density=0.05, format="csr", random_state=0), layout="vector")
    T.tiling.put("sm_count", 132)
    with tg.tuning(vec_coop=False, vec_blocks_per_unit=2):
        cands = vec_family.candidates(T.tiling, 64, True)
        assert all(isinstance(c.kernel, kp.SpmmVecAsync) and c.bpu == cands[0].bpu for c in cands)
        l1 = [c for c in cands if c.kernel.L1]
        assert l1 and {dataclasses.replace(c.kernel, L1=False) for c in l1} <= {c.kernel for c in cands}  # L2 twins
        assert vec_family.candidates(T.tiling, 64, False) == [vec_family.default(T.tiling, 64, False)]
        assert isinstance(vec_family.default(T.tiling, 64, False).kernel, kp.SpmmVec)  # unaligned: register gathers
        reached = {c.kernel for c in cands}
        reached |= {kp.SpmmVec(FS=f, U=4, VEC=False, COMBINE=c) for f in (1, 2) for c in (True, False)}
    with tg.tuning(vec_coop=True):
        reached |= {c.kernel for c in vec_family.candidates(T.tiling, 64, True)}
    assert reached == set(kp.VEC_SPMM_CONFIGS)
    with pytest.raises(ValueError, match="tuning option vec_kernel takes None or a config of "
                                         "kernels.products.VEC_SPMM_CONFIGS, got SpmmVec"):
        with tg.tuning(vec_kernel=kp.SpmmVec(1, 8, True, True)):  # refused where the block is entered
            vec_family.default(T.tiling, 64, True)
    with tg.tuning(vec_kernel=kp.VEC_SPMM_CONFIGS[-1]):  # a coop config: that launch, and no other candidate
        (only,) = vec_family.candidates(T.tiling, 64, True)
        assert only.kernel == kp.VEC_SPMM_CONFIGS[-1] and only.kernel.COOP


@pytest.mark.filterwarnings("ignore::tcgnn_py.NoGPUWarning")
@pytest.mark.parametrize("coop", [False, True])
def test_the_timed_choice_names_the_kernels_each_candidate_launches(coop, monkeypatch):
    """What the timed choice compiles for a candidate (kernels(config), no launch built) is what its launch
    compiles and runs: its kernel and its fixup's (launches built on the host, the arrays' addresses left out)."""
    from tcgnn_py.kernels import launches as kl
    from tcgnn_py.products import _launch

    hub = sp.csr_array(sp.random(400, 400, density=0.02, format="csr", random_state=1) + star(399))  # split windows
    T = tg.TiledMatrix(hub, layout="vector")
    T.tiling.put("sm_count", 132)
    half = ("float16", True, "float32")
    names = []
    monkeypatch.setattr(_launch, "get_kernel", lambda family, name: names.append((family, name)))
    monkeypatch.setattr(kl, "encode", lambda value, kind: 0)  # host arrays: no device address to write
    with tg.tuning(vec_coop=coop, vec_blocks_per_unit=2):
        for family, args in ((vec_family, ()), (half_family, (half,))):
            for c in family.candidates(T.tiling, 64, True, *args):
                names.clear()
                launch = family.launch(T.tiling, np.dtype(np.float32), 64, True, *args, c)
                want = family.kernels(T.tiling, np.dtype(np.float32), c)
                assert sorted(set(names)) == sorted(want), c
                runs = ((launch.family, launch.name),) + (() if launch.then is None else
                                                          ((launch.then[0].family, launch.then[0].name),))
                assert runs == want, c


def test_pick_fastest_keeps_the_default_within_the_margin():
    from tcgnn_py.products._autotune import TIMED_MARGIN, pick_fastest

    assert pick_fastest([5.0]) == 0
    assert pick_fastest([10.0, 10.0 * (1 - TIMED_MARGIN / 2), 11.0]) == 0  # within noise: the default
    assert pick_fastest([10.0, 9.0, 8.0, 8.5]) == 2
    assert pick_fastest([10.0, 8.0, 8.0]) == 1  # ties: the first listed
    assert pick_fastest([10.0, 12.0, 11.0]) == 0


class _Done:
    """A finished (or unfinished) background compile, as :func:`tcgnn_py.products._launch.planned` sees one."""

    def __init__(self, done):
        self._done = done

    def done(self):
        return self._done


def test_provisional_launch_is_replanned_once_its_compiles_finish():
    from tcgnn_py.products import _launch as _launches

    t = _Windows([0, 4])
    pending = _Done(False)
    plans = iter([_launches.Provisional("first", [pending]), "final", "never"])
    plan = lambda: next(plans)  # noqa: E731
    key = _launches.launch_key("tf32", np.float32, 64, True)
    assert _launches.planned(t, key, plan) == "first" and key not in t.bound()  # not kept: no plan binds it
    assert _launches.planned(t, key, plan) == "first"  # still compiling: the same launch, no new plan
    pending._done = True
    assert _launches.planned(t, key, plan) == "final" and t.bound()[key] == "final"
    assert ("provisional", key) not in t.store
    assert _launches.planned(t, key, plan) == "final"  # cached from now on


def test_recycled_results_come_back_only_when_nothing_holds_them():
    """A bound call's result maker hands back an array it made before once nothing else holds it (nor a view of
    it), keeps at most RECYCLE_RING per result, and leaves results above RECYCLE_BYTES to the maker itself."""
    from tcgnn_py.products._launch import RECYCLE_BYTES, RECYCLE_RING, recycled

    made = []

    def new(shape, dtype):
        made.append(np.ndarray(shape, dtype))
        return made[-1]

    f = recycled((3, 4), np.float32, new)
    a = f(None, None)
    b = f(None, None)  # a held: a second array
    assert a is not b and len(made) == 2 and a.shape == (3, 4) and a.dtype == np.float32
    made.clear()
    del a
    c = f(None, None)  # a's array, free again
    assert not made
    view = c[1:]
    del c
    d = f(None, None)  # c held through a view, b held: a new one, which takes the oldest's place in the ring
    assert len(made) == 1 and d is made[0] and view.base is not d and RECYCLE_RING == 2
    del view, d, b
    assert f(None, None) is not f(None, None)  # (the first held while the second is made)
    assert recycled((RECYCLE_BYTES // 4 + 1,), np.float32, new) is new


def _host_stand_ins(monkeypatch, _autotune):
    """The GPU pieces the timed choice asks for, on the host: a stream that is not capturing, and the launch type
    a stand-in family builds (it runs nothing)."""
    import types

    stream = types.SimpleNamespace(is_capturing=lambda: False)
    monkeypatch.setattr(_autotune, "get_cupy", lambda: types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_current_stream=lambda: stream)))

    class Launch(types.SimpleNamespace):
        dense = False

        def run(self, *operands):
            pass

    return Launch


def test_the_timed_choice_takes_a_family_compiles_what_is_missing_and_keeps_the_fastest(monkeypatch):
    """choose() asks the family for each candidate's kernels and launches: candidates whose kernels are missing
    compile in the background and are left out (the launch stays provisional), the others are timed and the
    fastest kept beyond the margin.  On the host, with the GPU's pieces standing in."""
    import types

    from tcgnn_py.kernels import registry, timing
    from tcgnn_py.products import _autotune

    compiled = {("fam", "a"), ("fam", "b")}
    started = []
    monkeypatch.setattr(registry, "is_compiled", lambda family, name: (family, name) in compiled)
    monkeypatch.setattr(registry, "background_compiles", lambda: True)
    monkeypatch.setattr(registry, "compile_in_background", lambda family, names: started.append((family, names))
                        or ["future"])
    monkeypatch.setattr(timing, "time_round_robin", lambda calls, rounds: [1.0, 0.5][:len(calls)])
    Launch = _host_stand_ins(monkeypatch, _autotune)

    family = types.SimpleNamespace(
        kernels=lambda tiling, dtype, config: (("fam", config),),
        launches=lambda tiling, dtype, D, vec, configs: [Launch(config=c) for c in configs])
    kept = {}
    tiling = types.SimpleNamespace(n_blocks=10, put=lambda key, value: kept.setdefault(key, value), peek=kept.get)
    with tg.tuning(timed_after=0):  # (timed on the first call)
        got = _autotune.choose(family, tiling, np.float32, 64, True, ("timed", "float32", 64, True), ["a", "b", "c"],
                               ("values", "X", "Y"))
    assert isinstance(got, _autotune.Provisional) and got.futures == ["future"]
    assert started == [("fam", ["c"])]  # the missing kernel, in the background; c left out of the timing
    assert got.launch.config == "b"  # 0.5 ms against the default's 1.0
    assert [c for c, _ in next(iter(kept.values()))] == ["a", "b"]


def test_timed_after_keeps_the_default_untimed_for_that_many_calls(monkeypatch):
    """tuning(timed_after=N): a signature's first planning times nothing -- the default launch, provisional, for
    N more calls (planned() asks whether it is done once a call) -- and the planning after them times."""
    import types

    from tcgnn_py.kernels import registry, timing
    from tcgnn_py.products import _autotune

    timed = []
    monkeypatch.setattr(registry, "is_compiled", lambda family, name: True)
    monkeypatch.setattr(timing, "time_round_robin", lambda calls, rounds: timed.append(len(calls)) or [1.0, 0.5])
    Launch = _host_stand_ins(monkeypatch, _autotune)

    family = types.SimpleNamespace(kernels=lambda tiling, dtype, config: (("fam", config),),
                                   launches=lambda tiling, dtype, D, vec, configs: [Launch(config=c) for c in configs])
    kept = {}
    tiling = types.SimpleNamespace(n_blocks=10, put=kept.__setitem__, peek=kept.get)
    args = (family, tiling, np.float32, 64, True, ("timed", "float32", 64, True), ["a", "b"], ("values", "X", "Y"))
    with tg.tuning(timed_after=2):
        first = _autotune.choose(*args)
        assert isinstance(first, _autotune.Provisional) and first.launch.config == "a" and timed == []
        assert [f.done() for f in first.futures for _ in range(3)] == [False, False, True]
        again = _autotune.choose(*args)
    assert again.config == "b" and timed == [2]  # the planning after them timed both
    with tg.tuning(timed_after=0):
        assert _autotune.choose(*args).config == "b" and timed == [2, 2]  # (every planning times)
    kept.clear()  # a new tiling, under the defaults: TIMED_AFTER calls untimed
    default = _autotune.choose(*args)
    assert isinstance(default, _autotune.Provisional) and timed == [2, 2] and _autotune.TIMED_AFTER > 8
    assert default.futures[0].left == _autotune.TIMED_AFTER == tg.tuning_options()["timed_after"]
    with pytest.raises(ValueError, match="tuning option timed_after takes an int >= 0"):
        with tg.tuning(timed_after=-1):
            pass


def test_an_untimed_call_works_out_the_default_alone(monkeypatch):
    """A family's candidates given as a callable: a call that times nothing (the first, under timed_after) asks
    for the default alone, and the planning that times asks for them all; a default that is the only candidate
    is final at once (no count to run down)."""
    import types

    from tcgnn_py.kernels import registry, timing
    from tcgnn_py.products import _autotune

    monkeypatch.setattr(registry, "is_compiled", lambda family, name: True)
    monkeypatch.setattr(timing, "time_round_robin", lambda calls, rounds: [1.0, 0.5])
    Launch = _host_stand_ins(monkeypatch, _autotune)
    family = types.SimpleNamespace(kernels=lambda tiling, dtype, config: (("fam", config),),
                                   launches=lambda tiling, dtype, D, vec, configs: [Launch(config=c) for c in configs])
    asked = []

    def candidates(first_only=False, configs=("a", "b")):
        asked.append(first_only)
        return (configs[0], len(configs) == 1) if first_only else list(configs)

    kept = {}
    tiling = types.SimpleNamespace(n_blocks=10, put=kept.__setitem__, peek=kept.get)
    args = (family, tiling, np.float32, 64, True, ("timed", "float32", 64, True))
    with tg.tuning(timed_after=2):
        first = _autotune.choose(*args, candidates, ("values", "X", "Y"))
        assert isinstance(first, _autotune.Provisional) and first.launch.config == "a" and asked == [True]
        assert _autotune.choose(*args, candidates, ("values", "X", "Y")).config == "b" and asked == [True, True, False]
        kept.clear()
        alone = _autotune.choose(*args, lambda first_only=False: candidates(first_only, ("a",)), ("values", "X", "Y"))
        assert alone.config == "a" and not isinstance(alone, _autotune.Provisional) and asked[-1] is True


def test_a_binder_binds_the_final_launch_or_a_counting_one_and_nothing_else():
    """bindable(): the final launch kept under the key; else the launch a Countdown keeps in use, with it, while
    the count runs; nothing for a launch waiting for compiles, or once the count has ended (the next planning
    takes it up)."""
    import types

    from tcgnn_py.products import _launch

    cache, store = {}, {}
    tiling = types.SimpleNamespace(peek=cache.get, bound=lambda: store)
    assert _launch.bindable(tiling, "k") == (None, None)
    countdown = _launch.Countdown(1)
    cache[("provisional", "k")] = _launch.Provisional("default", [countdown])
    assert _launch.bindable(tiling, "k") == ("default", countdown)
    cache[("provisional", "k")] = _launch.Provisional("default", ["a compile"])
    assert _launch.bindable(tiling, "k") == (None, None)
    cache[("provisional", "k")] = _launch.Provisional("default", [countdown])
    assert not countdown.done() and countdown.done()  # (asked n + 1 times: done)
    assert _launch.bindable(tiling, "k") == (None, None)
    store["k"] = "chosen"
    assert _launch.bindable(tiling, "k") == ("chosen", None)


def test_a_bound_call_counts_toward_the_timed_choice():
    """A launch bound while its Countdown runs (the statistics' launch, before the timed choice): each bound call
    counts; the call that ends the count goes the general way (where the choice is made), and the call after it
    binds the launch chosen, which counts nothing."""
    from tcgnn_py.products import _launch, _problem

    log, chosen, countdown = [], [], _launch.Countdown(2)

    def general(values, casts, X):
        log.append("general")
        return "general"

    def binder(values, casts, X, general):
        name = "chosen" if chosen else "default"

        def f(values, casts, X):
            log.append(name)
            return name

        f.countdown, f.fixed = (None if chosen else countdown), (lambda values, casts, X: name)
        return f

    plan = _problem.Plan(general, binder)
    for _ in range(3):
        plan(None, None, "X")
    held = plan.bound  # (what bound_spmm keeps)
    assert held.fixed(None, None, "X") == "default" and held.countdown is countdown  # (a replay keeps its launch)

    def chooses(values, casts, X):  # the call that ends the count: the general way, where the choice is made
        chosen.append(True)
        return general(values, casts, X)

    plan.general = chooses
    plan(None, None, "X")
    assert log == ["general", "default", "default", "general"]
    assert plan.bound is not None and getattr(plan.bound, "countdown", None) is None  # the launch chosen, bound
    for call in (plan, held, plan):
        call(None, None, "X")
    assert log[4:] == ["chosen"] * 3 and countdown.left < 0  # (the kept one reaches it through the plan)


def test_made_results_come_new_kept_or_recycled_in_one_call():
    """A bound form's several results in one call: "new" makes them anew, "keep" hands back the arrays made at
    binding, "recycle" each as ``recycled`` (an array back once nothing holds it); a large one is always new."""
    from tcgnn_py.products._launch import RECYCLE_BYTES, made

    count = []

    def new(shape, dtype):
        count.append(shape)
        return np.ndarray(shape, dtype)

    specs = (((2, 3), np.float32), ((4,), np.uint32))
    a, b = made(specs, "new", new)()
    c, d = made(specs, "new", new)()
    assert a.shape == (2, 3) and b.dtype == np.uint32 and a is not c and len(count) == 4
    keep = made(specs, "keep", new)
    (a, b), (c, d) = keep(), keep()
    assert a is c and b is d and a.shape == (2, 3) and b.shape == (4,)
    recycle = made(specs + (((RECYCLE_BYTES // 4 + 1,), np.float32),), "recycle", new)
    count.clear()
    a, b, big = recycle()
    a2, b2, big2 = recycle()  # all held: new ones
    assert a2 is not a and len(count) == 6
    del a, b
    a3, b3, big3 = recycle()  # the first two free again; the large one is never kept
    assert len(count) == 7 and a3.shape == (2, 3) and big3 is not big and big3 is not big2
    with pytest.raises(ValueError, match="how must be"):
        made(specs, "reuse", new)
