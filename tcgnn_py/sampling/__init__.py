"""Layer 2: neighbor sampling on the graph's device (:mod:`._neighbors`).

The names other packages use are here: they import this package, never its private modules.
"""

from ._neighbors import GOLDEN, NODE_MIX, sample_neighbors, sample_reference

__all__ = ["sample_neighbors", "sample_reference", "GOLDEN", "NODE_MIX"]
