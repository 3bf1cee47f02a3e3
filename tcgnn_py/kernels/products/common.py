"""Layer 1: what the product kernel families share: device helpers, launch limits, configs and the fixup kernel.

A family's kernel configuration is a frozen dataclass whose fields are the CUDA template's parameters,
named and ordered as in the template; its ``name`` is the NVRTC name expression (every argument
written out), so a compiled variant, a launch and a test all name a kernel the same way.
"""

import dataclasses
import functools
from typing import ClassVar

from ..registry import VALUE_TYPES

__all__ = [
    "KernelConfig",
    "cuda_arg",
    "cuda_type",
    "SpmmFixup",
    "fixup_name",
    "COMMON_SOURCE",
    "FIXUP_SOURCE",
    "VEC_COMMON_SOURCE",
    "PUT4_SOURCE",
    "VALUE_TYPES",
    "TILE_POS_TYPES",
    "HALF_TYPES",
    "SPMM_MAX_THREADS",
    "SPMM_SMEM_LIMIT",
    "FIXUP_THREADS",
    "SDDMM_WARPS",
]

#: ``tile_pos`` element types: uint8, or uint16 when ``H * W > 256``.
TILE_POS_TYPES = {"uint8": "tc_u8", "uint16": "tc_u16"}
#: NumPy name -> CUDA type of the 16-bit operand types.
HALF_TYPES = {"float16": "tc_f16", "bfloat16": "tc_bf16"}

# Launch geometry the sources assume; the launchers import it from here.
#: ``__launch_bounds__`` of the SpMM kernels: at most 8 warps per CTA.
SPMM_MAX_THREADS = 256
#: Dynamic shared memory available without an opt-in attribute.
SPMM_SMEM_LIMIT = 48 * 1024
#: Threads per CTA of ``tcgnn_spmm_fixup`` (any multiple of 32 works).
FIXUP_THREADS = 256
#: Warps per CTA of the SDDMM kernels (``__launch_bounds__(128)``).
SDDMM_WARPS = 4


def cuda_arg(value):
    """A template argument as CUDA C++ writes it (``true`` / ``false`` for booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def cuda_type(name):
    """The CUDA type of an operand or result dtype name: ``float`` for float32, ``tc_f16`` / ``tc_bf16`` for 16 bits."""
    return "float" if name == "float32" else HALF_TYPES[name]


class KernelConfig:
    """Base of the families' configs: ``KERNEL`` is the template's name, the dataclass fields its parameters."""

    KERNEL: ClassVar[str] = ""

    @functools.cached_property
    def name(self):
        """The NVRTC name expression of this instantiation, every template argument written out (kept on the
        config once written: planning a product asks for it often)."""
        args = ", ".join(cuda_arg(getattr(self, f.name)) for f in dataclasses.fields(self))
        return f"{self.KERNEL}<{args}>"


@dataclasses.dataclass(frozen=True)
class SpmmFixup(KernelConfig):
    """``tcgnn_spmm_fixup<T, TY>``: sums a split window's partial tiles (``T``) into the result (``TY``)."""

    KERNEL: ClassVar[str] = "tcgnn_spmm_fixup"
    T: str
    TY: str


@functools.cache
def fixup_name(value_type, out_type=None):
    """The fixup kernel for partial tiles of ``value_type`` and a result of ``out_type`` (default the same); worked
    out once per pair (a new matrix's first product asks for it)."""
    t = VALUE_TYPES[value_type]
    ty = t if out_type is None or out_type == value_type else HALF_TYPES[out_type]
    return SpmmFixup(t, ty).name


COMMON_SOURCE = r"""
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

#: The fixup kernel, in the families whose launches sum split windows by a second launch.
FIXUP_SOURCE = r"""
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
"""

VEC_COMMON_SOURCE = r"""
// The work item of one warp of the vector-layout SpMMs: unit x feature slice of WID features.
struct tc_vec_work {
    int lane, wib, g, t, unit, slice, base;
    int4 u;
};

// A launch without a plan (units null) reads its units from the window pointers: the usual launch's where no
// window is cut (unit = window, whole; no slot), the COOP launch's always (part j of window w: blocks
// [j nb / 4, (j + 1) nb / 4) of its nb) -- the plan's units, so the same sums in the same order, without a
// plan built and uploaded for a new matrix's first product.
__device__ __forceinline__ int4 tc_vec_unit(const int4* __restrict__ units, const int* __restrict__ win_ptr,
                                            int unit) {
    if (units != nullptr) return units[unit];
    return make_int4(unit, win_ptr[unit], win_ptr[unit + 1], -1);
}

__device__ __forceinline__ int4 tc_vec_coop_unit(const int4* __restrict__ units, const int* __restrict__ win_ptr,
                                                 int unit) {
    if (units != nullptr) return units[unit];
    const int w = unit >> 2, j = unit & 3;
    const int start = win_ptr[w], nb = win_ptr[w + 1] - start;  // (nb < 2**28: j nb fits an int)
    return make_int4(w, start + j * nb / 4, start + (j + 1) * nb / 4, -1);
}

__device__ __forceinline__ bool tc_vec_work_of(const int4* __restrict__ units, const int* __restrict__ win_ptr,
                                               int n_slices, int n_work, int wid, tc_vec_work& w) {
    w.lane = threadIdx.x & 31;
    w.wib = threadIdx.x >> 5;
    const int work = blockIdx.x * (blockDim.x >> 5) + w.wib;
    if (work >= n_work) return false;
    w.g = w.lane >> 2;
    w.t = w.lane & 3;
    w.unit = work / n_slices;
    w.slice = work - w.unit * n_slices;
    w.u = tc_vec_unit(units, win_ptr, w.unit);
    w.base = w.slice * wid;
    return true;
}

// COOP: a CTA of 4 warps is one window's feature slice, its warps the window's 4 parts (units
// 4 * window + warp, balanced; a part may be empty): grid = windows x slices.  Small grids, where
// parts summed through global partial tiles (a fence, a counter, a second read) make the chain.
__device__ __forceinline__ void tc_vec_coop_work_of(const int4* __restrict__ units, const int* __restrict__ win_ptr,
                                                    int n_slices, int wid, tc_vec_work& w) {
    w.lane = threadIdx.x & 31;
    w.wib = threadIdx.x >> 5;
    w.g = w.lane >> 2;
    w.t = w.lane & 3;
    w.slice = blockIdx.x % n_slices;
    w.unit = (blockIdx.x / n_slices) * 4 + w.wib;
    w.u = tc_vec_coop_unit(units, win_ptr, w.unit);
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

PUT4_SOURCE = r"""
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
