"""Layer 1: launch geometry of the Numba kernels, and their launcher (Numba is imported on first launch only).

``THREADS_PER_BLOCK`` is a multiple of 32, so lane groups of up to 32 lanes stay
inside warps; :func:`grid` covers ``n`` threads with such blocks.
"""

__all__ = ["THREADS_PER_BLOCK", "grid", "launch_numba"]

THREADS_PER_BLOCK = 256


def grid(n_threads):
    """Blocks of :data:`THREADS_PER_BLOCK` that cover ``n_threads`` (at least one)."""
    return max(1, -(-n_threads // THREADS_PER_BLOCK))


def launch_numba(kernel, grid, block, *args):
    """Launch a Numba kernel on CuPy's current stream (see :mod:`.numba_launch`; imports Numba on first use)."""
    from .numba_launch import launch

    launch(kernel, grid, block, *args)
