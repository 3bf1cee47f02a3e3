"""Layer 4 (bench): the products inside ``jax.jit`` (``tcgnn_py.jax``) against JAX's own aggregations.

Rows per graph (features ``WIDTH`` wide, random):

* ``aggregate``: one jitted ``A @ X`` -- :func:`tcgnn_py.jax.spmm`, ``jax.ops.segment_sum`` over the edges (what
  GNNs in JAX write), a ``jax.experimental.sparse.BCOO`` product -- microseconds per call (the host clock around
  the call and ``block_until_ready``, median);
* ``loop``: a jitted ``fori_loop`` of :data:`LOOP` products, per product, beside the product's GPU-only time (the
  library's own clock, queued behind a spin): their difference is the host cost of a call inside XLA (its FFI
  handler).

JAX is told not to take most of the GPU's memory up front (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, unless the
environment says otherwise): it shares the device with the library's CuPy pool.
"""

import os
import statistics
import time

import numpy as np

from ._graphs import resolve_graph

__all__ = ["bench_jax", "jax_markdown", "WIDTH", "LOOP"]

#: Feature width of the aggregation (the issue's D = 64).
WIDTH = 64
#: Products in the jitted loop.
LOOP = 1000


def _median_us(fn, x, repeat):
    fn(x).block_until_ready()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(x).block_until_ready()
        samples.append(1e6 * (time.perf_counter() - t0))
    return statistics.median(samples)


def bench_jax(spec, repeat=20, device=None, loop=LOOP):
    """Rows ``{graph, nnz, kind, impl, us}`` (``kind`` "aggregate" or "loop"; the loop's rows add ``gpu_us``
    and ``host_us`` on the GPU)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    from jax.experimental import sparse

    from .._device import use_gpu
    from .._tiled import TiledMatrix
    from ..jax import spmm

    gpu = use_gpu(device) and jax.default_backend() == "gpu"
    name, adj = resolve_graph(spec)
    A = adj.astype(np.float32).tocsr()
    A.sort_indices()
    n = A.shape[0]
    T = TiledMatrix(A, device="cuda" if gpu else "cpu")
    rows = jnp.asarray(np.repeat(np.arange(n), np.diff(A.indptr)).astype(np.int32))
    cols, vals = jnp.asarray(A.indices.astype(np.int32)), jnp.asarray(A.data)
    B = sparse.BCOO((vals, jnp.stack([rows, cols], axis=1)), shape=A.shape, indices_sorted=True)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((A.shape[1], WIDTH), dtype=np.float32))
    impls = {"tcgnn_py.jax": jax.jit(lambda x: spmm(T, x)),
             "segment_sum": jax.jit(lambda x: jax.ops.segment_sum(x[cols] * vals[:, None], rows, n,
                                                                  indices_are_sorted=True)),
             "BCOO": jax.jit(lambda x: B @ x)}
    base = {"graph": name, "nnz": int(A.nnz), "width": WIDTH}
    out = [dict(base, kind="aggregate", impl=k, us=_median_us(f, x, repeat)) for k, f in impls.items()]
    if A.shape[0] == A.shape[1]:
        scale = 1 / max(1.0, float(abs(A).sum(axis=1).max()))  # (the loop's values stay finite)
        looped = jax.jit(lambda x: jax.lax.fori_loop(0, loop, lambda i, y: spmm(T, y) * scale, x))
        row = dict(base, kind="loop", impl="tcgnn_py.jax", us=_median_us(looped, x, max(3, repeat // 5)) / loop)
        if gpu:
            import cupy as cp

            from .._tiled import spmm as tiled_spmm
            from ._timing import time_queued

            X, Y = cp.asarray(np.asarray(x)), cp.empty((n, WIDTH), np.float32)
            row["gpu_us"] = 1e3 * time_queued(lambda i: tiled_spmm(T, X, out=Y), 1, 200)
            row["host_us"] = row["us"] - row["gpu_us"]
        out.append(row)
    return out


def jax_markdown(rows):
    """Table: per graph, the jitted aggregation's microseconds per implementation and tcgnn_py.jax's speedups;
    the loop's microseconds per product, GPU-only and host cost."""
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    lines = ["| graph | nnz | tcgnn_py.jax us | segment_sum us | BCOO us | × segment_sum | × BCOO | loop us/call | "
             "GPU-only us | host us/call |", "|---|---|---|---|---|---|---|---|---|---|"]
    for g in graphs:
        agg = {r["impl"]: r["us"] for r in rows if r["graph"] == g and r["kind"] == "aggregate"}
        loop = next((r for r in rows if r["graph"] == g and r["kind"] == "loop"), {})
        nnz = next(r["nnz"] for r in rows if r["graph"] == g)
        ours = agg["tcgnn_py.jax"]

        def cell(v):
            return "–" if v is None else f"{v:.1f}"

        lines.append(f"| {g} | {nnz:,} | {ours:.1f} | {agg['segment_sum']:.1f} | {agg['BCOO']:.1f} | "
                     f"{agg['segment_sum'] / ours:.2f}× | {agg['BCOO'] / ours:.2f}× | {cell(loop.get('us'))} | "
                     f"{cell(loop.get('gpu_us'))} | {cell(loop.get('host_us'))} |")
    return "\n".join(lines)
