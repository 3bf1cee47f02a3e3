"""Layer 2: the tiled format -- SGT's translation into condensed tiles (:mod:`._sgt`), the ``Tiling`` it
builds (:mod:`._tiling`), and the N:M layouts' window grouping (:mod:`._nm_group`, its reference
:mod:`._nm_windows`).
"""
