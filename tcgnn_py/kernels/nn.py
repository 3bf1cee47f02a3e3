"""Layer 1: CUDA source of the ``"nn"`` RawModule family (training helpers).

Listed in :func:`tcgnn_py.kernels.registry.families`, so it compiles through
the same cached path and the same NVRTC check in CI.
"""

from .registry import VALUE_TYPES

__all__ = ["SOURCE", "NAMES", "FAMILIES", "adam_name"]

SOURCE = r"""
// One Adam step (Kingma & Ba, PyTorch's L2 weight decay), fused: each element
// reads p, g, m, v once and writes p, m, v once, instead of a dozen passes of
// array expressions.  step = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t).
template <typename T>
__global__ void tcgnn_adam(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                           T* __restrict__ v, long long n, T step, T b1, T b2, T eps, T wd,
                           T bc2_sqrt) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        T gi = g[i] + wd * p[i];
        T mi = b1 * m[i] + (T(1) - b1) * gi;
        T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= step * mi / (sqrt(vi) / bc2_sqrt + eps);
    }
}
"""


def adam_name(dtype_name):
    return f"tcgnn_adam<{VALUE_TYPES[dtype_name]}>"


NAMES = tuple(adam_name(t) for t in VALUE_TYPES)
FAMILIES = {"nn": (SOURCE, NAMES)}
