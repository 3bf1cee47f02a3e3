"""Layer 1: the ``"attention"`` family: graph attention fused into one pass per row (scores, softmax, aggregation).

For each row i of a CSR graph and each head h: ``out[i, h] = sum_j P_ij,h V[j, h]`` with
``P_ij,h = a_ij exp(z_ij,h) / sum_k a_ik exp(z_ik,h)`` over the row's stored entries (``a`` the
entries' non-negative values, 1 when there are none).  The scores never reach global memory: a warp walks its row's
entries once, keeping a running maximum, the running sum of ``a exp(z - max)`` and the weighted sum of
``V`` rows (the online softmax of FlashAttention), and writes one log-sum-exp per
row and head for the backward pass, which recomputes ``P`` from it: a warp per row (the gradients of the row's
own inputs, and each entry's two backward factors, 8 bytes per entry and head) and a warp per column of Aᵀ's CSR
(those of its partners', from the factors, with no score recomputed), sums in entry order.  A long row or
column is cut into parts; the last of its parts to finish (a counter per owner decides which) merges them in part
order, inside the same launch: the results do not depend on which part finishes last.

Scores (``KIND``):

``ADDITIVE`` (GAT)
    ``z_ij,h = LeakyReLU(s_dst[i, h] + s_src[j, h])`` from two per-node, per-head arrays: no SDDMM.
``COSINE`` (AGNN, one head)
    ``z_ij = beta * <Q[i], K[j]>`` of given (row-normalised) Q and K: one warp-wide dot per entry.

A warp takes one row (or column) and one head; its lanes cover the head's ``D`` features, ``C`` per lane
(``32 * C`` at most), and its entries 32 at a time (one score per lane, one rescale per chunk); CUDA cores,
float32 accumulation.  Rows whose entries all weigh 0, and empty rows, give 0 and a log-sum-exp of -inf.  A NaN
score makes its row's head NaN, as the unfused softmax does.
"""

import dataclasses
from typing import ClassVar

from .products.common import COMMON_SOURCE, KernelConfig, cuda_type
from .registry import register

__all__ = [
    "ATTENTION_UNIT", "ATTENTION_SMALL_UNIT", "ATTENTION_MAX_UNIT", "ATTENTION_MAX_HEADS", "ATTENTION_WARPS",
    "ATTENTION_CHUNKS",
    "ATTENTION_CONFIGS", "ADDITIVE", "COSINE", "AttentionFwd", "AttentionBwd", "AttentionCosBwd", "AttentionBwdCols",
    "attention_unit", "attention_config", "attention_bwd_config", "SOURCE", "NAMES"
]

ADDITIVE, COSINE = 0, 1
#: A row (or, in the backward pass, a column) of more entries than ``attention_unit(heads)`` is cut into parts of
#: that many, each taken by its own warps (one per head) and merged in part order: a hub's entries then spread over
#: the GPU; with more heads a row already has more warps, so its parts grow, up to ``ATTENTION_MAX_UNIT`` (the merges
#: stay few).  Where a pass fills the GPU, with the units longest first (a block's warps end together), parts of
#: 128 entries per head measured faster than parts of 64 (more merges) and of 256 (a longer last warp).
ATTENTION_UNIT = 128
#: Entries per part and head where a pass's warps do not fill the GPU: its time is then its longest part's, which
#: parts of ``ATTENTION_UNIT`` make longer.
ATTENTION_SMALL_UNIT = 64
#: The largest part (entries of one row or column per warp and head); a larger cap measured slower at 4 heads.
ATTENTION_MAX_UNIT = 512
#: Heads of one fused call (the scope of the layers: GAT's 1-8 heads).
ATTENTION_MAX_HEADS = 8
#: Warps per CTA (a warp takes one row or column, or a part of one, and one head).
ATTENTION_WARPS = 8
#: Features per lane: a head's ``D`` features are covered by ``32 * C`` lanes' slots.
ATTENTION_CHUNKS = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class AttentionFwd(KernelConfig):
    """``tcgnn_attention_fwd<T, KIND, C>``: features (and V) of type T, scores of KIND, C features per lane."""

    KERNEL: ClassVar[str] = "tcgnn_attention_fwd"
    T: str
    KIND: int
    C: int


@dataclasses.dataclass(frozen=True)
class AttentionBwd(KernelConfig):
    """``tcgnn_attention_bwd<T, C>``: the additive scores' backward pass over the rows, a warp per row and head (C
    features per lane of the head's D)."""

    KERNEL: ClassVar[str] = "tcgnn_attention_bwd"
    T: str
    C: int


@dataclasses.dataclass(frozen=True)
class AttentionCosBwd(KernelConfig):
    """``tcgnn_attention_cos_bwd<T, C>``: the cosine scores' backward pass over the rows."""

    KERNEL: ClassVar[str] = "tcgnn_attention_cos_bwd"
    T: str
    C: int


@dataclasses.dataclass(frozen=True)
class AttentionBwdCols(KernelConfig):
    """``tcgnn_attention_bwd_cols<T, KIND, C>``: the backward pass over the columns, of either score kind: the
    rows pass's factors summed, a warp per column and head."""

    KERNEL: ClassVar[str] = "tcgnn_attention_bwd_cols"
    T: str
    KIND: int
    C: int


def attention_bwd_config(dtype_name, kind, mode, width):
    """The backward kernel of scores ``kind`` over the rows (``mode`` 0) or the columns (1) for heads of ``width``
    features (a warp takes one head)."""
    t, chunks = cuda_type(dtype_name), attention_config(dtype_name, kind, width).C
    if mode == 1:
        return AttentionBwdCols(t, kind, chunks)
    return (AttentionBwd if kind == ADDITIVE else AttentionCosBwd)(t, chunks)


def attention_unit(heads, fills=True):
    """Entries per part of a long row or column for ``heads`` heads: ``ATTENTION_UNIT`` per head, at most
    ``ATTENTION_MAX_UNIT``; ``ATTENTION_SMALL_UNIT`` per head where the pass's warps do not ``fill`` the GPU."""
    return min(ATTENTION_MAX_UNIT, (ATTENTION_UNIT if fills else ATTENTION_SMALL_UNIT) * heads)


def attention_config(dtype_name, kind, width):
    """The forward kernel for heads of ``width`` features of ``dtype_name``: the fewest chunks that cover them."""
    chunks = next((c for c in ATTENTION_CHUNKS if 32 * c >= width), None)
    if chunks is None:
        raise ValueError(f"the fused attention covers heads of D <= {32 * ATTENTION_CHUNKS[-1]} features, "
                         f"got {width}")
    return AttentionFwd(cuda_type(dtype_name), kind, chunks)


_ATTENTION = r"""
#define TC_NEG_INF __int_as_float(0xff800000)

// One element as float32 (COMMON_SOURCE's conversions of float, tc_f16 and tc_bf16).
template <typename T>
__device__ __forceinline__ float tc_load(const T* p) { return tc_f32_of(*p); }

// Attention dropout: entry e (CSR order) of head h is kept where the 24 high bits of a hash of (e * heads + h,
// seed) are at least p * 2^24; kept entries weigh 1 / (1 - p) in the sum, and all of them in the softmax's
// normalisation (PyTorch Geometric's order: softmax, then dropout).  _reference.attention_keep is the same hash.
__device__ __forceinline__ bool tc_keep(unsigned e, unsigned seed, float p) {
    unsigned x = e ^ (seed * 0x9E3779B9u);
    x ^= x >> 16; x *= 0x85EBCA6Bu; x ^= x >> 13; x *= 0xC2B2AE35u; x ^= x >> 16;
    return (float)(x >> 8) * 5.9604644775390625e-8f >= p;
}

// K (2, 4 or 8) warp-wide sums at once: lane L returns the sum over the warp of v[L / (32 / K)].  Each step
// halves the values a lane holds, sending the half its partner keeps (K - 1 + 5 - log2 K shuffles, 9 for 8 sums,
// where summing each alone takes 5 K); every sum is the xor butterfly's own tree (lanes paired by bit 4, then 3,
// ...), so it equals, bit for bit, `for (o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o)` on that value.
template <int K>
__device__ __forceinline__ float tc_warp_sums(float (&v)[K], int lane) {
#pragma unroll
    for (int n = K, o = 16; n > 1; n >>= 1, o >>= 1) {
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < n / 2; ++i) {
            const float send = up ? v[i] : v[i + n / 2];
            const float keep = up ? v[i + n / 2] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
    float r = v[0];
#pragma unroll
    for (int o = 16 / K; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
    return r;
}

// This warp has stored its part of a long owner (``parts`` parts, counted in *counter): count it.  True in the
// warp of the owner's last part to finish, which then sees every part (fences release this part and acquire the
// others; the merge reads them through L2, where the other SMs wrote them).  The merging warp resets the counter.
__device__ __forceinline__ bool tc_att_last(int* counter, int parts, int lane) {
    __threadfence();
    __syncwarp();
    int last = 0;
    if (lane == 0) last = atomicAdd(counter, 1) == parts - 1;
    last = __shfl_sync(0xffffffffu, last, 0);
    if (last) __threadfence();
    return last;
}

// Element `at` of the forward's result, and (BIAS, biased not null) of the result plus a layer's bias (column
// `col`): the stored value plus the bias in float32, the bits of the training family's bias kernel on the stored
// result.  BIAS is the additive kind's alone: the cosine pass compiles to its code without a bias.
template <bool BIAS, typename T>
__device__ __forceinline__ void tc_att_put(T* __restrict__ out, T* __restrict__ biased, const float* __restrict__ bias,
                                           long long at, int col, float v) {
    tc_put(out + at, v);
    if (BIAS && biased != nullptr) tc_put(biased + at, tc_load(out + at) + bias[col]);
}

// A long row's forward parts (slots p0[k * (2 heads + HD)], k < parts), merged for head h in part order by one
// warp: M = max m_k, L = sum l_k exp(m_k - M), out = sum acc_k exp(m_k - M) / L, lse = M + log L.  Fixed lanes
// and tree order: deterministic.  Each part's factor exp(m_k - M) is worked out once, 32 parts at a time, into
// the warp's 32 floats of shared memory ``s_scale`` (-1: a part whose entries all weigh 0, which adds nothing).
template <typename T, int C, bool BIAS>
__device__ __noinline__ void tc_att_merge(const float* __restrict__ p0, int parts, long long row, int h, int heads,
                                          int D, T* __restrict__ out, float* __restrict__ lse,
                                          float* __restrict__ s_scale, int lane, const float* __restrict__ bias,
                                          T* __restrict__ biased) {
    const int HD = heads * D, PS = 2 * heads + HD;
    float M = TC_NEG_INF;
    for (int k = lane; k < parts; k += 32) {
        const float m = __ldcg(p0 + (long long)k * PS + h);
        M = m > M ? m : M;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, M, o);
        M = other > M ? other : M;
    }
    float L = 0.f;
    for (int k = lane; k < parts; k += 32) {
        const float m = __ldcg(p0 + (long long)k * PS + h);
        if (m != TC_NEG_INF) L += __ldcg(p0 + (long long)k * PS + heads + h) * expf(m - M);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    float A[C];
#pragma unroll
    for (int c = 0; c < C; ++c) A[c] = 0.f;
    for (int k0 = 0; k0 < parts; k0 += 32) {
        const int k = k0 + lane, cnt = min(32, parts - k0);
        float sk = -1.f;
        if (k < parts) {
            const float m = __ldcg(p0 + (long long)k * PS + h);
            if (m != TC_NEG_INF) sk = expf(m - M);
        }
        __syncwarp();  // the previous 32 factors are read
        s_scale[lane] = sk;
        __syncwarp();
        for (int t = 0; t < cnt; ++t) {
            const float st = s_scale[t];
            if (st < 0.f) continue;  // warp-uniform
            const float* acc = p0 + (long long)(k0 + t) * PS + 2 * heads + h * D;
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const int f = lane + 32 * c;
                if (f < D) A[c] += __ldcg(acc + f) * st;
            }
        }
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        if (f < D) tc_att_put<BIAS>(out, biased, bias, row * HD + h * D + f, h * D + f, L != 0.f ? A[c] / L : 0.f);
    }
    if (lane == 0) lse[row * heads + h] = L != 0.f ? M + logf(L) : TC_NEG_INF;
}

// Column ``col`` of a long owner's backward parts (slots p0[k * width], k < parts), summed in part order.
__device__ __forceinline__ float tc_att_sum_col(const float* __restrict__ p0, int parts, int width, int col) {
    float v = 0.f;
#pragma unroll 8
    for (int k = 0; k < parts; ++k) v += __ldcg(p0 + (long long)k * width + col);
    return v;
}

// A long owner's backward parts summed by one warp: columns [0, n0) to out0 and [n0, n0 + n1) to out1, or (heads:
// the additive pass's head h) ds to *out0 (column h) and, n1 > 0, head h's D = n1 columns of dV to out1.
__device__ __forceinline__ void tc_att_bwd_merge(const float* __restrict__ p0, int parts, int width, int heads, int h,
                                                 int n0, int n1, float* __restrict__ out0, float* __restrict__ out1,
                                                 int lane) {
    if (heads) {
        if (lane == 0) *out0 = tc_att_sum_col(p0, parts, width, h);
        for (int f = lane; f < n1; f += 32) out1[f] = tc_att_sum_col(p0, parts, width, heads + h * n1 + f);
        return;
    }
    for (int i = lane; i < n0 + n1; i += 32) {
        const float v = tc_att_sum_col(p0, parts, width, i);
        if (i < n0) out0[i] = v;
        else out1[i - n0] = v;
    }
}

// tc_att_bwd_merge as a call, for the additive pass; the cosine pass inlines it.  Which keeps a pass's registers
// lower depends on the ptxas version (check with -v): these were the lower at sm_90 with NVRTC 13.5.
__device__ __noinline__ void tc_att_bwd_merge_call(const float* __restrict__ p0, int parts, int width, int heads,
                                                   int h, int n0, int n1, float* __restrict__ out0,
                                                   float* __restrict__ out1, int lane) {
    tc_att_bwd_merge(p0, parts, width, heads, h, n0, n1, out0, out1, lane);
}

#define TC_ATT_WARPS 8  // warps per block (the module's ATTENTION_WARPS)
// This warp's unit and head (warps take each unit's heads in turn); false past the last, for the whole warp: no
// block-wide barrier follows in the passes.
__device__ __forceinline__ bool tc_att_unit(const int4* __restrict__ units, int n_units, int heads, int warp,
                                            long long& uid, int& h, int4& unit) {
    const long long wid = (long long)blockIdx.x * TC_ATT_WARPS + warp;
    if (wid >= (long long)n_units * heads) return false;
    uid = wid / heads;
    h = (int)(wid - uid * heads);
    unit = units[uid];
    return true;
}

// Partner rows (the forward's V, the backward columns pass's) whose loads are issued together: more where a lane
// holds few features.  (The backward rows passes load 4 at a time: 8 measured slower there, with their larger
// register footprint.)
#define TC_ATT_U(C) ((C) <= 2 ? 8 : 4)

// One warp per row and head, the row's entries 32 at a time: lane t scores entry t of the chunk, the warp takes
// the chunk's maximum and sum (online softmax: the running sums rescale once per chunk), and then accumulates the
// chunk's V rows (the head's D features), TC_ATT_U at a time, with the entries' weights from shared memory.
// Lane `lane` holds features f = lane + 32 c (c < C) of the head.  weights: the entries' values (nullptr: all 1).
// ADDITIVE reads s_src / s_dst ((n, heads) float); COSINE reads Q / K ((n, D) of T, one head) and beta (one float).
template <typename T, int KIND, int C>
__global__ void __launch_bounds__(32 * TC_ATT_WARPS)
tcgnn_attention_fwd(const int4* __restrict__ units, const int* __restrict__ indices,
                    const float* __restrict__ weights, const T* __restrict__ V,
                    const float* __restrict__ s_src, const float* __restrict__ s_dst,
                    const T* __restrict__ Q, const T* __restrict__ K, const float* __restrict__ beta,
                    T* __restrict__ out, float* __restrict__ lse, float* __restrict__ part,
                    const int2* __restrict__ k0s, int* __restrict__ counters, int n_units, int heads, int D,
                    float slope, float drop_p, const unsigned* __restrict__ seed, const float* __restrict__ bias,
                    T* __restrict__ biased) {
    __shared__ float s_p[TC_ATT_WARPS][32];  // the chunk's weights P (dropped ones 0)
    __shared__ int s_j[TC_ATT_WARPS][32];    // the chunk's columns
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    long long uid;
    int h;
    int4 unit;  // (row, first entry, end entry, partial slot or -1)
    if (!tc_att_unit(units, n_units, heads, warp, uid, h, unit)) return;
    const long long row = unit.x;
    const int HD = heads * D;
    const T* Vh = V + h * D;
    float acc[C], q[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        acc[c] = 0.f;
        q[c] = (KIND == 1 && f < D) ? tc_load(Q + row * D + f) : 0.f;
    }
    float m = TC_NEG_INF, l = 0.f;  // warp-uniform
    const float sd = KIND == 0 ? s_dst[row * heads + h] : 0.f;
    const float b = KIND == 1 ? beta[0] : 0.f;
    const unsigned sv = drop_p > 0.f ? seed[0] : 0u;
    const float kept = drop_p > 0.f ? 1.f / (1.f - drop_p) : 1.f;
    const int e0 = unit.y, e1 = unit.z;
    for (int base = e0; base < e1; base += 32) {
        const int e = base + lane, cnt = min(32, e1 - base);
        const bool valid = e < e1;
        const long long j = valid ? indices[e] : 0;
        const float w = valid ? (weights ? weights[e] : 1.f) : 0.f;
        s_j[warp][lane] = (int)j;
        float z = 0.f;
        if (KIND == 1) {  // the chunk's cosines: one warp-wide dot per entry, kept by the entry's lane
            __syncwarp();
            constexpr int U = TC_ATT_U(C);
            for (int t0 = 0; t0 < cnt; t0 += U) {  // U entries at a time: their K rows' loads overlap
                float dot[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const long long jt = t0 + u < cnt ? s_j[warp][t0 + u] : -1;
                    dot[u] = 0.f;
#pragma unroll
                    for (int c = 0; c < C; ++c) {
                        const int f = lane + 32 * c;
                        if (jt >= 0 && f < D) dot[u] += q[c] * tc_load(K + jt * D + f);
                    }
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1) dot[u] += __shfl_xor_sync(0xffffffffu, dot[u], o);
                    if (lane == t0 + u) z = b * dot[u];
                }
            }
        } else {
            z = sd + (valid ? s_src[j * heads + h] : 0.f);
            z = z > 0.f ? z : z * slope;
        }
        z = w != 0.f ? z + logf(w) : TC_NEG_INF;  // a exp(z) = exp(z + log a); an entry of weight 0 takes no part
        float mc = z;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float other = __shfl_xor_sync(0xffffffffu, mc, o);
            mc = other > mc ? other : mc;
        }
        const float mn = m > mc ? m : mc;  // a NaN score poisons the sums below
        const float p = mn == TC_NEG_INF ? 0.f : expf(z - mn);
        const float scale = mn == TC_NEG_INF ? 1.f : expf(m - mn);
        float ps = p;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        l = l * scale + ps;
        m = mn;
        float pv = p;
        if (drop_p > 0.f) pv = (valid && tc_keep((unsigned)e * heads + h, sv, drop_p)) ? p * kept : 0.f;
        s_p[warp][lane] = pv;
        __syncwarp();
#pragma unroll
        for (int c = 0; c < C; ++c) acc[c] *= scale;
        constexpr int U = TC_ATT_U(C);
        int t = 0;
        for (; t + U <= cnt; t += U) {  // U rows of V at a time, their loads issued together
            long long jj[U];
            float pp[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                jj[u] = s_j[warp][t + u];
                pp[u] = s_p[warp][t + u];
            }
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const int f = lane + 32 * c;
                if (f >= D) continue;
                float v[U];
#pragma unroll
                for (int u = 0; u < U; ++u) v[u] = tc_load(Vh + jj[u] * HD + f);
                float a = 0.f;
#pragma unroll
                for (int u = 0; u < U; ++u) a += pp[u] * v[u];
                acc[c] += a;
            }
        }
        for (; t < cnt; ++t) {
            const long long jt = s_j[warp][t];
            const float pt = s_p[warp][t];
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const int f = lane + 32 * c;
                if (f < D) acc[c] += pt * tc_load(Vh + jt * HD + f);
            }
        }
        __syncwarp();  // the next chunk overwrites s_j and s_p
    }
    if (unit.w >= 0) {  // a part of a long row: its (m, l) per head and unnormalised sums, merged in part order
        float* pp = part + (long long)unit.w * (2 * heads + HD);
        if (lane == 0) {
            pp[h] = m;
            pp[heads + h] = l;
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int f = lane + 32 * c;
            if (f < D) pp[2 * heads + h * D + f] = acc[c];
        }
        const int2 k0 = k0s[uid];  // (the row's first slot, its parts): the last part to finish merges them
        int* counter = counters + (long long)k0.x * heads + h;
        if (tc_att_last(counter, k0.y, lane)) {
            tc_att_merge<T, C, KIND == 0>(part + (long long)k0.x * (2 * heads + HD), k0.y, row, h, heads, D, out,
                                          lse, s_p[warp], lane, bias, biased);
            if (lane == 0) *counter = 0;  // ready for the next call on this stream
        }
        return;
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        if (f < D)
            tc_att_put<KIND == 0>(out, biased, bias, row * HD + h * D + f, h * D + f, l != 0.f ? acc[c] / l : 0.f);
    }
    if (lane == 0) lse[row * heads + h] = l != 0.f ? m + logf(l) : TC_NEG_INF;
}

// The backward passes, recomputed from the forward's log-sum-exp: a pass over the rows works out each entry's
// two factors, which the pass over the columns then reads (8 bytes per entry and head, freed with the call) in
// place of scoring every entry again (two warp-wide dots).  Sums in entry order: deterministic.
//
// The rows pass of ADDITIVE attention: for entry (i, j) of CSR id e and head h, pre = s_dst[i, h] + s_src[j, h],
// P = a exp(LeakyReLU(pre) - lse[i, h]), m = the dropout factor, dP = m <g_i, V_j>_h, dpre = P (dP - t_i)
// LeakyReLU'(pre) with t_i = <g_i, out_i>_h (from O, the forward's output).  A warp per row i and head:
// ds[i, h] = sum_j dpre (s_dst's gradient), and fac[e, h] = (P m, dpre) for the columns pass.  One head per warp
// keeps C = D / 32 registers per row and one dot per entry (4 summed at once); each lane scores its own entry
// of the chunk.
template <typename T, int C>
__global__ void __launch_bounds__(32 * TC_ATT_WARPS)
tcgnn_attention_bwd(const int4* __restrict__ units, const int* __restrict__ partners,
                    const float* __restrict__ weights, const T* __restrict__ V, const T* __restrict__ G,
                    const T* __restrict__ O, const float* __restrict__ s_src, const float* __restrict__ s_dst,
                    const float* __restrict__ lse, float* __restrict__ ds, float2* __restrict__ fac,
                    float* __restrict__ part, const int2* __restrict__ k0s, int* __restrict__ counters,
                    int n_units, int heads, int D, float slope, float drop_p, const unsigned* __restrict__ seed) {
    __shared__ int s_q[TC_ATT_WARPS][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    long long uid;
    int h;
    int4 unit;  // (row, first entry, end entry, partial slot or -1)
    if (!tc_att_unit(units, n_units, heads, warp, uid, h, unit)) return;
    const long long owner = unit.x;
    const int HD = heads * D;
    const T* mine = G + owner * HD + h * D;  // the row's head-h gradient, and its partners' V rows
    const T* theirs = V + h * D;
    float own[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        own[c] = f < D ? tc_load(mine + f) : 0.f;
    }
    const float s_own = s_dst[owner * heads + h];
    const float l_own = lse[owner * heads + h];
    float t_own = 0.f;  // <g_i, out_i>_h
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        if (f < D) t_own += own[c] * tc_load(O + owner * HD + h * D + f);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t_own += __shfl_xor_sync(0xffffffffu, t_own, o);
    float dsum = 0.f;
    const unsigned sv = drop_p > 0.f ? seed[0] : 0u;
    const float kept = drop_p > 0.f ? 1.f / (1.f - drop_p) : 1.f;
    const int e0 = unit.y, e1 = unit.z;
    for (int base = e0; base < e1; base += 32) {
        const int k = base + lane, cnt = min(32, e1 - base);
        const bool valid = k < e1;
        const int q = valid ? partners[k] : 0;
        const float w = valid ? (weights ? weights[k] : 1.f) : 0.f;
        // this lane's entry: P, the dropout factor, and what its dpre needs
        float P = 0.f, m = 0.f, pre = 0.f;
        if (w != 0.f) {
            pre = s_own + s_src[(long long)q * heads + h];
            P = expf((pre > 0.f ? pre : pre * slope) + logf(w) - l_own);
            m = 1.f;
            if (drop_p > 0.f) m = tc_keep((unsigned)k * heads + h, sv, drop_p) ? kept : 0.f;
        }
        s_q[warp][lane] = q;
        __syncwarp();
        float mydot = 0.f;
        constexpr int U = 4;
        for (int t0 = 0; t0 < cnt; t0 += U) {  // U entries' partner rows loaded together (their latencies overlap)
            float x[U][C];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const long long qt = t0 + u < cnt ? s_q[warp][t0 + u] : -1;
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    const int f = lane + 32 * c;
                    x[u][c] = (qt >= 0 && f < D) ? tc_load(theirs + qt * HD + f) : 0.f;
                }
            }
            float v[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                v[u] = 0.f;
#pragma unroll
                for (int c = 0; c < C; ++c) v[u] += own[c] * x[u][c];
            }
            const float sum = tc_warp_sums<U>(v, lane);  // the dot of entry t0 + lane / (32 / U)
            const float d = __shfl_sync(0xffffffffu, sum, ((lane - t0) & (U - 1)) * (32 / U));
            if (lane >= t0 && lane < t0 + U) mydot = d;
        }
        float dpre = 0.f;
        if (w != 0.f) {
            dpre = P * (m * mydot - t_own) * (pre > 0.f ? 1.f : slope);
            dsum += dpre;
        }
        if (valid) fac[(long long)k * heads + h] = make_float2(P * m, dpre);
        __syncwarp();  // the next chunk overwrites s_q
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dsum += __shfl_xor_sync(0xffffffffu, dsum, o);
    if (unit.w < 0) {
        if (lane == 0) ds[owner * heads + h] = dsum;
        return;
    }
    // a part of a long row: its ds in its slot; the row's last part to finish sums them in part order
    if (lane == 0) part[(long long)unit.w * heads + h] = dsum;
    const int2 k0 = k0s[uid];
    int* counter = counters + (long long)k0.x * heads + h;
    if (!tc_att_last(counter, k0.y, lane)) return;
    tc_att_bwd_merge_call(part + (long long)k0.x * heads, k0.y, heads, heads, h, 0, 0, ds + owner * heads + h,
                          nullptr, lane);
    if (lane == 0) *counter = 0;  // ready for the next call on this stream
}

// The rows pass of COSINE attention (one head): for entry (i, j) of CSR id e, c = <Q_i, K_j>, P = a exp(beta c -
// lse[i]), m the dropout factor, dz = P (m <g_i, V_j> - t_i), t_i = <g_i, out_i>.  A warp per row i: dQ[i] = beta
// sum_j dz K_j, the unit's share of dbeta = sum dz c in dbeta[unit], and fac[e] = (P m, beta dz) for the columns
// pass.  Each entry takes two warp-wide dots of D features (two partner rows loaded per entry, 4 entries at a
// time, their 8 dots summed at once); an entry of weight 0 takes no part (its factors are not written: the
// columns pass skips it too).
template <typename T, int C>
__global__ void __launch_bounds__(32 * TC_ATT_WARPS)
tcgnn_attention_cos_bwd(const int4* __restrict__ units, const int* __restrict__ partners,
                        const float* __restrict__ weights, const T* __restrict__ V, const T* __restrict__ G,
                        const T* __restrict__ O, const T* __restrict__ Q, const T* __restrict__ K,
                        const float* __restrict__ beta, const float* __restrict__ lse, float* __restrict__ dQ,
                        float* __restrict__ dbeta, float2* __restrict__ fac, float* __restrict__ part,
                        const int2* __restrict__ k0s, int* __restrict__ counters, int n_units, int D, float drop_p,
                        const unsigned* __restrict__ seed) {
    __shared__ int s_q[TC_ATT_WARPS][32];
    __shared__ float s_lw[TC_ATT_WARPS][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long uid = (long long)blockIdx.x * TC_ATT_WARPS + warp;
    if (uid >= n_units) return;
    const int4 unit = units[uid];  // (row, first entry, end entry, partial slot or -1)
    const long long owner = unit.x;
    float oa[C], ob[C], acc[C];  // the row's g and Q, and its dQ
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        oa[c] = f < D ? tc_load(G + owner * D + f) : 0.f;
        ob[c] = f < D ? tc_load(Q + owner * D + f) : 0.f;
        acc[c] = 0.f;
    }
    const float b = beta[0];
    const float lse_o = lse[owner];
    float t_o = 0.f;  // <g_i, out_i>
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        if (f < D) t_o += oa[c] * tc_load(O + owner * D + f);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t_o += __shfl_xor_sync(0xffffffffu, t_o, o);
    float dbsum = 0.f;  // warp-uniform
    const unsigned sv = drop_p > 0.f ? seed[0] : 0u;
    const float kept = drop_p > 0.f ? 1.f / (1.f - drop_p) : 1.f;
    const int e0 = unit.y, e1 = unit.z;
    for (int base = e0; base < e1; base += 32) {
        const int k = base + lane, cnt = min(32, e1 - base);
        const bool valid = k < e1;
        const float w = valid ? (weights ? weights[k] : 1.f) : 0.f;
        s_q[warp][lane] = valid ? partners[k] : 0;
        s_lw[warp][lane] = w != 0.f ? logf(w) : TC_NEG_INF;
        __syncwarp();
        float my_pm = 0.f, my_bdz = 0.f;  // this lane's entry's factors
        constexpr int U = 4;
        for (int t0 = 0; t0 < cnt; t0 += U) {  // U entries' partner rows loaded together (their latencies overlap)
            float xa[U][C], xb[U][C];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const long long qt = t0 + u < cnt ? s_q[warp][t0 + u] : -1;
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    const int f = lane + 32 * c;
                    const bool in = qt >= 0 && f < D;
                    xa[u][c] = in ? tc_load(V + qt * D + f) : 0.f;
                    xb[u][c] = in ? tc_load(K + qt * D + f) : 0.f;
                }
            }
            static_assert(U == 4, "8 sums: 4 lanes per sum");
            // the U entries' <g_i, V_j> and <Q_i, K_j>, summed at once: lane L holds entry t0 + (L >> 2 & 3)'s
            // (d1 in lanes 0-15, d2 in 16-31, then both), and works out its P m and dz, which the warp then takes
            // entry by entry from lane 4 u
            float v[2 * U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                v[u] = 0.f;
                v[U + u] = 0.f;
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    v[u] += oa[c] * xa[u][c];
                    v[U + u] += ob[c] * xb[u][c];
                }
            }
            const float sum = tc_warp_sums<2 * U>(v, lane);
            const float other = __shfl_xor_sync(0xffffffffu, sum, 16);
            const float d1 = lane < 16 ? sum : other, d2 = lane < 16 ? other : sum;
            const int tm = t0 + (lane >> 2 & (U - 1));
            float mk = 1.f;
            if (drop_p > 0.f) mk = tc_keep((unsigned)(base + tm), sv, drop_p) ? kept : 0.f;
            const float Pm = expf(b * d2 + s_lw[warp][tm] - lse_o);
            const float dzm = Pm * (mk * d1 - t_o);
            const float pmm = Pm * mk;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int t = t0 + u;
                if (t >= cnt) break;  // warp-uniform
                const float dz = __shfl_sync(0xffffffffu, dzm, 4 * u);
                const float d2t = __shfl_sync(0xffffffffu, d2, 4 * u);
                const float pm = __shfl_sync(0xffffffffu, pmm, 4 * u);
                if (s_lw[warp][t] == TC_NEG_INF) continue;  // an entry of weight 0 takes no part (warp-uniform)
                const float bdz = b * dz;
                dbsum += dz * d2t;
#pragma unroll
                for (int c = 0; c < C; ++c) acc[c] += bdz * xb[u][c];
                if (lane == t) {
                    my_pm = pm;
                    my_bdz = bdz;
                }
            }
        }
        if (w != 0.f) fac[k] = make_float2(my_pm, my_bdz);
        __syncwarp();  // the next chunk overwrites the shared arrays
    }
    if (lane == 0) dbeta[uid] = dbsum;
    float* dst = unit.w >= 0 ? part + (long long)unit.w * D : dQ + owner * D;  // a part of a long row: its slot
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        if (f < D) dst[f] = acc[c];
    }
    if (unit.w >= 0) {  // the row's last part to finish sums its parts' dQ in part order
        const int2 k0 = k0s[uid];
        if (tc_att_last(counters + k0.x, k0.y, lane)) {
            tc_att_bwd_merge(part + (long long)k0.x * D, k0.y, D, 0, 0, D, 0, dQ + owner * D, nullptr, lane);
            if (lane == 0) counters[k0.x] = 0;  // ready for the next call on this stream
        }
    }
}

// The columns pass of either kind: a warp per column j of Aᵀ's CSR and head h (`eids`: the entries' CSR ids in
// A) sums the rows pass's factors fac[e, h] = (P m, d) over the column's entries (i, j):
// dV[j, h] = sum_i P m g_i,h, and ADDITIVE: ds[j, h] = sum_i d (s_src's gradient); COSINE (one head): dK[j] =
// sum_i d Q_i, an entry of weight 0 skipped (as in the rows pass).  No scores: two gathers per entry.
template <typename T, int KIND, int C>
__global__ void __launch_bounds__(32 * TC_ATT_WARPS)
tcgnn_attention_bwd_cols(const int4* __restrict__ units, const int* __restrict__ partners,
                         const int* __restrict__ eids, const float* __restrict__ weights,
                         const float2* __restrict__ fac, const T* __restrict__ G, const T* __restrict__ Q,
                         float* __restrict__ dV, float* __restrict__ dX, float* __restrict__ part,
                         const int2* __restrict__ k0s, int* __restrict__ counters, int n_units, int heads, int D) {
    __shared__ int s_q[TC_ATT_WARPS][32];
    __shared__ float2 s_f[TC_ATT_WARPS][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    long long uid;
    int h;
    int4 unit;  // (column, first entry, end entry, partial slot or -1)
    if (!tc_att_unit(units, n_units, heads, warp, uid, h, unit)) return;
    const long long owner = unit.x;
    const int HD = heads * D;
    const T* Gh = G + h * D;
    float accA[C], accB[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        accA[c] = 0.f;
        accB[c] = 0.f;
    }
    float dsum = 0.f;
    const int e0 = unit.y, e1 = unit.z;
    for (int base = e0; base < e1; base += 32) {
        const int k = base + lane, cnt = min(32, e1 - base);
        const bool valid = k < e1;
        const int e = valid ? eids[k] : 0;
        const float w = valid ? (weights ? weights[e] : 1.f) : 0.f;
        const bool takes = valid && (KIND == 0 || w != 0.f);  // COSINE: an entry of weight 0 is skipped
        const float2 fe = w != 0.f ? fac[(long long)e * heads + h] : make_float2(0.f, 0.f);
        if (KIND == 0 && w != 0.f) dsum += fe.y;
        s_q[warp][lane] = takes ? partners[k] : -1;
        s_f[warp][lane] = fe;
        __syncwarp();
        constexpr int U = KIND == 1 ? 4 : TC_ATT_U(C);  // (COSINE loads two rows per entry)
        for (int t0 = 0; t0 < cnt; t0 += U) {  // U entries' partner rows loaded together (their latencies overlap)
            float xa[U][C], xb[U][C];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const long long qt = t0 + u < cnt ? s_q[warp][t0 + u] : -1;
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    const int f = lane + 32 * c;
                    const bool in = qt >= 0 && f < D;
                    xa[u][c] = in ? tc_load(Gh + qt * HD + f) : 0.f;
                    xb[u][c] = (KIND == 1 && in) ? tc_load(Q + qt * D + f) : 0.f;
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int t = t0 + u;
                if (t >= cnt) break;  // warp-uniform
                if (KIND == 1 && s_q[warp][t] < 0) continue;  // weight 0 (warp-uniform)
                const float2 ft = s_f[warp][t];
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    accA[c] += ft.x * xa[u][c];
                    if (KIND == 1) accB[c] += ft.y * xb[u][c];
                }
            }
        }
        __syncwarp();  // the next chunk overwrites the shared arrays
    }
    // ADDITIVE: ds then dV of head h (slot width heads + HD); COSINE: dV then dK (slot width 2 D)
    const int PS = KIND == 0 ? heads + HD : 2 * D;
    float* slot = unit.w >= 0 ? part + (long long)unit.w * PS : nullptr;  // a part of a long column
    if (KIND == 0) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dsum += __shfl_xor_sync(0xffffffffu, dsum, o);
        if (lane == 0) *(slot ? slot + h : dX + owner * heads + h) = dsum;
    }
    float* dA = slot ? slot + (KIND == 0 ? heads + h * D : 0) : dV + owner * HD + h * D;
    float* dB = slot ? slot + D : dX + owner * D;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        if (f >= D) continue;
        dA[f] = accA[c];
        if (KIND == 1) dB[f] = accB[c];
    }
    if (slot) {  // the column's last part to finish sums its parts (ds and dV, or dV and dK) in part order
        const int2 k0 = k0s[uid];
        int* counter = counters + (long long)k0.x * heads + h;
        if (!tc_att_last(counter, k0.y, lane)) return;
        if (KIND == 0)
            tc_att_bwd_merge_call(part + (long long)k0.x * PS, k0.y, PS, heads, h, 0, D, dX + owner * heads + h,
                                  dV + owner * HD + h * D, lane);
        else
            tc_att_bwd_merge(part + (long long)k0.x * PS, k0.y, PS, 0, 0, D, D, dV + owner * D, dX + owner * D,
                             lane);
        if (lane == 0) *counter = 0;  // ready for the next call on this stream
    }
}
"""

#: Every compiled kernel: the forward for float32 and 16-bit features, both score kinds, each chunk count; each
#: kind's backward by rows and by columns likewise.
ATTENTION_CONFIGS = tuple(
    [AttentionFwd(cuda_type(t), k, c) for t in ("float32", "float16", "bfloat16") for k in (ADDITIVE, COSINE)
     for c in ATTENTION_CHUNKS]
    + [cls(cuda_type(t), c) for cls in (AttentionBwd, AttentionCosBwd) for t in ("float32", "float16", "bfloat16")
       for c in ATTENTION_CHUNKS]
    + [AttentionBwdCols(cuda_type(t), k, c) for t in ("float32", "float16", "bfloat16") for k in (ADDITIVE, COSINE)
       for c in ATTENTION_CHUNKS])
SOURCE = COMMON_SOURCE + _ATTENTION
NAMES = tuple(c.name for c in ATTENTION_CONFIGS)
register("attention", SOURCE, NAMES)
