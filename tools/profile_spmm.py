"""Where SpMM time goes: Python overhead per call on a small graph, and a launch-shape sweep.

Usage (GPU machine): python tools/profile_spmm.py [GRAPH ...]
Part 1 (cora, D=64): back-to-back wall time per call of ``tg.spmm`` and of a
bare kernel launch, CUDA-event medians, and the top of a cProfile.
Part 2: ``_ops.set_tuning`` sweep of the TF32 SpMM on each graph at D=64/128,
beside cuSPARSE CSR ALG2 (row-major) timed in the same process.
"""

import cProfile
import io
import itertools
import pstats
import sys
import time

import numpy as np

import cupy as cp
import tcgnn_py as tg
from tcgnn_py import _ops
from tcgnn_py.bench import CSR_ALG2 as _CSR_ALG2, CusparseRowMajor, resolve_graph, time_rotating


def wall_us(fn, n=2000):
    fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    cp.cuda.Device().synchronize()
    return 1e6 * (time.perf_counter() - t0) / n


def part1():
    _, A = resolve_graph("cora")
    T = tg.TiledMatrix(A, dtype=np.float32)
    X = cp.random.standard_normal((A.shape[1], 64), dtype=cp.float32)
    Y = cp.empty((A.shape[0], 64), cp.float32)
    empty = cp.RawKernel('extern "C" __global__ void tcgnn_empty() {}', "tcgnn_empty")
    rows = {
        "tg.spmm(T, X, out=Y)": lambda: tg.spmm(T, X, out=Y),
        "T @ X": lambda: T @ X,
        "empty RawKernel": lambda: empty((1,), (32,), ()),
    }
    for k, fn in rows.items():
        print(f"{k:<24} wall {wall_us(fn):7.1f} us/call   events {1e3 * time_rotating(lambda i: fn(), 1, 200):7.1f} us")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        tg.spmm(T, X, out=Y)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
    print(s.getvalue()[:6000])


def part2(graphs):
    base = dict(_ops.TUNING)
    for spec in graphs:
        name, A = resolve_graph(spec)
        A = A.astype(np.float32)
        T = tg.TiledMatrix(A, dtype=np.float32)
        import cupyx.scipy.sparse as csp

        Ad = csp.csr_matrix(A)
        for D in (64, 128):
            Xs = [cp.random.standard_normal((A.shape[1], D), dtype=cp.float32) for _ in range(3)]
            Y = cp.empty((A.shape[0], D), cp.float32)
            ref = None
            alg2 = CusparseRowMajor(Ad, Xs, Y, _CSR_ALG2)
            t_alg2 = 1e3 * time_rotating(alg2, 3, 30)
            alg2(0)
            ref = Y.copy()
            alg2.close()
            res = []
            for chunks, bpw, nw, pv in itertools.product((1, 2, 4), (8, 16, 32), (4, 8), ((0, 1), (2, 1), (2, 3), (3, 3), (4, 3))):
                if chunks == 4 and nw == 8:
                    continue
                if 32 * chunks > D and chunks > 1:
                    continue
                _ops.set_tuning(tf32_max_chunks=chunks, blocks_per_warp=bpw, tf32_nwarps=(nw, nw, nw),
                                tf32_async_stages=pv[0], tf32_async_min_blocks=pv[1])
                tg.spmm(T, Xs[0], out=Y)
                err = float(cp.linalg.norm(Y - ref) / cp.linalg.norm(ref))
                us = 1e3 * time_rotating(lambda i: tg.spmm(T, Xs[i], out=Y), 3, 30)
                res.append((us, chunks, bpw, nw, pv, err))
            _ops.set_tuning(**base)
            us_default = 1e3 * time_rotating(lambda i: tg.spmm(T, Xs[i], out=Y), 3, 30)
            res.sort()
            best = res[0]
            print(f"{name:<26} D={D:<4} cuSPARSE ALG2 {t_alg2:8.1f} us | default {us_default:8.1f} us | "
                  f"best {best[0]:8.1f} us (chunks={best[1]} bpw={best[2]} nwarps={best[3]} async_stages={best[4]}, "
                  f"err {best[5]:.1e})")
            print("    " + "  ".join(f"{c}/{b}/{w}/{p[0]}.{p[1]}:{u:.0f}" for u, c, b, w, p, _ in
                                     sorted(res, key=lambda r: r[1:5])))


if __name__ == "__main__":
    part1()
    if sys.argv[1:] != ["--part1"]:
        part2(sys.argv[1:] or ["pubmed", "blogcatalog3", "powerlaw:1000000:16000000"])
