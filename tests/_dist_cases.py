"""Rank programs for the distributed tests: the same code on simulated host ranks and on GPUs."""

import numpy as np
import scipy.sparse as sp

import tcgnn_py as tg
from tcgnn_py import distributed as dist
from tcgnn_py._device import to_host
from _zoo import star


def int_graph(n, density, seed, directed=True):
    rng = np.random.default_rng(seed)
    A = sp.random_array((n, n), density=density, rng=rng, format="csr")
    A.data[:] = rng.integers(1, 5, A.nnz)
    A = sp.csr_array(A)
    return A if directed else sp.csr_array(A + A.T)


GRAPHS = {  # float32 values: the TF32 and CUDA-core float32 paths, exact on small integers
    "uniform_n1001": lambda: int_graph(1001, 0.01, 1).astype(np.float32),
    "power_law": lambda: tg.power_law_graph(2000, 16000, seed=3),
    "star_300": lambda: star(300).astype(np.float32),
    "isolated_rows": lambda: sp.csr_array(sp.block_diag([int_graph(40, 0.2, 4), sp.csr_array((37, 37))]),
                                          dtype=np.float32),
}


def host_csr(T):
    """A TiledMatrix's CSR form as a scipy array, wherever the matrix lives."""
    data, indices, indptr = (to_host(v) for v in T.csr_arrays())
    return sp.csr_array((data, indices, indptr), shape=T.shape)


def int_features(n, d, seed):
    return np.random.default_rng(seed).integers(-8, 9, (n, d)).astype(np.float32)


def products(A, X, G, repeats=1, **kw):
    """A rank program: its rows of ``A @ X``, ``Aᵀ @ G`` and SDDMM(X, X), each ``repeats`` times, with its global
    rows (``kw``: DistributedMatrix options, e.g. ``partition`` or ``halo_dtype``)."""

    def rank(ctx):
        D = dist.DistributedMatrix(A, ctx, **kw)
        rows = D.global_rows
        xp = ctx.xp
        Xr, Gr = xp.asarray(X[rows]), xp.asarray(G[rows])
        outs = []
        for _ in range(repeats):
            e = D.sddmm(Xr, precision="fp32")
            # SDDMM values come in the entries' order: back to (row, local column) through the local CSR.
            vals = D.local_csr(to_host(e)).toarray()
            outs.append((to_host(D.matmul(Xr)), to_host(D.rmatmul_t(Gr)), vals, D.n_halo, to_host(rows)))
        return outs

    return rank


def expected_sddmm_rows(A, X, bounds, p):
    """Rank ``p``'s SDDMM as a dense ``rows x (own + halo)`` block (the local matrix's columns), A and X in the
    partitioned numbering."""
    lo, hi = bounds[p], bounds[p + 1]
    rows = sp.csr_array(A[lo:hi])
    cols = rows.indices
    own = (cols >= lo) & (cols < hi)
    halo = np.unique(cols[~own])
    mapped = np.where(own, cols - lo, (hi - lo) + np.searchsorted(halo, cols))
    r = np.repeat(np.arange(hi - lo), np.diff(rows.indptr))
    out = np.zeros((hi - lo, (hi - lo) + halo.shape[0]), np.float32)
    np.add.at(out, (r, mapped), np.einsum("ij,ij->i", X[lo + r], X[cols]))
    return out


def check_products(results, A, X, G, bounds):
    """Each rank's rows of the products equal the whole graph's at its global rows; SDDMM in the partitioned
    numbering (``bounds`` of it)."""
    A = sp.csr_array(A)
    perm = np.concatenate([r[0][4] for r in results])
    assert sorted(perm.tolist()) == list(range(A.shape[0]))
    B = sp.csr_array(A[perm][:, perm])  # the partitioned numbering
    for rep in range(len(results[0])):
        Y = np.concatenate([r[rep][0] for r in results])
        np.testing.assert_array_equal(Y, (A @ X).astype(np.float32)[perm])
        Z = np.concatenate([r[rep][1] for r in results])
        np.testing.assert_array_equal(Z, (A.T @ G).astype(np.float32)[perm])
        for p, r in enumerate(results):
            np.testing.assert_array_equal(r[rep][2], expected_sddmm_rows(B, X[perm], bounds, p))
    for r in results:  # repeat runs are bit-identical
        for rep in r[1:]:
            for a, b in zip(rep[:3], r[0][:3]):
                assert np.array_equal(a, b)


def gcn_grads(S, X, params, **kw):
    """A rank program: its rows of the GCN logits (and its global rows) and the all-reduced gradients."""

    def rank(ctx):
        D = dist.DistributedMatrix(S, ctx, **kw)
        xp = ctx.xp
        p = {k: xp.asarray(v) for k, v in params.items()}
        # CUDA cores: the second layer's inputs outgrow TF32's exact integers.
        E = dist.DistributedEdges(D, precision="fp32")
        logits, vjp = tg.nn.gcn_apply(p, E, xp.asarray(X[D.global_rows]), dropout_p=0.0)
        g = xp.ones_like(logits)
        grads, _ = dist.allreduce_grads(ctx, vjp(g))
        return to_host(logits), {k: to_host(v) for k, v in grads.items()}, to_host(D.global_rows)

    return rank


def single_gcn_grads(S, X, params):
    """The same on the whole graph, one device (CPU reference, exact)."""
    T = tg.TiledMatrix(S, device="cpu")
    logits, vjp = tg.nn.gcn_apply(params, T, X, dropout_p=0.0)
    return logits, vjp(np.ones_like(logits))


def check_gcn_grads(A, X, rng, dtype, run, **kw):
    """A two-layer GCN's logits and all-reduced gradients over ranks (``run(rank_program)``) equal the whole
    graph's, exactly (small-integer data)."""
    params = {"W0": rng.integers(-2, 3, (6, 4)).astype(dtype), "b0": np.arange(4, dtype=dtype),
              "W1": rng.integers(-2, 3, (4, 3)).astype(dtype), "b1": np.ones(3, dtype)}
    want_logits, want = single_gcn_grads(A, X, params)
    res = run(gcn_grads(A, X, params, **kw))
    perm = np.concatenate([r[2] for r in res])
    np.testing.assert_array_equal(np.concatenate([r[0] for r in res]), want_logits[perm])
    for _, grads, _ in res:
        for k in want:
            np.testing.assert_array_equal(grads[k], want[k])


def train_by_ranks(S, X, labels, split, fresh, epochs, to_host_params=False, **kw):
    """A rank program: :func:`tcgnn_py.distributed.train` of a GCN (no dropout) on this rank's rows.

    ``fresh()`` gives equal ``(params, optimizer)`` on every rank; returns ``(result, params)``.
    """

    def rank(ctx):
        D = dist.DistributedMatrix(S, ctx, **kw)
        rows = D.global_rows
        local = dist.local_indices(D, split)
        p, o = fresh()
        r = dist.train(ctx, tg.nn.gcn_apply, p, D, X[rows], labels[rows], local, o, epochs=epochs, dropout_p=0.0)
        return r, ({k: to_host(v) for k, v in p.items()} if to_host_params else p)

    return rank
