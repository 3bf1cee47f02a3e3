"""Layer 1: CUDA source of the ``"nn"`` RawModule family (training helpers).

Listed in :func:`tcgnn_py.kernels.registry.families`, so it compiles through
the same cached path and the same NVRTC check in CI.
"""

from .registry import VALUE_TYPES, register

__all__ = ["SOURCE", "NAMES", "FAMILIES", "TICK", "adam_name"]

SOURCE = r"""
// The step count and bias corrections of Adam live on the device, so that a
// captured training step (a CUDA graph) advances them on every replay.
// t += 1; coef = (lr / (1 - b1^t), sqrt(1 - b2^t)).
__global__ void tcgnn_adam_tick(long long* __restrict__ t, double* __restrict__ coef, double lr,
                                double b1, double b2) {
    long long k = t[0] + 1;
    t[0] = k;
    coef[0] = lr / (1.0 - pow(b1, (double)k));
    coef[1] = sqrt(1.0 - pow(b2, (double)k));
}

// One Adam step (Kingma & Ba, PyTorch's L2 weight decay), fused: each element
// reads p, g, m, v once and writes p, m, v once, instead of a dozen passes of
// array expressions.  coef from tcgnn_adam_tick.
template <typename T>
__global__ void tcgnn_adam(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                           T* __restrict__ v, long long n, const double* __restrict__ coef, T b1, T b2,
                           T eps, T wd) {
    const T step = T(coef[0]);
    const T bc2_sqrt = T(coef[1]);
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


TICK = "tcgnn_adam_tick"
NAMES = (TICK, *(adam_name(t) for t in VALUE_TYPES))
FAMILIES = {"nn": (SOURCE, NAMES)}
register("nn", SOURCE, NAMES)
