"""Layer 4: the GNN layers of :mod:`tcgnn_py.nn` on a row-partitioned graph, and full-batch training.

A :class:`DistributedEdges` is an edge view (:class:`tcgnn_py.nn.EdgeView`)
whose products exchange halo rows, so every layer of :mod:`tcgnn_py.nn`
(``gcn_apply``, ``agnn_apply``, ``gat_apply``) runs on one rank's rows unchanged;
the attention runs its unfused sequence there.  Their weight gradients come out as this rank's
partial sums; :func:`train` all-reduces them (one NCCL call per step, loss
included), so every rank applies the same update and the parameters stay
replicated.
"""

import dataclasses
import time

import numpy as np

from .._validation import is_half
from ..nn import EdgeView, cross_entropy
from ._matrix import DistributedMatrix, digest, host_array

__all__ = ["DistributedEdges", "train", "DistTrainResult", "allreduce_grads", "local_indices"]


def local_indices(D, index_sets):
    """Each of ``index_sets`` (global vertex ids, e.g. a train / validation / test split) as this rank's local
    row numbers: the ids among :attr:`DistributedMatrix.global_rows`, numbered as this rank's rows.

    An id outside the graph (``0 <= id < n``) raises ``ValueError`` naming its set: another rank owns every
    id this rank drops, and none owns one outside the graph.
    """
    rows = np.asarray(host_array(D.global_rows), np.int64)
    order = np.argsort(rows)
    n = D.shape[0]
    out = []
    for k, ids in enumerate(index_sets):
        ids = np.asarray(host_array(ids))
        if ids.dtype.kind not in "iu" and ids.size:
            raise TypeError(f"index set {k} must hold integer vertex ids, got {ids.dtype}")
        ids = ids.astype(np.int64).ravel()
        bad = ids[(ids < 0) | (ids >= n)]
        if bad.size:
            raise ValueError(f"index set {k} has {bad.size} ids outside the graph's 0..{n - 1}, e.g. {int(bad[0])}")
        pos = np.searchsorted(rows, ids, sorter=order)
        pos = np.minimum(pos, max(rows.shape[0] - 1, 0))
        hit = rows.shape[0] > 0
        keep = rows[order[pos]] == ids if hit else np.zeros(ids.shape[0], bool)
        out.append(np.sort(order[pos[keep]]) if hit else np.zeros(0, np.int64))
    return out


class DistributedEdges(EdgeView):
    """Edge view of a :class:`DistributedMatrix`: this rank's entries (own part, then halo part), products that
    exchange halos.  The layers see this rank's square block: ``shape = (n_own, n_own)``."""

    def __init__(self, D, precision=None):
        if not isinstance(D, DistributedMatrix):
            raise TypeError(f"expected a DistributedMatrix, got {type(D).__name__}")
        self.dist = D
        self.precision = precision
        self.xp = D.ctx.xp
        self.shape = (D.n_own, D.n_own)
        self._cache = {}

    @property
    def values(self):
        return self.cached("values", lambda: self.dist.values)

    @property
    def rows(self):
        return self.cached("rows", self.dist.entry_rows)

    @property
    def cols(self):
        """Local column of each entry (``n_own +`` halo column for halo entries): what :meth:`columns` indexes."""
        return self.cached("cols", self.dist.entry_cols)

    @property
    def entry_ids(self):
        return self.cached("entry_ids", self.dist.entry_ids)

    def _out(self, X, rows):
        # 16-bit activations stay 16-bit (mixed precision): the product is rounded once into X's type.
        if not is_half(X.dtype) or X.ndim != 2:
            return None
        return self.xp.empty((rows, X.shape[1]), dtype=X.dtype)

    def spmm(self, X, values=None):
        return self.dist.matmul(X, values=values, precision=self.precision, out=self._out(X, self.dist.n_own))

    def spmm_t(self, X, values=None):
        return self.dist.rmatmul_t(X, values=values, precision=self.precision)

    def sddmm(self, Xa, Xb):
        return self.dist.sddmm(Xa, Xb, precision=self.precision)

    def columns(self, x):
        """``[x | halo rows of x]``: this rank's rows of a per-node array, extended to the local columns."""
        return self.xp.concatenate([x, self.dist.exchange(x)])

    def row_sums(self, v):
        """``sum_j v_ij`` per row (own and halo entries; exact, deterministic)."""
        ones = self.cached(("ones", v.dtype.str), lambda: self.xp.ones((self.dist.n_own, 1), dtype=v.dtype))
        return self.dist.matmul(ones, values=v, precision="fp32")[:, 0]

    def col_sums(self, v):
        """``sum_i v_ij`` per column this rank owns: the halo columns' partial sums go back to their owners."""
        ones = self.cached(("ones", v.dtype.str), lambda: self.xp.ones((self.dist.n_own, 1), dtype=v.dtype))
        return self.dist.rmatmul_t(ones, values=v, precision="fp32")[:, 0]


def check_replicated(ctx, params):
    """``ValueError`` on every rank unless ``params`` (a dict of arrays) are the same on every rank: the same
    names, shapes and bits.  Training keeps replicas equal only if they start equal (one seed for all ranks)."""
    names = sorted(params)
    head = ctx.allgather(ctx.xp.asarray([len(names), digest(np.array(names, dtype=str))], np.int64))
    head = host_array(head)  # synchronize!
    if (head != head[0]).any():
        raise ValueError("train: the ranks' params have different names; every rank must pass the same parameters")
    mine = ctx.xp.asarray([digest(params[k]) for k in names], np.int64)
    every = host_array(ctx.allgather(mine))  # synchronize!
    differ = [k for i, k in enumerate(names) if (every[:, i] != every[0, i]).any()]
    if differ:
        ranks = sorted({int(q) for q in np.nonzero((every != every[0]).any(axis=1))[0]})
        raise ValueError(f"train: params {differ} differ between ranks (ranks {ranks} differ from rank 0); every "
                         "rank must start from the same values, e.g. the same seed")


def allreduce_grads(ctx, grads, *extra):
    """Sum ``grads`` (a dict of arrays) and the scalars ``extra`` over the ranks in one all-reduce.

    Returns ``(grads, extra_sums)``; the gradients are replaced by the sums (same dtypes).
    """
    xp = ctx.xp
    keys = sorted(grads)
    dtype = np.result_type(*[grads[k].dtype for k in keys]) if keys else np.float32
    flat = xp.concatenate([grads[k].astype(dtype, copy=False).ravel() for k in keys]
                          + [xp.asarray(e, dtype=dtype).reshape(1) for e in extra])
    ctx.allreduce(flat)
    out, at = {}, 0
    for k in keys:
        g = grads[k]
        out[k] = flat[at:at + g.size].reshape(g.shape).astype(g.dtype, copy=False)
        at += g.size
    return out, flat[at:]


@dataclasses.dataclass
class DistTrainResult:
    """What :func:`train` measured, the same on every rank: accuracies over all ranks' nodes.

    ``epoch_times``: seconds per training step on this rank (CUDA events on the GPU, host clock on
    the reference backend); a step ends with the gradients' all-reduce, so it includes the slowest rank.
    """

    test_acc: float
    val_acc: float
    best_epoch: int
    final_loss: float
    epoch_times: list

    @property
    def epoch_time(self):
        """Median seconds per training epoch."""
        return float(np.median(self.epoch_times)) if self.epoch_times else float("nan")


def train(ctx, apply, params, A, X, labels, split, optimizer, *, epochs=200, rng=None, dropout_p=0.5,
          precision=None, evaluate=True):
    """Full-batch training of ``apply`` (e.g. :func:`tcgnn_py.nn.gcn_apply`) on a row-partitioned graph.

    Each rank passes its own rows: ``A`` a :class:`DistributedMatrix` (or its :class:`DistributedEdges`),
    ``X`` and ``labels`` its rows of the features and labels (``X[D.global_rows]``), ``split`` its
    ``(train, val, test)`` node indices in local numbering.  ``params`` start equal on every rank
    (same seed) and stay equal: the loss is the mean over all ranks' training nodes, and the
    gradients are all-reduced before ``optimizer.step``; parameters that differ between ranks when training
    starts raise ``ValueError`` (a checksum of each, compared over the ranks).

    Returns a :class:`DistTrainResult` (the same accuracies on every rank).

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> from tcgnn_py import distributed as dist
    >>> g = tg.load_cora()
    >>> S = tg.nn.gcn_norm(g.adj).tocsr()
    >>> X = g.features.toarray().astype(np.float32)
    >>> def rank(ctx):
    ...     D = dist.DistributedMatrix(S, ctx, partition="metis")
    ...     rows = D.global_rows  # this rank's vertices
    ...     local = dist.local_indices(D, (g.train_idx, g.val_idx, g.test_idx))
    ...     params = tg.nn.gcn_init((X.shape[1], 16, 7), np.random.default_rng(0))
    ...     opt = tg.nn.Adam(params, lr=0.01, weight_decay={"W0": 5e-4, "b0": 5e-4})
    ...     return dist.train(ctx, tg.nn.gcn_apply, params, D, X[rows], g.labels[rows], local, opt,
    ...                       epochs=30, rng=np.random.default_rng(ctx.rank))
    >>> r = dist.spmd(rank, 2, backend="reference")
    >>> r[0].test_acc == r[1].test_acc and 0.6 < r[0].test_acc <= 1
    True
    """
    E = A if isinstance(A, DistributedEdges) else DistributedEdges(A, precision)
    xp = ctx.xp
    X = xp.asarray(X)
    labels = xp.asarray(labels)
    if labels.shape != (E.shape[0],):
        raise ValueError(f"labels has {labels.size} entries, this rank has {E.shape[0]} rows (its rows of the labels: "
                         "labels[D.global_rows])")
    check_replicated(ctx, params)
    train_idx, val_idx, test_idx = (xp.asarray(i, dtype=np.int64) for i in split)
    sizes = np.asarray([int(i.shape[0]) for i in (train_idx, val_idx, test_idx)], np.int64)
    totals = host_array(ctx.allgather(xp.asarray(sizes)).sum(axis=0))  # synchronize!
    n_train = int(totals[0])
    if n_train == 0:
        raise ValueError("no rank has training nodes")
    share = sizes[0] / n_train  # this rank's weight in the global mean

    def step():
        logits, vjp = apply(params, E, X, rng=rng, dropout_p=dropout_p, training=True)
        if sizes[0]:
            loss, dlogits = cross_entropy(logits, labels, train_idx)
            dlogits *= dlogits.dtype.type(share)
            loss = loss * share
        else:
            loss, dlogits = xp.zeros((), logits.dtype), xp.zeros_like(logits)
        grads, (total_loss,) = allreduce_grads(ctx, vjp(dlogits), loss)
        optimizer.step(grads)
        return total_loss

    def score():
        logits, _ = apply(params, E, X, training=False)
        pred = logits.argmax(axis=1)
        hits = xp.stack([(pred[i] == labels[i]).sum() for i in (val_idx, test_idx)]).astype(np.int64)
        return ctx.allreduce(hits)

    on_device = xp is not np
    times, scores, loss = [], [], None
    for _ in range(epochs):
        if on_device:
            t0, t1 = xp.cuda.Event(), xp.cuda.Event()
            t0.record()
        else:
            h0 = time.perf_counter()
        loss = step()
        if on_device:
            t1.record()
            times.append((t0, t1))
        else:
            times.append(time.perf_counter() - h0)
        if evaluate:
            scores.append(score())
    ctx.synchronize()
    if on_device:
        times = [xp.cuda.get_elapsed_time(a, b) / 1e3 for a, b in times]
    final_loss = float(loss) if loss is not None else float("nan")  # synchronize!
    if not scores:
        return DistTrainResult(float("nan"), float("nan"), -1, final_loss, times)
    s = host_array(xp.stack(scores)).astype(np.float64)  # synchronize!
    acc = s / np.maximum(totals[1:], 1)
    best = int(np.argmax(acc[:, 0]))
    return DistTrainResult(float(acc[best, 1]), float(acc[best, 0]), best, final_loss, times)
