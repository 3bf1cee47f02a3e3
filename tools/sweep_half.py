"""16-bit vector SpMM: exactness, error and a launch-shape sweep against cuSPARSE fp32 (GPU machine).

Usage: python tools/sweep_half.py [--quick] GRAPH ...
For each graph and D in 64/128/256: the best of cuSPARSE CSR ALG2/ALG3 with
float32 row-major X (the user's alternative), the TF32 vector kernel, and the
float16 / bfloat16 kernel with a float32 matrix (split values) and with a
matrix of X's type, over ``_ops.set_tuning`` shapes (slices, k16 chunks per
step, stages).  Every configuration is first checked exact on small-integer
data; relative Frobenius errors on random data are against a float64 product
of the same (16-bit) inputs.  CUDA events, rotating fresh inputs, one process.
"""

import sys

import numpy as np

import cupy as cp
import cupyx.scipy.sparse as csp
import ml_dtypes
import tcgnn_py as tg
from tcgnn_py import _ops
from tcgnn_py.bench import time_rotating
from _sweep import cusparse_us, load_graph  # tools/, beside this script

BF16 = np.dtype(ml_dtypes.bfloat16)
DIMS = (64, 128, 256)


def rel(got, want):
    got = got.astype(cp.float64)
    return float(cp.linalg.norm(got - want) / max(float(cp.linalg.norm(want)), 1e-30))


def main(argv):
    quick = "--quick" in argv
    graphs = [a for a in argv if not a.startswith("--")]
    base = dict(_ops.TUNING)
    # (slices, k16 chunks per step, stages, values prefetched, target warps per SM)
    shapes = [(None, 1, 2, True, 16), (None, 1, 2, False, 16), (None, 1, 2, True, 32), (None, 1, 2, True, 64),
              (1, 2, 2, True, 16), (2, 1, 2, True, 16), (2, 1, 3, True, 16), (2, 2, 2, True, 16),
              (None, 2, 2, True, 32)]
    if quick:
        shapes = shapes[:1]
    summary = []
    per_shape = {}
    for spec in graphs:
        rng = np.random.default_rng()
        name, A, Ai = load_graph(spec, rng)
        Ar = A.copy()
        Ar.data[:] = rng.uniform(0.05, 1.0, Ar.nnz).astype(np.float32)
        Ad = csp.csr_matrix(Ar)
        TV = tg.TiledMatrix(Ar, dtype=np.float32, layout="vector")
        TVi = tg.TiledMatrix(Ai, dtype=np.float32, layout="vector")
        mats = {"f32": TV}
        for dt, tag in ((np.dtype(np.float16), "f16"), (BF16, "bf16")):
            mats[tag] = TV.astype(dt)
            mats[tag + "i"] = TVi.astype(dt)
        print(f"# {name}: {A.shape[0]} rows, nnz {A.nnz}", flush=True)
        for D in DIMS:
            Xs = [cp.random.standard_normal((A.shape[1], D), dtype=cp.float32) for _ in range(4)]
            Y = cp.empty((A.shape[0], D), cp.float32)
            best = min(cusparse_us(Ad, Xs, Y).values())
            tv = 1e3 * time_rotating(lambda i: tg.spmm(TV, Xs[i], out=Y), 4, 20)
            Xi32 = rng.integers(-8, 9, (A.shape[1], D)).astype(np.float32)
            want_i = cp.asarray(Ai.astype(np.float64) @ Xi32.astype(np.float64))
            line = [f"{name:16s} D={D:3d} cusparse {best:8.1f} us  tf32-vec {best / tv:5.2f}x"]
            for xt, xtag in ((np.dtype(np.float16), "f16"), (BF16, "bf16")):
                Xh = [x.astype(xt) for x in Xs]
                Xih = cp.asarray(Xi32).astype(xt)
                want_r = Ar.astype(np.float64) @ Xh[0].astype(cp.float32).get().astype(np.float64)
                want_r = cp.asarray(want_r)
                for mtag in ("f32", xtag):  # float32 matrix (split values) or a matrix of X's type
                    T, Ti = mats[mtag], (TVi if mtag == "f32" else mats[mtag + "i"])
                    Yo = cp.empty((A.shape[0], D), dtype=_ops.result_dtype(T.dtype, xt))
                    times = []
                    for s, ks, ns, pv, tw in shapes:
                        _ops.set_tuning(**{**base, "vec_slices": s, "half_ks": ks, "half_stages": ns,
                                           "half_prefetch": pv, "vec_target_warps": tw, "vec_timed_choice": False})
                        got = Ti @ Xih
                        ok = bool((got.astype(cp.float64) == want_i).all()) if Yo.dtype == np.float32 else \
                            bool((got.astype(cp.float64) == want_i.astype(cp.float32).astype(xt).astype(cp.float64)).all())
                        if not ok:
                            print(f"  NOT EXACT {xtag} matrix {mtag} shape {(s, ks, ns, pv, tw)}", flush=True)
                        t = 1e3 * time_rotating(lambda i: tg.spmm(T, Xh[i], out=Yo), 4, 20)
                        times.append((t, (s, ks, ns, pv, tw)))
                    _ops.set_tuning(**base)
                    err = rel(T @ Xh[0], want_r)
                    t0 = times[0][0]
                    tb, sb = min(times, key=lambda r: r[0])
                    line.append(f"{xtag}/{mtag} {best / t0:5.2f}x (best {best / tb:5.2f}x {sb}) err {err:.1e}")
                    summary.append((name, D, xtag, mtag, best / t0, best / tb, sb))
                    for t, sh in times:
                        per_shape.setdefault((xtag, mtag, sh), []).append(best / t)
            print("  ".join(line), flush=True)
    print("\n# geomean speedup over cuSPARSE fp32 per shape (slices, ks, stages, prefetch, target warps)")
    for (xtag, mtag, sh), v in sorted(per_shape.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2]))):
        print(f"{xtag} X, {mtag} matrix, {sh}: {np.exp(np.mean(np.log(v))):.3f}x over {len(v)}")
    print("\n# geomean speedup over cuSPARSE fp32 (default shape / best shape per point)")
    for xtag in ("f16", "bf16"):
        for mtag in ("f32", "half"):
            rows = [r for r in summary if r[2] == xtag and (r[3] == "f32") == (mtag == "f32")]
            if rows:
                g0 = np.exp(np.mean(np.log([r[4] for r in rows])))
                gb = np.exp(np.mean(np.log([r[5] for r in rows])))
                print(f"{xtag} X, {mtag} matrix: {g0:.2f}x / {gb:.2f}x  min {min(r[4] for r in rows):.2f}x over {len(rows)}")


if __name__ == "__main__":
    main(sys.argv[1:])
