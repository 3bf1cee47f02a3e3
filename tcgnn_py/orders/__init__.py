"""Layer 2: vertex orders -- ``Permutation`` (:mod:`._permutation`), the N:M reorder and its reference
(:mod:`._reorder`, :mod:`._nm_reference`), the locality order (:mod:`._locality`).

The names other packages use are here: they import this package, never its private modules.
"""

from ._locality import degree_order, run_heads, symmetric_pattern
from ._permutation import Permutation
from ._reorder import (LayoutLocality, LocalityReport, NMReport, best_pattern, locality_report, nm_report,
                       reorder)

__all__ = ["Permutation", "reorder", "locality_report", "nm_report", "best_pattern", "NMReport", "LocalityReport",
           "LayoutLocality", "degree_order", "symmetric_pattern", "run_heads"]
