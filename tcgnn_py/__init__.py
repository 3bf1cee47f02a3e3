"""tcgnn_py: sparse graph operations on NVIDIA tensor cores, in pure Python.

Public names live here; the implementation is in private modules by concern
(layers: 0 validation/device/reference/io/capture, 1 kernels, 2 tiling/sgt/ops/reorder,
3 TiledMatrix, 4 nn and bench).
"""

from ._capture import CUDAGraph
from ._device import DeviceMismatchError, FallbackWarning, NoGPUWarning, gpu_available
from ._io import Graph, load_cora, load_graph
from .orders import (
    LayoutLocality,
    LocalityReport,
    NMReport,
    Permutation,
    best_pattern,
    locality_report,
    nm_report,
    reorder,
)
from ._synth import planted_partition_graph, power_law_graph
from ._tiled import TiledMatrix, issparse, sddmm, spmm
from .tiles import LAYOUTS, Layout, Tiling, TileStats
from ._tuning import options as tuning_options, tuning

from . import nn  # noqa: E402  (layer 4: imports the names above)

__version__ = "0.1.0"

__all__ = [
    "nn",
    "TiledMatrix",
    "TileStats",
    "Tiling",
    "Layout",
    "LAYOUTS",
    "spmm",
    "sddmm",
    "issparse",
    "tuning",
    "tuning_options",
    "CUDAGraph",
    "gpu_available",
    "NoGPUWarning",
    "FallbackWarning",
    "DeviceMismatchError",
    "Graph",
    "load_cora",
    "load_graph",
    "power_law_graph",
    "planted_partition_graph",
    "reorder",
    "Permutation",
    "NMReport",
    "nm_report",
    "best_pattern",
    "locality_report",
    "LocalityReport",
    "LayoutLocality",
]
