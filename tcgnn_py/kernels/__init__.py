"""Layer 1: all CUDA code of tcgnn_py lives in this package.

``sgt`` holds Numba CUDA kernels.  Importing a submodule imports Numba, so the
rest of the package imports them lazily.
"""

from .._device import _patch_numpy_for_numba

_patch_numpy_for_numba()


def _quiet_numba():
    # Small graphs launch small grids by nature; Numba's occupancy warning is noise there.
    from numba import config

    config.CUDA_LOW_OCCUPANCY_WARNINGS = 0


_quiet_numba()
