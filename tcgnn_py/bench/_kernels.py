"""Layer 4: the benchmarks' own CUDA kernel family, ``"baseline"`` (not the library's product).

A gather-and-dot CSR SDDMM that benchmarks compare against where cuSPARSE
SDDMM is not reachable.  Registered with :mod:`tcgnn_py.kernels.registry`, so it
compiles through the same cached path and CI's NVRTC check.
"""

from ..kernels import registry

__all__ = ["BASELINE_GROUPS", "baseline_sddmm_name", "BASELINE_THREADS"]

#: Lanes per edge of the baseline SDDMM (one sub-warp group per edge).
BASELINE_GROUPS = (4, 8, 16, 32)

_BASELINE = r"""
// Baseline SDDMM over COO: out[e] = <Xa[rows[e]], Xb[cols[e]]> for row-major
// float32 features.  A group of G lanes per edge strides over the features and
// reduces with shfl_xor: one edge per group keeps hub rows balanced.  Lanes
// past nnz stay in the loop with zero work so every shuffle has its full warp.
template <int G>
__global__ void tcgnn_baseline_sddmm_coo(const int* __restrict__ rows, const int* __restrict__ cols,
                                         const float* __restrict__ Xa, const float* __restrict__ Xb,
                                         float* __restrict__ out, long long nnz, int D) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long e = t / G;
    int l = (int)(t % G);
    bool valid = e < nnz;
    float acc = 0.f;
    if (valid) {
        const float* a = Xa + (size_t)rows[e] * D;
        const float* b = Xb + (size_t)cols[e] * D;
        for (int k = l; k < D; k += G) acc = fmaf(__ldg(a + k), __ldg(b + k), acc);
    }
    #pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o, G);
    if (valid && l == 0) out[e] = acc;
}
"""

#: Threads per CTA of the baseline launch.
BASELINE_THREADS = 256


def baseline_sddmm_name(group):
    return f"tcgnn_baseline_sddmm_coo<{group}>"


registry.register("baseline", _BASELINE, tuple(baseline_sddmm_name(g) for g in BASELINE_GROUPS))
