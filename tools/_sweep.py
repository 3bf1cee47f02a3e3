"""What the launch-shape sweeps (``sweep_vec.py``, ``sweep_half.py``) share: graphs, integer twins, cuSPARSE times."""

import numpy as np

from tcgnn_py.bench import CSR_ALG2, CSR_ALG3, CusparseRowMajor, resolve_graph, time_rotating


def load_graph(spec, rng):
    """``(name, A, Ai)``: A as canonical float32 CSR, and Ai with its pattern and values in +-[1, 4] (exact tests)."""
    name, A = resolve_graph(spec)
    A = A.astype(np.float32)
    A.sum_duplicates()
    A.sort_indices()
    Ai = A.copy()
    Ai.data[:] = rng.integers(1, 5, Ai.nnz) * rng.choice([-1, 1], Ai.nnz)
    return name, A, Ai


def cusparse_us(Ad, Xs, Y, repeat=20):
    """Median µs of cuSPARSE CSR ALG2 and ALG3 (row-major X) on rotating inputs: ``{"alg2": .., "alg3": ..}``."""
    out = {}
    for alg, label in ((CSR_ALG2, "alg2"), (CSR_ALG3, "alg3")):
        c = CusparseRowMajor(Ad, Xs, Y, alg)
        out[label] = 1e3 * time_rotating(c, len(Xs), repeat)
        c.close()
    return out
