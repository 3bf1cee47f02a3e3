"""tcgnn_py: sparse graph operations on NVIDIA tensor cores, in pure Python.

Public names live here; the implementation is in private modules by concern
(layers: 0 validation/device/reference/io, 1 kernels, 2 sgt/ops/reorder, 3 TiledMatrix,
4 nn).
"""

from ._device import NoGPUWarning, gpu_available
from ._io import Graph, load_cora, load_graph
from ._reorder import NMReport, Permutation, best_pattern, nm_report, reorder
from ._synth import power_law_graph
from ._tiled import TiledMatrix, TileStats, sddmm, spmm

from . import nn  # noqa: E402  (layer 4: imports the names above)

__version__ = "0.1.0"

__all__ = [
    "nn",
    "TiledMatrix",
    "TileStats",
    "spmm",
    "sddmm",
    "gpu_available",
    "NoGPUWarning",
    "Graph",
    "load_cora",
    "load_graph",
    "power_law_graph",
    "reorder",
    "Permutation",
    "NMReport",
    "nm_report",
    "best_pattern",
]
