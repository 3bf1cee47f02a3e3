"""Layer 1: launch geometry of the Numba kernels (no Numba import here).

``THREADS_PER_BLOCK`` is a multiple of 32, so lane groups of up to 32 lanes stay
inside warps; :func:`grid` covers ``n`` threads with such blocks.
"""

__all__ = ["THREADS_PER_BLOCK", "grid"]

THREADS_PER_BLOCK = 256


def grid(n_threads):
    """Blocks of :data:`THREADS_PER_BLOCK` that cover ``n_threads`` (at least one)."""
    return max(1, -(-n_threads // THREADS_PER_BLOCK))
