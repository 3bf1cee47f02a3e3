"""Train GraphSAGE on neighbor-sampled mini-batches: every step samples new blocks around a batch of nodes.

A batch of training nodes samples at most 10 neighbors of each (hop 1) and 5 of each node hop 1 reached (hop 2)
(``tg.nn.NeighborLoader``: uniform without replacement, seeded, the next batch sampled while this one trains
with ``--prefetch``); two GraphSAGE layers with the mean aggregator (``tg.nn.sage_conv``, 64 hidden features,
ReLU, dropout 0.5) run on the two bipartite blocks, input hop first; the loss is the seeds' cross-entropy, Adam
(lr 0.01, weight decay 5e-4) updates the weights.  Validation and test nodes are classified on all their
neighbors (fanout -1), in batches; the model of the best validation epoch is the one tested.

    python examples/sage_sampled.py                                   # GPU if usable, Cora
    python examples/sage_sampled.py --device cpu --epochs 20 --min-accuracy 0.7
    python examples/sage_sampled.py --graph citeseer                  # a labelled graph under the data roots
    python examples/sage_sampled.py --graph synthetic:1000000 --batch-size 1024 --epochs 5 --min-accuracy 0.5

``--graph synthetic:N``: N nodes in 16 planted communities (10 entries a node, 80 % inside), the community as
the label, 32 features (a weak one-hot of the label under unit noise); training nodes N / 20 (at least 10,000
where N allows), validation and test 10,000 each (or N / 10).  Its bar is lower than a real graph's: the
features are weak by design, and chance is 1 in 16.
"""

import os
import pathlib
import time

from _common import parse_args


def extra(p):
    p.add_argument("--graph", default="cora", help="a graph folder name under $TCGNN_PY_DATA, .gpu/data or "
                   "../shared/data with labels (cora: the bundled copy where none has it), or synthetic:N")
    p.add_argument("--fanouts", default="10,5", help="neighbors sampled per hop, from the seeds out (default 10,5)")
    p.add_argument("--batch-size", type=int, default=64, help="seed nodes per step (default 64)")
    p.add_argument("--prefetch", action="store_true", help="sample the next batch on a worker thread")


args = parse_args(__doc__.splitlines()[0], training=True, default_min_acc=0.75, extra=extra)
if args.dtype != "float32" or args.cuda_graph:
    raise SystemExit("sage_sampled.py: float32 only, and no --cuda-graph (every step is a new set of blocks)")

import numpy as np  # noqa: E402

import tcgnn_py as tg  # noqa: E402

nn = tg.nn
root = pathlib.Path(__file__).resolve().parents[1]
roots = [pathlib.Path(p)
         for p in (os.environ.get("TCGNN_PY_DATA"), root / ".gpu" / "data", root.parent / "shared" / "data") if p]
if args.graph.startswith("synthetic:"):
    # planted communities (10 entries a node, 80 % inside a community), the community as the label, features a
    # weak one-hot of it under unit noise: what a node's neighbors share is what makes it learnable
    n, C = int(args.graph.split(":")[1]), 16
    A = tg.planted_partition_graph(n, 10 * n, communities=C, p_in=0.8, seed=args.seed, shuffle=False)
    labels = (np.arange(n, dtype=np.int64) * C) // n
    rs = np.random.default_rng(args.seed)
    X = rs.standard_normal((n, 32), dtype=np.float32)
    X[np.arange(n), labels] += 0.5
    order = rs.permutation(n)
    k = min(n // 10, 10_000)
    train, val, test = order[2 * k:2 * k + max(k, n // 20)], order[:k], order[k:2 * k]
else:
    folder = next((r / args.graph for r in roots if (r / args.graph / "adj_csr.npz").exists()), None)
    g = tg.load_graph(folder) if folder is not None else tg.load_graph(args.graph)
    if g.labels is None or g.features is None:
        raise SystemExit(f"sage_sampled.py: graph {args.graph!r} has no labels or no features")
    A = g.adj.tocsr()
    X = g.features.toarray().astype(np.float32)
    X /= np.maximum(X.sum(axis=1, keepdims=True), 1)
    labels = g.labels.astype(np.int64)
    n = A.shape[0]
    if g.train_idx is not None:
        train, val, test = g.train_idx, g.val_idx, g.test_idx
    else:  # a seeded 60 / 20 / 20 split of the labelled nodes
        order = np.random.default_rng(args.seed).permutation(np.flatnonzero(labels >= 0))
        k = len(order) // 5
        train, val, test = order[2 * k:], order[:k], order[k:2 * k]
fanouts = [int(f) for f in args.fanouts.split(",")]

probe = nn.gcn_norm(A[:2][:, :2])
on_gpu = probe.device == "cuda"
xp = np
if on_gpu:
    import cupy as xp
device = "cuda" if on_gpu else "cpu"
Xd, yd = xp.asarray(X), xp.asarray(labels)
rng = nn.default_rng(args.seed, like=probe)
dims = (X.shape[1], 64, int(labels.max()) + 1)
params = nn.sage_init(dims, rng)
opt = nn.Adam(params, lr=0.01, weight_decay=5e-4)
loader = nn.NeighborLoader(A, train, fanouts, args.batch_size, seed=args.seed, device=device, prefetch=args.prefetch)


def forward(blocks, training):
    """Logits of the last block's destinations, and the backward pass (grads by name)."""
    return nn.sage_apply(params, blocks, Xd[blocks[0].src], p=0.5, rng=rng, training=training)


def evaluate(nodes):
    """Accuracy on ``nodes``, each seeing all its neighbors (batched)."""
    right = 0
    for seeds, blocks in nn.NeighborLoader(A, nodes, [-1] * len(fanouts), 512, shuffle=False, device=device):
        logits, _ = forward(blocks, training=False)
        right += int((logits.argmax(axis=1) == yd[blocks[-1].dst]).sum())  # synchronize!
    return right / len(nodes)


best, times = (-1.0, 0.0, 0), []
for epoch in range(args.epochs):
    start = time.perf_counter()
    for seeds, blocks in loader:
        logits, backward = forward(blocks, training=True)
        loss, dlogits = nn.cross_entropy(logits, yd[blocks[-1].dst])
        opt.step(backward(dlogits))
    if on_gpu:
        xp.cuda.Device().synchronize()
    times.append(time.perf_counter() - start)
    val_acc = evaluate(val)
    if val_acc > best[0]:
        best = (val_acc, evaluate(test), epoch)
print(f"GraphSAGE on {args.graph}, sampled {fanouts}, batches of {args.batch_size}, "
      f"{'GPU (CuPy, tensor cores)' if on_gpu else 'CPU (NumPy reference path)'}: {args.epochs} epochs")
print(f"  test accuracy {100 * best[1]:.1f}% (epoch {best[2] + 1}, best validation {100 * best[0]:.1f}%); "
      f"last loss {float(loss):.3f}")
print(f"  time per epoch {1e3 * float(np.median(times)):.1f} ms ({len(loader)} sampled steps)")
assert best[1] >= args.min_accuracy, f"test accuracy {best[1]:.3f} < {args.min_accuracy}"
