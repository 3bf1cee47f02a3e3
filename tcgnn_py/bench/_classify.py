"""Layer 4 (bench): graph classification on batches of small graphs (a folder like ``proteins_full``: one
block-diagonal ``adj_csr.npz`` of every graph, ``graph_indicator.npy``, ``graph_labels.npy``, node labels).

Every step joins a batch of :data:`BATCH` graphs into one block-diagonal graph and normalises it (Kipf & Welling):
a new matrix every step.  The model is ``examples/graph_classification.py``'s: :data:`LAYERS` GCN layers of
:data:`HIDDEN` features with ReLU, each graph's mean, a linear classifier, Adam (lr 0.01); node features the
one-hot node label and the degree / 10; the graphs split 80 / 20, seeded.  Per implementation, the milliseconds
per training epoch (median over the epochs) and the test accuracy after them:

* ``tcgnn_py``: ``nn.gcn_norm`` of the batch (a :class:`~tcgnn_py.TiledMatrix`) and this library's products;
* ``cupyx`` (``scipy`` on the host): the same layers over the batch's CSR, normalised with CSR operations -- what
  a CuPy user would write;
* the ``--baselines`` file's ``classify_builders()``: another framework's model of the same widths on the same
  batches of graph ids (PyG's ``DataLoader`` batching and ``GCNConv`` layers, say).
"""

import pathlib
import statistics
import time

import numpy as np

__all__ = ["bench_classify", "classify_markdown", "classify_problem", "BATCH", "HIDDEN", "LAYERS", "EPOCHS"]

#: Graphs per step.
BATCH = 64
#: Features of the GCN layers.
HIDDEN = 64
#: GCN layers before the readout.
LAYERS = 3
#: Training epochs per implementation (the accuracy is the test set's after them).
EPOCHS = 20


def classify_problem(spec, seed=0):
    """The graphs of a folder (a name under the data roots, or a path): ``name, graphs`` (scipy CSR, one per
    graph), ``X`` (float32, per node), ``ptr`` (node offsets), ``labels`` (per graph, from 0), ``n_classes``,
    ``train``, ``test`` (graph ids, 80 / 20)."""
    from .._io import load_graph
    from ._graphs import data_roots

    folder = pathlib.Path(spec)
    if not (folder / "graph_indicator.npy").exists():
        folder = next((root / spec for root in data_roots() if (root / spec / "graph_indicator.npy").exists()), None)
    if folder is None:
        raise FileNotFoundError(f"no graph-classification folder {spec!r} (adj_csr.npz, graph_indicator.npy, "
                                f"graph_labels.npy) under {[str(r) for r in data_roots()]}")
    g = load_graph(folder)
    indicator = np.load(folder / "graph_indicator.npy")
    labels = np.load(folder / "graph_labels.npy").astype(np.int64)
    labels -= labels.min()
    ptr = np.concatenate([[0], np.cumsum(np.bincount(indicator))])
    A = g.adj.tocsr()
    node_labels = g.labels if g.labels is not None else np.zeros(A.shape[0], np.int64)
    degree = np.diff(A.indptr)
    X = np.concatenate([np.eye(int(node_labels.max()) + 1, dtype=np.float32)[node_labels],
                        (degree / 10)[:, None]], axis=1).astype(np.float32)
    graphs = [A[ptr[k]:ptr[k + 1]][:, ptr[k]:ptr[k + 1]] for k in range(len(ptr) - 1)]
    order = np.random.default_rng(seed).permutation(len(graphs))
    n_train = int(0.8 * len(graphs))
    return {"name": folder.name, "graphs": graphs, "X": X, "ptr": ptr, "labels": labels,
            "n_classes": int(labels.max()) + 1, "train": order[:n_train], "test": order[n_train:]}


def _csr_norm(A, xp):
    """``D^-1/2 (A + I) D^-1/2`` of a scipy or cupyx CSR matrix with CSR operations (float32)."""
    if xp is np:
        import scipy.sparse as sparse
    else:
        import cupyx.scipy.sparse as sparse
    n = A.shape[0]
    A = sparse.csr_matrix(A, dtype=np.float32) + sparse.identity(n, dtype=np.float32, format="csr")
    A = sparse.csr_matrix(A)
    d = xp.asarray(A.sum(axis=1)).ravel()
    s = xp.where(d > 0, 1 / xp.sqrt(xp.maximum(d, 1e-30)), 0).astype(np.float32)
    rows = xp.searchsorted(A.indptr, xp.arange(A.nnz), side="right") - 1
    return sparse.csr_matrix((A.data * s[rows] * s[A.indices], A.indices, A.indptr), shape=(n, n))


def _trainer(problem, fmt, device, seed=0):
    """``step(ids, learn) -> (loss, correct)``: the model on the graphs ``ids`` (forward; backward and Adam where
    ``learn``), its matrix a ``TiledMatrix`` (``fmt="tiled"``) or the batch's CSR (``"csr"``)."""
    from .. import nn
    from ..nn import CSREdges

    xp = np
    if device == "cuda":
        import cupy as xp
    graphs, X, ptr, labels = problem["graphs"], problem["X"], problem["ptr"], problem["labels"]
    rng = np.random.default_rng(seed)
    params = {k: xp.asarray(v) for k, v in nn.gcn_init((X.shape[1],) + (HIDDEN,) * LAYERS, rng).items()}
    params["Wo"] = xp.asarray(nn.glorot((HIDDEN, problem["n_classes"]), np.random.default_rng(seed + 1)))
    params["bo"] = xp.zeros(problem["n_classes"], np.float32)
    opt = nn.Adam(params, lr=0.01)

    def step(ids, learn):
        b = nn.batch([graphs[k] for k in ids])
        if fmt == "tiled":
            A = nn.gcn_norm(b.adj, device=device)  # a new matrix every step
        else:
            adj = b.adj
            if device == "cuda":
                import cupyx.scipy.sparse as csp

                adj = csp.csr_matrix(adj)
            A = CSREdges(_csr_norm(adj, xp))
        H = xp.asarray(np.concatenate([X[ptr[k]:ptr[k + 1]] for k in ids]))
        y = xp.asarray(labels[ids])
        vjps = []
        for i in range(LAYERS):
            H, conv = nn.gcn_conv(A, H, params[f"W{i}"], params[f"b{i}"])
            H, act = nn.relu(H)
            vjps.append((conv, act))
        pooled, pool = nn.readout(H, b.ptr, "mean")
        logits, head = nn.linear(pooled, params["Wo"], params["bo"])
        loss, dlogits = nn.cross_entropy(logits, y)
        correct = int((logits.argmax(axis=1) == y).sum())  # synchronize!
        if learn:
            grads = {}
            dpooled, grads["Wo"], grads["bo"] = head(dlogits)
            dH = pool(dpooled)
            for i in reversed(range(LAYERS)):
                conv, act = vjps[i]
                dH, grads[f"W{i}"], grads[f"b{i}"] = conv(act(dH), input_grad=i > 0)
            opt.step(grads)
        return float(loss), correct

    return step


def bench_classify(spec, epochs=EPOCHS, device=None, extra=None, seed=0):
    """Rows ``{graph, graphs, impl, ms, accuracy}``: each implementation's milliseconds per training epoch
    (median) and its test accuracy after ``epochs`` epochs, the graphs shuffled per epoch (seeded, the same order
    for every implementation).

    ``extra`` maps another framework's name to ``build(problem, hidden, layers) -> step(ids, learn)`` or None
    (the ``--baselines`` file's ``classify_builders()``), ``step`` returning ``(loss, correct)`` as here.
    """
    from .._device import use_gpu

    gpu = use_gpu(device)
    device = "cuda" if gpu else "cpu"
    sync = lambda: None  # noqa: E731
    if gpu:
        import cupy

        sync = cupy.cuda.Device().synchronize  # (every stream: another framework's too)
    problem = classify_problem(spec, seed)
    impls = [("tcgnn_py", _trainer(problem, "tiled", device, seed)),
             ("cupyx" if gpu else "scipy", _trainer(problem, "csr", device, seed))]
    for name, build in (extra or {}).items():
        step = build(problem, HIDDEN, LAYERS)
        if step is not None:
            impls.append((name, step))
    rows = []
    for impl, step in impls:
        order = np.random.default_rng(seed)
        train, test = problem["train"].copy(), problem["test"]
        times = []
        for _ in range(epochs):
            order.shuffle(train)
            sync()
            t0 = time.perf_counter()
            for s in range(0, len(train), BATCH):
                step(train[s:s + BATCH], True)
            sync()
            times.append(1e3 * (time.perf_counter() - t0))
        correct = sum(step(test[s:s + BATCH], False)[1] for s in range(0, len(test), BATCH))
        rows.append({"graph": problem["name"], "graphs": len(problem["graphs"]), "impl": impl,
                     "ms": statistics.median(times[1:] or times), "accuracy": correct / len(test)})
    return rows


def classify_markdown(rows):
    """Table: per folder, each implementation's milliseconds per epoch and test accuracy, with this library's
    speedup over each other."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    others = [i for i in impls if i != "tcgnn_py"]
    lines = ["| graphs | count | " + " | ".join(f"epoch ms {i} (accuracy)" for i in impls) + " | "
             + " | ".join(f"× {i}" for i in others) + " |", "|---|---|" + "---|" * (len(impls) + len(others))]
    for g in dict.fromkeys(r["graph"] for r in rows):
        mine = {r["impl"]: r for r in rows if r["graph"] == g}
        cells = [f"{mine[i]['ms']:.1f} ({100 * mine[i]['accuracy']:.1f} %)" if i in mine else "–" for i in impls]
        ours = mine.get("tcgnn_py")
        ratios = [f"{mine[i]['ms'] / ours['ms']:.2f}×" if ours and i in mine else "–" for i in others]
        count = next(iter(mine.values()))["graphs"]
        lines.append(f"| {g} | {count:,} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)
