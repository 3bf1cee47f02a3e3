"""Where a GNN training epoch spends its time on small graphs: host issue against wall, and per-call host cost.

    python tools/profile_gnn.py [GRAPH]      # default cora; needs a GPU

For each model and sparse backend (tiled tensor cores, cupyx CSR), prints the
host time to issue 50 epochs and the wall time to finish them; equal numbers
mean the epoch is launch-bound.  Then the per-call cost of the sparse calls
at D = 16 (the hidden width), back to back.
"""

import sys

import cupy as cp
import cupyx.scipy.sparse as csp

import tcgnn_py as tg
from tcgnn_py.bench import gnn_problem, train_step
from tcgnn_py.bench import settle, time_per_call


def per_call(fn, n):
    settle(fn)  # (the launches a long loop settles on)
    return time_per_call(fn, n, warmup=10)


def main(graph="cora"):
    p = gnn_problem(graph)
    for sparse in ("tiled", "csr"):
        for model in ("gcn", "agnn"):
            host, wall = per_call(train_step(p, model, sparse, "cuda"), 50)
            print(f"{sparse:5s} {model}: host issue {1e3 * host:.2f} ms/epoch, wall {1e3 * wall:.2f} ms/epoch")
    A = tg.nn.gcn_norm(p["adj"])
    X = cp.random.standard_normal((A.shape[0], 16), dtype=cp.float32)
    C = csp.csr_matrix(A.tocsr())
    for name, fn in (("tg.spmm(A, X)", lambda: tg.spmm(A, X)), ("tg.spmm(A.T, X)", lambda: tg.spmm(A.T, X)),
                     ("tg.sddmm(A, X)", lambda: tg.sddmm(A, X)), ("cupyx A @ X", lambda: C @ X),
                     ("cupyx A.T @ X", lambda: C.T @ X)):
        host, wall = per_call(fn, 200)
        print(f"{name:16s}: host {1e6 * host:.1f} us/call, wall {1e6 * wall:.1f} us/call")


if __name__ == "__main__":
    main(*sys.argv[1:])
