"""Layer 1: CuPy RawModule kernels for products over the tiled format.

Kernel families, each one RawModule (CUDA C++ kept here as strings),
compiled through :mod:`tcgnn_py.kernels.registry`, with name expressions
generated from one table of supported template arguments:

``"tf32"``
    Tensor-core SpMM and SDDMM for float32 data on ``16 x 8`` tiles: operands
    rounded to TF32, products accumulated in float32, through inline PTX
    ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``.
``"vec"``
    Tensor-core SpMM and SDDMM for float32 data on the vector layout (8-row
    windows, ``8 x 4`` blocks of condensed column vectors), operands swapped:
    X is the MMA's A operand.  One warp per (balanced unit, feature slice); split
    windows are summed inside the launch (``tcgnn_spmm_vec*``, COMBINE).
``"half"``
    float16 / bfloat16 SpMM on the vector layout (``mma.m16n8k16`` with float32
    accumulation, X staged by cp.async and read back with ``ldmatrix.trans``),
    for float32 matrices (values as two 16-bit parts) and 16-bit ones.
``"sparse"``
    SpMM on the N:M layouts through sparse tensor cores (``mma.sp``): 2:4 with
    float16 / bfloat16 X, 1:2 with TF32 (float32 X); compressed blocks and
    their metadata in fragment order (:mod:`tcgnn_py._sparse_tc`).
``"core"``
    CUDA-core SpMM and SDDMM in the data's own precision (float or double),
    for any tile shape: ``precision="fp32"`` and every float64 product.

No ``#include``: NVRTC on a pip-only install has no ``crt/mma.h``, and inline
PTX needs no header.  CI compiles every source for sm_80 and sm_90 through
NVRTC directly (``tests/test_nvrtc.py``).

Work decomposition (16x8 SpMM): the host builds *units* -- ``int4`` rows
``(window, first block, end block, partial slot)``.  A CTA takes one unit and
its warps stride over the unit's blocks; warps meet in shared memory and the
CTA writes the window's rows once, or, when a long (hub) window is split over
several units, a partial tile; the CTA that stores a window's slab last sums
the window's partial tiles in unit order (``tc_cta_combine``; without counters,
:func:`tcgnn_spmm_fixup` does it in a second launch, in the same order).
Every output element is written by exactly one thread and the summation order
is fixed, so results are deterministic run to run.
"""

from .registry import VALUE_TYPES, register

__all__ = [
    "FAMILIES",
    "TF32_CHUNKS",
    "CORE_HEIGHTS",
    "TILE_POS_TYPES",
    "SPMM_MAX_THREADS",
    "SPMM_SMEM_LIMIT",
    "tf32_spmm_smem",
    "core_spmm_smem",
    "FIXUP_THREADS",
    "SDDMM_WARPS",
    "SDDMM_TF32_SMEM_PER_WARP",
    "spmm_tf32_name",
    "spmm_tf32_async_name",
    "tf32_async_smem",
    "TF32_ASYNC",
    "sddmm_tf32_name",
    "spmm_core_name",
    "sddmm_core_name",
    "fixup_name",
    "VEC_SLICES",
    "VEC_UNROLL",
    "VEC_WARPS",
    "VEC_SDDMM_BLOCKS",
    "spmm_vec_name",
    "VEC_ASYNC",
    "VEC_ASYNC_L1",
    "VEC_COOP",
    "VEC_HALF_COOP",
    "spmm_vec_async_name",
    "vec_async_smem",
    "sddmm_vec_name",
    "HALF_TYPES",
    "VEC_HALF",
    "HALF_DEFAULT",
    "spmm_vech_name",
    "vech_smem",
    "SP_NT",
    "SP_UNROLL",
    "SP_TYPES",
    "spmm_sp_name",
]

#: Column chunks of 32 per CTA in the TF32 SpMM (a CTA covers ``32 * CH`` columns).
TF32_CHUNKS = (1, 2, 4)
#: Window heights the CUDA-core SpMM is instantiated for (accumulators live in registers).
CORE_HEIGHTS = (1, 2, 4, 8, 16, 32)
#: ``tile_pos`` element types: uint8, or uint16 when ``H * W > 256``.
TILE_POS_TYPES = {"uint8": "tc_u8", "uint16": "tc_u16"}

# Launch geometry the sources below assume; the launchers in ``_ops`` import it from here.
#: ``__launch_bounds__`` of the SpMM kernels: at most 8 warps per CTA.
SPMM_MAX_THREADS = 256
#: Dynamic shared memory available without an opt-in attribute.
SPMM_SMEM_LIMIT = 48 * 1024
#: Threads per CTA of ``tcgnn_spmm_fixup`` (any multiple of 32 works).
FIXUP_THREADS = 256
#: Warps per CTA of both SDDMM kernels (``__launch_bounds__(128)``).
SDDMM_WARPS = 4
#: Shared memory of ``tcgnn_sddmm_tf32`` per warp: one 16x8 float tile.
SDDMM_TF32_SMEM_PER_WARP = 16 * 8 * 4


def tf32_spmm_smem(nwarps, chunks):
    """Bytes of ``tcgnn_spmm_tf32``'s cross-warp sum: per warp ``CH * 4 * 32`` float4."""
    return nwarps * chunks * 4 * 32 * 16


def core_spmm_smem(nwarps, height, itemsize):
    """Bytes of ``tcgnn_spmm_core``'s cross-warp sum: per warp ``H * 32`` values."""
    return nwarps * height * 32 * itemsize

_COMMON = r"""
typedef unsigned char tc_u8;
typedef unsigned short tc_u16;
#define TC_FULL 0xffffffffu

// Round to TF32 with round-to-nearest (ties away).  Handing raw float bits to
// the MMA would truncate the 13 low mantissa bits instead: twice the error.
__device__ __forceinline__ unsigned tc_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// An MMA operand: rounded to TF32, or the raw float bits (the tensor core then truncates).
__device__ __forceinline__ unsigned tc_x(float x, bool round) { return round ? tc_tf32(x) : __float_as_uint(x); }

// 16-bit floats, stored as their bits (no cuda_fp16.h: NVRTC on a pip-only install
// may lack it).  Distinct types so that templates tell float16 from bfloat16.
struct tc_f16 { unsigned short x; };
struct tc_bf16 { unsigned short x; };

__device__ __forceinline__ float tc_f32_of(tc_f16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.x));
    return f;
}
__device__ __forceinline__ float tc_f32_of(tc_bf16 h) { return __uint_as_float((unsigned)h.x << 16); }
__device__ __forceinline__ float tc_f32_of(float v) { return v; }

// Stores with one rounding (round to nearest even) from the float32 accumulator.
__device__ __forceinline__ void tc_put(float* p, float v) { *p = v; }
__device__ __forceinline__ void tc_put(double* p, double v) { *p = v; }
__device__ __forceinline__ unsigned short tc_bits(tc_f16*, float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
__device__ __forceinline__ unsigned short tc_bits(tc_bf16*, float v) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
__device__ __forceinline__ void tc_put(tc_f16* p, float v) { p->x = tc_bits(p, v); }
__device__ __forceinline__ void tc_put(tc_bf16* p, float v) { p->x = tc_bits(p, v); }

// D += A * B on a 16x8x8 tile.  Fragment layout (PTX ISA, mma.m16n8k8 .tf32),
// with g = lane / 4 and t = lane % 4:
//   A (16x8, row): a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4]
//   B (8x8, col):  b0 = B[t][g], b1 = B[t+4][g]
//   C (16x8):      c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// Not volatile: the compiler may schedule the MMAs around the loads.
__device__ __forceinline__ void tc_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four consecutive elements X[row][col .. col+3], zero outside the matrix
// (row < 0 is a padding slot of block_cols).  VEC: one 16-byte load, which
// needs D % 4 == 0 and col % 4 == 0 (then col < D implies col + 3 < D).
template <bool VEC>
__device__ __forceinline__ float4 tc_load4(const float* __restrict__ X, int row, int col, int D) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row < 0) return v;
    const float* p = X + (size_t)row * D + col;
    if (VEC) {
        if (col < D) v = __ldg(reinterpret_cast<const float4*>(p));
    } else {
        if (col < D) v.x = __ldg(p);
        if (col + 1 < D) v.y = __ldg(p + 1);
        if (col + 2 < D) v.z = __ldg(p + 2);
        if (col + 3 < D) v.w = __ldg(p + 3);
    }
    return v;
}

template <bool VEC>
__device__ __forceinline__ void tc_store4(float* __restrict__ p, int col, int D, float4 v) {
    if (VEC) {
        if (col < D) *reinterpret_cast<float4*>(p + col) = v;
    } else {
        if (col < D) p[col] = v.x;
        if (col + 1 < D) p[col + 1] = v.y;
        if (col + 2 < D) p[col + 2] = v.z;
        if (col + 3 < D) p[col + 3] = v.w;
    }
}

__device__ __forceinline__ float4 tc_add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// acc (16x8) += P[rows lo, hi] @ Q[row q]^T over D features: A operand rows
// m = g (row lo) and m = g + 8 (row hi), B operand column n = g (row q).  K is
// permuted identically for both operands: VEC lanes load P[.][4t .. 4t+3] and
// Q[q][4t .. 4t+3] as float4 (elements 0-1 feed the first MMA's k = t and t+4,
// elements 2-3 the second's); otherwise k = t, t + 4 of each 8 features.  Rows
// < 0 and features >= D read zeros.  Both SDDMM kernels use it.
template <bool VEC>
__device__ __forceinline__ void tc_rows_dot(float (&acc)[4], const float* __restrict__ P, int lo, int hi,
                                            const float* __restrict__ Q, int q, int D, int t) {
    if (VEC) {
        for (int d0 = 0; d0 < D; d0 += 16) {  // warp-uniform trip count
            const int col = d0 + 4 * t;
            const float4 pl = tc_load4<true>(P, lo, col, D);
            const float4 ph = tc_load4<true>(P, hi, col, D);
            const float4 qq = tc_load4<true>(Q, q, col, D);
            const unsigned a0[4] = {tc_tf32(pl.x), tc_tf32(ph.x), tc_tf32(pl.y), tc_tf32(ph.y)};
            tc_mma(acc, a0, tc_tf32(qq.x), tc_tf32(qq.y));
            const unsigned a1[4] = {tc_tf32(pl.z), tc_tf32(ph.z), tc_tf32(pl.w), tc_tf32(ph.w)};
            tc_mma(acc, a1, tc_tf32(qq.z), tc_tf32(qq.w));
        }
    } else {
        for (int d0 = 0; d0 < D; d0 += 8) {
            const int k0 = d0 + t, k1 = d0 + t + 4;
            const bool in0 = k0 < D, in1 = k1 < D;
            const float l0 = (lo >= 0 && in0) ? __ldg(P + (size_t)lo * D + k0) : 0.f;
            const float h0 = (hi >= 0 && in0) ? __ldg(P + (size_t)hi * D + k0) : 0.f;
            const float l1 = (lo >= 0 && in1) ? __ldg(P + (size_t)lo * D + k1) : 0.f;
            const float h1 = (hi >= 0 && in1) ? __ldg(P + (size_t)hi * D + k1) : 0.f;
            const float q0 = (q >= 0 && in0) ? __ldg(Q + (size_t)q * D + k0) : 0.f;
            const float q1 = (q >= 0 && in1) ? __ldg(Q + (size_t)q * D + k1) : 0.f;
            const unsigned a[4] = {tc_tf32(l0), tc_tf32(h0), tc_tf32(l1), tc_tf32(h1)};
            tc_mma(acc, a, tc_tf32(q0), tc_tf32(q1));
        }
    }
}

// Window of block b, starting from a window w at or before it (win_ptr is
// non-decreasing; empty windows are skipped).
__device__ __forceinline__ int tc_advance_window(const int* __restrict__ win_ptr, int w, int b) {
    while (win_ptr[w + 1] <= b) ++w;
    return w;
}

// Last window whose first block is <= b (binary search; b < n_blocks).
__device__ __forceinline__ int tc_find_window(const int* __restrict__ win_ptr, int n_windows, int b) {
    int lo = 0, hi = n_windows;  // invariant: win_ptr[lo] <= b < win_ptr[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (win_ptr[mid] <= b) lo = mid; else hi = mid;
    }
    return tc_advance_window(win_ptr, lo, b);
}

// cp.async helpers (sm_80+).
__device__ __forceinline__ unsigned tc_smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes global -> shared; src_bytes == 0 writes zeros without reading.
__device__ __forceinline__ void tc_cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// The same, through L1 when L1 (.ca, else .cg): an X row gathered again by a warp of the same SM then hits in
// L1 and not L2.  The 16-bit SpMM always does (a win on every graph measured); the TF32 vector SpMM only
// where the timed choice finds it faster (its staged rows leave less L1).
template <bool L1>
__device__ __forceinline__ void tc_cp_async16_via(unsigned dst, const void* src, int src_bytes) {
    if (L1)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
    else
        tc_cp_async16(dst, src, src_bytes);
}

__device__ __forceinline__ void tc_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void tc_cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Sum the partial tiles of each split window, in unit order (deterministic).
// splits[i] = (window, first partial slot, number of slots, unused).
template <typename T, typename TY = T>
__global__ void tcgnn_spmm_fixup(const int4* __restrict__ splits, const T* __restrict__ partial,
                                 TY* __restrict__ Y, int M, int D, int H) {
    const int4 s = splits[blockIdx.x];
    const long long n = (long long)H * D;
    for (long long i = (long long)blockIdx.y * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.y * blockDim.x) {
        const int r = (int)(i / D), col = (int)(i % D);
        const long long row = (long long)s.x * H + r;
        if (row >= M) break;  // rows only grow with i
        // Eight loads in flight (a hub window has up to 1024 parts), summed in part order.
        const T* p = partial + ((size_t)s.y * H + r) * D + col;
        const size_t step = (size_t)H * D;
        T acc = T(0);
        int k = 0;
        for (; k + 8 <= s.z; k += 8) {
            T v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = __ldcg(p + (size_t)(k + j) * step);
#pragma unroll
            for (int j = 0; j < 8; ++j) acc += v[j];
        }
        for (; k < s.z; ++k) acc += __ldcg(p + (size_t)k * step);
        tc_put(Y + (size_t)row * D + col, acc);
    }
}

// The in-launch sum of a split window (the fixup's work, by the part that finished
// last): rows row0 .. row0 + H - 1, features base .. base + width - 1 of Y are the
// sums of the window's `parts` partial tiles (H rows of D floats each, from slot
// `first`) in part order, 8 loads in flight.  Threads tid, tid + nthreads, ... .
template <int WID, typename TY>
__device__ __forceinline__ void tc_sum_parts(const float* __restrict__ partial, int first, int parts, int H,
                                             long long row0, int base, int width, int M, int D,
                                             TY* __restrict__ Y, int tid, int nthreads) {
    for (int i = tid; i < H * WID; i += nthreads) {
        const int rr = i / WID, cc = i - rr * WID;
        if (cc >= width || row0 + rr >= M) continue;
        const float* p = partial + ((size_t)first * H + rr) * D + base + cc;
        float sum = 0.f;
        for (int k = 0; k < parts; k += 8) {
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = k + j < parts ? __ldcg(p + (size_t)(k + j) * H * D) : 0.f;
#pragma unroll
            for (int j = 0; j < 8; ++j) sum += v[j];
        }
        tc_put(Y + (size_t)(row0 + rr) * D + base + cc, sum);
    }
}

// tc_sum_parts on float4 (rows of D % 4 == 0 floats, 16-byte aligned Y, base % 4 == 0): each thread keeps
// two float4 outputs x four parts = eight 16-byte loads in flight, a quarter of the scalar form's round
// trips; the same sums in the same order.
template <int WID>
__device__ __forceinline__ void tc_sum_parts4(const float* __restrict__ partial, int first, int parts, int H,
                                              long long row0, int base, int width, int M, int D,
                                              float* __restrict__ Y, int tid, int nthreads) {
    constexpr int Q = WID / 4;  // float4 per row of the tile
    const size_t step = (size_t)H * D / 4;  // float4 from one part's tile to the next
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int i0 = tid; i0 < H * Q; i0 += 2 * nthreads) {
        const float4* p[2];
        bool ok[2];
        long long row[2];
        int cc[2];
        float4 s[2];
#pragma unroll
        for (int o = 0; o < 2; ++o) {
            const int i = i0 + o * nthreads, rr = i / Q;
            cc[o] = 4 * (i - rr * Q);
            row[o] = row0 + rr;
            ok[o] = i < H * Q && cc[o] < width && row[o] < M;
            p[o] = reinterpret_cast<const float4*>(partial + ((size_t)first * H + rr) * D + base + cc[o]);
            s[o] = zero;
        }
        for (int k = 0; k < parts; k += 4) {
            float4 v[2][4];
#pragma unroll
            for (int o = 0; o < 2; ++o)
#pragma unroll
                for (int j = 0; j < 4; ++j) v[o][j] = ok[o] && k + j < parts ? __ldcg(p[o] + (size_t)(k + j) * step) : zero;
#pragma unroll
            for (int o = 0; o < 2; ++o)
#pragma unroll
                for (int j = 0; j < 4; ++j) s[o] = tc_add4(s[o], v[o][j]);
        }
#pragma unroll
        for (int o = 0; o < 2; ++o)
            if (ok[o]) *reinterpret_cast<float4*>(Y + (size_t)row[o] * D + base + cc[o]) = s[o];
    }
}
"""

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

_CORE = r"""
// ---------------------------------------------------------------------------
// CUDA-core SpMM in the data's precision, any tile shape (H rows, W slots).
// Lane = one output column (32 per CTA column), H accumulators per lane.  The
// warp walks its blocks' stored entries only -- never the tile's zeros -- so it
// follows scipy exactly, NaN/Inf of X included.  Entries are read 32 at a
// time (coalesced) and broadcast with shuffles.
template <typename T, int H, typename P>
__global__ void __launch_bounds__(256)
tcgnn_spmm_core(const int4* __restrict__ units, const int* __restrict__ block_ptr,
                const int* __restrict__ block_cols, const P* __restrict__ tile_pos,
                const T* __restrict__ values, const T* __restrict__ X, T* __restrict__ Y,
                T* __restrict__ partial, int M, int D, int W, int wshift) {
    extern __shared__ float4 tc_smem[];  // float4: 16-byte aligned for any T
    T* red = reinterpret_cast<T*>(tc_smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int4 u = units[blockIdx.x];
    const int col = blockIdx.y * 32 + lane;
    const bool live = col < D;
    T acc[H];
#pragma unroll
    for (int i = 0; i < H; ++i) acc[i] = T(0);
    for (int b = u.y + warp; b < u.z; b += nwarps) {
        const int e1 = block_ptr[b + 1];
        for (int base = block_ptr[b]; base < e1; base += 32) {
            const int e = base + lane;
            int r = 0, c = 0;
            T v = T(0);
            if (e < e1) {
                const int p = tile_pos[e];
                r = p >> wshift;
                c = block_cols[b * W + (p & (W - 1))];
                v = values[e];
            }
            const int n = min(32, e1 - base);
            for (int j = 0; j < n; ++j) {
                const int rj = __shfl_sync(TC_FULL, r, j);
                const int cj = __shfl_sync(TC_FULL, c, j);
                const T vj = __shfl_sync(TC_FULL, v, j);
                const T x = live ? X[(size_t)cj * D + col] : T(0);
#pragma unroll
                for (int i = 0; i < H; ++i)  // registers need static indices
                    if (i == rj) acc[i] += vj * x;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < H; ++i) red[(warp * H + i) * 32 + lane] = acc[i];
    __syncthreads();
    for (int i = threadIdx.x; i < H * 32; i += blockDim.x) {
        T s = red[i];
        for (int w = 1; w < nwarps; ++w) s += red[w * H * 32 + i];
        const int r = i >> 5, cc = blockIdx.y * 32 + (i & 31);
        if (cc >= D) continue;
        if (u.w < 0) {
            const long long row = (long long)u.x * H + r;
            if (row < M) Y[(size_t)row * D + cc] = s;
        } else {
            partial[((size_t)u.w * H + r) * D + cc] = s;
        }
    }
}

// ---------------------------------------------------------------------------
// CUDA-core SDDMM in the data's precision, any tile shape: a warp per run of
// bpw blocks, one warp-wide dot product per stored entry (xor-butterfly sum:
// the same order on every run).
template <typename T, typename P>
__global__ void __launch_bounds__(128)
tcgnn_sddmm_core(const int* __restrict__ win_ptr, int n_windows, const int* __restrict__ block_ptr,
                 const int* __restrict__ block_cols, const P* __restrict__ tile_pos,
                 const T* __restrict__ values, const T* __restrict__ Xa, const T* __restrict__ Xb,
                 T* __restrict__ out, int n_blocks, int D, int H, int W, int wshift, int multiply,
                 int bpw) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long gw = (long long)blockIdx.x * (blockDim.x >> 5) + warp;
    const long long first = gw * bpw;
    if (first >= n_blocks) return;
    const int b0 = (int)first, b1 = (int)min((long long)n_blocks, first + bpw);
    int w = tc_find_window(win_ptr, n_windows, b0);
    for (int b = b0; b < b1; ++b) {
        w = tc_advance_window(win_ptr, w, b);
        const int e1 = block_ptr[b + 1];
        for (int e = block_ptr[b]; e < e1; ++e) {
            const int p = tile_pos[e];
            const size_t row = (size_t)w * H + (p >> wshift);
            const size_t cb = (size_t)block_cols[b * W + (p & (W - 1))];
            T s = T(0);
            for (int d = lane; d < D; d += 32) s += Xa[row * D + d] * Xb[cb * D + d];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(TC_FULL, s, off);
            if (lane == 0) out[e] = multiply ? s * values[e] : s;
        }
    }
}
"""

_VEC_COMMON = r"""
// The work item of one warp of the vector-layout SpMMs: unit x feature slice of WID features.
struct tc_vec_work {
    int lane, wib, g, t, unit, slice, base;
    int4 u;
};

__device__ __forceinline__ bool tc_vec_work_of(const int4* __restrict__ units, int n_slices, int n_work, int wid,
                                               tc_vec_work& w) {
    w.lane = threadIdx.x & 31;
    w.wib = threadIdx.x >> 5;
    const int work = blockIdx.x * (blockDim.x >> 5) + w.wib;
    if (work >= n_work) return false;
    w.g = w.lane >> 2;
    w.t = w.lane & 3;
    w.unit = work / n_slices;
    w.slice = work - w.unit * n_slices;
    w.u = units[w.unit];
    w.base = w.slice * wid;
    return true;
}

// COOP: a CTA of 4 warps is one window's feature slice, its warps the window's 4 parts (units
// 4 * window + warp, balanced; a part may be empty): grid = windows x slices.  Small grids, where
// parts summed through global partial tiles (a fence, a counter, a second read) make the chain.
__device__ __forceinline__ void tc_vec_coop_work_of(const int4* __restrict__ units, int n_slices, int wid,
                                                    tc_vec_work& w) {
    w.lane = threadIdx.x & 31;
    w.wib = threadIdx.x >> 5;
    w.g = w.lane >> 2;
    w.t = w.lane & 3;
    w.slice = blockIdx.x % n_slices;
    w.unit = (blockIdx.x / n_slices) * 4 + w.wib;
    w.u = units[w.unit];
    w.base = w.slice * wid;
}

// COMBINE tail of the vector-layout SpMMs: this warp has stored its part (partial
// slot u.w >= 0) of a split window's slice of WID features; count the part, and
// the window's last part sums all partial tiles (float) in unit order into Y.
// H: window rows (8; 16 for the N:M layouts).  V4: Y rows 16-byte aligned with D % 4 == 0 (the aligned float kernels): the float4 sum.
template <int WID, typename TY, bool V4 = false, int H = 8>
__device__ __forceinline__ void tc_vec_combine(int4 u, int unit, int slice, int lane,
                                               const int2* __restrict__ unit_k0, TY* __restrict__ Y,
                                               const float* __restrict__ partial, int* __restrict__ counters, int M,
                                               int D, int n_slices) {
    // Release this part's tile, count it; the window's last part sums them all.
    __threadfence();
    __syncwarp();
    const int2 k0 = unit_k0[unit];
    int* counter = counters + (size_t)k0.x * n_slices + slice;
    int last = 0;
    if (lane == 0) last = atomicAdd(counter, 1) == k0.y - 1;
    if (!__shfl_sync(TC_FULL, last, 0)) return;
    __threadfence();  // acquire: the other parts' tiles are visible (read through L2 below)
    const int base = slice * WID;
    if constexpr (V4)
        tc_sum_parts4<WID>(partial, k0.x, k0.y, H, (long long)u.x * H, base, min(WID, D - base), M, D, Y, lane, 32);
    else
        tc_sum_parts<WID>(partial, k0.x, k0.y, H, (long long)u.x * H, base, min(WID, D - base), M, D, Y, lane, 32);
    if (lane == 0) *counter = 0;  // ready for the next call on this stream
}
"""

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
tcgnn_spmm_vec(const int4* __restrict__ units, const int2* __restrict__ unit_k0, const int* __restrict__ block_cols,
               const uint2* __restrict__ meta, const float* __restrict__ values, const float* __restrict__ X,
               float* __restrict__ Y, float* __restrict__ partial, int* __restrict__ counters, int M, int D,
               int n_slices, int n_work) {
    static_assert(U % 2 == 0, "blocks go to the MMA in pairs");
    const int lane = threadIdx.x & 31;
    const int work = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (work >= n_work) return;  // whole warp
    const int g = lane >> 2, t = lane & 3;
    const int unit = work / n_slices, slice = work - unit * n_slices;
    const int4 u = units[unit];
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
// DV: values are dense, 32 per block in tile-position order (see _ops.vec_dense_values): no metadata.
// L1: the copies go through L1 (tc_cp_async16_via).
template <int FS, int U, int NS, bool COMBINE, bool RX = true, bool PV = false, bool DV = false, bool COOP = false,
          bool L1 = false>
__global__ void __launch_bounds__(128, (FS >= 2 ? 6 : 8))
tcgnn_spmm_vec_async(const int4* __restrict__ units, const int2* __restrict__ unit_k0,
                     const int* __restrict__ block_cols, const uint2* __restrict__ meta,
                     const float* __restrict__ values, const float* __restrict__ X, float* __restrict__ Y,
                     float* __restrict__ partial, int* __restrict__ counters, int M, int D, int n_slices,
                     int n_work) {
    static_assert(U % 2 == 0, "blocks go to the MMA in pairs");
    extern __shared__ float4 tc_smem[];
    constexpr int RS = 32 * FS + 8;    // floats per staged row
    constexpr int STAGE = U * 4 * RS;  // floats per stage
    tc_vec_work w;
    if (COOP)
        tc_vec_coop_work_of(units, n_slices, 32 * FS, w);  // every warp of the grid has a part
    else if (!tc_vec_work_of(units, n_slices, n_work, 32 * FS, w))
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

_PUT4 = r"""
// Four consecutive outputs at p[col .. col+3]; VEC: one 16-byte (float) or 8-byte (16-bit) store.
template <bool VEC, typename TY>
__device__ __forceinline__ void tc_put4(TY* p, int col, int D, float4 v) {
    if constexpr (sizeof(TY) == 4) {
        tc_store4<VEC>(reinterpret_cast<float*>(p), col, D, v);
    } else if (VEC) {
        if (col < D) {
            const unsigned lo = tc_bits(p, v.x) | ((unsigned)tc_bits(p, v.y) << 16);
            const unsigned hi = tc_bits(p, v.z) | ((unsigned)tc_bits(p, v.w) << 16);
            *reinterpret_cast<uint2*>(p + col) = make_uint2(lo, hi);
        }
    } else {
        if (col < D) tc_put(p + col, v.x);
        if (col + 1 < D) tc_put(p + col + 1, v.y);
        if (col + 2 < D) tc_put(p + col + 2, v.z);
        if (col + 3 < D) tc_put(p + col + 3, v.w);
    }
}

// COOP tail: the CTA's 4 warps have each put their part's 8 window rows x 32 * FS features, as float
// rows of 32 * FS + 4, at `tiles + warp * stride`; sum the 4 tiles in warp order (one fixed order:
// deterministic) into Y's rows of the window at features base .. (16-byte float / 8-byte 16-bit stores:
// D % 4 == 0, D % 8 == 0 for 16-bit).
template <int FS, bool VEC, typename TY>
__device__ __forceinline__ void tc_vec_coop_sum(const float* tiles, int stride, int window, TY* __restrict__ Y, int M,
                                                int D, int base) {
    constexpr int TS = 32 * FS + 4;
    __syncthreads();
    const long long row0 = (long long)window * 8;
    for (int q = threadIdx.x; q < 64 * FS; q += blockDim.x) {
        const int r = q / (8 * FS), c = 4 * (q - r * 8 * FS);
        float4 s = *reinterpret_cast<const float4*>(tiles + r * TS + c);
#pragma unroll
        for (int p = 1; p < 4; ++p) {
            const float4 o = *reinterpret_cast<const float4*>(tiles + p * stride + r * TS + c);
            s.x += o.x, s.y += o.y, s.z += o.z, s.w += o.w;
        }
        if (row0 + r < M) tc_put4<VEC>(Y + (size_t)(row0 + r) * D, base + c, D, s);
    }
}

"""

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
tcgnn_spmm_vech(const int4* __restrict__ units, const int2* __restrict__ unit_k0,
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
        tc_vec_coop_work_of(units, n_slices, 32 * FS, w);  // every warp of the grid has a part
    else if (!tc_vec_work_of(units, n_slices, n_work, 32 * FS, w))
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


def _b(v):
    return "true" if v else "false"


def spmm_tf32_name(chunks, vec, prefetch_values=True):
    return f"tcgnn_spmm_tf32<{chunks}, {_b(vec)}, {_b(prefetch_values)}>"


#: (chunks, stages, min CTAs per SM) of the cp.async TF32 SpMM.
TF32_ASYNC = tuple((c, ns, mb) for c in (1, 2) for ns in (2, 3, 4) for mb in (1, 3, 4))


def spmm_tf32_async_name(chunks, stages, min_blocks=1):
    return f"tcgnn_spmm_tf32_async<{chunks}, {stages}, {min_blocks}>"


def tf32_async_smem(nwarps, chunks, stages):
    """Bytes of ``tcgnn_spmm_tf32_async``: per warp ``stages`` x 8 padded rows, reused for the cross-warp sum."""
    return max(nwarps * stages * 8 * (32 * chunks + 8) * 4, tf32_spmm_smem(nwarps, chunks))


def sddmm_tf32_name(vec):
    return f"tcgnn_sddmm_tf32<{_b(vec)}>"


def spmm_core_name(value_type, height, pos_type):
    return f"tcgnn_spmm_core<{VALUE_TYPES[value_type]}, {height}, {TILE_POS_TYPES[pos_type]}>"


def sddmm_core_name(value_type, pos_type):
    return f"tcgnn_sddmm_core<{VALUE_TYPES[value_type]}, {TILE_POS_TYPES[pos_type]}>"


def fixup_name(value_type, out_type=None):
    if out_type is None or out_type == value_type:
        return f"tcgnn_spmm_fixup<{VALUE_TYPES[value_type]}>"
    return f"tcgnn_spmm_fixup<{VALUE_TYPES[value_type]}, {HALF_TYPES[out_type]}>"


#: Float4 column groups per lane (a warp covers ``32 * FS`` features) and blocks per step of the vector SpMM.
VEC_SLICES = (1, 2, 4)
VEC_UNROLL = (4, 8)
#: Warps per CTA of the vector SDDMM, and the most of the vector SpMM (``__launch_bounds__(128)``).
VEC_WARPS = 4
#: Blocks per unit of the vector SDDMM: one 16 x 8 MMA tile holds 4 blocks' columns.
VEC_SDDMM_BLOCKS = 4


def spmm_vec_name(slices, unroll, vec, combine=True, prefetch=True):
    return f"tcgnn_spmm_vec<{slices}, {unroll}, {_b(vec)}, {_b(combine)}, {_b(prefetch)}>"


#: (feature groups, blocks per step, stages) of the cp.async vector SpMM.
VEC_ASYNC = tuple((f, u, ns) for f in (1, 2) for u in (2, 4) for ns in (2, 3))


#: (feature groups, blocks per step) of the vector SpMM's COOP launch (one CTA per window x slice; 2 stages).
VEC_COOP = tuple((f, u) for f in (1, 2) for u in (2, 4))


#: (feature groups, blocks per step, stages) of the cp.async vector SpMM also compiled with its copies through L1
#: (values one step ahead, not dense): candidates of the timed choice.
VEC_ASYNC_L1 = tuple((f, u, 2) for f in (1, 2) for u in (2, 4))


def spmm_vec_async_name(slices, unroll, stages, combine=True, round_x=True, prefetch=False, dense=False, coop=False,
                        l1=False):
    if l1:  # X rows through L1 (VEC_ASYNC_L1): values one step ahead
        return f"tcgnn_spmm_vec_async<{slices}, {unroll}, {stages}, {_b(combine)}, true, true, false, false, true>"
    if coop:  # one CTA per window x slice, its parts summed in shared memory: values one step ahead, no dense
        return f"tcgnn_spmm_vec_async<{slices}, {unroll}, {stages}, false, true, true, false, true>"
    if dense:  # dense values: one step ahead by construction
        return f"tcgnn_spmm_vec_async<{slices}, {unroll}, {stages}, {_b(combine)}, {_b(round_x)}, true, true>"
    if prefetch:
        return f"tcgnn_spmm_vec_async<{slices}, {unroll}, {stages}, {_b(combine)}, {_b(round_x)}, true>"
    return f"tcgnn_spmm_vec_async<{slices}, {unroll}, {stages}, {_b(combine)}, {_b(round_x)}>"


def vec_async_smem(nwarps, slices, unroll, stages):
    """Bytes of ``tcgnn_spmm_vec_async``: per warp ``stages`` x ``unroll`` blocks x 4 rows padded by 8 floats."""
    return nwarps * stages * unroll * 4 * (32 * slices + 8) * 4


def sddmm_vec_name(vec):
    return f"tcgnn_sddmm_vec<{_b(vec)}>"


#: NumPy name -> CUDA type of the 16-bit operand types.
HALF_TYPES = {"float16": "tc_f16", "bfloat16": "tc_bf16"}
#: (feature groups of 32, k16 chunks per step, stages) of the 16-bit vector SpMM compiled for every type
#: combination and aligned rows; HALF_DEFAULT also for unaligned rows (D % 8 != 0).
VEC_HALF = ((1, 1, 2), (1, 2, 2), (2, 1, 2), (2, 1, 3), (2, 2, 2))
HALF_DEFAULT = (1, 1, 2)


#: (feature groups, k16 chunks per step, stages) of the 16-bit vector SpMM's COOP launch (aligned rows).
VEC_HALF_COOP = ((1, 1, 2), (2, 1, 2))


def spmm_vech_name(x_type, split, y_type, slices, ks, stages, combine=True, aligned=True, prefetch=True, coop=False):
    ty = "float" if y_type == "float32" else HALF_TYPES[y_type]
    if coop:  # one CTA per window x slice: aligned rows, values one step ahead, no partial tiles
        return (f"tcgnn_spmm_vech<{HALF_TYPES[x_type]}, {_b(split)}, {ty}, {slices}, {ks}, {stages}, false, true, "
                "true, true>")
    return (f"tcgnn_spmm_vech<{HALF_TYPES[x_type]}, {_b(split)}, {ty}, {slices}, {ks}, {stages}, {_b(combine)}, "
            f"{_b(aligned)}, {_b(prefetch)}>")


def vech_smem(nwarps, slices, ks, stages):
    """Bytes of ``tcgnn_spmm_vech``: per warp ``stages`` x 16 ``ks`` rows of ``32 slices + 8`` halves."""
    return nwarps * stages * 16 * ks * (32 * slices + 8) * 2


def _half_names():
    names = []
    for x in HALF_TYPES:
        for split in (True, False):
            for y in ("float32", x):
                for f, ks, ns in VEC_HALF:
                    names += [spmm_vech_name(x, split, y, f, ks, ns, c) for c in (True, False)]
                names += [spmm_vech_name(x, split, y, *HALF_DEFAULT, c, False) for c in (True, False)]
                names += [spmm_vech_name(x, split, y, f, ks, ns, True, True, False) for f, ks, ns in VEC_HALF[:3]]
                names += [spmm_vech_name(x, split, y, *cfg, coop=True) for cfg in VEC_HALF_COOP]
        names.append(fixup_name("float32", x))
    return names + [fixup_name("float32")]


#: Feature slices of the N:M SpMM: NT n-tiles of 8 per warp (32 or 64 features).
SP_NT = (4, 8)
#: Blocks per step of the N:M SpMM (their loads are issued together).
SP_UNROLL = (2, 4)

#: X type of the N:M SpMM -> its layout: 16-bit X on "2:4", float32 (TF32) on "1:2".
SP_TYPES = {"float16": "2:4", "bfloat16": "2:4", "float32": "1:2"}


def spmm_sp_name(x_type, split, y_type, nt, aligned, combine=True, unroll=2):
    tx = "float" if x_type == "float32" else HALF_TYPES[x_type]
    ty = "float" if y_type == "float32" else HALF_TYPES[y_type]
    return f"tcgnn_spmm_sp<{tx}, {_b(split)}, {ty}, {nt}, {_b(aligned)}, {_b(combine)}, {unroll}>"


def _sp_names():
    names = []
    for x in SP_TYPES:
        for split in ((False,) if x == "float32" else (True, False)):
            for y in dict.fromkeys(("float32", x)):
                names += [spmm_sp_name(x, split, y, nt, al, c, ub) for nt in SP_NT for al in (True, False)
                          for c in (True, False) for ub in SP_UNROLL]
                names.append(fixup_name("float32", y))
    return list(dict.fromkeys(names))


def _vec_names():
    names = [spmm_vec_name(f, u, v, c, pf) for f in VEC_SLICES for u in VEC_UNROLL for v in (True, False)
             for c in (True, False) for pf in (True, False)]
    names += [spmm_vec_async_name(f, u, ns, c) for f, u, ns in VEC_ASYNC for c in (True, False)]
    names += [spmm_vec_async_name(f, u, ns, c, True, True) for f, u, ns in VEC_ASYNC for c in (True, False)]
    names += [spmm_vec_async_name(f, u, ns, c, True, True, True) for f, u, ns in VEC_ASYNC for c in (True, False)]
    names += [spmm_vec_async_name(f, u, 2, coop=True) for f, u in VEC_COOP]
    names += [spmm_vec_async_name(f, u, ns, c, l1=True) for f, u, ns in VEC_ASYNC_L1 for c in (True, False)]
    return names + [sddmm_vec_name(v) for v in (True, False)] + [fixup_name("float32")]


def _tf32_names():
    names = [spmm_tf32_name(c, v, pv) for c in TF32_CHUNKS for v in (True, False) for pv in (True, False)]
    names += [spmm_tf32_async_name(c, ns, mb) for c, ns, mb in TF32_ASYNC]
    names += [sddmm_tf32_name(v) for v in (True, False)]
    return names + [fixup_name("float32")]


def _core_names():
    names = [
        spmm_core_name(t, h, p) for t in VALUE_TYPES for h in CORE_HEIGHTS for p in TILE_POS_TYPES
    ]
    names += [sddmm_core_name(t, p) for t in VALUE_TYPES for p in TILE_POS_TYPES]
    return names + [fixup_name(t) for t in VALUE_TYPES]


#: ``family -> (CUDA source, name expressions)`` of this module's families.
FAMILIES = {
    "tf32": (_COMMON + _TF32, tuple(_tf32_names())),
    "core": (_COMMON + _CORE, tuple(_core_names())),
    "vec": (_COMMON + _VEC_COMMON + _PUT4 + _VEC, tuple(_vec_names())),
    "half": (_COMMON + _VEC_COMMON + _PUT4 + _HALF, tuple(_half_names())),
    "sparse": (_COMMON + _VEC_COMMON + _PUT4 + _SPARSE, tuple(_sp_names())),
}
for _family, (_source, _names) in FAMILIES.items():
    register(_family, _source, _names)
