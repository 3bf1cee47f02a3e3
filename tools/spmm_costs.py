"""Where a product's time goes: host issue cost, GPU time, from idle, back to back -- ours against cuSPARSE.

    python tools/spmm_costs.py GRAPH ... [--dims 32,64,128,256] [--json FILE] [--markdown FILE]

For each graph and width, in one process, for ``tg.spmm(T, X, out=Y)`` on the
default (vector) layout and cuSPARSE ALG2 / ALG3 (row-major, descriptors made
once, as in the benchmark):

* ``host``: microseconds per call to issue 200 calls with no synchronisation
  (the host's cost; the GPU queue does not fill at that count);
* ``gpu``: microseconds per call of 20 calls queued behind a spin kernel
  (median of 11 batches): the kernels' time with no host in it;
* ``idle`` and ``b2b``: the benchmark's two clocks (one call from idle; 20
  calls back to back), both with 4 rotating inputs.

The GPU clock says how fast the kernels are; the other two say what a caller
sees.  A ratio that moves between the clocks is the host's share.
"""

import math
import time

import numpy as np


def _host_us(call, n_inputs, calls=200):
    import cupy as cp

    for k in range(20):
        call(k % n_inputs)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for k in range(calls):
        call(k % n_inputs)
    t1 = time.perf_counter()
    cp.cuda.Device().synchronize()
    return 1e6 * (t1 - t0) / calls


def main():
    from _sweep import graph_args  # tools/

    args = graph_args(__doc__)

    import cupy as cp
    import cupyx.scipy.sparse as csp

    import tcgnn_py as tg
    from tcgnn_py.bench import CSR_ALG2, CSR_ALG3, CusparseRowMajor, resolve_graph, settle
    from tcgnn_py.bench import time_back_to_back, time_queued, time_rotating
    from _sweep import write_outputs  # tools/

    rows, lines = [], []
    head = ("| graph | D | clock | ours µs | ALG2 µs | ALG3 µs | best cuSPARSE / ours |\n"
            "|---|---|---|---|---|---|---|")
    print(head, flush=True)
    rng = np.random.default_rng(0)
    for spec in args.graphs:
        name, A = resolve_graph(spec)
        A = A.astype(np.float32)
        A.sum_duplicates()
        A.data[:] = rng.integers(1, 4, A.nnz)
        T = tg.TiledMatrix(A)
        Ad = csp.csr_matrix(A)
        for D in (int(d) for d in args.dims.split(",")):
            Xs = [cp.asarray(rng.integers(-4, 5, (A.shape[1], D)).astype(np.float32)) for _ in range(4)]
            Y = cp.empty((A.shape[0], D), cp.float32)
            ref = Ad @ Xs[0]
            settle(lambda: tg.spmm(T, Xs[0], out=Y))  # (the launch a long-lived matrix's timed choice keeps)
            assert bool((Y == ref).all()), (name, D)  # synchronize!
            algs = {a: CusparseRowMajor(Ad, Xs, Y, alg) for a, alg in (("alg2", CSR_ALG2), ("alg3", CSR_ALG3))}
            ours = lambda i: tg.spmm(T, Xs[i], out=Y)  # noqa: E731
            impls = {"ours": ours, "alg2": algs["alg2"], "alg3": algs["alg3"]}
            row = {"graph": name, "nnz": int(A.nnz), "D": D}
            for clock, fn in (("gpu", lambda c: 1e3 * time_queued(impls[c], 4)), ("host", lambda c: _host_us(impls[c], 4)),
                              ("idle", lambda c: 1e3 * time_rotating(impls[c], 4, 20, 3)),
                              ("b2b", lambda c: 1e3 * time_back_to_back(impls[c], 4, 20))):
                row[clock] = {k: fn(k) for k in impls}
                t = row[clock]
                best = min(t["alg2"], t["alg3"])
                line = (f"| {name} | {D} | {clock} | {t['ours']:.1f} | {t['alg2']:.1f} | {t['alg3']:.1f} |"
                        f" {best / t['ours']:.2f}× |")
                lines.append(line)
                print(line, flush=True)
            for c in algs.values():
                c.close()
            rows.append(row)
    summary = []
    for clock in ("gpu", "idle", "b2b"):
        r = [min(x[clock]["alg2"], x[clock]["alg3"]) / x[clock]["ours"] for x in rows]
        gm = math.exp(sum(map(math.log, r)) / len(r))
        summary.append(f"{clock}: geomean {gm:.3f}×, {sum(v < 1 for v in r)} of {len(r)} below 1.0×, worst {min(r):.2f}×")
    print("\n".join(summary))
    write_outputs(args, head, lines, rows, summary)


if __name__ == "__main__":
    main()
