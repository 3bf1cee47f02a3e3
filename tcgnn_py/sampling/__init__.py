"""Layer 2: neighbor sampling on the graph's device (:mod:`._neighbors`).

The names other packages use are here: they import this package, never its private modules.
"""

from ._neighbors import (GOLDEN, HOP_BOUND_BYTES, NODE_MIX, RECORDED_KEPT, SORT_ROWS_MAX, RecordedHops, Relabel,
                         hop_kernels, row_entries, sample_hops, sample_neighbors, sample_reference, splitmix64)

__all__ = ["sample_neighbors", "sample_reference", "sample_hops", "hop_kernels", "RecordedHops", "row_entries",
           "Relabel", "splitmix64", "GOLDEN", "NODE_MIX", "SORT_ROWS_MAX", "HOP_BOUND_BYTES", "RECORDED_KEPT"]
