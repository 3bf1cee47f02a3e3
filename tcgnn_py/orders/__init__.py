"""Layer 0: vertex orders -- ``Permutation`` (:mod:`._permutation`), the N:M reorder and its reference
(:mod:`._reorder`, :mod:`._nm_reference`), the locality order (:mod:`._locality`).
"""
