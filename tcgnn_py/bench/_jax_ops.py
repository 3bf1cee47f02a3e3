"""Layer 4 (bench): the products inside ``jax.jit`` (``tcgnn_py.jax``) against JAX's own aggregations.

Rows per graph (features ``WIDTH`` wide, random; the matrix row-normalised, so a chain of products stays finite):

* ``aggregate``: the jitted aggregation ``A @ X`` -- :func:`tcgnn_py.jax.spmm`, ``jax.ops.segment_sum`` over the
  edges (what GNNs in JAX write), a ``jax.experimental.sparse.BCOO`` product -- in microseconds per aggregation of
  a jitted chain of :data:`LOOP` aggregations (``us``: one program, so JAX's dispatch of a program, tens of
  microseconds, is spread over the chain and the figure is the GPU's time or XLA's issue time, whichever is
  longer), and of one jitted call (``call_us``: the host clock around the call and ``block_until_ready``);
* on the GPU, this library's row adds the product's GPU-only time (``gpu_us``, the library's own clock, queued
  behind a spin) and ``host_us``, the chain's time per product minus it: what a call inside XLA costs beyond the
  GPU's work (its FFI handler), zero or less where the GPU's work hides it;
* the device memory a call allocates: ``temp_bytes``, XLA's temporaries of the jitted call (its compiled memory
  analysis), and on the GPU, this library's row, ``allocations``: what CuPy allocated during ``repeat`` settled
  calls (its allocator's calls and the growth of the pools of calls XLA recorded).  The FFI call reads ``x`` and
  writes its result in XLA's own buffers, so neither is copied on either side.

JAX is told not to take most of the GPU's memory up front (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, unless the
environment says otherwise): it shares the device with the library's CuPy pool.
"""

import os
import statistics
import time

import numpy as np
from scipy.sparse import diags as sp_diags

from ._graphs import resolve_graph

__all__ = ["bench_jax", "jax_markdown", "WIDTH", "LOOP"]

#: Feature width of the aggregation (the issue's D = 64).
WIDTH = 64
#: Aggregations in a jitted chain.
LOOP = 100


def _median_us(fn, x, repeat):
    fn(x).block_until_ready()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(x).block_until_ready()
        samples.append(1e6 * (time.perf_counter() - t0))
    return statistics.median(samples)


def _settle(chain, one, x):
    """Run both programs until their product's launch is the one a long loop settles on
    (:func:`tcgnn_py.bench.settle`): its timed choice made, the launch chosen bound."""
    from ._timing import settle

    settle(lambda: [f(x).block_until_ready() for f in (chain, one)])


def _chained(jax, step, length):
    """A jitted program of ``length`` aggregations one after another (unrolled: a ``fori_loop`` would add XLA's
    loop control, a read of the counter by the host per turn)."""

    def run(x):
        for _ in range(length):
            x = step(x)
        return x

    return jax.jit(run)


def _temp_bytes(fn, x):
    """XLA's temporaries of the jitted ``fn`` on ``x`` in bytes (None where the backend reports no analysis)."""
    stats = fn.lower(x).compile().memory_analysis()
    return None if stats is None else int(stats.temp_size_in_bytes)


def _allocations(run, calls):
    """``(allocations, bytes)`` CuPy made while ``run()`` ran ``calls`` times (each call waited for): its current
    allocator's calls (wrapped for the while) and the growth of what the calls XLA recorded into command buffers
    hold (their own pools)."""
    import cupy as cp

    from ..jax import recorded_nbytes

    before, counted, allocator = recorded_nbytes(), [0], cp.cuda.get_allocator()

    def malloc(size):
        counted[0] += 1
        return allocator(size)

    cp.cuda.set_allocator(malloc)
    try:
        for _ in range(calls):
            run()
    finally:
        cp.cuda.set_allocator(allocator)
    return counted[0], recorded_nbytes() - before


def bench_jax(spec, repeat=20, device=None, loop=LOOP):
    """Rows ``{graph, nnz, width, kind, impl, us, call_us, temp_bytes}`` (``kind`` "aggregate"; on the GPU this
    library's row adds ``gpu_us``, ``host_us`` and ``allocations`` (count, bytes); on the host the chain is at most
    10 long).  The graph must be square (the chain multiplies its own result)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    from jax.experimental import sparse

    from .._device import use_gpu
    from .._tiled import TiledMatrix
    from ..jax import spmm

    gpu = use_gpu(device) and jax.default_backend() == "gpu"
    name, adj = resolve_graph(spec)
    if adj.shape[0] != adj.shape[1]:
        raise ValueError(f"--ops jax: graph {name} must be square (a chain of aggregations), got {adj.shape}")
    A = adj.astype(np.float32).tocsr()
    A.sort_indices()
    A = (sp_diags(1 / np.maximum(1, np.asarray(abs(A).sum(axis=1)).ravel())).astype(np.float32) @ A).tocsr()
    n = A.shape[0]
    T = TiledMatrix(A, device="cuda" if gpu else "cpu")
    rows = jnp.asarray(np.repeat(np.arange(n), np.diff(A.indptr)).astype(np.int32))
    cols, vals = jnp.asarray(A.indices.astype(np.int32)), jnp.asarray(A.data)
    B = sparse.BCOO((vals, jnp.stack([rows, cols], axis=1)), shape=A.shape, indices_sorted=True)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((n, WIDTH), dtype=np.float32))
    steps = {"tcgnn_py.jax": lambda x: spmm(T, x),
             "segment_sum": lambda x: jax.ops.segment_sum(x[cols] * vals[:, None], rows, n, indices_are_sorted=True),
             "BCOO": lambda x: B @ x}
    base = {"graph": name, "nnz": int(A.nnz), "width": WIDTH, "kind": "aggregate"}
    loop = loop if gpu else min(loop, 10)  # (on the host the figures are the reference path's: a short chain)
    out = []
    for impl, step in steps.items():
        chain, one = _chained(jax, step, loop), jax.jit(step)
        if gpu:
            _settle(chain, one, x)
        us = _median_us(chain, x, max(3, repeat // 4)) / loop
        out.append(dict(base, impl=impl, us=us, call_us=_median_us(one, x, repeat), temp_bytes=_temp_bytes(one, x)))
        if gpu and impl == "tcgnn_py.jax":
            out[-1]["allocations"] = _allocations(lambda: one(x).block_until_ready(), repeat)
    if gpu:
        import cupy as cp

        from .._tiled import spmm as tiled_spmm
        from ._timing import time_queued

        X, Y = cp.asarray(np.asarray(x)), cp.empty((n, WIDTH), np.float32)
        out[0]["gpu_us"] = 1e3 * time_queued(lambda i: tiled_spmm(T, X, out=Y), 1, 200)
        out[0]["host_us"] = out[0]["us"] - out[0]["gpu_us"]
    return out


def jax_markdown(rows):
    """Table: per graph, microseconds per aggregation in a jitted chain per implementation and tcgnn_py.jax's
    speedups; one jitted call's time; the product's GPU-only time and the host cost per call inside XLA; XLA's
    temporaries of one call per implementation, and what CuPy allocated during this library's calls."""
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    lines = ["| graph | nnz | tcgnn_py.jax us | segment_sum us | BCOO us | × segment_sum | × BCOO | one call us "
             "(ours / segment_sum) | GPU-only us | host us/call | XLA temporaries MB (ours / segment_sum / BCOO) | "
             "CuPy allocations, bytes (ours) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(v, fmt="{:.1f}"):  # (a measure a row may lack: a dash)
        return "–" if v is None else fmt.format(*(v if isinstance(v, tuple) else (v,)))

    def mb(v):
        return cell(None if v is None else v / 2**20, "{:.2f}")

    for g in graphs:
        agg = {r["impl"]: r for r in rows if r["graph"] == g}
        ours, seg, bcoo = agg["tcgnn_py.jax"], agg["segment_sum"], agg["BCOO"]
        lines.append(f"| {g} | {ours['nnz']:,} | {ours['us']:.1f} | {seg['us']:.1f} | {bcoo['us']:.1f} | "
                     f"{seg['us'] / ours['us']:.2f}× | {bcoo['us'] / ours['us']:.2f}× | "
                     f"{ours['call_us']:.0f} / {seg['call_us']:.0f} | {cell(ours.get('gpu_us'))} | "
                     f"{cell(ours.get('host_us'))} | {mb(ours.get('temp_bytes'))} / {mb(seg.get('temp_bytes'))} / "
                     f"{mb(bcoo.get('temp_bytes'))} | "
                     f"{cell(ours.get('allocations'), '{}, {}')} |")
    return "\n".join(lines)
