"""Layer 1: the ``"half"`` family: float16 / bfloat16 SpMM on the vector layout.

``mma.m16n8k16`` with float32 accumulation, X staged by cp.async and read back with
``ldmatrix.trans``; float32 matrices as two 16-bit parts (SPLIT) or 16-bit ones, float32 or 16-bit
results.
"""

import dataclasses
from typing import ClassVar

from ..registry import register
from .common import (COMMON_SOURCE, FIXUP_SOURCE, HALF_TYPES, PUT4_SOURCE, VEC_COMMON_SOURCE, KernelConfig,
                     cuda_type, fixup_name)

__all__ = ["SpmmVech", "VEC_HALF", "HALF_DEFAULT", "VEC_HALF_COOP", "spmm_vech_name", "vech_smem"]

#: (feature groups of 32, k16 chunks per step, stages) compiled for every type combination and aligned rows;
#: HALF_DEFAULT also for unaligned rows (D % 8 != 0).  These are the timed choice's shapes: a shape that never
#: wins the choice on the measured graphs is not compiled (``tools/timed_choice.py`` shows which shapes win).
VEC_HALF = ((1, 1, 2), (2, 1, 2), (2, 1, 3))
HALF_DEFAULT = (1, 1, 2)
#: (feature groups, k16 chunks per step, stages) of the COOP launch (aligned rows).
VEC_HALF_COOP = ((1, 1, 2), (2, 1, 2))


@dataclasses.dataclass(frozen=True)
class SpmmVech(KernelConfig):
    """``tcgnn_spmm_vech<TX, SPLIT, TY, FS, KS, NS, COMBINE, AL, PV, COOP>``: X of TX, result of TY."""

    KERNEL: ClassVar[str] = "tcgnn_spmm_vech"
    TX: str
    SPLIT: bool
    TY: str
    FS: int
    KS: int
    NS: int
    COMBINE: bool
    AL: bool
    PV: bool = True
    COOP: bool = False


def spmm_vech_name(x_type, split, y_type, slices, ks, stages, combine=True, aligned=True, prefetch=True, coop=False):
    """``coop``: one CTA per window x slice (aligned rows, values one step ahead, no partial tiles)."""
    ty = cuda_type(y_type)
    if coop:
        return SpmmVech(HALF_TYPES[x_type], split, ty, slices, ks, stages, False, True, True, True).name
    return SpmmVech(HALF_TYPES[x_type], split, ty, slices, ks, stages, combine, aligned, prefetch).name


def vech_smem(nwarps, slices, ks, stages):
    """Bytes of ``tcgnn_spmm_vech``: per warp ``stages`` x 16 ``ks`` rows of ``32 slices + 8`` halves."""
    return nwarps * stages * 16 * ks * (32 * slices + 8) * 2


def _names():
    names = []
    for x in HALF_TYPES:
        for split in (True, False):
            for y in ("float32", x):
                for f, ks, ns in VEC_HALF:
                    names += [spmm_vech_name(x, split, y, f, ks, ns, c) for c in (True, False)]
                names += [spmm_vech_name(x, split, y, *HALF_DEFAULT, c, False) for c in (True, False)]
                names += [spmm_vech_name(x, split, y, *cfg, coop=True) for cfg in VEC_HALF_COOP]
        names.append(fixup_name("float32", x))
    return names + [fixup_name("float32")]


_HALF = r"""
// ---------------------------------------------------------------------------
// float16 / bfloat16 SpMM on the vector layout, fp32 accumulation.
// Same work split, units and COMBINE as tcgnn_spmm_vec_async; X (type TX) is the
// A operand of mma.m16n8k16 (16 features x 16 gathered rows = 4 blocks), the
// blocks' values the B operand (k = 4 * block + slot, n = row of the window):
//   Y[window rows]^T (16 x 8) += X[cols]^T (16 x 16) @ A_blocks^T (16 x 8).
// X rows travel global -> shared through cp.async (16 bytes = 8 features a
// copy) into rows padded by 8 halves; ldmatrix.x4.trans turns 16 staged rows x 16
// features into the A fragment in one instruction (matrix q: rows 8 * (q >> 1),
// features 8 * (q & 1); row strides of 80 + 64 j bytes hit distinct banks).
// B fragment (PTX ISA, m16n8k16 .f16/.bf16): lane (g, t) holds B[2t, 2t+1][g]
// (block t >> 1, slots 2 (t & 1), +1, row g) and B[2t+8, 2t+9][g] (block
// 2 + (t >> 1)): two consecutive tile positions, found with popc on the block's
// 32-bit occupancy mask.
// SPLIT: the matrix is float32 and its values come as (hi, lo) pairs of TX
// (hi = TX(v * scale), lo = TX(v * scale - hi)), two MMAs each: about 2 x 11
// (f16) or 2 x 8 (bf16) significant bits of every value, where a single TX
// would round it to 11 or 8.  ``*unscale`` (a power of two, on the device: no
// host read to find it) undoes ``scale``, which keeps float16 hi parts in range.
// Without SPLIT the values are TX.
// The tile goes back through shared memory as float (rows padded by 4: conflict
// free both ways) and leaves as 16-byte (float) or 8-byte (16-bit) stores.
// AL: D % 8 == 0 and 16-byte aligned X / Y (cp.async); else synchronous
// element loads into the same staging rows.
template <typename TX> struct tc_mma16;
template <> struct tc_mma16<tc_f16> {
    static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct tc_mma16<tc_bf16> {
    static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

__device__ __forceinline__ void tc_ldsm_x4_trans(unsigned (&a)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
}

// B registers (low half: the smaller k) of one block for lane (g, t): positions p0, p0 + 1.
template <bool SPLIT>
__device__ __forceinline__ void tc_half_b(const void* __restrict__ values, uint2 m, int p0, unsigned& hi,
                                          unsigned& lo) {
    const unsigned h0 = (m.x >> p0) & 1u, h1 = (m.x >> (p0 + 1)) & 1u;
    const int idx = (int)m.y + __popc(m.x & ((1u << p0) - 1u));
    if (SPLIT) {
        const unsigned* v = static_cast<const unsigned*>(values);
        const unsigned w0 = h0 ? __ldg(v + idx) : 0u;
        const unsigned w1 = h1 ? __ldg(v + idx + h0) : 0u;
        hi = (w0 & 0xffffu) | (w1 << 16);
        lo = (w0 >> 16) | (w1 & 0xffff0000u);
    } else {
        const unsigned short* v = static_cast<const unsigned short*>(values);
        const unsigned s0 = h0 ? __ldg(v + idx) : 0u;
        const unsigned s1 = h1 ? __ldg(v + idx + h0) : 0u;
        hi = s0 | (s1 << 16);
        lo = 0u;
    }
}

// PV: load a step's values one step ahead (with the next step's metadata two steps ahead), so
// the MMAs do not wait for their B operand's loads (Nsight Compute: the value loads issued in the
// step they are used in were the top stall).
// COOP: one CTA of 4 warps per window x feature slice (tc_vec_coop_work_of), its 4 tiles summed by
// tc_vec_coop_sum (AL only).
template <typename TX, bool SPLIT, typename TY, int FS, int KS, int NS, bool COMBINE, bool AL, bool PV = true,
          bool COOP = false>
__global__ void __launch_bounds__(128, (FS >= 4 ? 4 : 8))
tcgnn_spmm_vech(const int4* __restrict__ units, const int* __restrict__ win_ptr, const int2* __restrict__ unit_k0,
                const int* __restrict__ block_cols, const uint2* __restrict__ meta, const void* __restrict__ values,
                const TX* __restrict__ X, TY* __restrict__ Y, float* __restrict__ partial,
                int* __restrict__ counters, int M, int D, int n_slices, int n_work,
                const float* __restrict__ unscale_p) {
    constexpr int U = 4 * KS;         // blocks per step (KS k16 chunks)
    constexpr int ROWS = 4 * U;       // staged X rows per step
    constexpr int RS = 32 * FS + 8;   // halves per staged row
    constexpr int STAGE = ROWS * RS;  // halves per stage
    constexpr int CPR = 4 * FS;       // 16-byte copies per row
    constexpr int RP = 32 / CPR;      // rows per pass of the warp
    constexpr int PASSES = ROWS / RP;
    constexpr int TS = 32 * FS + 4;   // floats per row of the output tile
    static_assert(NS * STAGE * 2 >= 8 * TS * 4, "the output tile reuses the stages");
    extern __shared__ uint4 tc_smem[];
    static_assert(!COOP || (AL && !COMBINE), "COOP: aligned rows, no partial tiles");
    tc_vec_work w;
    if (COOP)
        tc_vec_coop_work_of(units, win_ptr, n_slices, 32 * FS, w);  // every warp of the grid has a part
    else if (!tc_vec_work_of(units, win_ptr, n_slices, n_work, 32 * FS, w))
        return;  // whole warp
    const int lane = w.lane, wib = w.wib, g = w.g, t = w.t, unit = w.unit, slice = w.slice, base = w.base;
    const int4 u = w.u;
    const int cr = lane / CPR, cf = 8 * (lane % CPR);  // this lane copies rows cr + RP * pass at feature cf
    unsigned short* stages = reinterpret_cast<unsigned short*>(tc_smem) + wib * NS * STAGE;
    const unsigned stages_addr = tc_smem_addr(stages);
    const int n_steps = (u.z - u.y + U - 1) / U;
    // ldmatrix: lane supplies row (lane & 7) + 8 (q >> 1) of matrix q = lane >> 3, features 8 (q & 1).
    const int lm_row = (lane & 7) + 8 * ((lane >> 3) >> 1), lm_col = 8 * ((lane >> 3) & 1);
    const int p0 = 4 * g + 2 * (t & 1);  // tile positions p0, p0 + 1 of this lane's B values

    float acc[2 * FS][4];
#pragma unroll
    for (int j = 0; j < 2 * FS; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[j][q] = 0.f;

    int rq[PASSES];
#define TC_H_ROWS(step)                                                          \
    _Pragma("unroll") for (int p = 0; p < PASSES; ++p) {                         \
        const int idx = (u.y + (step) * U) * 4 + p * RP + cr;                    \
        rq[p] = idx < u.z * 4 ? block_cols[idx] : -1;                            \
    }
#define TC_H_ISSUE(step)                                                         \
    {                                                                            \
        unsigned short* st = stages + ((step) % NS) * STAGE;                     \
        const int fx = base + cf;                                                \
        _Pragma("unroll") for (int p = 0; p < PASSES; ++p) {                     \
            unsigned short* dst = st + (p * RP + cr) * RS + cf;                  \
            if (AL) {                                                            \
                const int bytes = (rq[p] >= 0 && fx < D) ? 16 : 0;               \
                const TX* src = bytes ? X + (size_t)rq[p] * D + fx : X;          \
                tc_cp_async16_via<true>(tc_smem_addr(dst), src, bytes);          \
            } else {                                                             \
                const unsigned short* xs = reinterpret_cast<const unsigned short*>(X) + (size_t)max(rq[p], 0) * D; \
                unsigned w[4];                                                   \
                _Pragma("unroll") for (int e = 0; e < 4; ++e) {                  \
                    const unsigned a = (rq[p] >= 0 && fx + 2 * e < D) ? __ldg(xs + fx + 2 * e) : 0u; \
                    const unsigned b = (rq[p] >= 0 && fx + 2 * e + 1 < D) ? __ldg(xs + fx + 2 * e + 1) : 0u; \
                    w[e] = a | (b << 16);                                        \
                }                                                                \
                *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]); \
            }                                                                    \
        }                                                                        \
        tc_cp_commit();                                                          \
    }
#pragma unroll
    for (int s0 = 0; s0 < NS - 1; ++s0) {
        TC_H_ROWS(s0)
        TC_H_ISSUE(s0)
    }
    TC_H_ROWS(NS - 1)
    // Metadata of blocks t >> 1 and 2 + (t >> 1) of each k16 chunk of a step.
#define TC_H_META(m, step)                                                       \
    _Pragma("unroll") for (int k = 0; k < KS; ++k)                               \
        _Pragma("unroll") for (int h = 0; h < 2; ++h) {                          \
            const int bi = u.y + (step) * U + 4 * k + 2 * h + (t >> 1);          \
            m[k][h] = bi < u.z ? meta[bi] : make_uint2(0u, 0u);                  \
        }
#define TC_H_VALUES(m, hi, lo)                                                   \
    _Pragma("unroll") for (int k = 0; k < KS; ++k)                               \
        _Pragma("unroll") for (int h = 0; h < 2; ++h) tc_half_b<SPLIT>(values, m[k][h], p0, hi[k][h], lo[k][h]);
    uint2 mc[KS][2];  // PV: the next step's metadata; else this step's
    unsigned ph[KS][2], pl[KS][2];  // PV: this step's B registers, loaded one step ahead
    TC_H_META(mc, 0)
    if (PV) {
        TC_H_VALUES(mc, ph, pl)
        TC_H_META(mc, 1)
    }
    for (int step = 0; step < n_steps; ++step) {  // warp-uniform: mma.sync needs all lanes
        TC_H_ISSUE(step + NS - 1)
        TC_H_ROWS(step + NS)
        unsigned bh[KS][2], bl[KS][2];
        uint2 mn[KS][2];
        if (PV) {
#pragma unroll
            for (int k = 0; k < KS; ++k)
#pragma unroll
                for (int h = 0; h < 2; ++h) bh[k][h] = ph[k][h], bl[k][h] = pl[k][h];
            TC_H_VALUES(mc, ph, pl)  // next step's values
            TC_H_META(mn, step + 2)
        } else {
            TC_H_VALUES(mc, bh, bl)
            TC_H_META(mn, step + 1)
        }
        tc_cp_wait<NS - 1>();  // this lane's copies of this step have landed
        __syncwarp();          // ... and every other lane's
        const unsigned st = stages_addr + 2u * (unsigned)((step % NS) * STAGE);
#pragma unroll
        for (int k = 0; k < KS; ++k)
#pragma unroll
            for (int j = 0; j < 2 * FS; ++j) {
                unsigned a[4];
                tc_ldsm_x4_trans(a, st + 2u * (unsigned)((16 * k + lm_row) * RS + 16 * j + lm_col));
                tc_mma16<TX>::run(acc[j], a, bh[k][0], bh[k][1]);
                if (SPLIT) tc_mma16<TX>::run(acc[j], a, bl[k][0], bl[k][1]);
            }
#pragma unroll
        for (int k = 0; k < KS; ++k)
#pragma unroll
            for (int h = 0; h < 2; ++h) mc[k][h] = mn[k][h];
        __syncwarp();  // the stage is refilled in the next step
    }
#undef TC_H_ROWS
#undef TC_H_ISSUE
#undef TC_H_META
#undef TC_H_VALUES
    tc_cp_wait<0>();
    __syncwarp();

    // acc[j] = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}: feature 16 j + g (+8), window row 2t (+1).
    float* tile = reinterpret_cast<float*>(stages);
    const float unscale = __ldg(unscale_p);
#pragma unroll
    for (int j = 0; j < 2 * FS; ++j) {
        tile[(2 * t) * TS + 16 * j + g] = acc[j][0] * unscale;
        tile[(2 * t + 1) * TS + 16 * j + g] = acc[j][1] * unscale;
        tile[(2 * t) * TS + 16 * j + g + 8] = acc[j][2] * unscale;
        tile[(2 * t + 1) * TS + 16 * j + g + 8] = acc[j][3] * unscale;
    }
    if (COOP) {
        tc_vec_coop_sum<FS, true>(reinterpret_cast<const float*>(tc_smem), NS * STAGE / 2, u.x, Y, M, D, base);
        return;
    }
    __syncwarp();
    const long long row0 = (long long)u.x * 8;
    for (int i = lane; i < 8 * 8 * FS; i += 32) {
        const int rr = i / (8 * FS), c = base + 4 * (i - rr * 8 * FS);
        const float4 v = *reinterpret_cast<const float4*>(tile + rr * TS + (c - base));
        if (u.w < 0) {
            if (row0 + rr < M) tc_put4<AL>(Y + (size_t)(row0 + rr) * D, c, D, v);
        } else {
            tc_store4<AL>(partial + ((size_t)u.w * 8 + rr) * D, c, D, v);
        }
    }
    // A float32 Y with aligned rows (AL: D % 8 == 0, 16-byte rows) takes the float4 sum: same order, 4 outputs a lane.
    if (COMBINE && u.w >= 0)
        tc_vec_combine<32 * FS, TY, AL && sizeof(TY) == 4>(u, unit, slice, lane, unit_k0, Y, partial, counters, M, D,
                                                          n_slices);
}
"""

SOURCE = COMMON_SOURCE + FIXUP_SOURCE + VEC_COMMON_SOURCE + PUT4_SOURCE + _HALF
#: Every compiled variant: each X / matrix / result type combination's shapes, COOP shapes, the fixups.
NAMES = tuple(_names())
register("half", SOURCE, NAMES)
