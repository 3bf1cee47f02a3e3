"""Layer 1: the ``"attention"`` family: graph attention fused into one pass per row (scores, softmax, aggregation).

For each row i of a CSR graph and each head h: ``out[i, h] = sum_j P_ij,h V[j, h]`` with
``P_ij,h = a_ij exp(z_ij,h) / sum_k a_ik exp(z_ik,h)`` over the row's stored entries (``a`` the
entries' non-negative values, 1 when there are none).  The scores never reach global memory: a warp walks its row's
entries once, keeping a running maximum, the running sum of ``a exp(z - max)`` and the weighted sum of
``V`` rows (the online softmax of FlashAttention), and writes one log-sum-exp per
row and head for the backward pass, which recomputes ``P`` from it: a warp per row (the gradients of the row's
own inputs) and a warp per column of Aᵀ's CSR (those of its partners'), sums in entry order.  A long row or
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
    "ATTENTION_UNIT", "ATTENTION_MAX_UNIT", "ATTENTION_MAX_HEADS", "ATTENTION_WARPS", "ATTENTION_CHUNKS",
    "ATTENTION_CONFIGS", "ADDITIVE", "COSINE", "AttentionFwd", "AttentionBwd",
    "AttentionCosBwd", "attention_unit", "attention_config", "attention_bwd_config", "SOURCE", "NAMES"
]

ADDITIVE, COSINE = 0, 1
#: A row (or, in the backward pass, a column) of more entries than ``attention_unit(heads)`` is cut into parts of
#: that many, each taken by its own warps (one per head) and merged in part order: a hub's entries then spread over
#: the GPU, and short parts keep one-head passes balanced; with more heads a row already has more warps, so its parts
#: grow, up to ``ATTENTION_MAX_UNIT`` (the merges stay few).
ATTENTION_UNIT = 64
#: The largest part (entries of one row or column per warp and head).
ATTENTION_MAX_UNIT = 256
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
    """``tcgnn_attention_bwd<T, MODE, C>``: the additive scores' backward, by rows (MODE 0) or columns (1), a warp
    per owner and head (C features per lane of the head's D)."""

    KERNEL: ClassVar[str] = "tcgnn_attention_bwd"
    T: str
    MODE: int
    C: int


@dataclasses.dataclass(frozen=True)
class AttentionCosBwd(KernelConfig):
    """``tcgnn_attention_cos_bwd<T, MODE, C>``: the cosine scores' backward, by rows (MODE 0) or columns (1)."""

    KERNEL: ClassVar[str] = "tcgnn_attention_cos_bwd"
    T: str
    MODE: int
    C: int


def attention_bwd_config(dtype_name, kind, mode, width):
    """The backward kernel of scores ``kind`` by rows (``mode`` 0) or columns (1) for heads of ``width`` features
    (a warp takes one head)."""
    cls = AttentionBwd if kind == ADDITIVE else AttentionCosBwd
    return cls(cuda_type(dtype_name), mode, attention_config(dtype_name, kind, width).C)


def attention_unit(heads):
    """Entries per part of a long row or column for ``heads`` heads: ``ATTENTION_UNIT`` per head, at most
    ``ATTENTION_MAX_UNIT``."""
    return min(ATTENTION_MAX_UNIT, ATTENTION_UNIT * heads)


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

// A long row's forward parts (slots p0[k * (2 heads + HD)], k < parts), merged for head h in part order by one
// warp: M = max m_k, L = sum l_k exp(m_k - M), out = sum acc_k exp(m_k - M) / L, lse = M + log L.  Fixed lanes
// and tree order: deterministic.  Each part's factor exp(m_k - M) is worked out once, 32 parts at a time, into
// the warp's 32 floats of shared memory ``s_scale`` (-1: a part whose entries all weigh 0, which adds nothing).
template <typename T, int C>
__device__ __noinline__ void tc_att_merge(const float* __restrict__ p0, int parts, long long row, int h, int heads,
                                          int D, T* __restrict__ out, float* __restrict__ lse,
                                          float* __restrict__ s_scale, int lane) {
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
        if (f < D) tc_put(out + row * HD + h * D + f, L != 0.f ? A[c] / L : 0.f);
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

// One warp per row and head, the row's entries 32 at a time: lane t scores entry t of the chunk, the warp takes
// the chunk's maximum and sum (online softmax: the running sums rescale once per chunk), and then accumulates the
// chunk's V rows (the head's D features), TC_ATT_U at a time, with the entries' weights from shared memory.
// Lane `lane` holds features f = lane + 32 c (c < C) of the head.  weights: the entries' values (nullptr: all 1).
// ADDITIVE reads s_src / s_dst ((n, heads) float); COSINE reads Q / K ((n, D) of T, one head) and beta (one float).
#define TC_ATT_WARPS 8
// V rows (forward) whose loads are issued together: more where a lane holds few features.  (The backward passes
// load 4 partner rows at a time: 8 measured slower there, with their larger register footprint.)
#define TC_ATT_U(C) ((C) <= 2 ? 8 : 4)
template <typename T, int KIND, int C>
__global__ void __launch_bounds__(32 * TC_ATT_WARPS)
tcgnn_attention_fwd(const int4* __restrict__ units, const int* __restrict__ indices,
                    const float* __restrict__ weights, const T* __restrict__ V,
                    const float* __restrict__ s_src, const float* __restrict__ s_dst,
                    const T* __restrict__ Q, const T* __restrict__ K, const float* __restrict__ beta,
                    T* __restrict__ out, float* __restrict__ lse, float* __restrict__ part,
                    const int2* __restrict__ k0s, int* __restrict__ counters, int n_units, int heads, int D,
                    float slope, float drop_p, const unsigned* __restrict__ seed) {
    __shared__ float s_p[TC_ATT_WARPS][32];  // the chunk's weights P (dropped ones 0)
    __shared__ int s_j[TC_ATT_WARPS][32];    // the chunk's columns
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long wid = (long long)blockIdx.x * TC_ATT_WARPS + warp;
    if (wid >= (long long)n_units * heads) return;  // a whole warp: no block-wide barrier follows
    const long long uid = wid / heads;
    const int h = (int)(wid - uid * heads);
    const int4 unit = units[uid];  // (row, first entry, end entry, partial slot or -1)
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
            tc_att_merge<T, C>(part + (long long)k0.x * (2 * heads + HD), k0.y, row, h, heads, D, out, lse,
                               s_p[warp], lane);
            if (lane == 0) *counter = 0;  // ready for the next call on this stream
        }
        return;
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        if (f < D) tc_put(out + row * HD + h * D + f, l != 0.f ? acc[c] / l : 0.f);
    }
    if (lane == 0) lse[row * heads + h] = l != 0.f ? m + logf(l) : TC_NEG_INF;
}

// The backward pass of ADDITIVE attention, recomputed from the forward's log-sum-exp, no E-sized array:
// for entry (i, j) of CSR id e and head h, pre = s_dst[i, h] + s_src[j, h], P = a exp(LeakyReLU(pre) - lse[i, h]),
// m = the dropout factor, dP = m <g_i, V_j>_h, dpre = P (dP - tdot[i, h]) LeakyReLU'(pre) with
// tdot[i, h] = <g_i, out_i>_h.  MODE 0 (a warp per row i and head over A's CSR): ds[i, h] = sum_j dpre (s_dst's
// gradient), and tdot (from O, the forward's output) for MODE 1, which runs after it.  MODE 1 (a warp per column
// j and head over Aᵀ's CSR, `eids` the entries' CSR ids in A): dV[j, h] = sum_i P m g_i,h and ds[j, h] =
// sum_i dpre (s_src's gradient).  One head per warp keeps C = D / 32 registers
// per row and one reduction per entry; each lane first scores its own entry of the chunk (P m to shared memory).
// Sums in entry order: deterministic.
template <typename T, int MODE, int C>
__global__ void __launch_bounds__(32 * TC_ATT_WARPS)
tcgnn_attention_bwd(const int4* __restrict__ units, const int* __restrict__ partners, const int* __restrict__ eids,
                    const float* __restrict__ weights, const T* __restrict__ V, const T* __restrict__ G,
                    const T* __restrict__ O, const float* __restrict__ s_src, const float* __restrict__ s_dst,
                    const float* __restrict__ lse, float* __restrict__ tdot, float* __restrict__ dV,
                    float* __restrict__ ds, float* __restrict__ part, const int2* __restrict__ k0s,
                    int* __restrict__ counters, int n_units, int heads, int D, float slope, float drop_p,
                    const unsigned* __restrict__ seed) {
    __shared__ int s_q[TC_ATT_WARPS][32];
    __shared__ float s_pm[TC_ATT_WARPS][32];  // the chunk's P m (MODE 1)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long wid = (long long)blockIdx.x * TC_ATT_WARPS + warp;
    if (wid >= (long long)n_units * heads) return;
    const long long uid = wid / heads;
    const int h = (int)(wid - uid * heads);
    const int4 unit = units[uid];  // (owner, first entry, end entry, partial slot or -1)
    const long long owner = unit.x;
    const int HD = heads * D;
    const T* mine = (MODE == 0 ? G : V) + owner * HD + h * D;  // the owner's head-h row, and the partners'
    const T* theirs = (MODE == 0 ? V : G) + h * D;
    float own[C], acc[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        own[c] = f < D ? tc_load(mine + f) : 0.f;
        acc[c] = 0.f;
    }
    const float s_own = (MODE == 0 ? s_dst : s_src)[owner * heads + h];
    const float l_own = MODE == 0 ? lse[owner * heads + h] : 0.f;
    float t_own = 0.f;
    if (MODE == 0) {  // tdot[i, h] = <g_i, out_i>_h, for this pass and written for the columns pass
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int f = lane + 32 * c;
            if (f < D) t_own += own[c] * tc_load(O + owner * HD + h * D + f);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t_own += __shfl_xor_sync(0xffffffffu, t_own, o);
        if (lane == 0) tdot[owner * heads + h] = t_own;  // (every part of a long row writes the same value)
    }
    float dsum = 0.f;
    const unsigned sv = drop_p > 0.f ? seed[0] : 0u;
    const float kept = drop_p > 0.f ? 1.f / (1.f - drop_p) : 1.f;
    const int e0 = unit.y, e1 = unit.z;
    for (int base = e0; base < e1; base += 32) {
        const int k = base + lane, cnt = min(32, e1 - base);
        const bool valid = k < e1;
        const int q = valid ? partners[k] : 0;
        const int e = valid ? (eids ? eids[k] : k) : 0;
        const float w = valid ? (weights ? weights[e] : 1.f) : 0.f;
        // this lane's entry: P, the dropout factor, and what its dpre needs
        float P = 0.f, m = 0.f, pre = 0.f, ti = 0.f;
        if (w != 0.f) {
            pre = s_own + (MODE == 0 ? s_src : s_dst)[(long long)q * heads + h];
            const float li = MODE == 0 ? l_own : lse[(long long)q * heads + h];
            ti = MODE == 0 ? t_own : tdot[(long long)q * heads + h];
            P = expf((pre > 0.f ? pre : pre * slope) + logf(w) - li);
            m = 1.f;
            if (drop_p > 0.f) m = tc_keep((unsigned)e * heads + h, sv, drop_p) ? kept : 0.f;
        }
        s_q[warp][lane] = q;
        s_pm[warp][lane] = P * m;
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
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int t = t0 + u;
                if (t >= cnt) break;  // warp-uniform
                float v = 0.f;
#pragma unroll
                for (int c = 0; c < C; ++c) v += own[c] * x[u][c];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                if (lane == t) mydot = v;
                if (MODE == 1) {  // P m g_i into dV[j]
                    const float pm = s_pm[warp][t];
#pragma unroll
                    for (int c = 0; c < C; ++c) acc[c] += pm * x[u][c];
                }
            }
        }
        if (w != 0.f) dsum += P * (m * mydot - ti) * (pre > 0.f ? 1.f : slope);
        __syncwarp();  // the next chunk overwrites s_q and s_pm
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dsum += __shfl_xor_sync(0xffffffffu, dsum, o);
    float* slot = unit.w >= 0 ? part + (long long)unit.w * (heads + HD) : nullptr;  // a part of a long owner
    if (lane == 0) {
        if (slot) slot[h] = dsum;
        else ds[owner * heads + h] = dsum;
    }
    if (MODE == 1) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int f = lane + 32 * c;
            if (f >= D) continue;
            if (slot) slot[heads + h * D + f] = acc[c];
            else dV[owner * HD + h * D + f] = acc[c];
        }
    }
    if (slot) {  // the owner's last part to finish sums its parts' ds (and dV) of head h in part order
        const int2 k0 = k0s[uid];
        int* counter = counters + (long long)k0.x * heads + h;
        if (!tc_att_last(counter, k0.y, lane)) return;
        tc_att_bwd_merge_call(part + (long long)k0.x * (heads + HD), k0.y, heads + HD, heads, h, 0,
                              MODE == 1 ? D : 0, ds + owner * heads + h, dV + owner * HD + h * D, lane);
        if (lane == 0) *counter = 0;  // ready for the next call on this stream
    }
}

// The backward pass of COSINE attention (one head), recomputed from the forward's log-sum-exp, no E-sized array:
// for entry (i, j) of CSR id e, c = <Q_i, K_j>, P = a exp(beta c - lse[i]), m the dropout factor,
// dz = P (m <g_i, V_j> - tdot[i]), tdot[i] = <g_i, out_i>.  MODE 0 (one warp per row i over A's CSR): dQ[i] =
// beta sum_j dz K_j, the unit's share of dbeta = sum dz c in dbeta[unit], and tdot (from O) for MODE 1.
// MODE 1 (one warp per column j over Aᵀ's CSR): dV[j] = sum_i P m g_i and dK[j] = beta sum_i dz Q_i.  Each entry
// takes two warp-wide dots of D features (two partner rows loaded per entry, 4 entries at a time).  Sums
// in entry order: deterministic.
template <typename T, int MODE, int C>
__global__ void __launch_bounds__(32 * TC_ATT_WARPS)
tcgnn_attention_cos_bwd(const int4* __restrict__ units, const int* __restrict__ partners,
                        const int* __restrict__ eids, const float* __restrict__ weights, const T* __restrict__ V,
                        const T* __restrict__ G, const T* __restrict__ O, const T* __restrict__ Q,
                        const T* __restrict__ K, const float* __restrict__ beta, const float* __restrict__ lse,
                        float* __restrict__ tdot, float* __restrict__ dV, float* __restrict__ dQK,
                        float* __restrict__ dbeta, float* __restrict__ part, const int2* __restrict__ k0s,
                        int* __restrict__ counters, int n_units, int D, float drop_p,
                        const unsigned* __restrict__ seed) {
    __shared__ int s_q[TC_ATT_WARPS][32];
    __shared__ int s_e[TC_ATT_WARPS][32];
    __shared__ float s_lw[TC_ATT_WARPS][32];
    __shared__ float s_l[TC_ATT_WARPS][32];  // MODE 1: the partner row's lse and tdot
    __shared__ float s_t[TC_ATT_WARPS][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long uid = (long long)blockIdx.x * TC_ATT_WARPS + warp;
    if (uid >= n_units) return;
    const int4 unit = units[uid];  // (owner, first entry, end entry, partial slot or -1)
    const long long owner = unit.x;
    const T* ownA = MODE == 0 ? G : V;  // the owner's rows of the two dots, and the partners'
    const T* ownB = MODE == 0 ? Q : K;
    const T* parA = MODE == 0 ? V : G;
    const T* parB = MODE == 0 ? K : Q;
    float oa[C], ob[C], accA[C], accB[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        oa[c] = f < D ? tc_load(ownA + owner * D + f) : 0.f;
        ob[c] = f < D ? tc_load(ownB + owner * D + f) : 0.f;
        accA[c] = 0.f;
        accB[c] = 0.f;
    }
    const float b = beta[0];
    const float lse_o = MODE == 0 ? lse[owner] : 0.f;
    float t_o = 0.f;
    if (MODE == 0) {  // tdot[i] = <g_i, out_i>, for this pass and written for the columns pass
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int f = lane + 32 * c;
            if (f < D) t_o += oa[c] * tc_load(O + owner * D + f);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t_o += __shfl_xor_sync(0xffffffffu, t_o, o);
        if (lane == 0) tdot[owner] = t_o;
    }
    float dbsum = 0.f;  // warp-uniform
    const unsigned sv = drop_p > 0.f ? seed[0] : 0u;
    const float kept = drop_p > 0.f ? 1.f / (1.f - drop_p) : 1.f;
    const int e0 = unit.y, e1 = unit.z;
    for (int base = e0; base < e1; base += 32) {
        const int k = base + lane, cnt = min(32, e1 - base);
        const bool valid = k < e1;
        const int q = valid ? partners[k] : 0;
        const int e = valid ? (eids ? eids[k] : k) : 0;
        const float w = valid ? (weights ? weights[e] : 1.f) : 0.f;
        s_q[warp][lane] = q;
        s_e[warp][lane] = e;
        s_lw[warp][lane] = w != 0.f ? logf(w) : TC_NEG_INF;
        if (MODE == 1) {
            s_l[warp][lane] = valid ? lse[q] : 0.f;
            s_t[warp][lane] = valid ? tdot[q] : 0.f;
        }
        __syncwarp();
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
                    xa[u][c] = in ? tc_load(parA + qt * D + f) : 0.f;
                    xb[u][c] = in ? tc_load(parB + qt * D + f) : 0.f;
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int t = t0 + u;
                if (t >= cnt) break;  // warp-uniform
                float d1 = 0.f, d2 = 0.f;  // <g_i, V_j> and <Q_i, K_j>
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    d1 += oa[c] * xa[u][c];
                    d2 += ob[c] * xb[u][c];
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) {
                    d1 += __shfl_xor_sync(0xffffffffu, d1, o);
                    d2 += __shfl_xor_sync(0xffffffffu, d2, o);
                }
                const float lwt = s_lw[warp][t];
                if (lwt == TC_NEG_INF) continue;  // an entry of weight 0 takes no part (warp-uniform)
                const float li = MODE == 0 ? lse_o : s_l[warp][t], ti = MODE == 0 ? t_o : s_t[warp][t];
                const float P = expf(b * d2 + lwt - li);
                float mk = 1.f;
                if (drop_p > 0.f) mk = tc_keep((unsigned)s_e[warp][t], sv, drop_p) ? kept : 0.f;
                const float dz = P * (mk * d1 - ti);
                if (MODE == 0) dbsum += dz * d2;
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    if (MODE == 1) accA[c] += P * mk * xa[u][c];
                    accB[c] += b * dz * xb[u][c];
                }
            }
        }
        __syncwarp();  // the next chunk overwrites the shared arrays
    }
    const int PS = MODE == 0 ? D : 2 * D;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int f = lane + 32 * c;
        if (f >= D) continue;
        if (unit.w >= 0) {  // a part of a long owner: dQ, or dV and dK, summed below by its last part
            float* pp = part + (long long)unit.w * PS;
            if (MODE == 1) pp[f] = accA[c];
            pp[PS - D + f] = accB[c];
        } else {
            if (MODE == 1) dV[owner * D + f] = accA[c];
            dQK[owner * D + f] = accB[c];
        }
    }
    if (MODE == 0 && lane == 0) dbeta[uid] = dbsum;
    if (unit.w >= 0) {  // the owner's last part to finish sums its parts (dQ, or dV and dK) in part order
        const int2 k0 = k0s[uid];
        if (tc_att_last(counters + k0.x, k0.y, lane)) {
            tc_att_bwd_merge(part + (long long)k0.x * PS, k0.y, PS, 0, 0, D, PS - D, MODE == 1 ? dV + owner * D
                             : dQK + owner * D, dQK + owner * D, lane);
            if (lane == 0) counters[k0.x] = 0;  // ready for the next call on this stream
        }
    }
}
"""

#: Every compiled kernel: the forward for float32 and 16-bit features, both score kinds, each chunk count; each
#: kind's backward by rows and by columns likewise.
ATTENTION_CONFIGS = tuple(
    [AttentionFwd(cuda_type(t), k, c) for t in ("float32", "float16", "bfloat16") for k in (ADDITIVE, COSINE)
     for c in ATTENTION_CHUNKS]
    + [cls(cuda_type(t), m, c) for cls in (AttentionBwd, AttentionCosBwd) for t in ("float32", "float16", "bfloat16")
       for m in (0, 1) for c in ATTENTION_CHUNKS])
SOURCE = COMMON_SOURCE + _ATTENTION
NAMES = tuple(c.name for c in ATTENTION_CONFIGS)
register("attention", SOURCE, NAMES)
