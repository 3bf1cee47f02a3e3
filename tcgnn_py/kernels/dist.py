"""Layer 1: CUDA source of the ``"dist"`` RawModule family: what a distributed product moves between GPUs.

* ``tcgnn_pack_rows<TX, TY>``: the rows a peer asked for, gathered into one contiguous send buffer and cast
  (float32 rows to float16 / bfloat16 halos, rounded to nearest even), counting finite values the 16-bit type
  cannot hold (they would arrive as infinities: the caller raises instead).
* ``tcgnn_add_rows<TZ>``: ``Y[rows[i]] += Z[i]`` in float32 -- a product's halo part added to its own part,
  and the partial sums of ``Aᵀ @ G`` that peers send back added into their owners' rows.

A row is one block's work, its features strided over the threads: rows of any width, reads and writes
coalesced.  Listed in :func:`tcgnn_py.kernels.registry.families` (NVRTC-compiled in CI).
"""

from .products.common import COMMON_SOURCE, cuda_type
from .registry import register

__all__ = ["SOURCE", "NAMES", "ROW_THREADS", "HALO_TYPES", "pack_name", "add_name"]

#: Threads per block of both kernels (a row per block, its features strided over them).
ROW_THREADS = 128

_DIST = r"""
template <typename TX, typename TY>
__global__ void tcgnn_pack_rows(const TX* __restrict__ X, const long long* __restrict__ idx, long long n_rows,
                                int D, TY* __restrict__ out, unsigned* __restrict__ overflow, float limit) {
    for (long long i = blockIdx.x; i < n_rows; i += gridDim.x) {
        const TX* src = X + idx[i] * (long long)D;
        TY* dst = out + i * (long long)D;
        for (int j = threadIdx.x; j < D; j += blockDim.x) {
            const float v = tc_f32_of(src[j]);
            if (limit > 0.f && fabsf(v) > limit && isfinite(v)) atomicAdd(overflow, 1u);
            tc_put(dst + j, v);
        }
    }
}

template <typename TZ>
__global__ void tcgnn_add_rows(float* __restrict__ Y, const long long* __restrict__ rows, long long n_rows, int D,
                               const TZ* __restrict__ Z) {
    for (long long i = blockIdx.x; i < n_rows; i += gridDim.x) {
        float* y = Y + rows[i] * (long long)D;
        const TZ* z = Z + i * (long long)D;
        for (int j = threadIdx.x; j < D; j += blockDim.x) y[j] += tc_f32_of(z[j]);
    }
}
"""

SOURCE = COMMON_SOURCE + _DIST

#: The dtypes halo rows may travel in.
HALO_TYPES = ("float32", "float16", "bfloat16")


def pack_name(x_type, halo_type):
    """``tcgnn_pack_rows`` reading ``x_type`` rows (float32 or 16-bit) into a ``halo_type`` buffer."""
    return f"tcgnn_pack_rows<{cuda_type(x_type)}, {cuda_type(halo_type)}>"


def add_name(z_type):
    """``tcgnn_add_rows`` adding ``z_type`` rows into float32 ones."""
    return f"tcgnn_add_rows<{cuda_type(z_type)}>"


NAMES = tuple([pack_name(x, h) for x in HALO_TYPES for h in HALO_TYPES] + [add_name(z) for z in HALO_TYPES])
register("dist", SOURCE, NAMES)
