"""Layer 1: CuPy RawModule kernels for products over the tiled format, one module per family.

Kernel families, each in its own module (CUDA C++ kept there as a string),
compiled through :mod:`tcgnn_py.kernels.registry`; each module declares its
kernels' configs (frozen dataclasses named and ordered as the CUDA templates'
parameters, :class:`.common.KernelConfig`) and generates its compiled variants'
name expressions from them:

``"tf32"``
    Tensor-core SpMM and SDDMM for float32 data on ``16 x 8`` tiles: operands
    rounded to TF32, products accumulated in float32, through inline PTX
    ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``.
``"vec"``
    Tensor-core SpMM and SDDMM for float32 data on the vector layout (8-row
    windows, ``8 x 4`` blocks of condensed column vectors), operands swapped:
    X is the MMA's A operand.  One warp per (balanced unit, feature slice); split
    windows are summed inside the launch (``tcgnn_spmm_vec*``, COMBINE).
``"half"``
    float16 / bfloat16 SpMM on the vector layout (``mma.m16n8k16`` with float32
    accumulation, X staged by cp.async and read back with ``ldmatrix.trans``),
    for float32 matrices (values as two 16-bit parts) and 16-bit ones.
``"sparse"``
    SpMM on the N:M layouts through sparse tensor cores (``mma.sp``): 2:4 with
    float16 / bfloat16 X, 1:2 with TF32 (float32 X); compressed blocks and
    their metadata in fragment order (:mod:`tcgnn_py.products.families.sparse`).
``"core"``
    CUDA-core SpMM and SDDMM in the data's own precision (float or double),
    for any tile shape: ``precision="fp32"`` and every float64 product.

No ``#include``: NVRTC on a pip-only install has no ``crt/mma.h``, and inline
PTX needs no header.  CI compiles every source for sm_80 and sm_90 through
NVRTC directly (``tests/test_nvrtc.py``).

Work decomposition (16x8 SpMM): the host builds *units* -- ``int4`` rows
``(window, first block, end block, partial slot)``.  A CTA takes one unit and
its warps stride over the unit's blocks; warps meet in shared memory and the
CTA writes the window's rows once, or, when a long (hub) window is split over
several units, a partial tile; the CTA that stores a window's slab last sums
the window's partial tiles in unit order (``tc_cta_combine``; without counters,
:func:`tcgnn_spmm_fixup` does it in a second launch, in the same order).
Every output element is written by exactly one thread and the summation order
is fixed, so results are deterministic run to run.
"""

from . import common, core, half, sparse, tf32, vec
from .common import *  # noqa: F401,F403
from .core import *  # noqa: F401,F403
from .half import *  # noqa: F401,F403
from .sparse import *  # noqa: F401,F403
from .tf32 import *  # noqa: F401,F403
from .vec import *  # noqa: F401,F403



#: ``family -> (CUDA source, name expressions)`` of the product families, one module each.
FAMILIES = {name: (mod.SOURCE, mod.NAMES) for name, mod in
            (("tf32", tf32), ("core", core), ("vec", vec), ("half", half), ("sparse", sparse))}

__all__ = sorted({n for mod in (common, core, half, sparse, tf32, vec) for n in mod.__all__} | {"FAMILIES"})
