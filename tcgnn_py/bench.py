"""Benchmarks: ``python -m tcgnn_py.bench sgt GRAPH ...``.

Graphs are names under ``$TCGNN_PY_DATA``, ``.gpu/data`` or ``../shared/data``,
paths to a graph folder / ``.npz`` / ``.mtx``, or ``powerlaw:N:NNZ`` (synthetic).
Times are CUDA-event medians after warm-up (see the developers' METHOD).
"""

import argparse
import json
import os
import pathlib
import statistics
import sys

import numpy as np

from . import _sgt
from ._device import get_cupy
from ._io import load_graph
from ._synth import power_law_graph
from ._tiled import TiledMatrix

_DATA = [os.environ.get("TCGNN_PY_DATA"), ".gpu/data", "../shared/data"]


def resolve_graph(spec):
    """``(name, scipy csr_array)`` for a graph spec."""
    if spec.startswith("powerlaw:"):
        _, n, nnz = spec.split(":")
        return f"powerlaw-{n}-{nnz}", power_law_graph(int(n), int(nnz), seed=0)
    for root in filter(None, _DATA):
        p = pathlib.Path(root) / spec
        if (p / "adj_csr.npz").exists():
            return spec, load_graph(p).adj
    return pathlib.Path(spec).stem, load_graph(spec).adj


def time_events(fn, repeat=10, warmup=2):
    """Median milliseconds of ``fn()`` between CUDA events, and every sample."""
    cp = get_cupy()
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, stop))
    return statistics.median(samples), samples


def bench_sgt(spec, repeat=10, tile_shape=(16, 8)):
    """SGT of one graph: device translation time per edge, end-to-end time, tile stats."""
    cp = get_cupy()
    name, A = resolve_graph(spec)
    A.sum_duplicates()
    d = [cp.asarray(a) for a in (A.data.astype(np.float32), A.indices.astype(np.int32), A.indptr.astype(np.int32))]
    sgt_ms, samples = time_events(lambda: _sgt.translate(*d, A.shape, *tile_shape), repeat)
    e2e_ms, _ = time_events(lambda: TiledMatrix(A, tile_shape=tile_shape), repeat)
    stats = TiledMatrix(A, tile_shape=tile_shape).tile_stats()
    return {
        "graph": name,
        "nodes": A.shape[0],
        "nnz": int(A.nnz),
        "sgt_ms": sgt_ms,
        "sgt_ns_per_edge": sgt_ms * 1e6 / max(A.nnz, 1),
        "sgt_samples_ms": samples,
        "from_host_ms": e2e_ms,
        "stats": {
            "windows": stats.windows,
            "blocks_before": stats.blocks_before,
            "blocks": stats.blocks,
            "block_reduction": stats.block_reduction,
            "density_before": stats.density_before,
            "density": stats.density,
            "max_blocks_per_window": stats.max_blocks_per_window,
        },
        "stats_str": str(stats),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tcgnn_py.bench", description=__doc__)
    ap.add_argument("what", choices=["sgt"])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", help="write all results to this file")
    args = ap.parse_args(argv)
    rows = [bench_sgt(g, args.repeat) for g in args.graphs]
    print(f"{'graph':<28}{'nnz':>12}{'SGT ms':>10}{'ns/edge':>9}{'host->tiled ms':>16}")
    for r in rows:
        print(f"{r['graph']:<28}{r['nnz']:>12,}{r['sgt_ms']:>10.3f}{r['sgt_ns_per_edge']:>9.2f}{r['from_host_ms']:>16.2f}")
    for r in rows:
        print(f"tile_stats {r['graph']}: {r['stats_str']}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
