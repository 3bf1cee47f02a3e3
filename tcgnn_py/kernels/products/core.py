"""Layer 1: the ``"core"`` family: CUDA-core SpMM and SDDMM in the data's own precision, any tile shape.

``precision="fp32"`` and every float64 product run here; accumulators live in registers, one row
window of height ``H`` per warp pass.
"""

import dataclasses
from typing import ClassVar

from ..registry import VALUE_TYPES, register
from .common import COMMON_SOURCE, FIXUP_SOURCE, TILE_POS_TYPES, KernelConfig, fixup_name

__all__ = ["SpmmCore", "SddmmCore", "CORE_HEIGHTS", "spmm_core_name", "sddmm_core_name", "core_spmm_smem"]

#: Window heights the CUDA-core SpMM is instantiated for (accumulators live in registers).
CORE_HEIGHTS = (1, 2, 4, 8, 16, 32)


@dataclasses.dataclass(frozen=True)
class SpmmCore(KernelConfig):
    """``tcgnn_spmm_core<T, H, P>``: values of CUDA type T, window height H, ``tile_pos`` type P."""

    KERNEL: ClassVar[str] = "tcgnn_spmm_core"
    T: str
    H: int
    P: str


@dataclasses.dataclass(frozen=True)
class SddmmCore(KernelConfig):
    """``tcgnn_sddmm_core<T, P>``."""

    KERNEL: ClassVar[str] = "tcgnn_sddmm_core"
    T: str
    P: str


def spmm_core_name(value_type, height, pos_type):
    return SpmmCore(VALUE_TYPES[value_type], height, TILE_POS_TYPES[pos_type]).name


def sddmm_core_name(value_type, pos_type):
    return SddmmCore(VALUE_TYPES[value_type], TILE_POS_TYPES[pos_type]).name


def core_spmm_smem(nwarps, height, itemsize):
    """Bytes of ``tcgnn_spmm_core``'s cross-warp sum: per warp ``H * 32`` values."""
    return nwarps * height * 32 * itemsize


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

SOURCE = COMMON_SOURCE + FIXUP_SOURCE + _CORE
#: Every compiled variant: each value type, window height and tile_pos type; the fixups.
NAMES = tuple(
    [spmm_core_name(t, h, p) for t in VALUE_TYPES for h in CORE_HEIGHTS for p in TILE_POS_TYPES]
    + [sddmm_core_name(t, p) for t in VALUE_TYPES for p in TILE_POS_TYPES]
    + [fixup_name(t) for t in VALUE_TYPES]
)
register("core", SOURCE, NAMES)
