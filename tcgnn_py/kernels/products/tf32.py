"""Layer 1: the ``"tf32"`` family: SpMM and SDDMM for float32 data on 16x8 tiles through TF32 tensor cores.

Operands are rounded to TF32, products accumulated in float32, through inline PTX
``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``; the SpMM's register kernel, its cp.async
kernel and the SDDMM.
"""

import dataclasses
from typing import ClassVar

from ..registry import register
from .common import COMMON_SOURCE, KernelConfig

__all__ = ["SpmmTF32", "SpmmTF32Async", "SddmmTF32", "TF32_CHUNKS", "TF32_SPMM_CONFIGS", "SDDMM_TF32_SMEM_PER_WARP",
           "tf32_spmm_config", "sddmm_tf32_name", "tf32_spmm_smem", "tf32_async_smem"]

#: Column chunks of 32 per CTA in the TF32 SpMM (a CTA covers ``32 * CH`` columns): 1 up to 32 features, else 2.
TF32_CHUNKS = (1, 2)
#: Shared memory of ``tcgnn_sddmm_tf32`` per warp: one 16x8 float tile.
SDDMM_TF32_SMEM_PER_WARP = 16 * 8 * 4


@dataclasses.dataclass(frozen=True)
class SpmmTF32(KernelConfig):
    """``tcgnn_spmm_tf32<CH, VEC, PV>``: CH column chunks of 32, float4 rows (VEC), values prefetched (PV)."""

    KERNEL: ClassVar[str] = "tcgnn_spmm_tf32"
    CH: int
    VEC: bool
    PV: bool = True


@dataclasses.dataclass(frozen=True)
class SpmmTF32Async(KernelConfig):
    """``tcgnn_spmm_tf32_async<CH, NS, MINB>``: cp.async gathers, NS blocks in flight, MINB CTAs per SM."""

    KERNEL: ClassVar[str] = "tcgnn_spmm_tf32_async"
    CH: int
    NS: int
    MINB: int = 1


@dataclasses.dataclass(frozen=True)
class SddmmTF32(KernelConfig):
    """``tcgnn_sddmm_tf32<VEC>``: float4 feature loads when VEC."""

    KERNEL: ClassVar[str] = "tcgnn_sddmm_tf32"
    VEC: bool


def tf32_spmm_config(chunks, aligned):
    """The TF32 SpMM for ``chunks`` of 32 columns: cp.async gathers of 16-byte aligned rows (2 blocks in flight,
    80 registers so that 3 CTAs of 256 threads fit an SM), else register gathers, which read any row."""
    return SpmmTF32Async(chunks, 2, 3) if aligned else SpmmTF32(chunks, False)


def sddmm_tf32_name(vec):
    return SddmmTF32(vec).name


def tf32_spmm_smem(nwarps, chunks):
    """Bytes of ``tcgnn_spmm_tf32``'s cross-warp sum: per warp ``CH * 4 * 32`` float4."""
    return nwarps * chunks * 4 * 32 * 16


def tf32_async_smem(nwarps, chunks, stages):
    """Bytes of ``tcgnn_spmm_tf32_async``: per warp ``stages`` x 8 padded rows, reused for the cross-warp sum."""
    return max(nwarps * stages * 8 * (32 * chunks + 8) * 4, tf32_spmm_smem(nwarps, chunks))


_TF32 = r"""
// ---------------------------------------------------------------------------
// TF32 tensor-core SpMM, Y = A @ X, on 16x8 tiles.
// grid = units * n_slabs (slab = CTA column range of 32 * CH, the fastest index,
// so the CTAs of one unit run together and share its metadata and X rows' pages
// in L2), block = 32 * nwarps threads.  Each warp owns CH column chunks of 32.  Within a chunk, MMA j (of 4) gives
// fragment column n the X column 4n + j: lane (g, t) then loads X[.][4g .. 4g+3]
// with one 16-byte load per B row, and ends up owning the 8 consecutive output
// columns 8t .. 8t+7 of rows g and g+8 -- 16-byte stores too.
// The A fragment comes from a 128-bit occupancy mask per block (bit p: tile
// position p = 8 * row + slot is stored).  Entries are stored in position order,
// so an entry's index within its block is the number of mask bits below it:
// each lane finds its four values with popc, without shared memory or a barrier.
// Shared memory: per warp CH*4*32 float4 of accumulators for the cross-warp sum.
// Per-block metadata of the TF32 SpMM: first entry, occupancy mask, and the
// two B rows lane t reads (slots t and t + 4).  Past the unit's end: an empty
// block whose rows are padding, so the pipeline needs no special last step.
struct TcMeta {
    int e0, c_lo, c_hi;
    uint4 mk;
};

__device__ __forceinline__ TcMeta tc_meta(const int* __restrict__ block_ptr, const int* __restrict__ block_cols,
                                          const uint4* __restrict__ block_mask, int b, int end, int t) {
    TcMeta m = {0, -1, -1, make_uint4(0u, 0u, 0u, 0u)};
    if (b < end) {
        m.e0 = block_ptr[b];
        m.mk = block_mask[b];
        m.c_lo = block_cols[b * 8 + t];
        m.c_hi = block_cols[b * 8 + t + 4];
    }
    return m;
}

template <int CH, bool VEC>
__device__ __forceinline__ void tc_load_rows(const float* __restrict__ X, const TcMeta& m, int col, int D,
                                             float4 (&lo)[CH], float4 (&hi)[CH]) {
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        // Padding slots (column -1) load zeros: a NaN there would poison the tile.
        lo[c] = tc_load4<VEC>(X, m.c_lo, col + c * 32, D);
        hi[c] = tc_load4<VEC>(X, m.c_hi, col + c * 32, D);
    }
}

// Cross-warp sum of the CTA's accumulators, then one store per output element
// (Y, or the unit's partial tile when its window is split).  red[(warp, c, q)][lane]
// as float4: consecutive lanes hit consecutive 16-byte words, so both the writes
// and the reads are conflict-free.
template <int CH, bool VEC>
__device__ __forceinline__ void tc_cta_sum_store(const float (&acc)[CH][4][4], float4* red, int4 u, int col0, int M,
                                                 int D, float* __restrict__ Y, float* __restrict__ partial) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int per = CH * 4 * 32;
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int q = 0; q < 4; ++q)
            red[(warp * CH * 4 + c * 4 + q) * 32 + lane] =
                make_float4(acc[c][0][q], acc[c][1][q], acc[c][2][q], acc[c][3][q]);
    __syncthreads();
    for (int i = threadIdx.x; i < per; i += blockDim.x) {
        float4 s = red[i];
        for (int w = 1; w < nwarps; ++w) s = tc_add4(s, red[w * per + i]);
        // Which output the float4 holds: lane l = (g, t), register pair q.
        const int l = i & 31, q = (i >> 5) & 3, c = i >> 7;
        const int r = (l >> 2) + ((q >> 1) << 3);
        const int col = col0 + c * 32 + ((l & 3) << 3) + ((q & 1) << 2);
        if (u.w < 0) {
            const long long row = (long long)u.x * 16 + r;
            if (row < M) tc_store4<VEC>(Y + (size_t)row * D, col, D, s);
        } else {
            tc_store4<VEC>(partial + ((size_t)u.w * 16 + r) * D, col, D, s);
        }
    }
}

// Split windows summed in the launch (counters != nullptr; else tcgnn_spmm_fixup
// does it): this CTA stored its unit's partial tile for slab `slab`; count it,
// and the CTA that stores a window's slab last sums all of the window's partial
// tiles in unit order into Y -- the fixup's order, so the result does not depend
// on which CTA came last.  unit_k0[unit] = (first slot of its window, parts).
// The counter is reset by that CTA: ready for the next call on this stream.
template <int CH>
__device__ __forceinline__ void tc_cta_combine(int4 u, int unit, int slab, int col0, const int2* __restrict__ unit_k0,
                                               float* __restrict__ Y, const float* __restrict__ partial,
                                               int* __restrict__ counters, int M, int D, int n_slabs) {
    __shared__ int last;
    __threadfence();  // release: this thread's part of the partial tile
    __syncthreads();
    const int2 k0 = unit_k0[unit];
    int* counter = counters + (size_t)k0.x * n_slabs + slab;
    if (threadIdx.x == 0) last = atomicAdd(counter, 1) == k0.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();  // acquire: the other parts' tiles are visible (read through L2 below)
    tc_sum_parts<32 * CH>(partial, k0.x, k0.y, 16, (long long)u.x * 16, col0, min(32 * CH, D - col0), M, D, Y,
                          threadIdx.x, blockDim.x);
    if (threadIdx.x == 0) *counter = 0;
}

// The four A-fragment values lane (g, t) holds for a block (zeros where the mask has no entry).
__device__ __forceinline__ float4 tc_frag_values(const float* __restrict__ values, const TcMeta& m, bool upper,
                                                 unsigned bit, unsigned below_t, unsigned below_t4) {
    const unsigned wa = upper ? m.mk.y : m.mk.x, wb = upper ? m.mk.w : m.mk.z;
    const int base_a = m.e0 + (upper ? __popc(m.mk.x) : 0);
    const int base_b = m.e0 + __popc(m.mk.x) + __popc(m.mk.y) + (upper ? __popc(m.mk.z) : 0);
    float4 v;
    v.x = (wa >> bit) & 1u ? __ldg(values + base_a + __popc(wa & below_t)) : 0.f;
    v.y = (wb >> bit) & 1u ? __ldg(values + base_b + __popc(wb & below_t)) : 0.f;
    v.z = (wa >> (bit + 4)) & 1u ? __ldg(values + base_a + __popc(wa & below_t4)) : 0.f;
    v.w = (wb >> (bit + 4)) & 1u ? __ldg(values + base_b + __popc(wb & below_t4)) : 0.f;
    return v;
}

// PV: prefetch the next block's values with its X rows (their load waits on the
// mask, so reading them in the step that uses them exposes one L2 round trip per block).
template <int CH, bool VEC, bool PV>
__global__ void __launch_bounds__(256)
tcgnn_spmm_tf32(const int4* __restrict__ units, const int* __restrict__ block_ptr,
                const int* __restrict__ block_cols, const uint4* __restrict__ block_mask,
                const float* __restrict__ values, const float* __restrict__ X,
                float* __restrict__ Y, float* __restrict__ partial, int* __restrict__ counters,
                const int2* __restrict__ unit_k0, int M, int D, int n_slabs) {
    extern __shared__ float4 tc_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int unit = blockIdx.x / n_slabs, slab = blockIdx.x - unit * n_slabs;
    const int4 u = units[unit];  // (window, first block, end block, slot or -1)
    const int col0 = slab * (32 * CH);
    // Lane (g, t) holds A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]: positions
    // 8g+t (+64, +4).  Rows 0-7 sit in mask words 0-1, rows 8-15 in words 2-3;
    // all four positions share the bit offset below within their word.
    const bool upper = (g >> 2) != 0;
    const unsigned bit = 8u * (g & 3) + t;
    const unsigned below_t = (1u << bit) - 1u, below_t4 = (1u << (bit + 4)) - 1u;

    float acc[CH][4][4];
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[c][j][q] = 0.f;

    // Software pipeline over the warp's blocks b, b + nwarps, ...: while the MMAs
    // of block i run, the X rows of block i+1 and the metadata of block i+2 are
    // already in flight (a warp keeps about two blocks of loads outstanding).
    int b = u.y + warp;
    TcMeta cur = tc_meta(block_ptr, block_cols, block_mask, b, u.z, t);
    float4 lo[CH], hi[CH];
    tc_load_rows<CH, VEC>(X, cur, col0 + 4 * g, D, lo, hi);
    TcMeta nxt = tc_meta(block_ptr, block_cols, block_mask, b + nwarps, u.z, t);
    float4 vcur = PV ? tc_frag_values(values, cur, upper, bit, below_t, below_t4) : make_float4(0.f, 0.f, 0.f, 0.f);
    for (; b < u.z; b += nwarps) {  // warp-uniform: mma.sync needs all lanes
        const float4 v = PV ? vcur : tc_frag_values(values, cur, upper, bit, below_t, below_t4);
        float4 nlo[CH], nhi[CH];
        tc_load_rows<CH, VEC>(X, nxt, col0 + 4 * g, D, nlo, nhi);
        if (PV) vcur = tc_frag_values(values, nxt, upper, bit, below_t, below_t4);
        const TcMeta after = tc_meta(block_ptr, block_cols, block_mask, b + 2 * nwarps, u.z, t);
        const unsigned a[4] = {tc_tf32(v.x), tc_tf32(v.y), tc_tf32(v.z), tc_tf32(v.w)};
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            tc_mma(acc[c][0], a, tc_tf32(lo[c].x), tc_tf32(hi[c].x));
            tc_mma(acc[c][1], a, tc_tf32(lo[c].y), tc_tf32(hi[c].y));
            tc_mma(acc[c][2], a, tc_tf32(lo[c].z), tc_tf32(hi[c].z));
            tc_mma(acc[c][3], a, tc_tf32(lo[c].w), tc_tf32(hi[c].w));
            lo[c] = nlo[c];
            hi[c] = nhi[c];
        }
        cur = nxt;
        nxt = after;
    }

    tc_cta_sum_store<CH, VEC>(acc, tc_smem, u, col0, M, D, Y, partial);
    if (counters != nullptr && u.w >= 0) tc_cta_combine<CH>(u, unit, slab, col0, unit_k0, Y, partial, counters, M, D, n_slabs);
}

// ---------------------------------------------------------------------------
// TF32 SpMM with cp.async gathers (same tiles, plan, outputs and split-window sum as
// tcgnn_spmm_tf32; 16-byte aligned rows only, D % 4 == 0).
// Nsight Compute on blogcatalog3 (D = 128) showed tcgnn_spmm_tf32 latency-bound:
// 98 registers/thread, 23 % achieved occupancy, long-scoreboard stalls, L2 at
// 34 % -- a warp keeps only about two blocks of X rows in flight, in registers.
// Here the X rows of the next NS - 1 blocks travel global -> shared through
// cp.async, which holds no registers while in flight, so each warp keeps NS
// blocks of gathers outstanding at fewer registers.  The copies are coalesced
// (lane L copies 16 bytes of slot L / 8 (and L / 8 + 4), a quarter-warp one
// row's 128 contiguous bytes); the fragments are read from shared memory, rows
// padded by 8 floats so that lanes (g, t) reading rows t and t + 4 at 4g hit
// distinct banks.  Each warp owns its stages; __syncwarp orders them.
struct TcEM {
    int e0;
    uint4 mk;
};

__device__ __forceinline__ TcEM tc_em(const int* __restrict__ block_ptr, const uint4* __restrict__ block_mask, int b,
                                      int end) {
    TcEM m = {0, make_uint4(0u, 0u, 0u, 0u)};
    if (b < end) {
        m.e0 = block_ptr[b];
        m.mk = block_mask[b];
    }
    return m;
}

__device__ __forceinline__ float4 tc_frag_values_em(const float* __restrict__ values, const TcEM& m, bool upper,
                                                    unsigned bit, unsigned below_t, unsigned below_t4) {
    TcMeta mm = {m.e0, -1, -1, m.mk};
    return tc_frag_values(values, mm, upper, bit, below_t, below_t4);
}

// Rows this lane copies for block b: slots s and s + 4 (padding slots and blocks past the end: -1).
__device__ __forceinline__ int2 tc_copy_cols(const int* __restrict__ block_cols, int b, int end, int s) {
    return b < end ? make_int2(block_cols[b * 8 + s], block_cols[b * 8 + s + 4]) : make_int2(-1, -1);
}

template <int CH>
__device__ __forceinline__ void tc_issue_rows(float* stage, const float* __restrict__ X, int2 rows, int s, int off,
                                              int col0, int D) {
    constexpr int RS = 32 * CH + 8;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int col = col0 + c * 32 + off;
        const bool in = col < D;  // D % 4 == 0: the 4 floats are all in or all out
        const int lo_bytes = (rows.x >= 0 && in) ? 16 : 0, hi_bytes = (rows.y >= 0 && in) ? 16 : 0;
        const float* plo = lo_bytes ? X + (size_t)rows.x * D + col : X;
        const float* phi = hi_bytes ? X + (size_t)rows.y * D + col : X;
        tc_cp_async16(tc_smem_addr(stage + s * RS + c * 32 + off), plo, lo_bytes);
        tc_cp_async16(tc_smem_addr(stage + (s + 4) * RS + c * 32 + off), phi, hi_bytes);
    }
}

// MINB: CTAs of 256 threads per SM to budget registers for (3: at most 80 per thread, 4: 64).
template <int CH, int NS, int MINB>
__global__ void __launch_bounds__(256, MINB)
tcgnn_spmm_tf32_async(const int4* __restrict__ units, const int* __restrict__ block_ptr,
                      const int* __restrict__ block_cols, const uint4* __restrict__ block_mask,
                      const float* __restrict__ values, const float* __restrict__ X,
                      float* __restrict__ Y, float* __restrict__ partial, int* __restrict__ counters,
                const int2* __restrict__ unit_k0, int M, int D, int n_slabs) {
    extern __shared__ float4 tc_smem[];
    constexpr int RS = 32 * CH + 8;  // floats per staged row
    constexpr int STAGE = 8 * RS;     // floats per stage (one block's 8 rows)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int unit = blockIdx.x / n_slabs, slab = blockIdx.x - unit * n_slabs;
    const int4 u = units[unit];
    const int col0 = slab * (32 * CH);
    const bool upper = (g >> 2) != 0;
    const unsigned bit = 8u * (g & 3) + t;
    const unsigned below_t = (1u << bit) - 1u, below_t4 = (1u << (bit + 4)) - 1u;
    const int cs = lane >> 3, coff = 4 * (lane & 7);  // this lane's copies: slots cs, cs + 4 at feature coff
    float* stages = reinterpret_cast<float*>(tc_smem) + warp * NS * STAGE;

    float acc[CH][4][4];
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[c][j][q] = 0.f;

    // The warp's blocks are b_i = u.y + warp + i * nwarps, i < n.
    const int first = u.y + warp;
    const int n = first < u.z ? (u.z - first + nwarps - 1) / nwarps : 0;
    int2 cq[NS];
#pragma unroll
    for (int j = 0; j < NS; ++j) cq[j] = tc_copy_cols(block_cols, first + j * nwarps, u.z, cs);
#pragma unroll
    for (int j = 0; j < NS - 1; ++j) {
        tc_issue_rows<CH>(stages + j * STAGE, X, cq[j], cs, coff, col0, D);
        tc_cp_commit();
    }
    int2 cnext = cq[NS - 1];
    TcEM nxt = tc_em(block_ptr, block_mask, first + nwarps, u.z);
    float4 vcur = tc_frag_values_em(values, tc_em(block_ptr, block_mask, first, u.z), upper, bit, below_t, below_t4);
    for (int i = 0; i < n; ++i) {  // warp-uniform: mma.sync needs all lanes
        // Block i + NS - 1 into the stage that block i - 1 freed; then its successor's columns.
        tc_issue_rows<CH>(stages + ((i + NS - 1) % NS) * STAGE, X, cnext, cs, coff, col0, D);
        tc_cp_commit();
        cnext = tc_copy_cols(block_cols, first + (i + NS) * nwarps, u.z, cs);
        const float4 vnext = tc_frag_values_em(values, nxt, upper, bit, below_t, below_t4);
        nxt = tc_em(block_ptr, block_mask, first + (i + 2) * nwarps, u.z);
        tc_cp_wait<NS - 1>();  // this lane's copies of block i have landed
        __syncwarp();          // ... and every other lane's
        const float* st = stages + (i % NS) * STAGE;
        const unsigned a[4] = {tc_tf32(vcur.x), tc_tf32(vcur.y), tc_tf32(vcur.z), tc_tf32(vcur.w)};
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            const float4 l = *reinterpret_cast<const float4*>(st + t * RS + c * 32 + 4 * g);
            const float4 h = *reinterpret_cast<const float4*>(st + (t + 4) * RS + c * 32 + 4 * g);
            tc_mma(acc[c][0], a, tc_tf32(l.x), tc_tf32(h.x));
            tc_mma(acc[c][1], a, tc_tf32(l.y), tc_tf32(h.y));
            tc_mma(acc[c][2], a, tc_tf32(l.z), tc_tf32(h.z));
            tc_mma(acc[c][3], a, tc_tf32(l.w), tc_tf32(h.w));
        }
        vcur = vnext;
        __syncwarp();  // the stage is refilled in the next iteration
    }
    tc_cp_wait<0>();
    __syncthreads();  // the stages' memory becomes the cross-warp sum's
    tc_cta_sum_store<CH, true>(acc, tc_smem, u, col0, M, D, Y, partial);
    if (counters != nullptr && u.w >= 0) tc_cta_combine<CH>(u, unit, slab, col0, unit_k0, Y, partial, counters, M, D, n_slabs);
}

// ---------------------------------------------------------------------------
// TF32 tensor-core SDDMM: out[e] = <Xa[i], Xb[j]> (times values[e] if multiply)
// for every stored entry e = (i, j), in tiled order.  A warp computes a block's
// whole 16x8 tile, C = Xa[window rows] @ Xb[block columns]^T, then each stored
// entry reads its element: each output is written once.
// K (the feature dimension) is permuted inside each MMA (tc_rows_dot).
// grid = ceil(n_blocks / (bpw * 4)), block = 128 threads; blocks are dealt to
// warps in runs of bpw, so hub windows spread over many warps.
template <bool VEC>
__global__ void __launch_bounds__(128)
tcgnn_sddmm_tf32(const int* __restrict__ win_ptr, int n_windows, const int* __restrict__ block_ptr,
                 const int* __restrict__ block_cols, const tc_u8* __restrict__ tile_pos,
                 const float* __restrict__ values, const float* __restrict__ Xa,
                 const float* __restrict__ Xb, float* __restrict__ out, int M, int n_blocks, int D,
                 int multiply, int bpw) {
    extern __shared__ float4 tc_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const long long gw = (long long)blockIdx.x * (blockDim.x >> 5) + warp;
    const long long first = gw * bpw;
    if (first >= n_blocks) return;  // whole warp
    const int b0 = (int)first, b1 = (int)min((long long)n_blocks, first + bpw);
    float* tile = reinterpret_cast<float*>(tc_smem) + warp * 128;
    int w = tc_find_window(win_ptr, n_windows, b0);
    for (int b = b0; b < b1; ++b) {
        w = tc_advance_window(win_ptr, w, b);
        const int ra = w * 16 + g, rb = ra + 8;
        const int r_lo = ra < M ? ra : -1, r_hi = rb < M ? rb : -1;
        const int cb = block_cols[b * 8 + g];
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        tc_rows_dot<VEC>(acc, Xa, r_lo, r_hi, Xb, cb, D, t);
        // C tile row-major in shared memory, then one read per stored entry.
        reinterpret_cast<float2*>(tile)[(g * 8 + 2 * t) >> 1] = make_float2(acc[0], acc[1]);
        reinterpret_cast<float2*>(tile)[((g + 8) * 8 + 2 * t) >> 1] = make_float2(acc[2], acc[3]);
        __syncwarp();
        const int e1 = block_ptr[b + 1];
        for (int e = block_ptr[b] + lane; e < e1; e += 32) {
            float v = tile[tile_pos[e]];
            if (multiply) v *= values[e];
            out[e] = v;
        }
        __syncwarp();  // the next block overwrites the tile
    }
}
"""

SOURCE = COMMON_SOURCE + _TF32
#: Every SpMM config compiled: each one :func:`tf32_spmm_config` gives.
TF32_SPMM_CONFIGS = tuple(tf32_spmm_config(c, a) for c in TF32_CHUNKS for a in (True, False))
#: Every compiled variant: the SpMM configs and both SDDMMs (split windows are summed inside the SpMM launch).
NAMES = tuple([c.name for c in TF32_SPMM_CONFIGS] + [SddmmTF32(v).name for v in (True, False)])
register("tf32", SOURCE, NAMES)
