"""Layer 4: benchmarks of tcgnn_py against what a user would run instead.

``python -m tcgnn_py.bench --help`` runs them from the command line; the asv
suite in ``asv_bench/`` and the tools reuse the pieces below.

Examples
--------
>>> from tcgnn_py.bench import bench_graph
>>> g = bench_graph("banded:40:2", dims=(4,), repeat=1, n_inputs=1, device="cpu")
>>> [(r["op"], r["D"], sorted(r["us"])) for r in g["results"]]
[('spmm', 4, ['scipy', 'tcgnn_ref']), ('sddmm', 4, ['numpy_gather_dot', 'tcgnn_ref'])]
"""

from ..tiles import translate as sgt_translate  # SGT alone (canonical CSR in), what the SGT timings time
from . import _kernels  # noqa: F401  (registers the "baseline" kernel family)
from ._baselines import CSR_ALG2, CSR_ALG3, CusparseRowMajor, CusparseSDDMM, GatherDotSDDMM
from ._first import first_product_markdown, first_product_times
from ._gnn import HIDDEN, JAX_COLUMNS, bench_gnn, gnn_markdown, gnn_problem, load_baselines, train_step
from ._graphs import SYNTHETIC, resolve_graph
from ._run import bench_graph, bench_reorder, distinct_window_columns, traffic_bytes
from ._report import CLOCKS
from ._timing import (copy_bandwidth, settle, time_back_to_back, time_events, time_host, time_per_call, time_queued,
                      time_rotating)
from ..kernels.registry import wait_for_compiles  # a product's timed choice compiles its candidates in the background

__all__ = [
    "bench_graph",
    "settle",
    "first_product_times",
    "first_product_markdown",
    "sgt_translate",
    "bench_reorder",
    "resolve_graph",
    "SYNTHETIC",
    "bench_gnn",
    "load_baselines",
    "gnn_markdown",
    "gnn_problem",
    "train_step",
    "HIDDEN",
    "JAX_COLUMNS",
    "traffic_bytes",
    "distinct_window_columns",
    "CusparseRowMajor",
    "CusparseSDDMM",
    "GatherDotSDDMM",
    "CSR_ALG2",
    "CSR_ALG3",
    "time_events",
    "time_host",
    "time_rotating",
    "time_queued",
    "time_back_to_back",
    "time_per_call",
    "copy_bandwidth",
    "CLOCKS",
    "wait_for_compiles",
]
