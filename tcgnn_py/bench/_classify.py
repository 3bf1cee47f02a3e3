"""Layer 4 (bench): graph classification on batches of small graphs (a folder like ``proteins_full``: one
block-diagonal ``adj_csr.npz`` of every graph, ``graph_indicator.npy``, ``graph_labels.npy``, node labels).

Every step joins a batch of :data:`BATCH` graphs into one block-diagonal graph and normalises it (Kipf & Welling): a
new matrix every step.  The model is ``examples/graph_classification.py``'s: :data:`LAYERS` GCN layers of
:data:`HIDDEN` features with ReLU, each graph's mean, a linear classifier, Adam (lr 0.01); node features the one-hot
node label and the degree / 10; the graphs split 80 / 20, seeded.  Per implementation, the milliseconds per training
epoch (median over the epochs, after an untimed epoch of a model of its own and every background compile: a training
loop of many epochs compiles once; the implementations' epochs in turn, so that a host whose speed drifts slows each
alike) and the test accuracy after them, as the mean (and standard deviation) over :data:`SEEDS` seeded splits and
initialisations -- one split's test set of a few hundred graphs moves by points from seed to seed:

* ``tcgnn_py``: ``nn.gcn_norm(..., format="csr")`` of the batch (a :class:`~tcgnn_py.nn.RowEdges`: the library's
  CSR kernel, the batch's matrix never translated into tiles) and this library's layers;
* ``tcgnn_py tiled``: ``nn.gcn_norm`` of the batch as a :class:`~tcgnn_py.TiledMatrix` (translated every step,
  tensor-core products);
* ``cupyx`` (``scipy`` on the host): the same layers over the batch's CSR, normalised with CSR operations -- what
  a CuPy user would write;
* the ``--baselines`` file's ``classify_builders()``: another framework's model of the same widths on the same
  batches of graph ids (PyG's ``DataLoader`` batching and ``GCNConv`` layers, say).
"""

import pathlib
import statistics
import time

import numpy as np

__all__ = ["bench_classify", "classify_markdown", "classify_problem", "BATCH", "HIDDEN", "LAYERS", "EPOCHS", "SEEDS"]

#: Graphs per step.
BATCH = 64
#: Features of the GCN layers.
HIDDEN = 64
#: GCN layers before the readout.
LAYERS = 3
#: Training epochs per implementation (the accuracy is the test set's after them).
EPOCHS = 20
#: Seeds (splits and initialisations) the accuracy is averaged over; the first one's epochs are the timed ones.
SEEDS = 5


def classify_problem(spec, seed=0):
    """The graphs of a folder (a name under the data roots, or a path): ``name, graphs`` (scipy CSR, one per
    graph), ``X`` (float32, per node), ``ptr`` (node offsets), ``labels`` (per graph, from 0), ``n_classes``,
    ``train``, ``test`` (graph ids, 80 / 20) and the ``seed`` that split them (a model's initialisation takes it
    too)."""
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
    return _split({"name": folder.name, "graphs": graphs, "X": X, "ptr": ptr, "labels": labels,
                   "n_classes": int(labels.max()) + 1}, seed)


def _split(problem, seed):
    """The problem with its graphs split 80 / 20 by ``seed`` (and that seed kept)."""
    order = np.random.default_rng(seed).permutation(len(problem["graphs"]))
    n_train = int(0.8 * len(order))
    return dict(problem, train=order[:n_train], test=order[n_train:], seed=seed)


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


def _trainer(problem, fmt, device):
    """``step(ids, learn) -> (loss, correct)``: the model on the graphs ``ids`` (forward; backward and Adam where
    ``learn``), its matrix a ``TiledMatrix`` (``fmt="tiled"``), a ``RowEdges`` (``"rows"``) or the batch's CSR
    through cupyx or scipy (``"csr"``), initialised by the problem's seed."""
    from .. import nn
    from ..nn import CSREdges

    xp = np
    if device == "cuda":
        import cupy as xp
    graphs, X, ptr, labels, seed = (problem[k] for k in ("graphs", "X", "ptr", "labels", "seed"))
    rng = np.random.default_rng(seed)
    params = {k: xp.asarray(v) for k, v in nn.gcn_init((X.shape[1],) + (HIDDEN,) * LAYERS, rng).items()}
    params["Wo"] = xp.asarray(nn.glorot((HIDDEN, problem["n_classes"]), np.random.default_rng(seed + 1)))
    params["bo"] = xp.zeros(problem["n_classes"], np.float32)
    opt = nn.Adam(params, lr=0.01)

    def step(ids, learn):
        b = nn.batch([graphs[k] for k in ids])
        if fmt != "csr":
            A = nn.gcn_norm(b.adj, device=device, format="csr" if fmt == "rows" else "tiled")  # (new every step)
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


def bench_classify(spec, epochs=EPOCHS, device=None, extra=None, seed=0, seeds=SEEDS):
    """Rows ``{graph, graphs, impl, ms, accuracy, accuracy_sd, seeds}``: each implementation's milliseconds per
    training epoch (median, with the first split and initialisation; the implementations' epochs timed in turn)
    and its test accuracy after ``epochs`` epochs, the mean and standard deviation over ``seeds`` seeds from
    ``seed``; the graphs shuffled per epoch (seeded, the same order for every implementation).

    ``extra`` maps another framework's name to ``build(problem, hidden, layers) -> step(ids, learn)`` or None
    (the ``--baselines`` file's ``classify_builders()``), ``step`` returning ``(loss, correct)`` as here; a build
    makes a new model, initialised by ``problem["seed"]``.
    """
    from .._device import use_gpu
    from ..kernels.registry import wait_for_compiles

    gpu = use_gpu(device)
    device = "cuda" if gpu else "cpu"
    sync = no_sync = lambda: None  # noqa: E731
    if gpu:
        import cupy

        sync = cupy.cuda.Device().synchronize  # (every stream: another framework's too)
    problems = [classify_problem(spec, seed)]
    problems += [_split(problems[0], seed + s) for s in range(1, seeds)]
    makers = [("tcgnn_py", lambda p: _trainer(p, "rows", device)),
              ("tcgnn_py tiled", lambda p: _trainer(p, "tiled", device)),
              ("cupyx" if gpu else "scipy", lambda p: _trainer(p, "csr", device))]
    makers += [(name, lambda p, build=build: build(p, HIDDEN, LAYERS)) for name, build in (extra or {}).items()]
    first = problems[0]
    for impl, make in list(makers):
        warm = make(first)
        if warm is None:
            makers.remove((impl, make))
            continue
        next(_epochs(warm, first, sync))  # (untimed: compiles, and starts what compiles in the background)
    wait_for_compiles()
    # The first seed's models, timed an epoch of each in turn: a host whose speed drifts slows every one alike.
    steps = {impl: make(first) for impl, make in makers}
    running = {impl: _epochs(step, first, sync) for impl, step in steps.items()}
    times = {impl: [] for impl in steps}
    for _ in range(epochs):
        for impl, run in running.items():
            times[impl].append(next(run))
    rows = []
    for impl, make in makers:
        accuracies = [_accuracy_of(steps[impl], first)]
        for problem in problems[1:]:
            step = make(problem)
            run = _epochs(step, problem, no_sync)
            for _ in range(epochs):
                next(run)
            accuracies.append(_accuracy_of(step, problem))
        rows.append({"graph": first["name"], "graphs": len(first["graphs"]), "impl": impl,
                     "ms": statistics.median(times[impl]), "accuracy": statistics.mean(accuracies),
                     "accuracy_sd": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
                     "seeds": len(accuracies)})
    return rows


def _epochs(step, problem, sync):
    """Training epochs of ``step``, one per ``next()``, which returns its milliseconds; the training graphs are
    shuffled per epoch by the problem's seed."""
    order = np.random.default_rng(problem["seed"])
    train = problem["train"].copy()
    while True:
        order.shuffle(train)
        sync()
        t0 = time.perf_counter()
        for s in range(0, len(train), BATCH):
            step(train[s:s + BATCH], True)
        sync()
        yield 1e3 * (time.perf_counter() - t0)


def _accuracy_of(step, problem):
    """The share of the problem's test graphs that ``step`` classifies right."""
    test = problem["test"]
    return sum(step(test[s:s + BATCH], False)[1] for s in range(0, len(test), BATCH)) / len(test)


def _accuracy(row):
    """``72.2 %``, or over seeds ``72.2 ± 2.0 %`` (mean and standard deviation)."""
    sd = f" ± {100 * row['accuracy_sd']:.1f}" if row.get("seeds", 1) > 1 else ""
    return f"{100 * row['accuracy']:.1f}{sd} %"


def classify_markdown(rows):
    """Table: per folder, each implementation's milliseconds per epoch and test accuracy (over seeds: the mean ±
    the standard deviation), with this library's speedup over each other."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    others = [i for i in impls if i != "tcgnn_py"]
    lines = ["| graphs | count | " + " | ".join(f"epoch ms {i} (accuracy)" for i in impls) + " | "
             + " | ".join(f"× {i}" for i in others) + " |", "|---|---|" + "---|" * (len(impls) + len(others))]
    for g in dict.fromkeys(r["graph"] for r in rows):
        mine = {r["impl"]: r for r in rows if r["graph"] == g}
        cells = [f"{mine[i]['ms']:.1f} ({_accuracy(mine[i])})" if i in mine else "–" for i in impls]
        ours = mine.get("tcgnn_py")
        ratios = [f"{mine[i]['ms'] / ours['ms']:.2f}×" if ours and i in mine else "–" for i in others]
        count = next(iter(mine.values()))["graphs"]
        lines.append(f"| {g} | {count:,} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)
