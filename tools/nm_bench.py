"""Issue 19 figures: sparse tensor cores (mma.sp) on the N:M layouts against dense tensor cores and cuSPARSE.

Usage (GPU machine): python tools/nm_bench.py [GRAPH ...] [--dims 32,64,128,256] [--repeat 20] [--padding]

Per graph and vertex order (original, after ``tg.reorder(A, "2:4")``, and after
``tg.reorder(A, "2:4", layout="2:4")`` where its window stage renumbers), per width D, one process, one run
(ratios within a row come from the same run):

* padding of the "2:4" and "1:2" layouts (stored slots holding no column), and windows needing none;
* float16 X (float32 matrix, float32 out): "2:4" mma.sp against the vector layout's dense m16n8k16 kernel;
* float32 X (TF32): "1:2" mma.sp against the vector layout's and the 16x8 layout's dense m16n8k8 kernels;
* cuSPARSE float32, CSR, row-major X and Y, best of ALG2 / ALG3 (ALG_DEFAULT is within 2 % of ALG2 here),
  on the same (reordered or original) matrix.

Two clocks, both medians over 5 batches, calls cycling through 4 fresh random inputs:

* ``call``: one call from an idle GPU between CUDA events (what a user's single call costs, host work included;
  the 16-bit and N:M paths have no cached hot path yet, so small graphs measure Python here);
* ``gpu``: the GPU time per call of ``repeat`` calls queued behind a 2 ms busy kernel (the host has issued them
  all before the GPU reaches them): the kernels' time without the host's.  Ratios use this clock.
"""

import argparse
import sys

import numpy as np

import cupy as cp
import tcgnn_py as tg
from tcgnn_py.bench import resolve_graph
from tcgnn_py.bench import CSR_ALG2, CSR_ALG3, CusparseRowMajor
from tcgnn_py.bench import time_queued, time_rotating

DEFAULT = ["cora", "pubmed", "citeseer", "ppi_homo_sapiens", "wiki_vote", "as_22july06", "facebook", "astro_ph",
           "blogcatalog3", "wikipedia_pos", "deezer_europe", "facebook_pagepage", "proteins_full", "wing",
           "fe_4elt2", "lastfm_asia", "ss_bcsstk13", "email_eu_core"]


def padding_table(graphs):
    """Padding of the N:M layouts before and after ``tg.reorder(A, "2:4")``: all padding slots / inside groups."""
    import time

    print("| graph | nnz | 2:4 original: all / in groups / windows unpadded | reorder s | 2:4 reordered: all / in "
          "groups / windows unpadded | 1:2 original: all / in groups | 1:2 reordered: all / in groups |")
    print("|" + "---|" * 7)
    for name in graphs:
        _, A = resolve_graph(name)
        A = A.astype(np.float32)
        t0 = time.perf_counter()
        p = tg.reorder(A, "2:4", verbose=False)
        secs = time.perf_counter() - t0
        cells = {}
        for order, M in (("orig", A), ("re", p.apply(A))):
            for lay in ("2:4", "1:2"):
                s = tg.TiledMatrix(M, layout=lay).tile_stats()
                cells[order, lay] = (f"{100 * s.padding_fraction:.1f} % / {100 * s.group_padding_fraction:.1f} %",
                                     f"{100 * s.windows_unpadded / max(s.nonempty_windows, 1):.0f} %")
        print(f"| {name} | {A.nnz:,} | {cells['orig', '2:4'][0]} / {cells['orig', '2:4'][1]} | {secs:.2f} | "
              f"{cells['re', '2:4'][0]} / {cells['re', '2:4'][1]} | {cells['orig', '1:2'][0]} | {cells['re', '1:2'][0]} |",
              flush=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("graphs", nargs="*", default=DEFAULT)
    ap.add_argument("--dims", default="32,64,128,256")
    ap.add_argument("--repeat", type=int, default=20, help="calls per batch")
    ap.add_argument("--no-reorder", action="store_true")
    ap.add_argument("--padding", action="store_true", help="only the padding table (no timing)")
    a = ap.parse_args(argv)
    if a.padding:
        return padding_table(a.graphs)
    dims = [int(d) for d in a.dims.split(",")]
    import cupyx.scipy.sparse as csp

    print("| graph | order | nnz | pad 2:4 | pad 1:2 | D | cuSPARSE fp32 µs | vector f16 µs | 2:4 sp f16 µs | "
          "sp/dense f16 | sp f16 vs cuSPARSE | vector tf32 µs | 16x8 tf32 µs | 1:2 sp tf32 µs | sp/dense tf32 | "
          "sp tf32 vs cuSPARSE | call µs: vec f16 / sp f16 / vec tf32 / sp tf32 |")
    print("|" + "---|" * 17)
    rng = np.random.default_rng(0)
    for name in a.graphs:
        _, A0 = resolve_graph(name)
        A0 = A0.astype(np.float32)
        orders = [("original", A0)]
        if not a.no_reorder:
            p = tg.reorder(A0, "2:4")
            orders.append(("2:4 reorder", p.apply(A0).astype(np.float32)))
            q = tg.reorder(A0, "2:4", layout="2:4")  # with the window stage for the 2:4 layout
            if q.report.renumbered:
                orders.append(("2:4 reorder + window stage", q.apply(A0).astype(np.float32)))
        for order, A in orders:
            A.data[:] = rng.uniform(0.5, 1.5, A.nnz).astype(np.float32)
            T24 = tg.TiledMatrix(A, layout="2:4")
            T12 = tg.TiledMatrix(A, layout="1:2")
            TV = tg.TiledMatrix(A, layout="vector")
            TC = tg.TiledMatrix(A, layout="tcgnn")
            s24, s12 = T24.tile_stats(), T12.tile_stats()
            Ad = csp.csr_matrix(A)
            for D in dims:
                Xs = [cp.asarray(rng.standard_normal((A.shape[1], D)).astype(np.float32)) for _ in range(4)]
                Xh = [x.astype(cp.float16) for x in Xs]
                Y = cp.empty((A.shape[0], D), cp.float32)
                cs = [CusparseRowMajor(Ad, Xs, Y, alg) for alg in (CSR_ALG2, CSR_ALG3)]
                t, call = {}, {}
                t["cusparse"] = min(time_queued(c, 4, calls=a.repeat, repeat=5) for c in cs)
                want = (Ad @ Xs[0]).get()
                for key, T, X, prec in (("vec16", TV, Xh, "fp16"), ("sp16", T24, Xh, "fp16"),
                                        ("vec32", TV, Xs, "tf32"), ("tc32", TC, Xs, "tf32"), ("sp32", T12, Xs, None)):
                    f = (lambda i, T=T, X=X, prec=prec: tg.spmm(T, X[i], out=Y, precision=prec))
                    f(0)
                    ref = (Ad @ X[0].astype(cp.float32)).get()
                    err = np.linalg.norm(Y.get() - ref) / max(np.linalg.norm(ref), 1e-30)
                    assert err < 2e-3, (name, order, D, key, err)
                    t[key] = time_queued(f, 4, calls=a.repeat, repeat=5)
                    call[key] = time_rotating(f, 4, a.repeat)
                for c in cs:
                    c.close()
                del want
                us = {k: 1e3 * v for k, v in t.items()}
                print(f"| {name} | {order} | {A.nnz} | {100 * s24.padding_fraction:.1f}% | "
                      f"{100 * s12.padding_fraction:.1f}% | {D} | {us['cusparse']:.1f} | {us['vec16']:.1f} | "
                      f"{us['sp16']:.1f} | {t['vec16'] / t['sp16']:.2f}× | {t['cusparse'] / t['sp16']:.2f}× | "
                      f"{us['vec32']:.1f} | {us['tc32']:.1f} | {us['sp32']:.1f} | "
                      f"{min(t['vec32'], t['tc32']) / t['sp32']:.2f}× | {t['cusparse'] / t['sp32']:.2f}× | "
                      f"{1e3 * call['vec16']:.0f} / {1e3 * call['sp16']:.0f} / {1e3 * call['vec32']:.0f} / "
                      f"{1e3 * call['sp32']:.0f} |", flush=True)
            print(f"<!-- {name} {order}: 2:4 {s24} | 1:2 {s12} -->", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
