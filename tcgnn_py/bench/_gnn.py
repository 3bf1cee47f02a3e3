"""Layer 4 (bench): Time per training epoch of the GCN, AGNN and GAT models: tcgnn_py beside the same model on cupyx.

Both run the layers of :mod:`tcgnn_py.nn`; they differ only in the sparse
operations under them: the tiled tensor-core SpMM/SDDMM, or cupyx
``A @ X`` / ``A.T @ X`` and a CuPy gather-and-dot SDDMM (on the host: the
reference path beside scipy; GAT's fused attention has no such counterpart, so its cupyx column stays
empty).  Where JAX is installed, the same models in pure JAX, each step one jitted function
(:mod:`._jax_models`), fill a ``jax`` column (aggregation by ``segment_sum``), ``jax_bcoo`` (BCOO products) and
``jax_tcgnn`` (this library's products inside the jitted step, ``tcgnn_py.jax``) columns.  ``extra`` adds
implementations from outside the library (``tools/gnn_epoch_table.py --baselines FILE`` adds other frameworks'
models there).

An epoch is one full-batch training step: forward with dropout, cross-entropy
on the training nodes, backward, Adam.  The clock is the host's around
``epochs`` back-to-back steps closed by a device synchronisation, the same for
every implementation; the median of ``repeat`` such batches is reported, the implementations timed in turn within
each round.
"""

import functools
import statistics
import time

import numpy as np

from ._graphs import data_roots, resolve_graph

__all__ = ["gnn_problem", "bench_gnn", "train_step", "gnn_markdown", "time_epochs", "time_epochs_in_turn",
           "MODELS", "HIDDEN", "GAT_HEADS", "GAT_HIDDEN", "JAX_COLUMNS"]

MODELS = ("gcn", "agnn", "gat")
#: Hidden width of GCN and AGNN (the examples' Kipf & Welling / AGNN setups).
HIDDEN = 16
#: GAT's hidden layer: heads of this width (the GAT paper's Cora model, as examples/gat_cora.py).
GAT_HEADS, GAT_HIDDEN = 8, 8
#: Feature width and class count where a graph has none (synthetic graphs, pubmed's missing features).
SYNTH_FEATURES = {"pubmed": 500, None: 64}
SYNTH_CLASSES = 8


def gnn_problem(spec, seed=0):
    """Graph, features, labels and training nodes for a spec (real where the folder has them).

    Returns a dict: ``name, adj`` (scipy csr_array), ``X`` (float32, row-normalised
    when real), ``labels`` (int64, one per node), ``train_idx``, ``n_classes``,
    ``features`` ("real" or "random").
    """
    from .._io import load_cora, load_graph

    # A data folder is loaded once, with its features and split; anything else through resolve_graph.
    folder = next((root / spec for root in data_roots() if (root / spec / "adj_csr.npz").exists()), None)
    if folder is not None:
        g = load_graph(folder)
    elif spec == "cora":
        g = load_cora()
    else:
        g = None
    name, A = (spec, g.adj) if g is not None else resolve_graph(spec)
    rng = np.random.default_rng(seed)
    n = A.shape[0]
    if g is not None and g.features is not None:
        X = g.features.toarray().astype(np.float32)
        X /= np.maximum(X.sum(axis=1, keepdims=True), 1)
        features = "real"
    else:
        X = rng.standard_normal((n, SYNTH_FEATURES.get(spec, SYNTH_FEATURES[None])), dtype=np.float32)
        features = "random"
    labels = None if g is None else g.labels
    if labels is not None and labels.ndim == 2:  # multi-label (blogcatalog3): the first label
        labels = labels.argmax(axis=1)
    if labels is None:
        labels = rng.integers(0, SYNTH_CLASSES, n)
    labels = np.maximum(labels.astype(np.int64), 0)  # -1 marks unlabelled nodes (never trained on here)
    train_idx = g.train_idx if g is not None and g.train_idx is not None else rng.permutation(n)[: max(1, n // 10)]
    return {"name": name, "adj": A, "X": X, "labels": labels, "train_idx": np.asarray(train_idx),
            "n_classes": int(labels.max()) + 1, "features": features}


def train_step(problem, model, sparse, device=None, seed=0, cuda_graph=False):
    """One training step of ``model`` in tcgnn_py.nn over ``sparse`` ("tiled" or "csr"), on ``device``.

    ``cuda_graph``: the first call runs the step and captures the next one
    (:class:`tcgnn_py.CUDAGraph`); every later call replays it.  None for GAT over "csr" (its attention
    runs on the tiled matrix only).
    """
    from .. import nn
    from .._device import get_cupy, use_gpu
    from ..nn import CSREdges

    if model == "gat" and sparse == "csr":
        return None
    gpu = use_gpu(device)
    where = "cuda" if gpu else "cpu"
    A = nn.gcn_norm(problem["adj"], device=where) if model == "gcn" else nn.add_self_loops(problem["adj"], device=where)
    rng = nn.default_rng(seed, like=A)
    xp = get_cupy() if gpu else np
    if sparse == "csr":
        if gpu:
            import cupyx.scipy.sparse as csp

            A = CSREdges(csp.csr_matrix(A.tocsr()))
        else:
            A = CSREdges(A.tocsr())
    X = xp.asarray(problem["X"])
    labels, idx = xp.asarray(problem["labels"]), xp.asarray(problem["train_idx"])
    dims = (X.shape[1], HIDDEN, problem["n_classes"])
    p = 0.5
    if model == "gcn":
        apply, params = nn.gcn_apply, nn.gcn_init(dims, rng)
        opt = nn.Adam(params, lr=0.01, weight_decay={"W0": 5e-4, "b0": 5e-4})
    elif model == "agnn":
        apply, params = nn.agnn_apply, nn.agnn_init(dims, rng)
        opt = nn.Adam(params, lr=0.01, weight_decay=5e-4)
    else:
        apply, params = nn.gat_apply, nn.gat_init((X.shape[1], GAT_HIDDEN, dims[2]), rng, heads=GAT_HEADS)
        opt, p = nn.Adam(params, lr=0.005, weight_decay=5e-4), 0.6

    def step():
        logits, vjp = apply(params, A, X, rng=rng, dropout_p=p)
        opt.step(vjp(nn.cross_entropy(logits, labels, idx)[1]))

    if not cuda_graph:
        return step
    from .._capture import CUDAGraph

    graph = []

    def replay():
        if graph:
            graph[0].replay()
            return
        step()  # warms every cache the capture needs
        g = CUDAGraph()
        with g.capture():
            step()
        graph.append(g)

    return replay


def _cupy_sync():
    import cupy

    cupy.cuda.Device().synchronize()


def time_epochs(step, sync, epochs=20, repeat=3, warmup=3, settled=True):
    """Median milliseconds per epoch over ``repeat`` batches of ``epochs`` back-to-back steps.

    Timed after the steps that settle its products' launches (:func:`tcgnn_py.bench.settle`: a loop of 200 epochs
    runs the launches its timed choices keep from its 66th; ``settled`` False skips them, for the host's reference
    path, which has no launches to settle), and ``warmup`` steps more.
    """
    return time_epochs_in_turn({None: (step, sync)}, epochs, repeat, warmup, settled)[None]


def time_epochs_in_turn(steps, epochs=20, repeat=3, warmup=3, settled=True):
    """``{name: median milliseconds per epoch}`` of ``steps`` (``{name: (step, sync)}``), as :func:`time_epochs`
    times one, taken in turn: each of the ``repeat`` rounds times one batch of every step (the order reversed every
    other round), so that a drift of the machine's speed during the run reaches every implementation alike."""
    from ._timing import settle

    for step, sync in steps.values():
        if settled:
            settle(step, sync)
        for _ in range(warmup):
            step()
        sync()
    names = list(steps)
    samples = {name: [] for name in names}
    for r in range(repeat):
        for name in names if r % 2 == 0 else names[::-1]:
            step, sync = steps[name]
            t0 = time.perf_counter()  # (the device idle: every batch and warm-up ends with its step's sync)
            for _ in range(epochs):
                step()
            sync()
            samples[name].append(1e3 * (time.perf_counter() - t0) / epochs)
    return {name: statistics.median(v) for name, v in samples.items()}


def _load(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gnn_baselines", path)
    if spec is None:
        raise ValueError(f"baselines: {path!r} is not a Python file")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_baselines(path):
    """``(builders, versions, attention, sample, classify)`` from a Python file (kept outside this package) that
    defines ``builders()`` and, optionally, ``attention_builders()``, ``sample_builders()`` and
    ``classify_builders()``.

    ``builders()`` returns ``({name: build(problem, model) -> (step, sync) or None}, {package: version})``:
    the ``extra`` that :func:`bench_gnn` takes; ``attention_builders()`` returns ``{name: build(problem,
    score, heads) -> (fwd(i), fwd_bwd(i)) or None}``, the ``extra`` of :func:`bench_attention`;
    ``sample_builders()`` returns ``{name: build(problem, hidden) -> train(seeds, blocks) or None}``, the ``extra``
    of the sampled table's ``bench_sample``; ``classify_builders()`` returns ``{name: build(problem, hidden,
    layers) -> step(ids, learn) or None}``, the ``extra`` of the graph-classification table's ``bench_classify``
    (``{}`` where the file has none).  Other frameworks' models live in such a file, so this package imports none
    of them.
    """
    mod = _load(path)
    builders, versions = mod.builders()
    optional = [getattr(mod, name)() if hasattr(mod, name) else {}
                for name in ("attention_builders", "sample_builders", "classify_builders")]
    return (builders, versions, *optional)


#: The epoch table's JAX columns by aggregation: ``jax.ops.segment_sum`` (what GNNs in JAX write), BCOO products,
#: and tcgnn_py's own products through :mod:`tcgnn_py.jax`.
JAX_COLUMNS = {"segment_sum": "jax", "bcoo": "jax_bcoo", "tcgnn": "jax_tcgnn"}


def _jax_aggregations(with_jax):
    """The aggregations of :func:`bench_gnn`'s ``with_jax`` (a bool, or aggregations of :data:`JAX_COLUMNS`), in the
    table's order; an unknown one is a ValueError that names it, before any graph is loaded."""
    if with_jax is True or with_jax is False:
        return tuple(JAX_COLUMNS) if with_jax else ()
    if isinstance(with_jax, str):
        raise TypeError(f"with_jax must be a bool or a sequence of aggregations, got str {with_jax!r}")
    asked = list(with_jax)
    for a in asked:
        if a not in JAX_COLUMNS:
            raise ValueError(f"with_jax: unknown aggregation {a!r} (one of {', '.join(JAX_COLUMNS)})")
    return tuple(a for a in JAX_COLUMNS if a in asked)


def bench_gnn(spec, models=MODELS, epochs=20, repeat=3, device=None, extra=None, with_jax=True):
    """Rows ``{graph, model, impl, ms, nodes, nnz, features, ...}`` of time per training epoch.

    ``extra`` maps an implementation name to ``build(problem, model) -> (step, sync)`` or None; on the GPU the
    JAX models come first among them where JAX is installed and ``with_jax`` (XLA compiles each model's step
    first, up to tens of seconds on wide inputs, so a caller may leave them out): True for every aggregation of
    :data:`JAX_COLUMNS`, or a sequence of its aggregations (``["segment_sum"]``: the pure-JAX model alone).
    """
    from .._device import use_gpu
    from . import _jax_models

    aggregations = _jax_aggregations(with_jax)
    gpu = use_gpu(device)
    problem = gnn_problem(spec)
    A = problem["adj"]
    if gpu:
        impls = {"tcgnn_py": ("tiled", False), "tcgnn_py_graph": ("tiled", True), "cupyx": ("csr", False)}
    else:
        impls = {"tcgnn_ref": ("tiled", False), "scipy": ("csr", False)}
    sync = _cupy_sync if gpu else (lambda: None)
    if gpu and aggregations and _jax_models.available():
        jax = {JAX_COLUMNS[a]: functools.partial(_jax_models.build, hidden=HIDDEN, gat=(GAT_HEADS, GAT_HIDDEN),
                                                 aggregation=a) for a in aggregations}
        extra = {**jax, **(extra or {})}
    rows = []
    for model in models:
        steps = {}
        for impl, (sparse, graph) in impls.items():
            step = train_step(problem, model, sparse, "cuda" if gpu else "cpu", cuda_graph=graph)
            if step is not None:
                steps[impl] = (step, sync)
        for impl, build in (extra or {}).items():
            built = build(problem, model)
            if built is not None:  # None: that implementation has no such model
                steps[impl] = built
        # (every implementation built first, then timed in turn: the table compares them within each round)
        times = time_epochs_in_turn(steps, epochs, repeat, settled=gpu)
        for impl, ms in times.items():
            rows.append({"graph": problem["name"], "model": model, "impl": impl, "ms": ms,
                         "nodes": A.shape[0], "nnz": int(A.nnz), "in_features": problem["X"].shape[1],
                         "features": problem["features"], "classes": problem["n_classes"]})
    return rows


def gnn_markdown(rows):
    """Table: one line per graph and model, ms per epoch per implementation, speedups of tcgnn_py.

    With a ``tcgnn_py_graph`` column (CUDA-graph replay), each speedup cell is
    ``eager / replayed``.
    """
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    ours = [i for i in impls if i.startswith("tcgnn_")]
    others = [i for i in impls if i not in ours]
    head = ["graph", "nodes", "nnz", "features", "model"] + [f"{i} ms" for i in impls]
    head += [f"speedup over {i}" + (" (eager / graph)" if len(ours) > 1 else "") for i in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = list(dict.fromkeys((r["graph"], r["model"]) for r in rows))
    for graph, model in keys:
        sel = {r["impl"]: r for r in rows if r["graph"] == graph and r["model"] == model}
        r0 = sel[ours[0]]
        cells = [graph, f"{r0['nodes']:,}", f"{r0['nnz']:,}", f"{r0['in_features']} ({r0['features']})", model]
        cells += [f"{sel[i]['ms']:.2f}" if i in sel else "–" for i in impls]
        for i in others:
            if i not in sel:
                cells.append("–")
                continue
            cells.append(" / ".join(f"{sel[i]['ms'] / sel[o]['ms']:.2f}×" for o in ours if o in sel))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
