"""Layer 4 (bench): the neighbor sampler and GraphSAGE on sampled blocks.

Per graph (features and labels as the epoch table's, :func:`tcgnn_py.bench.gnn_problem`):

* ``sampler``: sampled entries per second of :func:`tcgnn_py.nn.sample_blocks` with :data:`FANOUTS` on batches of
  :data:`BATCH` random seeds, CSR blocks (sampling and relabelling; no tiled matrix), median over batches;
* ``epoch``: milliseconds per sampled training epoch (:data:`STEPS` batches of the training nodes, sampling
  included) of a GraphSAGE of ``len(FANOUTS)`` mean layers (:data:`HIDDEN` features, ReLU, Adam): on tiled
  blocks with this library's products (``tcgnn_py``), and on CSR blocks with cupyx's products (``cupyx``;
  scipy's on the host) -- what a CuPy user would write around the same sampler.
"""

import statistics
import time

import numpy as np

__all__ = ["bench_sample", "sample_markdown", "FANOUTS", "BATCH", "STEPS", "HIDDEN"]

#: Neighbors sampled per hop, from the seeds out.
FANOUTS = (15, 10, 5)
#: Seeds per batch.
BATCH = 1024
#: Batches per timed epoch.
STEPS = 10
#: Hidden width of the GraphSAGE layers.
HIDDEN = 64


def _step_fn(problem, fmt, device, seed=0):
    """One sampled training step per call, on ``fmt`` blocks ("tiled" or "csr")."""
    from .. import nn

    gpu = device == "cuda"
    xp = np
    if gpu:
        import cupy as xp
    X, y = xp.asarray(problem["X"]), xp.asarray(problem["labels"])
    rng = np.random.default_rng(seed)
    dims = (X.shape[1],) + (HIDDEN,) * (len(FANOUTS) - 1) + (problem["n_classes"],)
    params = {k: xp.asarray(v) for k, v in nn.sage_init(dims, rng).items()}
    opt = nn.Adam(params, lr=0.01)
    loader = nn.NeighborLoader(problem["adj"], problem["train_idx"], list(FANOUTS), BATCH, seed=seed,
                               device=device, format=fmt)
    batches = iter(())

    def step():
        nonlocal batches
        try:
            _, blocks = next(batches)
        except StopIteration:
            batches = iter(loader)
            _, blocks = next(batches)
        logits, vjp = nn.sage_apply(params, blocks, X[blocks[0].src])
        _, g = nn.cross_entropy(logits, y[blocks[-1].dst])
        grads = vjp(g)
        opt.step(grads)

    return step


def _no_sync():
    return None


def bench_sample(spec, repeat=5, device=None):
    """Rows ``{graph, nnz, kind, impl, ...}``: the sampler's ``entries_per_s`` and ``ms`` per batch, and each
    implementation's ``ms`` per sampled epoch."""
    from .. import nn
    from .._device import use_gpu
    from ..kernels.registry import wait_for_compiles
    from ._gnn import gnn_problem

    gpu = use_gpu(device)
    device = "cuda" if gpu else "cpu"
    sync = _no_sync
    if gpu:
        import cupy

        sync = cupy.cuda.Device().synchronize
    problem = gnn_problem(spec)
    A = problem["adj"]
    n = A.shape[0]
    base = {"graph": problem["name"], "nnz": int(A.nnz)}
    sampler = nn.NeighborLoader(A, [0], list(FANOUTS), 1, device=device, format="csr")  # (the graph moved once)
    rng = np.random.default_rng(0)
    samples = []
    for r in range(repeat + 1):
        seeds = rng.permutation(n)[:min(BATCH, n)]
        sync()
        t0 = time.perf_counter()
        blocks = sampler.sample(seeds, seed=r)
        sync()
        if r:  # (the first batch compiles the sampler's kernel)
            samples.append((time.perf_counter() - t0, sum(int(b.adj.nnz) for b in blocks)))
    ms = 1e3 * statistics.median(t for t, _ in samples)
    rows = [dict(base, kind="sampler", impl="tcgnn_py", ms=ms,
                 entries_per_s=statistics.median(e / t for t, e in samples))]
    for impl, fmt in (("tcgnn_py", "tiled"), ("cupyx" if gpu else "scipy", "csr")):
        step = _step_fn(problem, fmt, device)
        for _ in range(3):
            step()
        sync()
        wait_for_compiles()
        step()
        times = []
        for _ in range(repeat):
            sync()
            t0 = time.perf_counter()
            for _ in range(STEPS):
                step()
            sync()
            times.append(1e3 * (time.perf_counter() - t0))
        rows.append(dict(base, kind="epoch", impl=impl, ms=statistics.median(times)))
    return rows


def sample_markdown(rows):
    """Table: per graph, the sampler's millions of sampled entries per second and milliseconds per batch, and the
    sampled epoch's milliseconds per implementation with this library's speedup."""
    lines = [f"| graph | nnz | sampled M entries/s | sampling ms / batch of {BATCH} | epoch ms tcgnn_py | "
             "epoch ms (cupyx or scipy) | × |", "|---|---|---|---|---|---|---|"]
    for g in dict.fromkeys(r["graph"] for r in rows):
        mine = [r for r in rows if r["graph"] == g]
        s = next(r for r in mine if r["kind"] == "sampler")
        ours = next(r["ms"] for r in mine if r["kind"] == "epoch" and r["impl"] == "tcgnn_py")
        theirs = next(r["ms"] for r in mine if r["kind"] == "epoch" and r["impl"] != "tcgnn_py")
        lines.append(f"| {g} | {s['nnz']:,} | {s['entries_per_s'] / 1e6:.1f} | {s['ms']:.2f} | {ours:.1f} | "
                     f"{theirs:.1f} | {theirs / ours:.2f}× |")
    return "\n".join(lines)
