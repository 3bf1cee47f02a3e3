"""Layer 1: the ``"attention"`` family: graph attention fused into one pass per row (scores, softmax, aggregation).

For each row i of a CSR graph and each head h: ``out[i, h] = sum_j P_ij,h V[j, h]`` with
``P_ij,h = a_ij exp(z_ij,h) / sum_k a_ik exp(z_ik,h)`` over the row's stored entries (``a`` the
entries' non-negative values, 1 when there are none).  The scores never reach global memory: a warp walks its row's
entries once, keeping for each of its features a running maximum, the running sum of ``a exp(z - max)``
and the weighted sum of ``V`` rows (the online softmax of FlashAttention), and writes one log-sum-exp per
row and head for the backward pass, which recomputes ``P`` from it.

Scores (``KIND``):

``ADDITIVE`` (GAT)
    ``z_ij,h = LeakyReLU(s_dst[i, h] + s_src[j, h])`` from two per-node, per-head arrays: no SDDMM.
``COSINE`` (AGNN, one head)
    ``z_ij = beta * <Q[i], K[j]>`` of given (row-normalised) Q and K: one warp-wide dot per entry.

Lanes cover the ``heads * D`` features of a row, ``C`` per lane (``32 * C`` at most); CUDA cores, float32
accumulation (exact in float32 where the reference is).  Rows whose entries all weigh 0, and empty rows,
give 0 and a log-sum-exp of -inf.  A NaN score makes its row's head NaN, as the unfused softmax does.
"""

import dataclasses
from typing import ClassVar

from .products.common import KernelConfig, cuda_type
from .registry import register

__all__ = ["ATTENTION_CHUNKS", "ATTENTION_CONFIGS", "ADDITIVE", "COSINE", "AttentionFwd", "attention_config",
           "SOURCE", "NAMES"]

ADDITIVE, COSINE = 0, 1
#: Features per lane: a row's ``heads * D`` features are covered by ``32 * C`` lanes' slots.
ATTENTION_CHUNKS = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class AttentionFwd(KernelConfig):
    """``tcgnn_attention_fwd<T, KIND, C>``: features (and V) of type T, scores of KIND, C features per lane."""

    KERNEL: ClassVar[str] = "tcgnn_attention_fwd"
    T: str
    KIND: int
    C: int


def attention_config(dtype_name, kind, features):
    """The forward kernel for ``features = heads * D`` of ``dtype_name``: the fewest chunks that cover them."""
    chunks = next((c for c in ATTENTION_CHUNKS if 32 * c >= features), None)
    if chunks is None:
        raise ValueError(f"the fused attention covers heads * D <= {32 * ATTENTION_CHUNKS[-1]} features, "
                         f"got {features}")
    return AttentionFwd(cuda_type(dtype_name), kind, chunks)


SOURCE = r"""
#define TC_NEG_INF __int_as_float(0xff800000)
typedef unsigned short tc_bits16;
struct tc_f16 { tc_bits16 x; };
struct tc_bf16 { tc_bits16 x; };

__device__ __forceinline__ float tc_load(const float* p) { return *p; }
__device__ __forceinline__ float tc_load(const tc_f16* p) {
    float f;
    asm("{ .reg .b16 h; ld.global.b16 h, [%1]; cvt.f32.f16 %0, h; }" : "=f"(f) : "l"(p));
    return f;
}
__device__ __forceinline__ float tc_load(const tc_bf16* p) {
    return __uint_as_float(((unsigned)((const tc_bits16*)p)[0]) << 16);
}
__device__ __forceinline__ void tc_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void tc_store(tc_f16* p, float v) {
    asm volatile("{ .reg .b16 h; cvt.rn.f16.f32 h, %1; st.global.b16 [%0], h; }" ::"l"(p), "f"(v));
}
__device__ __forceinline__ void tc_store(tc_bf16* p, float v) {
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) u = 0x7fc00000u;  // NaN stays NaN
    else u += 0x7fffu + ((u >> 16) & 1u);                      // round to nearest even
    ((tc_bits16*)p)[0] = (tc_bits16)(u >> 16);
}

// Attention dropout: entry e (CSR order) of head h is kept where the 24 high bits of a hash of (e * heads + h,
// seed) are at least p * 2^24; kept entries weigh 1 / (1 - p) in the sum, and all of them in the softmax's
// normalisation (PyTorch Geometric's order: softmax, then dropout).  _reference.attention_keep is the same hash.
__device__ __forceinline__ bool tc_keep(unsigned e, unsigned seed, float p) {
    unsigned x = e ^ (seed * 0x9E3779B9u);
    x ^= x >> 16; x *= 0x85EBCA6Bu; x ^= x >> 13; x *= 0xC2B2AE35u; x ^= x >> 16;
    return (float)(x >> 8) * 5.9604644775390625e-8f >= p;
}

// One warp per row; lane `lane` holds features f = lane + 32 c (c < C) of the row's heads * D.
// weights: the entries' values (nullptr: all 1).  ADDITIVE reads s_src / s_dst ((n, heads) float);
// COSINE reads Q / K ((n, D) of T, one head) and beta (one float).
template <typename T, int KIND, int C>
__global__ void __launch_bounds__(256)
tcgnn_attention_fwd(const int* __restrict__ indptr, const int* __restrict__ indices,
                    const float* __restrict__ weights, const T* __restrict__ V,
                    const float* __restrict__ s_src, const float* __restrict__ s_dst,
                    const T* __restrict__ Q, const T* __restrict__ K, const float* __restrict__ beta,
                    T* __restrict__ out, float* __restrict__ lse, int n_rows, int heads, int D, float slope,
                    float drop_p, const unsigned* __restrict__ seed) {
    const int lane = threadIdx.x & 31;
    const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= n_rows) return;
    const int HD = heads * D;
    float acc[C], m[C], l[C], sd[C], q[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        acc[c] = 0.f;
        m[c] = TC_NEG_INF;
        l[c] = 0.f;
        const int f = lane + 32 * c;
        sd[c] = (KIND == 0 && f < HD) ? s_dst[row * heads + f / D] : 0.f;
        q[c] = (KIND == 1 && f < D) ? tc_load(Q + row * D + f) : 0.f;
    }
    const float b = KIND == 1 ? beta[0] : 0.f;
    const unsigned sv = drop_p > 0.f ? seed[0] : 0u;
    const float kept = drop_p > 0.f ? 1.f / (1.f - drop_p) : 1.f;
    const int e0 = indptr[row], e1 = indptr[row + 1];
    for (int e = e0; e < e1; ++e) {
        const long long j = indices[e];
        const float w = weights ? weights[e] : 1.f;
        if (w == 0.f) continue;      // an entry of weight 0 takes no part
        const float lw = logf(w);  // weights are non-negative (a negative or NaN one poisons its row)
        float zc = 0.f;
        if (KIND == 1) {
            float part = 0.f;
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const int f = lane + 32 * c;
                if (f < D) part += q[c] * tc_load(K + j * D + f);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
            zc = b * part;
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int f = lane + 32 * c;
            if (f >= HD) continue;
            float z;
            if (KIND == 0) {
                z = sd[c] + s_src[j * heads + f / D];
                z = z > 0.f ? z : z * slope;
            } else {
                z = zc;
            }
            z += lw;  // a exp(z) = exp(z + log a): the weight joins the running maximum
            const float mn = z > m[c] ? z : m[c];  // a NaN z leaves the maximum; its p poisons the sums
            if (mn == TC_NEG_INF) continue;         // nothing yet but -inf scores: they add 0
            const float scale = expf(m[c] - mn);
            const float p = expf(z - mn);
            const float pv = drop_p > 0.f ? (tc_keep((unsigned)e * heads + f / D, sv, drop_p) ? p * kept : 0.f) : p;
            acc[c] = acc[c] * scale + pv * tc_load(V + j * HD + f);
            l[c] = l[c] * scale + p;
            m[c] = mn;
        }
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        if (f >= HD) continue;
        tc_store(out + row * HD + f, l[c] != 0.f ? acc[c] / l[c] : 0.f);
        if (f % D == 0) lse[row * heads + f / D] = l[c] != 0.f ? m[c] + logf(l[c]) : TC_NEG_INF;
    }
}
"""

#: Every compiled forward: float32 and 16-bit features, both score kinds, each chunk count.
ATTENTION_CONFIGS = tuple(AttentionFwd(cuda_type(t), k, c) for t in ("float32", "float16", "bfloat16")
                          for k in (ADDITIVE, COSINE) for c in ATTENTION_CHUNKS)
NAMES = tuple(c.name for c in ATTENTION_CONFIGS)
register("attention", SOURCE, NAMES)
