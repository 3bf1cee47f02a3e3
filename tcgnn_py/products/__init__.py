"""Layer 2: the product engine -- SpMM and SDDMM on a tiling, one home per kernel family.

``TiledMatrix`` and ``nn`` enter through this package's names only (:mod:`._dispatch` is the front door;
``attention`` the fused attention family, which ``nn.graph_attention`` runs; ``dense``, ``pointwise`` and
``optimizer`` the layers' dense products, their elementwise tails and row-wise helpers, and Adam, which ``nn``
runs).  Below it:

* ``_modes``: operands and the one precision vocabulary (:class:`._modes.Mode`);
* ``_problem``: what a product's plan is made of, decided once per signature (``Operand``, ``Problem``, ``Plan``);
* ``_plans``: work plans and tiling-derived data; ``_values``: the values' cast, dense and 16-bit forms;
* ``_launch``: the products' launches, their scratch and fixup, and how one runs or is bound;
* ``_small``: what the small-kernel families share (their launches by name, kept per signature);
* ``_autotune``: the timed choice among a family's bit-identical launches (it knows no family);
* ``_vec_layout``: the vector layout's partition, shared by its float32 and 16-bit families;
* ``families/``: ``tf32``, ``core``, ``vec``, ``half``, ``sparse``, ``attention``, ``dense``, ``pointwise`` and
  ``optimizer`` -- each family's launch rule, candidates and argument lists (a family imports no sibling).
"""

from ._dispatch import (DEVICE_VALUES, MISMATCH, Plan, as_operand, check_out, result_dtype, sddmm_raw, signature,
                        spmm_raw, timed_choices)
from ._autotune import settle
from ._launch import recycled
from ._problem import Operand, Problem
from .families import attention, dense, optimizer, pointwise

__all__ = ["DEVICE_VALUES", "MISMATCH", "Operand", "Plan", "Problem", "as_operand", "attention", "check_out", "dense",
           "optimizer", "pointwise", "recycled", "result_dtype", "sddmm_raw", "settle", "signature",
           "spmm_raw", "timed_choices"]
