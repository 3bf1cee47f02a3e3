"""Layer 1: the ``"vec"`` family: TF32 SpMM and SDDMM on the vector layout (8-row windows, 8x4 blocks).

Operands swapped: X is the MMA's A operand.  One warp per (balanced unit, feature slice); split
windows are summed inside the launch (COMBINE) or by the fixup.  Register gathers
(``tcgnn_spmm_vec``) and cp.async gathers (``tcgnn_spmm_vec_async``: through L2, or L1, values
one step ahead or dense, one CTA per window x slice for COOP).
"""

import dataclasses
from typing import ClassVar

from ..registry import register
from .common import COMMON_SOURCE, FIXUP_SOURCE, PUT4_SOURCE, VEC_COMMON_SOURCE, KernelConfig, fixup_name

__all__ = ["SpmmVec", "SpmmVecAsync", "SddmmVec", "VEC_SLICES", "VEC_UNROLL", "VEC_ASYNC_UNROLL", "VEC_STAGES",
           "VEC_WARPS", "VEC_SDDMM_BLOCKS", "VEC_SPMM_CONFIGS", "vec_async_smem",
           "sddmm_vec_name"]

#: Float4 column groups per lane: a warp covers ``32 * FS`` features (the statistics' rule picks 1 or 2).
VEC_SLICES = (1, 2)
#: Blocks per step of the vector SpMM: the statistics' default, and the timed choice's other shape.
VEC_UNROLL = 4
VEC_ASYNC_UNROLL = (4, 2)
#: Steps in flight per warp of the cp.async vector SpMM.
VEC_STAGES = 2
#: Warps per CTA of the vector SDDMM, and the most of the vector SpMM (``__launch_bounds__(128)``).
VEC_WARPS = 4
#: Blocks per unit of the vector SDDMM: one 16 x 8 MMA tile holds 4 blocks' columns.
VEC_SDDMM_BLOCKS = 4


@dataclasses.dataclass(frozen=True)
class SpmmVec(KernelConfig):
    """``tcgnn_spmm_vec<FS, U, VEC, COMBINE, PF>``: register gathers of U blocks, metadata prefetched (PF)."""

    KERNEL: ClassVar[str] = "tcgnn_spmm_vec"
    FS: int
    U: int
    VEC: bool
    COMBINE: bool = True
    PF: bool = True


@dataclasses.dataclass(frozen=True)
class SpmmVecAsync(KernelConfig):
    """``tcgnn_spmm_vec_async<FS, U, NS, COMBINE, RX, PV, DV, COOP, L1>``: cp.async gathers, NS steps in flight.

    RX rounds X to TF32 in registers, PV loads values one step ahead, DV reads dense values, COOP
    sums a window's parts in shared memory, L1 copies X rows through L1.
    """

    KERNEL: ClassVar[str] = "tcgnn_spmm_vec_async"
    FS: int
    U: int
    NS: int
    COMBINE: bool = True
    RX: bool = True
    PV: bool = False
    DV: bool = False
    COOP: bool = False
    L1: bool = False


@dataclasses.dataclass(frozen=True)
class SddmmVec(KernelConfig):
    """``tcgnn_sddmm_vec<VEC>``."""

    KERNEL: ClassVar[str] = "tcgnn_sddmm_vec"
    VEC: bool


def vec_async_smem(nwarps, slices, unroll, stages):
    """Bytes of ``tcgnn_spmm_vec_async``: per warp ``stages`` x ``unroll`` blocks x 4 rows padded by 8 floats."""
    return nwarps * stages * unroll * 4 * (32 * slices + 8) * 4


def sddmm_vec_name(vec):
    return SddmmVec(vec).name


_VEC = r"""
// ---------------------------------------------------------------------------
// TF32 SpMM on the vector layout: 8-row windows, condensed 8x1 column vectors
// grouped 4 per block (8 x 4 tiles, tile position p = 4 * row + slot).
// Operands swapped (FlashSparse): X is the MMA's A operand -- 16 features x 8
// gathered rows -- and two blocks of sparse vectors are B (k = slot of the first
// block, k + 4 of the second; n = row of the window), so
//   Y[window rows]^T (16 x 8) += X[cols]^T (16 x 8) @ A_blocks^T (8 x 8)
// per mma.m16n8k8.  Lane (g, t) loads X[col of slot t][c + 4g .. 4g + 3] with
// one 16-byte load straight to registers (no shared memory, no barrier): MMA
// (j, 0) takes features 4g, 4g + 1 as m = g, g + 8; MMA (j, 1) features 4g + 2,
// 4g + 3.  Its B value is entry p = lane of the block: the block's 32-bit
// occupancy mask says whether it is stored, popc of the bits below says where.
// The lane ends up owning rows 2t, 2t + 1 x features c + 4g .. 4g + 3: 16-byte
// stores.
// Work: one warp per (unit, feature slice of 32 * FS); units are balanced parts
// of a window (int4: window, first block, end block, partial slot or -1), and a
// split window's parts are summed in unit order by tcgnn_spmm_fixup (H = 8).
// grid = ceil(units * slices / warps) CTAs of 1-4 independent warps.
// Store a warp's 8 rows x 32 * FS features (Y, or its partial tile), then, with
// COMBINE, count the part and let the window's last part sum all partial tiles.
template <int FS, bool VEC, bool COMBINE>
__device__ __forceinline__ void tc_vec_finish(const float (&acc)[FS][2][4], int4 u, int unit, int slice, int col,
                                              int lane, const int2* __restrict__ unit_k0, float* __restrict__ Y,
                                              float* __restrict__ partial, int* __restrict__ counters, int M, int D,
                                              int n_slices) {
    const int t = lane & 3;
    // acc[j][h] = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}: m = g (+8) is feature 4g + 2h (+1).
    const int r = 2 * t;
    float* out;
    long long rows_left;
    if (u.w < 0) {
        out = Y + ((size_t)u.x * 8 + r) * D;
        rows_left = (long long)M - ((long long)u.x * 8 + r);
    } else {
        out = partial + ((size_t)u.w * 8 + r) * D;
        rows_left = 2;
    }
#pragma unroll
    for (int j = 0; j < FS; ++j) {
        const int cj = col + 32 * j;
        if (rows_left > 0)
            tc_store4<VEC>(out, cj, D, make_float4(acc[j][0][0], acc[j][0][2], acc[j][1][0], acc[j][1][2]));
        if (rows_left > 1)
            tc_store4<VEC>(out + D, cj, D, make_float4(acc[j][0][1], acc[j][0][3], acc[j][1][1], acc[j][1][3]));
    }
    if (COMBINE && u.w >= 0)
        tc_vec_combine<32 * FS, float, VEC>(u, unit, slice, lane, unit_k0, Y, partial, counters, M, D, n_slices);
}

// COMBINE: split windows are summed in this launch -- each part stores its partial
// tile, and the warp that finishes a window's slice last (a per-stream counter,
// reset by that warp) sums all of the window's partial tiles in unit order, as
// tcgnn_spmm_fixup would: same order, so results do not depend on which warp
// came last.  unit_k0[unit] = (first slot of its window, parts of its window).
// PF: load the next U blocks' metadata one step ahead of their X rows (more
// registers; without it each step waits for its metadata, then for its rows).
// Registers are capped at 80 (6 CTAs of 128 per SM; 128 for FS = 4), where
// Nsight Compute showed no spills: a 64 cap spilled.
template <int FS, int U, bool VEC, bool COMBINE, bool PF>
__global__ void __launch_bounds__(128, (FS >= 4 ? 4 : 6))
tcgnn_spmm_vec(const int4* __restrict__ units, const int* __restrict__ win_ptr, const int2* __restrict__ unit_k0,
               const int* __restrict__ block_cols, const uint2* __restrict__ meta, const float* __restrict__ values,
               const float* __restrict__ X,
               float* __restrict__ Y, float* __restrict__ partial, int* __restrict__ counters, int M, int D,
               int n_slices, int n_work) {
    static_assert(U % 2 == 0, "blocks go to the MMA in pairs");
    const int lane = threadIdx.x & 31;
    const int work = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (work >= n_work) return;  // whole warp
    const int g = lane >> 2, t = lane & 3;
    const int unit = work / n_slices, slice = work - unit * n_slices;
    const int4 u = tc_vec_unit(units, win_ptr, unit);
    const int col = slice * (32 * FS) + 4 * g;
    const unsigned below = (1u << lane) - 1u;

    float acc[FS][2][4];
#pragma unroll
    for (int j = 0; j < FS; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[j][h][q] = 0.f;

    int c[U];
    uint2 m[U];
    if (PF) {
#pragma unroll
        for (int i = 0; i < U; ++i) {
            const int bi = u.y + i;
            c[i] = bi < u.z ? block_cols[bi * 4 + t] : -1;
            m[i] = bi < u.z ? meta[bi] : make_uint2(0u, 0u);
        }
    }
    for (int b = u.y; b < u.z; b += U) {  // warp-uniform: mma.sync needs all lanes
        if (!PF) {
#pragma unroll
            for (int i = 0; i < U; ++i) {
                const int bi = b + i;
                c[i] = bi < u.z ? block_cols[bi * 4 + t] : -1;
                m[i] = bi < u.z ? meta[bi] : make_uint2(0u, 0u);
            }
        }
        float4 x[U][FS];
        float v[U];
#pragma unroll
        for (int i = 0; i < U; ++i) {
#pragma unroll
            for (int j = 0; j < FS; ++j) x[i][j] = tc_load4<VEC>(X, c[i], col + 32 * j, D);  // slot -1: zeros
            v[i] = (m[i].x >> lane) & 1u ? __ldg(values + m[i].y + __popc(m[i].x & below)) : 0.f;
        }
        if (PF) {
#pragma unroll
            for (int i = 0; i < U; ++i) {
                const int bi = b + U + i;
                c[i] = bi < u.z ? block_cols[bi * 4 + t] : -1;
                m[i] = bi < u.z ? meta[bi] : make_uint2(0u, 0u);
            }
        }
#pragma unroll
        for (int i = 0; i < U; i += 2) {
            const unsigned b0 = tc_tf32(v[i]), b1 = tc_tf32(v[i + 1]);
#pragma unroll
            for (int j = 0; j < FS; ++j) {
                const float4 p = x[i][j], q = x[i + 1][j];
                const unsigned a0[4] = {tc_tf32(p.x), tc_tf32(p.y), tc_tf32(q.x), tc_tf32(q.y)};
                const unsigned a1[4] = {tc_tf32(p.z), tc_tf32(p.w), tc_tf32(q.z), tc_tf32(q.w)};
                tc_mma(acc[j][0], a0, b0, b1);
                tc_mma(acc[j][1], a1, b0, b1);
            }
        }
    }

    tc_vec_finish<FS, VEC, COMBINE>(acc, u, unit, slice, col, lane, unit_k0, Y, partial, counters, M, D, n_slices);
}

// COOP tail of the TF32 kernel: each warp puts its 8 rows x 32 * FS features (MMA accumulator layout,
// as tc_vec_finish stores them) into its own tile at `tiles + wib * stride`; tc_vec_coop_sum adds the 4.
template <int FS>
__device__ __forceinline__ void tc_vec_coop_finish(const float (&acc)[FS][2][4], int window, int lane, int wib,
                                                   float* tiles, int stride, float* __restrict__ Y, int M, int D,
                                                   int base) {
    constexpr int TS = 32 * FS + 4;  // floats per tile row
    const int g = lane >> 2, t = lane & 3;
    float* mine = tiles + wib * stride;
    __syncwarp();  // this warp's last reads of its stages are done
#pragma unroll
    for (int j = 0; j < FS; ++j) {
        *reinterpret_cast<float4*>(mine + (2 * t) * TS + 32 * j + 4 * g) =
            make_float4(acc[j][0][0], acc[j][0][2], acc[j][1][0], acc[j][1][2]);
        *reinterpret_cast<float4*>(mine + (2 * t + 1) * TS + 32 * j + 4 * g) =
            make_float4(acc[j][0][1], acc[j][0][3], acc[j][1][1], acc[j][1][3]);
    }
    tc_vec_coop_sum<FS, true>(tiles, stride, window, Y, M, D, base);
}

// ---------------------------------------------------------------------------
// Vector-layout SpMM with cp.async gathers (16-byte aligned rows, D % 4 == 0).
// Same work, fragments, outputs and COMBINE as tcgnn_spmm_vec, but the X rows of
// the next NS - 1 steps (U blocks each) travel global -> shared through
// cp.async, which holds no registers while in flight: more gathers in flight
// per warp at fewer registers.  Lane L copies 16 bytes of row L / 8 of each
// block (a quarter-warp one row's 128 contiguous bytes); fragments are read
// back with 16-byte shared loads from rows padded by 8 floats, so the lanes of
// a quarter-warp (rows t, features 4g) hit distinct banks.  Each warp owns its
// stages; __syncwarp orders them.
// RX: round X to TF32 (cvt.rna) before the MMA; false hands the raw float bits
// over, which the tensor core truncates (twice the rounding error on X, one
// instruction less per element) -- an experiment, not a public mode.
// PV: each step's values are loaded one step ahead (the next step's metadata two ahead).
// DV: values are dense, 32 per block in tile-position order (see products._values.vec_dense_values): no metadata.
// L1: the copies go through L1 (tc_cp_async16_via).
template <int FS, int U, int NS, bool COMBINE, bool RX = true, bool PV = false, bool DV = false, bool COOP = false,
          bool L1 = false>
__global__ void __launch_bounds__(128, (FS >= 2 ? 6 : 8))
tcgnn_spmm_vec_async(const int4* __restrict__ units, const int* __restrict__ win_ptr,
                     const int2* __restrict__ unit_k0, const int* __restrict__ block_cols,
                     const uint2* __restrict__ meta,
                     const float* __restrict__ values, const float* __restrict__ X, float* __restrict__ Y,
                     float* __restrict__ partial, int* __restrict__ counters, int M, int D, int n_slices,
                     int n_work) {
    static_assert(U % 2 == 0, "blocks go to the MMA in pairs");
    extern __shared__ float4 tc_smem[];
    constexpr int RS = 32 * FS + 8;    // floats per staged row
    constexpr int STAGE = U * 4 * RS;  // floats per stage
    tc_vec_work w;
    if (COOP)
        tc_vec_coop_work_of(units, win_ptr, n_slices, 32 * FS, w);  // every warp of the grid has a part
    else if (!tc_vec_work_of(units, win_ptr, n_slices, n_work, 32 * FS, w))
        return;  // whole warp
    const int lane = w.lane, wib = w.wib, g = w.g, t = w.t, unit = w.unit, slice = w.slice, base = w.base;
    const int4 u = w.u;
    const int col = base + 4 * g;
    const unsigned bit = 1u << lane, below = bit - 1u;
    const int cr = lane >> 3, coff = 4 * (lane & 7);  // this lane copies row cr of each block at feature coff
    float* stages = reinterpret_cast<float*>(tc_smem) + wib * NS * STAGE;
    const int n_steps = (u.z - u.y + U - 1) / U;
    // Per-lane constants of the copies, so that a copy costs one multiply-add and the cp.async: the shared
    // address of this lane's slot in stage 0 (block i, chunk c of stage s sit at fixed offsets from it), and
    // per chunk the source in X's row 0 -- X itself where the chunk lies past D (then nothing is read).
    const unsigned cp_dst = tc_smem_addr(stages + cr * RS + coff);
    const char* cp_src[FS];
    bool cp_ok[FS];
#pragma unroll
    for (int c = 0; c < FS; ++c) {
        cp_ok[c] = base + 32 * c + coff < D;
        cp_src[c] = reinterpret_cast<const char*>(cp_ok[c] ? X + base + 32 * c + coff : X);
    }
    const int row_bytes = 4 * D;  // X's rows: one multiply-add from row 0 (D < 2**29)

    float acc[FS][2][4];
#pragma unroll
    for (int j = 0; j < FS; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[j][h][q] = 0.f;

    int rq[U];  // X rows this lane copies for the next step to issue (-1: a padding slot, zeros)
#define TC_VEC_ROWS(step)                                                        \
    _Pragma("unroll") for (int i = 0; i < U; ++i) {                              \
        const int bi = u.y + (step) * U + i;                                     \
        rq[i] = bi < u.z ? __ldg(block_cols + bi * 4 + cr) : -1;                 \
    }
#define TC_VEC_ISSUE(step)                                                       \
    {                                                                            \
        const unsigned dst = cp_dst + ((step) % NS) * (STAGE * 4);               \
        _Pragma("unroll") for (int i = 0; i < U; ++i) {                          \
            const long long off = (long long)max(rq[i], 0) * row_bytes;          \
            _Pragma("unroll") for (int c = 0; c < FS; ++c)                       \
                tc_cp_async16_via<L1>(dst + (i * 4 * RS + 32 * c) * 4,               \
                                      cp_src[c] + off, rq[i] >= 0 && cp_ok[c] ? 16 : 0); \
        }                                                                        \
        tc_cp_commit();                                                          \
    }
#define TC_VEC_META(dst, step)                                                   \
    _Pragma("unroll") for (int i = 0; i < U; ++i) {                              \
        const int bi = u.y + (step) * U + i;                                     \
        dst[i] = bi < u.z ? meta[bi] : make_uint2(0u, 0u);                       \
    }
#define TC_VEC_VALUE(m) ((m).x & bit ? __ldg(values + ((m).y + __popc((m).x & below))) : 0.f)
#pragma unroll
    for (int s0 = 0; s0 < NS - 1; ++s0) {
        TC_VEC_ROWS(s0)
        TC_VEC_ISSUE(s0)
    }
    TC_VEC_ROWS(NS - 1)
    // DV: values holds 32 floats per block in position order (zeros where no entry): lane L's B value is
    // entry L, one coalesced load per block and no metadata; loaded one step ahead, in pv.
#define TC_VEC_DENSE(dst, step)                                                  \
    _Pragma("unroll") for (int i = 0; i < U; ++i) {                              \
        const int bi = u.y + (step) * U + i;                                     \
        dst[i] = bi < u.z ? __ldg(values + (size_t)bi * 32 + lane) : 0.f;        \
    }
    uint2 mc[U];  // PV: the next step's metadata; else this step's
    float pv[U];  // PV (and DV): this step's values, loaded one step ahead
    if (DV) {
        TC_VEC_DENSE(pv, 0)
    } else {
        TC_VEC_META(mc, 0)
        if (PV) {
#pragma unroll
            for (int i = 0; i < U; ++i) pv[i] = TC_VEC_VALUE(mc[i]);
            TC_VEC_META(mc, 1)
        }
    }
    for (int step = 0; step < n_steps; ++step) {  // warp-uniform: mma.sync needs all lanes
        TC_VEC_ISSUE(step + NS - 1)
        TC_VEC_ROWS(step + NS)
        float v[U];
        uint2 mn[U];
        if (DV) {
#pragma unroll
            for (int i = 0; i < U; ++i) v[i] = pv[i];
            TC_VEC_DENSE(pv, step + 1)
        } else {
#pragma unroll
            for (int i = 0; i < U; ++i) {
                const float vi = TC_VEC_VALUE(mc[i]);
                if (PV) {
                    v[i] = pv[i];
                    pv[i] = vi;
                } else {
                    v[i] = vi;
                }
            }
            TC_VEC_META(mn, step + (PV ? 2 : 1))
        }
        tc_cp_wait<NS - 1>();  // this lane's copies of this step have landed
        __syncwarp();          // ... and every other lane's
        const float* st = stages + (step % NS) * STAGE;
#pragma unroll
        for (int i = 0; i < U; i += 2) {
            const unsigned b0 = tc_tf32(v[i]), b1 = tc_tf32(v[i + 1]);
#pragma unroll
            for (int j = 0; j < FS; ++j) {
                const float4 p = *reinterpret_cast<const float4*>(st + (i * 4 + t) * RS + 32 * j + 4 * g);
                const float4 q = *reinterpret_cast<const float4*>(st + ((i + 1) * 4 + t) * RS + 32 * j + 4 * g);
                const unsigned a0[4] = {tc_x(p.x, RX), tc_x(p.y, RX), tc_x(q.x, RX), tc_x(q.y, RX)};
                const unsigned a1[4] = {tc_x(p.z, RX), tc_x(p.w, RX), tc_x(q.z, RX), tc_x(q.w, RX)};
                tc_mma(acc[j][0], a0, b0, b1);
                tc_mma(acc[j][1], a1, b0, b1);
            }
        }
        if (!DV) {
#pragma unroll
            for (int i = 0; i < U; ++i) mc[i] = mn[i];
        }
        __syncwarp();  // the stage is refilled in the next step
    }
#undef TC_VEC_DENSE
#undef TC_VEC_VALUE
#undef TC_VEC_ROWS
#undef TC_VEC_ISSUE
#undef TC_VEC_META
    tc_cp_wait<0>();
    if (COOP) {
        static_assert(!COOP || 8 * (32 * FS + 4) <= NS * STAGE, "a warp's tile fits in its stages");
        tc_vec_coop_finish<FS>(acc, u.x, lane, wib, reinterpret_cast<float*>(tc_smem), NS * STAGE, Y, M, D, base);
        return;
    }
    tc_vec_finish<FS, true, COMBINE>(acc, u, unit, slice, col, lane, unit_k0, Y, partial, counters, M, D, n_slices);
}

// ---------------------------------------------------------------------------
// TF32 SDDMM on the vector layout: a warp takes one unit of at most 4 blocks of
// one window and computes the 16 x 8 tile C = Xb[16 gathered columns] @
// Xa[8 window rows]^T (m = 4 * (block - first) + slot, n = row), through
// tc_rows_dot; each stored entry then reads its element from the warp's
// tile in shared memory: each output is written once.
template <bool VEC>
__global__ void __launch_bounds__(128)
tcgnn_sddmm_vec(const int4* __restrict__ units, int n_units, const int* __restrict__ block_ptr,
                const int* __restrict__ block_cols, const tc_u8* __restrict__ tile_pos,
                const float* __restrict__ values, const float* __restrict__ Xa, const float* __restrict__ Xb,
                float* __restrict__ out, int M, int D, int multiply) {
    __shared__ float tiles[4][128];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int unit = blockIdx.x * 4 + warp;
    if (unit >= n_units) return;
    const int g = lane >> 2, t = lane & 3;
    const int4 u = units[unit];
    const int slots = 4 * (u.z - u.y);
    const int c_lo = g < slots ? block_cols[u.y * 4 + g] : -1;
    const int c_hi = g + 8 < slots ? block_cols[u.y * 4 + g + 8] : -1;
    const int row = u.x * 8 + g;
    const int r = row < M ? row : -1;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    tc_rows_dot<VEC>(acc, Xb, c_lo, c_hi, Xa, r, D, t);  // columns are the A operand here
    float* tile = tiles[warp];
    reinterpret_cast<float2*>(tile)[(g * 8 + 2 * t) >> 1] = make_float2(acc[0], acc[1]);
    reinterpret_cast<float2*>(tile)[((g + 8) * 8 + 2 * t) >> 1] = make_float2(acc[2], acc[3]);
    __syncwarp();
    // Entries of the unit's blocks are contiguous; block k of the unit starts at p1..p3.
    const int e0 = block_ptr[u.y], e1 = block_ptr[u.z];
    const int nb = u.z - u.y;
    const int p1 = nb > 1 ? block_ptr[u.y + 1] : e1, p2 = nb > 2 ? block_ptr[u.y + 2] : e1;
    const int p3 = nb > 3 ? block_ptr[u.y + 3] : e1;
    for (int e = e0 + lane; e < e1; e += 32) {
        const int k = (e >= p1) + (e >= p2) + (e >= p3);
        const int p = tile_pos[e];
        float v = tile[(4 * k + (p & 3)) * 8 + (p >> 2)];
        if (multiply) v *= values[e];
        out[e] = v;
    }
}
"""

SOURCE = COMMON_SOURCE + FIXUP_SOURCE + VEC_COMMON_SOURCE + PUT4_SOURCE + _VEC
#: Every SpMM config compiled: each one the statistics' rule or the timed choice picks, and a shape that never
#: wins the timed choice on the measured graphs is neither a candidate nor compiled (``tools/timed_choice.py``
#: shows which shapes win).  So register gathers serve only rows cp.async cannot copy (not 16-byte aligned).
VEC_SPMM_CONFIGS = tuple(
    [SpmmVec(f, VEC_UNROLL, False, c) for f in VEC_SLICES for c in (True, False)]
    + [SpmmVecAsync(f, u, VEC_STAGES, c, True, True) for f in VEC_SLICES for u in VEC_ASYNC_UNROLL for c in (True, False)]
    + [SpmmVecAsync(f, VEC_UNROLL, VEC_STAGES, c, True, True, True) for f in VEC_SLICES for c in (True, False)]
    + [SpmmVecAsync(f, u, VEC_STAGES, c, True, True, False, False, True) for f in VEC_SLICES for u in VEC_ASYNC_UNROLL
       for c in (True, False)]
    + [SpmmVecAsync(f, u, VEC_STAGES, False, True, True, False, True) for f in VEC_SLICES for u in VEC_ASYNC_UNROLL]
)
#: Every compiled variant: the SpMM configs, both SDDMMs, the fixup.
NAMES = tuple([c.name for c in VEC_SPMM_CONFIGS] + [sddmm_vec_name(v) for v in (True, False)] + [fixup_name("float32")])
register("vec", SOURCE, NAMES)
