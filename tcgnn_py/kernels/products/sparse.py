"""Layer 1: the ``"sparse"`` family: SpMM on the N:M layouts through sparse tensor cores (``mma.sp``).

2:4 with float16 / bfloat16 X, 1:2 with TF32 (float32 X); compressed blocks and their metadata in
fragment order (:mod:`tcgnn_py.products.families.sparse`).
"""

import dataclasses
from typing import ClassVar

from ..registry import register
from .common import COMMON_SOURCE, FIXUP_SOURCE, PUT4_SOURCE, VEC_COMMON_SOURCE, KernelConfig, cuda_type, fixup_name

__all__ = ["SpmmSp", "SP_NT", "SP_TYPES", "SP_SPMM_CONFIGS", "sp_spmm_config"]

#: N-tiles of 8 features per warp of the N:M SpMM (32 features).
SP_NT = 4
#: X type of the N:M SpMM -> its layout: 16-bit X on "2:4", float32 (TF32) on "1:2".
SP_TYPES = {"float16": "2:4", "bfloat16": "2:4", "float32": "1:2"}


@dataclasses.dataclass(frozen=True)
class SpmmSp(KernelConfig):
    """``tcgnn_spmm_sp<TX, SPLIT, TY, NT, AL, COMBINE, UB>``: NT n-tiles per warp, UB blocks per step."""

    KERNEL: ClassVar[str] = "tcgnn_spmm_sp"
    TX: str
    SPLIT: bool
    TY: str
    NT: int
    AL: bool
    COMBINE: bool = True
    UB: int = 2


def sp_spmm_config(x_type, split, y_type, aligned):
    """The N:M SpMM for X of ``x_type`` and a result of ``y_type``: :data:`SP_NT` n-tiles per warp, 4 blocks per
    step for TF32 and 2 for 16-bit X (whose blocks hold twice the columns), split windows summed by the fixup."""
    return SpmmSp(cuda_type(x_type), split, cuda_type(y_type), SP_NT, aligned, False, 4 if x_type == "float32" else 2)


def _configs():
    out = []
    for x in SP_TYPES:
        for split in ((False,) if x == "float32" else (True, False)):
            out += [sp_spmm_config(x, split, y, al) for y in dict.fromkeys(("float32", x)) for al in (True, False)]
    return tuple(out)


#: Every SpMM config compiled: each type combination and row alignment, one shape each.
SP_SPMM_CONFIGS = _configs()


_SPARSE = r"""
// ---------------------------------------------------------------------------
// Sparse tensor cores (mma.sp) on the N:M layouts: 16-row windows whose condensed
// column slots are grouped so that each row holds <= N entries in every M consecutive
// slots ("2:4": 16-slot blocks, f16/bf16 m16n8k16; "1:2": 8-slot blocks, TF32
// m16n8k8).  A block is the sparse A operand (16 rows x K slots), stored compressed
// (N of every M values) with its metadata; B is K gathered X rows x 8 features:
//   Y[window rows] (16 x 8 n) += A_block (16 x K) @ X[block cols] (K x 8 n).
// Fragments (PTX ISA; checked on the H200 with every sparsity selector), lane (g, t):
//   compressed A: a0 = Ac[g][2t, 2t+1] (16-bit) or Ac[g][t] (TF32); a1 = the same of row g + 8.
//   metadata (selector 0: lane (g, 0) supplies it): bits 4q .. 4q+3 hold row g's group q
//   (two 2-bit positions, ascending: ::ordered_metadata), bits 16 + 4q .. row g + 8's.
//   B: 16-bit b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; TF32 b0 = B[t][g], b1 = B[t+4][g].
// Features are permuted so that X loads and Y stores are vectors: n-tile j's column n is
// feature base + NT n + j.  Lane (g, t) loads features base + NT g .. + NT of its k rows and
// owns the outputs base + 2 NT t .. + 2 NT of rows g and g + 8: no shared memory, no barriers.
// One warp per (unit, feature slice of 8 NT); units (window, first block, end block, slot):
// a split window writes partial rows (slot >= 0), summed by tcgnn_spmm_fixup in unit order.
template <typename TX> struct tc_mmasp;
template <> struct tc_mmasp<tc_f16> {
    static __device__ __forceinline__ void run(float (&d)[4], uint2 a, unsigned b0, unsigned b1, unsigned m) {
        asm("mma.sp::ordered_metadata.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5}, {%6, %7}, {%0, %1, %2, %3}, %8, 0;"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a.x), "r"(a.y), "r"(b0), "r"(b1), "r"(m));
    }
};
template <> struct tc_mmasp<tc_bf16> {
    static __device__ __forceinline__ void run(float (&d)[4], uint2 a, unsigned b0, unsigned b1, unsigned m) {
        asm("mma.sp::ordered_metadata.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5}, {%6, %7}, {%0, %1, %2, %3}, %8, 0;"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a.x), "r"(a.y), "r"(b0), "r"(b1), "r"(m));
    }
};
template <> struct tc_mmasp<float> {
    static __device__ __forceinline__ void run(float (&d)[4], uint2 a, unsigned b0, unsigned b1, unsigned m) {
        asm("mma.sp::ordered_metadata.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
            "{%0, %1, %2, %3}, {%4, %5}, {%6, %7}, {%0, %1, %2, %3}, %8, 0;"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a.x), "r"(a.y), "r"(b0), "r"(b1), "r"(m));
    }
};

// NT consecutive X elements X[c][f0 .. f0 + NT) as 32-bit words (zeros for a padding slot
// c < 0 and past D).  AL: whole vectors (D % 8 == 0 and 16-byte aligned rows).
template <typename TX, int NT, bool AL>
__device__ __forceinline__ void tc_sp_row(const TX* __restrict__ X, int c, int f0, int D,
                                          unsigned (&w)[NT * sizeof(TX) / 4]) {
    constexpr int NW = NT * sizeof(TX) / 4;
#pragma unroll
    for (int i = 0; i < NW; ++i) w[i] = 0u;
    if (c < 0) return;
    if (AL) {
        if (f0 >= D) return;
        const uint4* p = reinterpret_cast<const uint4*>(X + (size_t)c * D + f0);
        if constexpr (NW == 2) {
            const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
            w[0] = v.x, w[1] = v.y;
        } else {
#pragma unroll
            for (int i = 0; i < NW / 4; ++i) {
                const uint4 v = __ldg(p + i);
                w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
            }
        }
    } else if constexpr (sizeof(TX) == 4) {
        const unsigned* p = reinterpret_cast<const unsigned*>(X) + (size_t)c * D;
#pragma unroll
        for (int i = 0; i < NT; ++i) w[i] = f0 + i < D ? __ldg(p + f0 + i) : 0u;
    } else {
        const unsigned short* p = reinterpret_cast<const unsigned short*>(X) + (size_t)c * D;
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            const unsigned h = f0 + i < D ? __ldg(p + f0 + i) : 0u;
            w[i / 2] |= h << (16 * (i & 1));
        }
    }
}

// Columns of this lane's k rows, metadata word and compressed values of blocks b0 .. b0 + UB - 1
// (blocks from `end` on: padding columns, zero values, valid metadata).
template <bool SPLIT, int W, int KR, int UB>
__device__ __forceinline__ void tc_sp_blocks(const int* __restrict__ block_cols, const unsigned* __restrict__ meta,
                                             const void* __restrict__ avals, int b0, int end, const int (&kr)[KR],
                                             int g, int lane, int (&c)[UB][KR], unsigned (&m)[UB], uint4 (&a)[UB]) {
#pragma unroll
    for (int s = 0; s < UB; ++s) {
        const int b = b0 + s;
        const bool in = b < end;
#pragma unroll
        for (int k = 0; k < KR; ++k) c[s][k] = in ? __ldg(block_cols + (size_t)b * W + kr[k]) : -1;
        m[s] = in ? __ldg(meta + (size_t)b * 8 + g) : 0x44444444u;
        if (SPLIT) {
            a[s] = in ? __ldg(static_cast<const uint4*>(avals) + (size_t)b * 32 + lane) : make_uint4(0u, 0u, 0u, 0u);
        } else {
            const uint2 v = in ? __ldg(static_cast<const uint2*>(avals) + (size_t)b * 32 + lane) : make_uint2(0u, 0u);
            a[s] = make_uint4(v.x, v.y, 0u, 0u);
        }
    }
}

// SPLIT (16-bit X, float32 matrix): the values come as (hi, lo) pairs of TX, two MMAs each
// (as tcgnn_spmm_vech); avals holds per block and lane uint4 (hi regs, lo regs), else uint2.
// UB blocks per step: their column, value and X loads are all issued before the MMAs.
// COMBINE: a split window's last part sums its partial rows in the launch (tc_vec_combine).
template <typename TX, bool SPLIT, typename TY, int NT, bool AL, bool COMBINE, int UB = 2>
__global__ void __launch_bounds__(128)
tcgnn_spmm_sp(const int4* __restrict__ units, const int2* __restrict__ unit_k0, const int* __restrict__ block_cols,
              const unsigned* __restrict__ meta, const void* __restrict__ avals, const TX* __restrict__ X,
              TY* __restrict__ Y, float* __restrict__ partial, int* __restrict__ counters, int M, int D,
              int n_slices, int n_work, const float* __restrict__ unscale_p) {
    constexpr bool TF = sizeof(TX) == 4;  // TF32: 8-slot blocks, one k row pair per lane
    constexpr int W = TF ? 8 : 16;
    constexpr int KR = TF ? 2 : 4;        // X rows per lane and block
    constexpr int NW = NT * sizeof(TX) / 4;
    const int lane = threadIdx.x & 31;
    const int work = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (work >= n_work) return;  // whole warp
    const int g = lane >> 2, t = lane & 3;
    const int unit = work / n_slices, slice = work - unit * n_slices;
    const int base = slice * 8 * NT;
    const int4 u = units[unit];
    const int f0 = base + NT * g;
    // This lane's k rows within a block.
    int kr[KR];
    if constexpr (TF) {
        kr[0] = t, kr[1] = t + 4;
    } else {
        kr[0] = 2 * t, kr[1] = 2 * t + 1, kr[2] = 2 * t + 8, kr[3] = 2 * t + 9;  // discarded for TF32
    }

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[j][q] = 0.f;

    // A step's block data (columns, metadata, compressed values) is loaded one step ahead, so the
    // step's X loads issue at once instead of waiting for its columns (two dependent round trips).
    int c[UB][KR];
    unsigned m[UB];
    uint4 a[UB];
    tc_sp_blocks<SPLIT, W, KR, UB>(block_cols, meta, avals, u.y, u.z, kr, g, lane, c, m, a);
    for (int b0 = u.y; b0 < u.z; b0 += UB) {
        unsigned w[UB][KR][NW];
#pragma unroll
        for (int s = 0; s < UB; ++s)
#pragma unroll
            for (int k = 0; k < KR; ++k) tc_sp_row<TX, NT, AL>(X, c[s][k], f0, D, w[s][k]);
        int cn[UB][KR];
        unsigned mn[UB];
        uint4 an[UB];
        tc_sp_blocks<SPLIT, W, KR, UB>(block_cols, meta, avals, b0 + UB, u.z, kr, g, lane, cn, mn, an);
#pragma unroll
        for (int s = 0; s < UB; ++s) {
            if constexpr (TF) {
                const uint2 av = make_uint2(tc_tf32(__uint_as_float(a[s].x)), tc_tf32(__uint_as_float(a[s].y)));
#pragma unroll
                for (int j = 0; j < NT; ++j)
                    tc_mmasp<TX>::run(acc[j], av, tc_tf32(__uint_as_float(w[s][0][j])),
                                      tc_tf32(__uint_as_float(w[s][1][j])), m[s]);
            } else {
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const unsigned sel = (j & 1) ? 0x7632u : 0x5410u;  // (row lo, row hi) halves of feature j
                    const unsigned bb0 = __byte_perm(w[s][0][j >> 1], w[s][1][j >> 1], sel);
                    const unsigned bb1 = __byte_perm(w[s][2][j >> 1], w[s][3][j >> 1], sel);
                    tc_mmasp<TX>::run(acc[j], make_uint2(a[s].x, a[s].y), bb0, bb1, m[s]);
                    if (SPLIT) tc_mmasp<TX>::run(acc[j], make_uint2(a[s].z, a[s].w), bb0, bb1, m[s]);
                }
            }
        }
#pragma unroll
        for (int s = 0; s < UB; ++s) {
            m[s] = mn[s], a[s] = an[s];
#pragma unroll
            for (int k = 0; k < KR; ++k) c[s][k] = cn[s][k];
        }
    }

    // acc[j] = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]} of n-tile j: row g (+8), features
    // base + NT (2t) + j and base + NT (2t + 1) + j.
    const float unscale = SPLIT ? __ldg(unscale_p) : 1.f;
    const int c0 = base + 2 * NT * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const long long row = (long long)u.x * 16 + g + 8 * h;
        float v[2 * NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) v[j] = acc[j][2 * h] * unscale, v[NT + j] = acc[j][2 * h + 1] * unscale;
#pragma unroll
        for (int i = 0; i < 2 * NT; i += 4) {
            const float4 q = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
            if (u.w < 0) {
                if (row < M) tc_put4<AL>(Y + (size_t)row * D, c0 + i, D, q);
            } else {
                tc_store4<AL>(partial + ((size_t)u.w * 16 + g + 8 * h) * D, c0 + i, D, q);
            }
        }
    }
    if (COMBINE && u.w >= 0)
        tc_vec_combine<8 * NT, TY, AL && sizeof(TY) == 4, 16>(u, unit, slice, lane, unit_k0, Y, partial, counters, M,
                                                               D, n_slices);
}
"""

SOURCE = COMMON_SOURCE + FIXUP_SOURCE + VEC_COMMON_SOURCE + PUT4_SOURCE + _SPARSE
#: Every compiled variant: the SpMM configs and the fixups into each result type.
NAMES = tuple([c.name for c in SP_SPMM_CONFIGS] + [fixup_name("float32", y) for y in ("float32", "float16", "bfloat16")])
register("sparse", SOURCE, NAMES)
