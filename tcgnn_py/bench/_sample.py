"""Layer 4 (bench): the neighbor sampler and GraphSAGE on sampled blocks.

Per graph (features and labels as the epoch table's, :func:`tcgnn_py.bench.gnn_problem`):

* ``sampler``: sampled entries per second of :func:`tcgnn_py.nn.sample_blocks` with :data:`FANOUTS` on
  :data:`SAMPLER_BATCHES` batches of :data:`BATCH` random seeds, blocks as the training takes them (sampling,
  relabelling and each block's CSR; no tiled matrix), median over batches;
* ``epoch``: milliseconds per sampled training epoch (:data:`STEPS` batches of the training nodes, sampling
  included) of a GraphSAGE of ``len(FANOUTS)`` mean layers (:data:`HIDDEN` features, ReLU, Adam): on blocks
  sampled as tiled, which the layers multiply by their entries' CSR with this library's CSR kernel, none
  translated (``tcgnn_py``), and on CSR blocks with cupyx's products (``cupyx``;
  scipy's on the host) -- what a CuPy user would write around the same sampler -- and on the same CSR blocks with
  another framework's layers (the ``--baselines`` file's ``sample_builders()``); each also without the sampling
  (``ms_trained``: the same number of batches sampled beforehand, then trained on).  Medians over ``repeat``
  rounds, after an epoch's steps and every background compile, the implementations' rounds in turn (a host whose
  speed drifts slows each alike).
"""

import statistics
import time

import numpy as np

__all__ = ["bench_sample", "sample_markdown", "FANOUTS", "BATCH", "STEPS", "HIDDEN", "SAMPLER_BATCHES"]

#: Neighbors sampled per hop, from the seeds out.
FANOUTS = (15, 10, 5)
#: Seeds per batch.
BATCH = 1024
#: Batches per timed epoch.
STEPS = 10
#: Hidden width of the GraphSAGE layers.
HIDDEN = 64
#: Batches the sampler's row times, after :data:`SAMPLER_WARMUP` that compile its kernels and every background
#: compile: a batch takes about a millisecond.
SAMPLER_BATCHES = 20
#: Untimed batches before them.
SAMPLER_WARMUP = 3


def _loader(problem, fmt, device, seed=0):
    """The training nodes' sampled batches, :data:`FANOUTS` and :data:`BATCH`, on ``fmt`` blocks, as an endless
    ``next_batch() -> (seeds, blocks)``."""
    from .. import nn

    loader = nn.NeighborLoader(problem["adj"], problem["train_idx"], list(FANOUTS), BATCH, seed=seed,
                               device=device, format=fmt)
    batches = iter(())

    def next_batch():
        nonlocal batches
        try:
            return next(batches)
        except StopIteration:
            batches = iter(loader)
            return next(batches)

    return next_batch


def _trainer(problem, device, seed=0):
    """``train(seeds, blocks)``: one GraphSAGE step (:data:`HIDDEN` features, ReLU, Adam) on a batch's blocks,
    sampled as tiled (this library's CSR kernel) or as CSR (scipy's or cupyx's products)."""
    from .. import nn

    xp = np
    if device == "cuda":
        import cupy as xp
    X, y = xp.asarray(problem["X"]), xp.asarray(problem["labels"])
    rng = np.random.default_rng(seed)
    dims = (X.shape[1],) + (HIDDEN,) * (len(FANOUTS) - 1) + (problem["n_classes"],)
    params = {k: xp.asarray(v) for k, v in nn.sage_init(dims, rng).items()}
    opt = nn.Adam(params, lr=0.01)

    def train(seeds, blocks):
        logits, vjp = nn.sage_apply(params, blocks, X[blocks[0].src])
        _, g = nn.cross_entropy(logits, y[blocks[-1].dst])
        opt.step(vjp(g))

    return train


def _no_sync():
    return None


def _round(next_batch, train, sync):
    """Milliseconds of :data:`STEPS` steps with the sampling (each step samples its batch, then trains) and without
    it (the same number of batches sampled beforehand, then trained on)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(STEPS):
        train(*next_batch())
    sync()
    with_sampling = 1e3 * (time.perf_counter() - t0)
    batches = [next_batch() for _ in range(STEPS)]
    sync()
    t0 = time.perf_counter()
    for batch in batches:
        train(*batch)
    sync()
    return with_sampling, 1e3 * (time.perf_counter() - t0)


def bench_sample(spec, repeat=5, device=None, extra=None):
    """Rows ``{graph, nnz, kind, impl, ...}``: the sampler's ``entries_per_s`` and ``ms`` per batch, and each
    implementation's ``ms`` per sampled epoch (sampling included) and ``ms_trained`` (the same batches sampled
    beforehand), medians of ``repeat`` rounds timed in turn.

    ``extra`` maps another framework's name to ``build(problem, hidden) -> train(seeds, blocks)`` or None: a
    GraphSAGE of the same widths trained on the same CSR blocks (scipy's on the host, cupyx's on the GPU;
    :class:`tcgnn_py.nn.Block`), kept outside this package (the ``--baselines`` file's ``sample_builders()``).
    """
    from .. import nn
    from .._device import use_gpu
    from ..kernels.registry import wait_for_compiles
    from ._gnn import gnn_problem

    gpu = use_gpu(device)
    device = "cuda" if gpu else "cpu"
    sync = _no_sync
    if gpu:
        import cupy

        sync = cupy.cuda.Device().synchronize  # (every stream: another framework's too)
    problem = gnn_problem(spec)
    A = problem["adj"]
    n = A.shape[0]
    base = {"graph": problem["name"], "nnz": int(A.nnz)}
    # (the graph moved once; blocks as the training takes them)
    sampler = nn.NeighborLoader(A, [0], list(FANOUTS), 1, device=device, format="tiled")
    rng = np.random.default_rng(0)
    samples = []
    for r in range(SAMPLER_WARMUP + SAMPLER_BATCHES):
        if r == SAMPLER_WARMUP:
            wait_for_compiles()  # (a background compile holds the interpreter: it would time that instead)
        seeds = rng.permutation(n)[:min(BATCH, n)]
        sync()
        t0 = time.perf_counter()
        blocks = sampler.sample(seeds, seed=r)
        sync()
        if r >= SAMPLER_WARMUP:  # (the first batches compile the sampler's kernels and grow its buffers)
            samples.append((time.perf_counter() - t0, sum(b.nnz for b in blocks)))
    ms = 1e3 * statistics.median(t for t, _ in samples)
    rows = [dict(base, kind="sampler", impl="tcgnn_py", ms=ms,
                 entries_per_s=statistics.median(e / t for t, e in samples))]
    impls = [("tcgnn_py", "tiled", _trainer(problem, device)),
             ("cupyx" if gpu else "scipy", "csr", _trainer(problem, device))]
    for name, build in (extra or {}).items():
        train = build(problem, HIDDEN)
        if train is not None:
            impls.append((name, "csr", train))
    running = []
    for impl, fmt, train in impls:
        next_batch = _loader(problem, fmt, device)
        for _ in range(1 + STEPS):  # (the first batches meet kernels not yet compiled: a loop of many epochs does once)
            train(*next_batch())
        running.append((impl, next_batch, train))
    sync()
    wait_for_compiles()
    # The implementations' rounds in turn: a host whose speed drifts slows every one alike.
    times = {impl: [] for impl, _, _ in running}
    for _ in range(repeat):
        for impl, next_batch, train in running:
            times[impl].append(_round(next_batch, train, sync))
    for impl, rounds in times.items():
        rows.append(dict(base, kind="epoch", impl=impl, ms=statistics.median(w for w, _ in rounds),
                         ms_trained=statistics.median(t for _, t in rounds)))
    return rows


def sample_markdown(rows):
    """Table: per graph, the sampler's millions of sampled entries per second and milliseconds per batch, and each
    implementation's milliseconds per sampled epoch (in brackets: the same batches sampled beforehand), with this
    library's speedup over each: its epoch with the sampling over theirs with it, and (in brackets) over theirs
    trained only -- the sampling counted on this library's side alone, the comparison the sampled-training target
    makes."""
    impls = list(dict.fromkeys(r["impl"] for r in rows if r["kind"] == "epoch"))
    others = [i for i in impls if i != "tcgnn_py"]
    lines = [f"| graph | nnz | sampled M entries/s | sampling ms / batch of {BATCH} | "
             + " | ".join(f"epoch ms {i} (trained only)" for i in impls) + " | "
             + " | ".join(f"× {i} (× trained only)" for i in others) + " |",
             "|---|---|---|---|" + "---|" * (len(impls) + len(others))]
    for g in dict.fromkeys(r["graph"] for r in rows):
        mine = [r for r in rows if r["graph"] == g]
        s = next(r for r in mine if r["kind"] == "sampler")
        epoch = {r["impl"]: r for r in mine if r["kind"] == "epoch"}
        cells = [f"{epoch[i]['ms']:.1f} ({epoch[i]['ms_trained']:.1f})" if i in epoch else "–" for i in impls]
        ours = epoch.get("tcgnn_py")
        ratios = [f"{epoch[i]['ms'] / ours['ms']:.2f}× ({epoch[i]['ms_trained'] / ours['ms']:.2f}×)"
                  if ours and i in epoch else "–" for i in others]
        lines.append(f"| {g} | {s['nnz']:,} | {s['entries_per_s'] / 1e6:.1f} | {s['ms']:.2f} | "
                     + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)
