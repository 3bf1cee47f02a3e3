"""Layer 1: CUDA source of the ``"nn"`` RawModule family (training helpers).

Listed in :func:`tcgnn_py.kernels.registry.families`, so it compiles through
the same cached path and the same NVRTC check in CI.
"""

from .products.common import COMMON_SOURCE, cuda_type
from .registry import VALUE_TYPES, register

__all__ = ["SOURCE", "NAMES", "FAMILIES", "TICK", "adam_multi_name", "ADAM_MULTI", "ADAM_SLOTS",
           "tail_name", "tail_grad_name", "cross_entropy_name", "index_weights_name", "head_dots_name",
           "head_dots_grad_name", "add_bias_name", "dense_mm_name", "DENSE_TILES", "dense_atb_name",
           "DENSE_ATB_TILES", "DENSE_ATB_SUM", "NARROW_ATB", "NARROW_THREADS", "NARROW_ATB_MAX", "SLICE_SUM_THREADS",
           "slice_sum_threads", "DENSE_NAMES", "SEED_BITS", "DRAW", "drop_mm_name", "drop_atb_name", "DROP_TILES",
           "DROP_NAMES",
           "row_normalize_name", "row_normalize_grad_name", "sum_name", "segment_sum_name", "csr_mm_name",
           "head_blocks_name", "SUM_THREADS",
           "ACTIVATIONS", "TAIL_TYPES"]

#: Tensors one ``tcgnn_adam_multi`` launch updates: its gradients are kernel parameters (``g0`` to ``g7``).
ADAM_MULTI = 8
#: int64 slots per tensor in the multi-tensor Adam table: parameter, m and v addresses, size, weight decay's bits.
ADAM_SLOTS = 5
#: Activation codes of the tail kernels (``tcgnn_tail``'s ``act``).
ACTIVATIONS = {None: 0, "relu": 1, "elu": 2}
#: NumPy names of the tail and cross-entropy kernels' element types.
TAIL_TYPES = ("float32", "float64", "float16", "bfloat16")

_NN = r"""
// The step count and bias corrections of Adam live on the device, so that a
// captured training step (a CUDA graph) advances them on every replay.
// t += 1; coef = (lr / (1 - b1^t), sqrt(1 - b2^t)).  (A step with gradients ticks in tcgnn_adam_multi.)
__global__ void tcgnn_adam_tick(long long* __restrict__ t, double* __restrict__ coef, double lr,
                                double b1, double b2) {
    long long k = t[0] + 1;
    t[0] = k;
    coef[0] = lr / (1.0 - pow(b1, (double)k));
    coef[1] = sqrt(1.0 - pow(b2, (double)k));
}

// One Adam step of element i (Kingma & Ba, PyTorch's L2 weight decay): p, g, m, v read once, p, m, v written
// once.  step and bc2_sqrt from tcgnn_adam_tick.
template <typename T>
__device__ __forceinline__ void tcgnn_adam_one(T* p, const T* g, T* m, T* v, long long i, T step, T bc2_sqrt,
                                               T b1, T b2, T eps, T wd) {
    T gi = g[i] + wd * p[i];
    T mi = b1 * m[i] + (T(1) - b1) * gi;
    T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= step * mi / (sqrt(vi) / bc2_sqrt + eps);
}

// Whether this block is the last of `blocks` to get here (a count in done, which the last block resets once it has
// read what the others wrote): every block's writes before the call are visible to the last one.  Called by every
// thread of the block: one launch whose last block finishes the work, where a second launch would cost more.
__device__ __forceinline__ bool nn_last_block(unsigned int* done, unsigned int blocks) {
    __shared__ bool last;
    __threadfence();  // this block's writes are visible before its count
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done, 1u) == blocks - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// Adam for up to 8 tensors in one launch (blockIdx.y picks the tensor), one element as tcgnn_adam_one: a
// training step's dozen small parameters cost one launch, not one each.  table: per tensor its parameter, m and
// v addresses, its size and its weight decay's bits (a double), made once by the optimizer; g0..g7 the
// gradients, which change every step.  With t (the step's first launch): every thread works out
// tcgnn_adam_tick's step count and bias corrections from t[0], and the block that finishes last (t[1] counts
// them; it resets it) writes them to t[0] and coef -- the tick's launch folded into the update; else coef is read.
template <typename T>
__global__ void tcgnn_adam_multi(const long long* __restrict__ table, double* __restrict__ coef, T b1, T b2,
                                 T eps, const T* g0, const T* g1, const T* g2, const T* g3, const T* g4,
                                 const T* g5, const T* g6, const T* g7, long long* __restrict__ t, double lr,
                                 double b1d, double b2d) {
    const int j = blockIdx.y;
    const long long* e = table + 5 * j;
    T* p = reinterpret_cast<T*>(e[0]);
    T* m = reinterpret_cast<T*>(e[1]);
    T* v = reinterpret_cast<T*>(e[2]);
    const long long n = e[3];
    const T wd = T(__longlong_as_double(e[4]));
    const T* g = j == 0 ? g0 : j == 1 ? g1 : j == 2 ? g2 : j == 3 ? g3 : j == 4 ? g4 : j == 5 ? g5 : j == 6 ? g6 : g7;
    long long k = 0;
    double c0, c1;
    if (t != nullptr) {
        k = t[0] + 1;
        c0 = lr / (1.0 - pow(b1d, (double)k));
        c1 = sqrt(1.0 - pow(b2d, (double)k));
    } else {
        c0 = coef[0];
        c1 = coef[1];
    }
    const T step = T(c0);
    const T bc2_sqrt = T(c1);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        tcgnn_adam_one(p, g, m, v, i, step, bc2_sqrt, b1, b2, eps, wd);
    if (t == nullptr) return;
    // (every thread has read t[0] before its block's count; t[1] counts the blocks, its low half as 32 bits)
    if (nn_last_block(reinterpret_cast<unsigned int*>(t + 1), gridDim.x * gridDim.y) && threadIdx.x == 0) {
        t[0] = k;
        coef[0] = c0;
        coef[1] = c1;
        t[1] = 0;
    }
}

// Elements in their compute type: double for double, float for float and the 16-bit types.
template <typename T> struct nn_acc { typedef float type; };
template <> struct nn_acc<double> { typedef double type; };
__device__ __forceinline__ double nn_of(double v) { return v; }
template <typename T> __device__ __forceinline__ float nn_of(T v) { return tc_f32_of(v); }

// 4 bytes global -> shared; ok false writes a zero without reading.
__device__ __forceinline__ void dn_cp4(float* dst, const float* src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(tc_smem_addr(dst)), "l"(src), "r"(ok ? 4 : 0)
                 : "memory");
}

// C = A B (+ bias) in float32 for a tall A and a small B: A is m x k with unit column stride and row stride lda,
// B is k x n with strides (sb, tb), C m x n C-contiguous; bias one value per column or nullptr.  Each element is
// summed one fma at a time in k's order (cuBLAS's float32 compute, no TF32).
// A block of NT threads computes a (NT / (BN / 4) * TM) x BN tile of C, TM x 4 elements per thread, over BK-wide
// slices of A and B that cp.async stages in shared memory, the next slice copied while this one is summed (no
// registers held for the copy).  Each thread reads its rows' and its columns' next 4 values of k as float4s,
// so shared memory serves 4 fmas per value read.  vec bit 0 (lda and k multiples of 4, A 16-byte aligned): A is
// copied 16 bytes at a time, 8 threads a row's 128 bytes; bit 1 likewise for B along its unit stride (its other
// stride and its extent there multiples of 4).  BT (B a transposed view, sb == 1): B's slice is kept by columns
// and each thread takes the columns tx, tx + BN / 4, ... (conflict-free reads of a column's k), else by rows and
// each thread takes 4 adjacent columns (stored as a float4).
// Scores (GAT, not BT): with a_src not nullptr, C's columns are heads of D values (D / 4 a power of two that
// divides BN / 4) and s_src[i, h] = <C[i, h], a_src[h]>, s_dst likewise, are written from the sums as stored.
template <int BN, int TM, int NT, bool BT>
__global__ void __launch_bounds__(NT) tcgnn_dense_mm(const float* __restrict__ A, const float* __restrict__ B,
                                                      const float* __restrict__ bias, float* __restrict__ C, int m,
                                                      int n, int k, long long lda, long long sb, long long tb,
                                                      int vec, const float* __restrict__ a_src,
                                                      const float* __restrict__ a_dst, float* __restrict__ s_src,
                                                      float* __restrict__ s_dst, int D) {
    constexpr int GX = BN / 4, BM = NT / GX * TM;
    // k per slice: two slices of A and B within the 48 KB of static shared memory
    constexpr int BK = (BM * 36 + (BT ? BN * 36 : 32 * BN)) * 8 <= 48 * 1024 ? 32 : 16;
    constexpr int PA = BK + 4, SA = BM * PA, SB = BT ? BN * PA : BK * BN;
    __shared__ __align__(16) float As[2 * SA];
    __shared__ __align__(16) float Bs[2 * SB];
    const int tid = threadIdx.x, tx = tid % GX, ty = tid / GX;
    const long long row0 = (long long)blockIdx.x * BM;
    const int col0 = blockIdx.y * BN;
    auto stage = [&](int l0, int buf) {
        float* as = As + buf * SA;
        float* bs = Bs + buf * SB;
        if (vec & 1) {
            for (int f = tid; f < BM * BK / 4; f += NT) {
                const int r = f / (BK / 4), c = l0 + f % (BK / 4) * 4;
                const bool ok = row0 + r < m && c < k;
                tc_cp_async16(tc_smem_addr(as + r * PA + c - l0), ok ? A + (row0 + r) * lda + c : A, ok ? 16 : 0);
            }
        } else {
            for (int e = tid; e < BM * BK; e += NT) {
                const int r = e / BK, c = l0 + e % BK;
                const bool ok = row0 + r < m && c < k;
                dn_cp4(as + r * PA + c - l0, ok ? A + (row0 + r) * lda + c : A, ok);
            }
        }
        if (vec & 2) {  // 4 values of B's contiguous dimension (k for BT, else n) at a time
            for (int f = tid; f < BK * BN / 4; f += NT) {
                const int r = BT ? f % (BK / 4) * 4 : f / (BN / 4), c = BT ? f / (BK / 4) : f % (BN / 4) * 4;
                const bool ok = l0 + r < k && col0 + c < n;
                tc_cp_async16(tc_smem_addr(bs + (BT ? c * PA + r : r * BN + c)),
                              ok ? B + (l0 + r) * sb + (long long)(col0 + c) * tb : B, ok ? 16 : 0);
            }
        } else {
            for (int e = tid; e < BK * BN; e += NT) {
                const int r = BT ? e % BK : e / BN, c = BT ? e / BK : e % BN;
                const bool ok = l0 + r < k && col0 + c < n;
                dn_cp4(bs + (BT ? c * PA + r : e), ok ? B + (l0 + r) * sb + (long long)(col0 + c) * tb : B, ok);
            }
        }
    };
    float acc[TM][4];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
    const int slices = (k + BK - 1) / BK;
    stage(0, 0);
    tc_cp_commit();
    for (int t = 0; t < slices; ++t) {
        if (t + 1 < slices) stage((t + 1) * BK, (t + 1) & 1);
        tc_cp_commit();
        tc_cp_wait<1>();
        __syncthreads();
        const float* as = As + (t & 1) * SA;
        const float* bs = Bs + (t & 1) * SB;
#pragma unroll
        for (int l = 0; l < BK; l += 4) {
            float4 a[TM], b[4];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = *reinterpret_cast<const float4*>(as + (ty * TM + i) * PA + l);
#pragma unroll
            for (int j = 0; j < 4; ++j)  // BT: column j's 4 values of k; else row l + j's 4 columns
                b[j] = *reinterpret_cast<const float4*>(BT ? bs + (tx + j * GX) * PA + l : bs + (l + j) * BN + tx * 4);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
#pragma unroll
                for (int i = 0; i < TM; ++i) {
                    const float v = q == 0 ? a[i].x : q == 1 ? a[i].y : q == 2 ? a[i].z : a[i].w;
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float4 w = BT ? b[j] : b[q];
                        const int at = BT ? q : j;
                        acc[i][j] = fmaf(v, at == 0 ? w.x : at == 1 ? w.y : at == 2 ? w.z : w.w, acc[i][j]);
                    }
                }
            }
        }
        __syncthreads();
    }
    float bv[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int c = col0 + (BT ? tx + j * GX : tx * 4 + j);
        bv[j] = bias && c < n ? bias[c] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const long long r = row0 + ty * TM + i;
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += bv[j];
        if constexpr (BT) {
            if (r < m)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (col0 + tx + j * GX < n) C[r * n + col0 + tx + j * GX] = acc[i][j];
        } else {
            const int c0 = col0 + tx * 4;
            if (a_src) {  // the row's head dots: this thread's 4 columns, then the D / 4 lanes of the head
                float ps = 0.f, pd = 0.f;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    if (c0 + j < n) {
                        ps = fmaf(acc[i][j], a_src[c0 + j], ps);
                        pd = fmaf(acc[i][j], a_dst[c0 + j], pd);
                    }
                }
                for (int o = D / 8; o; o >>= 1) {
                    ps += __shfl_xor_sync(0xffffffffu, ps, o);
                    pd += __shfl_xor_sync(0xffffffffu, pd, o);
                }
                if (r < m && c0 < n && c0 % D == 0) {
                    const int heads = n / D;
                    s_src[r * heads + c0 / D] = ps;
                    s_dst[r * heads + c0 / D] = pd;
                }
            }
            if (r < m) {
                float* out = C + r * n + c0;
                if (c0 + 3 < n && n % 4 == 0)
                    *reinterpret_cast<float4*>(out) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
                else
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        if (c0 + j < n) out[j] = acc[i][j];
            }
        }
    }
}

// C[o] = sum over s of P[s * pq + o], s = 0 .. S - 1 (tcgnn_dense_atb's and the dropped products' slices: the same
// sums on every run, and on every launch shape), a block of NT threads for the NT / T outputs o0 ... (T a power of
// two dividing NT): thread t of output o adds the slices t, t + T, ... in order, then a tree over the T threads.
// Few slices take T = 1 (a thread an output, coalesced); many take more threads per output, so that few outputs
// (a bias's column sums) are not summed by a few lanes one slice after another.  The partials are read from L2,
// as other blocks of a launch wrote them.
template <int NT>
__device__ __forceinline__ void dn_slice_sum(const float* P, float* C, int S, int pq, int T, long long o0,
                                             float* red) {
    const int O = NT / T, t = threadIdx.x / O;
    const long long o = o0 + threadIdx.x % O;
    float v = 0.f;
    if (o < pq) {
        int s = t;
        for (; s + 3 * T < S; s += 4 * T) {
            const float x0 = __ldcg(P + (long long)s * pq + o), x1 = __ldcg(P + (long long)(s + T) * pq + o);
            const float x2 = __ldcg(P + (long long)(s + 2 * T) * pq + o);
            const float x3 = __ldcg(P + (long long)(s + 3 * T) * pq + o);
            v += x0; v += x1; v += x2; v += x3;
        }
        for (; s < S; s += T) v += __ldcg(P + (long long)s * pq + o);
    }
    if (T == 1) {
        if (o < pq) C[o] = v;
        return;
    }
    red[threadIdx.x] = v;
    __syncthreads();
    for (int w = T / 2; w > 0; w >>= 1) {
        if (t < w) red[threadIdx.x] += red[threadIdx.x + w * O];
        __syncthreads();
    }
    if (t == 0 && o < pq) C[o] = red[threadIdx.x];
    __syncthreads();
}

// Threads per output of dn_slice_sum for S slices: the power of two that leaves each four to eight loads, at most NT
// (slice_sum_threads on the host).
__device__ __forceinline__ int dn_sum_threads(int S, int NT) {
    int T = 1;
    while (T * 8 <= S && T < NT) T <<= 1;
    return T;
}

// Partial sums of C = Aᵀ B over a slice of the long dimension, float32: A is N x p and B is N x q, both with unit
// column stride and row strides lda, ldb (A nullptr: a column of ones, p = 1, so C holds B's column sums); block
// (s, I, J) sums the rows [s * chunk, (s + 1) * chunk) (chunk 0: N split evenly over the slices, 32 rows at a
// time) of the (NT / (BQ / 4) * TI) x BQ tile (I, J) of C into P + s * p * q (p x q, C-contiguous), or into C
// itself where one slice covers N (P == C).  32 rows of A and B at a time are staged by cp.async, the next copied
// while this one is summed; each thread owns TI x 4 elements and reads its rows' values of A and its 4 columns of
// B as float4s.
// With a barrier (two counters, zero before the first launch; a cooperative launch, so every block is resident)
// the blocks then wait for each other and add the slices into C themselves (dn_slice_sum);
// without, tcgnn_dense_atb_sum adds them in a second launch.
template <int BQ, int TI, int NT>
__global__ void __launch_bounds__(NT) tcgnn_dense_atb(const float* __restrict__ A, const float* __restrict__ B,
                                                      float* __restrict__ P, long long N, int p, int q,
                                                      long long lda, long long ldb, long long chunk, int vec,
                                                      float* __restrict__ C, unsigned int* __restrict__ barrier) {
    constexpr int GX = BQ / 4, BP = NT / GX * TI, R = 32, PA = BP + 4, PB = BQ + 4;
    __shared__ __align__(16) float As[2 * R * PA];
    __shared__ __align__(16) float Bs[2 * R * PB];
    const int tid = threadIdx.x, tx = tid % GX, ty = tid / GX;
    const int i0 = blockIdx.y * BP, j0 = blockIdx.z * BQ;
    // chunk 0: the rows split evenly over the grid's slices, 32 at a time (a launch bound for every N)
    const long long rows = chunk > 0 ? chunk : ((N + gridDim.x - 1) / gridDim.x + 31) / 32 * 32;
    const long long r0 = blockIdx.x * rows, r1 = min(N, r0 + rows);
    auto stage = [&](long long rb, int buf) {
        float* as = As + buf * R * PA;
        float* bs = Bs + buf * R * PB;
        for (int e = tid; e < R * BP; e += NT) {  // A's rows rb .. rb + 31, columns i0 .. i0 + BP - 1
            const int r = e / BP, c = e % BP;
            const bool ok = rb + r < r1 && i0 + c < p;
            if (A) dn_cp4(as + r * PA + c, ok ? A + (rb + r) * lda + i0 + c : A, ok);
            else as[r * PA + c] = ok ? 1.f : 0.f;
        }
        if (vec) {  // B 16 bytes at a time (ldb and q multiples of 4, B 16-byte aligned)
            for (int f = tid; f < R * BQ / 4; f += NT) {
                const int r = f / (BQ / 4), c = f % (BQ / 4) * 4;
                const bool ok = rb + r < r1 && j0 + c < q;
                tc_cp_async16(tc_smem_addr(bs + r * PB + c), ok ? B + (rb + r) * ldb + j0 + c : B, ok ? 16 : 0);
            }
        } else {
            for (int e = tid; e < R * BQ; e += NT) {
                const int r = e / BQ, c = e % BQ;
                const bool ok = rb + r < r1 && j0 + c < q;
                dn_cp4(bs + r * PB + c, ok ? B + (rb + r) * ldb + j0 + c : B, ok);
            }
        }
    };
    float acc[TI][4];
#pragma unroll
    for (int i = 0; i < TI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
    const int steps = r1 > r0 ? (int)((r1 - r0 + R - 1) / R) : 0;
    if (steps) stage(r0, 0);
    tc_cp_commit();
    for (int t = 0; t < steps; ++t) {
        if (t + 1 < steps) stage(r0 + (long long)(t + 1) * R, (t + 1) & 1);
        tc_cp_commit();
        tc_cp_wait<1>();
        __syncthreads();
        const float* as = As + (t & 1) * R * PA;
        const float* bs = Bs + (t & 1) * R * PB;
#pragma unroll 8
        for (int r = 0; r < R; ++r) {
            const float4 b = *reinterpret_cast<const float4*>(bs + r * PB + tx * 4);
            float a[TI];
            if constexpr (TI % 4 == 0) {
#pragma unroll
                for (int i = 0; i < TI; i += 4) {
                    const float4 v = *reinterpret_cast<const float4*>(as + r * PA + ty * TI + i);
                    a[i] = v.x, a[i + 1] = v.y, a[i + 2] = v.z, a[i + 3] = v.w;
                }
            } else {
#pragma unroll
                for (int i = 0; i < TI; ++i) a[i] = as[r * PA + ty * TI + i];
            }
#pragma unroll
            for (int i = 0; i < TI; ++i) {
                acc[i][0] = fmaf(a[i], b.x, acc[i][0]);
                acc[i][1] = fmaf(a[i], b.y, acc[i][1]);
                acc[i][2] = fmaf(a[i], b.z, acc[i][2]);
                acc[i][3] = fmaf(a[i], b.w, acc[i][3]);
            }
        }
        __syncthreads();
    }
    float* out = P + (long long)blockIdx.x * p * q;
#pragma unroll
    for (int i = 0; i < TI; ++i) {
        const int row = i0 + ty * TI + i;
        if (row >= p) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (j0 + tx * 4 + j < q) out[(long long)row * q + j0 + tx * 4 + j] = acc[i][j];
    }
    if (barrier == nullptr) return;
    const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
    __syncthreads();
    if (tid == 0) {  // a grid barrier: barrier[0] counts arrivals, barrier[1] is the generation the last one ends
        volatile unsigned int* generation = barrier + 1;
        const unsigned int mine = *generation;
        __threadfence();  // this block's partials are visible before its arrival
        if (atomicAdd(barrier, 1u) == blocks - 1) {
            barrier[0] = 0u;
            __threadfence();
            atomicAdd(barrier + 1, 1u);
        } else {
            while (*generation == mine) {}
        }
        __threadfence();
    }
    __syncthreads();
    __shared__ float red[NT];
    const unsigned int b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    const int pq = p * q, T = dn_sum_threads(gridDim.x, NT), O = NT / T;
    for (long long o0 = (long long)b * O; o0 < pq; o0 += (long long)blocks * O)
        dn_slice_sum<NT>(P, C, gridDim.x, pq, T, o0, red);
}

// The slices' sum of tcgnn_dense_atb launched without a barrier, and of the dropped products: a block of 256 threads
// per 256 / T outputs (dn_slice_sum, T threads each).
__global__ void __launch_bounds__(256) tcgnn_dense_atb_sum(const float* __restrict__ P, float* __restrict__ C,
                                                           int S, int pq, int T) {
    __shared__ float red[256];
    dn_slice_sum<256>(P, C, S, pq, T, (long long)blockIdx.x * (256 / T), red);
}

// C = Aᵀ B for a narrow result (p q <= NARROW_ATB_MAX outputs; A N x p and B N x q with unit column stride, rows
// lda and ldb floats apart; A nullptr: ones, so C is B's column sums, p = 1), in one plain launch.  Block b takes
// the b-th of gridDim.x even slices of the rows; thread g * pq + o owns output o = i q + j in row group g (G groups,
// the power of two at most NN_NARROW_THREADS / pq) and adds A[r, i] B[r, j] over every G-th row, eight rows' loads
// in flight; a tree adds the groups and the block writes its pq partials to P.  The last block (nn_last_block)
// adds the blocks' partials the same way, in one fixed order: the same bits on every run.  (A bias's or a narrow
// weight's gradient: where tcgnn_dense_atb pays for a grid barrier and 64 x 64 tiles, a few outputs cost one pass
// over the rows.)
__device__ __forceinline__ float nn_group_tree(float v, float* red, int g, int G, int pq) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int w = G / 2; w > 0; w >>= 1) {
        if (g < w) red[threadIdx.x] += red[threadIdx.x + w * pq];
        __syncthreads();
    }
    return red[threadIdx.x];
}

__global__ void __launch_bounds__(NN_NARROW_THREADS) tcgnn_narrow_atb(
    const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, float* __restrict__ P,
    unsigned int* __restrict__ done, long long N, int p, int q, long long lda, long long ldb) {
    __shared__ float red[NN_NARROW_THREADS];
    const int pq = p * q;
    int G = 1;
    while (2 * G * pq <= NN_NARROW_THREADS) G <<= 1;
    const int o = threadIdx.x % pq, g = threadIdx.x / pq, i = o / q, j = o - i * q;
    const bool on = g < G;
    const long long rows = (N + gridDim.x - 1) / gridDim.x, r0 = (long long)blockIdx.x * rows;
    const long long r1 = min(N, r0 + rows);
    // 8 rows' loads issued at once: each row clamped into the slice (loads without conditions, so none waits for
    // another), the ones past it then added as 0
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (on && A == nullptr) {
        for (long long r = r0 + g; r < r1; r += 8 * G) {
            float x[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) x[u] = __ldg(B + min(r + u * G, r1 - 1) * ldb + j);
#pragma unroll
            for (int u = 0; u < 8; ++u) acc[u & 3] += r + u * G < r1 ? x[u] : 0.f;
        }
    } else if (on) {
        for (long long r = r0 + g; r < r1; r += 8 * G) {
            float x[8], y[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const long long ru = min(r + u * G, r1 - 1);
                x[u] = __ldg(A + ru * lda + i);
                y[u] = __ldg(B + ru * ldb + j);
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) acc[u & 3] += r + u * G < r1 ? x[u] * y[u] : 0.f;
        }
    }
    float v = nn_group_tree(on ? (acc[0] + acc[1]) + (acc[2] + acc[3]) : 0.f, red, on ? g : G, G, pq);
    if (g == 0) P[(long long)blockIdx.x * pq + o] = v;
    if (!nn_last_block(done, gridDim.x)) return;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    if (on) {
        const int S = gridDim.x;
        for (int s = g; s < S; s += 8 * G) {
            float x[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) x[u] = __ldcg(P + (long long)min(s + u * G, S - 1) * pq + o);
#pragma unroll
            for (int u = 0; u < 8; ++u) acc[u & 3] += s + u * G < S ? x[u] : 0.f;
        }
    }
    v = nn_group_tree(on ? (acc[0] + acc[1]) + (acc[2] + acc[3]) : 0.f, red, on ? g : G, G, pq);
    if (g == 0) C[o] = v;
    if (threadIdx.x == 0) done[0] = 0u;
}

// An attention dropout seed from a float64 draw x in [0, 1): y = (unsigned)(x * 2^32), the bits NumPy's
// (x * 2**32).astype(uint32) gives (the product is exact, the cast truncates).
__global__ void tcgnn_seed_bits(const double* __restrict__ x, unsigned int* __restrict__ y) {
    if (blockIdx.x == 0 && threadIdx.x == 0) y[0] = (unsigned int)(x[0] * 4294967296.0);
}

// A seed stream's next seed: state = {key, count}; out = the `words` (1 or 2) 32-bit halves of
// splitmix64(key + (count + 1) * golden), low first, and count advanced.  One thread on the device: a captured step
// (a CUDA graph) draws anew on every replay, and no call reads the host.
__global__ void tcgnn_draw(unsigned long long* __restrict__ state, unsigned int* __restrict__ out, int words) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    unsigned long long c = state[1] + 1;
    state[1] = c;
    unsigned long long z = state[0] + c * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[0] = (unsigned int)z;
    if (words > 1) out[1] = (unsigned int)(z >> 32);
}

// x[i, c] += b[c] in place over an n x cols C-contiguous x, in the compute type: a layer's bias after a sparse
// product, in one launch bound per signature (no CuPy elementwise call).
template <typename T>
__global__ void tcgnn_add_bias(T* __restrict__ x, const T* __restrict__ b, long long n, long long cols) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        tc_put(x + i, nn_of(x[i]) + nn_of(b[i % cols]));
}

// Feature dropout: element i is kept where the 24 high bits of a hash of (i, seed) are at least p * 2^24 (the
// attention dropout's mixing), so the backward pass recomputes the mask instead of keeping an n x F array.
// seed: two words on the device (a seed stream's draw, or a float64 draw rng.random(1)): no host read.
// The seed's term of the hash (a kernel of many elements computes it once); 0 without a seed.
__device__ __forceinline__ unsigned nn_mix(const unsigned* seed) {
    return seed ? (seed[0] ^ seed[1]) * 0x9E3779B9u : 0u;
}
// mix: nn_mix(seed).
__device__ __forceinline__ bool nn_keep_mixed(long long i, unsigned mix, float p) {
    unsigned x = (unsigned)i ^ ((unsigned)((unsigned long long)i >> 32) * 0x27D4EB2Fu) ^ mix;
    x ^= x >> 16; x *= 0x85EBCA6Bu; x ^= x >> 13; x *= 0xC2B2AE35u; x ^= x >> 16;
    return (float)(x >> 8) * 5.9604644775390625e-8f >= p;
}
__device__ __forceinline__ bool nn_keep(long long i, const unsigned* seed, float p) {
    return nn_keep_mixed(i, nn_mix(seed), p);
}

// A layer's elementwise tail in one pass: out = dropout(act(x + b)), act 0 none, 1 ReLU, 2 ELU; b (one value per
// column, cols of them) or nullptr; seed nullptr: no dropout, else kept elements scaled by `scale` = 1 / (1 - p).
template <typename T>
__global__ void tcgnn_tail(const T* __restrict__ x, const T* __restrict__ b, T* __restrict__ out, long long n,
                           long long cols, int act, float p, double scale, const unsigned* __restrict__ seed) {
    typedef typename nn_acc<T>::type A;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        A z = nn_of(x[i]);
        if (b) z += nn_of(b[i % cols]);
        if (act == 1) z = z > A(0) ? z : A(0);
        else if (act == 2) z = z > A(0) ? z : expm1(z);
        if (seed) z = nn_keep(i, seed, p) ? z * A(scale) : A(0);
        tc_put(out + i, z);
    }
}

// The tail's vjp: dz = g * mask * act'(x + b), the mask recomputed from the seed.
template <typename T>
__global__ void tcgnn_tail_grad(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ b,
                                T* __restrict__ dz, long long n, long long cols, int act, float p, double scale,
                                const unsigned* __restrict__ seed) {
    typedef typename nn_acc<T>::type A;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        A d = nn_of(g[i]);
        if (seed) d = nn_keep(i, seed, p) ? d * A(scale) : A(0);
        if (act) {
            A z = nn_of(x[i]);
            if (b) z += nn_of(b[i % cols]);
            if (act == 1) d = z > A(0) ? d : A(0);
            else d = z > A(0) ? d : d * exp(z);
        }
        tc_put(dz + i, d);
    }
}

// A float32 operand as two TF32 values, x ~ hi + lo (3xTF32: hi*hi + hi*lo + lo*hi, near float32's accuracy).
__device__ __forceinline__ void nn_split(float x, unsigned& hi, unsigned& lo) {
    hi = tc_tf32(x);
    lo = tc_tf32(x - __uint_as_float(hi));
}

// d += a b in 3xTF32 (the small products first): a's fragment split (ah + al), b's two values (bh + bl each).
__device__ __forceinline__ void nn_mma3(float (&d)[4], const unsigned (&ah)[4], const unsigned (&al)[4],
                                        const unsigned (&bh)[2], const unsigned (&bl)[2]) {
    tc_mma(d, al, bh[0], bh[1]);
    tc_mma(d, ah, bl[0], bl[1]);
    tc_mma(d, ah, bh[0], bh[1]);
}

template <int MT, int NJ>
__device__ __forceinline__ void nn_zero(float (&acc)[MT][NJ][4]) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// C = dropout(A) B for a tall, wide A (m x k, unit column stride, row stride lda) and a narrow B (k x n, strides
// sb, tb; n <= 8 NJ), C m x n C-contiguous, on TF32 tensor cores in 3xTF32 (near float32's accuracy, exact on small
// integers).  Dropout (seed not nullptr) as the tail kernel's: A's value (i, l) kept by nn_keep of i * k + l and
// scaled by drop_scale, masked in registers as loaded, so the product of a dropped input reads A once and
// writes no masked copy.  A warp owns 64 rows (4 MMA tiles of 16) over k in steps of 16: each thread loads its
// rows' (g and g + 8 of each tile) 4 values of k at 4t as one float4 (vec bit 0: lda and k multiples of 4, A
// 16-byte aligned), and they serve as the MMA's columns t and t + 4 of two steps (k permuted within a step, B's
// rows alike), so a row's 64 bytes are one coalesced read.  With slices of k (gridDim.y, each kc wide, a multiple
// of 16) each writes its partial sums to P + y * m * n (tcgnn_dense_atb_sum adds them in y's order), else C.
template <int NJ>
__global__ void __launch_bounds__(128) tcgnn_drop_mm(const float* __restrict__ A, const float* __restrict__ B,
                                                     float* __restrict__ C, int m, int n, int k, long long lda,
                                                     long long sb, long long tb, int vec, int kc,
                                                     float* __restrict__ P, const unsigned* __restrict__ seed,
                                                     float drop_p, double drop_scale) {
    constexpr int MT = 4, Q = 1;  // MMA tiles of 16 rows a warp, 16-wide steps of k loaded at once
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long long row0 = ((long long)blockIdx.x * 4 + threadIdx.x / 32) * 16 * MT;
    const int k0 = blockIdx.y * kc, k1 = min(k, k0 + kc);
    const unsigned mix = nn_mix(seed);
    const float keep_scale = (float)drop_scale;
    float acc[MT][NJ][4];
    nn_zero(acc);
    for (int kq = k0; kq < k1; kq += 16 * Q) {
        float a[Q][MT][2][4];  // [step][tile][row g, g + 8][k]
#pragma unroll
        for (int q = 0; q < Q; ++q)
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const long long r = row0 + i * 16 + g + 8 * h;
                    const int kt = kq + 16 * q + 4 * t;  // this thread's 4 values of k
                    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
                    if (r < m && kt < k1) {
                        const float* src = A + r * lda + kt;
                        if (vec & 1) {  // (k1 a multiple of 4: kt < k1 holds all four)
                            v = __ldg(reinterpret_cast<const float4*>(src));
                        } else {
                            v.x = src[0];
                            if (kt + 1 < k1) v.y = src[1];
                            if (kt + 2 < k1) v.z = src[2];
                            if (kt + 3 < k1) v.w = src[3];
                        }
                    }
                    a[q][i][h][0] = v.x, a[q][i][h][1] = v.y, a[q][i][h][2] = v.z, a[q][i][h][3] = v.w;
                }
        if (seed) {
#pragma unroll
            for (int q = 0; q < Q; ++q)
#pragma unroll
                for (int i = 0; i < MT; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const long long at = (row0 + i * 16 + g + 8 * h) * k + kq + 16 * q + 4 * t;
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            a[q][i][h][e] = nn_keep_mixed(at + e, mix, drop_p) ? a[q][i][h][e] * keep_scale : 0.f;
                    }
        }
#pragma unroll
        for (int q = 0; q < Q; ++q)
#pragma unroll
            for (int s = 0; s < 2; ++s) {  // step s: columns t and t + 4 are k = kt + 2s and kt + 2s + 1
                unsigned bh[NJ][2], bl[NJ][2];
                const int kb = kq + 16 * q + 4 * t + 2 * s;
#pragma unroll
                for (int j = 0; j < NJ; ++j) {
                    const int col = 8 * j + g;
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        nn_split(kb + e < k1 && col < n ? __ldg(B + (kb + e) * sb + col * tb) : 0.f, bh[j][e],
                                 bl[j][e]);
                }
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    unsigned ah[4], al[4];
                    nn_split(a[q][i][0][2 * s], ah[0], al[0]);
                    nn_split(a[q][i][1][2 * s], ah[1], al[1]);
                    nn_split(a[q][i][0][2 * s + 1], ah[2], al[2]);
                    nn_split(a[q][i][1][2 * s + 1], ah[3], al[3]);
#pragma unroll
                    for (int j = 0; j < NJ; ++j) nn_mma3(acc[i][j], ah, al, bh[j], bl[j]);
                }
            }
    }
    float* out = gridDim.y > 1 ? P + blockIdx.y * (long long)m * n : C;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const long long r = row0 + i * 16 + g + 8 * (e / 2);
                const int c = 8 * j + 2 * t + e % 2;
                if (r < m && c < n) out[r * n + c] = acc[i][j][e];
            }
}

// C = dropout(A)ᵀ G, a dropped input's weight gradient: A m x k (unit column stride, row stride lda), G m x n
// (unit column stride, row stride ldg; n <= 8 NJ), C k x n C-contiguous; 3xTF32 and the mask as tcgnn_drop_mm's.
// The MMA's rows are A's columns, its k A's rows: a warp owns 64 columns of A, 4 MMA tiles (rows g and g + 8 of
// tile i are columns 16i + 2g and 16i + 2g + 1, one float2 per row of A: vec bit 0, lda and k even, A 8-byte
// aligned; a row's 256 bytes read by the warp at once), over a slice of A's rows (gridDim.y slices of rc rows, a
// multiple of 16), 8 rows per MMA step, two steps loaded at once.  With slices each writes its partial sums to
// P + y * k * n (tcgnn_dense_atb_sum adds them in y's order), else C.
template <int NJ>
__global__ void __launch_bounds__(128) tcgnn_drop_atb(const float* __restrict__ A, const float* __restrict__ G,
                                                      float* __restrict__ C, int m, int n, int k, long long lda,
                                                      long long ldg, int vec, int rc, float* __restrict__ P,
                                                      const unsigned* __restrict__ seed, float drop_p,
                                                      double drop_scale) {
    constexpr int U = 2, MT = 4;
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int fw = (blockIdx.x * 4 + threadIdx.x / 32) * 16 * MT + 2 * g;  // column of tile 0's row g
    const int r0 = blockIdx.y * rc, r1 = min(m, r0 + rc);
    const unsigned mix = nn_mix(seed);
    const float keep_scale = (float)drop_scale;
    float acc[MT][NJ][4];
    nn_zero(acc);
    for (int rb = r0; rb < r1; rb += 8 * U) {
        float a[U][2][MT][2], b[U][2][NJ];  // [step][row t, t + 4][tile][column f, f + 1] / [..][column 8j + g]
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const long long r = rb + 8 * u + t + 4 * h;
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    const int f = fw + 16 * i;
                    float2 v = make_float2(0.f, 0.f);
                    if (r < r1 && f < k) {
                        const float* src = A + r * lda + f;
                        if (vec & 1) {  // (k even: f < k holds f + 1)
                            v = __ldg(reinterpret_cast<const float2*>(src));
                        } else {
                            v.x = src[0];
                            if (f + 1 < k) v.y = src[1];
                        }
                    }
                    a[u][h][i][0] = v.x, a[u][h][i][1] = v.y;
                }
#pragma unroll
                for (int j = 0; j < NJ; ++j)
                    b[u][h][j] = r < r1 && 8 * j + g < n ? __ldg(G + r * ldg + 8 * j + g) : 0.f;
            }
        if (seed) {
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const long long at = (long long)(rb + 8 * u + t + 4 * h) * k + fw;
#pragma unroll
                    for (int i = 0; i < MT; ++i)
#pragma unroll
                        for (int e = 0; e < 2; ++e)
                            a[u][h][i][e] = nn_keep_mixed(at + 16 * i + e, mix, drop_p) ? a[u][h][i][e] * keep_scale
                                                                                         : 0.f;
                }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            unsigned bh[NJ][2], bl[NJ][2];
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                nn_split(b[u][0][j], bh[j][0], bl[j][0]);
                nn_split(b[u][1][j], bh[j][1], bl[j][1]);
            }
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                unsigned ah[4], al[4];
                nn_split(a[u][0][i][0], ah[0], al[0]);
                nn_split(a[u][0][i][1], ah[1], al[1]);
                nn_split(a[u][1][i][0], ah[2], al[2]);
                nn_split(a[u][1][i][1], ah[3], al[3]);
#pragma unroll
                for (int j = 0; j < NJ; ++j) nn_mma3(acc[i][j], ah, al, bh[j], bl[j]);
            }
        }
    }
    float* out = gridDim.y > 1 ? P + blockIdx.y * (long long)k * n : C;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = fw + 16 * i + e / 2, c = 8 * j + 2 * t + e % 2;
                if (row < k && c < n) out[(long long)row * n + c] = acc[i][j][e];
            }
}

// The sum of the block's v (one per thread, NN_SUM_THREADS threads) in a tree over the threads, in shared part:
// every thread gets it (one fixed order).
template <typename A>
__device__ __forceinline__ A nn_tree_sum(A v, A* part) {
    part[threadIdx.x] = v;
    __syncthreads();
    for (int h = NN_SUM_THREADS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    const A s = part[0];
    __syncthreads();
    return s;
}

// Softmax cross-entropy, one thread per row i of k logits: with z = logits_i - max_c logits_ic,
// loss_i = w_i (log sum_c exp z_c - z_y) and grad_i = w_i (exp z / sum exp z - onehot(y)); a label outside
// [0, k) matches no class.  w: one weight per row, or nullptr for w0 on every row.  total = sum of loss_i in one
// launch: each block adds its rows' losses (a thread's rows in order, then a tree over the block's NN_SUM_THREADS
// threads) into P[block], and the block that finishes last (a count in done, which it resets) adds P in block
// order -- one fixed order for each n, so the same bits on every run.
template <typename T>
__global__ void __launch_bounds__(NN_SUM_THREADS) tcgnn_cross_entropy(
    const T* __restrict__ logits, const long long* __restrict__ labels, const T* __restrict__ w, double w0,
    T* __restrict__ total, T* __restrict__ grad, long long n, int k, typename nn_acc<T>::type* __restrict__ P,
    unsigned int* __restrict__ done) {
    typedef typename nn_acc<T>::type A;
    __shared__ A part[NN_SUM_THREADS];
    A mine = A(0);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const T* z = logits + i * k;
        A mx = nn_of(z[0]);
        for (int c = 1; c < k; ++c) mx = max(mx, nn_of(z[c]));
        A s = A(0);
        for (int c = 0; c < k; ++c) s += exp(nn_of(z[c]) - mx);
        const long long y = labels[i];
        const A wi = w ? nn_of(w[i]) : A(w0);
        const A zy = (y >= 0 && y < k) ? nn_of(z[y]) - mx : A(0);
        mine += wi * (log(s) - zy);
        for (int c = 0; c < k; ++c)
            tc_put(grad + i * k + c, wi * (exp(nn_of(z[c]) - mx) / s - (c == y ? A(1) : A(0))));
    }
    const A block = nn_tree_sum(mine, part);
    if (threadIdx.x == 0) P[blockIdx.x] = block;
    if (!nn_last_block(done, gridDim.x)) return;
    A s = A(0);
    for (long long b = threadIdx.x; b < gridDim.x; b += NN_SUM_THREADS) s += __ldcg(P + b);
    const A sum = nn_tree_sum(s, part);
    if (threadIdx.x == 0) {
        tc_put(total, sum);
        done[0] = 0u;
    }
}
// The loss's per-row weights: w[index[j]] = value for every j (w zeroed before), a negative index counted from
// the end as in NumPy, one outside [-n, n) skipped; repeated rows are written once over (same value).
template <typename T>
__global__ void tcgnn_index_weights(T* __restrict__ w, const long long* __restrict__ index, long long m,
                                    long long n, double value) {
    typedef typename nn_acc<T>::type A;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < m;
         j += (long long)gridDim.x * blockDim.x) {
        long long r = index[j];
        if (r < 0) r += n;
        if (r >= 0 && r < n) tc_put(w + r, A(value));
    }
}

// GAT's scores of X = H W per head: s_src[i, h] = <X[i, h], a_src[h]> and s_dst[i, h] = <X[i, h], a_dst[h]> in
// the compute type, one thread per row and head (X read once, both dot products from one read).
template <typename T>
__global__ void tcgnn_head_dots(const T* __restrict__ x, const typename nn_acc<T>::type* __restrict__ a_src,
                                const typename nn_acc<T>::type* __restrict__ a_dst,
                                typename nn_acc<T>::type* __restrict__ s_src,
                                typename nn_acc<T>::type* __restrict__ s_dst, long long n, int heads, int D) {
    typedef typename nn_acc<T>::type A;
    const long long total = n * heads;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const int h = (int)(t % heads);
        const T* xr = x + t * D;  // row t / heads, head h
        const A* as = a_src + (long long)h * D;
        const A* ad = a_dst + (long long)h * D;
        A ss = A(0), sd = A(0);
        for (int d = 0; d < D; ++d) {
            const A v = nn_of(xr[d]);
            ss += v * as[d];
            sd += v * ad[d];
        }
        s_src[t] = ss;
        s_dst[t] = sd;
    }
}

// The scores' vjp added to the attention's: dx[i, h, d] = g[i, h, d] + ds_src[i, h] a_src[h, d]
// + ds_dst[i, h] a_dst[h, d], in the compute type, stored as T.
template <typename T>
__global__ void tcgnn_head_dots_grad(const T* __restrict__ g, const typename nn_acc<T>::type* __restrict__ ds_src,
                                     const typename nn_acc<T>::type* __restrict__ ds_dst,
                                     const typename nn_acc<T>::type* __restrict__ a_src,
                                     const typename nn_acc<T>::type* __restrict__ a_dst, T* __restrict__ dx,
                                     long long n, int heads, int D) {
    typedef typename nn_acc<T>::type A;
    const long long width = (long long)heads * D;
    const long long total = n * width;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long col = i % width;
        const long long s = (i / width) * heads + col / D;
        A v = nn_of(g[i]) + ds_src[s] * a_src[col];
        v += ds_dst[s] * a_dst[col];
        tc_put(dx + i, v);
    }
}

// AGNN's row normalisation, a warp per row: norm[i] = |x_i| in the compute type and xn_i = x_i / max(norm[i], eps)
// (PyTorch's F.normalize), stored as T.
template <typename T>
__global__ void tcgnn_row_normalize(const T* __restrict__ x, T* __restrict__ xn,
                                    typename nn_acc<T>::type* __restrict__ norm, long long n, int d, double eps) {
    typedef typename nn_acc<T>::type A;
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < n; r += warps) {
        const T* xr = x + r * d;
        A ss = A(0);
        for (int c = lane; c < d; c += 32) {
            const A v = nn_of(xr[c]);
            ss += v * v;
        }
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const A nr = sqrt(ss);
        const A inv = A(1) / max(nr, A(eps));
        for (int c = lane; c < d; c += 32) tc_put(xn + r * d + c, nn_of(xr[c]) * inv);
        if (lane == 0) norm[r] = nr;
    }
}

// The sum of x[0 .. n) in one fixed order, by one block of NN_SUM_THREADS (the module's SUM_THREADS) threads: thread
// t adds x[t], x[t + NN_SUM_THREADS], ... in the compute type, then a tree over the threads; out[0] is the sum in
// x's type.  Deterministic: every caller of one length and type gets the same bits.
template <typename T>
__device__ __forceinline__ void nn_block_sum(const T* __restrict__ x, long long n, T* __restrict__ out) {
    typedef typename nn_acc<T>::type A;
    __shared__ A part[NN_SUM_THREADS];
    A s = A(0);
    for (long long i = threadIdx.x; i < n; i += NN_SUM_THREADS) s += nn_of(x[i]);
    s = nn_tree_sum(s, part);
    if (threadIdx.x == 0) tc_put(out, s);
}

// The normalisation's vjp added to the attention's, a warp per row: with dn = dq + dk,
// dh = dv + (dn - xn <xn, dn>) / max(norm, eps); the radial part only where norm > eps (below it the
// normalisation is a scaling by 1 / eps).  dh in the compute type.  Given shares (AGNN's temperature gradient, one
// share per row unit), the last block also writes their sum to total, in tcgnn_sum's order (blocks of
// NN_SUM_THREADS threads): a launch less.
template <typename T>
__global__ void tcgnn_row_normalize_grad(const T* __restrict__ dv, const typename nn_acc<T>::type* __restrict__ dq,
                                         const typename nn_acc<T>::type* __restrict__ dk, const T* __restrict__ xn,
                                         const typename nn_acc<T>::type* __restrict__ norm,
                                         typename nn_acc<T>::type* __restrict__ dh, long long n, int d, double eps,
                                         const float* __restrict__ shares, long long n_shares,
                                         float* __restrict__ total) {
    typedef typename nn_acc<T>::type A;
    if (shares != nullptr && blockIdx.x == gridDim.x - 1) nn_block_sum(shares, n_shares, total);
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < n; r += warps) {
        const long long o0 = r * d;
        A dot = A(0);
        for (int c = lane; c < d; c += 32) dot += nn_of(xn[o0 + c]) * (dq[o0 + c] + dk[o0 + c]);
        for (int o = 16; o; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        const A nr = norm[r];
        const A radial = nr > A(eps) ? dot : A(0);
        const A inv = A(1) / max(nr, A(eps));
        for (int c = lane; c < d; c += 32) {
            const A dn = dq[o0 + c] + dk[o0 + c];
            dh[o0 + c] = nn_of(dv[o0 + c]) + (dn - nn_of(xn[o0 + c]) * radial) * inv;
        }
    }
}

// nn_block_sum in one launch of one block: one launch where a library reduction costs several times its kernel on
// the host; what it sums is one value per row (a loss) or per unit (AGNN's temperature gradient), at one SM's
// bandwidth.
template <typename T>
__global__ void __launch_bounds__(NN_SUM_THREADS) tcgnn_sum(const T* __restrict__ x, long long n, T* __restrict__ out) {
    nn_block_sum(x, n, out);
}

// Per-segment sums of a C-contiguous (n, d) x's rows, segment g the rows ptr[g] .. ptr[g + 1] - 1 (int64 offsets):
// out[g, c] = sum of scale[g] x[r, c] over them in row order, in the compute type (scale null: 1) -- the product
// with a pooling matrix whose row g holds scale[g] on its segment, in one fixed order; an empty segment gives 0.
// A thread per output, neighbouring threads neighbouring columns (coalesced rows).
template <typename T>
__global__ void tcgnn_segment_sum(const T* __restrict__ x, const long long* __restrict__ ptr,
                                  const T* __restrict__ scale, T* __restrict__ out, long long G, int d) {
    typedef typename nn_acc<T>::type A;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < G * d;
         i += (long long)gridDim.x * blockDim.x) {
        const long long g = i / d;
        const long long c = i - g * d;
        const A w = scale != nullptr ? nn_of(scale[g]) : A(1);
        A s = A(0);
        for (long long r = ptr[g]; r < ptr[g + 1]; ++r) s += w * nn_of(x[r * d + c]);
        tc_put(out + i, s);
    }
}

// out = A x for a CSR A (int32 indices and row pointers, values of x's type) and a C-contiguous (k, d) x: out[r, c]
// = sum of values[e] x[indices[e], c] over row r's entries in their order, in the compute type (deterministic; an
// empty row gives 0).  The product of a matrix used once (a sampled block, or its transpose in a backward), where
// its translation into tiles and its first product's plan cost more than the product.  A group of 2^lg lanes per
// row (2^lg about d / 2, at most a warp), each lane on two columns at a time: a row's entries are read once per
// group and x's rows coalesced, and no output pays a division to find its row.  Entries go NN_CSR_STEP at a time,
// their loads issued before their sums (in entry order): a long row (a hub of a block's transpose) is a chain of
// loads, which the step's independent loads shorten.
#define NN_CSR_STEP 8
template <typename T>
__global__ void tcgnn_csr_mm(const T* __restrict__ values, const int* __restrict__ indices,
                             const int* __restrict__ indptr, const T* __restrict__ x, T* __restrict__ out,
                             long long n, int d, int lg) {
    typedef typename nn_acc<T>::type A;
    const int g = 1 << lg;
    const int lane = threadIdx.x & (g - 1);
    const long long groups = ((long long)gridDim.x * blockDim.x) >> lg;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> lg; r < n; r += groups) {
        const int e0 = indptr[r], e1 = indptr[r + 1];
        for (int c = lane; c < d; c += 2 * g) {
            const int c2 = c + g;
            const bool two = c2 < d;
            A s = A(0), s2 = A(0);
            int e = e0;
            for (; e + NN_CSR_STEP <= e1; e += NN_CSR_STEP) {
                A v[NN_CSR_STEP];
                T a[NN_CSR_STEP], b[NN_CSR_STEP];
#pragma unroll
                for (int u = 0; u < NN_CSR_STEP; ++u) {
                    const T* row = x + (long long)indices[e + u] * d;
                    v[u] = nn_of(values[e + u]);
                    a[u] = row[c];
                    b[u] = two ? row[c2] : T(0);
                }
#pragma unroll
                for (int u = 0; u < NN_CSR_STEP; ++u) {
                    s += v[u] * nn_of(a[u]);
                    s2 += v[u] * nn_of(b[u]);
                }
            }
            for (; e < e1; ++e) {
                const A v = nn_of(values[e]);
                const T* row = x + (long long)indices[e] * d;
                s += v * nn_of(row[c]);
                if (two) s2 += v * nn_of(row[c2]);
            }
            tc_put(out + r * d + c, s);
            if (two) tc_put(out + r * d + c2, s2);
        }
    }
}

// GAT's attention vectors' gradients from R_src = ds_srcᵀ X and R_dst = ds_dstᵀ X ((heads, heads * D) each,
// C-contiguous): da[h, d] = R[h, h * D + d], the diagonal blocks, both gathered in one launch (a library gather
// costs several times more on the host), one thread per output.
template <typename T>
__global__ void tcgnn_head_blocks(const T* __restrict__ r_src, const T* __restrict__ r_dst, T* __restrict__ a_src,
                                  T* __restrict__ a_dst, int heads, int D) {
    const int total = heads * D;
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < 2 * total; t += gridDim.x * blockDim.x) {
        const int v = t / total, i = t % total, h = i / D;
        const long long at = (long long)h * total + (long long)h * D + i % D;
        if (v == 0) a_src[i] = r_src[at];
        else a_dst[i] = r_dst[at];
    }
}
"""

#: Tiles of ``tcgnn_dense_mm``: (BN, TM, NT), a block of NT threads computing (NT / (BN / 4) * TM) x BN of C, for
#: results of up to 16, 32 and 64 columns.  64 columns take 8 rows a thread in blocks of 128 (cuBLAS's float32
#: tile): fewer shared-memory reads per fma than 4 rows in blocks of 256, which ran slower than cuBLAS.
DENSE_TILES = ((16, 2, 256), (32, 4, 256), (64, 8, 128))
#: Tiles of ``tcgnn_dense_atb`` (Aᵀ B over a long dimension): (BQ, TI, NT), a block of NT threads summing
#: (NT / (BQ / 4) * TI) x BQ of C; 64 x 64 for a weight's gradient, 8 x 64 for a few rows (column sums, GAT's
#: per-head vectors).
DENSE_ATB_TILES = ((64, 4, 256), (64, 1, 128))
#: Threads of the one block of ``tcgnn_sum`` (a power of two: its tree halves them).
SUM_THREADS = 256
#: Threads of a ``tcgnn_narrow_atb`` block: as many row groups as an SM holds, so that each thread adds few rows
#: and the last block few partials.
NARROW_THREADS = 1024
SOURCE = (COMMON_SOURCE + f"#define NN_SUM_THREADS {SUM_THREADS}\n#define NN_NARROW_THREADS {NARROW_THREADS}\n"
          + _NN)


def _ctype(dtype_name):
    return VALUE_TYPES.get(dtype_name) or cuda_type(dtype_name)


def adam_multi_name(dtype_name):
    return f"tcgnn_adam_multi<{VALUE_TYPES[dtype_name]}>"


def _template(kernel):
    """``name(dtype_name)``: the NVRTC name of ``kernel``'s instantiation for elements of that type."""
    def name(dtype_name):
        return f"{kernel}<{_ctype(dtype_name)}>"

    name.__name__ = name.__qualname__ = f"{kernel.removeprefix('tcgnn_')}_name"
    return name


tail_name = _template("tcgnn_tail")
tail_grad_name = _template("tcgnn_tail_grad")
cross_entropy_name = _template("tcgnn_cross_entropy")
index_weights_name = _template("tcgnn_index_weights")
head_dots_name = _template("tcgnn_head_dots")
head_dots_grad_name = _template("tcgnn_head_dots_grad")
row_normalize_name = _template("tcgnn_row_normalize")
row_normalize_grad_name = _template("tcgnn_row_normalize_grad")
sum_name = _template("tcgnn_sum")
segment_sum_name = _template("tcgnn_segment_sum")
csr_mm_name = _template("tcgnn_csr_mm")
add_bias_name = _template("tcgnn_add_bias")


def dense_atb_name(bq, ti, nt):
    """The NVRTC name of ``tcgnn_dense_atb`` for the tile ``(bq, ti, nt)``."""
    return f"tcgnn_dense_atb<{bq}, {ti}, {nt}>"


#: ``Aᵀ B`` of a few outputs in one launch (a bias's or a narrow weight's gradient).
NARROW_ATB = "tcgnn_narrow_atb"
#: The most outputs ``tcgnn_narrow_atb`` computes (a block holds at least 16 row groups).
NARROW_ATB_MAX = 64
#: The slices' sum of ``tcgnn_dense_atb`` (and of the dropped products): blocks of ``SLICE_SUM_THREADS`` threads.
DENSE_ATB_SUM = "tcgnn_dense_atb_sum"
SLICE_SUM_THREADS = 256


def slice_sum_threads(slices, threads=SLICE_SUM_THREADS):
    """Threads per output of a slices' sum (the kernels' ``dn_sum_threads``): the power of two that leaves each
    four to eight of the ``slices`` to load, at most ``threads``."""
    t = 1
    while t * 8 <= slices and t < threads:
        t *= 2
    return t


#: An attention dropout seed's bits from a float64 draw.
SEED_BITS = "tcgnn_seed_bits"
#: A seed stream's next seed (:func:`tcgnn_py._reference.seed_stream`).
DRAW = "tcgnn_draw"


def drop_mm_name(nj):
    """The NVRTC name of ``tcgnn_drop_mm`` for results of up to ``8 nj`` columns."""
    return f"tcgnn_drop_mm<{nj}>"


def drop_atb_name(nj):
    """The NVRTC name of ``tcgnn_drop_atb`` for gradients of up to ``8 nj`` columns."""
    return f"tcgnn_drop_atb<{nj}>"


#: Column tiles of 8 ``tcgnn_drop_mm`` and ``tcgnn_drop_atb`` are instantiated for (results of up to 32 columns).
DROP_TILES = (1, 2, 4)


def dense_mm_name(bn, tm, nt, bt):
    """The NVRTC name of ``tcgnn_dense_mm`` for the tile ``(bn, tm, nt)``, B a transposed view (``bt``) or not."""
    return f"tcgnn_dense_mm<{bn}, {tm}, {nt}, {'true' if bt else 'false'}>"
head_blocks_name = _template("tcgnn_head_blocks")


#: The layers' dense kernels (products, sums over rows, the bias after a sparse product), float32.
DENSE_NAMES = (*(dense_mm_name(*tile, bt) for tile in DENSE_TILES for bt in (False, True)),
               *(dense_atb_name(*tile) for tile in DENSE_ATB_TILES), DENSE_ATB_SUM, NARROW_ATB)
#: A dropped input layer's kernels (its product and its weight's gradient).
DROP_NAMES = (*(drop_mm_name(nj) for nj in DROP_TILES), *(drop_atb_name(nj) for nj in DROP_TILES))

TICK = "tcgnn_adam_tick"
NAMES = (TICK, SEED_BITS, DRAW, *(adam_multi_name(t) for t in VALUE_TYPES),
         *(f(t) for f in (tail_name, tail_grad_name, cross_entropy_name, index_weights_name, head_dots_name,
                          head_dots_grad_name, row_normalize_name, row_normalize_grad_name, sum_name,
                          head_blocks_name, add_bias_name) for t in TAIL_TYPES),
         *(f(t) for f in (segment_sum_name, csr_mm_name) for t in ("float32", "float64")),
         *DENSE_NAMES, *DROP_NAMES)
FAMILIES = {"nn": (SOURCE, NAMES)}
register("nn", SOURCE, NAMES)
