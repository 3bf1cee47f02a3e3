"""Layer 2: the tiled format -- SGT's translation into condensed tiles (:mod:`._sgt`), the ``Tiling`` it
builds (:mod:`._tiling`), and the N:M layouts' window grouping (:mod:`._nm_group`, its reference
:mod:`._nm_windows`).

The names other packages use are here: they import this package, never its private modules.
"""

from ._nm_group import group_slots, regroup
from ._nm_windows import nm_groups
from ._sgt import (DERIVED, HOST_PLAN_MAX, WindowStats, block_meta_layout, csr_transpose, host_limit, kernels_ran,
                   on_host, tile, translate, upload)
from ._tiling import DEFAULT_LAYOUT, LAYOUTS, STRUCTURE, Layout, Tiling, TileStats, resolve_layout

__all__ = ["Tiling", "TileStats", "Layout", "LAYOUTS", "DEFAULT_LAYOUT", "STRUCTURE", "DERIVED", "HOST_PLAN_MAX",
           "WindowStats", "block_meta_layout", "resolve_layout", "tile",
           "translate", "csr_transpose", "host_limit", "kernels_ran", "on_host", "upload", "regroup",
           "group_slots", "nm_groups"]
