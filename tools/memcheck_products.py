"""A small workload that runs every SpMM/SDDMM kernel variant once, for compute-sanitizer.

Usage: compute-sanitizer --tool memcheck python tools/memcheck_products.py [PART ...]
PART: ``float32`` (TF32 / CUDA-core SpMM and SDDMM), ``half`` (16-bit SpMM), ``sparse`` (mma.sp),
``attention`` (the fused graph attention),
``baseline`` (the benchmarks' SDDMM baseline); all by default.  Under the sanitizer the whole workload
takes longer than one device call allows: run the parts in separate calls.
Covers every compiled SpMM config, selected by config (``tcgnn_py.tuning(tf32_kernel=..., vec_kernel=...,
half_kernel=...)``): the TF32 SpMM's (1/2 column chunks, cp.async and register gathers) with split (hub)
windows summed in the launch; the vector layout's (register and cp.async gathers, through L2 or L1, dense
values, one CTA per window summing its parts in shared memory) with units of 2 blocks, split windows summed in
the launch or by the fixup, and the default with every timed candidate (also on windows none of which is cut,
whose units the kernels read from the window pointers); the vector and TF32 SDDMM; CUDA-core
SpMM in float32/float64 on other tile shapes and the CUDA-core SDDMM; the 16-bit SpMM's shapes (both types,
float32 and 16-bit matrices and outputs, aligned and unaligned rows); the N:M layouts' mma.sp SpMM (2:4
16-bit, 1:2 TF32, split windows); float32 matrices as 16-bit values or (hi, lo) pairs.  Sizes are not multiples of 16.  Every
result is checked against SciPy, so a wrong index shows up even when it stays
inside an allocation.
"""

import pathlib
import sys

import numpy as np
import scipy.sparse as sp

import cupy as cp
import tcgnn_py as tg
from tcgnn_py.kernels import products as kp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from _zoo import sddmm_expected, star  # noqa: E402  (the test suite's references)

rng = np.random.default_rng(7)
n = 1003
A = sp.random_array((n, n), density=0.01, rng=rng, format="csr", dtype=np.float64)
A.data[:] = rng.integers(1, 5, A.nnz)
A = sp.csr_array(A + star(n - 1))  # window 0 has ~125 blocks: split over several CTAs
R = sp.random_array((n, 517), density=0.02, rng=rng, format="csr")
R.data[:] = rng.integers(1, 5, R.nnz)
# windows of a few blocks, none cut: the vector launches read their units from the window pointers (no plan)
S = sp.random_array((n, 517), density=4 / 517, rng=rng, format="csr")
S.data[:] = rng.integers(1, 5, S.nnz)


ALL_D = (1, 3, 17, 64, 100, 130)
ALIGNED_D = (64, 100, 130)  # cp.async configs: other widths take the register kernel, which its own cases run
#: (matrix, tile shape, dtype, tuning, widths)
cases = [(A, (16, 8), np.float32, {}, ALL_D), (R, (16, 8), np.float32, {}, ALL_D), (A, (8, 8), np.float32, {}, ALL_D),
         (A, (32, 32), np.float64, {}, ALL_D)]
# the vector layout: each config with units of 2 blocks, and the default (every candidate of the timed choice runs)
cases += [(M, (8, 4), np.float32, dict(vec_kernel=c, vec_blocks_per_unit=2),
           ALL_D if isinstance(c, kp.SpmmVec) else ALIGNED_D) for c in kp.VEC_SPMM_CONFIGS for M in (A, R)]
cases += [(M, (8, 4), np.float32, dict(timed_after=0), ALL_D) for M in (A, R, S)]  # (timed on its first call)
# 16x8: each config with units of 4 warps x 1 block (every window of more than 4 blocks split), and the default
cases += [(M, (16, 8), np.float32, dict(tf32_kernel=c, tf32_nwarps=(4, 4), blocks_per_warp=1),
           ALIGNED_D if isinstance(c, kp.SpmmTF32Async) else ALL_D) for c in kp.TF32_SPMM_CONFIGS for M in (A, R)]


def part_float32():
    checked = 0
    for M, tile_shape, dtype, tuning, widths in cases:
        with tg.tuning(**tuning):
            T = tg.TiledMatrix(M, dtype=dtype, tile_shape=tile_shape)
            for D in widths:
                X = rng.integers(-8, 9, (M.shape[1], D)).astype(dtype)
                want = M @ X.astype(np.float64)
                # None twice: the second call takes the cached launch (with its fixup launch where there is one).
                for precision in ((None, None, "fp32") if dtype == np.float32 else (None,)):
                    Y = tg.spmm(T, cp.asarray(X), precision=precision)
                    assert np.array_equal(Y.get(), want.astype(dtype)), (tile_shape, D, precision)
                    checked += 1
                if M.shape[0] == M.shape[1]:
                    for precision in ((None, "fp32") if dtype == np.float32 else (None,)):
                        S = tg.sddmm(T, cp.asarray(X), multiply_values=True, precision=precision)
                        e = sddmm_expected(M, X, X, multiply=True)
                        assert np.array_equal(S.tocsr().data, e.astype(dtype)), (tile_shape, D, precision)
                        checked += 1
    return checked


# 16-bit SpMM (vector layout): float16 / bfloat16 X, float32 (split) or 16-bit matrix, float32 or 16-bit out,
# every compiled shape, split windows summed in the launch or by the fixup, aligned (cp.async) and unaligned rows.
import ml_dtypes  # noqa: E402

# The float32 matrices hold small integers: the single-MMA kernels on their 16-bit values, and (first) the pairs.
def _half_shape(fs, ks, ns, combine=True, coop=False):
    """A 16-bit kernel shape for ``half_kernel`` (its types come from the operands)."""
    return kp.SpmmVech("tc_f16", False, "float", fs, ks, ns, combine, True, True, coop)


HALF_TUNINGS = ([dict(half_kernel=_half_shape(*shape, c), vec_blocks_per_unit=2, half_exact_values=exact)
                 for shape in kp.VEC_HALF for c, exact in ((True, False), (False, True))]
                + [dict(half_kernel=_half_shape(*shape, False, True)) for shape in kp.VEC_HALF_COOP]
                # the default: every candidate of the timed choice runs (timed on its first call)
                + [dict(timed_after=0)])


def part_half():
    checked = 0
    for tuning in HALF_TUNINGS:
        with tg.tuning(**tuning):
            for M in (A, R, S):
                for xt in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
                    for mdt in (np.float32, xt):
                        T = tg.TiledMatrix(M, dtype=mdt, layout="vector")
                        for D in (1, 3, 17, 64, 100, 136):
                            X = rng.integers(-8, 9, (M.shape[1], D)).astype(np.float32)
                            want = (M @ X.astype(np.float64)).astype(np.float32)
                            for ydt in (np.float32, xt):
                                out = cp.full((M.shape[0], D), cp.nan, ydt)
                                tg.spmm(T, cp.asarray(X).astype(xt), out=out)
                                assert np.array_equal(out.get().astype(np.float32), want.astype(ydt).astype(np.float32)), \
                                    (tuning, xt, mdt, D, ydt)
                                checked += 1
    return checked


# The N:M layouts' mma.sp SpMM: 2:4 with 16-bit X (float32 and 16-bit matrices and outputs), 1:2 with TF32;
# units of 8, 2 and 1 blocks: split windows summed by the fixup.
def part_sparse():
    checked = 0
    # Each layout's matrix is built once (the N:M grouping kernels are slow under the sanitizer); a tuning
    # changes the launches only.
    for M in (A, R):
        mats = {("1:2", np.float32): tg.TiledMatrix(M, dtype=np.float32, layout="1:2")}
        mats.update({("2:4", mdt): tg.TiledMatrix(M, dtype=mdt, layout="2:4")
                     for mdt in (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))})
        for tuning in (dict(sp_blocks_per_unit=8, half_exact_values=False), dict(sp_blocks_per_unit=8),
                       dict(sp_blocks_per_unit=1), dict(sp_blocks_per_unit=2)):
            with tg.tuning(**tuning):
                for D in (1, 3, 17, 64, 100, 136):
                    X = rng.integers(-8, 9, (M.shape[1], D)).astype(np.float32)
                    want = (M @ X.astype(np.float64)).astype(np.float32)
                    out = cp.full((M.shape[0], D), cp.nan, np.float32)
                    tg.spmm(mats["1:2", np.float32], cp.asarray(X), out=out)
                    assert np.array_equal(out.get(), want), (tuning, "1:2", D)
                    checked += 1
                    for xt in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
                        for mdt in (np.dtype(np.float32), xt):
                            for ydt in (np.float32, xt):
                                out = cp.full((M.shape[0], D), cp.nan, ydt)
                                tg.spmm(mats["2:4", mdt], cp.asarray(X).astype(xt), out=out)
                                assert np.array_equal(out.get().astype(np.float32), want.astype(ydt).astype(np.float32)), \
                                    (tuning, "2:4", xt, mdt, D, ydt)
                                checked += 1
    return checked


# The benchmarks' gather-and-dot SDDMM baseline (every lane-group size).
import cupyx.scipy.sparse as csp  # noqa: E402

from tcgnn_py.bench import GatherDotSDDMM  # noqa: E402



def part_baseline():
    checked = 0
    rows = np.repeat(np.arange(n), np.diff(A.indptr))
    for D in (1, 3, 8, 17, 64, 130):
        X = rng.integers(-8, 9, (n, D)).astype(np.float32)
        out = cp.full(A.nnz, cp.nan, cp.float32)
        GatherDotSDDMM(csp.csr_matrix(A.astype(np.float32)), [cp.asarray(X)], out)(0)
        got, want = out.get(), np.einsum("ij,ij->i", X[rows], X[A.indices])
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (D, bad.size, A.nnz, A.indices.dtype, bad[:5], got[bad[:5]], want[bad[:5]], rows[bad[:5]])
        checked += 1
    return checked


def part_attention():
    """The fused attention (tcgnn_py.nn.graph_attention), forward and backward: both scores, 1-8 heads, widths that
    leave lanes idle, 16-bit values, attention dropout; a hub row and column (A's window 0) and a rectangular graph."""
    checked = 0

    def rel(a, b):
        a = (a.astype(cp.float32) if isinstance(a, cp.ndarray) else a)
        a = cp.asnumpy(a).astype(np.float64)
        return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1)

    for M in (A, R):
        T = tg.TiledMatrix(M.astype(np.float32))
        Tc = tg.TiledMatrix(M.astype(np.float64), device="cpu")  # the NumPy reference, in float64
        n, k = M.shape
        seed, seed_c = cp.asarray([3], cp.uint32), np.array([3], np.uint32)
        for heads, D in ((1, 3), (1, 64), (4, 17), (8, 8), (2, 128), (3, 100)):
            V = rng.integers(-4, 5, (k, heads * D)).astype(np.float32)
            g = rng.integers(-4, 5, (n, heads * D)).astype(np.float32)
            ss, sd = rng.standard_normal((k, heads)).astype(np.float32), rng.standard_normal((n, heads)).astype(np.float32)
            for xt in ("float32", "float16", "bfloat16"):
                for p in (0.0, 0.5):
                    out, vjp = tg.nn.graph_attention(T, cp.asarray(V).astype(xt), heads=heads, s_src=cp.asarray(ss),
                                                     s_dst=cp.asarray(sd), dropout=p, seed=seed)
                    # V and g hold small integers: exact in 16 bits, so the float64 reference sees the same values
                    want, wvjp = tg.nn.graph_attention(Tc, V.astype(np.float64), heads=heads, s_src=ss,
                                                       s_dst=sd, dropout=p, seed=seed_c)
                    err = rel(out, want)
                    assert err < 2e-2, (heads, D, xt, p, err)
                    if xt == "float32":  # the fused backward, by rows and by columns
                        for got, exp in zip(vjp(cp.asarray(g)), wvjp(g.astype(np.float64))):
                            assert rel(got, exp) < 1e-4, (heads, D, p)
                    checked += 1
        for D in (3, 48, 200):  # cosine scores, forward and backward
            V = rng.integers(-4, 5, (k, D)).astype(np.float32)
            g = rng.integers(-4, 5, (n, D)).astype(np.float32)
            Q, K = ((rng.standard_normal((r, D)) / np.sqrt(D)).astype(np.float32) for r in (n, k))  # float32: fused
            for p in (0.0, 0.5):
                out, vjp = tg.nn.graph_attention(T, cp.asarray(V), score="cosine", Q=cp.asarray(Q), K=cp.asarray(K),
                                                 beta=cp.asarray([1.5], cp.float32), dropout=p, seed=seed)
                want, wvjp = tg.nn.graph_attention(Tc, V.astype(np.float64), score="cosine", Q=Q.astype(np.float64),
                                                   K=K.astype(np.float64), beta=np.array([1.5]), dropout=p,
                                                   seed=seed_c)
                assert rel(out, want) < 1e-4, (D, p)
                for got, exp in zip(vjp(cp.asarray(g)), wvjp(g.astype(np.float64))):
                    assert rel(got, exp) < 1e-4, (D, p)
                checked += 1
        for D, xt in ((3, "float32"), (48, "float32"), (200, "float32"), (48, "float16")) if n == k else ():
            # AGNN layers: float32 at three widths (one, two and eight feature chunks per lane) and float16
            H = cp.asarray(rng.standard_normal((n, D)).astype(np.float32)).astype(xt)
            out, vjp = tg.nn.agnn_conv(T, H, cp.asarray([1.5], cp.float32))
            want, _ = tg.nn.agnn_conv(T, H, cp.asarray([1.5], cp.float32), precision="fp32", fused=False)
            o, w = out.get().astype(np.float64), want.get().astype(np.float64)  # (host norms: cupy.linalg's driver
            err = float(np.linalg.norm(o - w) / np.linalg.norm(w))  # lookups read as API errors here)
            assert err < (1e-4 if xt == "float32" else 1e-2), (D, xt, err)
            vjp(cp.ones_like(out))
            checked += 1
    return checked


def part_dist():
    """The distributed products' row kernels (tcgnn_py.kernels.dist): packing rows into a send buffer in every
    type pair, float16's range count, adding rows into a float32 result; odd widths, empty and single rows."""
    from tcgnn_py.kernels import dist as kd
    from tcgnn_py.kernels.registry import get_kernel

    checked = 0
    types = {"float32": np.float32, "float16": np.float16}
    try:
        import ml_dtypes

        types["bfloat16"] = ml_dtypes.bfloat16
    except ImportError:
        pass
    for D in (1, 3, 17, 128, 130):
        X = rng.integers(-8, 9, (257, D)).astype(np.float32)
        for n_rows in (0, 1, 200):
            idx = rng.integers(0, 257, n_rows).astype(np.int64)
            for x_name, x_type in types.items():
                for h_name, h_type in types.items():
                    Xd = cp.asarray(X.astype(x_type))
                    out = cp.empty((n_rows, D), h_type)
                    flag = cp.zeros(1, np.uint32)
                    if n_rows:
                        get_kernel("dist", kd.pack_name(x_name, h_name))(
                            (min(n_rows, 1024),), (kd.ROW_THREADS,),
                            (Xd, cp.asarray(idx), np.int64(n_rows), np.int32(D), out, flag, np.float32(65504.0)))
                    assert np.array_equal(out.get().astype(np.float32), X[idx]), (D, n_rows, x_name, h_name)
                    assert int(flag.get()[0]) == 0
                    checked += 1
            rows = rng.permutation(257)[:n_rows].astype(np.int64)  # distinct
            for z_name, z_type in types.items():
                Y = cp.asarray(X)
                Z = rng.integers(-8, 9, (n_rows, D)).astype(np.float32)
                if n_rows:
                    get_kernel("dist", kd.add_name(z_name))(
                        (min(n_rows, 1024),), (kd.ROW_THREADS,),
                        (Y, cp.asarray(rows), np.int64(n_rows), np.int32(D), cp.asarray(Z.astype(z_type))))
                want = X.copy()
                want[rows] += Z
                assert np.array_equal(Y.get(), want), (D, n_rows, z_name)
                checked += 1
    big = cp.asarray(np.array([[1e6, 1.0, np.inf]], np.float32))
    flag = cp.zeros(1, np.uint32)
    out = cp.empty((1, 3), np.float16)
    get_kernel("dist", kd.pack_name("float32", "float16"))(
        (1,), (kd.ROW_THREADS,), (big, cp.zeros(1, np.int64), np.int64(1), np.int32(3), out, flag, np.float32(65504.0)))
    assert int(flag.get()[0]) == 1  # the finite value beyond float16's range is counted, infinity is not
    return checked + 1


PARTS = {"float32": part_float32, "dist": part_dist, "attention": part_attention, "half": part_half, "sparse": part_sparse, "baseline": part_baseline}
if __name__ == "__main__":
    names = sys.argv[1:] or list(PARTS)
    checked = sum(PARTS[name]() for name in names)
    cp.cuda.Device().synchronize()
    print(f"memcheck products workload ok ({', '.join(names)}): {checked} products checked")
