"""Reorder a graph once for locality, train a GCN in the new order, map the predictions back.

The locality reorder renumbers the vertices so that the rows of each tensor-core
window share columns (fewer X rows gathered per product).  ``Graph.permute``
moves the adjacency, features, labels and split together, so the whole
pipeline runs in the new order; ``perm.undo_rows`` brings per-vertex results
back.  The example trains the same GCN in both orders and prints the column
sharing, the reorder's time and the epoch time before and after.

    python examples/locality_gcn.py                                   # bundled Cora
    python examples/locality_gcn.py --graph ../shared/data/facebook_pagepage
    python examples/locality_gcn.py --device cpu --epochs 30 --min-accuracy 0.6

A graph folder needs ``labels.npy``; without a split, one is drawn (20 training
vertices per class, 500 validation, 1000 test); without features, one-hot
degree buckets are used.
"""

import numpy as np
from _common import device_name, parse_args

args = parse_args(__doc__.splitlines()[0], training=True, extra=lambda p: (
    p.add_argument("--graph", default=None, help="a graph folder (adj_csr.npz, labels.npy, ...); default: Cora"),
    p.add_argument("--layout", choices=("tcgnn", "vector"), default="vector", help="tensor-core layout to order for"),
))

import tcgnn_py as tg  # noqa: E402  (after --device has set TCGNN_PY_DEVICE)

nn = tg.nn


def load():
    g = tg.load_cora() if args.graph is None else tg.load_graph(args.graph)
    if g.labels is None or g.labels.ndim != 1:
        raise SystemExit(f"{g.name}: needs single-label labels.npy")
    rng = np.random.default_rng(args.seed)
    if g.train_idx is None:  # a Planetoid-style split
        classes = np.unique(g.labels[g.labels >= 0])
        train = np.concatenate([rng.permutation(np.flatnonzero(g.labels == c))[:20] for c in classes])
        rest = rng.permutation(np.setdiff1d(np.flatnonzero(g.labels >= 0), train))
        g.train_idx, g.val_idx, g.test_idx = np.sort(train), np.sort(rest[:500]), np.sort(rest[500:1500])
    if g.features is None:  # one-hot log2-degree buckets
        deg = np.diff(g.adj.indptr)
        X = np.eye(32, dtype=np.float32)[np.minimum(np.log2(np.maximum(deg, 1)).astype(int), 31)]
    else:
        X = g.features.toarray().astype(np.float32)
        X /= np.maximum(X.sum(axis=1, keepdims=True), 1)
    return g, X


def run(g, X):
    """Train the GCN of examples/gcn_cora.py on ``g``; return the result and the test predictions."""
    A = nn.gcn_norm(g.adj, layout=args.layout)
    rng = nn.default_rng(args.seed, like=A)
    params = nn.gcn_init((X.shape[1], 16, int(g.labels.max()) + 1), rng)
    opt = nn.Adam(params, lr=0.01, weight_decay={"W0": 5e-4, "b0": 5e-4})
    r = nn.train(nn.gcn_apply, params, A, X, g.labels, (g.train_idx, g.val_idx, g.test_idx), opt,
                 epochs=args.epochs, rng=rng, dropout_p=0.5)
    logits, _ = nn.gcn_apply(params, A, X, training=False)
    pred = logits.argmax(axis=1)
    return r, A, (pred.get() if hasattr(pred, "get") else np.asarray(pred))


g, X = load()
r0, A0, pred0 = run(g, X)

p = tg.reorder(g.adj, "locality", layout=args.layout)  # once, for the whole pipeline
h = g.permute(p)  # adjacency, features, labels and split in the new order
r1, A1, pred1 = run(h, p.apply_rows(X))
pred_back = p.undo_rows(pred1)  # predictions in the original vertex order
acc_back = float((pred_back[g.test_idx] == g.labels[g.test_idx]).mean())

rep = p.report
print(f"GCN on {g.name} ({g.adj.shape[0]:,} vertices, {g.adj.nnz:,} entries), {device_name(A0)}, "
      f"{args.layout} layout, {args.epochs} epochs")
print(f"  locality reorder: {rep.method} order, {rep.time_s:.3f} s; U/nnz {rep.initial[args.layout].pairs_per_nnz:.3f}"
      f" -> {rep[args.layout].pairs_per_nnz:.3f}; tile density {100 * rep.initial[args.layout].density:.1f}% -> "
      f"{100 * rep[args.layout].density:.1f}%")
print(f"  original order:  time per epoch {1e3 * r0.epoch_time:.3f} ms, test accuracy {100 * r0.test_acc:.1f}%")
print(f"  reordered:       time per epoch {1e3 * r1.epoch_time:.3f} ms, test accuracy {100 * r1.test_acc:.1f}% "
      f"(last epoch's predictions mapped back: {100 * acc_back:.1f}%)")
print(f"  epoch speedup {r0.epoch_time / r1.epoch_time:.2f}x")
assert abs(acc_back - r1.final_test_acc) < 1e-9, "mapped-back predictions disagree with the reordered run"
for r in (r0, r1):
    assert r.test_acc >= args.min_accuracy, f"test accuracy {r.test_acc:.3f} < {args.min_accuracy}"
