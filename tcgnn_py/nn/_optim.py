"""Layer 4: the Adam optimizer, on NumPy or CuPy parameters."""

import math

import numpy as np

from .._device import array_module
from ..products import optimizer

__all__ = ["Adam"]


class Adam:
    """Adam (Kingma & Ba) with PyTorch's semantics: ``weight_decay`` adds ``wd * p`` to the gradient.

    Parameters
    ----------
    params : dict of str -> array
        Updated in place by :meth:`step` (NumPy or CuPy, float32 or float64).
    lr : float, default 0.01
    betas : (float, float), default (0.9, 0.999)
    eps : float, default 1e-8
    weight_decay : float or dict of str -> float, default 0
        One value for every parameter, or one per name (missing names: 0),
        e.g. Kipf & Welling's decay of the first layer only.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> params = {"w": np.array([1.0, -1.0])}
    >>> opt = tg.nn.Adam(params, lr=0.1)
    >>> opt.step({"w": np.array([2.0, -3.0])})
    >>> print(params["w"].round(6).tolist())
    [0.9, -0.9]
    """

    def __init__(self, params, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        self.params = params
        self.lr, self.betas, self.eps = float(lr), (float(betas[0]), float(betas[1])), float(eps)
        if isinstance(weight_decay, dict):
            unknown = set(weight_decay) - set(params)
            if unknown:
                raise KeyError(f"weight_decay names unknown parameters: {sorted(unknown)}")
            self.weight_decay = {k: float(weight_decay.get(k, 0.0)) for k in params}
        else:
            self.weight_decay = dict.fromkeys(params, float(weight_decay))
        for k, p in params.items():
            if p.dtype not in (np.float32, np.float64) or not p.flags.c_contiguous:
                raise TypeError(f"parameter {k!r} must be a C-contiguous float32/float64 array")
        self.state = {k: (array_module(p).zeros_like(p), array_module(p).zeros_like(p)) for k, p in params.items()}
        self._t = 0  # host parameters: the step count
        self._device_t = None  # device parameters: (step count, bias corrections) on the device
        self._tables = {}  # device parameters: names -> (their arrays, the multi-tensor table, sizes)
        if params and array_module(next(iter(params.values()))) is not np:
            for dtype in (np.float32, np.float64):  # the tables of every parameter, made here (not under a capture)
                names = tuple(k for k, p in params.items() if p.dtype == dtype)
                if names:
                    self._table(names)

    @property
    def t(self):
        """Steps taken.  For device parameters it lives on the device (a captured step advances it on
        every replay), and reading it synchronises."""
        if self._device_t is None:
            return self._t
        return int(self._device_t[0].get()[0])  # synchronize!

    def step(self, grads):
        """Apply one update from ``grads`` (name -> array; None or missing names are skipped).

        On the device nothing is read back to the host, so a step can be captured in a CUDA graph.
        """
        b1, b2 = self.betas
        items = [(k, g) for k, g in grads.items() if g is not None]
        for k, g in items:
            if g.shape != self.params[k].shape:
                raise ValueError(f"gradient of {k!r} has shape {g.shape}, the parameter {self.params[k].shape}")
        if not self.params or array_module(next(iter(self.params.values()))) is np:
            self._t += 1
            step = self.lr / (1 - b1**self._t)
            bc2_sqrt = math.sqrt(1 - b2**self._t)
            for k, g in items:
                p = self.params[k]
                m, v = self.state[k]
                wd = self.weight_decay[k]
                g = g + wd * p if wd else g
                m *= b1
                m += (1 - b1) * g
                v *= b2
                v += (1 - b2) * g * g
                p -= step * m / (np.sqrt(v) / bc2_sqrt + self.eps)
            return
        t, coef = self._device_state()
        groups = {}  # dtype -> [(name, gradient)]: one multi-tensor launch per dtype
        for k, g in items:
            p = self.params[k]
            if g.dtype != p.dtype or not g.flags.c_contiguous:
                g = array_module(p).ascontiguousarray(g, dtype=p.dtype)
            groups.setdefault(p.dtype, []).append((k, g))
        if not groups:  # (no gradient: the step count still advances)
            optimizer.adam_tick(t, coef, self.lr, b1, b2)
        tick = (t, self.lr)  # the first launch advances the step count
        for group in groups.values():
            table, sizes = self._table(tuple(k for k, _ in group))
            optimizer.adam_multi(table, sizes, [g for _, g in group], coef, b1, b2, self.eps, tick)
            tick = None

    def _table(self, names):
        """The device table of the parameters ``names`` and their moments (``optimizer.adam_table``), made once per
        set of names and rebuilt where a parameter or moment array was replaced."""
        arrays = tuple((self.params[k], *self.state[k]) for k in names)
        kept = self._tables.get(names)
        if kept is None or any(a is not b for new, old in zip(arrays, kept[0]) for a, b in zip(new, old)):
            table = optimizer.adam_table([a[0] for a in arrays], [a[1:] for a in arrays],
                                     [self.weight_decay[k] for k in names])
            kept = self._tables[names] = (arrays, table, [a[0].size for a in arrays])
        return kept[1], kept[2]

    def _device_state(self):
        """The device step count (int64 ``[count, 0]``, the second a count the update's blocks use) and bias
        corrections, made at the first step."""
        import cupy

        if self._device_t is None:
            self._device_t = (cupy.zeros(2, np.int64), cupy.zeros(2, np.float64))
        return self._device_t
