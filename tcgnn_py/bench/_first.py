"""Layer 4 (bench): time to the first product, in fresh processes with empty and warm kernel caches.

Each run is a new Python process with its own empty ``CUPY_CACHE_DIR`` and ``NUMBA_CACHE_DIR``
("empty caches"), then a second process on the same folders ("warm disk caches").  A process times, on
its own clock: ``import tcgnn_py``, ``TiledMatrix(cora)``, the first float32 ``T @ X`` (D = 64), the first
float16 product after it, a new width (D = 128) and a new graph (a 20k-node power-law graph) in the same
process, first call against the median of later ones; a separate process times its first
``reorder(cora, "2:4")``, and with ``graph`` (an ``adj_csr.npz``) another one times ``TiledMatrix`` of that
graph and its first product (D = 64) after the import.  Needs a GPU.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

__all__ = ["first_product_times", "first_product_markdown"]

_PRODUCTS = r"""
import json, statistics, time
t0 = time.perf_counter()
import numpy as np, cupy as cp
import tcgnn_py as tg
t_import = time.perf_counter() - t0

def timed(fn):
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    out = fn()
    cp.cuda.Device().synchronize()
    return out, time.perf_counter() - t

def first_and_later(fn):
    _, first = timed(fn)
    later = statistics.median(timed(fn)[1] for _ in range(20))
    return first, later

rng = np.random.default_rng(0)
A = tg.load_cora().adj
T, t_tiled = timed(lambda: tg.TiledMatrix(A))
X = cp.asarray(rng.standard_normal((A.shape[1], 64)).astype(np.float32))
_, t_f32 = timed(lambda: T @ X)
Xh = X.astype(cp.float16)
_, t_f16 = timed(lambda: T @ Xh)
X128 = cp.asarray(rng.standard_normal((A.shape[1], 128)).astype(np.float32))
width = first_and_later(lambda: T @ X128)
B = tg.power_law_graph(20000, 200000, seed=1)
TB = tg.TiledMatrix(B)
XB = cp.asarray(rng.standard_normal((B.shape[1], 64)).astype(np.float32))
graph = first_and_later(lambda: TB @ XB)
print(json.dumps({"import": t_import, "tiled": t_tiled, "f32": t_f32, "f16": t_f16,
                  "width_first": width[0], "width_later": width[1], "graph_first": graph[0], "graph_later": graph[1]}))
"""

_REORDER = r"""
import json, time
import numpy as np, cupy as cp
import tcgnn_py as tg
A = tg.load_cora().adj
cp.cuda.Device().synchronize()
t = time.perf_counter()
p = tg.reorder(A, "2:4")
print(json.dumps({"reorder": time.perf_counter() - t}))
"""


_GRAPH = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np, cupy as cp, scipy.sparse as sp
import tcgnn_py as tg
t_import = time.perf_counter() - t0
A = sp.load_npz(sys.argv[1])
X = cp.asarray(np.random.default_rng(0).standard_normal((A.shape[1], 64)).astype(np.float32))
cp.cuda.Device().synchronize()
t = time.perf_counter()
T = tg.TiledMatrix(A)
cp.cuda.Device().synchronize()
t_tiled = time.perf_counter() - t
Y = T @ X
cp.cuda.Device().synchronize()
print(json.dumps({"g_import": t_import, "g_tiled": t_tiled, "g_f32": time.perf_counter() - t - t_tiled,
                  "g_nnz": int(A.nnz)}))
"""


def _child(code, caches, *args):
    env = dict(os.environ, CUPY_CACHE_DIR=caches[0], NUMBA_CACHE_DIR=caches[1], PYTHONUNBUFFERED="1")
    t = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600,
                         cwd=caches[0])  # not the checkout: the package comes from PYTHONPATH or site-packages
    wall = time.perf_counter() - t
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-3000:])
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["wall"] = wall
    return out


def _run_once(graph=None):
    """One cold and one warm process of each kind, with fresh cache folders."""
    with tempfile.TemporaryDirectory() as c1, tempfile.TemporaryDirectory() as c2:
        cold = _child(_PRODUCTS, (c1, c2))
        warm = _child(_PRODUCTS, (c1, c2))
    with tempfile.TemporaryDirectory() as c1, tempfile.TemporaryDirectory() as c2:
        for out in (cold, warm):
            r = _child(_REORDER, (c1, c2))
            out.update(reorder=r["reorder"], reorder_wall=r["wall"])
    if graph is not None:
        with tempfile.TemporaryDirectory() as c1, tempfile.TemporaryDirectory() as c2:
            for out in (cold, warm):
                r = _child(_GRAPH, (c1, c2), os.path.abspath(graph))
                out.update(r, g_wall=r.pop("wall"))
    return {"cold": cold, "warm": warm}


ROWS = [
    ("import tcgnn_py", "import"),
    ("TiledMatrix(cora)", "tiled"),
    ("first float32 T @ X (D = 64)", "f32"),
    ("import + TiledMatrix + first product", None),
    ("first float16 product after it", "f16"),
    ("process wall clock (products)", "wall"),
    ("new width D = 128: first call / later", ("width_first", "width_later")),
    ("new graph (20k nodes): first call / later", ("graph_first", "graph_later")),
    ("first reorder(cora, '2:4')", "reorder"),
    ("process wall clock (reorder)", "reorder_wall"),
]
#: The rows of ``first_product_times(graph=...)``'s process, shown when it ran.
GRAPH_ROWS = [
    ("the graph ({nnz:,} entries): import tcgnn_py", "g_import"),
    ("the graph: TiledMatrix + first product (after the import)", ("g_tiled", "g_f32")),
    ("the graph: process wall clock", "g_wall"),
]


def first_product_markdown(runs):
    def med(kind, key):
        return statistics.median(r[kind][key] for r in runs)

    def cell(kind, key):
        if key is None:
            return f"{med(kind, 'import') + med(kind, 'tiled') + med(kind, 'f32'):.2f} s"
        if key == ("g_tiled", "g_f32"):
            return f"{med(kind, key[0]) + med(kind, key[1]):.2f} s ({med(kind, key[0]):.2f} + {med(kind, key[1]):.2f})"
        if isinstance(key, tuple):
            return f"{1e3 * med(kind, key[0]):.1f} ms / {1e3 * med(kind, key[1]):.2f} ms"
        return f"{med(kind, key):.2f} s"

    graph = "g_import" in runs[0]["cold"]
    lines = [f"| step ({len(runs)} runs, median) | empty caches | warm disk caches |", "|---|---|---|"]
    for label, key in ROWS + (GRAPH_ROWS if graph else []):
        label = label.format(nnz=runs[0]["cold"].get("g_nnz", 0))
        lines.append(f"| {label} | {cell('cold', key)} | {cell('warm', key)} |")
    return "\n".join(lines)


def first_product_times(runs=3, graph=None):
    """``runs`` measurements, each ``{"cold": {...}, "warm": {...}}`` of seconds per step (see the module);
    ``graph``: the path of an ``adj_csr.npz`` whose first ``TiledMatrix`` and product are timed too."""
    return [_run_once(graph) for _ in range(runs)]
