"""Issue 15 experiment: hybrid routing of the vector layout's entries.

Entries of multi-entry column vectors run on tensor cores (vector layout), single-entry vectors on CUDA
cores (cuSPARSE CSR ALG2 with beta = 1 into the same Y), against the whole matrix on the vector layout.

    python tools/hybrid_routing.py blogcatalog3,pubmed 32,128

Results: tools/profiles/spmm15/hybrid_routing.md.
"""
import sys

import cupy as cp
import cupyx.scipy.sparse as cps
import numpy as np
import scipy.sparse as sp

import tcgnn_py as tg
from tcgnn_py.bench import resolve_graph
from tcgnn_py.bench._baselines import CSR_ALG2, CusparseRowMajor
from tcgnn_py.bench._timing import time_back_to_back, time_rotating

graphs, dims = sys.argv[1].split(","), [int(d) for d in sys.argv[2].split(",")]
rng = np.random.default_rng(1)
print("graph | D | single-entry share of nnz | cuSPARSE | vector | TC multi + cuSPARSE single (sequential) | best hybrid / vector")
for g in graphs:
    A = resolve_graph(g)[1].astype(np.float32).tocsr()
    A.sort_indices()
    T0 = tg.TiledMatrix(A, layout="vector", device="cpu")
    t = T0.tiling
    bp, pos = np.asarray(t.block_ptr), np.asarray(t.tile_pos).astype(np.int64)
    blk = np.repeat(np.arange(len(bp) - 1), np.diff(bp))
    vec = blk * 4 + (pos & 3)
    multi = np.bincount(vec)[vec] > 1
    r, c = t.rows_cols()
    r, c = np.asarray(r), np.asarray(c)
    vals = np.asarray(T0.values, np.float32)
    Am = sp.csr_matrix((vals[multi], (r[multi], c[multi])), shape=A.shape)
    As = sp.csr_matrix((vals[~multi], (r[~multi], c[~multi])), shape=A.shape)
    assert Am.nnz + As.nnz == A.nnz
    T = tg.TiledMatrix(A, layout="vector")
    Tm = tg.TiledMatrix(Am, layout="vector")
    for D in dims:
        Xs = [cp.asarray(rng.integers(-4, 5, (A.shape[1], D)).astype(np.float32)) for _ in range(4)]
        Y = cp.empty((A.shape[0], D), np.float32)
        full = CusparseRowMajor(cps.csr_matrix(A), Xs, Y, CSR_ALG2)
        single = CusparseRowMajor(cps.csr_matrix(As), Xs, Y, CSR_ALG2)
        single.beta = np.array(1, np.float32)
        def hyb(i):
            tg.spmm(Tm, Xs[i], out=Y, precision="tf32")
            single(i)
        hyb(0); assert bool((Y == cps.csr_matrix(A) @ Xs[0]).all()), g
        f = lambda i: tg.spmm(T, Xs[i], out=Y, precision="tf32")
        res = [time_rotating(x, 4, repeat=30) * 1e3 for x in (full, f, hyb)]
        b2b = [time_back_to_back(x, 4) * 1e3 for x in (full, f, hyb)]
        print(f"{g} | {D} | {As.nnz / A.nnz:.0%} | {res[0]:.1f} / {b2b[0]:.1f} | {res[1]:.1f} / {b2b[1]:.1f} | "
              f"{res[2]:.1f} / {b2b[2]:.1f} | {res[1] / res[2]:.2f}x / {b2b[1] / b2b[2]:.2f}x", flush=True)
        full.close(); single.close()
