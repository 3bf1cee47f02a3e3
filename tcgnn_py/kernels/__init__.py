"""Layer 1: all CUDA code of tcgnn_py lives in this package.

Numba CUDA kernels (imported lazily: importing them imports Numba):

``sgt``
    Sparse Graph Translation: rank, condense, count and scatter the edges.
``reorder``
    The N:M reorder's bit packing, position codes, meta-block counts and
    stage-2 swap rounds.
``locality``
    The locality reorder's coarsening step (each vertex's best partner).
``nm_windows``
    The N:M layouts' window grouping, one warp per row window.
``sample``
    The neighbor sampler: each node's draws, Floyd's algorithm past the
    fan-out.
``warp``
    What they share: ``FULL_MASK`` and the warp-level binary search.

CuPy RawModule kernel families (CUDA C++ kept as Python strings), compiled
once per process and device through :func:`registry.get_kernel`:

``"tf32"`` (:mod:`.products`)
    Tensor-core SpMM and SDDMM for float32 data on ``16 x 8`` tiles.
``"vec"`` (:mod:`.products`)
    Tensor-core SpMM (register and ``cp.async`` gathers) and SDDMM for float32
    data on the vector layout's ``8 x 4`` blocks, operands swapped.
``"half"`` (:mod:`.products`)
    float16 / bfloat16 SpMM on the vector layout (``mma.m16n8k16``, float32
    accumulation), for float32 matrices (values as two 16-bit parts) and 16-bit ones.
``"sparse"`` (:mod:`.products`)
    SpMM on the N:M layouts through sparse tensor cores (``mma.sp``).
``"core"`` (:mod:`.products`)
    CUDA-core SpMM and SDDMM in the data's own precision, any tile shape.
``"attention"`` (:mod:`.attention`)
    Graph attention fused into one pass per row (scores, online softmax, aggregation).
``"dist"`` (:mod:`.dist`)
    What a distributed product moves: rows packed into send buffers (cast to
    16-bit halos), and rows added into a result.
``"nn"`` (:mod:`.nn`)
    Training helpers of :mod:`tcgnn_py.nn` (a fused Adam step).
``"timing"`` (:mod:`.timing`)
    A spin kernel that holds a stream while the host queues launches to time
    (the products' timed launch choice, the benchmarks' GPU-only clock).

Packages above may register their own families (the benchmarks' baseline
SDDMM does, from :mod:`tcgnn_py.bench`); :func:`registry.families` lists them
all, and CI compiles every one through NVRTC.  :mod:`.launch` holds the launch
geometry that needs no Numba (threads per block, grid sizes).

Launch paths:

``numba_launch``
    Numba kernels on CuPy's current stream; after a signature's first call,
    Numba's cubin is launched through the driver (no per-call dispatch).
``driver``
    ``cuLaunchKernel`` through ``ctypes`` with one 8-byte slot per parameter,
    and launches bound to fixed parameters (the products' bound plans).
``blas``
    ``cublasGemmEx`` with a handle and workspace owned here: dense products
    that a CUDA-graph capture can hold (CuPy's binding refuses to run there).
"""

from . import attention, dist, nn, products, timing  # noqa: E402,F401  (each registers its kernel families)
