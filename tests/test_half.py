"""float16 / bfloat16 operands: dtype rules, errors, and exactness on every path.

The module-level tests run wherever the suite runs (the NumPy reference on a
machine without a GPU, the 16-bit tensor-core kernels on one); the ``gpu`` tests
sweep the kernels' shapes against the float64 SciPy reference, through
NaN-poisoned outputs.
"""

import os
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from _env import (TOL, check_cached_launch, count_timing, cupy_fixture, exact_product, host, int_graph, ints, poisoned,
                  tuning_fixture)
from _zoo import star, zoo

import tcgnn_py as tg
from tcgnn_py.products import _modes, _values
from tcgnn_py.products.families import half as half_family
from tcgnn_py.kernels import products as kp
from tcgnn_py._validation import as_dtype, promote

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 tests need ml_dtypes (the [bf16] extra)")
F16, BF16, F32, F64 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.float64)
HALVES = [F16, BF16]
ZOO = zoo("full")

#: Relative Frobenius error of a 16-bit product against the float64 product of the same
#: ... and of a matrix stored in 16 bits against its float32 values (one rounding of each value).
TOL_VALUES = {F16: 1e-3, BF16: 8e-3}


@pytest.mark.parametrize(("m", "x", "want"), [
    (F32, F16, F32), (F16, F16, F16), (BF16, BF16, BF16), (F32, BF16, F32), (BF16, F16, F32), (F16, BF16, F32),
    (F64, F16, F64), (F16, np.int8, F32), (BF16, F64, F64),
])
def test_result_dtype_promotion(m, x, want):
    assert _modes.result_dtype(np.dtype(m), np.dtype(x)) == want
    T = tg.TiledMatrix(ZOO["n17"], dtype=m)
    assert T.dtype == m
    assert (T @ np.ones((17, 3), x)).dtype == want


def test_promote_is_symmetric():
    for a in (F16, BF16, F32, F64):
        for b in (F16, BF16, F32, F64):
            assert promote(a, b) == promote(b, a)


@pytest.mark.parametrize("xt", HALVES)
@pytest.mark.parametrize("layout", ["tcgnn", "vector"])
@pytest.mark.parametrize("mt", ["float32", "same"])
def test_spmm_half_exact_on_every_path(xt, layout, mt):
    rng = np.random.default_rng(0)
    A = ZOO["n17"] if layout == "tcgnn" else int_graph(rng, 300, 300)
    mdt = F32 if mt == "float32" else xt
    T = tg.TiledMatrix(A, dtype=mdt, layout=layout)
    X = ints(rng, A.shape[1], 19, dtype=xt)
    Y = T @ X
    assert isinstance(Y, np.ndarray) and Y.dtype == _modes.result_dtype(mdt, xt)
    np.testing.assert_array_equal(Y, exact_product(A, X, Y.dtype))


@pytest.mark.parametrize("xt", HALVES)
def test_spmm_half_out_rounds_once(xt):
    rng = np.random.default_rng(0)
    A = int_graph(rng, 200, 200)
    T = tg.TiledMatrix(A, dtype=np.float32, layout="vector")
    X = ints(rng, 200, 24, dtype=xt)
    out = np.full((200, 24), np.nan, dtype=xt)
    assert tg.spmm(T, X, out=out) is out
    np.testing.assert_array_equal(out, exact_product(A, X, xt))
    out32 = np.empty((200, 24), np.float32)
    np.testing.assert_array_equal(tg.spmm(T, X, out=out32), exact_product(A, X, F32))
    # Products computed in float32 go to any of float32 / float16 / bfloat16; float64 ones only to float64.
    Th = T.astype(xt)
    out32 = np.empty((200, 24), np.float32)
    np.testing.assert_array_equal(tg.spmm(Th, X, out=out32), exact_product(A, X, F32))
    with pytest.raises(ValueError, match="expected float64"):
        tg.spmm(T.astype(np.float64), X, out=np.empty((200, 24), xt))
    with pytest.raises(ValueError, match="expected float16"):
        tg.spmm(T.astype(np.float16), X.astype(np.float16), out=np.empty((200, 24), np.float64))


def test_precision_errors():
    T = tg.TiledMatrix(ZOO["n17"], dtype=np.float32, layout="vector")
    X = np.ones((17, 4), np.float32)
    with pytest.raises(TypeError, match="precision='fp16' needs float16 operands, got float32"):
        tg.spmm(T, X, precision="fp16")
    with pytest.raises(TypeError, match="needs bfloat16 operands, got float16"):
        tg.spmm(T, X.astype(np.float16), precision="bf16")
    with pytest.raises(ValueError, match="needs layout='vector' or '2:4'"):
        tg.spmm(tg.TiledMatrix(ZOO["n17"], dtype=np.float32, layout="tcgnn"), X.astype(np.float16), precision="fp16")
    with pytest.raises(TypeError, match="needs a float32 or 16-bit product, this one is float64"):
        tg.spmm(T.astype(np.float64), X.astype(np.float16), precision="fp16")
    with pytest.raises(ValueError, match="precision must be one of"):
        tg.spmm(T, X, precision="half")
    # tf32 / fp32 with 16-bit operands widen them (exactly).
    Xh = X.astype(np.float16)
    for p in ("tf32", "fp32", "fp16", None):
        np.testing.assert_array_equal(host(tg.spmm(T, Xh, precision=p)), ZOO["n17"] @ X)


def test_bfloat16_without_ml_dtypes_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"tcgnn_py\[bf16\]"):
        as_dtype("bfloat16")
    with pytest.raises(ImportError, match=r"tcgnn_py\[bf16\]"):
        tg.TiledMatrix(ZOO["n17"], dtype="bfloat16")


@pytest.mark.parametrize("dt", HALVES)
def test_half_matrix_storage(dt):
    # Duplicates are summed in float32 and rounded once: 2049 + 1 + ... is not float16's 2048.
    rows, cols = np.array([0, 0, 0, 1]), np.array([1, 1, 1, 0])
    vals = np.array([1024.0, 1.0, 0.5, 3.0])
    A = sp.coo_array((vals, (rows, cols)), shape=(2, 2))
    T = tg.TiledMatrix(A, dtype=dt)
    assert T.dtype == dt and T.values.dtype == dt
    want = np.array([[0, 1025.5], [3, 0]], np.float32).astype(dt)
    np.testing.assert_array_equal(T.toarray(), want)
    assert T.toarray().dtype == dt
    C = T.tocsr()  # scipy has no 16-bit floats: float32, exact
    assert C.dtype == np.float32
    np.testing.assert_array_equal(C.toarray(), want.astype(np.float32))
    assert T.astype(np.float32).dtype == F32 and T.T.dtype == dt


@pytest.mark.parametrize("xt", HALVES)
@pytest.mark.parametrize("layout", ["tcgnn", "vector"])
def test_sddmm_half(xt, layout):
    rng = np.random.default_rng(0)
    A = int_graph(rng, 120, 120)
    T = tg.TiledMatrix(A, dtype=np.float32, layout=layout)
    X = ints(rng, 120, 20, dtype=xt)
    S = tg.sddmm(T, X)
    assert S.dtype == xt
    C = A.tocoo()
    want = (np.asarray(X, np.float64)[C.row] * np.asarray(X, np.float64)[C.col]).sum(axis=1)
    got = S.toarray()[C.row, C.col]
    np.testing.assert_array_equal(np.asarray(got, np.float64), want.astype(np.float32).astype(xt).astype(np.float64))
    Sm = tg.sddmm(T, X, multiply_values=True)
    assert Sm.dtype == F32


@pytest.mark.parametrize("xt", HALVES)
@pytest.mark.parametrize("mt", ["float32", "same"])
def test_spmm_half_random_error(xt, mt):
    rng = np.random.default_rng(0)
    A = int_graph(rng, 2000, 2000, degree=20)
    A.data[:] = rng.standard_normal(A.nnz)
    mdt = F32 if mt == "float32" else xt
    T = tg.TiledMatrix(A, dtype=mdt, layout="vector")
    X = rng.standard_normal((2000, 64)).astype(np.float32).astype(xt)
    Y = T @ X
    stored = T.tocsr().astype(np.float64)  # the values as the matrix holds them
    want = stored @ np.asarray(X, np.float64)
    err = np.linalg.norm(np.asarray(Y, np.float64) - want) / np.linalg.norm(want)
    assert err <= TOL[Y.dtype.name], err
    if mt == "same":  # one rounding of each value, against the float32 matrix
        v = np.linalg.norm(stored.toarray() - A.toarray()) / np.linalg.norm(A.toarray())
        assert 0 < v <= TOL_VALUES[xt]


# --- the kernels (GPU) ------------------------------------------------------------

DS = [1, 3, 8, 16, 17, 64, 130, 256]
NS = [1, 15, 17, 1000, 16005]
#: 16-bit SpMM variants, selected by the kernel's shape (kernels.products.SpmmVech: FS, KS, NS, COMBINE, COOP;
#: the types come from the operands) and units of 2 blocks (every window split); "default" is the launch the
#: timed choice keeps, "pairs" a float32 matrix of small integers as (hi, lo) pairs (two MMAs), not as the 16-bit
#: values it holds exactly.  Unaligned rows have one shape: those cases run it whatever the variant.
PIN = dict(vec_timed_choice=False, vec_coop=False)


def _shape(fs, ks, ns, combine=True, coop=False):
    return kp.SpmmVech("tc_f16", False, "float", fs, ks, ns, combine, True, True, coop)


HALF_VARIANTS = {
    "default": {},
    **{"fs{}-ks{}-ns{}-{}".format(*s, "combine" if c else "fixup"): dict(half_kernel=_shape(*s, c),
                                                                       vec_blocks_per_unit=2)
       for s in kp.VEC_HALF for c in (True, False)},
    **{"coop-fs{}-ks{}-ns{}".format(*s): dict(half_kernel=_shape(*s, False, True)) for s in kp.VEC_HALF_COOP},
    "coop-timed": dict(vec_coop=True),
    "pairs": dict(half_exact_values=False),
    "pairs-split": dict(PIN, vec_blocks_per_unit=2, half_exact_values=False),
    "pairs-coop": dict(half_kernel=_shape(1, 1, 2, False, True), half_exact_values=False),
}


half_kernel = tuning_fixture(HALF_VARIANTS)


def _planned(T, kind):
    """Whether a launch of ``kind`` was planned on T's tiling (final, or provisional while candidates compile)."""
    return bool(T.tiling.cached_items(kind)) or any(k[1][0] == kind for k, _ in T.tiling.cached_items("provisional"))


cp = cupy_fixture()


@pytest.mark.gpu
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("D", DS)
def test_half_kernels_exact_integers(cp, half_kernel, N, D):
    rng = np.random.default_rng(0)
    A = int_graph(rng, N, N)
    for xt in HALVES:
        X = cp.asarray(ints(rng, N, D, dtype=xt))
        Xh = X.get()
        for mdt in (F32, xt):
            T = tg.TiledMatrix(A, dtype=mdt, layout="vector")
            for ydt in (F32, xt):
                got = poisoned(cp, T, X, ydt, precision={F16: "fp16", BF16: "bf16"}[xt])
                np.testing.assert_array_equal(got, exact_product(A, Xh, ydt).astype(np.float64),
                                              err_msg=f"{xt} X, {mdt} matrix, {ydt} out")
            assert _planned(T, "half_launch"), "16-bit kernel ran"


@pytest.mark.gpu
def test_half_kernel_into_the_other_16bit_type(cp):
    """float16 X into a bfloat16 out (and back): the 16-bit MMA still runs, rounded once into out."""
    rng = np.random.default_rng(0)
    A = int_graph(rng, 1000, 1000)
    T = tg.TiledMatrix(A, dtype=np.float32, layout="vector")
    for xt, yt in ((F16, BF16), (BF16, F16)):
        X = ints(rng, 1000, 64, dtype=xt)
        got = poisoned(cp, T, cp.asarray(X), yt, precision={F16: "fp16", BF16: "bf16"}[xt])
        np.testing.assert_array_equal(got, exact_product(A, X, yt).astype(np.float64))
    assert _planned(T, "half_launch")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1000, 3000), (3000, 1000), (17, 40_000), (40_000, 17)])
def test_half_kernels_rectangular(cp, half_kernel, shape):
    rng = np.random.default_rng(0)
    A = int_graph(rng, *shape)
    for xt in HALVES:
        for D in (64, 130):
            X = ints(rng, shape[1], D, dtype=xt)
            T = tg.TiledMatrix(A, dtype=np.float32, layout="vector")
            np.testing.assert_array_equal(poisoned(cp, T, cp.asarray(X), F32), exact_product(A, X, F32).astype(np.float64))


@pytest.mark.gpu
def test_half_kernels_star_hub_200k(cp, half_kernel):
    A = star(200_000)
    rng = np.random.default_rng(0)
    T = tg.TiledMatrix(A, dtype=np.float32, layout="vector")
    for xt in HALVES:
        for D in (17, 64, 128):
            X = ints(rng, A.shape[1], D, dtype=xt)
            np.testing.assert_array_equal(poisoned(cp, T, cp.asarray(X), F32), exact_product(A, X, F32).astype(np.float64))
        Xf = cp.asarray(rng.standard_normal((A.shape[1], 64)).astype(np.float32)).astype(xt)
        np.testing.assert_array_equal(poisoned(cp, T, Xf, F32), poisoned(cp, T, Xf, F32))  # deterministic


@pytest.mark.gpu
@pytest.mark.parametrize("xt", HALVES)
def test_half_values_out_of_float16_range(cp, xt):
    # |v| up to 1e6 and down to 1e-7: the scale keeps float16 parts in range; Inf values propagate.
    rng = np.random.default_rng(0)
    A = int_graph(rng, 500, 500)
    A.data[:] = rng.choice([1e6, -3e5, 1e-7, 2.5, -1e-3], A.nnz)
    T = tg.TiledMatrix(A, dtype=np.float32, layout="vector")
    X = ints(rng, 500, 32, dtype=xt)
    want = A.astype(np.float64) @ np.asarray(X, np.float64)
    got = poisoned(cp, T, cp.asarray(X), F32)
    assert np.linalg.norm(got - want) <= 1e-6 * np.linalg.norm(want)
    A.data[0] = np.inf
    Ti = tg.TiledMatrix(A, dtype=np.float32, layout="vector")
    with np.errstate(invalid="ignore"):
        want = A.astype(np.float64) @ np.asarray(X, np.float64)
    got = poisoned(cp, Ti, cp.asarray(X), F32)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))


@pytest.mark.gpu
@pytest.mark.parametrize("xt", HALVES)
def test_float32_values_exact_in_16_bits_take_one_mma(cp, xt):
    """A float32 matrix whose values X's type holds (unweighted, small integers) runs on those values, one MMA,
    with the bits of the (hi, lo) pairs; values it does not hold, NaN, and values made on the device keep the
    pairs.  Matrices of both kinds on one tiling share the cached launch safely (bound plan)."""
    rng = np.random.default_rng(0)
    A = _hub_graph(rng)
    A.data[:] = rng.integers(-4, 5, A.nnz)
    A.data[A.data == 0] = 1
    X = cp.asarray(rng.standard_normal((A.shape[1], 64)).astype(np.float32)).astype(xt)
    T = tg.TiledMatrix(A, dtype=np.float32, layout="vector")
    got = {}
    for exact_values in (True, False):
        with tg.tuning(half_exact_values=exact_values):
            split = _values.half_values(T.values, xt, T._casts)[0]
            assert split is not exact_values
            got[exact_values] = poisoned(cp, T, X, F32)
    np.testing.assert_array_equal(got[True].view(np.uint64), got[False].view(np.uint64))
    for data in (rng.uniform(0.5, 1.5, A.nnz), np.where(np.arange(A.nnz) == 7, np.nan, A.data)):
        assert _values.half_values(cp.asarray(data.astype(np.float32)), xt, {})[0], "pairs"
    # values made on the device (a training step's) are not checked (no host read): pairs, also on the transpose
    ints_on_device = T.with_values(cp.asarray(A.tocsr().data.astype(np.float32)))
    for M in (ints_on_device, ints_on_device.T):
        assert _values.half_values(M.values, xt, M._casts)[0]
    assert not _values.half_values(T.T.values, xt, T.T._casts)[0]
    from_host = T.with_values(A.tocsr().data.astype(np.float32))  # host values: checked, one MMA
    assert not _values.half_values(from_host.values, xt, from_host._casts)[0]
    # the bound plan: the cached launch of one form, called with a matrix of the other, goes the general way
    weighted = T.with_values(cp.asarray(rng.uniform(0.5, 1.5, A.nnz).astype(np.float32)))
    Xh = np.asarray(X.get(), np.float64)
    for M in (T, weighted, T, weighted):
        for _ in range(2):
            want = M.tocsr().astype(np.float64) @ Xh
            Y = (M @ X).get()
            assert np.linalg.norm(Y - want) <= TOL["float32"] * np.linalg.norm(want)


@pytest.mark.gpu
def test_bfloat16_through_dlpack_with_jax(cp):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU's memory to CuPy
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    rng = np.random.default_rng(0)
    A = int_graph(rng, 300, 300)
    X = ints(rng, 300, 16, dtype=BF16)
    Xj = jnp.asarray(np.asarray(X, np.float32)).astype(jnp.bfloat16)
    for mdt, ydt in ((F32, F32), (BF16, BF16)):
        T = tg.TiledMatrix(A, dtype=mdt, layout="vector")
        Y = T @ Xj  # a CUDA DLPack producer: a CuPy result
        assert isinstance(Y, cp.ndarray) and Y.dtype == ydt
        np.testing.assert_array_equal(Y.get(), exact_product(A, X, ydt))
        back = jnp.from_dlpack(Y)
        assert back.dtype == jnp.dtype(ydt)


@pytest.mark.gpu
@pytest.mark.parametrize("xt", HALVES)
def test_half_bound_plan_matches_the_first_call(cp, half_kernel, xt):
    """The second call of a signature takes the cached launch (allocate, launch): the same bits as the first.

    Covers ``T @ X``, ``spmm(out=)`` into float32 and X's type, the explicit precision, a
    float32 and a 16-bit matrix, split windows (hub row), and a matrix made by ``with_values``
    on the same tiling: the cached launch reads the matrix it is called on, not the first one.
    """
    rng = np.random.default_rng(0)
    A = int_graph(rng, 1000, 1000)
    A = sp.csr_array(sp.vstack([sp.csr_array(np.ones((1, 1000))), A[1:]]))  # a hub row: split windows
    A.sum_duplicates()  # canonical: with_values takes values in this order
    for mdt in (F32, xt):
        T = tg.TiledMatrix(A, dtype=mdt, layout="vector")
        for D in (17, 64):
            X = cp.asarray(ints(rng, 1000, D, dtype=xt))
            check_cached_launch(cp, A, T, X, (F32, xt), {F16: "fp16", BF16: "bf16"}[xt], rng)


def _hub_graph(rng):
    """Hub windows (split: in-launch sums against the fixup) among ordinary rows, values in [0.5, 1.5)."""
    hub = star(3000)
    hub.resize((4001, 4001))
    A = sp.csr_array(int_graph(rng, 4001, 4001, degree=30) + hub)
    A.data[:] = rng.uniform(0.5, 1.5, A.nnz)
    return A


@pytest.mark.gpu
@pytest.mark.parametrize("coop", [False, True])
@pytest.mark.parametrize("D", [17, 64, 256])
def test_half_timed_choice_candidates_are_bit_identical(cp, D, coop):
    """Every 16-bit launch the timed choice may pick gives the same bits (random floats, split windows).

    ``coop``: one CTA per window x slice (aligned rows), whose candidates are its own shapes.
    """
    with tg.tuning(vec_coop=coop):
        _check_half_candidates(cp, D, coop)


def _check_half_candidates(cp, D, coop):
    from tcgnn_py.kernels.products import VEC_HALF, VEC_HALF_COOP

    rng = np.random.default_rng(0)
    A = _hub_graph(rng)
    aligned = D % 8 == 0
    for xt in HALVES:
        T = tg.TiledMatrix(A, dtype=np.float32, layout="vector")
        X = cp.asarray(rng.standard_normal((A.shape[1], D)).astype(np.float32)).astype(xt)
        split, vals, unscale = _values.half_values(T.values, xt, T._casts)
        half = (xt.name, split, "float32")
        choices = half_family.candidates(T.tiling, D, aligned, half)
        assert len(set(choices)) == len(choices) and len({c.bpu for c in choices}) == 1
        kernels = [c.kernel for c in choices]
        assert {k.COOP for k in kernels} == {coop and aligned}
        if aligned and coop:
            assert {(k.FS, k.KS, k.NS) for k in kernels} == set(VEC_HALF_COOP)
            assert not any(k.COMBINE for k in kernels)
        elif aligned:
            assert {k.COMBINE for k in kernels} == {True, False}
            assert {(k.FS, k.KS, k.NS) for k in kernels} == set(VEC_HALF)
        else:
            assert len(choices) == 1
        first = None
        for c in choices:
            launch = half_family.launch(T.tiling, F32, D, aligned, half, c)
            Y = cp.full((A.shape[0], D), cp.nan, cp.float32)
            launch.run(vals, X, Y, unscale)
            got = Y.get()
            if first is None:
                first = got
                want = A.astype(np.float64) @ np.asarray(X.get(), np.float64)
                assert np.linalg.norm(got - want) <= TOL["float32"] * np.linalg.norm(want), c
            else:
                np.testing.assert_array_equal(got.view(np.uint32), first.view(np.uint32), err_msg=f"{xt} {c}")


@pytest.mark.gpu
def test_half_timed_choice_runs_once(cp, monkeypatch):
    rng = np.random.default_rng(0)
    A = _hub_graph(rng)
    A.data[:] = rng.integers(1, 4, A.nnz)
    X = ints(rng, A.shape[1], 64, dtype=F16)
    with tg.tuning(timed_after=0):  # timed on the first call
        tg.TiledMatrix(A, dtype=np.float32, layout="vector") @ cp.asarray(X)  # starts compiling every candidate
        from tcgnn_py.kernels import registry

        registry.wait_for_compiles()
        calls = count_timing(monkeypatch)
        T = tg.TiledMatrix(A, dtype=np.float32, layout="vector")
        for _ in range(3):  # slow path (timed), then the cached launch
            np.testing.assert_array_equal((T @ cp.asarray(X)).get(), exact_product(A, X, F32))
        assert len(calls) == 1 and calls[0] > 1
        ((_, ms),) = T.tiling.cached_items("timed")
        assert len(ms) == calls[0]
